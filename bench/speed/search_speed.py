"""Search speed: full search wall time and candidates evaluated per second.

Cases: gpt3-175b on 128 dgx-a100-80gb nodes (gbs 1536), gpt-1t on 384 (gbs 3072) and
llama3.1-405b on 2,048 dgx-h100-80gb nodes (16,384 GPUs, gbs 16384).
Prints in-process search time (best of ``--repeats``, default 5) and the wall time of the
whole CLI command (interpreter start and imports included).
Run: ``python -m bench.speed.search_speed [--repeats 5]``.
"""

from __future__ import annotations

import subprocess
import sys
import time

from bench.common import bench_parser, table_head
from configurator.core.model_presets import load_model
from configurator.search.rank import search
from topology.cluster_files import load_cluster

CASES = [("gpt3-175b", "dgx-a100-80gb", 128, 1536), ("gpt-1t", "dgx-a100-80gb", 384, 3072),
         ("llama3.1-405b", "dgx-h100-80gb", 2048, 16384)]


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=5,
                    help="in-process searches per case, the best kept (default 5)")
    args = ap.parse_args(argv)
    print(table_head(["model", "GPUs", "candidates", "feasible",
                      f"search s (best of {args.repeats})", "candidates/s", "CLI wall s"]))
    for name, preset, nodes, gbs in CASES:
        model, best = load_model(name), float("inf")
        for _ in range(args.repeats):
            cluster = load_cluster(preset, nodes=nodes)  # fresh caches each time
            t0 = time.perf_counter()
            res = search(model, cluster, gbs)
            best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "configurator", "search", "--model", name,
                        "--cluster", preset, "--nodes", str(nodes), "--gbs",
                        str(gbs)], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        print(f"| {name} | {nodes * 8} | {res.candidates_evaluated} | {res.feasible} | "
              f"{best:.3f} | {res.candidates_evaluated / best:,.0f} | {wall:.2f} |")


if __name__ == "__main__":
    main()
