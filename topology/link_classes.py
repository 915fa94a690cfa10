"""Measurement classes of a topology and the statistics the audit and the structure analysis
share: which records should share one bandwidth (:func:`measurement_classes`), the robust
scale (:data:`MAD_TO_SIGMA`, the link fit's, :mod:`topology.linkfit`), the optimal two-mode
split of a class and the rules that call it bimodal (:func:`two_mode_split`,
:func:`is_bimodal`), and the thresholds of both (:class:`AuditThresholds`, with the six
slow-link and slow-host defaults the structure analysis shares). The reasoning behind each
rule is in :mod:`topology.audit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from topology.linkfit import MAD_TO_SIGMA
from topology.topofile import Topology, host_sort_key

# The slow-link and slow-host rules the audit (:class:`AuditThresholds`) and the structure
# analysis (:class:`topology.structure.StructureThresholds`) share, defined once here; the
# reasoning behind each is in :mod:`topology.audit`'s docstring.

#: A directed link is slow below this fraction of its class's healthy level: the "below
#: 80 % of the median" rule of the 17-node H100 nccl-tests logs in
#: configurator/data/examples; ±3 % noise on a healthy cluster never reaches it.
SLOW_RATIO = 0.8
#: ... and when its robust z (scaled MADs from the healthy level) is below this: ≈ 3·10⁻⁵
#: one-sided normal tail, so 10⁴ healthy links give < 1 false alarm.
SLOW_Z = -4.0
#: Floor of the scaled MAD, as a fraction of the median (1 %): keeps z finite when every
#: link of a class measures the same. Chosen by hand, below the ±3 % run-to-run noise.
MAD_FLOOR_FRACTION = 0.01
#: A pair measured both ways is asymmetric when ``1 − min/max`` exceeds this: above the
#: ≤ 14 % send/recv asymmetry Pipette (Yim et al., DATE 2024) reports on a healthy A100
#: cluster.
ASYMMETRY_FRACTION = 0.2
#: A host is slow when at least this fraction of its partners' links are slow: one bad
#: cable slows one pair, a bad NIC most of its host's pairs (with one bad host among
#: N ≥ 4, every other host has 1/(N−1) < 0.5 slow partners).
NODE_SLOW_FRACTION = 0.5
#: Fewest measured inter-node partners before a host can be called slow: with fewer a slow
#: pair cannot be pinned on either end.
MIN_PARTNERS = 3


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
    slow_ratio: float = SLOW_RATIO
    slow_z: float = SLOW_Z
    mad_floor_fraction: float = MAD_FLOOR_FRACTION
    asymmetry_fraction: float = ASYMMETRY_FRACTION
    node_slow_fraction: float = NODE_SLOW_FRACTION
    min_partners: int = MIN_PARTNERS
    bimodal_min_share: float = 0.1
    bimodal_min_members: int = 2
    bimodal_median_ratio: float = 1.25
    bimodal_min_separation: float = 3.0
    bimodal_gap_mads: float = 1.5
    bimodal_mad_floor: float = 0.01


def gpu_key(g: int | None) -> int:
    return -1 if g is None else g


def endpoint_key(ep: tuple[str, int | None]) -> tuple:
    return host_sort_key(ep[0]), gpu_key(ep[1])


def class_of(link) -> tuple:
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
        out.setdefault(class_of(l), {}).setdefault(
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


def endpoint_name(host: str, gpu: int | None) -> str:
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
SPLIT_FIGURES = frozenset({"slow_count", "fast_count", "slow_median_Bps", "fast_median_Bps",
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
