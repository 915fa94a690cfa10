"""Ring groups and pipeline neighbours on a cluster's links: the figures the cost model
prices collectives and sends with.

:func:`uniform_group_shape` gives what the groups of one shape look like on a uniform cluster
(identity placement) without listing them; :func:`ring_figures` prices NCCL rings row by row
on any links; :class:`GroupFigures` (a base of :class:`topology.cluster.Cluster`) answers
:meth:`~GroupFigures.group_busbw`, :meth:`~GroupFigures.p2p_worst` and
:meth:`~GroupFigures.p2p_boundaries` from the shape where it may (in time independent of the
GPU count, bit for bit what walking every hop gives: ``tests/test_scale.py``), hop by hop
elsewhere.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np


def _ceil_div(a, b):
    return -(-a // b)


def uniform_group_shape(stride: int, size: int, world: int,
                        domain_gpus: int) -> tuple[bool, bool, int]:
    """What the ring groups of ``size`` ranks spaced ``stride`` apart among ``world`` ranks
    (:func:`topology.rank_order.rank_groups`, every group, identity placement) look like on
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


def domain_members(gpus: np.ndarray, domains) -> np.ndarray:
    """For each row of ``gpus`` (``[rows, n]`` physical GPU indices), the fewest members of
    the row any of its GPUs shares an NVLink domain with, itself included (``domains``: the
    NVLink domain of every GPU index): what its all-to-all reaches over NVLink
    (:func:`topology.collectives.all_to_all_time_s`'s ``on_node``). ``[rows]`` ints."""
    dom = np.asarray(domains)[gpus]
    return (dom[:, :, None] == dom[:, None, :]).sum(axis=2).min(axis=1)


def ring_figures(gpus: np.ndarray, links, domains) -> tuple[np.ndarray, np.ndarray]:
    """(bus bandwidth B/s, per-step latency s) of the NCCL ring over each row of ``gpus``
    (``[rows, n]`` physical GPU indices, host-major), by :meth:`GroupFigures.ring_busbw`'s rules:
    NVLink hops between neighbours in one NVLink domain (a one-domain row closes its ring),
    and between consecutive domains of a row ``k`` rails in parallel (``k`` the fewest
    members a domain of the row holds), their bandwidths summed; the slowest hop sets the
    row's figure. ``domains``: the NVLink domain of every GPU index (an integer array,
    :attr:`topology.cluster.Cluster.gpu_domains`), or an int, the GPUs of each of the
    consecutive domains. ``links(a, b)`` gives (bandwidth_Bps, latency_s) arrays for GPU
    index arrays. Rows of one member get (inf, 0). Returns two ``[rows]`` float arrays."""
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


def host_ring_figures(gpus: np.ndarray, links, domains, table) -> tuple[np.ndarray, np.ndarray]:
    """:func:`ring_figures` of every row of ``gpus``, the same numbers, where a link's
    figures depend on its two hosts alone (``table``, a
    :class:`topology.link_table.LinkTable` whose :attr:`~topology.link_table.LinkTable.host_level`
    holds): a run of consecutive rows with the same host member by member (the rails of one
    data-parallel group) is priced once, and a row inside one host takes the intra-host
    figures. Returns two ``[rows]`` float arrays."""
    gpus = np.asarray(gpus, dtype=np.int64)
    rows, n = gpus.shape
    if rows == 0 or n < 2:
        return ring_figures(gpus, links, domains)
    hosts = gpus // table.gpus_per_node
    start = np.ones(rows, dtype=bool)
    start[1:] = (hosts[1:] != hosts[:-1]).any(axis=1)
    run = np.cumsum(start) - 1
    reps = np.flatnonzero(start)
    inside = (hosts[reps] == hosts[reps, :1]).all(axis=1)
    bw, lat = np.empty(reps.size), np.empty(reps.size)
    bw[inside], lat[inside] = table.intra_figures
    across = ~inside
    if across.any():
        bw[across], lat[across] = ring_figures(gpus[reps[across]], links, domains)
    return bw[run], lat[run]


class GroupFigures:
    """The ring-group and pipeline-neighbour figures of a :class:`topology.cluster.Cluster`,
    which it inherits: they read its :attr:`placement`, :attr:`is_uniform`,
    :attr:`measured_links`, :meth:`link_table`,
    :attr:`domains_in_order`, :attr:`nvlink_domain_gpus`, :attr:`num_gpus`,
    :attr:`gpu_domains`, :meth:`link` and :meth:`links`, and keep their results in its
    ``_cache`` (dropped by its ``invalidate``)."""

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

    @property
    def _shape_shortcut(self) -> bool:
        """Whether group figures may come from the groups' shape: a uniform cluster, the
        identity placement and the NVLink domains the hosts in order (the shortcut counts
        members per domain of ``nvlink_domain_gpus`` consecutive rank numbers)."""
        return self.placement.is_identity and self.is_uniform and self.domains_in_order

    def _uniform_shape(self, stride: int, size: int, world: int) -> tuple[bool, bool, int]:
        """:func:`uniform_group_shape` on this cluster's NVLink domains, once per shape (the
        ring, single-send and per-domain figures of one group shape share it)."""
        key = ("shape", stride, size, world)
        if key not in self._cache:
            self._cache[key] = uniform_group_shape(stride, size, world,
                                                   self.nvlink_domain_gpus)
        return self._cache[key]

    def _group_gpus(self, stride: int, size: int, world: int) -> np.ndarray:
        """Physical GPU indices (one row per group) of every group of
        :func:`topology.rank_order.rank_groups` under :attr:`placement`."""
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
        """:meth:`ring_busbw`'s rules over every row of ``gpus`` at once; the worst row.

        Where a link's figures depend on its two hosts alone
        (:attr:`topology.link_table.LinkTable.host_level`, e.g. a measured topology of
        host-to-host records), rows with the same hosts member by member have the same
        figures and rows inside one host the intra-host one (:func:`host_ring_figures`).
        Asked of a cluster with measured links laid over (or whose link table exists): a
        built graph's link table is not made for it."""
        t = (self.link_table() if self.measured_links is not None or "table" in self._cache
             else None)
        if t is not None and t.host_level:
            bw, lat = host_ring_figures(gpus, self.links, self.gpu_domains, t)
        else:
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
                intra, inter, k = self._uniform_shape(stride, size, world)
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

    def ring_hop_worst(self, stride: int, size: int, world: int) -> tuple[float, float]:
        """Worst (bandwidth B/s, latency s) of one transfer between neighbours of the rings
        of ``size`` ranks ``stride`` apart, the wrap-around ``size-1 → 0`` included, both
        directions: what a ring of point-to-point sends (Transformer Engine's context-parallel
        K/V exchange, one ``batch_isend_irecv`` per step) runs at. Unlike
        :meth:`group_busbw` no rails add up: each send leaves through its own GPU's link
        (NVLink, or the GPU's NIC when the neighbour is in another NVLink domain), and every
        member sends at once, so no NIC is free to help another."""
        return self._hop_worst(stride, size, world, wrap=True)

    def _uniform_hop(self, stride: int, size: int, world: int) -> tuple[float, float]:
        """Worst (bandwidth B/s, latency s) of one send between neighbours of a group shape on
        a uniform cluster: its hops inside an NVLink domain and/or across one NIC, each way."""
        self._check_extent(stride, size, world)
        D = self.nvlink_domain_gpus
        intra, inter, _ = self._uniform_shape(stride, size, world)
        bw, lat = float("inf"), 0.0
        for on, b in ((intra, 1), (inter, D)):
            if on:
                for x, y in ((0, b), (b, 0)):
                    bw_, l_ = self.link(x, y)
                    bw, lat = min(bw, bw_), max(lat, l_)
        return bw, lat

    def members_per_domain(self, stride: int, size: int, world: int) -> int:
        """The fewest members one NVLink domain holds of a group of ``size`` ranks
        ``stride`` apart, over every group of that shape (``size`` when every group lies in
        one domain): the members of the slowest rank's all-to-all that it reaches over
        NVLink, itself included (:func:`topology.collectives.all_to_all_time_s`'s
        ``on_node``)."""
        key = ("per_domain", stride, size, world)
        if key not in self._cache:
            if size < 2:
                res = size
            elif self._shape_shortcut:
                self._check_extent(stride, size, world)
                _, inter, k = self._uniform_shape(stride, size, world)
                res = k if inter else size
            else:
                res = int(domain_members(self._group_gpus(stride, size, world),
                                         self.gpu_domains).min())
            self._cache[key] = res
        return self._cache[key]

    def p2p_worst(self, stride: int, size: int, world: int) -> tuple[float, float]:
        """Worst (bandwidth B/s, latency s) between pipeline neighbours ``r → r + stride``
        (both directions)."""
        return self._hop_worst(stride, size, world, wrap=False)

    def _hop_worst(self, stride: int, size: int, world: int,
                   wrap: bool) -> tuple[float, float]:
        """Worst (bandwidth B/s, latency s) of one send between neighbours ``r → r + stride``,
        both ways, over every boundary of the groups (with ``wrap``, the ring's wrap-around
        too); cached per shape."""
        key = ("ring_hop" if wrap else "p2p", stride, size, world)
        if key not in self._cache:
            res = (float("inf"), 0.0)
            if size < 2:
                pass
            elif self._shape_shortcut:
                res = self._uniform_hop(stride, size, world)
            else:
                fb, fl, bb, bl = self.p2p_boundaries(stride, size, world)
                end = None if wrap else -1
                res = (float(min(fb[:end].min(), bb[:end].min())),
                       float(max(fl[:end].max(), bl[:end].max())))
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
