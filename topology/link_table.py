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
    wins. Memory ``O(H·G² + measured edges)``.
    """

    def __init__(self, cluster):
        H, G = cluster.num_nodes, cluster.gpus_per_node
        self.gpus_per_node = G
        self.num_gpus = H * G
        self.host_domain = cluster.host_domain
        bi, li = cluster.nominal_link(True)
        self.intra_bw = np.full((H, G, G), bi)
        self.intra_lat = np.full((H, G, G), li)
        e = nominal_edges(cluster.spec) if all(k in cluster.spec for k in SPEC_KEYS) else None
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
        facts = cluster.graph_facts()
        if facts is None:
            return
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
        arrays, host-major), as :meth:`topology.cluster.Cluster.link` gives them."""
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

