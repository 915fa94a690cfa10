"""Measured topology: link and collective measurements between hosts and GPUs, and their file.

Inside, everything is SI (bytes/s, seconds, bytes). The file (YAML, or JSON when the name ends
in ``.json``) carries units at the edge: GB/s (1e9 B/s) and microseconds::

    format: configurator-topology      # optional on load; must match when present
    version: 1                         # optional on load; must be 1 when present
    hosts: [cnode2-001, cnode2-002]    # host names, in order
    gpus_per_host: 8                   # GPUs per host as far as the inputs show, or null
    merge_policy: min                  # how duplicate records were combined: min|median|pNN
    links:                             # per-direction src → dst attained bandwidth
      - src: cnode2-001                # host
        dst: cnode2-002                # host (== src for an intra-node GPU↔GPU link)
        src_gpu: null                  # local GPU index, or null for a host-level link
        dst_gpu: null                  # (both null or both set)
        bandwidth_GBps: 13.59          # > 0
        latency_us: null               # > 0 or null
        link_class: network            # nvlink | pcie | network | ...
        message_bytes: 17179869184     # largest message size behind the figure, or null
        method: nccl-tests sendrecv_perf busbw alpha-beta fit over 10 sizes
        timestamp: null                # ISO-8601 string, or null
        samples_GBps: [13.35, 13.40]   # optional: the individual measurements (spread): e.g.
                                       #   busbw of every size, out-of-place and in-place
        gpus_per_host: 1               # optional: GPUs per host the measurement used
        rails_used: 1                  # optional: NICs per host carrying traffic at once
    collectives:                       # optional: collective bus bandwidths
      - hosts: [cnode2-001, cnode2-002]
        gpus_per_host: 8
        op: alltoall                   # all_reduce | all_gather | alltoall | sendrecv | ...
        busbw_GBps: 23.1               # bus bandwidth (nccl-tests definition), > 0
        latency_us: 35.0               # optional: latency (alpha of the fit), > 0 or null
        message_bytes: 17179869184     # largest message size behind the figure, or null
        method: nccl-tests alltoall_perf busbw alpha-beta fit over 10 sizes
        timestamp: null
    missing:                           # optional: measurements that were expected, not found
      - {src: cnode2-002, dst: cnode2-008, reason: "..."}
    warnings: ["..."]                  # optional

Figures from a message-size sweep (nccl-tests logs) are an α–β fit, ``time(n) = α + n / β``
(:mod:`topology.linkfit`): the bandwidth is the fitted β (bus bandwidth), ``latency_us`` the
fitted α when the sweep resolves it, ``message_bytes`` the largest size the fit kept.

Conventions: a ``method`` ending in ``"(nominal)"`` marks a data-sheet rate, not a measurement
(e.g. ``nvidia-smi topo -m (nominal)``). A host-level inter-node record measured with
``gpus_per_host = k`` GPUs per host spread over ``rails_used`` NICs (default ``k``) gives a
per-rail bandwidth of ``bandwidth / rails_used``; nccl-tests ``sendrecv_perf`` runs a ring, so
only one NIC per direction crosses hosts whatever ``k`` and its records carry ``rails_used=1``.

Errors: :class:`configurator.core.errors.InputError` for bad files, bad policies, or a file that
would be overwritten without ``force``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from configurator.core.errors import InputError
from topology.cluster import build_cluster
from topology.measured_links import MeasuredLinks

FORMAT = "configurator-topology"
VERSION = 1   # the topology file format's version (a file of another is refused)
NOMINAL_SUFFIX = "(nominal)"

__all__ = ["LinkMeasurement", "CollectiveMeasurement", "MissingMeasurement", "Topology",
           "merge_topologies", "apply_topology", "check_policy", "combine", "host_sort_key",
           "FORMAT", "VERSION", "NOMINAL_SUFFIX"]


@dataclass(frozen=True, kw_only=True)
class LinkMeasurement:
    """Attained bandwidth of one direction ``src → dst`` (hosts; GPUs when ``*_gpu`` set).

    ``bandwidth_Bps`` bytes/s per direction (nccl-tests sendrecv between two ranks: busbw, which
    equals algbw; from a size sweep, the β of its α–β fit); ``latency_s`` seconds or None (the
    fit's α); ``message_bytes`` the (largest) size the figure was taken at; ``samples_Bps`` the
    individual measurements (repeats, or every size of a sweep); ``gpus_per_host`` GPUs per host the
    measurement used (N2_G4 → 4); ``rails_used`` NICs per host carrying traffic at once
    (None: ``gpus_per_host``, see the module docstring).
    """

    src: str
    dst: str
    src_gpu: int | None
    dst_gpu: int | None
    bandwidth_Bps: float
    latency_s: float | None
    link_class: str
    message_bytes: int | None
    method: str
    timestamp: str | None
    samples_Bps: tuple[float, ...] = ()
    gpus_per_host: int | None = None
    rails_used: int | None = None

    @property
    def intra_node(self) -> bool:
        return self.src == self.dst

    @property
    def nominal(self) -> bool:
        """True for data-sheet rates (method ends in ``"(nominal)"``), not measurements."""
        return self.method.endswith(NOMINAL_SUFFIX)

    @property
    def rails(self) -> int:
        """NICs per host the measurement loaded at once (≥ 1)."""
        return self.rails_used or self.gpus_per_host or 1

    @property
    def key(self) -> tuple:
        """Identity for merging: the same link measured with the same GPU count."""
        return (self.src, self.dst, self.src_gpu, self.dst_gpu, self.gpus_per_host,
                self.rails_used)


@dataclass(frozen=True, kw_only=True)
class CollectiveMeasurement:
    """Bus bandwidth (``busbw_Bps``, bytes/s, nccl-tests definition) of collective ``op`` over
    ``gpus_per_host`` GPUs on each of ``hosts``; ``message_bytes`` the largest size behind it;
    ``latency_s`` seconds or None (for an nccl-tests sweep: the α of the α–β fit whose β is
    ``busbw_Bps``, see :mod:`topology.linkfit`)."""

    hosts: tuple[str, ...]
    gpus_per_host: int
    op: str
    busbw_Bps: float
    message_bytes: int | None
    method: str
    timestamp: str | None
    latency_s: float | None = None

    @property
    def key(self) -> tuple:
        return (self.hosts, self.gpus_per_host, self.op, self.method)


@dataclass(frozen=True, kw_only=True)
class MissingMeasurement:
    """A measurement between hosts ``src`` and ``dst`` that was expected but yielded no figure."""

    src: str
    dst: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Everything measured about a set of hosts. ``merge_policy`` records how duplicate
    link records (same :attr:`LinkMeasurement.key`) were combined."""

    hosts: tuple[str, ...]
    gpus_per_host: int | None
    links: tuple[LinkMeasurement, ...]
    collectives: tuple[CollectiveMeasurement, ...] = ()
    missing: tuple[MissingMeasurement, ...] = ()
    merge_policy: str = "min"
    warnings: tuple[str, ...] = ()
    #: the GPUs' device name as the measurements report it (nccl-tests' Rank lines:
    #: ``NVIDIA H100 80GB HBM3``), or None
    gpu_name: str | None = None

    def measured_pairs(self) -> set[frozenset[str]]:
        """Unordered host pairs with at least one inter-node link record."""
        return {frozenset((l.src, l.dst)) for l in self.links if l.src != l.dst}

    def unmeasured_pairs(self) -> list[tuple[str, str]]:
        """Host pairs named in ``missing`` that have no link record at all, sorted."""
        have = self.measured_pairs()
        out = {tuple(sorted((m.src, m.dst), key=host_sort_key)) for m in self.missing
               if m.src != m.dst and frozenset((m.src, m.dst)) not in have}
        return sorted(out, key=lambda p: (host_sort_key(p[0]), host_sort_key(p[1])))


# -- merging -------------------------------------------------------------------------------

def host_sort_key(name: str) -> tuple:
    """Natural order for host names (``node2`` before ``node10``). Only ASCII digits count
    as numbers (``'²'.isdigit()`` is true but ``int('²')`` fails)."""
    return tuple((0, int(t), "") if t.isascii() and t.isdigit() else (1, 0, t)
                 for t in re.split(r"([0-9]+)", name) if t)


@functools.lru_cache(maxsize=64)
def _policy_ok(policy: str) -> bool:
    if policy in ("min", "median"):
        return True
    m = re.fullmatch(r"p([0-9]{1,3}(?:\.[0-9]+)?)", policy)
    return bool(m) and 0 <= float(m.group(1)) <= 100


def check_policy(policy: str) -> str:
    """Validate a merge policy: ``min``, ``median`` or ``pNN`` (0 ≤ NN ≤ 100)."""
    if isinstance(policy, str) and _policy_ok(policy):
        return policy
    raise InputError("merge", policy, "must be min, median or pNN with 0 <= NN <= 100 "
                                      "(e.g. p10)")


def combine(values: Sequence[float], policy: str) -> float:
    """One figure from repeated bandwidths: the minimum (pessimistic), the median, or the
    NN-th percentile (linear interpolation, numpy.percentile's default)."""
    check_policy(policy)
    if not values:
        raise ValueError("combine() needs at least one value")
    if len(values) == 1:          # every policy's figure of one value is that value
        return float(values[0])
    if policy == "min":
        return float(min(values))
    if policy == "median":
        return float(np.median(values))
    return float(np.percentile(values, float(policy[1:])))


def _opposite(policy: str) -> str:
    """Latency is combined pessimistically too: the mirror percentile of the bandwidth one."""
    if policy == "min":
        return "p100"
    if policy == "median":
        return "median"
    return f"p{100 - float(policy[1:]):g}"


def _merge_links(group: list[LinkMeasurement], policy: str) -> LinkMeasurement:
    if len(group) == 1:
        return group[0]
    first = group[0]
    lats = [l.latency_s for l in group if l.latency_s is not None]
    sizes = [l.message_bytes for l in group if l.message_bytes is not None]
    stamps = sorted(l.timestamp for l in group if l.timestamp)
    methods = list(dict.fromkeys(l.method for l in group))
    classes = list(dict.fromkeys(l.link_class for l in group))
    samples: list[float] = []
    for l in group:
        samples.extend(l.samples_Bps or (l.bandwidth_Bps,))
    return replace(first,
                   bandwidth_Bps=combine([l.bandwidth_Bps for l in group], policy),
                   latency_s=combine(lats, _opposite(policy)) if lats else None,
                   link_class=classes[0] if len(classes) == 1 else "/".join(classes),
                   message_bytes=max(sizes) if sizes else None,
                   method=methods[0] if len(methods) == 1 else " + ".join(methods),
                   timestamp=stamps[-1] if stamps else None,
                   samples_Bps=tuple(samples))


def merge_topologies(topos: Iterable[Topology], policy: str = "min") -> Topology:
    """Union of topologies; duplicate links (same :attr:`LinkMeasurement.key`) and collectives
    are combined with ``policy`` (see :func:`combine`; latencies with the mirror policy, e.g.
    the maximum for ``min``). ``samples_Bps`` of a merged link holds every input figure.
    Missing entries and warnings are kept (duplicates dropped). Raises InputError for a bad
    policy."""
    check_policy(policy)
    topos = list(topos)
    hosts: dict[str, None] = {}
    links: dict[tuple, list[LinkMeasurement]] = {}
    colls: dict[tuple, list[CollectiveMeasurement]] = {}
    missing: dict[MissingMeasurement, None] = {}
    warnings: dict[str, None] = {}
    gpus = [t.gpus_per_host for t in topos if t.gpus_per_host]
    names = list(dict.fromkeys(t.gpu_name for t in topos if t.gpu_name))
    if len(names) > 1:
        warnings[f"the inputs name several GPUs ({', '.join(names)}): no GPU recorded"] = None
    for t in topos:
        hosts.update(dict.fromkeys(t.hosts))
        for l in t.links:
            links.setdefault(l.key, []).append(l)
        for c in t.collectives:
            colls.setdefault(c.key, []).append(c)
        missing.update(dict.fromkeys(t.missing))
        warnings.update(dict.fromkeys(t.warnings))
    merged_colls = []
    for group in colls.values():
        sizes = [c.message_bytes for c in group if c.message_bytes is not None]
        stamps = sorted(c.timestamp for c in group if c.timestamp)
        lats = [c.latency_s for c in group if c.latency_s is not None]
        merged_colls.append(replace(group[0],
                                    busbw_Bps=combine([c.busbw_Bps for c in group], policy),
                                    latency_s=combine(lats, _opposite(policy)) if lats else None,
                                    message_bytes=max(sizes) if sizes else None,
                                    timestamp=stamps[-1] if stamps else None))
    return Topology(hosts=tuple(hosts), gpus_per_host=max(gpus) if gpus else None,
                    links=tuple(_merge_links(g, policy) for g in links.values()),
                    collectives=tuple(merged_colls), missing=tuple(missing),
                    merge_policy=policy, warnings=tuple(warnings),
                    gpu_name=names[0] if len(names) == 1 else None)


# -- applying to a cluster -----------------------------------------------------------------

def _cluster_spec(cluster) -> dict[str, float]:
    """build_cluster's nominal arguments, as the cluster recorded them."""
    return dict(cluster.spec)


def apply_topology(cluster, topo: Topology, policy: str | None = None):
    """A NEW :class:`topology.cluster.Cluster` with ``topo``'s links as ``measured`` edges.

    Hosts: the topology's names replace the cluster's (the cluster keeps its node count unless
    the topology names more hosts). Built afresh with build_cluster from the cluster's own
    nominal spec and NVLink-domain size (hosts grouped into domains in this order), so
    earlier measured edges are dropped. Between two hosts of one NVLink domain a transfer
    takes the domain's switch, so inter-node records of such a pair do not change it (only
    a direct GPU→GPU edge would). Edges added (bandwidth per direction), kept sparse
    (:attr:`topology.cluster.Cluster.measured_links`) until someone asks for the graph:

    * host-level inter-node record → ``"<A>" → "<B>"``, per-rail bandwidth
      ``bandwidth / rails`` (see :attr:`LinkMeasurement.rails`);
    * GPU-level inter-node record → ``"<A>/nic<i>" → "<B>/nic<j>"`` (per rail, as measured);
    * GPU-level intra-node record → ``"<H>/gpu<i>" → "<H>/gpu<j>"``.

    Records of one edge are combined with ``policy`` (default: the topology's merge_policy).
    Nominal records (method ending ``"(nominal)"``) are scaled by the cluster's efficiency for
    that side (intra/inter) so they estimate attained rates. Latency of a measured inter-node
    edge is what remains of the measured end-to-end latency after the two GPU↔NIC hops; when
    unmeasured, the nominal path latency is kept. Host pairs of the topology with no
    inter-node record get the median of the measured host pairs (``imputed=True``; one
    figure for all of them, not an edge each, until the graph is built). Raises
    InputError when a record names a GPU index the cluster's nodes do not have.
    """
    policy = check_policy(policy or topo.merge_policy)
    spec = _cluster_spec(cluster)
    n = max(cluster.num_nodes, len(topo.hosts))
    named = set(topo.hosts)
    extra = [h for h in cluster.hosts if h not in named]
    hosts = list(topo.hosts) + extra[: n - len(topo.hosts)]
    taken = set(hosts)
    i = 0
    while len(hosts) < n:  # cluster names collided with topology names: invent fresh ones
        name = f"node{i:04d}"
        if name not in taken:
            hosts.append(name)
            taken.add(name)
        i += 1
    new = build_cluster(name=cluster.name, gpu=cluster.gpu, gpus_per_node=cluster.gpus_per_node,
                        hosts=hosts, nvlink_domain_gpus=cluster.nvlink_domain_gpus, **spec)
    gpn = cluster.gpus_per_node
    hop_lat = spec["inter_latency_s"] / 4
    edges: dict[tuple, list[tuple[float, float | None, LinkMeasurement]]] = {}
    measured = MeasuredLinks(new.hosts, gpn)
    for l in topo.links:
        for field, idx in (("src_gpu", l.src_gpu), ("dst_gpu", l.dst_gpu)):
            if idx is not None and idx >= gpn:
                raise InputError(f"topology.links.{field}", idx,
                                 f"cluster {cluster.name} has {gpn} GPUs per node")
        if l.intra_node:
            if l.src_gpu is None or l.src_gpu == l.dst_gpu:
                continue  # host-level intra-node figures belong to collectives
            u, w = ("gpu", l.src, l.src_gpu), ("gpu", l.dst, l.dst_gpu)
            bw = l.bandwidth_Bps * (spec["intra_efficiency"] if l.nominal else 1.0)
            lat = l.latency_s
        else:
            if l.src_gpu is None:
                u, w = ("host", l.src, None), ("host", l.dst, None)
                bw = l.bandwidth_Bps / l.rails
            else:
                u, w = ("nic", l.src, l.src_gpu), ("nic", l.dst, l.dst_gpu)
                bw = l.bandwidth_Bps
            bw *= spec["inter_efficiency"] if l.nominal else 1.0
            lat = None if l.latency_s is None else max(l.latency_s - 2 * hop_lat, 0.0)
        edges.setdefault((u, w), []).append((bw, lat, l))
    lat_policy = _opposite(policy)
    for (u, w), recs in edges.items():
        first = recs[0][2]
        lats = [r[1] for r in recs if r[1] is not None]
        bw = combine([r[0] for r in recs], policy)
        lat = combine(lats, lat_policy) if lats else None
        method = " + ".join(dict.fromkeys(r[2].method for r in recs))
        if lat is None:
            lat = spec["intra_latency_s"] if first.intra_node else 2 * hop_lat
        nominal = (spec["intra_bandwidth_Bps"] if first.intra_node
                   else spec["inter_bandwidth_Bps"])
        measured.add(u[0], u[1:], w[1:], bandwidth_Bps=float(bw), nominal_bandwidth_Bps=nominal,
                     latency_s=float(lat), link_class=first.link_class, measured=True,
                     method=method)
    # every unmeasured pair of the topology's hosts: the median of the measured pairs, so it
    # is neither the fastest (nominal) nor the slowest link of the cluster
    measured.impute_host_pairs(list(topo.hosts), spec["inter_bandwidth_Bps"])
    new.set_measured_links(measured)
    return new
