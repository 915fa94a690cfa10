"""How the model's prices of small single-node A100 plans moved between two versions of it.

``price`` writes the iteration time a source tree (``--tree``, default this one) predicts for
every legal plan of the single-node grid of :mod:`bench.accuracy.calibrate_synthetic` (GPT
models of hidden 1,024 and 2,048 with 12 and 24 layers on 1-8 GPUs of one DGX A100, global
batches 8-128, FP16, full recompute, the plan's other fields at their defaults); ``compare``
prints the mean ratio of a second file's times to a first's, plan by plan, by tp, pp, micro
batch size and hidden size. A tree is any checkout of this project, an older commit included
(``git worktree add``): the script imports its ``configurator`` and ``topology``, and needs
only ``make_model``, ``ParallelPlan``, ``evaluate_plan`` and the cluster presets.

It tells which plans a change of the model made slower or faster, and by how much, without
measured runs: the no-see-saw check for the small plans no published source covers.

Run: ``python -m bench.accuracy.grid_drift price old.json --tree ../old-checkout``, ``python
-m bench.accuracy.grid_drift price new.json``, then ``python -m bench.accuracy.grid_drift
compare old.json new.json`` (about 5 s per tree).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections import defaultdict

#: The grid (as :mod:`bench.accuracy.calibrate_synthetic`'s): (hidden, layers), GPUs of one
#: DGX A100, global batches, tp and pp sizes, micro batch sizes.
MODELS = ((1024, 12), (1024, 24), (2048, 12), (2048, 24))
GPUS = (1, 2, 4, 8)
GLOBAL_BATCHES = (8, 16, 32, 64, 128)
SIZES = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)


def grid() -> list[dict]:
    """Every legal plan of the grid as a plain dict (hidden, layers, GPUs, gbs, tp, pp, dp,
    mbs)."""
    out = []
    for (h, layers), n, gbs, tp, pp, mbs in itertools.product(
            MODELS, GPUS, GLOBAL_BATCHES, SIZES, SIZES, MICRO_BATCHES):
        if n % (tp * pp) or layers % pp or gbs % (mbs * (n // (tp * pp))):
            continue
        out.append(dict(hidden=h, layers=layers, gpus=n, gbs=gbs, tp=tp, pp=pp,
                        dp=n // (tp * pp), mbs=mbs))
    return out


def model_fields(hidden: int, layers: int) -> dict:
    """``make_model`` keywords of the grid's GPT of ``hidden`` and ``layers`` (heads of 64,
    vocabulary 51,200, sequence 1,024)."""
    return dict(name=f"gpt-h{hidden}-l{layers}", num_layers=layers, hidden_size=hidden,
                num_attention_heads=hidden // 64, vocab_size=51200, seq_length=1024)


def plan_fields(r: dict) -> dict:
    """``ParallelPlan`` keywords of one row of :func:`grid` (FP16, full recompute, the
    other fields at their defaults)."""
    return dict(tp=r["tp"], pp=r["pp"], dp=r["dp"], micro_batch_size=r["mbs"],
                global_batch_size=r["gbs"], recompute="full", precision="fp16")


def price(tree: str | None) -> list[dict]:
    """The grid with each plan's predicted ``iteration_time_s`` by the tree's model."""
    if tree:
        sys.path.insert(0, tree)
    from configurator.core.model_presets import make_model
    from configurator.core.plan import ParallelPlan
    from configurator.search.evaluate import evaluate_plan
    from topology.cluster_files import CLUSTER_PRESETS, cluster_from_config, load_cluster

    data = CLUSTER_PRESETS["dgx-a100-80gb"]
    clusters = {n: load_cluster("dgx-a100-80gb", 1) if n == 8 else cluster_from_config(
        {**data, "gpus_per_node": n, "nvlink_domain_gpus": n}, 1) for n in GPUS}
    models = {}
    rows = grid()
    for r in rows:
        key = (r["hidden"], r["layers"])
        if key not in models:
            models[key] = make_model(**model_fields(*key))
        r["iteration_time_s"] = evaluate_plan(models[key], clusters[r["gpus"]],
                                              ParallelPlan(**plan_fields(r))).iteration_time_s
    return rows


def compare(old: list[dict], new: list[dict]) -> list[tuple[str, int, float, float]]:
    """``(bucket, plans, mean ratio, geometric-mean ratio)`` of new over old times, by tp,
    pp, mbs and hidden size, then over all (plans matched by their fields)."""
    key = ("hidden", "layers", "gpus", "gbs", "tp", "pp", "mbs")
    before = {tuple(r[k] for k in key): r["iteration_time_s"] for r in old}
    by = defaultdict(list)
    for r in new:
        t0 = before.get(tuple(r[k] for k in key))
        if t0 is None:
            continue
        ratio = r["iteration_time_s"] / t0
        for field in ("tp", "pp", "mbs", "hidden"):
            by[f"{field} {r[field]}"].append(ratio)
        by["all"].append(ratio)
    order = sorted(by, key=lambda b: (b == "all", b.split()[0], int(b.split()[-1])
                                      if b != "all" else 0))
    return [(b, len(by[b]), statistics.mean(by[b]),
             math.exp(statistics.mean(map(math.log, by[b])))) for b in order]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("price", help="price the grid with a tree's model")
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--tree", help="source tree whose model prices (default: this one)")
    c = sub.add_parser("compare", help="ratios of a second file's times to a first's")
    c.add_argument("old")
    c.add_argument("new")
    args = ap.parse_args(argv)
    if args.command == "price":
        rows = price(args.tree)
        with open(args.out, "w") as f:
            json.dump(rows, f)
        print(f"{len(rows)} plans priced -> {args.out}")
        return
    with open(args.old) as f:
        old = json.load(f)
    with open(args.new) as f:
        new = json.load(f)
    print("| plans | count | mean new/old | geometric mean |\n|---|---:|---:|---:|")
    for b, n, mean, gmean in compare(old, new):
        print(f"| {b} | {n} | {mean:.3f} | {gmean:.3f} |")


if __name__ == "__main__":
    main()
