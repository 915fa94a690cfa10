"""``configurator search``, ``estimate`` and ``launch``: arguments and printing.

The plan options (``--tp``, ``--mbs``, ``--recompute``, ``--[no-]sequence-parallel`` …) are
generated from the plan schema (:data:`configurator.core.plan.PLAN_FIELDS`).
"""

from __future__ import annotations

import argparse

from configurator.app.inputs import JobInputs
from configurator.app.plan_jobs import (EstimateRequest, LaunchRequest, SearchRequest,
                                        run_estimate as estimate_job, run_launch as launch_job,
                                        run_search as search_job)
from configurator.core import jsonout
from configurator.core.errors import InputError
from configurator.core.model import MODEL_PRESETS
from configurator.core.plan import PLAN_FIELD, PLAN_FIELDS, RECOMPUTE, SEARCH_OPTIONS
from memory_model.estimate import DEFAULT_MAX_MEMORY_FRACTION
from topology.cluster import CLUSTER_PRESETS

#: Plan fields ``estimate`` takes as options (every field with a CLI flag; dp is derived).
ESTIMATE_FIELDS = tuple(f.name for f in PLAN_FIELDS
                        if f.cli_flag and f.name not in SEARCH_OPTIONS)
#: Plan fields ``search`` can be restricted to given values (``--ep 8 16``).
SEARCH_RESTRICTIONS = ("ep", "etp", "decoder_first_pipeline_num_layers",
                       "decoder_last_pipeline_num_layers")
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
        p.add_argument(f.cli_flag, dest=f.name, choices=f.choices,
                       default=f.default if default is None else default, help=f.help)
    else:
        p.add_argument(f.cli_flag, dest=f.name, type=f.type, required=required,
                       metavar=(f.alias or f.cli_flag.lstrip("-")).upper(),
                       default=None, help=f.help)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True,
                   help="preset name (" + ", ".join(MODEL_PRESETS) + "), a YAML/JSON file "
                        "with Megatron keys, or a Hugging Face config.json")
    p.add_argument("--cluster", required=True,
                   help="preset (" + ", ".join(CLUSTER_PRESETS) + ") or YAML/JSON file")
    p.add_argument("--nodes", type=int,
                   help="number of nodes (default: the cluster's own; with --topology, how "
                        "many of its hosts to use, at most all: the placement picks which)")
    p.add_argument("--gbs", type=int, required=True, help="global batch size (sequences)")
    p.add_argument("--seq-length", type=int, help="override the model's sequence length")
    for name in SEARCH_OPTIONS:
        add_plan_option(p, name)
    p.add_argument("--topology", metavar="FILE",
                   help="measured topology file (configurator topology import / probe): "
                        "collective and p2p times use its links")
    p.add_argument("--calibration", metavar="FILE",
                   help="calibrated GPU efficiencies (configurator calibrate -o FILE) in "
                        "place of the GPU preset's")
    p.add_argument("--profile", metavar="FILE",
                   help="measured layer times (configurator profile -o FILE, taken on the "
                        "cluster's GPU for this model and precision) in place of the analytic "
                        "layer compute at the shapes it holds")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _inputs(args, exclude_flagged: bool = False) -> JobInputs:
    return JobInputs(model=args.model, cluster=args.cluster, nodes=args.nodes,
                     seq_length=args.seq_length, topology=args.topology,
                     exclude_flagged=exclude_flagged,
                     calibration=getattr(args, "calibration", None),
                     profile=getattr(args, "profile", None))


def _placement_options(p, budget_s: float, evaluations: int) -> None:
    p.add_argument("--placement-evaluations", type=int, default=evaluations, metavar="N",
                   help=f"with --topology: placements the search prices per plan (default "
                        f"{evaluations}; the same result on every run for a seed)")
    p.add_argument("--placement-time-s", type=float, default=budget_s, metavar="S",
                   help=f"with --topology: time cap of the placement search per plan "
                        f"(default {budget_s:g} s; when it binds, results may vary)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the placement search and of the random placements "
                        "(default 0)")


def add_estimate_arguments(p) -> None:
    _common(p)
    for name in ESTIMATE_FIELDS:
        add_plan_option(p, name, required=name in ESTIMATE_REQUIRED)
    p.add_argument("--placement", default="default", metavar="default|optimized|FILE",
                   help="with --topology: where the ranks run: 'default' (Megatron's order "
                        "on the first hosts), 'optimized' (searched on the measured links), "
                        "or a plan.json / YAML with hosts and gpu_order (default: default)")
    _placement_options(p, 60.0, 2000)


def run_estimate(args) -> int:
    from configurator.report.table import format_estimate

    fields = {name: getattr(args, name) for name in ESTIMATE_FIELDS}
    fields.update({name: getattr(args, name) for name in SEARCH_OPTIONS},
                  global_batch_size=args.gbs)
    out = estimate_job(EstimateRequest(inputs=_inputs(args), fields=fields,
                                       placement=args.placement,
                                       placement_time_s=args.placement_time_s,
                                       placement_evaluations=args.placement_evaluations,
                                       seed=args.seed))
    if args.json:
        print(jsonout.dumps(out.evaluation.to_dict(), indent=2))
    else:
        print(out.title)
        print(format_estimate(out.evaluation))
    return 0


def add_search_arguments(p) -> None:
    _common(p)
    p.add_argument("--top", type=int, default=10, help="plans to show (default 10)")
    p.add_argument("--wide", action="store_true",
                   help="show every column of the ranked table (default: fit 100 columns)")
    p.add_argument("--out", metavar="DIR",
                   help="write the best plan's launch scripts, plan.json, plans.json, "
                        "table.txt and plans.png")
    p.add_argument("--force", action="store_true", help="overwrite files in --out")
    p.add_argument("--recompute", choices=RECOMPUTE, nargs="+",
                   help="restrict recompute choices (default: all)")
    for name in SEARCH_RESTRICTIONS:
        f = PLAN_FIELD[name]
        p.add_argument(f.cli_flag, dest=name, type=int, nargs="+",
                       metavar=(f.alias or f.cli_flag.lstrip("-")).upper(),
                       help=f"restrict {f.megatron_name} to these values (default: all legal)")
    p.add_argument("--max-memory-fraction", type=float, default=DEFAULT_MAX_MEMORY_FRACTION,
                   metavar="F",
                   help="keep plans whose predicted peak is at most F of GPU memory (0 < F "
                        f"<= 1, default {DEFAULT_MAX_MEMORY_FRACTION:g}: the estimate allows "
                        "for activation fragmentation, this leaves room for what it cannot "
                        "see: the caching allocator's split blocks, NCCL buffers of new "
                        "communicators, first-iteration spikes)")
    p.add_argument("--exclude-flagged", action="store_true",
                   help="with --topology: plan on the hosts the audit does not flag, and "
                        "report what the exclusion costs or saves")
    p.add_argument("--nodes-range", metavar="A:B",
                   help="best plan for every node count from A to B (iteration time, "
                        "tokens/s, tokens/s per GPU; --out adds scaling.png)")
    _placement_options(p, 10.0, 100)


def run_search(args) -> int:
    req = SearchRequest(inputs=_inputs(args, args.exclude_flagged), global_batch_size=args.gbs,
                        options={name: getattr(args, name) for name in SEARCH_OPTIONS},
                        recompute=tuple(args.recompute) if args.recompute else RECOMPUTE,
                        restrict={k: getattr(args, k) for k in SEARCH_RESTRICTIONS
                                  if getattr(args, k) is not None},
                        top=args.top, max_memory_fraction=args.max_memory_fraction,
                        out=args.out, force=args.force,
                        placement_time_s=args.placement_time_s,
                        placement_evaluations=args.placement_evaluations, seed=args.seed)
    if args.nodes_range is not None:
        return _run_scaling(args, req)
    out = search_job(req)
    if args.json:
        print(jsonout.dumps(out.document, indent=2))
    else:
        from configurator.report.table import format_table

        print(out.header)
        print(format_table(out.result.plans, wide=args.wide))
    if out.written and not args.json:
        print(f"wrote {args.out}/" + ", ".join(sorted(out.written, key=lambda n: (
            not n.startswith("launch"), n))))
    return 0


def _run_scaling(args, req) -> int:
    from configurator.app.plan_jobs import parse_nodes_range, run_scaling
    from configurator.report.table import format_scaling

    if args.nodes is not None:
        raise InputError("nodes_range", args.nodes_range, "give --nodes or --nodes-range, "
                         "not both")
    lo, hi = parse_nodes_range(args.nodes_range)
    out = run_scaling(req, lo, hi)
    if args.json:
        print(jsonout.dumps(out.document, indent=2))
    else:
        print(out.header)
        print(format_scaling(out.rows))
        if out.written:
            print(f"wrote {args.out}/" + ", ".join(out.written))
    return 0


def add_launch_arguments(p) -> None:
    p.add_argument("--plan", required=True, help="plan.json written by search --out")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="directory for the scripts (not a symbolic link)")
    p.add_argument("--nodes", type=int,
                   help="the plan's node count (checked; a plan for another count is "
                        "another plan: re-plan with configurator search --nodes N)")
    p.add_argument("--data-path", nargs="+", metavar="WORD",
                   help="Megatron --data-path: one dataset prefix, or a blend of several "
                        "(--data-path 0.3 /a 0.7 /b: weights and prefixes alternating); "
                        "needs --tokenizer-model (default: --mock-data)")
    p.add_argument("--tokenizer-model",
                   help="Hugging Face tokenizer name or path (required with --data-path)")
    p.add_argument("--force", action="store_true",
                   help="overwrite existing scripts (never through a symbolic link)")


def run_launch(args) -> int:
    data = tuple(args.data_path) if args.data_path else None
    out = launch_job(LaunchRequest(plan_path=args.plan, out=args.out, nodes=args.nodes,
                                   data_path=data, tokenizer_model=args.tokenizer_model,
                                   force=args.force))
    print("wrote " + " and ".join(out.paths))
    print(out.placement)
    return 0


def add_explain_arguments(p) -> None:
    p.add_argument("plan_a", metavar="PLAN_A", help="plan.json written by search --out")
    p.add_argument("plan_b", metavar="PLAN_B", help="another plan.json")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_explain(args) -> int:
    from configurator.app.explain import explain_plans
    from configurator.report.table import format_explanation

    ex = explain_plans(args.plan_a, args.plan_b)
    print(jsonout.dumps(ex.to_dict(), indent=2) if args.json else format_explanation(ex))
    return 0
