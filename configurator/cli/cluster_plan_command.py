"""``configurator plan``: from measurements to a running job in one command: import the
nccl-tests logs (or read a topology file), audit them, search with the ranks placed on the
measured links, leaving out the hosts the audit flags when that is faster, price what each
finding costs the chosen plan, and write the launch scripts, ``plan.json`` and one
``report.html``."""

from __future__ import annotations

import os

from configurator.app.cluster_plan_jobs import PlanRequest, plan_warnings, run_plan
from configurator.cli.options import (add_force, add_json, add_out, add_training_options,
                                      integer, option_groups)
from configurator.cli.plan_commands import (add_plan_option, add_search_limits, group_of,
                                            search_limits, training_request)
from configurator.core import jsonout
from configurator.core.plan import SEARCH_OPTIONS
from launchers import start_instructions


def add_plan_arguments(p) -> None:
    groups = option_groups(p)
    g = groups["model and cluster"]
    g.add_argument("--model", required=True,
                   help="a preset (any case), a YAML/JSON file with Megatron keys, a Hugging "
                        "Face config.json, or a Hugging Face model id (owner/name: its "
                        "config.json through huggingface_hub)")
    g.add_argument("--gbs", type=integer, required=True, help="global batch size (sequences)")
    g.add_argument("--seq-length", type=integer,
                   help="override the model's sequence length (a Hugging Face config's "
                        "default: its family's pretraining length, stated in the output)")
    g.add_argument("--cluster", metavar="PRESET_OR_FILE",
                   help="the cluster's preset or file (default: the preset whose GPU the "
                        "measurements name, e.g. nccl-tests' NVIDIA H100 80GB HBM3 -> "
                        "dgx-h100-80gb)")
    g.add_argument("--nodes", type=integer,
                   help="hosts the plan uses (default: all, or all but the flagged ones when "
                        "that is faster; the most that have a legal layout when all have "
                        "none, e.g. 13 hosts for gbs 128)")
    for name in SEARCH_OPTIONS:
        add_plan_option(groups[group_of(name)], name)
    add_search_limits(groups)
    g = groups["topology and placement"]
    g.add_argument("--logs", nargs="+", metavar="PATH", default=(),
                   help="nccl-tests logs, 'nvidia-smi topo -m' output or probe files, or "
                        "directories of them (written to --out as topology.json)")
    g.add_argument("--topology", metavar="FILE", help="a topology file instead of --logs")
    g.add_argument("--seed", type=integer, default=0, help="seed of the placement search "
                                                       "(default 0)")
    g = groups["search"]
    g.add_argument("--top", type=integer, default=3,
                   help="plans placed on the measured links and shown (1 to 1,000; default 3)")
    add_training_options(groups["time to train"])
    g = groups["output"]
    add_out(g, "directory for the scripts, bridge_overrides.yaml, plan.json, plans.json, "
               "audit.json and report.html",
            metavar="DIR", required=True)
    add_force(g, "files in --out")
    add_json(g, "the summary")


def run_plan_command(args) -> int:
    out = run_plan(PlanRequest(
        model=args.model, global_batch_size=args.gbs, logs=tuple(args.logs),
        topology=args.topology, cluster=args.cluster, nodes=args.nodes,
        seq_length=args.seq_length, out=args.out, force=args.force, top=args.top,
        options={name: getattr(args, name) for name in SEARCH_OPTIONS}, seed=args.seed,
        training=training_request(args), limits=search_limits(args)))
    best = out.chosen.plans[0]
    steps = start_instructions(args.out, nodes=best.placement.nodes, placed=True,
                               data=False, plan_file=os.path.join(args.out, "plan.json"))
    if args.json:
        print(jsonout.dumps({"summary": out.summary,
                             "warnings": plan_warnings(out.report),
                             "out": args.out, "written": out.written,
                             "excluded_hosts": list(out.excluded),
                             "iteration_time_s": best.iteration_time_s,
                             "plan": best.plan.to_dict(),
                             "placement": best.placement.to_estimate_dict(),
                             "islands": [list(i) for i in out.report.islands],
                             **({} if best.training is None
                                else {"training": best.training.to_dict()}),
                             "next_steps": steps}, indent=2))
        return 0
    for line in out.summary:
        print(line)
    print(f"wrote {args.out}/: " + ", ".join(out.written))
    print(f"the audit, its costs, the placement and the schedule: "
          f"{os.path.join(args.out, 'report.html')}")
    for line in steps:
        print(line)
    return 0
