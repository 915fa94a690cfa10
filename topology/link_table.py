"""Every GPU→GPU link of a cluster as arrays (:class:`LinkTable`), for the placement search
and the placed pricing, which ask millions of pairs at once."""

from __future__ import annotations

import numpy as np

from topology.link_graph import SPEC_KEYS, nominal_edges


class LinkTable:
    """Every GPU→GPU link of a :class:`topology.cluster.Cluster` as arrays: its
    :meth:`~topology.cluster.Cluster.link` figures for whole index arrays at once, for
    placement search (which asks millions of pairs).

    A link inside a host comes from ``intra_bw[h, i, j]`` (``[H, G, G]``); one between two
    hosts of one NVLink domain from its path GPU→switch→GPU; one across domains from its
    path GPU→NIC→(NIC↔NIC or host↔host measured edge, else NIC→fabric→NIC)→GPU
    (per-host ``[H, G]`` edge arrays and the measured host-edges, sparse), the slowest edge and the
    summed latency, exactly :meth:`~topology.cluster.Cluster.link`'s rule
    (``tests/test_placement.py`` compares them); a measured direct GPU→GPU edge between hosts
    wins. Memory ``O(H·G² + measured edges)``. Of a cluster whose graph is not built, the
    same figures from its :attr:`~topology.cluster.Cluster.measured_links` (an imputed
    host pair is no stored edge but the one figure every such pair has).
    """

    def __init__(self, cluster):
        H, G = cluster.num_nodes, cluster.gpus_per_node
        self.gpus_per_node = G
        self.num_gpus = H * G
        self.host_domain = cluster.host_domain
        bi, li = cluster.nominal_link(True)
        # read-only views of one number until a figure differs (:meth:`_writable`)
        self.intra_bw = np.broadcast_to(np.float64(bi), (H, G, G))
        self.intra_lat = np.broadcast_to(np.float64(li), (H, G, G))
        e = nominal_edges(cluster.spec) if all(k in cluster.spec for k in SPEC_KEYS) else None
        shape = (H, G)
        if e is not None:
            hop_bw, hop_lat = e["inter"]["bandwidth_Bps"], e["inter"]["latency_s"]
            sw_bw, sw_lat = e["intra"]["bandwidth_Bps"], e["intra"]["latency_s"]
        else:
            hop_bw = hop_lat = sw_bw = sw_lat = np.nan
        # four edge kinds of the inter-domain path: gpu→nic, nic→fabric, fabric→nic,
        # nic→gpu; two of the path between hosts of one domain: gpu→switch, switch→gpu
        def const(x):
            return np.broadcast_to(np.float64(x), shape)
        self.edge_bw = {k: const(hop_bw) for k in ("gn", "nf", "fn", "ng")}
        self.edge_lat = {k: const(hop_lat) for k in ("gn", "nf", "fn", "ng")}
        for k in ("gs", "sg"):
            self.edge_bw[k], self.edge_lat[k] = const(sw_bw), const(sw_lat)
        # measured host→host edges, sparse: sorted keys ha·H + hb and their figures
        self.host_keys = np.zeros(0, dtype=np.int64)
        self.host_bw = np.zeros(0)
        self.host_lat = np.zeros(0)
        self.num_hosts = H
        self.overrides: dict[int, tuple[float, float]] = {}   # a*n+b -> figures
        #: (bandwidth_Bps, latency_s) of an imputed host pair, the hosts that take it
        #: (``[H]`` bool) and the sorted keys ``ha·H + hb`` of host pairs with a NIC→NIC
        #: edge, which do not (:class:`topology.measured_links.MeasuredLinks`)
        self.imputed: tuple[float, float] | None = None
        self.imputed_hosts = np.zeros(H, dtype=bool)
        self.nic_pair_keys = np.zeros(0, dtype=np.int64)
        facts = cluster.graph_facts()
        if facts is not None and cluster.measured_links is not None:
            self._lay_measured(cluster, cluster.measured_links)
        elif facts is not None:
            self._read_graph(cluster, facts)
        self._find_constants()

    def _find_constants(self) -> None:
        """The arrays whose every entry is one number (what :meth:`links` need not index):
        ``_const[name] = (bandwidth_Bps, latency_s)`` or None."""
        def one(bw, lat):
            b, l = bw.reshape(-1), lat.reshape(-1)
            if b.size and np.all(b == b[0]) and np.all(l == l[0]):
                return float(b[0]), float(l[0])
            return None
        self._const = {k: one(self.edge_bw[k], self.edge_lat[k]) for k in self.edge_bw}
        self._const["intra"] = one(self.intra_bw, self.intra_lat)
        G = self.gpus_per_node
        self._shift = G.bit_length() - 1 if G & (G - 1) == 0 else None

    @property
    def host_level(self) -> bool:
        """Whether a link's figures depend on its two hosts alone: one figure for every GPU
        pair inside a host, every GPU↔switch, GPU↔NIC and NIC↔fabric edge alike, and no
        NIC→NIC or GPU→GPU edge between hosts (host→host edges may differ)."""
        return all(c is not None for c in self._const.values()) and not self.overrides

    @property
    def intra_figures(self) -> tuple[float, float]:
        """(bandwidth_Bps, latency_s) of every GPU pair inside a host, where they are alike
        (:attr:`host_level`)."""
        return self._const["intra"]

    def _edge(self, key: str, h: np.ndarray, l: np.ndarray) -> tuple:
        """Edge ``key``'s figures at hosts ``h``, local GPUs ``l`` (scalars when all alike)."""
        c = self._const[key]
        return c if c is not None else (self.edge_bw[key][h, l], self.edge_lat[key][h, l])

    def _split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(host, local index) of GPU indices ``x``."""
        if self._shift is not None:
            return x >> self._shift, x & (self.gpus_per_node - 1)
        return np.divmod(x, self.gpus_per_node)

    def _writable(self) -> None:
        """Every figure array its own memory (they start as views of one number)."""
        self.intra_bw, self.intra_lat = self.intra_bw.copy(), self.intra_lat.copy()
        for d in (self.edge_bw, self.edge_lat):
            for k in d:
                d[k] = d[k].copy()

    def _read_graph(self, cluster, facts) -> None:
        """The figures off a built graph (hosts with special links looked up one by one)."""
        H, G = self.num_hosts, self.gpus_per_node
        self._writable()
        g = cluster.graph
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
                    d = cluster.edge(u, w)
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
        self._set_host_edges(host_edges)

    def _set_host_edges(self, host_edges: dict[int, tuple[float, float]]) -> None:
        if host_edges:
            keys = sorted(host_edges)
            self.host_keys = np.array(keys, dtype=np.int64)
            self.host_bw = np.array([host_edges[k][0] for k in keys])
            self.host_lat = np.array([host_edges[k][1] for k in keys])

    def _lay_measured(self, cluster, m) -> None:
        """The figures of a cluster whose graph is not built: nominal arrays (set above)
        with ``m``'s measured edges laid over them, as :meth:`__init__` reads them off a
        built graph (a GPU→GPU edge inside a host sets that pair; host→host edges are
        the sparse host edges; NIC→NIC and GPU→GPU edges between hosts are overrides)."""
        H, G, n = self.num_hosts, self.gpus_per_node, self.num_gpus
        host_edges = {}
        if any(kind == "gpu" for kind, *_ in m.ends.values()):
            self._writable()
        for key, (kind, a, lu, b, lw) in m.ends.items():
            e = m.edges[key]
            if kind == "host":
                host_edges[a * H + b] = (e["bandwidth_Bps"], e["latency_s"])
            elif kind == "gpu" and a == b:
                self.intra_bw[a, lu, lw], self.intra_lat[a, lu, lw] = (e["bandwidth_Bps"],
                                                                       e["latency_s"])
            elif a != b:
                self.overrides[(a * G + lu) * n + b * G + lw] = None
        self.overrides = {k: cluster.link(k // n, k % n) for k in self.overrides}
        self._set_host_edges(host_edges)
        if m.imputed is not None:
            self.imputed = (m.imputed["bandwidth_Bps"], m.imputed["latency_s"])
            self.imputed_hosts = m.imputed_hosts.copy()
            self.nic_pair_keys = np.array(sorted(a * H + b for a, b in m.nic_pairs),
                                          dtype=np.int64)

    def _imputed_pairs(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """Whether each host pair ``(A[i], B[i])`` without a host edge takes the imputed
        figure: both hosts imputed, two hosts, no NIC→NIC edge between them."""
        out = self.imputed_hosts[A] & self.imputed_hosts[B] & (A != B)
        if self.nic_pair_keys.size and out.any():
            out &= ~np.isin(A * self.num_hosts + B, self.nic_pair_keys)
        return out

    def host_bandwidth_medians(self, hosts) -> dict[int, float | None]:
        """Per host index of ``hosts``: the median bandwidth (B/s) of the host→host edges
        out of it and into it, measured and imputed (each imputed pair counted as the edge
        it stands for), or None where it has none."""
        H = self.num_hosts
        src, dst = np.divmod(self.host_keys, H)
        ends = np.concatenate([src, dst])
        vals = np.concatenate([self.host_bw, self.host_bw])
        order = np.argsort(ends, kind="stable")
        ends, vals = ends[order], vals[order]
        starts = np.searchsorted(ends, np.arange(H + 1))
        copies = np.zeros(H, dtype=np.int64)
        if self.imputed is not None:
            imp = self.imputed_hosts
            m = int(imp.sum())
            # pairs that do not take the imputed figure: a host edge or a NIC→NIC edge
            taken = np.union1d(self.host_keys, self.nic_pair_keys)
            ta, tb = np.divmod(taken, H)
            keep = imp[ta] & imp[tb] & (ta != tb)
            ta, tb = ta[keep], tb[keep]
            out_n = (m - 1) - np.bincount(ta, minlength=H)
            in_n = (m - 1) - np.bincount(tb, minlength=H)
            copies = np.where(imp, out_n + in_n, 0)
        out: dict[int, float | None] = {}
        for h in hosts:
            seg = np.sort(vals[starts[h]:starts[h + 1]])
            out[h] = _median_with_copies(seg, self.imputed[0] if copies[h] else 0.0,
                                         int(copies[h]))
        return out

    def _host_edge(self, A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Measured host→host figures of the pairs ``(A[i], B[i])``, NaN where none."""
        bw = np.full(A.shape, np.nan)
        lat = np.full(A.shape, np.nan)
        if self.host_keys.size:
            keys = A * self.num_hosts + B
            pos = np.minimum(np.searchsorted(self.host_keys, keys), self.host_keys.size - 1)
            hit = self.host_keys[pos] == keys
            bw[hit], lat[hit] = self.host_bw[pos[hit]], self.host_lat[pos[hit]]
        if self.imputed is not None:
            imp = np.isnan(bw)
            imp[imp] = self._imputed_pairs(A[imp], B[imp])
            bw[imp], lat[imp] = self.imputed
        return bw, lat

    def links(self, a, b) -> tuple[np.ndarray, np.ndarray]:
        """(bandwidth_Bps, latency_s) arrays of the transfers ``a[i] → b[i]`` (GPU index
        arrays, host-major), as :meth:`topology.cluster.Cluster.link` gives them. Where a
        link depends on its two hosts alone (:attr:`host_level`), a run of consecutive pairs
        between the same two hosts (the ranks of one host sending to the next host) is
        looked up once."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        ha, la = self._split(a)
        hb, lb = self._split(b)
        if self.host_level and a.ndim == 1 and a.size > 64:
            start = np.empty(a.size, dtype=bool)
            start[0] = True
            np.not_equal(ha[1:], ha[:-1], out=start[1:])
            start[1:] |= hb[1:] != hb[:-1]
            reps = np.flatnonzero(start)
            if reps.size * 2 < a.size:
                bw, lat = self._links(ha[reps], la[reps], hb[reps], lb[reps], a[reps], b[reps])
                run = np.cumsum(start) - 1
                return bw[run], lat[run]
        return self._links(ha, la, hb, lb, a, b)

    def _links(self, ha, la, hb, lb, a, b) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`links` of the pairs ``a → b`` split into hosts and local indices."""
        c = self._const["intra"]
        if c is not None:
            bw, lat = np.full(a.shape, c[0]), np.full(a.shape, c[1])
        else:
            bw, lat = self.intra_bw[ha, la, lb], self.intra_lat[ha, la, lb]
        cross = np.flatnonzero(ha != hb)
        one_domain = self.host_domain[ha[cross]] == self.host_domain[hb[cross]]
        y = cross[one_domain]            # two hosts of one NVLink domain: via its switch
        if y.size:
            A, LA, B, LB = ha[y], la[y], hb[y], lb[y]
            (b1, l1), (b2, l2) = self._edge("gs", A, LA), self._edge("sg", B, LB)
            bw[y], lat[y] = np.minimum(b1, b2), l1 + l2
        x = cross[~one_domain]           # two domains: over the network
        if x.size:
            A, LA, B, LB = ha[x], la[x], hb[x], lb[x]
            hbw, hlat = self._host_edge(A, B)
            (b1, l1), (b2, l2) = self._edge("nf", A, LA), self._edge("fn", B, LB)
            fab_bw, fab_lat = np.minimum(b1, b2), l1 + l2
            has = ~np.isnan(hbw)
            mid_bw, mid_lat = np.where(has, hbw, fab_bw), np.where(has, hlat, fab_lat)
            (b1, l1), (b2, l2) = self._edge("gn", A, LA), self._edge("ng", B, LB)
            bw[x] = np.minimum(np.minimum(b1, mid_bw), b2)
            lat[x] = l1 + mid_lat + l2
        if self.overrides and cross.size:
            keys = a[cross] * self.num_gpus + b[cross]
            hit = np.flatnonzero(np.isin(keys, np.fromiter(self.overrides, np.int64)))
            for i in hit.tolist():
                bw[cross[i]], lat[cross[i]] = self.overrides[int(keys[i])]
        return bw, lat


def _median_with_copies(values: np.ndarray, v: float, k: int) -> float | None:
    """``statistics.median`` of the sorted ``values`` with ``k`` copies of ``v`` added, without
    making the list; None when both are empty."""
    n = values.size + k
    if n == 0:
        return None
    i = int(np.searchsorted(values, v)) if k else values.size

    def at(p: int) -> float:
        return float(values[p]) if p < i else (v if p < i + k else float(values[p - k]))

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2
