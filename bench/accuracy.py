"""Predicted vs published iteration time for every row of SC'21 Table 1 (markdown table).

Published time: T = F / (TFLOP/s · 1e12 · GPUs) with F = 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))
(the FLOPs the paper counts). Run: ``python bench/accuracy.py``.
"""

from configurator.search.evaluate import evaluate_plan
from configurator.cost.groundtruth import sc21_rows
from topology.cluster import load_cluster


def main() -> None:
    print("| model | GPUs | tp | pp | vp | mbs | GBS | published TFLOP/s | published s "
          "| predicted s | error | peak memory GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for r in sc21_rows():
        e = evaluate_plan(r.model, load_cluster("dgx-a100-80gb", nodes=r.num_gpus // 8), r.plan)
        err = e.iteration_time_s / r.published_iteration_time_s - 1
        worst = max(worst, abs(err))
        p = r.plan
        print(f"| {r.model.name} | {r.num_gpus} | {p.tp} | {p.pp} | {p.vp} | "
              f"{p.micro_batch_size} | {p.global_batch_size} | {r.published_tflops_per_gpu:g} | "
              f"{r.published_iteration_time_s:.2f} | {e.iteration_time_s:.2f} | "
              f"{100 * err:+.1f} % | {e.peak_memory_bytes / 2**30:.1f} |")
    print(f"\nworst |error|: {100 * worst:.1f} %")


if __name__ == "__main__":
    main()
