"""Search at scale: the whole CLI and the in-process search on very large clusters.

Cases: gpt-1t and llama3.1-405b on dgx-h100-80gb (8 GPUs per node) at 16,384, 131,072 and
262,144 GPUs (the cap: 32,768 nodes), global batch 16,384 and 8,192. Prints a markdown
table: candidates and feasible plans; in-process ``search`` time (best of ``--repeat``,
fresh cluster each time; cluster loading timed apart); the wall time of
``python -m configurator search ... --json`` (best of ``--repeat``, interpreter start and
imports included) and that process's peak resident memory. Also checks that no search built
the per-GPU link graph. Run: ``python -m bench.speed.scale`` (``--repeat N``, ``--nodes N ...``).
"""

from __future__ import annotations

import subprocess
import sys
import time

from bench.common import bench_parser, table_head
from configurator.core.model_presets import load_model
from configurator.search.rank import search
from topology.cluster_files import load_cluster

CLUSTER = "dgx-h100-80gb"
MODELS = ("gpt-1t", "llama3.1-405b")
NODES = (2048, 16384, 32768)
GBS = (16384, 8192)


#: Starts the CLI and reports its wall time and peak RSS. It runs in a small helper process:
#: on Linux a child's ru_maxrss counts the pages it inherited at fork, so forking the CLI
#: straight from this (large) benchmark process would report this process's size.
_HELPER = """
import os, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.Popen([sys.executable, "-m", "configurator", *sys.argv[1:]],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
_, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - t0
err = proc.stderr.read().decode()[-500:]
print(os.waitstatus_to_exitcode(status), wall, usage.ru_maxrss / 1024, repr(err))
"""


def cli_run(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one CLI run; raises if it fails."""
    out = subprocess.run([sys.executable, "-c", _HELPER, *args], capture_output=True,
                         text=True, check=True).stdout.split(" ", 3)
    code, wall, rss, err = int(out[0]), float(out[1]), float(out[2]), out[3]
    if code != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {code}: {err}")
    return wall, rss  # Linux ru_maxrss: KiB, turned into MiB above


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--nodes", type=int, nargs="+", default=list(NODES))
    ap.add_argument("--gbs", type=int, nargs="+", default=list(GBS))
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    opts = ap.parse_args(argv)
    print(table_head(["model", "GPUs", "gbs", "candidates", "feasible", "load cluster s",
                      "search s (in-process)", "CLI wall s", "CLI peak RSS MiB"],
                     ["---"] + ["---:"] * 8))
    for name in opts.models:
        model = load_model(name)
        for nodes in opts.nodes:
            for gbs in opts.gbs:
                best_load = best_search = float("inf")
                for _ in range(opts.repeat):
                    t0 = time.perf_counter()
                    cluster = load_cluster(CLUSTER, nodes=nodes)  # fresh caches each time
                    t1 = time.perf_counter()
                    res = search(model, cluster, gbs)
                    t2 = time.perf_counter()
                    best_load, best_search = min(best_load, t1 - t0), min(best_search, t2 - t1)
                    assert not cluster.graph_built, "the search built the link graph"
                runs = [cli_run(["search", "--model", name, "--cluster", CLUSTER, "--nodes",
                                 str(nodes), "--gbs", str(gbs), "--json"])
                        for _ in range(opts.repeat)]
                wall = min(w for w, _ in runs)
                rss = max(r for _, r in runs)
                print(f"| {name} | {nodes * 8:,} | {gbs:,} | {res.candidates_evaluated:,} | "
                      f"{res.feasible:,} | {best_load:.3f} | {best_search:.3f} | {wall:.2f} | "
                      f"{rss:.0f} |", flush=True)


if __name__ == "__main__":
    main()
