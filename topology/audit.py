"""Cluster audit: slow links, asymmetric links, slow nodes and unmeasured host pairs.

Input: a measured :class:`~topology.topofile.Topology`. Output: an :class:`AuditReport`
(frozen dataclasses; :meth:`AuditReport.to_dict` gives the JSON form, GB/s at the edge).

Method. Links are grouped into *classes* that should share one bandwidth: scope (intra-node
when ``src == dst`` host, else inter-node), ``link_class``, ``method`` and ``gpus_per_host``
(an nccl-tests pair run with 1 GPU per node is a different experiment from one with 8).
Each class gets a robust baseline: the median ``m`` and the scaled median absolute deviation
``s = 1.4826·median(|x − m|)`` (a consistent estimator of σ for normal data; Rousseeuw &
Croux, JASA 1993). A directed link with bandwidth ``x`` is *slow* when both

* ``ratio = x / m < slow_ratio`` (default 0.8: the "below 80 % of the median" rule of the
  17-node H100 logs that ship in configurator/data/examples), and
* ``z = (x − m) / max(s, mad_floor_fraction·m) < slow_z`` (default −4: ≈ 3·10⁻⁵ one-sided
  tail for normal noise, so even 10⁴ healthy links give < 1 false alarm; the floor, 1 % of
  the median, keeps ``z`` finite when every link measures the same).

A healthy cluster with ±3 % noise never reaches ratio 0.8, and a noisy class (bimodal, large
``s``) flags nothing unless a link is far out of its own spread. A pair measured in both
directions is *asymmetric* when ``1 − min/max > asymmetry_fraction`` (default 0.2, above the
≤ 14 % send/recv asymmetry Pipette reports on a healthy A100 cluster, REFERENCE §5).
A host is a *slow node* when the fraction of its partners in a class whose link is slow is
``≥ node_slow_fraction`` (default 0.5): one bad cable slows one pair, a bad host slows most of
its pairs. Inter-node partners are other hosts and at least ``min_partners`` (default 3) must
have been measured, since with fewer a slow pair cannot be pinned on either end (with one bad
host among N ≥ 4, every other host has 1/(N−1) < 0.5 slow partners). Intra-node partners are
the host's own GPU pairs (or its single-host collective), so no minimum applies. Inter-node
classes should cover every host pair: each uncovered pair is a missing link; failed runs the
topology lists in ``missing`` are reported as well.

Bimodal classes. A robust baseline assumes one mode; a class whose values fall into two
well-separated groups (e.g. half the all-to-all pairs of the 17-node H100 sweep at 8 GPUs per
node near 23.6 GB/s, the other half spread over 12–20 GB/s) has no single healthy figure, and
a large scaled MAD there hides slow links. Every class (links and collectives alike) is split
in two by the optimal 1-D two-means split of ``y = ln(bandwidth)`` (Fisher 1958 / Jenks
natural breaks for two classes: the split point minimising the within-group sum of squares,
exact by scanning the sorted values). With per-group medians ``m_lo < m_hi`` and scaled MADs
``s_lo, s_hi`` of ``y`` (floored at ``bimodal_mad_floor``, 1 %), the class is *bimodal* when
all of

* each group holds ``≥ bimodal_min_share`` of the members (10 %) and
  ``≥ bimodal_min_members`` (2): a handful of slow links is a slow-link finding, not a mode;
* ``exp(m_hi − m_lo) ≥ bimodal_median_ratio`` (1.25): the modes differ in a way that matters;
* Ashman's separation ``D = √2·(m_hi − m_lo) / √(s_lo² + s_hi²) ≥ bimodal_min_separation``
  (3; Ashman, Bird & Zepf, AJ 108, 1994: a two-component mixture separates cleanly for
  ``D > 2``), with robust location and scale in place of mean and σ;
* the empty interval between the groups is ``≥ bimodal_gap_mads`` (1.5) pooled scaled MADs
  ``√((s_lo² + s_hi²) / 2)``: the groups do not touch.

A unimodal class never passes: ±3 % noise gives a median ratio near 1.03, and even a broad
normal (σ ≥ 17 % in log, enough for the ratio) has ``D ≈ 2.3`` and no gap. The report lists
the two medians and counts, the pairs in the slow mode, and the hosts whose partners are
mostly (``≥ node_slow_fraction``, with ``≥ min_partners`` partners for inter-node classes) in
the slow mode. Detection only reports; slow-link and slow-node flags are unchanged.

Sources: links that are not data-sheet rates, and collectives over one or two hosts (see
:func:`measurement_classes`); a two-host nccl-tests ``alltoall_perf`` is a pair measurement too.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from configurator.core.units import GB
from topology.topofile import Topology, host_sort_key

#: A class whose scaled MAD exceeds this fraction of its median (e.g. bimodal) gets a warning.
WIDE_SPREAD_FRACTION = 0.1
#: σ ≈ 1.4826 · MAD for normally distributed data (1 / Φ⁻¹(3/4); Rousseeuw & Croux 1993).
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True, kw_only=True)
class AuditThresholds:
    """Flagging rules (dimensionless); see the module docstring for the reasoning.

    Slow links: ``slow_ratio``, ``slow_z``, ``mad_floor_fraction``; asymmetry:
    ``asymmetry_fraction``; slow nodes: ``node_slow_fraction``, ``min_partners``. Bimodal
    classes (two-means split of log bandwidth): each group ``≥ bimodal_min_share`` of the
    class and ``≥ bimodal_min_members`` members; group medians ``≥ bimodal_median_ratio``
    apart; robust Ashman separation ``≥ bimodal_min_separation``; empty gap between the groups
    ``≥ bimodal_gap_mads`` pooled scaled MADs; scaled MADs floored at ``bimodal_mad_floor``
    (log units, i.e. 1 %).
    """
    slow_ratio: float = 0.8
    slow_z: float = -4.0
    mad_floor_fraction: float = 0.01
    asymmetry_fraction: float = 0.2
    node_slow_fraction: float = 0.5
    min_partners: int = 3
    bimodal_min_share: float = 0.1
    bimodal_min_members: int = 2
    bimodal_median_ratio: float = 1.25
    bimodal_min_separation: float = 3.0
    bimodal_gap_mads: float = 1.5
    bimodal_mad_floor: float = 0.01


@dataclass(frozen=True, kw_only=True)
class ClassBaseline:
    """Robust baseline of one link class: median and scaled MAD, bytes/s."""
    label: str
    scope: str                      # "inter-node" | "intra-node"
    link_class: str
    method: str
    gpus_per_host: int | None
    links: int
    median_Bps: float
    scaled_mad_Bps: float
    min_Bps: float
    max_Bps: float


@dataclass(frozen=True, kw_only=True)
class FlaggedLink:
    """A slow or asymmetric link. ``expected_Bps`` is the class median (slow) or the reverse
    direction (asymmetric); ``ratio = measured / expected``."""
    src: str
    dst: str
    src_gpu: int | None
    dst_gpu: int | None
    link_class: str                 # class label
    kind: str                       # "slow" | "asymmetric"
    measured_Bps: float
    expected_Bps: float
    ratio: float
    z_score: float
    both_directions: bool           # both directions measured and both slow
    reason: str


@dataclass(frozen=True, kw_only=True)
class NodeStat:
    """One host in one class: median over its links (bytes/s), partners, slow partners."""
    host: str
    link_class: str
    median_Bps: float
    links: int
    partners: int
    slow_partners: int

    @property
    def slow_partner_fraction(self) -> float:
        return self.slow_partners / self.partners if self.partners else 0.0


@dataclass(frozen=True, kw_only=True)
class FlaggedNode:
    """A host slow with most of its partners in at least one class."""
    host: str
    classes: tuple[str, ...]
    slow_partner_fraction: float     # the worst over ``classes``
    reason: str


@dataclass(frozen=True, kw_only=True)
class BimodalClass:
    """A class whose values split into a slow and a fast mode (see the module docstring):
    ``split`` the two modes (:class:`TwoModeSplit`, bytes/s), whose figures it also offers
    by name (``slow_count``, ``slow_median_Bps``, ``ratio``, ``separation`` …). ``slow_pairs``
    endpoint-name pairs (``host`` or ``host/gpuN``) with a value in the slow mode;
    ``slow_hosts`` hosts mostly in the slow mode."""
    label: str
    scope: str
    link_class: str
    method: str
    gpus_per_host: int | None
    split: "TwoModeSplit"
    slow_pairs: tuple[tuple[str, str], ...]
    slow_hosts: tuple[str, ...]
    reason: str

    @property
    def members(self) -> int:
        return self.split.slow_count + self.split.fast_count

    def __getattr__(self, name: str):
        if name in _SPLIT_FIGURES:          # the split's figures, by their own names
            return getattr(self.split, name)
        raise AttributeError(name)


@dataclass(frozen=True, kw_only=True)
class MissingLink:
    """A host pair without a measurement; ``link_class`` None = from the topology's list."""
    src: str
    dst: str
    link_class: str | None
    reason: str


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    hosts: tuple[str, ...]
    links_measured: int
    thresholds: AuditThresholds
    baselines: tuple[ClassBaseline, ...]
    flagged_links: tuple[FlaggedLink, ...]
    flagged_nodes: tuple[FlaggedNode, ...]
    node_stats: tuple[NodeStat, ...]
    missing_links: tuple[MissingLink, ...]
    drain_hosts: tuple[str, ...]
    report_links: tuple[tuple[str, str], ...]   # host pairs for the network team
    recommendation: str
    warnings: tuple[str, ...] = ()
    bimodal_classes: tuple[BimodalClass, ...] = ()

    def to_dict(self) -> dict:
        """JSON-able summary; bandwidths in GB/s (1e9 B/s)."""
        r3 = lambda x: round(x, 3)  # noqa: E731
        return {
            "hosts": list(self.hosts),
            "links_measured": self.links_measured,
            "thresholds": vars(self.thresholds).copy(),
            "baselines": [{
                "class": b.label, "scope": b.scope, "link_class": b.link_class,
                "method": b.method, "gpus_per_host": b.gpus_per_host, "links": b.links,
                "median_GBps": r3(b.median_Bps / GB), "scaled_mad_GBps": r3(b.scaled_mad_Bps / GB),
                "min_GBps": r3(b.min_Bps / GB), "max_GBps": r3(b.max_Bps / GB)}
                for b in self.baselines],
            "flagged_links": [{
                "src": f.src, "dst": f.dst, "src_gpu": f.src_gpu, "dst_gpu": f.dst_gpu,
                "class": f.link_class, "kind": f.kind,
                "measured_GBps": r3(f.measured_Bps / GB), "expected_GBps": r3(f.expected_Bps / GB),
                "ratio": r3(f.ratio), "z_score": round(f.z_score, 1),
                "both_directions": f.both_directions, "reason": f.reason}
                for f in self.flagged_links],
            "flagged_nodes": [{
                "host": n.host, "classes": list(n.classes), "reason": n.reason,
                "slow_partner_fraction": r3(n.slow_partner_fraction)}
                for n in self.flagged_nodes],
            "node_stats": [{
                "host": s.host, "class": s.link_class, "median_GBps": r3(s.median_Bps / GB),
                "links": s.links, "partners": s.partners, "slow_partners": s.slow_partners,
                "slow_partner_fraction": r3(s.slow_partner_fraction)}
                for s in self.node_stats],
            "missing_links": [{"src": m.src, "dst": m.dst, "class": m.link_class,
                               "reason": m.reason} for m in self.missing_links],
            "bimodal_classes": [{
                "class": b.label, "scope": b.scope, "link_class": b.link_class,
                "method": b.method, "gpus_per_host": b.gpus_per_host, "members": b.members,
                "slow_count": b.slow_count, "fast_count": b.fast_count,
                "slow_median_GBps": r3(b.slow_median_Bps / GB),
                "fast_median_GBps": r3(b.fast_median_Bps / GB),
                "slow_max_GBps": r3(b.slow_max_Bps / GB),
                "fast_min_GBps": r3(b.fast_min_Bps / GB), "ratio": r3(b.ratio),
                "separation": round(b.separation, 1),
                "slow_pairs": [list(p) for p in b.slow_pairs],
                "slow_hosts": list(b.slow_hosts), "reason": b.reason}
                for b in self.bimodal_classes],
            "recommendation": {
                "drain_hosts": list(self.drain_hosts),
                "report_links": [list(p) for p in self.report_links],
                "remeasure_pairs": [list(p) for p in _pairs_sorted(
                    (m.src, m.dst) for m in self.missing_links)],
                "text": self.recommendation},
            "warnings": list(self.warnings),
        }


def _gpu_key(g: int | None) -> int:
    return -1 if g is None else g


def _endpoint_key(ep: tuple[str, int | None]) -> tuple:
    return host_sort_key(ep[0]), _gpu_key(ep[1])


def _class_of(link) -> tuple:
    scope = "intra-node" if link.src == link.dst else "inter-node"
    return scope, link.link_class, link.method, link.gpus_per_host


def measurement_classes(topo: Topology, warnings: list[str] | None = None) -> dict:
    """Group the topology's measurements into classes.

    Returns ``{(scope, link_class, method, gpus_per_host): {((src, src_gpu), (dst, dst_gpu)):
    [bandwidth_Bps, ...]}}``. Sources: every link that is not a data-sheet rate (method ending
    ``"(nominal)"``), and every collective over one or two hosts (busbw; link_class
    ``"<op> collective"``; a two-host one is a pair measurement ``hosts[0] → hosts[1]``, a
    one-host one an intra-node figure of that host). Records with bandwidth ≤ 0 are skipped
    and noted in ``warnings``.
    """
    out: dict[tuple, dict] = {}
    notes = [] if warnings is None else warnings
    for l in topo.links:
        if l.nominal:
            continue
        if not l.bandwidth_Bps > 0:
            notes.append(f"skipped link {l.src}->{l.dst}: bandwidth {l.bandwidth_Bps!r} B/s "
                         "is not positive")
            continue
        out.setdefault(_class_of(l), {}).setdefault(
            ((l.src, l.src_gpu), (l.dst, l.dst_gpu)), []).append(l.bandwidth_Bps)
    for c in topo.collectives:
        if len(c.hosts) not in (1, 2) or not c.busbw_Bps > 0:
            continue
        a, b = c.hosts[0], c.hosts[-1]
        key = ("intra-node" if a == b else "inter-node", f"{c.op} collective", c.method,
               c.gpus_per_host)
        out.setdefault(key, {}).setdefault(((a, None), (b, None)), []).append(c.busbw_Bps)
    return out


def class_label(key: tuple) -> str:
    scope, link_class, method, gph = key
    return f"{scope} {link_class} | {method} | G={'?' if gph is None else gph}"


def _ep_name(host: str, gpu: int | None) -> str:
    return host if gpu is None else f"{host}/gpu{gpu}"


@dataclass(frozen=True, kw_only=True)
class TwoModeSplit:
    """Optimal two-means split of log bandwidth (see :func:`two_mode_split`). Bandwidths in
    bytes/s (group medians, the slow group's largest and the fast group's smallest value);
    ``slow_mad``/``fast_mad`` floored scaled MADs of ``ln(bandwidth)``."""
    slow_count: int
    fast_count: int
    slow_median_Bps: float
    fast_median_Bps: float
    slow_max_Bps: float
    fast_min_Bps: float
    slow_mad: float
    fast_mad: float

    @property
    def ratio(self) -> float:
        return self.fast_median_Bps / self.slow_median_Bps

    @property
    def separation(self) -> float:
        """Ashman's D with medians and scaled MADs of the log values."""
        return (math.sqrt(2) * math.log(self.ratio)
                / math.hypot(self.slow_mad, self.fast_mad))

    @property
    def gap_mads(self) -> float:
        """Empty interval between the groups, in pooled scaled MADs of the log values."""
        pooled = math.sqrt((self.slow_mad ** 2 + self.fast_mad ** 2) / 2)
        return math.log(self.fast_min_Bps / self.slow_max_Bps) / pooled


#: :class:`TwoModeSplit` figures a :class:`BimodalClass` answers for its split.
_SPLIT_FIGURES = frozenset({"slow_count", "fast_count", "slow_median_Bps", "fast_median_Bps",
                            "slow_max_Bps", "fast_min_Bps", "ratio", "separation"})


def two_mode_split(values_Bps, mad_floor: float = 0.01) -> TwoModeSplit | None:
    """Split positive bandwidths (bytes/s, any iterable, ≥ 2 values) into the two groups
    that minimise the within-group sum of squares of ``ln(value)`` (optimal 1-D two-means,
    i.e. Jenks natural breaks with two classes; exact: every split of the sorted values is
    scored with prefix sums, O(m log m)). Ties go to the first minimum. Returns None for
    fewer than two values or when all values are equal; non-positive or non-finite values
    are ignored."""
    x = np.sort(np.asarray([v for v in values_Bps if v > 0 and math.isfinite(v)],
                           dtype=float))
    if x.size < 2 or x[0] == x[-1]:
        return None
    y = np.log(x)
    m = y.size
    c1 = np.cumsum(y)
    c2 = np.cumsum(y * y)
    k = np.arange(1, m)                                  # size of the slow group
    left = c2[:-1] - c1[:-1] ** 2 / k
    right = (c2[-1] - c2[:-1]) - (c1[-1] - c1[:-1]) ** 2 / (m - k)
    cut = int(np.argmin(left + right)) + 1
    lo, hi = y[:cut], y[cut:]

    def smad(v):
        return max(MAD_TO_SIGMA * float(np.median(np.abs(v - np.median(v)))), mad_floor)

    return TwoModeSplit(slow_count=int(lo.size), fast_count=int(hi.size),
                        slow_median_Bps=float(np.median(x[:cut])),
                        fast_median_Bps=float(np.median(x[cut:])),
                        slow_max_Bps=float(x[cut - 1]), fast_min_Bps=float(x[cut]),
                        slow_mad=smad(lo), fast_mad=smad(hi))


def is_bimodal(split: TwoModeSplit | None, th: AuditThresholds) -> bool:
    """Whether a :func:`two_mode_split` passes every rule of the module docstring."""
    if split is None:
        return False
    m = split.slow_count + split.fast_count
    need = max(th.bimodal_min_members, math.ceil(th.bimodal_min_share * m - 1e-9))
    return (min(split.slow_count, split.fast_count) >= need
            and split.ratio >= th.bimodal_median_ratio
            and split.separation >= th.bimodal_min_separation
            and split.gap_mads >= th.bimodal_gap_mads)


def _bimodal_class(key: tuple, label: str, directed: dict, th: AuditThresholds
                   ) -> BimodalClass | None:
    split = two_mode_split(directed.values(), th.bimodal_mad_floor)
    if not is_bimodal(split, th):
        return None
    cut = math.sqrt(split.slow_max_Bps * split.fast_min_Bps)      # inside the empty gap
    slow_dirs = [(a, b) for (a, b), bw in directed.items() if bw < cut]
    pairs = {tuple(sorted((a, b), key=_endpoint_key)) for a, b in directed}
    slow = {tuple(sorted(d, key=_endpoint_key)) for d in slow_dirs}
    slow_hosts = []
    hosts = sorted({ep[0] for p in pairs for ep in p}, key=host_sort_key)
    for h in hosts:
        if key[0] == "inter-node":
            part = {(p[0] if p[0] != h else q[0]) for p, q in pairs if h in (p[0], q[0])}
            bad = {(p[0] if p[0] != h else q[0]) for p, q in slow if h in (p[0], q[0])}
            enough = len(part) >= th.min_partners
        else:
            part = {pq for pq in pairs if pq[0][0] == h}
            bad = {pq for pq in slow if pq[0][0] == h}
            enough = bool(part)
        if enough and len(bad) >= th.node_slow_fraction * len(part):
            slow_hosts.append(h)
    slow_pairs = tuple((_ep_name(*a), _ep_name(*b)) for a, b in sorted(
        slow, key=lambda p: (_endpoint_key(p[0]), _endpoint_key(p[1]))))
    m = split.slow_count + split.fast_count
    reason = (f"{split.slow_count} of {m} values in a slow mode (median "
              f"{split.slow_median_Bps / GB:.2f} GB/s, up to {split.slow_max_Bps / GB:.2f}) and "
              f"{split.fast_count} in a fast mode (median {split.fast_median_Bps / GB:.2f} GB/s, "
              f"from {split.fast_min_Bps / GB:.2f}): {split.ratio:.2f}x apart, separation "
              f"D = {split.separation:.1f}; one baseline does not describe this class"
              + (f"; mostly slow: {', '.join(slow_hosts)}" if slow_hosts else ""))
    return BimodalClass(
        label=label, scope=key[0], link_class=key[1], method=key[2], gpus_per_host=key[3],
        split=split, slow_pairs=slow_pairs, slow_hosts=tuple(slow_hosts), reason=reason)


def audit(topo: Topology, thresholds: AuditThresholds | None = None) -> AuditReport:
    """Audit a measured topology (see the module docstring for the rules).

    Args: ``topo``: links in bytes/s; ``thresholds``: flagging rules (defaults documented).
    Returns an :class:`AuditReport`. What is audited: see :func:`measurement_classes`.
    Raises nothing on odd data: records with a bandwidth ≤ 0 are skipped with a warning.
    """
    th = thresholds or AuditThresholds()
    warnings = list(topo.warnings)
    classes = measurement_classes(topo, warnings)

    # Inter-node first; within a scope, links before collectives; then by GPUs per host.
    order = lambda k: (k[0] != "inter-node", k[1].endswith(" collective"), k[1], k[2],  # noqa
                       _gpu_key(k[3]))
    baselines, flagged, stats, missing, bimodal = [], [], [], [], []
    node_flags: dict[str, list[tuple[str, float, str]]] = {}
    reportable: list[FlaggedLink] = []
    for key in sorted(classes, key=order):
        label = class_label(key)
        # Duplicates of one directed link within a class: the median of them.
        directed = {k: statistics.median(v) for k, v in classes[key].items()}
        values = list(directed.values())
        med = statistics.median(values)
        smad = MAD_TO_SIGMA * statistics.median(abs(x - med) for x in values)
        scale = max(smad, th.mad_floor_fraction * med)
        baselines.append(ClassBaseline(
            label=label, scope=key[0], link_class=key[1], method=key[2], gpus_per_host=key[3],
            links=len(values), median_Bps=med, scaled_mad_Bps=smad,
            min_Bps=min(values), max_Bps=max(values)))
        bim = _bimodal_class(key, label, directed, th)
        if bim is not None:
            bimodal.append(bim)
        if smad > WIDE_SPREAD_FRACTION * med:
            warnings.append(f"[{label}]: spread too wide for a reliable baseline (scaled MAD "
                            f"{100 * smad / med:.0f} % of the median"
                            + ("; bimodal, see bimodal_classes" if bim else "")
                            + "); slow links in it may go unflagged")
        z_of = lambda x: (x - med) / scale  # noqa: E731
        is_slow = lambda x: x / med < th.slow_ratio and z_of(x) < th.slow_z  # noqa: E731

        pairs: dict[tuple, dict] = {}
        for (a, b), bw in directed.items():
            lo, hi = sorted((a, b), key=_endpoint_key)
            pairs.setdefault((lo, hi), {})["fwd" if a == lo else "rev"] = bw
        slow_pairs: set[tuple] = set()
        class_flags: list[FlaggedLink] = []
        for (lo, hi), dirs in sorted(pairs.items(), key=lambda kv: (
                _endpoint_key(kv[0][0]), _endpoint_key(kv[0][1]))):
            slow = {d: bw for d, bw in dirs.items() if is_slow(bw)}
            if slow:
                slow_pairs.add((lo, hi))
                both = len(slow) == 2
                d = min(slow, key=slow.get)
                s, t = (lo, hi) if d == "fwd" else (hi, lo)
                x = slow[d]
                class_flags.append(FlaggedLink(
                    src=s[0], dst=t[0], src_gpu=s[1], dst_gpu=t[1], link_class=label,
                    kind="slow", measured_Bps=x, expected_Bps=med, ratio=x / med,
                    z_score=z_of(x), both_directions=both,
                    reason=f"{x / GB:.2f} GB/s is {100 * x / med:.0f} % of the class median "
                           f"{med / GB:.2f} GB/s (robust z {z_of(x):.0f})"
                           + ("; both directions slow" if both else "")))
            if len(dirs) == 2:
                f, r = dirs["fwd"], dirs["rev"]
                if 1 - min(f, r) / max(f, r) > th.asymmetry_fraction:
                    s, t = (lo, hi) if f < r else (hi, lo)
                    x, y = min(f, r), max(f, r)
                    class_flags.append(FlaggedLink(
                        src=s[0], dst=t[0], src_gpu=s[1], dst_gpu=t[1], link_class=label,
                        kind="asymmetric", measured_Bps=x, expected_Bps=y, ratio=x / y,
                        z_score=z_of(x), both_directions=False,
                        reason=f"{_ep_name(*s)}->{_ep_name(*t)} {x / GB:.2f} GB/s vs reverse "
                               f"{y / GB:.2f} GB/s ({100 * (1 - x / y):.0f} % apart)"))
        flagged.extend(class_flags)

        # Per-host statistics. Inter-node partners are other hosts; intra-node partners are
        # the host's GPU pairs.
        hosts_in_class = sorted({ep[0] for pair in pairs for ep in pair}, key=host_sort_key)
        class_bad: set[str] = set()
        for h in hosts_in_class:
            vals = [bw for (a, b), bw in directed.items() if h in (a[0], b[0])]
            if key[0] == "inter-node":
                partners = {(p[0] if p[0] != h else q[0]) for p, q in pairs if h in (p[0], q[0])}
                slow_p = {(p[0] if p[0] != h else q[0]) for p, q in slow_pairs
                          if h in (p[0], q[0])}
            else:
                partners = {pq for pq in pairs if pq[0][0] == h}
                slow_p = {pq for pq in slow_pairs if pq[0][0] == h}
            st = NodeStat(host=h, link_class=label, median_Bps=statistics.median(vals),
                          links=len(vals), partners=len(partners), slow_partners=len(slow_p))
            stats.append(st)
            frac = st.slow_partner_fraction
            enough = st.partners >= th.min_partners or key[0] == "intra-node"
            if enough and frac >= th.node_slow_fraction:
                class_bad.add(h)
                what = "other hosts" if key[0] == "inter-node" else "GPU pairs"
                node_flags.setdefault(h, []).append((label, frac, (
                    f"slow with {st.slow_partners} of {st.partners} {what} in [{label}] "
                    f"(median {st.median_Bps / GB:.2f} GB/s vs class {med / GB:.2f} GB/s)")))
        # Links of a host drained in this class are explained by it; the rest go to the
        # network team.
        reportable.extend(f for f in class_flags
                          if f.src not in class_bad and f.dst not in class_bad)

        if key[0] == "inter-node":
            measured = {frozenset((p[0], q[0])) for p, q in pairs}
            for a, b in combinations(sorted(topo.hosts, key=host_sort_key), 2):
                if frozenset((a, b)) not in measured:
                    missing.append(MissingLink(src=a, dst=b, link_class=label,
                                               reason="no measurement in this class"))

    # The topology's own list of failed / absent measurements.
    for m in topo.missing:
        missing.append(MissingLink(src=m.src, dst=m.dst, link_class=None, reason=m.reason))
    if len(topo.hosts) > 1 and not any(k[0] == "inter-node" for k in classes):
        for a, b in combinations(sorted(topo.hosts, key=host_sort_key), 2):
            missing.append(MissingLink(src=a, dst=b, link_class=None,
                                       reason="no inter-node measurement at all"))

    flagged_nodes = tuple(
        FlaggedNode(host=h, classes=tuple(c for c, _, _ in v),
                    slow_partner_fraction=max(f for _, f, _ in v),
                    reason="; ".join(r for _, _, r in v))
        for h, v in sorted(node_flags.items(), key=lambda kv: host_sort_key(kv[0])))
    drain = tuple(n.host for n in flagged_nodes)
    report = _pairs_sorted((f.src, f.dst) for f in reportable)
    return AuditReport(
        hosts=tuple(topo.hosts), links_measured=sum(len(c) for c in classes.values()),
        thresholds=th, baselines=tuple(baselines), flagged_links=tuple(flagged),
        flagged_nodes=flagged_nodes, node_stats=tuple(stats), missing_links=tuple(missing),
        drain_hosts=drain, report_links=report,
        recommendation=_recommend(drain, report, missing,
                                  measured=sum(len(c) for c in classes.values())),
        warnings=tuple(warnings),
        bimodal_classes=tuple(bimodal))


def _pairs_sorted(pairs) -> tuple[tuple[str, str], ...]:
    """Unordered host pairs, each in natural order, deduplicated and sorted."""
    uniq = {tuple(sorted(p, key=host_sort_key)) for p in pairs}
    return tuple(sorted(uniq, key=lambda p: (host_sort_key(p[0]), host_sort_key(p[1]))))


#: The recommendation of an audit that found nothing to audit.
NOTHING_MEASURED = ("Measure first: the inputs hold no link measurement, so nothing could be "
                    "audited. Run the probe (configurator probe prints its torchrun command) "
                    "or nccl-tests sendrecv_perf and alltoall_perf between every pair of "
                    "hosts, then configurator topology import the results.")


def _recommend(drain, report, missing, *, measured: int) -> str:
    """The audit's recommendation: the hosts to drain, the links to report, the pairs to
    re-measure; :data:`NOTHING_MEASURED` when no link was measured at all."""
    if not measured:
        return NOTHING_MEASURED
    lines = []
    if drain:
        lines.append("Drain / exclude hosts: " + ", ".join(drain) + ".")
    if report:
        lines.append("Report to the network team: "
                     + ", ".join(f"{a}<->{b}" for a, b in report) + ".")
    pairs = _pairs_sorted((m.src, m.dst) for m in missing)
    if pairs:
        lines.append("Re-measure unmeasured pairs: "
                     + ", ".join(f"{a}<->{b}" for a, b in pairs) + ".")
    return " ".join(lines) or "No action: every measured link is within its class baseline."
