"""The network's structure, found from the measured host-to-host bandwidths: islands of hosts
fast among themselves and slow between them, a host whose links are all slow (its NIC), a
slow pair, a slow direction, a link that loses bandwidth at large messages. Each
:class:`Finding` says which measurements show it, what usually causes it, what to do, and
which links a repair would restore (the cost of a finding is priced from that, by the app).

Method, per inter-node measurement class (:func:`topology.link_classes.measurement_classes`; GPU
records folded per directed host pair by their median):

1. **Healthy level** ``h``: where the class is bimodal (:func:`topology.link_classes.is_bimodal`)
   the median of its fast mode, else its median; a directed link is *slow* when it is below
   ``slow_ratio·h`` (0.8) and its robust z against the healthy values' scaled MAD is below
   ``slow_z`` (−4), the audit's own rule with the healthy mode as the baseline. A class
   whose median sits in a slow mode (half its pairs slow, as between two islands) is judged
   against its fast mode, not its median.
2. **Islands**: Louvain communities (networkx, seed 0; Blondel et al., J. Stat. Mech. 2008)
   of the graph whose edges are the host pairs with no slow direction. They are islands when
   at least two communities hold two or more hosts each, at least ``island_purity`` (75 %)
   of the measured pairs between them are slow and at least that share of the pairs inside
   them is not: the shape of a failed spine switch or uplink. Hosts left alone in a
   community (their links are all slow) are not islands: step 3 names them.
3. **Slow hosts**: a host is slow when, over its partners not explained by islands (same
   island, or no islands), at least ``node_slow_fraction`` (half) of its outgoing or of its
   incoming links are slow, with at least ``min_partners`` (3) partners: a bad cable slows
   one pair, a bad NIC every pair of its host. Outgoing only: it sends slowly; incoming only:
   it receives slowly; both: every link.
4. **Slow pairs and directions**: of the pairs left (not across islands, not touching a slow
   host), one slow in both directions (or measured one way) is a slow pair; one slow one way
   and at least ``1/(1 − asymmetry_fraction)`` faster the other way is a slow direction.
5. **Degrading with size**: a link record whose busbw at its two largest samples (an
   nccl-tests sweep's largest message, out-of-place and in-place) is below
   ``degrade_fraction`` (half) of its fitted bandwidth: the α–β fit prices the link at the
   smaller messages' rate, and large messages run slower.

Findings of the same thing in several classes (e.g. the 1-, 4- and 8-GPU runs) are merged,
each class listed in the evidence.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from configurator.core.units import GB
from topology.link_classes import (ASYMMETRY_FRACTION, MAD_FLOOR_FRACTION, MAD_TO_SIGMA,
                                   MIN_PARTNERS, NODE_SLOW_FRACTION, SLOW_RATIO, SLOW_Z,
                                   AuditThresholds, class_label, class_of, is_bimodal,
                                   measurement_classes, two_mode_split)
from topology.topofile import Topology, host_sort_key

#: What a finding is about, in the order findings are reported.
FINDING_KINDS = ("islands", "slow_host", "slow_pair", "slow_direction", "degrades_with_size")
#: How each kind is named in a sentence: (one, several).
KIND_NAMES = {"islands": ("island structure", "island structures"),
              "slow_host": ("slow host", "slow hosts"), "slow_pair": ("slow pair", "slow pairs"),
              "slow_direction": ("slow direction", "slow directions"),
              "degrades_with_size": ("link slower at large messages",
                                     "links slower at large messages")}


def count_findings(findings) -> str:
    """``"1 slow host, 25 slow pairs"``: the findings counted by kind, in kind order."""
    n = {k: sum(f.kind == k for f in findings) for k in FINDING_KINDS}
    return ", ".join(f"{c} {KIND_NAMES[k][c != 1]}" for k, c in n.items() if c)


#: What usually causes each kind of finding.
CAUSES = {
    "islands": "a failed or oversubscribed spine switch or uplink: the hosts of each island "
               "share a leaf switch and reach the others only through the degraded layer",
    "slow_host": "the host's NIC or its cable (a link trained at a lower rate, PCIe "
                 "downgraded, firmware) or its port on the switch",
    "slow_pair": "a cable, transceiver or switch port on the route between the two hosts, or "
                 "routing (ECMP) that sends their traffic over a congested link",
    "slow_direction": "one direction of a link: a bad transceiver lane or cable on one side, "
                      "a port that negotiated a lower rate one way, or congestion (PFC pauses) "
                      "in that direction only",
    "degrades_with_size": "loss or congestion under sustained load (buffer exhaustion, PFC "
                          "pauses, adaptive routing off) or a NIC or transceiver throttling",
}


#: What to do about each kind of finding: ``{subject}`` is one finding's (``cnode2-001<->
#: cnode2-004``, ``the direction a->b``) or, said of every finding of a kind at once,
#: :data:`EVERY_SUBJECT`'s.
ACTIONS = {
    "islands": "check the fabric between {subject}: spine switches and uplinks; until then "
               "keep each group of ranks that talks most inside one island",
    "slow_host": "leave {subject} out (drain it) or check its NIC and cable",
    "slow_pair": "report {subject} to the network team (cable, transceiver or switch port on "
                 "their route)",
    "slow_direction": "report {subject} to the network team (one side of the link: "
                      "transceiver, cable lane or port speed)",
    "degrades_with_size": "re-run {subject} with the largest messages and check the switch "
                          "counters for pauses and drops (the plan is priced at the smaller "
                          "messages' rate)",
}
#: :data:`ACTIONS`' subject when the action is said once for every finding of its kind.
EVERY_SUBJECT = {"islands": "the islands", "slow_host": "each host",
                 "slow_pair": "each pair", "slow_direction": "each direction",
                 "degrades_with_size": "each pair's test"}


def kind_action(kind: str) -> str:
    """What to do about every finding of ``kind`` (:data:`ACTIONS` said of them all)."""
    return ACTIONS[kind].format(subject=EVERY_SUBJECT[kind])


@dataclass(frozen=True, kw_only=True)
class StructureThresholds:
    """Rules of the structure analysis (see the module docstring); the slow-link and
    slow-host figures are the audit's (:class:`topology.link_classes.AuditThresholds`)."""

    slow_ratio: float = SLOW_RATIO
    slow_z: float = SLOW_Z
    mad_floor_fraction: float = MAD_FLOOR_FRACTION
    asymmetry_fraction: float = ASYMMETRY_FRACTION
    node_slow_fraction: float = NODE_SLOW_FRACTION
    min_partners: int = MIN_PARTNERS
    #: Share of the pairs between communities that must be slow (and of those inside that
    #: must not) for them to be islands. Set by hand, no fit: above 0.5 so that most pairs
    #: agree, below 1 so that one healthy cross link does not hide a failed spine; the
    #: tests' two-island topologies (tests/test_structure.py) have purity 1.
    island_purity: float = 0.75
    #: A link degrades with size when its two largest messages' busbw is below this
    #: fraction of its fitted bandwidth. Set by hand, no fit: half, far outside the ±3 %
    #: noise of a healthy sweep.
    degrade_fraction: float = 0.5


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One structural finding.

    ``kind``: one of :data:`FINDING_KINDS`. ``hosts``: the hosts it names (islands: every
    island host; a slow host; a pair; a direction's ``(src, dst)``). ``islands``: the island
    members (kind ``islands``). ``direction``: for a slow host ``"both"``, ``"send"`` or
    ``"receive"``; for a slow direction ``"src->dst"``. ``measured_Bps`` / ``expected_Bps``:
    the slow figure and the healthy level it is judged against (bytes/s; the worst class).
    ``evidence``: one line per measurement class that shows it. ``repair``: the directed host
    pairs a repair would bring to the healthy level; ``leave_out``: hosts one could run
    without instead. ``cause`` and ``action`` in words."""

    kind: str
    subject: str
    hosts: tuple[str, ...]
    islands: tuple[tuple[str, ...], ...] = ()
    direction: str | None = None
    measured_Bps: float = math.nan
    expected_Bps: float = math.nan
    evidence: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    repair: tuple[tuple[str, str], ...] = ()
    leave_out: tuple[str, ...] = ()
    cause: str = ""
    action: str = ""

    @property
    def ratio(self) -> float:
        return self.measured_Bps / self.expected_Bps if self.expected_Bps else math.nan

    def to_dict(self) -> dict:
        r3 = lambda x: None if not math.isfinite(x) else round(x, 3)  # noqa: E731
        return {"kind": self.kind, "subject": self.subject, "hosts": list(self.hosts),
                "islands": [list(i) for i in self.islands], "direction": self.direction,
                "measured_GBps": r3(self.measured_Bps / GB),
                "expected_GBps": r3(self.expected_Bps / GB), "ratio": r3(self.ratio),
                "classes": list(self.classes), "evidence": list(self.evidence),
                "cause": self.cause, "action": self.action,
                "repair": [list(p) for p in self.repair], "leave_out": list(self.leave_out)}


@dataclass(frozen=True, kw_only=True)
class Structure:
    """The findings (ordered by :data:`FINDING_KINDS`, then worst first), the islands, and
    each inter-node class's healthy level (bytes/s, by class label: what a repair restores
    a link of that class to)."""

    islands: tuple[tuple[str, ...], ...] = ()
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    healthy_Bps: dict = field(default_factory=dict)
    #: labels of the classes made of link records (not collectives): the links the cost
    #: model prices transfers on (:func:`topology.topofile.apply_topology`)
    link_classes: frozenset = frozenset()

    def host_order(self, hosts) -> list[str]:
        """``hosts`` with each island's members together (islands in order, the rest after),
        naturally sorted within each: the heatmap's order."""
        rank = {h: i for i, isl in enumerate(self.islands) for h in isl}
        return sorted(hosts, key=lambda h: (rank.get(h, len(self.islands)), host_sort_key(h)))


def _pair(a: str, b: str) -> tuple[str, str]:
    return tuple(sorted((a, b), key=host_sort_key))


def _fmt(x: float) -> str:
    return f"{x / GB:.2f}"


@dataclass
class _Class:
    """One inter-node class folded to directed host pairs: bandwidth, healthy level, scale."""

    label: str
    bw: dict                    # (src, dst) -> bytes/s
    healthy: float
    scale: float
    from_links: bool            # link records (True) or two-host collectives

    def slow(self, x: float, th: StructureThresholds) -> bool:
        return x < th.slow_ratio * self.healthy and (x - self.healthy) / self.scale < th.slow_z


def _fold(directed: dict) -> dict:
    """GPU-level records of a class folded per directed host pair (their median). A class
    that measures every pair one way only (a two-host collective is one figure for the pair)
    says nothing about direction: each figure stands for both directions."""
    per: dict[tuple[str, str], list[float]] = {}
    for ((a, _), (b, _)), x in directed.items():
        if a != b:
            per.setdefault((a, b), []).append(x)
    out = {k: statistics.median(v) for k, v in per.items()}
    if not any((b, a) in out for (a, b) in out):
        out.update({(b, a): x for (a, b), x in list(out.items())})
    return out


def _healthy(values: list[float], th: StructureThresholds, bimodal_th) -> tuple[float, float]:
    """(healthy level, robust scale) of a class's values (module docstring, step 1)."""
    split = two_mode_split(values, bimodal_th.bimodal_mad_floor)
    good = values
    if is_bimodal(split, bimodal_th):
        cut = math.sqrt(split.slow_max_Bps * split.fast_min_Bps)
        good = [x for x in values if x >= cut]
    h = statistics.median(good)
    smad = MAD_TO_SIGMA * statistics.median(abs(x - h) for x in good)
    return h, max(smad, th.mad_floor_fraction * h)


def _islands(c: _Class, hosts: list[str], th: StructureThresholds
             ) -> tuple[tuple[str, ...], ...]:
    """Islands of one class (module docstring, step 2), or ``()``."""
    import networkx as nx

    pairs: dict[tuple[str, str], bool] = {}
    for (a, b), x in c.bw.items():
        p = _pair(a, b)
        pairs[p] = pairs.get(p, False) or c.slow(x, th)
    if len(hosts) < 4 or not any(pairs.values()):
        return ()
    g = nx.Graph()
    g.add_nodes_from(hosts)
    g.add_edges_from(p for p, slow in pairs.items() if not slow)
    comms = nx.community.louvain_communities(g, seed=0)
    islands = [tuple(sorted(cm, key=host_sort_key)) for cm in comms if len(cm) >= 2]
    if len(islands) < 2:
        return ()
    where = {h: i for i, isl in enumerate(islands) for h in isl}
    inside = [slow for (a, b), slow in pairs.items() if a in where and where.get(b) == where[a]]
    across = [slow for (a, b), slow in pairs.items()
              if a in where and b in where and where[a] != where[b]]
    if not across or not inside:
        return ()
    if (sum(across) / len(across) < th.island_purity
            or 1 - sum(inside) / len(inside) < th.island_purity):
        return ()
    # a host left alone (every link slow: its NIC) joins the island it reaches fastest, when
    # that is clearly faster than the others (step 3 then names it as a slow host)
    members = [list(isl) for isl in islands]
    for h in hosts:
        if h in where:
            continue
        reach = []
        for isl in islands:
            vals = [x for (a, b), x in c.bw.items() if (a == h and b in isl)
                    or (b == h and a in isl)]
            reach.append(statistics.median(vals) if vals else 0.0)
        order = sorted(range(len(reach)), key=lambda i: -reach[i])
        if reach[order[0]] > 0 and reach[order[0]] * th.slow_ratio >= reach[order[1]]:
            members[order[0]].append(h)
    return tuple(sorted((tuple(sorted(m, key=host_sort_key)) for m in members),
                        key=lambda isl: host_sort_key(isl[0])))


def find_structure(topo: Topology, thresholds: StructureThresholds | None = None,
                   audit_thresholds=None) -> Structure:
    """The structure of ``topo``'s inter-node measurements (module docstring). Returns a
    :class:`Structure`; a topology with no inter-node measurement has none."""
    th = thresholds or StructureThresholds()
    ath = audit_thresholds or AuditThresholds()
    classes = []
    for key, recs in measurement_classes(topo).items():
        if key[0] != "inter-node":
            continue
        bw = _fold({k: statistics.median(v) for k, v in recs.items()})
        if len(bw) < 2:
            continue
        h, scale = _healthy(list(bw.values()), th, ath)
        classes.append(_Class(class_label(key), bw, h, scale,
                              not key[1].endswith(" collective")))
    hosts = sorted(topo.hosts, key=host_sort_key)

    # islands: the class that shows them over the most pairs; others must agree to count
    found = [(c, _islands(c, hosts, th)) for c in classes]
    found = [(c, isl) for c, isl in found if isl]
    islands: tuple[tuple[str, ...], ...] = ()
    island_classes: list[_Class] = []
    if found:
        islands = max(found, key=lambda ci: len(ci[0].bw))[1]
        island_classes = [c for c, isl in found if isl == islands]
    where = {h: i for i, isl in enumerate(islands) for h in isl}
    across = lambda a, b: a in where and b in where and where[a] != where[b]  # noqa: E731

    hits: dict[tuple, list] = {}         # (kind, subject key) -> [(class, measured, healthy)]
    for c in classes:
        isl_here = c in island_classes
        explained = (lambda a, b: across(a, b)) if isl_here else (lambda a, b: False)
        # slow hosts
        slow_hosts: dict[str, str] = {}
        for hname in hosts:
            outs = [(b, x) for (a, b), x in c.bw.items() if a == hname and not explained(a, b)]
            ins = [(a, x) for (a, b), x in c.bw.items() if b == hname and not explained(a, b)]
            partners = {p for p, _ in outs} | {p for p, _ in ins}
            if len(partners) < th.min_partners:
                continue
            f_out = (sum(c.slow(x, th) for _, x in outs) / len(outs)) if outs else 0.0
            f_in = (sum(c.slow(x, th) for _, x in ins) / len(ins)) if ins else 0.0
            if max(f_out, f_in) < th.node_slow_fraction:
                continue
            direction = ("both" if min(f_out, f_in) >= th.node_slow_fraction
                         or not outs or not ins    # measured one way: cannot tell
                         else "send" if f_out >= th.node_slow_fraction else "receive")
            slow_hosts[hname] = direction
            vals = [x for _, x in (outs if direction == "send" else ins if
                                   direction == "receive" else outs + ins)]
            hits.setdefault(("slow_host", hname, None), []).append(
                (c, statistics.median(vals), c.healthy, direction))
        # pairs and directions
        done: set[tuple[str, str]] = set()
        for (a, b) in c.bw:
            p = _pair(a, b)
            if p in done or explained(a, b) or a in slow_hosts or b in slow_hosts:
                continue
            done.add(p)
            fwd, rev = c.bw.get(p), c.bw.get((p[1], p[0]))
            sf = fwd is not None and c.slow(fwd, th)
            sr = rev is not None and c.slow(rev, th)
            if not (sf or sr):
                continue
            if sf and sr or fwd is None or rev is None:
                x = min(v for v in (fwd, rev) if v is not None)
                hits.setdefault(("slow_pair", p, None), []).append((c, x, c.healthy, None))
                continue
            lo, hi = (fwd, rev) if sf else (rev, fwd)
            src, dst = p if sf else (p[1], p[0])
            if lo < (1 - th.asymmetry_fraction) * hi:
                hits.setdefault(("slow_direction", (src, dst), None), []).append(
                    (c, lo, c.healthy, None))
            else:       # slow one way, hardly faster the other: the pair
                hits.setdefault(("slow_pair", p, None), []).append((c, lo, c.healthy, None))

    findings: list[Finding] = []
    if islands:
        evid, measured = [], []
        for c in island_classes:
            cross = [x for (a, b), x in c.bw.items() if across(a, b)]
            pairs = {_pair(a, b) for (a, b) in c.bw if across(a, b)}
            measured.append((statistics.median(cross), c.healthy))
            evid.append(f"[{c.label}] {len(pairs)} cross-island pairs at median "
                        f"{_fmt(statistics.median(cross))} GB/s vs {_fmt(c.healthy)} GB/s "
                        f"inside the islands")
        x, h = min(measured, key=lambda m: m[0] / m[1])
        names = "; ".join("{" + ", ".join(i) + "}" for i in islands)
        repair = tuple(sorted({(a, b) for c in island_classes for (a, b) in c.bw
                               if across(a, b)}, key=lambda p: (host_sort_key(p[0]),
                                                                host_sort_key(p[1]))))
        findings.append(Finding(
            kind="islands", subject=f"{len(islands)} islands: {names}",
            hosts=tuple(h for isl in islands for h in isl), islands=islands,
            measured_Bps=x, expected_Bps=h, evidence=tuple(evid),
            classes=tuple(c.label for c in island_classes), repair=repair,
            cause=CAUSES["islands"],
            action=ACTIONS["islands"].format(subject=f"the islands ({names})")))

    def merged(kind):
        for (k, subj, _), rows in hits.items():
            if k != kind:
                continue
            c, x, h, _ = min(rows, key=lambda r: r[1] / r[2])
            yield subj, rows, x, h

    per_kind: dict[str, list[Finding]] = {k: [] for k in FINDING_KINDS}
    dirs = {"both": "every link", "send": "what it sends", "receive": "what it receives"}
    for subj, rows, x, h in merged("slow_host"):
        seen = {d for *_, d in rows}       # one way in every class that shows it, or both
        direction = seen.pop() if len(seen) == 1 else "both"
        repair = tuple(sorted({(a, b) for c, *_ in rows for (a, b) in c.bw
                               if (direction in ("both", "send") and a == subj)
                               or (direction in ("both", "receive") and b == subj)}))
        per_kind["slow_host"].append(Finding(
            kind="slow_host", subject=subj, hosts=(subj,), direction=direction,
            measured_Bps=x, expected_Bps=h, classes=tuple(c.label for c, *_ in rows),
            evidence=tuple(f"[{c.label}] {dirs[d]}: median {_fmt(m)} GB/s vs "
                           f"{_fmt(hh)} GB/s healthy ({100 * m / hh:.0f} %)"
                           for c, m, hh, d in rows),
            repair=repair, leave_out=(subj,), cause=CAUSES["slow_host"],
            action=ACTIONS["slow_host"].format(subject=subj)))
    for subj, rows, x, h in merged("slow_pair"):
        a, b = subj
        per_kind["slow_pair"].append(Finding(
            kind="slow_pair", subject=f"{a}<->{b}", hosts=(a, b), measured_Bps=x,
            expected_Bps=h, classes=tuple(c.label for c, *_ in rows),
            evidence=tuple(f"[{c.label}] {_fmt(m)} GB/s vs {_fmt(hh)} GB/s healthy "
                           f"({100 * m / hh:.0f} %)" for c, m, hh, _ in rows),
            repair=((a, b), (b, a)), cause=CAUSES["slow_pair"],
            action=ACTIONS["slow_pair"].format(subject=f"{a}<->{b}")))
    for subj, rows, x, h in merged("slow_direction"):
        s, d = subj
        per_kind["slow_direction"].append(Finding(
            kind="slow_direction", subject=f"{s}->{d}", hosts=(s, d), direction=f"{s}->{d}",
            measured_Bps=x, expected_Bps=h, classes=tuple(c.label for c, *_ in rows),
            evidence=tuple(f"[{c.label}] {s}->{d} {_fmt(m)} GB/s vs "
                           f"{_fmt(c.bw[(d, s)])} GB/s the other way, {_fmt(hh)} healthy"
                           for c, m, hh, _ in rows),
            repair=((s, d),), cause=CAUSES["slow_direction"],
            action=ACTIONS["slow_direction"].format(subject=f"the direction {s}->{d}")))
    per_kind["degrades_with_size"] = _degrading(topo, th)
    for kind in FINDING_KINDS[1:]:
        findings += sorted(per_kind[kind], key=lambda f: (f.ratio, f.subject))
    return Structure(islands=islands, findings=tuple(findings),
                     healthy_Bps={c.label: c.healthy for c in classes},
                     link_classes=frozenset(c.label for c in classes if c.from_links))


def repaired(topo: Topology, structure: Structure, finding: Finding) -> Topology:
    """``topo`` with ``finding`` repaired: every link record of a class that shows it, on a
    directed host pair of :attr:`Finding.repair`, raised to its class's healthy level (GPU
    records of those hosts as well). The other records are unchanged."""
    import dataclasses

    pairs = set(finding.repair)
    classes = set(finding.classes)
    links = []
    for l in topo.links:
        label = class_label(class_of(l))
        h = structure.healthy_Bps.get(label)
        if (h is not None and label in classes and (l.src, l.dst) in pairs
                and l.bandwidth_Bps < h):
            l = dataclasses.replace(l, bandwidth_Bps=h)
        links.append(l)
    return dataclasses.replace(topo, links=tuple(links))


def _degrading(topo: Topology, th: StructureThresholds) -> list[Finding]:
    """Links whose largest messages run below ``degrade_fraction`` of their fitted rate
    (module docstring, step 5), merged per host pair."""
    per: dict[tuple[str, str], list] = {}
    for l in topo.links:
        if l.intra_node or l.nominal or len(l.samples_Bps) < 4 or not l.bandwidth_Bps > 0:
            continue
        tail = max(l.samples_Bps[-2:])
        if tail < th.degrade_fraction * l.bandwidth_Bps:
            per.setdefault(_pair(l.src, l.dst), []).append((l, tail))
    out = []
    for (a, b), rows in per.items():
        worst_l, worst_t = min(rows, key=lambda r: r[1] / r[0].bandwidth_Bps)
        labels = tuple(dict.fromkeys(class_label(class_of(l)) for l, _ in rows))
        out.append(Finding(
            kind="degrades_with_size", subject=f"{a}<->{b}", hosts=(a, b),
            measured_Bps=worst_t, expected_Bps=worst_l.bandwidth_Bps, classes=labels,
            evidence=tuple(f"[{class_label(class_of(l))}] {l.src}->{l.dst}: busbw "
                           f"{_fmt(t)} GB/s at the largest messages vs {_fmt(l.bandwidth_Bps)}"
                           f" GB/s fitted over the smaller ones" for l, t in rows),
            cause=CAUSES["degrades_with_size"],
            action=ACTIONS["degrades_with_size"].format(subject=f"the {a}<->{b} test")))
    return out
