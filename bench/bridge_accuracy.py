"""Megatron-Bridge pre-training throughput (the shipped table
``configurator/data/published/megatron_bridge_perf.csv``): predicted vs published iteration
time per row, MAPE and worst row per model (MoE: Qwen3-30B-A3B, GPT-OSS 120B; dense:
Llama-3 8B).

Run: ``python bench/bridge_accuracy.py`` (≈ 20 s). MoE rows use force-balanced routing, as
the cost model assumes (imbalance factor 1.0).
"""

from __future__ import annotations

from collections import defaultdict

from configurator.core.rules import check_plan
from configurator.cost.groundtruth import bridge_rows
from configurator.search.evaluate import evaluate_plan
from topology.cluster import load_cluster


def main() -> None:
    rows, skipped = bridge_rows()
    errs = defaultdict(list)
    print("| release | model | system | precision | GPUs | tp/pp/cp/vp/ep | mbs/gbs | "
          "published (s) | predicted (s) | error | peak (GiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cl = load_cluster(r.cluster, nodes=r.nodes)
        p = r.plan
        check_plan(r.model, p, p.world_size)
        e = evaluate_plan(r.model, cl, p)
        err = e.iteration_time_s / r.published_iteration_time_s - 1
        errs[r.model.name].append((abs(err), r))
        print(f"| {r.release} | {r.model.name} | {r.cluster} | {p.precision} | {p.world_size} "
              f"| {p.tp}/{p.pp}/{p.cp}/{p.vp}/{p.ep} | {p.micro_batch_size}/"
              f"{p.global_batch_size} | {r.published_iteration_time_s:.3f} "
              f"| {e.iteration_time_s:.3f} | {100 * err:+.1f} % "
              f"| {e.peak_memory_bytes / 2**30:.1f} |")
    print()
    print("| model | rows | MAPE | worst row |")
    print("|---|---|---|---|")
    for name, xs in errs.items():
        worst, row = max(xs, key=lambda x: x[0])
        mape = 100 * sum(x for x, _ in xs) / len(xs)
        print(f"| {name} | {len(xs)} | {mape:.1f} % | {100 * worst:.1f} % ({row.release} "
              f"{row.cluster} {row.plan.precision}) |")
    print()
    for s in skipped:
        print("skipped:", s)


if __name__ == "__main__":
    main()
