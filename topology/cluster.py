"""A GPU cluster (:class:`Cluster`): its hosts, NVLink domains and GPU type, the link graph
(:mod:`topology.link_graph`) whose edges carry attained bandwidths, and the figures of a
transfer between two GPUs. Presets and cluster files are read by
:mod:`topology.cluster_files`; the figures of whole ring groups and pipeline neighbours come
from :mod:`topology.group_figures`.

Which GPU a rank runs on is :attr:`Cluster.placement` (:mod:`topology.rank_order`, which owns
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

Scale: the graph is built on first access of :attr:`Cluster.graph`; a cluster nobody asked the
graph of answers :meth:`Cluster.link` from its nominal :attr:`Cluster.spec`, with a measured
topology's links laid over it sparse (:attr:`Cluster.measured_links`,
:mod:`topology.measured_links`) until then. On a uniform cluster with the identity
placement, the worst group figures come from the groups' shape
(:func:`topology.group_figures.uniform_group_shape`), in time independent of the GPU count
and bit for bit what walking every hop gives (``tests/test_scale.py``).
"""

from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING, Iterable

import numpy as np

from topology.gpus import GPUSpec
from topology.group_figures import GroupFigures
from topology.link_graph import (SPEC_KEYS, GraphFacts, build_graph, nominal_edges,
                                 path_value, switch_name)
from topology.link_table import LinkTable
from topology.measured_links import MeasuredLinks
from topology.rank_order import Placement

if TYPE_CHECKING:   # networkx is imported where a graph is built (a tenth of a second)
    import networkx as nx


# Attained fraction of the nominal per-direction link rate for large NCCL transfers.
# NVLink/NVSwitch: nccl-tests all_reduce busbw ≈ 230 GB/s of 300 GB/s on DGX A100 and
# ≈ 370 of 450 GB/s on DGX H100 (NVIDIA nccl-tests results; shared REFERENCE §5).
# InfiniBand: ≈ 23.5 of 25 GB/s (HDR 200 Gb/s) and 45–48 of 50 GB/s (NDR 400 Gb/s).
DEFAULT_INTRA_EFFICIENCY = 0.77
DEFAULT_INTER_EFFICIENCY = 0.94


def _by_first_appearance(labels: np.ndarray) -> np.ndarray:
    """``labels`` renumbered 0, 1, … in order of first appearance."""
    if labels.size == 0:
        return labels
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inv.reshape(-1)]



class Cluster(GroupFigures):
    """A GPU cluster: ``gpu`` (:class:`GPUSpec`), ``hosts`` × ``gpus_per_node`` GPUs and the
    link graph ``graph`` (:class:`networkx.DiGraph`). Built by :func:`build_cluster`.

    The graph of a cluster built from its nominal :attr:`spec` is made on first access of
    :attr:`graph` (a 131,072-GPU cluster has ~800k edges); until then :meth:`link` answers
    from the spec with the numbers those edges would give. While the cluster is uniform (no
    graph yet, or a graph whose edges of each kind all agree and none measured) and ranks
    sit on GPUs by the identity placement, :meth:`group_busbw` and :meth:`p2p_worst` come
    from the groups' shape (:func:`~topology.group_figures.uniform_group_shape`); otherwise
    every hop of every group is looked at (vectorised; :meth:`link` per hop only on hosts
    with non-nominal links).

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
        if graph is None and not all(k in self.spec for k in SPEC_KEYS):
            raise ValueError("Cluster needs a graph or a complete build spec "
                             f"({', '.join(SPEC_KEYS)})")
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
        self._measured: MeasuredLinks | None = None
        #: Global rank -> physical GPU (torchrun's default order).
        self.placement = Placement(gpus_per_node)
        #: The 95 % intervals of the calibrated parameters this cluster carries
        #: (:meth:`topology.calibration.Calibration.apply_cluster`): parameter name ->
        #: ``(low, high)``; empty when not calibrated or fitted without intervals.
        self.calibration_intervals: dict[str, tuple[float, float]] = {}
        self._cache: dict = {}

    def with_gpu(self, gpu: GPUSpec) -> "Cluster":
        """The same hosts and links with ``gpu`` in place of :attr:`gpu` (a calibrated GPU:
        only the cost model's compute figures change, so the link caches are shared)."""
        out = copy.copy(self)
        out.gpu = gpu
        return out

    def with_link_efficiency(self, intra: float | None = None,
                             inter: float | None = None) -> "Cluster":
        """The same hosts with the nominal links' attained fractions ``intra`` (NVLink) and
        ``inter`` (network) in place of :attr:`spec`'s (None: kept), the graph built again
        from the spec on first use. A cluster with measured links is returned unchanged:
        its links carry what was measured, not nominal × efficiency."""
        if self._measured is not None or (intra is None and inter is None):
            return self
        spec = dict(self.spec)
        if intra is not None:
            spec["intra_efficiency"] = float(intra)
        if inter is not None:
            spec["inter_efficiency"] = float(inter)
        if spec == self.spec:
            return self
        out = Cluster(name=self.name, gpu=self.gpu, gpus_per_node=self.gpus_per_node,
                      hosts=self.hosts, spec=spec, nvlink_domain_gpus=self.nvlink_domain_gpus,
                      host_domains=self.host_domain)
        out.placement = self.placement
        out.calibration_intervals = dict(self.calibration_intervals)
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
        return switch_name(self.hosts, self.host_domain, host, self.one_host_domains)

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
            self._graph = build_graph(self.hosts, self.gpus_per_node, self.spec,
                                      self.host_domain, self.one_host_domains)
            if self._measured is not None:
                self._graph.add_edges_from(self._measured.graph_edges())
                self._measured = None
            self.invalidate()  # from here on the (editable) graph is the source
        return self._graph

    @graph.setter
    def graph(self, graph: nx.DiGraph) -> None:
        self._graph, self._measured = graph, None
        self.invalidate()

    @property
    def measured_links(self) -> MeasuredLinks | None:
        """The measured edges while the graph is not built (sparse,
        :class:`~topology.measured_links.MeasuredLinks`), or None."""
        return self._measured

    def set_measured_links(self, measured: MeasuredLinks) -> None:
        """Lay ``measured`` (made for this cluster's hosts) over the nominal links: kept
        sparse while the graph is not built, added to the graph's edges once it is."""
        if measured.hosts != self.hosts or measured.gpus_per_node != self.gpus_per_node:
            raise ValueError("measured links made for other hosts")
        if self._graph is not None:
            self._graph.add_edges_from(measured.graph_edges())
        else:
            self._measured = measured
        self.invalidate()

    @property
    def graph_built(self) -> bool:
        """Whether :attr:`graph` has been made (accessing it builds it)."""
        return self._graph is not None

    def graph_facts(self) -> GraphFacts | None:
        """Facts of the built graph (None while there is none), cached until invalidate."""
        if self._graph is None and self._measured is None:
            return None
        if "facts" not in self._cache:
            self._cache["facts"] = (GraphFacts(self) if self._graph is not None
                                    else GraphFacts.of_measured(self._measured))
        return self._cache["facts"]

    @property
    def has_measured_links(self) -> bool:
        facts = self.graph_facts()
        return facts is not None and facts.measured

    @property
    def is_uniform(self) -> bool:
        """Every host identical and no measured link: a link's figures depend only on
        whether its two GPUs share an NVLink domain."""
        facts = self.graph_facts()
        return facts is None or facts.uniform

    def invalidate(self) -> None:
        """Drop cached link/group figures (call after editing ``graph``)."""
        self._cache.clear()
        self.link.cache_clear()

    # -- links ---------------------------------------------------------------------------
    def edge(self, u: str, w: str):
        """The attributes of the built graph's edge ``u → w``, or None where there is none."""
        return self._graph.edges[u, w] if self._graph.has_edge(u, w) else None

    def nominal_link(self, same_domain: bool) -> tuple[float, float]:
        """:meth:`link` of two GPUs of one NVLink domain / of two domains, from the nominal
        edges."""
        key = ("nominal", same_domain)
        if key not in self._cache:
            e = nominal_edges(self.spec)
            self._cache[key] = path_value([e["intra"]] * 2 if same_domain
                                          else [e["inter"]] * 4)
        return self._cache[key]

    @functools.lru_cache(maxsize=1 << 16)
    def link(self, a: int, b: int) -> tuple[float, float]:
        """(bandwidth_Bps, latency_s) of a transfer from GPU ``a`` to GPU ``b`` (indices).

        A measured direct edge wins; otherwise the slowest edge on the path
        GPU→NVLink switch→GPU (same NVLink domain: one host, or two hosts of one NVL72 rack)
        or GPU→NIC→fabric→NIC→GPU (same rail, other domain), with a measured NIC↔NIC or
        host↔host edge replacing the fabric hop. Before the graph is built: the same figures
        from :attr:`spec`, with :attr:`measured_links` laid over them.
        """
        if self._graph is None:
            n = self.num_gpus
            if not (0 <= a < n and 0 <= b < n):
                raise IndexError(f"GPU index out of range 0..{n - 1}: {a}, {b}")
            return self._unbuilt_link(a, b)
        g = self._graph
        ga, gb = self.gpu_id(a), self.gpu_id(b)
        e = self.edge(ga, gb)
        if e is not None:
            return e["bandwidth_Bps"], e["latency_s"]
        ha, la = divmod(a, self.gpus_per_node)
        hb, lb = divmod(b, self.gpus_per_node)
        if self.host_domain[ha] == self.host_domain[hb]:
            sw = self.switch_of(ha)
            path = [g.edges[ga, sw], g.edges[sw, gb]]
        else:
            na, nb = f"{self.hosts[ha]}/nic{la}", f"{self.hosts[hb]}/nic{lb}"
            mid = self.edge(na, nb) or self.edge(self.hosts[ha], self.hosts[hb])
            hops = [mid] if mid is not None else [g.edges[na, "fabric"], g.edges["fabric", nb]]
            path = [g.edges[ga, na], *hops, g.edges[nb, gb]]
        return path_value(path)

    def _unbuilt_link(self, a: int, b: int) -> tuple[float, float]:
        """:meth:`link` before the graph is built: the path's nominal edges, a measured edge
        of :attr:`measured_links` replacing the direct or the middle hop as in the graph."""
        same = bool(self.same_domain(a, b))
        m = self._measured
        if m is None:
            return self.nominal_link(same)
        e = m.edges.get((self.gpu_id(a), self.gpu_id(b)))
        if e is not None:
            return e["bandwidth_Bps"], e["latency_s"]
        if same:
            return self.nominal_link(True)
        ha, la = divmod(a, self.gpus_per_node)
        hb, lb = divmod(b, self.gpus_per_node)
        mid = (m.edges.get((f"{self.hosts[ha]}/nic{la}", f"{self.hosts[hb]}/nic{lb}"))
               or m.host_edge(ha, hb))
        if mid is None:
            return self.nominal_link(False)
        hop = nominal_edges(self.spec)["inter"]
        return path_value([hop, mid, hop])

    def links(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`link` of every pair ``(a[i], b[i])`` (arrays of GPU indices): the nominal
        figures where both hosts have only nominal links, :meth:`link` (once per distinct
        pair) elsewhere. Returns (bandwidth_Bps, latency_s) float arrays."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        n, G = self.num_gpus, self.gpus_per_node
        if a.size and (min(a.min(), b.min()) < 0 or max(a.max(), b.max()) >= n):
            raise IndexError(f"GPU index out of range 0..{n - 1}")
        facts = self.graph_facts()
        if self._graph is None and facts is not None:     # measured links laid over
            return self.link_table().links(a, b)
        ha, hb = a // G, b // G
        same = self.host_domain[ha] == self.host_domain[hb]
        (bi, li), (be, le) = self.nominal_link(True), self.nominal_link(False)
        bw, lat = np.where(same, bi, be), np.where(same, li, le)
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
                      graph=None if self._graph is None else self._graph.__class__(),
                      nvlink_domain_gpus=self.nvlink_domain_gpus,
                      host_domains=self.host_domain[idx] if idx else [])
        sub.calibration_intervals = dict(self.calibration_intervals)
        if self._measured is not None:
            sub.set_measured_links(self._measured.subset(idx))
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
