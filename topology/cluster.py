"""The cluster as a directed networkx graph whose edges carry attained bandwidths.

Nodes: ``"<host>/gpu<k>"`` (kind ``gpu``), ``"<host>/nvswitch"`` (``switch``),
``"<host>/nic<k>"`` (``nic``, one rail per GPU as on DGX systems) and ``"fabric"``.
Edges are directional and carry ``bandwidth_Bps`` (what a transfer attains, bytes/s),
``nominal_bandwidth_Bps``, ``latency_s`` and ``link_class``. Measured links (a later import)
are added as direct edges ``gpu→gpu``, ``nic→nic`` (same rail, two hosts) or ``host→host``
(applies to every rail) with ``measured=True``; they take precedence over the nominal path.

Which GPU a rank runs on is :attr:`Cluster.placement` (:mod:`topology.placement`, which owns
Megatron's rank order ``tp-cp-ep-dp-pp`` and the rank → (host, GPU) map).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Mapping

import networkx as nx

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.units import GB, US
from topology.gpus import GPUSpec, gpu_from_config
from topology.placement import Placement, rank_groups

# Attained fraction of the nominal per-direction link rate for large NCCL transfers.
# NVLink/NVSwitch: nccl-tests all_reduce busbw ≈ 230 GB/s of 300 GB/s on DGX A100 and
# ≈ 370 of 450 GB/s on DGX H100 (NVIDIA nccl-tests results; shared REFERENCE §5).
# InfiniBand: ≈ 23.5 of 25 GB/s (HDR 200 Gb/s) and 45–48 of 50 GB/s (NDR 400 Gb/s).
DEFAULT_INTRA_EFFICIENCY = 0.77
DEFAULT_INTER_EFFICIENCY = 0.94

CLUSTER_KEYS_REQUIRED = ("gpu", "gpus_per_node", "nodes", "intra_node_bandwidth_GBps",
                         "inter_node_bandwidth_GBps", "intra_node_latency_us",
                         "inter_node_latency_us")
CLUSTER_KEYS_OPTIONAL = ("name", "intra_node_efficiency", "inter_node_efficiency")

#: Presets, in the YAML schema. Bandwidths are nominal, per GPU, per direction.
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
}


class Cluster:
    """A GPU cluster: ``gpu`` (:class:`GPUSpec`), ``hosts`` × ``gpus_per_node`` GPUs and the
    link graph ``graph`` (:class:`networkx.DiGraph`). Built by :func:`build_cluster`."""

    def __init__(self, *, name: str, gpu: GPUSpec, gpus_per_node: int, hosts: list[str],
                 graph: nx.DiGraph, spec: dict | None = None):
        self.name = name
        #: The nominal arguments :func:`build_cluster` was called with (bytes/s, seconds).
        self.spec = dict(spec or {})
        self.gpu = gpu
        self.gpus_per_node = gpus_per_node
        self.hosts = list(hosts)
        self.graph = graph
        #: Global rank -> physical GPU (torchrun's default order).
        self.placement = Placement(gpus_per_node)
        self._cache: dict = {}

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
    def has_measured_links(self) -> bool:
        if "measured" not in self._cache:
            self._cache["measured"] = any(d.get("measured")
                                          for _, _, d in self.graph.edges(data=True))
        return self._cache["measured"]

    def invalidate(self) -> None:
        """Drop cached link/group figures (call after editing ``graph``)."""
        self._cache.clear()
        self.link.cache_clear()

    # -- links ---------------------------------------------------------------------------
    def _edge(self, u: str, w: str):
        return self.graph.edges[u, w] if self.graph.has_edge(u, w) else None

    @functools.lru_cache(maxsize=1 << 16)
    def link(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth_Bps, latency_s) of a transfer from GPU ``a`` to GPU ``b`` (indices).

        A measured direct edge wins; otherwise the slowest edge on the path
        GPU→NVSwitch→GPU (same host) or GPU→NIC→fabric→NIC→GPU (same rail, other host),
        with a measured NIC↔NIC or host↔host edge replacing the fabric hop.
        """
        ga, gb = self.gpu_id(a), self.gpu_id(b)
        e = self._edge(ga, gb)
        if e is not None:
            return e["bandwidth_Bps"], e["latency_s"]
        ha, la = divmod(a, self.gpus_per_node)
        hb, lb = divmod(b, self.gpus_per_node)
        if ha == hb:
            sw = f"{self.hosts[ha]}/nvswitch"
            path = [self.graph.edges[ga, sw], self.graph.edges[sw, gb]]
        else:
            na, nb = f"{self.hosts[ha]}/nic{la}", f"{self.hosts[hb]}/nic{lb}"
            mid = self._edge(na, nb) or self._edge(self.hosts[ha], self.hosts[hb])
            hops = [mid] if mid is not None else [self.graph.edges[na, "fabric"],
                                                   self.graph.edges["fabric", nb]]
            path = [self.graph.edges[ga, na], *hops, self.graph.edges[nb, gb]]
        return min(p["bandwidth_Bps"] for p in path), sum(p["latency_s"] for p in path)

    def ring_busbw(self, gpus: Iterable[int]) -> tuple[float, float]:
        """(bus bandwidth B/s, per-step latency s) of an NCCL ring over ``gpus``.

        Within a host the ring runs over NVLink; across hosts NCCL runs one ring per rail
        (``k`` group GPUs per host use ``k`` NICs in parallel), so a host-to-host hop carries
        the sum of its ``k`` rail bandwidths. The bus bandwidth is the slowest hop.
        """
        gpus = list(gpus)
        if len(gpus) < 2:
            return float("inf"), 0.0
        by_host: dict[int, list[int]] = {}
        for g in gpus:
            by_host.setdefault(g // self.gpus_per_node, []).append(g)
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

    def _groups(self, stride: int, size: int, world: int):
        """Physical GPU indices of the rank groups of ``size`` ranks spaced ``stride`` apart
        (:func:`topology.placement.rank_groups`) under :attr:`placement`.

        With measured links, every group. Without, the groups of one period
        ``lcm(stride·size, gpus_per_node)`` ranks and, within a block, the first
        ``gpus_per_node`` offsets: the others are translates that see identical links.
        """
        if self.has_measured_links:
            groups = rank_groups(stride, size, world)
        else:
            block = stride * size
            limit = min(world, math.lcm(block, self.gpus_per_node))
            # Shifting a group by gpus_per_node ranks moves every member one host on with
            # the same local GPU: on a uniform cluster an identical group.
            offsets = min(stride, self.gpus_per_node)
            groups = ([start + off + i * stride for i in range(size)]
                      for start in range(0, limit, block) for off in range(offsets))
        for g in groups:
            yield [self.placement.gpu_index(r) for r in g]

    def group_busbw(self, stride: int, size: int, world: int) -> tuple[float, float]:
        """Worst (bus bandwidth B/s, latency s) over every ring group of this shape.

        Groups that straddle node boundaries (e.g. tp=6 on 8-GPU nodes) are slower than
        aligned ones; the slowest group sets the pace (collectives of all groups run in
        lock-step within an iteration).
        """
        key = ("group", stride, size, world)
        if key not in self._cache:
            if size < 2:
                res = (float("inf"), 0.0)
            else:
                res = (float("inf"), 0.0)
                for g in self._groups(stride, size, world):
                    b, l = self.ring_busbw(g)
                    res = (min(res[0], b), max(res[1], l))
            self._cache[key] = res
        return self._cache[key]

    def p2p_worst(self, stride: int, size: int, world: int) -> tuple[float, float]:
        """Worst (bandwidth B/s, latency s) between pipeline neighbours ``r → r + stride``."""
        key = ("p2p", stride, size, world)
        if key not in self._cache:
            res = (float("inf"), 0.0)
            if size >= 2:
                for g in self._groups(stride, size, world):
                    for a, b in zip(g, g[1:]):
                        for x, y in ((a, b), (b, a)):
                            bw, l = self.link(x, y)
                            res = (min(res[0], bw), max(res[1], l))
            self._cache[key] = res
        return self._cache[key]

    def __hash__(self) -> int:  # lru_cache on methods needs a hashable self
        return id(self)

    def __eq__(self, other) -> bool:
        return self is other

    def to_dict(self) -> dict:
        return {"name": self.name, "gpu": self.gpu.name, "gpus_per_node": self.gpus_per_node,
                "nodes": self.num_nodes, "num_gpus": self.num_gpus}


def build_cluster(*, name: str, gpu: GPUSpec, gpus_per_node: int, hosts: list[str],
                  intra_bandwidth_Bps: float, inter_bandwidth_Bps: float,
                  intra_latency_s: float, inter_latency_s: float,
                  intra_efficiency: float = DEFAULT_INTRA_EFFICIENCY,
                  inter_efficiency: float = DEFAULT_INTER_EFFICIENCY) -> Cluster:
    """Build the graph of a homogeneous cluster: NVSwitch per host, one NIC rail per GPU.

    Bandwidths are nominal per GPU per direction (bytes/s); edges carry
    ``bandwidth_Bps = nominal × efficiency``. Latencies are split evenly over a path's hops.
    """
    g = nx.DiGraph()
    g.add_node("fabric", kind="fabric")
    intra = dict(bandwidth_Bps=intra_bandwidth_Bps * intra_efficiency,
                 nominal_bandwidth_Bps=intra_bandwidth_Bps, latency_s=intra_latency_s / 2,
                 link_class="nvlink", measured=False)
    inter = dict(bandwidth_Bps=inter_bandwidth_Bps * inter_efficiency,
                 nominal_bandwidth_Bps=inter_bandwidth_Bps, latency_s=inter_latency_s / 4,
                 link_class="network", measured=False)
    for host in hosts:
        sw = f"{host}/nvswitch"
        g.add_node(host, kind="host")
        g.add_node(sw, kind="switch", host=host)
        for k in range(gpus_per_node):
            gid, nic = f"{host}/gpu{k}", f"{host}/nic{k}"
            g.add_node(gid, kind="gpu", host=host, local_rank=k)
            g.add_node(nic, kind="nic", host=host, rail=k)
            g.add_edge(gid, sw, **intra)
            g.add_edge(sw, gid, **intra)
            for u, w in ((gid, nic), (nic, gid), (nic, "fabric"), ("fabric", nic)):
                g.add_edge(u, w, **inter)
    spec = dict(intra_bandwidth_Bps=intra_bandwidth_Bps, inter_bandwidth_Bps=inter_bandwidth_Bps,
                intra_latency_s=intra_latency_s, inter_latency_s=inter_latency_s,
                intra_efficiency=intra_efficiency, inter_efficiency=inter_efficiency)
    return Cluster(name=name, gpu=gpu, gpus_per_node=gpus_per_node, hosts=hosts, graph=g,
                   spec=spec)


def cluster_from_config(data: Mapping[str, Any], nodes: int | None = None) -> Cluster:
    """Build a cluster from the YAML schema (see :data:`CLUSTER_PRESETS`); ``nodes`` overrides."""
    v.exact_keys("cluster", data, CLUSTER_KEYS_REQUIRED, CLUSTER_KEYS_OPTIONAL)
    gpu = gpu_from_config(data["gpu"])
    gpn = v.positive_int("gpus_per_node", data["gpus_per_node"])
    n = v.positive_int("nodes", data["nodes"] if nodes is None else nodes)
    eff = {}
    for key, default in (("intra_node_efficiency", DEFAULT_INTRA_EFFICIENCY),
                         ("inter_node_efficiency", DEFAULT_INTER_EFFICIENCY)):
        val = v.positive_float(key, data.get(key, default))
        if val > 1:
            raise InputError(key, val, "must be a fraction in (0, 1]")
        eff[key] = val
    name = data.get("name", "custom-cluster")
    return build_cluster(
        name=str(name), gpu=gpu, gpus_per_node=gpn, hosts=[f"node{i:04d}" for i in range(n)],
        intra_bandwidth_Bps=v.positive_float("intra_node_bandwidth_GBps",
                                             data["intra_node_bandwidth_GBps"]) * GB,
        inter_bandwidth_Bps=v.positive_float("inter_node_bandwidth_GBps",
                                             data["inter_node_bandwidth_GBps"]) * GB,
        intra_latency_s=v.positive_float("intra_node_latency_us",
                                         data["intra_node_latency_us"]) * US,
        inter_latency_s=v.positive_float("inter_node_latency_us",
                                         data["inter_node_latency_us"]) * US,
        intra_efficiency=eff["intra_node_efficiency"],
        inter_efficiency=eff["inter_node_efficiency"])


def load_cluster(ref: str, nodes: int | None = None) -> Cluster:
    """Resolve a preset name or a YAML/JSON cluster file; ``nodes`` overrides its node count.

    Raises :class:`InputError` (field ``cluster``, ``nodes``, or the offending key).
    """
    import os

    if nodes is not None:
        v.positive_int("nodes", nodes)
    if ref in CLUSTER_PRESETS:
        return cluster_from_config(CLUSTER_PRESETS[ref], nodes)
    if not os.path.exists(ref):
        raise InputError("cluster", ref, "not a preset name (" + ", ".join(CLUSTER_PRESETS)
                         + ") nor an existing file")
    return cluster_from_config(v.load_mapping_file("cluster", ref), nodes)
