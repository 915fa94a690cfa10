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
≤ 14 % send/recv asymmetry Pipette reports on a healthy A100 cluster; Yim et al., DATE 2024).
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

from configurator.core.units import GB
from topology.link_classes import (MAD_TO_SIGMA, SPLIT_FIGURES, AuditThresholds, TwoModeSplit,
                                   class_label, endpoint_key, endpoint_name, gpu_key,
                                   is_bimodal, measurement_classes, two_mode_split)
from topology.structure import Finding, Structure, StructureThresholds, find_structure
from topology.topofile import Topology, host_sort_key

#: A class whose scaled MAD exceeds this fraction of its median (e.g. bimodal) gets a warning.
WIDE_SPREAD_FRACTION = 0.1
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
        if name in SPLIT_FIGURES:          # the split's figures, by their own names
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
    #: the network's structure and what it means (:mod:`topology.structure`)
    structure: "Structure | None" = None
    #: hosts the audit cannot judge: measured with fewer than ``min_partners`` other hosts
    #: (:func:`thin_coverage`), so a slow host among them is not told from a slow link
    unaudited_hosts: tuple[str, ...] = ()

    @property
    def coverage_warning(self) -> str:
        """One line when coverage is too thin to audit some hosts, else ``""``."""
        return coverage_warning(len(self.hosts), self.unaudited_hosts,
                                self.thresholds.min_partners)

    @property
    def audit_line(self) -> str:
        """``audit: <findings>`` for the first lines of an output: the findings counted
        by kind; ``no finding`` only when every host was audited."""
        from topology.structure import count_findings

        found = count_findings(self.findings)
        if found:
            return "audit: " + found
        if not self.links_measured:
            return "audit: nothing measured, nothing audited"
        if len(self.unaudited_hosts) == len(self.hosts):
            return "audit: not audited (coverage too thin)"
        if self.unaudited_hosts:
            return (f"audit: no finding on the {len(self.hosts) - len(self.unaudited_hosts)} "
                    f"hosts audited; {len(self.unaudited_hosts)} not audited")
        return "audit: no finding"

    @property
    def islands(self) -> tuple[tuple[str, ...], ...]:
        return self.structure.islands if self.structure else ()

    @property
    def findings(self) -> tuple["Finding", ...]:
        return self.structure.findings if self.structure else ()

    def to_dict(self) -> dict:
        """JSON-able summary; bandwidths in GB/s (1e9 B/s)."""
        r3 = lambda x: round(x, 3)  # noqa: E731
        return {
            "hosts": list(self.hosts),
            "links_measured": self.links_measured,
            "islands": [list(i) for i in self.islands],
            "findings": [f.to_dict() for f in self.findings],
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
            "unaudited_hosts": list(self.unaudited_hosts),
        }


def _bimodal_class(key: tuple, label: str, directed: dict, th: AuditThresholds
                   ) -> BimodalClass | None:
    split = two_mode_split(directed.values(), th.bimodal_mad_floor)
    if not is_bimodal(split, th):
        return None
    cut = math.sqrt(split.slow_max_Bps * split.fast_min_Bps)      # inside the empty gap
    slow_dirs = [(a, b) for (a, b), bw in directed.items() if bw < cut]
    pairs = {tuple(sorted((a, b), key=endpoint_key)) for a, b in directed}
    slow = {tuple(sorted(d, key=endpoint_key)) for d in slow_dirs}
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
    slow_pairs = tuple((endpoint_name(*a), endpoint_name(*b)) for a, b in sorted(
        slow, key=lambda p: (endpoint_key(p[0]), endpoint_key(p[1]))))
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
                       gpu_key(k[3]))
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
            lo, hi = sorted((a, b), key=endpoint_key)
            pairs.setdefault((lo, hi), {})["fwd" if a == lo else "rev"] = bw
        slow_pairs: set[tuple] = set()
        class_flags: list[FlaggedLink] = []
        for (lo, hi), dirs in sorted(pairs.items(), key=lambda kv: (
                endpoint_key(kv[0][0]), endpoint_key(kv[0][1]))):
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
                        reason=f"{endpoint_name(*s)}->{endpoint_name(*t)} {x / GB:.2f} GB/s vs reverse "
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
    structure = find_structure(topo, StructureThresholds(
        slow_ratio=th.slow_ratio, slow_z=th.slow_z, mad_floor_fraction=th.mad_floor_fraction,
        asymmetry_fraction=th.asymmetry_fraction, node_slow_fraction=th.node_slow_fraction,
        min_partners=th.min_partners), th)
    drain = tuple(h for f in structure.findings for h in f.leave_out)
    report = _pairs_sorted(f.hosts for f in structure.findings
                           if f.kind in ("slow_pair", "slow_direction"))
    measured = sum(len(c) for c in classes.values())
    unaudited = thin_coverage(topo, th.min_partners)
    if unaudited:
        warnings.insert(0, coverage_warning(len(topo.hosts), unaudited, th.min_partners))
    return AuditReport(unaudited_hosts=unaudited,
        hosts=tuple(topo.hosts), links_measured=measured,
        thresholds=th, baselines=tuple(baselines), flagged_links=tuple(flagged),
        flagged_nodes=flagged_nodes, node_stats=tuple(stats), missing_links=tuple(missing),
        drain_hosts=drain, report_links=report,
        recommendation=recommend(structure, missing, measured=measured,
                                 asymmetric=sum(f.kind == "asymmetric" for f in flagged),
                                 unaudited=unaudited),
        warnings=tuple(warnings), bimodal_classes=tuple(bimodal), structure=structure)


def coverage_warning(hosts: int, unaudited: tuple[str, ...], min_partners: int) -> str:
    """One line naming the hosts :func:`thin_coverage` leaves unaudited, or ``""``."""
    if not unaudited:
        return ""
    k = len(unaudited)
    shown = ", ".join(unaudited[:6]) + (f" and {k - 6} more" if k > 6 else "")
    return (f"coverage too thin to audit {k} of {hosts} hosts ({shown}): each was measured "
            f"with fewer than {min_partners} other hosts, so a slow host is not told from a "
            f"slow link; measure every pair of hosts")


def thin_coverage(topo: Topology, min_partners: int) -> tuple[str, ...]:
    """The hosts of a multi-host topology measured (inter-node links or collectives over
    two hosts) with fewer than ``min_partners`` other hosts: the slow-node rule needs that
    many partners to pin a slow pair on one end (module docstring), so such hosts are not
    audited. Empty for a single host (intra-node only: nothing inter-node to judge)."""
    if len(topo.hosts) < 2:
        return ()
    partners: dict[str, set[str]] = {h: set() for h in topo.hosts}
    for link in topo.links:
        if link.src != link.dst:
            partners[link.src].add(link.dst)
            partners[link.dst].add(link.src)
    for c in topo.collectives:
        if len(c.hosts) == 2:
            a, b = c.hosts
            partners[a].add(b)
            partners[b].add(a)
    return tuple(h for h in sorted(topo.hosts, key=host_sort_key)
                 if len(partners[h]) < min_partners)


def _pairs_sorted(pairs) -> tuple[tuple[str, str], ...]:
    """Unordered host pairs, each in natural order, deduplicated and sorted."""
    uniq = {tuple(sorted(p, key=host_sort_key)) for p in pairs}
    return tuple(sorted(uniq, key=lambda p: (host_sort_key(p[0]), host_sort_key(p[1]))))


#: The recommendation of an audit that found nothing to audit.
NOTHING_MEASURED = ("Measure first: the inputs hold no link measurement, so nothing could be "
                    "audited. Run the probe (configurator probe prints its torchrun command) "
                    "or nccl-tests sendrecv_perf and alltoall_perf between every pair of "
                    "hosts, then configurator topology import the results.")
#: Findings a recommendation names one by one; beyond this many of a kind it counts them.
NAMED_PER_KIND = 6


def recommend(structure: Structure, missing, *, measured: int, asymmetric: int = 0,
              unaudited: tuple[str, ...] = ()) -> str:
    """The audit's recommendation, from its findings (:mod:`topology.structure`), each
    kind's action in order (islands, hosts to leave out, pairs and directions to report,
    links to re-test at large messages), then the pairs to re-measure;
    :data:`NOTHING_MEASURED` when no link was measured. "No action" only when there is no
    finding, nothing to re-measure and no host left unaudited (``unaudited``)."""
    if not measured:
        return NOTHING_MEASURED
    lines = []
    by_kind: dict[str, list] = {}
    for f in structure.findings:
        by_kind.setdefault(f.kind, []).append(f)
    for f in by_kind.get("islands", []):
        lines.append(f"Check the fabric between the islands ({_island_names(f.islands)}): "
                     f"their links run at {100 * f.ratio:.0f} % of the rate inside them.")

    def names(kind):
        fs = by_kind.get(kind, [])
        shown = ", ".join(f.subject for f in fs[:NAMED_PER_KIND])
        more = len(fs) - NAMED_PER_KIND
        return shown + (f" and {more} more" if more > 0 else "")

    if by_kind.get("slow_host"):
        lines.append(f"Leave out (drain) or repair the NIC of: {names('slow_host')}.")
    if by_kind.get("slow_pair") or by_kind.get("slow_direction"):
        parts = [x for x in (names("slow_pair"), names("slow_direction")) if x]
        lines.append("Report to the network team: " + "; ".join(parts) + ".")
    if by_kind.get("degrades_with_size"):
        lines.append(f"Re-test at large messages (bandwidth falls with size): "
                     f"{names('degrades_with_size')}.")
    pairs = _pairs_sorted((m.src, m.dst) for m in missing)
    if pairs:
        lines.append("Re-measure unmeasured pairs: "
                     + ", ".join(f"{a}<->{b}" for a, b in pairs) + ".")
    if unaudited:
        shown = ", ".join(unaudited[:NAMED_PER_KIND]) + (
            f" and {len(unaudited) - NAMED_PER_KIND} more"
            if len(unaudited) > NAMED_PER_KIND else "")
        lines.append(f"Measure every pair of hosts: {shown} had too few partners to audit.")
    if lines:
        return " ".join(lines)
    return ("No action: no link runs below its class's healthy level"
            + (f" ({asymmetric} pair(s) above run faster one way than the other, not slower)"
               if asymmetric else "") + ".")


def _island_names(islands) -> str:
    return "; ".join("{" + ", ".join(i) + "}" for i in islands)
