"""``configurator search``, ``estimate`` and ``launch``: arguments and printing.

The plan options (``--tp``, ``--mbs``, ``--recompute``, ``--[no-]sequence-parallel`` …) are
generated from the plan schema (:data:`configurator.core.plan.PLAN_FIELDS`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from configurator.app.inputs import JobInputs
from configurator.cli.options import (TRAINING_OPTION_DESTS, add_force, add_json, add_out,
                                      add_training_options, integer, option_groups)
from configurator.app.plan_jobs import (SEARCH_DDP, SEARCH_RESTRICTIONS, SEARCH_SWITCHES,
                                        EstimateRequest, LaunchRequest, SearchLimits,
                                        SearchRequest,
                                        run_estimate as estimate_job, run_launch as launch_job,
                                        run_search as search_job)
from configurator.core import jsonout
from configurator.core.errors import InputError
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import PLAN_FIELD, PLAN_FIELDS, SEARCH_OPTIONS, field_words
from configurator.core.plan_values import RECOMPUTE
from launchers import start_instructions
from memory_model.estimate import DEFAULT_MAX_MEMORY_FRACTION
from topology.cluster_files import CLUSTER_PRESETS

#: Plan fields ``estimate`` takes as options (every field with a CLI flag; dp is derived).
ESTIMATE_FIELDS = tuple(f.name for f in PLAN_FIELDS
                        if f.cli_flag and f.name not in SEARCH_OPTIONS)
#: Required options of ``estimate``: the layout and micro-batch size.
ESTIMATE_REQUIRED = ("tp", "pp", "micro_batch_size")


def add_plan_option(p, name: str, *, required: bool = False, default=None) -> None:
    """Add the CLI option of plan field ``name`` from its schema entry (flag, type, choices,
    help). Booleans become ``--x/--no-x`` with ``None`` meaning "the documented default", as
    for an integer or text option left out (:func:`configurator.core.rules.plan_for_world`
    fills it: ``vp`` from a pipeline layout, else the schema's default)."""
    f = PLAN_FIELD[name]
    if f.type is bool:
        p.add_argument(f.cli_flag, dest=f.name, action=argparse.BooleanOptionalAction,
                       default=None, help=f.help)
    elif f.choices:
        # None: not given (a search chooses a mechanism the user did not name)
        p.add_argument(f.cli_flag, dest=f.name, choices=f.choices, default=default,
                       help=f.help)
    else:
        p.add_argument(f.cli_flag, dest=f.name, type=integer if f.type is int else f.type,
                       required=required,
                       metavar=(f.alias or f.cli_flag.lstrip("-")).upper(),
                       default=None, help=f.help)


def group_of(name: str) -> str:
    """The ``--help`` group of plan field ``name``: precision and kernels, else the plan."""
    return ("precision and kernels" if PLAN_FIELD[name].flag_group == "precision and kernels"
            else "plan")


def _common(p: argparse.ArgumentParser, groups) -> None:
    g = groups["model and cluster"]
    g.add_argument("--model", required=True,
                   help="preset name, any case (" + ", ".join(MODEL_PRESETS) + "), a YAML/JSON "
                        "file with Megatron keys, a Hugging Face config.json, or a Hugging "
                        "Face model id (owner/name: its config.json through huggingface_hub, "
                        "from its cache when HF_HUB_OFFLINE=1)")
    g.add_argument("--cluster", required=True,
                   help="preset, any case (" + ", ".join(CLUSTER_PRESETS) + ") or a YAML/JSON "
                        "file")
    g.add_argument("--nodes", type=integer,
                   help="number of nodes (default: the cluster's own, stated in the output; "
                        "with --topology, how many of its hosts to use, at most all: the "
                        "placement picks which)")
    add_gpus(g)
    g.add_argument("--gbs", type=integer, required=True, help="global batch size (sequences)")
    g.add_argument("--seq-length", type=integer,
                   help="override the model's sequence length (a Hugging Face config's "
                        "default: its family's pretraining length, stated in the output)")
    g.add_argument("--calibration", metavar="FILE",
                   help="calibrated GPU efficiencies (configurator calibrate -o FILE) in "
                        "place of the GPU preset's")
    g.add_argument("--profile", metavar="FILE",
                   help="measured layer times (configurator profile -o FILE, taken on the "
                        "cluster's GPU for this model and precision) in place of the analytic "
                        "layer compute at the shapes it holds")
    for name in SEARCH_OPTIONS:
        add_plan_option(groups[group_of(name)], name)
    groups["topology and placement"].add_argument(
        "--topology", metavar="FILE",
        help="measured topology file (configurator topology import / probe): collective "
             "and p2p times use its links")
    add_json(groups["output"])


def add_gpus(g) -> None:
    """``--gpus N``: the job's GPU count instead of whole nodes (:class:`JobInputs`)."""
    g.add_argument("--gpus", type=integer, metavar="N",
                   help="number of GPUs instead of --nodes: whole nodes, or part of one node "
                        "(a divisor of its GPUs: 1, 2 or 4 of a DGX's 8, launched with "
                        "--nproc-per-node N); whole hosts only on a measured topology")


def _inputs(args, exclude_flagged: bool = False) -> JobInputs:
    return JobInputs(model=args.model, cluster=args.cluster, nodes=args.nodes, gpus=args.gpus,
                     seq_length=args.seq_length, topology=args.topology,
                     exclude_flagged=exclude_flagged,
                     calibration=getattr(args, "calibration", None),
                     profile=getattr(args, "profile", None))


def _placement_options(g, budget_s: float, evaluations: int) -> None:
    g.add_argument("--placement-evaluations", type=integer, default=evaluations, metavar="N",
                   help=f"with --topology: placements the search prices per plan (default "
                        f"{evaluations}; the same result on every run for a seed)")
    g.add_argument("--placement-time-s", type=float, default=budget_s, metavar="S",
                   help=f"with --topology: time cap of the placement search per plan "
                        f"(default {budget_s:g} s; when it binds, results may vary)")
    g.add_argument("--seed", type=integer, default=0,
                   help="seed of the placement search and of the random placements "
                        "(default 0)")


def add_estimate_arguments(p) -> None:
    groups = option_groups(p)
    _common(p, groups)
    for name in ESTIMATE_FIELDS:
        add_plan_option(groups[group_of(name)], name, required=name in ESTIMATE_REQUIRED)
    g = groups["topology and placement"]
    g.add_argument("--placement", default="default", metavar="default|optimized|FILE",
                   help="with --topology: where the ranks run: 'default' (Megatron's order "
                        "on the first hosts), 'optimized' (searched on the measured links), "
                        "or a plan.json / YAML with hosts and gpu_order (default: default)")
    _placement_options(g, 60.0, 2000)
    add_out(groups["output"], "save the plan document here (JSON: what 'explain' compares "
                              "and 'launch --plan' reads); refused if it exists without --force")
    add_force(groups["output"], "an existing --out file")


def run_estimate(args) -> int:
    from configurator.report.table import format_estimate

    fields = {name: getattr(args, name) for name in ESTIMATE_FIELDS}
    fields.update({name: getattr(args, name) for name in SEARCH_OPTIONS},
                  global_batch_size=args.gbs)
    out = estimate_job(EstimateRequest(inputs=_inputs(args), fields=fields,
                                       placement=args.placement,
                                       placement_time_s=args.placement_time_s,
                                       placement_evaluations=args.placement_evaluations,
                                       seed=args.seed, out=args.out, force=args.force))
    if args.json:
        print(jsonout.dumps(out.evaluation.to_dict(), indent=2))
    else:
        print(out.title)
        print(format_estimate(out.evaluation))
    if out.written:
        print(f"wrote {out.written}; compare it with another plan: configurator explain "
              f"{shlex.quote(out.written)} OTHER.json; scripts: configurator launch --plan "
              f"{shlex.quote(out.written)} --out DIR", file=sys.stderr if args.json else sys.stdout)
    return 0


def add_search_limits(groups) -> None:
    """The options that restrict a search's plans (``--recompute``, ``--tp 4 8``,
    ``--no-sequence-parallel`` …) and the data-parallel overlap every plan runs with
    (``--no-overlap-grad-reduce``): ``search``'s and ``trial``'s (:func:`search_limits`)."""
    g = groups["plan"]
    g.add_argument("--recompute", choices=RECOMPUTE, nargs="+",
                   help="restrict recompute choices (default: all)")
    for name in SEARCH_RESTRICTIONS:
        f = PLAN_FIELD[name]
        flag = f.cli_flag or f"--{name}"
        g.add_argument(flag, dest=name, type=integer, nargs="+",
                       metavar=(f.alias or flag.lstrip("-")).upper(),
                       help=f"restrict {f.megatron_name} to these values (default: all legal)")
    for name in SEARCH_SWITCHES:
        f = PLAN_FIELD[name]
        g.add_argument(f.cli_flag, dest=name, action=argparse.BooleanOptionalAction,
                       default=None,
                       help=f"only plans with (or, --no-, without) {f.megatron_name} "
                            "(default: both)")
    for name in SEARCH_DDP:
        add_plan_option(groups[group_of(name)], name)


def search_limits(args) -> SearchLimits:
    """What :func:`add_search_limits` parsed (:class:`SearchLimits`): the recompute
    choices, the fields given and the overlaps given."""
    return SearchLimits(
        recompute=tuple(args.recompute) if args.recompute else RECOMPUTE,
        restrict={k: getattr(args, k) for k in SEARCH_RESTRICTIONS + SEARCH_SWITCHES
                  if getattr(args, k) is not None},
        ddp={k: getattr(args, k) for k in SEARCH_DDP if getattr(args, k) is not None})


def add_search_arguments(p) -> None:
    groups = option_groups(p)
    _common(p, groups)
    add_search_limits(groups)
    g = groups["search"]
    g.add_argument("--top", type=integer, default=10,
                   help="plans to show, each priced on its exact schedule (1 to 1,000; "
                        "default 10)")
    g.add_argument("--max-memory-fraction", type=float, default=DEFAULT_MAX_MEMORY_FRACTION,
                   metavar="F",
                   help="keep plans whose predicted peak is at most F of GPU memory (0 < F "
                        f"<= 1, default {DEFAULT_MAX_MEMORY_FRACTION:g}: the estimate allows "
                        "for activation fragmentation, this leaves room for what it cannot "
                        "see: the caching allocator's split blocks, NCCL buffers of new "
                        "communicators, first-iteration spikes)")
    g.add_argument("--nodes-range", metavar="A:B",
                   help="best plan for every node count from A to B (iteration time, "
                        "tokens/s, tokens/s per GPU; --out adds scaling.png)")
    add_training_options(groups["time to train"])
    g = groups["topology and placement"]
    g.add_argument("--exclude-flagged", action="store_true",
                   help="with --topology: plan on the hosts the audit does not flag, and "
                        "report what the exclusion costs or saves")
    _placement_options(g, 10.0, 100)
    g = groups["output"]
    g.add_argument("--wide", action="store_true",
                   help="the ranked table's headers on one line (default: stacked on two "
                        "lines; every column is shown either way)")
    add_out(g, "write the best plan's launch scripts, its Megatron-Bridge overrides "
               "(bridge_overrides.yaml), plan.json, plans.json, table.txt, plans.png and "
               "report.html into this directory", metavar="DIR")
    add_force(g, "files in --out")


def run_search(args) -> int:
    req = SearchRequest(inputs=_inputs(args, args.exclude_flagged), global_batch_size=args.gbs,
                        options={name: getattr(args, name) for name in SEARCH_OPTIONS},
                        limits=search_limits(args), top=args.top,
                        max_memory_fraction=args.max_memory_fraction,
                        out=args.out, force=args.force,
                        placement_time_s=args.placement_time_s,
                        placement_evaluations=args.placement_evaluations, seed=args.seed,
                        training=training_request(args))
    if args.nodes_range is not None:
        return _run_scaling(args, req)
    out = search_job(req)
    if args.json:
        print(jsonout.dumps(out.document, indent=2))
        return 0
    from configurator.report.table import format_table

    print(out.header)
    print(format_table(out.result.plans, wide=args.wide))
    if not out.written:
        print(f"next: --out DIR writes plan 1's launch scripts; plan 1 in detail: "
              f"{estimate_command(args, out.result.plans[0].plan)}")
        return 0
    print(f"wrote {args.out}/: " + ", ".join(sorted(out.written, key=lambda n: (
        not n.startswith("launch"), n))))
    best = out.result.plans[0]
    for line in start_instructions(args.out, nodes=out.nodes,
                                   placed=best.placement is not None, data=False,
                                   plan_file=os.path.join(args.out, "plan.json")):
        print(line)
    if len(out.result.plans) > 1:
        plans = shlex.quote(os.path.join(args.out, "plans.json"))
        print(f"compare two plans: configurator explain {plans}:1 {plans}:2")
    return 0


def training_request(args):
    """The time-to-train options of ``args`` (:func:`add_training_options`)."""
    from configurator.app.training_jobs import TrainingRequest

    return TrainingRequest(train_tokens=args.train_tokens,
                           options={k: getattr(args, k) for k in TRAINING_OPTION_DESTS},
                           async_save=args.async_save, objective=args.objective,
                           deadline_days=args.deadline)


def estimate_command(args, plan) -> str:
    """The ``configurator estimate`` command line that prices ``plan`` as the search did:
    the search's model, cluster, nodes and options, and every plan field whose value
    ``estimate`` would not choose by itself (:func:`configurator.core.rules.plan_for_world`
    fills the ones left out)."""
    from configurator.core.rules import plan_for_world

    words = ["configurator", "estimate", "--model", args.model, "--cluster", args.cluster]
    nodes = args.nodes
    if args.topology:
        words += ["--topology", args.topology, "--placement", "optimized"]
    if nodes is not None:
        words += ["--nodes", str(nodes)]
    if args.gpus is not None:
        words += ["--gpus", str(args.gpus)]
    words += ["--gbs", str(args.gbs)]
    if args.seq_length is not None:
        words += ["--seq-length", str(args.seq_length)]
    for name in ("calibration", "profile"):
        if getattr(args, name):
            words += [f"--{name}", getattr(args, name)]
    # the plan's own search-wide fields: those given and the mechanisms the search chose
    given: dict = {name: getattr(plan, name) for name in SEARCH_OPTIONS
                   if getattr(plan, name) != PLAN_FIELD[name].default}
    for name in ESTIMATE_FIELDS:
        f = PLAN_FIELD[name]
        value = getattr(plan, name)
        if f.type is not bool and (name in ESTIMATE_REQUIRED or value != f.default):
            given[name] = value
    chosen = plan_for_world(given, plan.world_size)
    for name in ESTIMATE_FIELDS:   # switches estimate would set otherwise
        if PLAN_FIELD[name].type is bool and getattr(chosen, name) != getattr(plan, name):
            given[name] = getattr(plan, name)
    for name in (*ESTIMATE_FIELDS, *SEARCH_OPTIONS):
        if name in given:
            words += field_words(name, given[name])
    return " ".join(shlex.quote(w) for w in words)


def _run_scaling(args, req) -> int:
    from configurator.app.plan_jobs import parse_nodes_range, run_scaling
    from configurator.report.table import format_scaling

    if args.nodes is not None or args.gpus is not None:
        raise InputError("nodes_range", args.nodes_range, "give --nodes (or --gpus) or "
                         "--nodes-range, not both")
    lo, hi = parse_nodes_range(args.nodes_range, sample=args.train_tokens is not None)
    out = run_scaling(req, lo, hi)
    if args.json:
        print(jsonout.dumps(out.document, indent=2))
    else:
        print(out.header)
        print(format_scaling(out.rows))
        chosen = out.document.get("training", {}).get("chosen_nodes")
        if chosen is not None:
            row = next(r for r in out.rows if r["nodes"] == chosen)
            print(f"chosen {chosen} nodes: " + scaling_training_line(row))
        if out.written:
            print(f"wrote {args.out}/" + ", ".join(out.written))
    return 0


def scaling_training_line(row: dict) -> str:
    """One line of a priced sweep row: days, GPU-hours (cost), ETTR, the interval."""
    t = row["training"]
    cost = f", cost {t['cost']:,.0f}" if t["cost"] is not None else ""
    return (f"{t['days']:.1f} days, {t['gpu_hours']:,.0f} GPU-hours{cost}, ETTR "
            f"{t['ettr']:.3f}, checkpoint every {t['interval_iterations']} iterations "
            f"({t['interval_s'] / 60:.1f} min), energy {t['energy_MWh']:,.0f} MWh")


def add_launch_arguments(p) -> None:
    groups = option_groups(p)
    g = groups["model and cluster"]
    g.add_argument("--plan", required=True,
                   help="plan document: plan.json of search --out, or estimate --out FILE")
    g.add_argument("--nodes", type=integer,
                   help="the plan's node count (checked; a plan for another count is "
                        "another plan: re-plan with configurator search --nodes N)")
    g = groups["plan"]
    g.add_argument("--data-path", nargs="+", metavar="WORD",
                   help="Megatron --data-path: one dataset prefix, or a blend of several "
                        "(--data-path 0.3 /a 0.7 /b: weights and prefixes alternating); "
                        "needs --tokenizer-model (default: --mock-data)")
    g.add_argument("--tokenizer-model",
                   help="Hugging Face tokenizer name or path (required with --data-path)")
    add_out(groups["output"], "directory for the scripts and bridge_overrides.yaml (not a "
                              "symbolic link)",
            metavar="DIR", required=True)
    add_force(groups["output"], "existing scripts")


def run_launch(args) -> int:
    data = tuple(args.data_path) if args.data_path else None
    out = launch_job(LaunchRequest(plan_path=args.plan, out=args.out, nodes=args.nodes,
                                   data_path=data, tokenizer_model=args.tokenizer_model,
                                   force=args.force))
    print("wrote " + " and ".join(out.paths))
    print(out.placement)
    for line in out.next_steps:
        print(line)
    return 0


def add_explain_arguments(p) -> None:
    p.add_argument("plan_a", metavar="PLAN_A",
                   help="a plan document (plan.json of search --out, estimate --out FILE) "
                        "or FILE:N, entry N (1 = the best) of a plans.json")
    p.add_argument("plan_b", metavar="PLAN_B", help="another, as PLAN_A")
    add_json(option_groups(p)["output"], "the comparison")


def run_explain(args) -> int:
    from configurator.app.explain import explain_plans
    from configurator.report.table import format_explanation

    ex = explain_plans(args.plan_a, args.plan_b)
    print(jsonout.dumps(ex.to_dict(), indent=2) if args.json else format_explanation(ex))
    return 0
