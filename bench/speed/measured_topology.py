"""A measured topology of many hosts: imported and searched, time and memory.

Writes a topology file of ``--hosts`` hosts (default 16,384 DGX H100 hosts, 131,072 GPUs)
holding what an nccl-tests ``sendrecv_perf`` sweep round a ring of hosts gives: one
host-level record per direction between ring neighbours (rates 40–48 GB/s, latencies
8–12 µs, seeded), so every other host pair is imputed. Then, in a fresh process, reads the
file, lays it over the preset cluster (``apply_topology``) and runs the search (llama3.1-405b,
gbs ``--gbs``); prints the phases' seconds, the process's wall time (interpreter start and
imports included) and its peak resident memory, best of ``--repeat`` runs. The placement
that ``configurator search --topology`` adds after the search is not part of it.
Run: ``python -m bench.speed.measured_topology`` (``--hosts N``, ``--gbs N``, ``--repeat N``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from bench.common import bench_parser, table_head

#: Runs in a fresh process: the phases' seconds, then ``ru_maxrss`` (KiB on Linux).
_CHILD = """
import resource, sys, time
t0 = time.perf_counter()
from configurator.core.model_presets import load_model
from configurator.search.rank import search
from topology.cluster_files import load_cluster
from topology.topofile import apply_topology
from topology.topofile_io import load_topology
t1 = time.perf_counter()
topo = load_topology(sys.argv[1])
t2 = time.perf_counter()
cluster = apply_topology(load_cluster("dgx-h100-80gb", len(topo.hosts)), topo)
t3 = time.perf_counter()
res = search(load_model("llama3.1-405b"), cluster, int(sys.argv[2]))
t4 = time.perf_counter()
assert not cluster.graph_built, "the search built the link graph"
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3, res.candidates_evaluated, res.feasible,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_ring_topology(path: str, hosts: int, seed: int) -> int:
    """The topology file described above; returns its record count."""
    import numpy as np

    from topology.topofile import LinkMeasurement, Topology
    from topology.topofile_io import save_topology

    rng = np.random.default_rng(seed)
    names = tuple(f"node{i:05d}" for i in range(hosts))
    bw = rng.uniform(40e9, 48e9, 2 * hosts)
    lat = rng.uniform(8e-6, 12e-6, 2 * hosts)
    links = []
    for i in range(hosts):
        for k, (a, b) in enumerate(((i, (i + 1) % hosts), ((i + 1) % hosts, i))):
            links.append(LinkMeasurement(
                src=names[a], dst=names[b], src_gpu=None, dst_gpu=None,
                bandwidth_Bps=float(bw[2 * i + k]), latency_s=float(lat[2 * i + k]),
                link_class="network", message_bytes=1 << 30,
                method="nccl-tests sendrecv_perf (synthetic ring)", timestamp=None,
                gpus_per_host=1, rails_used=1))
    save_topology(Topology(hosts=names, gpus_per_host=8, links=tuple(links)), path, force=True)
    return len(links)


def run_child(path: str, gbs: int) -> tuple[float, list[float]]:
    """(wall seconds, [imports, load, apply, search, candidates, feasible, peak RSS MiB])."""
    import time

    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, path, str(gbs)], capture_output=True,
                         text=True, check=True).stdout.split()
    wall = time.perf_counter() - t0
    vals = [float(x) for x in out]
    vals[-1] /= 1024     # KiB → MiB
    return wall, vals


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--hosts", type=int, default=16384)
    ap.add_argument("--gbs", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "topology.json")
        records = write_ring_topology(path, opts.hosts, opts.seed)
        size_mib = os.path.getsize(path) / 2**20
        runs = [run_child(path, opts.gbs) for _ in range(opts.repeat)]
    wall, vals = min(runs, key=lambda r: r[0])
    rss = max(v[-1] for _, v in runs)
    imports, load, apply, search_s, cands, feas, _ = vals
    print(table_head(["hosts", "GPUs", "records", "file MiB", "imports s", "load s",
                      "apply s", "search s", "load+apply+search s", "process wall s",
                      "peak RSS MiB", "candidates", "feasible"],
                     ["---:"] * 13))
    print(f"| {opts.hosts:,} | {opts.hosts * 8:,} | {records:,} | {size_mib:.1f} | "
          f"{imports:.2f} | {load:.2f} | {apply:.2f} | {search_s:.2f} | "
          f"{load + apply + search_s:.2f} | {wall:.2f} | {rss:.0f} | {int(cands):,} | "
          f"{int(feas):,} |")


if __name__ == "__main__":
    main()
