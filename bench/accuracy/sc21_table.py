"""Predicted vs published iteration time for every row of SC'21 Table 1 (markdown table).

Published time: T = F / (TFLOP/s · 1e12 · GPUs) with F = 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))
(the FLOPs the paper counts). Run: ``python -m bench.accuracy.sc21_table``.
"""

from bench.common import bench_parser, sc21_cluster, table_head
from configurator.cost.groundtruth import sc21_rows
from configurator.search.evaluate import evaluate_plan


def main(argv=None) -> None:
    bench_parser(__doc__).parse_args(argv)
    print(table_head(["model", "GPUs", "tp", "pp", "vp", "mbs", "GBS", "published TFLOP/s",
                      "published s", "predicted s", "error", "peak memory GiB"]))
    worst = 0.0
    for r in sc21_rows():
        e = evaluate_plan(r.model, sc21_cluster(r), r.plan)
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
