"""Search speed: full search wall time and candidates evaluated per second.

Cases: gpt3-175b on 128 dgx-a100-80gb nodes (gbs 1536) and gpt-1t on 384 nodes (gbs 3072).
Prints in-process search time (best of 5) and the wall time of the whole CLI command
(interpreter start and imports included). Run: ``python bench/search_speed.py``.
"""

from __future__ import annotations

import subprocess
import sys
import time

from configurator.core.model import load_model
from configurator.search.rank import search
from topology.cluster import load_cluster

CASES = [("gpt3-175b", 128, 1536), ("gpt-1t", 384, 3072)]


def main() -> None:
    print("| model | GPUs | candidates | feasible | search s (best of 5) | candidates/s | CLI wall s |")
    print("|---|---|---|---|---|---|---|")
    for name, nodes, gbs in CASES:
        model, best = load_model(name), float("inf")
        for _ in range(5):
            cluster = load_cluster("dgx-a100-80gb", nodes=nodes)  # fresh caches each time
            t0 = time.perf_counter()
            res = search(model, cluster, gbs)
            best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "configurator", "search", "--model", name,
                        "--cluster", "dgx-a100-80gb", "--nodes", str(nodes), "--gbs",
                        str(gbs)], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        print(f"| {name} | {nodes * 8} | {res.candidates_evaluated} | {res.feasible} | "
              f"{best:.3f} | {res.candidates_evaluated / best:,.0f} | {wall:.2f} |")


if __name__ == "__main__":
    main()
