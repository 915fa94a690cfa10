"""``configurator search``, ``estimate`` and ``launch`` sub-commands."""

from __future__ import annotations

import argparse
import json
import os
import sys

from configurator import validate as v
from configurator.commands import command
from configurator.errors import InputError
from configurator.plan import ATTENTION_BACKENDS, PRECISION, RECOMPUTE, ParallelPlan

DEFAULT_MODEL, DEFAULT_CLUSTER, DEFAULT_NODES, DEFAULT_GBS = "gpt3-175b", "dgx-a100-80gb", 128, 1536


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True,
                   help="preset name (e.g. gpt3-175b, llama3-70b), a YAML/JSON file with "
                        "Megatron keys, or a Hugging Face config.json")
    p.add_argument("--cluster", required=True,
                   help="preset (dgx-a100-80gb, dgx-h100-80gb, dgx-h200-141gb) or YAML/JSON file")
    p.add_argument("--nodes", type=int, help="number of nodes (default: the cluster's own)")
    p.add_argument("--gbs", type=int, required=True, help="global batch size (sequences)")
    p.add_argument("--seq-length", type=int, help="override the model's sequence length")
    p.add_argument("--precision", choices=PRECISION, default="bf16",
                   help="bf16 (default), fp16, or fp8 (Transformer Engine GEMMs)")
    p.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="auto",
                   help="Megatron --attention-backend; local/unfused store the s*s scores")
    p.add_argument("--topology", metavar="FILE",
                   help="measured topology file (configurator topology import / probe): "
                        "collective and p2p times use its links")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _resolve(args, exclude_flagged: bool = False):
    """(model, cluster); with ``exclude_flagged`` the cluster keeps only the hosts the audit
    of ``--topology`` does not recommend draining (the world size shrinks)."""
    from configurator.model import load_model
    from topology.cluster import load_cluster

    model = load_model(args.model)
    if args.seq_length is not None:
        model = model.with_seq_length(args.seq_length)
    v.positive_int("gbs", args.gbs)
    if args.nodes is not None:
        v.positive_int("nodes", args.nodes)
    topo_path = getattr(args, "topology", None)
    if not topo_path:
        if exclude_flagged:
            raise InputError("exclude_flagged", True, "needs --topology FILE")
        return model, load_cluster(args.cluster, args.nodes)
    from topology.topofile import apply_topology, load_topology

    topo = load_topology(topo_path)
    nodes = args.nodes
    if exclude_flagged:
        topo = healthy_topology(topo)
        nodes = len(topo.hosts)
    return model, apply_topology(load_cluster(args.cluster, nodes), topo)


def healthy_topology(topo):
    """``topo`` without the hosts its audit recommends draining (and their links)."""
    import dataclasses

    from topology.audit import audit

    drop = set(audit(topo).drain_hosts)
    return dataclasses.replace(
        topo, hosts=tuple(h for h in topo.hosts if h not in drop),
        links=tuple(lk for lk in topo.links if lk.src not in drop and lk.dst not in drop),
        collectives=tuple(c for c in topo.collectives if not drop & set(c.hosts)),
        missing=tuple(m for m in topo.missing if m.src not in drop and m.dst not in drop))


def _bool_flag(p, name: str, help_: str) -> None:
    p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None, help=help_)


@command
def register_estimate(sub) -> None:
    p = sub.add_parser("estimate", help="predict memory and iteration time of one plan",
                       description="Predict per-stage memory and iteration time of one plan "
                                   "(dp is derived from the GPU count). Estimates also plans "
                                   "that do not fit (then fits is false).")
    _common(p)
    p.add_argument("--tp", type=int, required=True, help="tensor_model_parallel_size")
    p.add_argument("--pp", type=int, required=True, help="pipeline_model_parallel_size")
    p.add_argument("--cp", type=int, default=1, help="context_parallel_size (default 1)")
    p.add_argument("--vp", type=int, default=1,
                   help="virtual stages per pipeline rank (1 = no interleaving)")
    p.add_argument("--mbs", type=int, required=True, help="micro_batch_size")
    p.add_argument("--recompute", choices=RECOMPUTE, default="none",
                   help="activation recompute: none, selective (core attention) or full")
    _bool_flag(p, "sequence-parallel", "sequence parallelism (default: on when tp > 1)")
    _bool_flag(p, "distributed-optimizer",
               "shard optimizer state over data parallel (default: on when dp*cp > 1)")
    _bool_flag(p, "overlap-grad-reduce",
               "overlap the data-parallel gradient reduction with backward (default on)")
    p.set_defaults(func=run_estimate)


def plan_from_args(args, world: int) -> ParallelPlan:
    for name in ("tp", "pp", "cp", "vp", "mbs"):
        v.positive_int(name, getattr(args, name))
    mp = args.tp * args.pp * args.cp
    if world % mp:
        raise InputError("tp*pp*cp", mp, f"tp({args.tp}) * pp({args.pp}) * cp({args.cp}) = "
                         f"{mp} does not divide {world} GPUs")
    dp = world // mp
    sp = args.tp > 1 if args.sequence_parallel is None else args.sequence_parallel
    do = dp * args.cp > 1 if args.distributed_optimizer is None else args.distributed_optimizer
    ogr = True if args.overlap_grad_reduce is None else args.overlap_grad_reduce
    return ParallelPlan(tp=args.tp, pp=args.pp, dp=dp, cp=args.cp, vp=args.vp,
                        micro_batch_size=args.mbs, global_batch_size=args.gbs,
                        recompute=args.recompute, sequence_parallel=sp,
                        distributed_optimizer=do, precision=args.precision,
                        attention_backend=args.attention_backend, overlap_grad_reduce=ogr,
                        overlap_param_gather=ogr and do)


def run_estimate(args) -> int:
    from configurator.evaluate import evaluate_plan
    from configurator.report import format_estimate

    model, cluster = _resolve(args)
    plan = plan_from_args(args, cluster.num_gpus)
    e = evaluate_plan(model, cluster, plan)
    if args.json:
        print(json.dumps(e.to_dict(), indent=2))
    else:
        print(f"{model.name} on {cluster.num_nodes} x {cluster.gpus_per_node} "
              f"{cluster.gpu.name} ({cluster.name})")
        print(format_estimate(e))
    return 0


@command
def register_search(sub) -> None:
    p = sub.add_parser("search", help="rank every legal plan that fits in memory",
                       description="Enumerate every plan Megatron-LM accepts (tp, pp, dp, cp, "
                                   "vp, micro batch size, recompute, sequence parallel, "
                                   "distributed optimizer), drop those that do not fit, rank "
                                   "the rest by predicted iteration time.")
    _common(p)
    p.add_argument("--top", type=int, default=10, help="plans to show (default 10)")
    p.add_argument("--out", metavar="DIR",
                   help="write the best plan's launch scripts, plan.json, plans.json, table.txt")
    p.add_argument("--force", action="store_true", help="overwrite files in --out")
    p.add_argument("--recompute", choices=RECOMPUTE, nargs="+",
                   help="restrict recompute choices (default: all)")
    p.add_argument("--max-memory-fraction", type=float, default=1.0, metavar="F",
                   help="keep plans whose predicted peak is at most F of GPU memory "
                        "(0 < F <= 1, default 1: the model already allows for fragmentation)")
    p.add_argument("--exclude-flagged", action="store_true",
                   help="with --topology: plan on the hosts the audit does not flag, and "
                        "report what the exclusion costs or saves")
    p.set_defaults(func=run_search)


def run_search(args) -> int:
    from configurator.report import format_table
    from configurator.search import search
    from configurator.space import SearchSpace

    model, cluster = _resolve(args, exclude_flagged=args.exclude_flagged)
    v.positive_int("top", args.top)
    if not 0 < args.max_memory_fraction <= 1:
        raise InputError("max_memory_fraction", args.max_memory_fraction, "must be in (0, 1]")
    if args.out:
        _check_out(args.out, ("plan.json", "plans.json", "table.txt", "plans.png",
                              "launch_torchrun.sh", "launch_slurm.sbatch"), args.force)
    space = SearchSpace(recompute=tuple(args.recompute) if args.recompute else RECOMPUTE)
    res = search(model, cluster, args.gbs, precision=args.precision,
                 attention_backend=args.attention_backend, top_k=args.top, space=space,
                 keep_ranking=bool(args.out), max_memory_fraction=args.max_memory_fraction)
    table = format_table(res.plans)
    header = (f"{model.name} on {cluster.num_nodes} x {cluster.gpus_per_node} "
              f"{cluster.gpu.name} ({cluster.num_gpus} GPUs), gbs {args.gbs}, "
              f"seq {model.seq_length}, {args.precision}: {res.candidates_evaluated} plans "
              f"evaluated, {res.feasible} fit, {res.search_time_s:.3f} s")
    doc = res.to_dict()
    if args.exclude_flagged:
        doc["exclusion"] = _exclusion_effect(args, model, cluster, res, space)
        header += "\n" + doc["exclusion"]["summary"]
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(header)
        print(table)
    if args.out:
        _write_outputs(args.out, model, cluster, res, header + "\n" + table + "\n", args.force)
        if not args.json:
            print(f"wrote {args.out}/launch_torchrun.sh, launch_slurm.sbatch, plan.json, "
                  f"plans.json, table.txt, plans.png")
    return 0


def _exclusion_effect(args, model, healthy, res, space) -> dict:
    """Compare the best plan on the healthy hosts with the best on every host."""
    from configurator.errors import NoFeasiblePlanError
    from configurator.search import search

    _, full = _resolve(args)
    kept = set(healthy.hosts)
    excluded = [h for h in full.hosts if h not in kept]
    best = res.plans[0]
    out = {"excluded_hosts": excluded, "gpus_kept": healthy.num_gpus,
           "gpus_all": full.num_gpus, "iteration_time_s": best.iteration_time_s,
           "tokens_per_s": best.tokens_per_s_per_gpu * healthy.num_gpus}
    try:
        alls = search(model, full, args.gbs, precision=args.precision,
                      attention_backend=args.attention_backend, top_k=1, space=space).plans[0]
        out["all_hosts_iteration_time_s"] = alls.iteration_time_s
        out["all_hosts_tokens_per_s"] = alls.tokens_per_s_per_gpu * full.num_gpus
        change = 100 * (best.iteration_time_s / alls.iteration_time_s - 1)
        out["summary"] = (f"excluding {', '.join(excluded) or 'no host'}: best iteration "
                          f"{best.iteration_time_s:.3f} s on {healthy.num_gpus} GPUs vs "
                          f"{alls.iteration_time_s:.3f} s on all {full.num_gpus} GPUs "
                          f"({change:+.1f} %)")
    except (InputError, NoFeasiblePlanError) as err:
        out["summary"] = (f"excluding {', '.join(excluded) or 'no host'}; with all hosts no "
                          f"plan: {err}")
    return out


def _check_out(out: str, names, force: bool) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError("out", out, "exists and is not a directory")
    if not force:
        for n in names:
            path = os.path.join(out, n)
            if os.path.exists(path):
                raise InputError("out", path, "exists; pass --force to overwrite")


def _summary(estimate: dict) -> dict:
    """Predicted figures written into the launch script's header comment."""
    return {"iteration_time_s": round(estimate["iteration_time_s"], 3),
            "model_tflops_per_gpu": round(estimate["model_tflops_per_gpu"], 1),
            "mfu": round(estimate["mfu"], 3),
            "peak_memory_GiB": round(estimate["peak_memory_bytes"] / 2**30, 2)}


def plan_document(model, cluster, evaluation) -> dict:
    """The saved plan: what ``configurator launch`` needs to write the scripts again."""
    return {"model": model.to_dict(), "cluster": cluster.to_dict(),
            "estimate": evaluation.to_dict()}


def _write_outputs(out: str, model, cluster, res, table: str, force: bool) -> None:
    from launchers import write_launch_files

    os.makedirs(out, exist_ok=True)
    best = res.plans[0]
    write_launch_files(out, model, best.plan, nodes=cluster.num_nodes,
                       gpus_per_node=cluster.gpus_per_node, force=force,
                       summary=_summary(best.to_dict()))
    with open(os.path.join(out, "plan.json"), "w", encoding="utf-8") as fh:
        json.dump(plan_document(model, cluster, best), fh, indent=2)
    with open(os.path.join(out, "plans.json"), "w", encoding="utf-8") as fh:
        json.dump(res.to_dict(), fh, indent=2)
    with open(os.path.join(out, "table.txt"), "w", encoding="utf-8") as fh:
        fh.write(table)
    from configurator.plot import plot_search
    from configurator.search import candidate_memory

    plot_search(os.path.join(out, "plans.png"),
                peak_memory_bytes=candidate_memory(model, res.ranked),
                iteration_time_s=res.ranked_time_s, recompute=res.ranked.recompute,
                capacity_bytes=cluster.gpu.memory_bytes,
                title=f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name}: "
                      f"{res.feasible} feasible plans")


@command
def register_launch(sub) -> None:
    p = sub.add_parser("launch", help="write launch scripts from a saved plan JSON",
                       description="Write the torchrun and SLURM launch scripts of a plan "
                                   "saved by 'configurator search --out' (plan.json).")
    p.add_argument("--plan", required=True, help="plan.json written by search --out")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the scripts")
    p.add_argument("--nodes", type=int, help="override the node count")
    p.add_argument("--data-path", help="Megatron --data-path (default: --mock-data)")
    p.add_argument("--tokenizer-model", help="tokenizer model file for --data-path runs")
    p.add_argument("--force", action="store_true", help="overwrite existing scripts")
    p.set_defaults(func=run_launch)


def run_launch(args) -> int:
    from configurator.model import make_model
    from launchers import write_launch_files

    doc = v.load_mapping_file("plan", args.plan)
    try:
        model = make_model(**doc["model"])
        cfg = dict(doc["estimate"]["config"])
        cluster = doc["cluster"]
    except (KeyError, TypeError) as err:
        raise InputError("plan", args.plan, f"not a plan.json written by search --out "
                         f"(missing {err})") from None
    fields = {f for f in ParallelPlan.__dataclass_fields__}
    plan = ParallelPlan(**{k: val for k, val in cfg.items() if k in fields})
    nodes = v.positive_int("nodes", args.nodes if args.nodes else cluster["nodes"])
    gpn = v.positive_int("gpus_per_node", cluster["gpus_per_node"])
    if nodes * gpn != plan.world_size:
        raise InputError("nodes", nodes, f"nodes * gpus_per_node ({nodes * gpn}) must equal "
                         f"the plan's world size tp*pp*dp*cp ({plan.world_size})")
    _check_out(args.out, ("launch_torchrun.sh", "launch_slurm.sbatch"), args.force)
    os.makedirs(args.out, exist_ok=True)
    write_launch_files(args.out, model, plan, nodes=nodes, gpus_per_node=gpn, force=args.force,
                       data_path=args.data_path, tokenizer_model=args.tokenizer_model,
                       summary=_summary(doc["estimate"]))
    print(f"wrote {args.out}/launch_torchrun.sh and {args.out}/launch_slurm.sbatch",
          file=sys.stdout)
    return 0
