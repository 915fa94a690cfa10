"""Search speed: full search wall time and candidates evaluated per second.

Cases: gpt3-175b on 128 dgx-a100-80gb nodes (gbs 1536), gpt-1t on 384 (gbs 3072) and
llama3.1-405b on 256 and 2,048 dgx-h100-80gb nodes (2,048 and 16,384 GPUs, gbs 16384).
Prints the first search's time in a process, with the compiled pipeline schedules of
:func:`~configurator.cost.schedule_sim.schedule_order` not cached yet (what one CLI search
pays), in-process search time (best of ``--repeats``, default 5, the schedules cached), the
minor page faults of
one search (``getrusage``'s ``ru_minflt``, the mean over the repeats) and the wall time of the
whole CLI command (interpreter start and imports included). The process sets the memory
allocator's thresholds as the command line does (:mod:`configurator.core.allocator`);
``--default-allocator`` leaves glibc's defaults (the figure a library caller who does not set
them gets).
``--instructions`` prints instead the CPU instructions one search executes, counted by
valgrind's callgrind (one search in a fresh process, then three: half the difference is one
search after the first): a figure that does not move with the machine's load, for
before/after pairs on a shared machine (needs ``valgrind`` on the PATH; about 5 minutes).
Run: ``python -m bench.speed.search_speed [--repeats 5] [--default-allocator]
[--instructions]``.
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
import time

from bench.common import bench_parser, table_head
from configurator.core.allocator import tune_allocator
from configurator.core.model_presets import load_model
from configurator.cost.schedule_sim import clear_cache, schedule_order
from configurator.search.rank import search
from topology.cluster_files import load_cluster

CASES = [("gpt3-175b", "dgx-a100-80gb", 128, 1536), ("gpt-1t", "dgx-a100-80gb", 384, 3072),
         ("llama3.1-405b", "dgx-h100-80gb", 256, 16384),
         ("llama3.1-405b", "dgx-h100-80gb", 2048, 16384)]

#: Runs ``searches`` searches of one case in a fresh process (argv: case index, searches).
_CHILD = """
import sys
from bench.speed.search_speed import CASES, searches
searches(CASES[int(sys.argv[1])], int(sys.argv[2]))
"""


def searches(case, n: int) -> None:
    """``n`` searches of ``case``, each on a fresh cluster and simulation cache."""
    name, preset, nodes, gbs = case
    model = load_model(name)
    for _ in range(n):
        clear_cache()
        search(model, load_cluster(preset, nodes=nodes), gbs)


def instructions(case_index: int, n: int) -> int:
    """Instructions callgrind counts in a fresh process running ``n`` searches."""
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, "-c", _CHILD, str(case_index), str(n)],
                         capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1))


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=5,
                    help="in-process searches per case, the best kept (default 5)")
    ap.add_argument("--instructions", action="store_true",
                    help="count the instructions of one search with valgrind instead of "
                         "timing it")
    ap.add_argument("--default-allocator", action="store_true",
                    help="time the in-process searches under glibc's default malloc "
                         "thresholds, not the command line's")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print(f"search_speed: --repeats {args.repeats}: must be at least 1", file=sys.stderr)
        return 2
    if args.instructions:
        if shutil.which("valgrind") is None:
            print("search_speed: --instructions needs valgrind on the PATH", file=sys.stderr)
            return 2
        print(table_head(["model", "GPUs", "instructions of one search (10⁹)",
                          "with start-up, imports and a first search (10⁹)"]))
        for i, (name, _, nodes, _) in enumerate(CASES):
            one, three = instructions(i, 1), instructions(i, 3)
            print(f"| {name} | {nodes * 8} | {(three - one) / 2e9:.3f} | {one / 1e9:.2f} |")
        return 0
    tuned = not args.default_allocator and tune_allocator()
    print(f"in-process searches: {'the command line' if tuned else 'glibc'}'s malloc "
          f"thresholds")
    print(table_head(["model", "GPUs", "candidates", "feasible", "first search s",
                      f"search s (best of {args.repeats})", "candidates/s",
                      "page faults per search", "CLI wall s"]))
    for name, preset, nodes, gbs in CASES:
        model, best, faults = load_model(name), float("inf"), 0
        schedule_order.cache_clear()      # the first search compiles its schedules
        clear_cache()
        t0 = time.perf_counter()
        search(model, load_cluster(preset, nodes=nodes), gbs)
        first = time.perf_counter() - t0
        for _ in range(args.repeats):
            cluster = load_cluster(preset, nodes=nodes)  # fresh caches each time
            clear_cache()     # the simulated schedules of the repeat before
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            res = search(model, cluster, gbs)
            best = min(best, time.perf_counter() - t0)
            faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "configurator", "search", "--model", name,
                        "--cluster", preset, "--nodes", str(nodes), "--gbs",
                        str(gbs)], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        print(f"| {name} | {nodes * 8} | {res.candidates_evaluated} | {res.feasible} | "
              f"{first:.3f} | {best:.3f} | {res.candidates_evaluated / best:,.0f} | "
              f"{faults / args.repeats:,.0f} | {wall:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
