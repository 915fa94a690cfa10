"""``configurator trial``: the few short runs that best settle a job's ranking, their launch
scripts and the next step (``calibrate`` on their logs, then ``search --calibration``)."""

from __future__ import annotations

import sys

from configurator.app.inputs import JobInputs
from configurator.app.trial_jobs import DEFAULT_ITERATIONS, DEFAULT_RUNS, TrialRequest, run_trial
from configurator.cli.options import add_force, add_json, add_out, option_groups
from configurator.cli.plan_commands import (add_gpus, add_plan_option, add_search_limits,
                                            group_of, search_limits)
from configurator.core import jsonout
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import SEARCH_OPTIONS
from topology.cluster_files import CLUSTER_PRESETS


def add_trial_arguments(p) -> None:
    groups = option_groups(p)
    g = groups["model and cluster"]
    g.add_argument("--model", required=True,
                   help="preset name, any case (" + ", ".join(MODEL_PRESETS) + "), a YAML/JSON "
                        "file with Megatron keys, or a Hugging Face config.json")
    g.add_argument("--cluster", required=True,
                   help="preset, any case (" + ", ".join(CLUSTER_PRESETS) + ") or a YAML/JSON "
                        "file")
    g.add_argument("--nodes", type=int, help="number of nodes (default: the cluster's own)")
    add_gpus(g)
    g.add_argument("--gbs", type=int, required=True, help="global batch size (sequences)")
    g.add_argument("--seq-length", type=int, help="override the model's sequence length")
    groups["topology and placement"].add_argument(
        "--topology", metavar="FILE",
        help="topology file of your hosts (configurator topology import of nccl-tests logs "
             "or 'nvidia-smi topo -m', or probe): the runs are chosen on its links and "
             "pinned to its first --nodes hosts (default all), which their logs name for "
             "calibrate --topology; the next step names it")
    groups["topology and placement"].add_argument(
        "--exclude-flagged", action="store_true",
        help="with --topology: pin the runs to the first hosts the topology's audit does not "
             "flag (the audit of a topology of thousands of hosts takes a while)")
    for name in SEARCH_OPTIONS:
        add_plan_option(groups[group_of(name)], name)
    add_search_limits(groups)
    g = groups["search"]
    g.add_argument("--plans", metavar="FILE",
                   help="the plans you can run: a plans.json of 'search --out' (or a YAML/JSON "
                        "mapping 'plans: [plan, ...]'; a plan repeated counts once); "
                        "default: every plan the search keeps within the limits above "
                        "(--recompute, --tp …, --no-sequence-parallel …), which the next "
                        "step's search repeats")
    g.add_argument("--runs", type=int, default=DEFAULT_RUNS, metavar="K",
                   help=f"how many short runs to choose (1..64, default {DEFAULT_RUNS})")
    g.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS, metavar="N",
                   help=f"training iterations of each run (10..10000, default "
                        f"{DEFAULT_ITERATIONS}; mock data)")
    g = groups["output"]
    add_out(g, "write each run's launch scripts (trialN/), trials.json and an empty logs/ "
               "here", metavar="DIR")
    add_force(g, "files in --out")
    add_json(g)


def run_trial_command(args) -> int:
    req = TrialRequest(inputs=JobInputs(model=args.model, cluster=args.cluster,
                                        nodes=args.nodes, gpus=args.gpus,
                                        seq_length=args.seq_length,
                                        topology=args.topology,
                                        exclude_flagged=args.exclude_flagged),
                       global_batch_size=args.gbs,
                       options={name: getattr(args, name) for name in SEARCH_OPTIONS},
                       plans=args.plans, runs=args.runs, iterations=args.iterations,
                       out=args.out, force=args.force, limits=search_limits(args))
    out = run_trial(req)
    if args.json:
        print(jsonout.dumps(out.to_dict(), indent=2))
        return 0
    print(out.header)
    # the trial run's own time beside the job's where they differ (forced MoE balance)
    forced = any(r.predicted_iteration_time_s != r.job_iteration_time_s for r in out.runs)
    ep = any(r.plan.ep > 1 for r in out.runs)
    print(f"{'#':>2} {'role':<10} {'tp':>3} {'pp':>3} {'dp':>4} {'cp':>3} {'vp':>3} {'mbs':>4} "
          + (f"{'ep':>3} {'etp':>3} " if ep else "")
          + f"{'recompute':<10} {'predicted s':>11}" + (f" {'trial run s':>11}" if forced else "")
          + "  why")
    for r in out.runs:
        p = r.plan
        print(f"{r.index:>2} {r.role:<10} {p.tp:>3} {p.pp:>3} {p.dp:>4} {p.cp:>3} "
              f"{p.vp or 1:>3} {p.micro_batch_size:>4} "
              + (f"{p.ep:>3} {p.etp:>3} " if ep else "")
              + f"{p.recompute:<10} {r.job_iteration_time_s:>11.3f}"
              + (f" {r.predicted_iteration_time_s:>11.3f}" if forced else "")
              + f"  {r.reason}")
    sd = ", ".join(f"{n} ±{100 * out.sd_before[n]:.0f} % -> ±{100 * out.sd_after[n]:.0f} %"
                   for n in out.sd_before)
    print(f"parameters' uncertainty (1 σ, log) before -> after these runs: {sd}")
    for line in out.notes:
        print("note: " + line)
    if out.written:
        print(f"wrote {args.out.rstrip('/') or '/'}/: trial1..trial{len(out.runs)}/launch_torchrun.sh and "
              f"launch_slurm.sbatch, trials.json, logs/")
    else:
        print("next: --out DIR writes their launch scripts", file=sys.stdout)
    for line in out.next_steps:
        print("next: " + line)
    return 0
