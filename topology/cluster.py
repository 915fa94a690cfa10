"""The cluster as a directed networkx graph whose edges carry attained bandwidths.

Nodes: ``"<host>/gpu<k>"`` (kind ``gpu``), the NVLink switch of each NVLink domain
(``switch``: ``"<host>/nvswitch"`` where a domain is one host, ``"domain<d>/nvswitch"`` where
it spans several), ``"<host>/nic<k>"`` (``nic``, one rail per GPU as on DGX systems) and
``"fabric"``.
Edges are directional and carry ``bandwidth_Bps`` (what a transfer attains, bytes/s),
``nominal_bandwidth_Bps``, ``latency_s`` and ``link_class``. Measured links (a later import)
are added as direct edges ``gpu→gpu``, ``nic→nic`` (same rail, two hosts) or ``host→host``
(applies to every rail) with ``measured=True``; they take precedence over the nominal path.

Which GPU a rank runs on is :attr:`Cluster.placement` (:mod:`topology.placement`, which owns
Megatron's rank order ``tp-cp-ep-dp-pp`` and the rank → (host, GPU) map).

Hosts and NVLink domains. A *host* is what torchrun and SLURM call a node (``gpus_per_node``
processes, one ``--node-rank``); an *NVLink domain* is the set of GPUs that reach each other
over NVLink at full speed through one NVLink switch fabric. On DGX systems a domain is one
host; on GB200/GB300 NVL72 racks it is 18 compute trays of 4 GPUs (72 GPUs, one host per
tray). ``nvlink_domain_gpus`` (a multiple of ``gpus_per_node``, default one host) groups the
hosts in order into domains (the last one may be partial); every link-speed decision below
asks "same domain?" (:meth:`Cluster.same_domain`), never "same host?", while launchers and
placements keep counting hosts. Inside a domain a transfer goes GPU→switch→GPU; between
domains over the GPUs' NICs; a ring crossing domains runs one rail per member a domain holds.

Scale: the graph is built on first access of :attr:`Cluster.graph` (measured links are added
to it); a cluster nobody asked the graph of answers :meth:`Cluster.link` from its nominal
:attr:`Cluster.spec`. On a uniform cluster with the identity placement, the worst group
figures come from the groups' shape (:func:`uniform_group_shape`), in time independent of
the GPU count and bit for bit what walking every hop gives (``tests/test_scale.py``).
"""

from __future__ import annotations

import copy

import functools
import math
from typing import Any, Iterable, Mapping

import networkx as nx
import numpy as np

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.units import GB, US
from topology.gpus import GPUSpec, gpu_from_config
from topology.placement import Placement

# Attained fraction of the nominal per-direction link rate for large NCCL transfers.
# NVLink/NVSwitch: nccl-tests all_reduce busbw ≈ 230 GB/s of 300 GB/s on DGX A100 and
# ≈ 370 of 450 GB/s on DGX H100 (NVIDIA nccl-tests results; shared REFERENCE §5).
# InfiniBand: ≈ 23.5 of 25 GB/s (HDR 200 Gb/s) and 45–48 of 50 GB/s (NDR 400 Gb/s).
DEFAULT_INTRA_EFFICIENCY = 0.77
DEFAULT_INTER_EFFICIENCY = 0.94

CLUSTER_KEYS_REQUIRED = ("gpu", "gpus_per_node", "nodes", "intra_node_bandwidth_GBps",
                         "inter_node_bandwidth_GBps", "intra_node_latency_us",
                         "inter_node_latency_us")
CLUSTER_KEYS_OPTIONAL = ("name", "intra_node_efficiency", "inter_node_efficiency",
                         "nvlink_domain_gpus")

#: Presets, in the YAML schema. Bandwidths are nominal, per GPU, per direction; the
#: ``intra_node_*`` figures are those of the NVLink domain (a host unless
#: ``nvlink_domain_gpus`` says otherwise), the ``inter_node_*`` ones those between domains.
#: NVLink 5 (Blackwell): 18 links × 50 GB/s = 1.8 TB/s bidirectional per GPU, i.e. 900 GB/s
#: per direction; attained ≈ 811 GB/s all-reduce bus bandwidth (nccl-tests all_reduce_perf
#: over 8 GB200 GPUs of two compute trays through the NVLink switches, lixueduan.com,
#: "GB200 MNNVL" test), efficiency 811/900. Scale-out NICs are per GPU; ConnectX-7
#: 400 Gb/s = 50 GB/s attains 46.5 (NDR, as DGX H100), ConnectX-8 800 Gb/s = 100 GB/s taken
#: at the same 0.93 (no XDR measurement at hand).
CLUSTER_PRESETS: dict[str, dict[str, Any]] = {
    # DGX A100: NVLink3 12 links x 25 GB/s = 300 GB/s per direction through NVSwitch;
    # 8x HDR 200 Gb/s ConnectX-6 (one per GPU) = 25 GB/s (NVIDIA DGX A100 User Guide).
    "dgx-a100-80gb": dict(name="dgx-a100-80gb", gpu="a100-80gb", gpus_per_node=8, nodes=16,
                          intra_node_bandwidth_GBps=300, inter_node_bandwidth_GBps=25,
                          intra_node_latency_us=3.0, inter_node_latency_us=6.0,
                          intra_node_efficiency=230 / 300, inter_node_efficiency=23.5 / 25),
    # DGX H100: NVLink4 18 links x 25 GB/s = 450 GB/s per direction; 8x NDR 400 Gb/s
    # ConnectX-7 = 50 GB/s (NVIDIA DGX H100 User Guide).
    "dgx-h100-80gb": dict(name="dgx-h100-80gb", gpu="h100-80gb", gpus_per_node=8, nodes=16,
                          intra_node_bandwidth_GBps=450, inter_node_bandwidth_GBps=50,
                          intra_node_latency_us=3.0, inter_node_latency_us=6.0,
                          intra_node_efficiency=370 / 450, inter_node_efficiency=46.5 / 50),
    # DGX H200: same NVLink4 / NDR fabric as DGX H100 (NVIDIA DGX H200 data sheet).
    "dgx-h200-141gb": dict(name="dgx-h200-141gb", gpu="h200-141gb", gpus_per_node=8,
                           nodes=16, intra_node_bandwidth_GBps=450,
                           inter_node_bandwidth_GBps=50, intra_node_latency_us=3.0,
                           inter_node_latency_us=6.0, intra_node_efficiency=370 / 450,
                           inter_node_efficiency=46.5 / 50),
    # DGX B200: 8 B200, two NVSwitch chips with 14.4 TB/s aggregate NVLink 5 bandwidth, i.e.
    # 1.8 TB/s per GPU bidirectional = 900 GB/s per direction; "4x OSFP ports serving 8x
    # single-port NVIDIA ConnectX-7 VPI, up to 400 Gb/s" = 50 GB/s per GPU (NVIDIA DGX B200
    # data sheet and DGX B200 User Guide, hardware overview).
    "dgx-b200-180gb": dict(name="dgx-b200-180gb", gpu="b200-180gb", gpus_per_node=8,
                           nodes=16, intra_node_bandwidth_GBps=900,
                           inter_node_bandwidth_GBps=50, intra_node_latency_us=3.0,
                           inter_node_latency_us=6.0, intra_node_efficiency=811 / 900,
                           inter_node_efficiency=46.5 / 50),
    # DGX B300: 8 B300 on NVLink 5 through NVSwitch, 1.8 TB/s per GPU bidirectional = 900 GB/s
    # per direction; "8x OSFP ports serving 8x single-port NVIDIA ConnectX-8 VPI, up to
    # 800 Gb/s" = 100 GB/s per GPU (NVIDIA DGX B300 data sheet).
    "dgx-b300-288gb": dict(name="dgx-b300-288gb", gpu="b300-288gb", gpus_per_node=8,
                           nodes=16, intra_node_bandwidth_GBps=900,
                           inter_node_bandwidth_GBps=100, intra_node_latency_us=3.0,
                           inter_node_latency_us=6.0, intra_node_efficiency=811 / 900,
                           inter_node_efficiency=46.5 / 50),
    # GB200 NVL72: 18 compute trays of 2 Grace CPUs + 4 GB200 GPUs (one host each), 9 NVLink
    # switch trays joining all 72 GPUs at 1.8 TB/s per GPU bidirectional (130 TB/s in all)
    # = 900 GB/s per direction (NVIDIA GB200 NVL72 specifications); scale-out one ConnectX-7
    # 400 Gb/s NIC per GPU, 4 per tray (NVIDIA DGX SuperPOD with DGX GB200 reference
    # architecture) = 50 GB/s. --nodes counts trays (hosts of 4 GPUs); by default 16 of a
    # rack's 18 (64 GPUs, the power-of-two job a rack usually runs, two trays spare).
    "gb200-nvl72": dict(name="gb200-nvl72", gpu="gb200-186gb", gpus_per_node=4, nodes=16,
                        nvlink_domain_gpus=72, intra_node_bandwidth_GBps=900,
                        inter_node_bandwidth_GBps=50, intra_node_latency_us=3.0,
                        inter_node_latency_us=6.0, intra_node_efficiency=811 / 900,
                        inter_node_efficiency=46.5 / 50),
    # GB300 NVL72: the same rack of 18 trays × 4 Blackwell Ultra GPUs in one NVLink 5 domain
    # (9 NVSwitch trays, 130 TB/s; NVIDIA Enterprise Reference Architecture "NVL72 AI
    # factory", system hardware and components: 4 GPUs and 2 Grace CPUs per tray, 4
    # ConnectX-8 HCAs per tray); ConnectX-8 SuperNIC 800 Gb/s per GPU (NVIDIA GB300 NVL72
    # specifications) = 100 GB/s.
    "gb300-nvl72": dict(name="gb300-nvl72", gpu="gb300-288gb", gpus_per_node=4, nodes=16,
                        nvlink_domain_gpus=72, intra_node_bandwidth_GBps=900,
                        inter_node_bandwidth_GBps=100, intra_node_latency_us=3.0,
                        inter_node_latency_us=6.0, intra_node_efficiency=811 / 900,
                        inter_node_efficiency=46.5 / 50),
}


#: Edge roles of :func:`build_cluster`'s graph, by the kinds of their end nodes, and which
#: of the two nominal edges (``intra`` NVLink, ``inter`` network) each carries.
_ROLES = {("gpu", "switch"): "intra", ("switch", "gpu"): "intra", ("gpu", "nic"): "inter",
          ("nic", "gpu"): "inter", ("nic", "fabric"): "inter", ("fabric", "nic"): "inter"}
_SPEC_KEYS = ("intra_bandwidth_Bps", "inter_bandwidth_Bps", "intra_latency_s",
              "inter_latency_s", "intra_efficiency", "inter_efficiency")


def _nominal_edges(spec: Mapping[str, float]) -> dict[str, dict]:
    """The attributes of :func:`build_cluster`'s two kinds of edge, from its arguments."""
    return {"intra": dict(bandwidth_Bps=spec["intra_bandwidth_Bps"] * spec["intra_efficiency"],
                          nominal_bandwidth_Bps=spec["intra_bandwidth_Bps"],
                          latency_s=spec["intra_latency_s"] / 2, link_class="nvlink",
                          measured=False),
            "inter": dict(bandwidth_Bps=spec["inter_bandwidth_Bps"] * spec["inter_efficiency"],
                          nominal_bandwidth_Bps=spec["inter_bandwidth_Bps"],
                          latency_s=spec["inter_latency_s"] / 4, link_class="network",
                          measured=False)}


def _path_value(path: Iterable[Mapping]) -> tuple[float, float]:
    """(bandwidth, latency) of a path of edges: its slowest edge, its summed latency."""
    path = list(path)
    return min(p["bandwidth_Bps"] for p in path), sum(p["latency_s"] for p in path)


def _switch_name(hosts: list[str], host_domain, h: int, one_host_domains: bool) -> str:
    """Graph node of the NVLink switch that host index ``h`` hangs off (module docstring)."""
    return f"{hosts[h]}/nvswitch" if one_host_domains else f"domain{host_domain[h]}/nvswitch"


def _build_graph(hosts: list[str], gpus_per_node: int, spec: Mapping[str, float],
                 host_domain, one_host_domains: bool) -> nx.DiGraph:
    """The per-GPU link graph of a homogeneous cluster (see :func:`build_cluster`); host
    ``h`` belongs to NVLink domain ``host_domain[h]``."""
    e = _nominal_edges(spec)
    intra, inter = e["intra"], e["inter"]
    g = nx.DiGraph()
    g.add_node("fabric", kind="fabric")
    for h, host in enumerate(hosts):
        sw = _switch_name(hosts, host_domain, h, one_host_domains)
        g.add_node(host, kind="host")
        if one_host_domains:
            g.add_node(sw, kind="switch", host=host)
        elif sw in g:
            g.nodes[sw]["hosts"] += (host,)
        else:
            g.add_node(sw, kind="switch", domain=int(host_domain[h]), hosts=(host,))
        gids = [f"{host}/gpu{k}" for k in range(gpus_per_node)]
        nics = [f"{host}/nic{k}" for k in range(gpus_per_node)]
        g.add_nodes_from((gid, dict(kind="gpu", host=host, local_rank=k))
                         for k, gid in enumerate(gids))
        g.add_nodes_from((nic, dict(kind="nic", host=host, rail=k))
                         for k, nic in enumerate(nics))
        # add_edges_from copies the attribute dict into each edge's own dict
        for gid, nic in zip(gids, nics):
            g.add_edges_from(((gid, sw), (sw, gid)), **intra)
            g.add_edges_from(((gid, nic), (nic, gid), (nic, "fabric"), ("fabric", nic)),
                             **inter)
    return g


def _ceil_div(a, b):
    return -(-a // b)


def _by_first_appearance(labels: np.ndarray) -> np.ndarray:
    """``labels`` renumbered 0, 1, … in order of first appearance."""
    if labels.size == 0:
        return labels
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inv.reshape(-1)]


def uniform_group_shape(stride: int, size: int, world: int,
                        domain_gpus: int) -> tuple[bool, bool, int]:
    """What the ring groups of ``size`` ranks spaced ``stride`` apart among ``world`` ranks
    (:func:`topology.placement.rank_groups`, every group, identity placement) look like on
    NVLink domains of ``domain_gpus`` consecutive GPUs (a host each on DGX systems; a partial
    last domain holds no group member past ``world``, so it changes nothing):
    ``(intra, inter, k)`` with ``intra`` true when some group has two members in one domain
    (a hop over its NVLink switch), ``inter`` true when some group spans domains, and ``k``
    the fewest members one domain holds over the groups that span domains (the rails of
    their slowest domain-to-domain hop; 0 if none). Needs ``size >= 2``.

    Computed without listing the groups: a group's per-domain counts depend only on where
    its first rank falls within a domain (``s mod G``, ``G`` = ``domain_gpus``); those
    residues come from the block starts ``j·stride·size`` (periodic in ``j``) plus offsets
    ``0 … stride-1``. Within one group the domains strictly between the first and the last
    have counts periodic in the domain number with period ``stride / gcd(stride, G)``.
    """
    G, d, n = domain_gpus, stride, size
    if d >= G:  # consecutive members are a domain or more apart: one member per domain
        return False, True, 1
    block = d * n
    starts = min(_ceil_div(world, block), G // math.gcd(block, G))
    a = (np.arange(starts, dtype=np.int64) * block) % G
    rho = np.unique((a[:, None] + np.arange(d, dtype=np.int64)[None, :]) % G)
    last = (rho + (n - 1) * d) // G             # domain of the last member (the first in 0)
    intra = bool(np.any(last == 0))             # a whole group in one domain (n >= 2 members)
    span = last > 0
    if not span.any():
        return intra, False, 0
    rho, last = rho[span], last[span]

    c_first = _ceil_div(G - rho, d)               # members in domain 0
    c_last = n - _ceil_div(last * G - rho, d)     # members in the last domain
    lo, hi = np.minimum(c_first, c_last), np.maximum(c_first, c_last)
    m = min(d // math.gcd(d, G), int(last.max()) - 1)   # one period of the domains between
    if m >= 1:
        h = np.arange(1, m + 1, dtype=np.int64)[None, :]
        r = rho[:, None]
        cnt = _ceil_div((h + 1) * G - r, d) - _ceil_div(h * G - r, d)
        mid = h <= (last - 1)[:, None]
        lo = np.minimum(lo, np.where(mid, cnt, n).min(axis=1))
        hi = np.maximum(hi, np.where(mid, cnt, 0).max(axis=1))
    return intra or bool(np.any(hi >= 2)), True, int(lo.min())


def ring_figures(gpus: np.ndarray, links, domains) -> tuple[np.ndarray, np.ndarray]:
    """(bus bandwidth B/s, per-step latency s) of the NCCL ring over each row of ``gpus``
    (``[rows, n]`` physical GPU indices, host-major), by :meth:`Cluster.ring_busbw`'s rules:
    NVLink hops between neighbours in one NVLink domain (a one-domain row closes its ring),
    and between consecutive domains of a row ``k`` rails in parallel (``k`` the fewest
    members a domain of the row holds), their bandwidths summed; the slowest hop sets the
    row's figure. ``domains``: the NVLink domain of every GPU index (an integer array,
    :attr:`Cluster.gpu_domains`), or an int, the GPUs of each of the consecutive domains.
    ``links(a, b)`` gives (bandwidth_Bps, latency_s) arrays for GPU index arrays. Rows of
    one member get (inf, 0). Returns two ``[rows]`` float arrays."""
    gpus = np.asarray(gpus, dtype=np.int64)
    rows, n = gpus.shape
    out_bw = np.full(rows, np.inf)
    out_lat = np.zeros(rows)
    if n < 2 or rows == 0:
        return out_bw, out_lat
    dom = (gpus // domains if isinstance(domains, (int, np.integer))
           else np.asarray(domains, dtype=np.int64)[gpus])
    if not np.all(dom[:, 1:] >= dom[:, :-1]):
        # order each row domain by domain, domains by first appearance, members as they come
        pos = np.arange(n, dtype=np.int64)
        srt = np.argsort(dom, axis=1, kind="stable")
        hs = np.take_along_axis(dom, srt, 1)
        new = np.ones((rows, n), dtype=bool)
        new[:, 1:] = hs[:, 1:] != hs[:, :-1]
        seg = np.maximum.accumulate(np.where(new, pos, 0), axis=1)
        first = np.empty_like(srt)
        np.put_along_axis(first, srt, np.take_along_axis(srt, seg, 1), 1)
        order = np.argsort(first * n + pos, axis=1)
        gpus = np.take_along_axis(gpus, order, 1)
        dom = np.take_along_axis(dom, order, 1)
    same = dom[:, 1:] == dom[:, :-1]
    single = same.all(axis=1)
    # NVLink hops: neighbours in one domain; one-domain rows close their ring
    rr, cc = np.nonzero(same)
    ss = np.flatnonzero(single)
    a = np.concatenate([gpus[rr, cc], gpus[ss, -1]])
    b = np.concatenate([gpus[rr, cc + 1], gpus[ss, 0]])
    row = np.concatenate([rr, ss])
    if row.size:
        bw_i, lat_i = links(a, b)
        np.minimum.at(out_bw, row, bw_i)
        np.maximum.at(out_lat, row, lat_i)
    multi = np.flatnonzero(~single)
    if multi.size:
        # domain-to-domain hops: segment (domain) s of a row to the row's next, cyclically,
        # rail j < k pairing the j-th members, k the row's smallest segment
        gm = gpus[multi]
        start = np.ones(gm.shape, dtype=bool)
        start[:, 1:] = ~same[multi]
        r, c = np.nonzero(start)                 # segments, row by row, in order
        nseg = len(r)
        row_first = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        per_row = np.diff(np.r_[row_first, nseg])
        row_last = row_first + per_row - 1
        nxt = np.arange(1, nseg + 1)
        nxt[row_last] = row_first
        end = np.r_[c[1:], n]
        end[row_last] = n
        k = np.repeat(np.minimum.reduceat(end - c, row_first), per_row)
        hop_bw = np.zeros(nseg)
        hop_lat = np.zeros(nseg)
        for j in range(int(k.max())):
            act = np.flatnonzero(k > j)
            b_, l_ = links(gm[r[act], c[act] + j], gm[r[act], c[nxt[act]] + j])
            hop_bw[act] += b_
            hop_lat[act] = np.maximum(hop_lat[act], l_)
        np.minimum.at(out_bw, multi[r], hop_bw)
        np.maximum.at(out_lat, multi[r], hop_lat)
    return out_bw, out_lat


class LinkTable:
    """Every GPU→GPU link of a :class:`Cluster` as arrays: :meth:`Cluster.link`'s figures for
    whole index arrays at once, for placement search (which asks millions of pairs).

    A link inside a host comes from ``intra_bw[h, i, j]`` (``[H, G, G]``); one between two
    hosts of one NVLink domain from its path GPU→switch→GPU; one across domains from its
    path GPU→NIC→(NIC↔NIC or host↔host measured edge, else NIC→fabric→NIC)→GPU (per-host
    ``[H, G]`` edge arrays and the measured host-edges, sparse), the slowest edge and the
    summed latency, exactly :meth:`Cluster.link`'s rule (``tests/test_placement.py``
    compares them); a measured direct GPU→GPU edge between hosts wins. Memory
    ``O(H·G² + measured edges)``.
    """

    def __init__(self, cluster: "Cluster"):
        H, G = cluster.num_nodes, cluster.gpus_per_node
        self.gpus_per_node = G
        self.num_gpus = H * G
        self.host_domain = cluster.host_domain
        bi, li = cluster._nominal_link(True)
        self.intra_bw = np.full((H, G, G), bi)
        self.intra_lat = np.full((H, G, G), li)
        e = _nominal_edges(cluster.spec) if all(k in cluster.spec for k in _SPEC_KEYS) else None
        shape = (H, G)
        if e is not None:
            hop_bw, hop_lat = e["inter"]["bandwidth_Bps"], e["inter"]["latency_s"]
            sw_bw, sw_lat = e["intra"]["bandwidth_Bps"], e["intra"]["latency_s"]
        else:
            hop_bw = hop_lat = sw_bw = sw_lat = np.nan
        # four edge kinds of the inter-domain path: gpu→nic, nic→fabric, fabric→nic,
        # nic→gpu; two of the path between hosts of one domain: gpu→switch, switch→gpu
        self.edge_bw = {k: np.full(shape, hop_bw) for k in ("gn", "nf", "fn", "ng")}
        self.edge_lat = {k: np.full(shape, hop_lat) for k in ("gn", "nf", "fn", "ng")}
        for k in ("gs", "sg"):
            self.edge_bw[k], self.edge_lat[k] = np.full(shape, sw_bw), np.full(shape, sw_lat)
        # measured host→host edges, sparse: sorted keys ha·H + hb and their figures
        self.host_keys = np.zeros(0, dtype=np.int64)
        self.host_bw = np.zeros(0)
        self.host_lat = np.zeros(0)
        self.num_hosts = H
        self.overrides: dict[int, tuple[float, float]] = {}   # a*n+b -> figures
        facts = cluster._facts()
        if facts is None:
            return
        g = cluster._graph
        hidx = {h: i for i, h in enumerate(cluster.hosts)}
        special = (np.ones(H, dtype=bool) if facts.all_special else facts.special)
        for h in np.flatnonzero(special).tolist():
            host = cluster.hosts[h]
            for i in range(G):
                for j in range(G):
                    if i != j:
                        self.intra_bw[h, i, j], self.intra_lat[h, i, j] = cluster.link(
                            h * G + i, h * G + j)
                gid, nic, sw = f"{host}/gpu{i}", f"{host}/nic{i}", cluster.switch_of(h)
                for key, (u, w) in (("gn", (gid, nic)), ("nf", (nic, "fabric")),
                                    ("fn", ("fabric", nic)), ("ng", (nic, gid)),
                                    ("gs", (gid, sw)), ("sg", (sw, gid))):
                    d = cluster._edge(u, w)
                    val = (d["bandwidth_Bps"], d["latency_s"]) if d else (np.nan, np.nan)
                    self.edge_bw[key][h, i], self.edge_lat[key][h, i] = val
        n = self.num_gpus
        host_edges = {}
        for u, w, d in g.edges(data=True):
            ku, kw = g.nodes[u].get("kind"), g.nodes[w].get("kind")
            if ku == kw == "host" and u in hidx and w in hidx:
                host_edges[hidx[u] * H + hidx[w]] = (d["bandwidth_Bps"], d["latency_s"])
            elif ku == kw and ku in ("nic", "gpu"):
                hu, hw = g.nodes[u].get("host"), g.nodes[w].get("host")
                if hu == hw or hu not in hidx or hw not in hidx:
                    continue
                a = hidx[hu] * G + int(u.rsplit(ku, 1)[1])
                b = hidx[hw] * G + int(w.rsplit(kw, 1)[1])
                self.overrides[a * n + b] = (ku, d["bandwidth_Bps"], d["latency_s"])
        # a direct GPU→GPU edge beats a NIC→NIC one and the switch (Cluster.link's order)
        self.overrides = {k: cluster.link(k // n, k % n) for k in self.overrides}
        if host_edges:
            keys = sorted(host_edges)
            self.host_keys = np.array(keys, dtype=np.int64)
            self.host_bw = np.array([host_edges[k][0] for k in keys])
            self.host_lat = np.array([host_edges[k][1] for k in keys])

    def _host_edge(self, A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Measured host→host figures of the pairs ``(A[i], B[i])``, NaN where none."""
        bw = np.full(A.shape, np.nan)
        lat = np.full(A.shape, np.nan)
        if self.host_keys.size:
            keys = A * self.num_hosts + B
            pos = np.minimum(np.searchsorted(self.host_keys, keys), self.host_keys.size - 1)
            hit = self.host_keys[pos] == keys
            bw[hit], lat[hit] = self.host_bw[pos[hit]], self.host_lat[pos[hit]]
        return bw, lat

    def links(self, a, b) -> tuple[np.ndarray, np.ndarray]:
        """(bandwidth_Bps, latency_s) arrays of the transfers ``a[i] → b[i]`` (GPU index
        arrays, host-major), as :meth:`Cluster.link` gives them."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        G = self.gpus_per_node
        ha, la = np.divmod(a, G)
        hb, lb = np.divmod(b, G)
        same = ha == hb
        bw = self.intra_bw[ha, la, lb]
        lat = self.intra_lat[ha, la, lb]
        cross = np.flatnonzero(~same)
        one_domain = self.host_domain[ha[cross]] == self.host_domain[hb[cross]]
        y = cross[one_domain]            # two hosts of one NVLink domain: via its switch
        if y.size:
            A, LA, B, LB = ha[y], la[y], hb[y], lb[y]
            bw[y] = np.minimum(self.edge_bw["gs"][A, LA], self.edge_bw["sg"][B, LB])
            lat[y] = self.edge_lat["gs"][A, LA] + self.edge_lat["sg"][B, LB]
        x = cross[~one_domain]           # two domains: over the network
        if x.size:
            A, LA, B, LB = ha[x], la[x], hb[x], lb[x]
            hbw, hlat = self._host_edge(A, B)
            fab_bw = np.minimum(self.edge_bw["nf"][A, LA], self.edge_bw["fn"][B, LB])
            fab_lat = self.edge_lat["nf"][A, LA] + self.edge_lat["fn"][B, LB]
            has = ~np.isnan(hbw)
            mid_bw, mid_lat = np.where(has, hbw, fab_bw), np.where(has, hlat, fab_lat)
            bw[x] = np.minimum(np.minimum(self.edge_bw["gn"][A, LA], mid_bw),
                               self.edge_bw["ng"][B, LB])
            lat[x] = self.edge_lat["gn"][A, LA] + mid_lat + self.edge_lat["ng"][B, LB]
        if self.overrides and cross.size:
            keys = a[cross] * self.num_gpus + b[cross]
            hit = np.flatnonzero(np.isin(keys, np.fromiter(self.overrides, np.int64)))
            for i in hit.tolist():
                bw[cross[i]], lat[cross[i]] = self.overrides[int(keys[i])]
        return bw, lat


class _GraphFacts:
    """One pass over a built graph: is it still uniform, has it measured edges, and which
    hosts have any link other than the nominal ones (``special``)."""

    __slots__ = ("measured", "uniform", "special", "all_special")

    def __init__(self, cluster: "Cluster"):
        g = cluster._graph
        nodes = g.nodes
        ref = ({r: (e["bandwidth_Bps"], e["latency_s"])
                for r, e in _nominal_edges(cluster.spec).items()}
               if all(k in cluster.spec for k in _SPEC_KEYS) else {})
        host_index = {h: i for i, h in enumerate(cluster.hosts)}
        special = np.zeros(cluster.num_nodes, dtype=bool)
        values: dict[tuple, set] = {r: set() for r in _ROLES}
        measured = all_special = other = False
        role_edges = 0

        def host_of(x, kx):  # index into hosts, -1 for shared nodes, None if unknown
            if kx == "fabric" or (kx == "switch" and "domain" in nodes[x]):
                return -1        # the fabric, a domain's switch: its GPUs' hosts are marked
            return host_index.get(x if kx == "host" else nodes[x].get("host"))

        for u, nbrs in g.adjacency():
            ku = nodes[u].get("kind")
            hu = host_of(u, ku)
            for w, d in nbrs.items():
                if d.get("measured"):
                    measured = True
                kw = nodes[w].get("kind")
                role = _ROLES.get((ku, kw))
                val = (d.get("bandwidth_Bps"), d.get("latency_s"))
                if role is not None:
                    role_edges += 1
                    values[(ku, kw)].add(val)
                    if val == ref.get(role):
                        continue
                else:
                    other = True
                for h in (hu, host_of(w, kw)):
                    if h is None:
                        all_special = True
                    elif h >= 0:
                        special[h] = True
        complete = role_edges == 6 * cluster.num_gpus
        self.measured = measured
        self.uniform = (complete and not measured and not other
                        and all(len(v) <= 1 for v in values.values()))
        self.special = special
        self.all_special = all_special or not complete or not ref


class Cluster:
    """A GPU cluster: ``gpu`` (:class:`GPUSpec`), ``hosts`` × ``gpus_per_node`` GPUs and the
    link graph ``graph`` (:class:`networkx.DiGraph`). Built by :func:`build_cluster`.

    The graph of a cluster built from its nominal :attr:`spec` is made on first access of
    :attr:`graph` (a 131,072-GPU cluster has ~800k edges); until then :meth:`link` answers
    from the spec with the numbers those edges would give. While the cluster is uniform (no
    graph yet, or a graph whose edges of each kind all agree and none measured) and ranks
    sit on GPUs by the identity placement, :meth:`group_busbw` and :meth:`p2p_worst` come
    from the groups' shape (:func:`uniform_group_shape`); otherwise every hop of every group
    is looked at (vectorised; :meth:`link` per hop only on hosts with non-nominal links).

    NVLink domains (module docstring): ``nvlink_domain_gpus`` (default ``gpus_per_node``, a
    multiple of it) groups the hosts in order into domains, the last one possibly partial;
    ``host_domains`` instead names the domain of every host (a :meth:`subset` keeps its
    hosts' domains). :attr:`host_domain` holds the result.
    """

    def __init__(self, *, name: str, gpu: GPUSpec, gpus_per_node: int, hosts: list[str],
                 graph: nx.DiGraph | None = None, spec: dict | None = None,
                 nvlink_domain_gpus: int | None = None,
                 host_domains: Iterable[int] | None = None):
        self.name = name
        #: The nominal arguments :func:`build_cluster` was called with (bytes/s, seconds).
        self.spec = dict(spec or {})
        self.gpu = gpu
        self.gpus_per_node = gpus_per_node
        self.hosts = list(hosts)
        if graph is None and not all(k in self.spec for k in _SPEC_KEYS):
            raise ValueError("Cluster needs a graph or a complete build spec "
                             f"({', '.join(_SPEC_KEYS)})")
        D = gpus_per_node if nvlink_domain_gpus is None else int(nvlink_domain_gpus)
        if D < gpus_per_node or D % gpus_per_node:
            raise ValueError(f"nvlink_domain_gpus {D} is not a multiple of gpus_per_node "
                             f"{gpus_per_node}")
        #: GPUs of one NVLink domain (the last one may hold fewer).
        self.nvlink_domain_gpus = D
        in_order = np.arange(len(self.hosts), dtype=np.int64) // (D // gpus_per_node)
        #: NVLink domain of every host (index into :attr:`hosts`).
        self.host_domain = (in_order if host_domains is None
                            else np.array(list(host_domains), dtype=np.int64).reshape(-1))
        if self.host_domain.shape != (len(self.hosts),):
            raise ValueError(f"host_domains names {self.host_domain.size} domains for "
                             f"{len(self.hosts)} hosts")
        #: Whether the domains are the hosts in order, ``nvlink_domain_gpus`` GPUs each
        #: (relabelled by first appearance): the shape shortcuts count on it.
        self.domains_in_order = bool(np.array_equal(_by_first_appearance(self.host_domain),
                                                    in_order))
        self._graph = graph
        #: Global rank -> physical GPU (torchrun's default order).
        self.placement = Placement(gpus_per_node)
        #: Measured layer times (:class:`configurator.core.profile.LayerProfile`) the cost
        #: model uses in place of its analytic layer compute, or None.
        self.layer_profile = None
        self._cache: dict = {}

    def with_gpu(self, gpu: GPUSpec) -> "Cluster":
        """The same hosts and links with ``gpu`` in place of :attr:`gpu` (a calibrated GPU:
        only the cost model's compute figures change, so the link caches are shared)."""
        out = copy.copy(self)
        out.gpu = gpu
        return out

    def with_layer_profile(self, profile) -> "Cluster":
        """The same cluster with ``profile`` (a :class:`configurator.core.profile.LayerProfile`
        of the job's model and precision) as :attr:`layer_profile`."""
        out = copy.copy(self)
        out.layer_profile = profile
        return out

    # -- basic facts ---------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.hosts)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def gpu_id(self, index: int) -> str:
        """Graph node of global GPU ``index`` (host-major order)."""
        host, local = divmod(index, self.gpus_per_node)
        return f"{self.hosts[host]}/gpu{local}"

    @property
    def one_host_domains(self) -> bool:
        """Whether every NVLink domain is one host (DGX systems)."""
        return self.nvlink_domain_gpus == self.gpus_per_node

    @functools.cached_property
    def gpu_domains(self) -> np.ndarray:
        """NVLink domain of every GPU index (host-major), ``[num_gpus]``."""
        return np.repeat(self.host_domain, self.gpus_per_node)

    def same_domain(self, a, b):
        """Whether GPUs ``a`` and ``b`` (indices or index arrays) share an NVLink domain
        (equal :attr:`host_domain` of their hosts: what every link-speed decision compares)."""
        G = self.gpus_per_node
        return self.host_domain[np.asarray(a) // G] == self.host_domain[np.asarray(b) // G]

    def switch_of(self, host: int) -> str:
        """Graph node of the NVLink switch of host index ``host``'s domain."""
        return _switch_name(self.hosts, self.host_domain, host, self.one_host_domains)

    @property
    def placement_invariant(self) -> bool:
        """Uniform, and no node-granular placement can change which GPU pairs share an
        NVLink domain: each domain is one host, or one domain holds every host."""
        return self.is_uniform and (self.one_host_domains
                                    or bool(np.all(self.host_domain == self.host_domain[0])))

    @property
    def graph(self) -> nx.DiGraph:
        """The link graph, built from :attr:`spec` on first access. Call :meth:`invalidate`
        after editing it."""
        if self._graph is None:
            self._graph = _build_graph(self.hosts, self.gpus_per_node, self.spec,
                                       self.host_domain, self.one_host_domains)
            self.invalidate()  # from here on the (editable) graph is the source
        return self._graph

    @graph.setter
    def graph(self, graph: nx.DiGraph) -> None:
        self._graph = graph
        self.invalidate()

    @property
    def graph_built(self) -> bool:
        """Whether :attr:`graph` has been made (accessing it builds it)."""
        return self._graph is not None

    def _facts(self) -> _GraphFacts | None:
        """Facts of the built graph (None while there is none), cached until invalidate."""
        if self._graph is None:
            return None
        if "facts" not in self._cache:
            self._cache["facts"] = _GraphFacts(self)
        return self._cache["facts"]

    @property
    def has_measured_links(self) -> bool:
        facts = self._facts()
        return facts is not None and facts.measured

    @property
    def is_uniform(self) -> bool:
        """Every host identical and no measured link: a link's figures depend only on
        whether its two GPUs share an NVLink domain."""
        facts = self._facts()
        return facts is None or facts.uniform

    def invalidate(self) -> None:
        """Drop cached link/group figures (call after editing ``graph``)."""
        self._cache.clear()
        self.link.cache_clear()

    # -- links ---------------------------------------------------------------------------
    def _edge(self, u: str, w: str):
        return self._graph.edges[u, w] if self._graph.has_edge(u, w) else None

    def _nominal_link(self, same_domain: bool) -> tuple[float, float]:
        """:meth:`link` of two GPUs of one NVLink domain / of two domains, from the nominal
        edges."""
        key = ("nominal", same_domain)
        if key not in self._cache:
            e = _nominal_edges(self.spec)
            self._cache[key] = _path_value([e["intra"]] * 2 if same_domain
                                           else [e["inter"]] * 4)
        return self._cache[key]

    @functools.lru_cache(maxsize=1 << 16)
    def link(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth_Bps, latency_s) of a transfer from GPU ``a`` to GPU ``b`` (indices).

        A measured direct edge wins; otherwise the slowest edge on the path
        GPU→NVLink switch→GPU (same NVLink domain: one host, or two hosts of one NVL72 rack)
        or GPU→NIC→fabric→NIC→GPU (same rail, other domain), with a measured NIC↔NIC or
        host↔host edge replacing the fabric hop. Before the graph is built: the same figures
        from :attr:`spec`.
        """
        if self._graph is None:
            n = self.num_gpus
            if not (0 <= a < n and 0 <= b < n):
                raise IndexError(f"GPU index out of range 0..{n - 1}: {a}, {b}")
            return self._nominal_link(bool(self.same_domain(a, b)))
        g = self._graph
        ga, gb = self.gpu_id(a), self.gpu_id(b)
        e = self._edge(ga, gb)
        if e is not None:
            return e["bandwidth_Bps"], e["latency_s"]
        ha, la = divmod(a, self.gpus_per_node)
        hb, lb = divmod(b, self.gpus_per_node)
        if self.host_domain[ha] == self.host_domain[hb]:
            sw = self.switch_of(ha)
            path = [g.edges[ga, sw], g.edges[sw, gb]]
        else:
            na, nb = f"{self.hosts[ha]}/nic{la}", f"{self.hosts[hb]}/nic{lb}"
            mid = self._edge(na, nb) or self._edge(self.hosts[ha], self.hosts[hb])
            hops = [mid] if mid is not None else [g.edges[na, "fabric"], g.edges["fabric", nb]]
            path = [g.edges[ga, na], *hops, g.edges[nb, gb]]
        return _path_value(path)

    def links(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`link` of every pair ``(a[i], b[i])`` (arrays of GPU indices): the nominal
        figures where both hosts have only nominal links, :meth:`link` (once per distinct
        pair) elsewhere. Returns (bandwidth_Bps, latency_s) float arrays."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        n, G = self.num_gpus, self.gpus_per_node
        if a.size and (min(a.min(), b.min()) < 0 or max(a.max(), b.max()) >= n):
            raise IndexError(f"GPU index out of range 0..{n - 1}")
        ha, hb = a // G, b // G
        same = self.host_domain[ha] == self.host_domain[hb]
        (bi, li), (be, le) = self._nominal_link(True), self._nominal_link(False)
        bw, lat = np.where(same, bi, be), np.where(same, li, le)
        facts = self._facts()
        if facts is not None:
            slow = (np.ones(a.shape, dtype=bool) if facts.all_special
                    else facts.special[ha] | facts.special[hb])
            idx = np.flatnonzero(slow)
            if idx.size:
                keys, inv = np.unique(a[idx] * n + b[idx], return_inverse=True)
                vals = np.array([self.link(int(k // n), int(k % n)) for k in keys.tolist()],
                                dtype=float).reshape(-1, 2)
                bw[idx], lat[idx] = vals[inv.reshape(-1), 0], vals[inv.reshape(-1), 1]
        return bw, lat

    def link_table(self) -> LinkTable:
        """:class:`LinkTable` of this cluster (cached until :meth:`invalidate`)."""
        if "table" not in self._cache:
            self._cache["table"] = LinkTable(self)
        return self._cache["table"]

    def ring_busbw(self, gpus: Iterable[int]) -> tuple[float, float]:
        """(bus bandwidth B/s, per-step latency s) of an NCCL ring over ``gpus``.

        Within an NVLink domain (a host, or a whole NVL72 rack) the ring runs over NVLink;
        across domains NCCL runs one ring per rail (``k`` group GPUs per domain use ``k``
        NICs in parallel), so a domain-to-domain hop carries the sum of its ``k`` rail
        bandwidths. The bus bandwidth is the slowest hop. (One group, hop by hop;
        :meth:`group_busbw` applies the same rules to every group.)
        """
        gpus = list(gpus)
        if len(gpus) < 2:
            return float("inf"), 0.0
        by_host: dict[int, list[int]] = {}        # by NVLink domain, in order of appearance
        for g in gpus:
            by_host.setdefault(int(self.gpu_domains[g]), []).append(g)
        bw, lat = float("inf"), 0.0
        for members in by_host.values():
            for i in range(len(members) if len(by_host) == 1 else len(members) - 1):
                b, l = self.link(members[i], members[(i + 1) % len(members)])
                bw, lat = min(bw, b), max(lat, l)
        if len(by_host) > 1:
            hosts = list(by_host)
            k = min(len(m) for m in by_host.values())
            for i, ha in enumerate(hosts):
                hb = hosts[(i + 1) % len(hosts)]
                hop_bw, hop_lat = 0.0, 0.0
                for j in range(k):
                    b, l = self.link(by_host[ha][j], by_host[hb][j])
                    hop_bw += b
                    hop_lat = max(hop_lat, l)
                bw, lat = min(bw, hop_bw), max(lat, hop_lat)
        return bw, lat

    # -- groups --------------------------------------------------------------------------
    @property
    def _shape_shortcut(self) -> bool:
        """Whether group figures may come from the groups' shape: a uniform cluster, the
        identity placement and the NVLink domains the hosts in order (the shortcut counts
        members per domain of ``nvlink_domain_gpus`` consecutive rank numbers)."""
        return self.placement.is_identity and self.is_uniform and self.domains_in_order

    def _group_gpus(self, stride: int, size: int, world: int) -> np.ndarray:
        """Physical GPU indices (one row per group) of every group of
        :func:`topology.placement.rank_groups` under :attr:`placement`."""
        block = stride * size
        first = (np.arange(0, world, block, dtype=np.int64)[:, None]
                 + np.arange(stride, dtype=np.int64)[None, :]).reshape(-1)
        ranks = first[:, None] + stride * np.arange(size, dtype=np.int64)[None, :]
        gpus = self.placement.gpu_indices(ranks)
        if gpus.size and (gpus.min() < 0 or gpus.max() >= self.num_gpus):
            raise IndexError(f"group ranks beyond the cluster's {self.num_gpus} GPUs "
                             f"(stride {stride}, size {size}, world {world})")
        return gpus

    def _check_extent(self, stride: int, size: int, world: int) -> None:
        """The shortcut's counterpart of :meth:`_group_gpus`'s range check."""
        if _ceil_div(world, stride * size) * stride * size > self.num_gpus:
            raise IndexError(f"group ranks beyond the cluster's {self.num_gpus} GPUs "
                             f"(stride {stride}, size {size}, world {world})")

    def _hop_group_busbw(self, gpus: np.ndarray) -> tuple[float, float]:
        """:meth:`ring_busbw`'s rules over every row of ``gpus`` at once; the worst row."""
        bw, lat = ring_figures(gpus, self.links, self.gpu_domains)
        return float(bw.min()), float(lat.max())

    def group_busbw(self, stride: int, size: int, world: int) -> tuple[float, float]:
        """Worst (bus bandwidth B/s, latency s) over every ring group of this shape.

        Groups that straddle NVLink-domain boundaries (e.g. tp=6 on 8-GPU hosts, or 64
        ranks of a 128-GPU job on 72-GPU NVL72 racks) are slower than aligned ones; the
        slowest group sets the pace (collectives of all groups run in lock-step within an
        iteration). Uniform cluster, identity placement, domains in order: from the
        groups' shape (:func:`uniform_group_shape`); otherwise hop by hop.
        """
        key = ("group", stride, size, world)
        if key not in self._cache:
            if size < 2:
                res = (float("inf"), 0.0)
            elif self._shape_shortcut:
                self._check_extent(stride, size, world)
                D = self.nvlink_domain_gpus
                intra, inter, k = uniform_group_shape(stride, size, world, D)
                bw, lat = float("inf"), 0.0
                if intra:
                    b, l = self.link(0, 1)
                    bw, lat = min(bw, b), max(lat, l)
                if inter:
                    b, l = self.link(0, D)
                    hop_bw = 0.0
                    for _ in range(k):  # k rails, summed as ring_busbw sums them
                        hop_bw += b
                    bw, lat = min(bw, hop_bw), max(lat, l)
                res = (bw, lat)
            else:
                res = self._hop_group_busbw(self._group_gpus(stride, size, world))
            self._cache[key] = res
        return self._cache[key]

    def p2p_worst(self, stride: int, size: int, world: int) -> tuple[float, float]:
        """Worst (bandwidth B/s, latency s) between pipeline neighbours ``r → r + stride``
        (both directions)."""
        key = ("p2p", stride, size, world)
        if key not in self._cache:
            res = (float("inf"), 0.0)
            if size < 2:
                pass
            elif self._shape_shortcut:
                self._check_extent(stride, size, world)
                D = self.nvlink_domain_gpus
                intra, inter, _ = uniform_group_shape(stride, size, world, D)
                bw, lat = float("inf"), 0.0
                for on, b in ((intra, 1), (inter, D)):
                    if on:
                        for x, y in ((0, b), (b, 0)):
                            bw_, l_ = self.link(x, y)
                            bw, lat = min(bw, bw_), max(lat, l_)
                res = (bw, lat)
            else:        # every boundary but the wrap-around, both ways
                fb, fl, bb, bl = self.p2p_boundaries(stride, size, world)
                res = (float(min(fb[:-1].min(), bb[:-1].min())),
                       float(max(fl[:-1].max(), bl[:-1].max())))
            self._cache[key] = res
        return self._cache[key]

    def p2p_boundaries(self, stride: int, size: int,
                       world: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Pipeline boundary by boundary: ``(fwd_bw, fwd_lat, bwd_bw, bwd_lat)``, each
        ``[size]``, index ``s`` the transfers from pipeline rank ``s`` to ``(s + 1) % size``
        (forward) and back (backward); index ``size - 1`` is the wrap-around ``size-1 → 0``
        that interleaved schedules use. Each boundary's figure is its slowest pair (its
        ``stride`` pairs send at once): min bandwidth (B/s), max latency (s). On a uniform
        cluster a boundary is an NVLink hop when every pair stays in one NVLink domain,
        else a network hop; elsewhere every pair is looked up. ``size >= 2``."""
        key = ("p2p_boundaries", stride, size, world)
        if key not in self._cache:
            D = self.nvlink_domain_gpus
            if self._shape_shortcut and stride >= D:   # every pair a domain or more apart
                self._check_extent(stride, size, world)
                b, l = self.link(0, D)
                full = (np.full(size, b), np.full(size, l))
                res = full + full
            else:        # fewer than D ranks per stage on a uniform cluster: a small world
                src = self._group_gpus(stride, size, world).T       # [size, groups]
                dst = np.roll(src, -1, axis=0)
                fb, fl = self.links(src.reshape(-1), dst.reshape(-1))
                bb, bl = self.links(dst.reshape(-1), src.reshape(-1))
                shape = (size, -1)
                res = (fb.reshape(shape).min(axis=1), fl.reshape(shape).max(axis=1),
                       bb.reshape(shape).min(axis=1), bl.reshape(shape).max(axis=1))
            self._cache[key] = res
        return self._cache[key]

    def __hash__(self) -> int:  # lru_cache on methods needs a hashable self
        return id(self)

    def __eq__(self, other) -> bool:
        return self is other

    def subset(self, hosts: Iterable[int]) -> "Cluster":
        """A cluster of the hosts with indices ``hosts`` (in that order), their GPUs, links,
        NVLink domains and measured edges (the fabric and their domains' switches kept); GPU
        indices renumber host-major."""
        idx = [int(h) for h in hosts]
        names = [self.hosts[i] for i in idx]
        sub = Cluster(name=self.name, gpu=self.gpu, gpus_per_node=self.gpus_per_node,
                      hosts=names, spec=self.spec,
                      graph=None if self._graph is None else nx.DiGraph(),
                      nvlink_domain_gpus=self.nvlink_domain_gpus,
                      host_domains=self.host_domain[idx] if idx else [])
        sub.layer_profile = self.layer_profile
        if self._graph is not None:
            keep = set(names)
            g = self._graph
            nodes = [x for x, d in g.nodes(data=True)
                     if x == "fabric" or x in keep or d.get("host") in keep
                     or keep.intersection(d.get("hosts", ()))]
            sub.graph = g.subgraph(nodes).copy()
        return sub

    def to_dict(self) -> dict:
        return {"name": self.name, "gpu": self.gpu.name, "gpus_per_node": self.gpus_per_node,
                "nodes": self.num_nodes, "num_gpus": self.num_gpus}


def build_cluster(*, name: str, gpu: GPUSpec, gpus_per_node: int, hosts: list[str],
                  intra_bandwidth_Bps: float, inter_bandwidth_Bps: float,
                  intra_latency_s: float, inter_latency_s: float,
                  intra_efficiency: float = DEFAULT_INTRA_EFFICIENCY,
                  inter_efficiency: float = DEFAULT_INTER_EFFICIENCY,
                  nvlink_domain_gpus: int | None = None) -> Cluster:
    """A homogeneous cluster: one NVLink switch per NVLink domain (per host unless
    ``nvlink_domain_gpus`` spans several hosts), one NIC rail per GPU.

    Bandwidths are nominal per GPU per direction (bytes/s): ``intra`` inside a domain,
    ``inter`` between domains; edges carry ``bandwidth_Bps = nominal × efficiency``.
    Latencies are split evenly over a path's hops. The graph itself is built on first
    access of :attr:`Cluster.graph`.
    """
    spec = dict(intra_bandwidth_Bps=intra_bandwidth_Bps, inter_bandwidth_Bps=inter_bandwidth_Bps,
                intra_latency_s=intra_latency_s, inter_latency_s=inter_latency_s,
                intra_efficiency=intra_efficiency, inter_efficiency=inter_efficiency)
    return Cluster(name=name, gpu=gpu, gpus_per_node=gpus_per_node, hosts=hosts, spec=spec,
                   nvlink_domain_gpus=nvlink_domain_gpus)


def cluster_from_config(data: Mapping[str, Any], nodes: int | None = None) -> Cluster:
    """Build a cluster from the YAML schema (see :data:`CLUSTER_PRESETS`); ``nodes`` overrides.

    ``nodes`` counts hosts of ``gpus_per_node`` GPUs (torchrun/SLURM nodes; an NVL72 compute
    tray). Optional ``nvlink_domain_gpus``: GPUs of one NVLink domain, a positive multiple
    of ``gpus_per_node`` (default: one host); hosts are grouped into domains in order, the
    last one possibly partial. The ``intra_node_*`` figures apply inside a domain."""
    v.exact_keys("cluster", data, CLUSTER_KEYS_REQUIRED, CLUSTER_KEYS_OPTIONAL)
    gpu = gpu_from_config(data["gpu"])
    gpn = v.int_in_range("gpus_per_node", data["gpus_per_node"])
    n = v.int_in_range("nodes", data["nodes"] if nodes is None else nodes)
    v.int_in_range("nodes*gpus_per_node", n * gpn, key="num_gpus")
    domain = v.int_in_range("nvlink_domain_gpus", data.get("nvlink_domain_gpus", gpn),
                            key="num_gpus")
    if domain % gpn:
        raise InputError("nvlink_domain_gpus", domain,
                         f"must be a positive multiple of gpus_per_node ({gpn}): an NVLink "
                         "domain is made of whole hosts")
    eff = {}
    for key, default in (("intra_node_efficiency", DEFAULT_INTRA_EFFICIENCY),
                         ("inter_node_efficiency", DEFAULT_INTER_EFFICIENCY)):
        val = v.positive_float(key, data.get(key, default))
        if val > 1:
            raise InputError(key, val, "must be a fraction in (0, 1]")
        eff[key] = val
    name = v.display_name("name", data.get("name", "custom-cluster"))
    figure = {key: v.float_in_range(key, data[key]) for key in CLUSTER_KEYS_REQUIRED
              if key.endswith(("_GBps", "_us"))}
    return build_cluster(
        name=name, gpu=gpu, gpus_per_node=gpn, hosts=[f"node{i:04d}" for i in range(n)],
        intra_bandwidth_Bps=figure["intra_node_bandwidth_GBps"] * GB,
        inter_bandwidth_Bps=figure["inter_node_bandwidth_GBps"] * GB,
        intra_latency_s=figure["intra_node_latency_us"] * US,
        inter_latency_s=figure["inter_node_latency_us"] * US,
        intra_efficiency=eff["intra_node_efficiency"],
        inter_efficiency=eff["inter_node_efficiency"], nvlink_domain_gpus=domain)


def load_cluster(ref: str, nodes: int | None = None) -> Cluster:
    """Resolve a preset name (any case) or a YAML/JSON cluster file; ``nodes`` overrides its
    node count.

    Raises :class:`InputError` (field ``cluster``, ``nodes``, or the offending key).
    """
    import os

    if nodes is not None:
        v.int_in_range("nodes", nodes)
    preset = v.preset_name(ref, CLUSTER_PRESETS)
    if preset is not None:
        return cluster_from_config(CLUSTER_PRESETS[preset], nodes)
    if not os.path.exists(ref):
        raise InputError("cluster", ref, "not a preset name nor an existing file"
                         + (v.did_you_mean(ref, CLUSTER_PRESETS)
                            or " (presets: " + ", ".join(CLUSTER_PRESETS) + ")"))
    return cluster_from_config(v.load_mapping_file("cluster", ref), nodes)
