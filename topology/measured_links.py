"""The measured links of a cluster whose per-GPU link graph is not built
(:class:`MeasuredLinks`): the edges a topology adds (:func:`topology.topofile.apply_topology`)
kept sparse, next to the nominal figures every other edge has.

A measured topology of 16,384 hosts adds some 10⁵ edges to a graph of some 10⁶ nominal ones,
and gives every unmeasured pair of its hosts the median of the measured pairs (10⁸ pairs):
built out, that is gigabytes. Kept here, it is the measured edges and one imputed figure,
and :meth:`topology.cluster.Cluster.link` and :class:`topology.link_table.LinkTable` answer
exactly what the built graph would answer (``tests/test_measured_links.py`` compares them).
Asking :attr:`topology.cluster.Cluster.graph` still builds the graph, with every measured and
imputed edge in it.
"""

from __future__ import annotations

import statistics

import numpy as np

#: The three kinds of measured edge a topology adds (:mod:`topology.link_graph`): a direct
#: GPU→GPU edge (inside a host), a NIC→NIC edge (one rail, two hosts) and a host→host edge
#: (every rail of two hosts).
KINDS = ("gpu", "nic", "host")


class MeasuredLinks:
    """Measured edges over a cluster's nominal ones, sparse.

    ``hosts``: the cluster's host names (index = host index); ``gpus_per_node``: GPUs (and
    NIC rails) per host. Edges are added with :meth:`add` and looked up by their graph node
    names (:attr:`edges`); :attr:`imputed` (set by :meth:`impute_host_pairs`) is what an
    ordered pair of two :attr:`imputed_hosts` with no host→host and no NIC→NIC record gets.
    """

    def __init__(self, hosts: list[str], gpus_per_node: int):
        self.hosts = list(hosts)
        self.gpus_per_node = gpus_per_node
        self.host_index = {h: i for i, h in enumerate(self.hosts)}
        #: ``(u, w)`` graph node names → edge attributes (bandwidth_Bps, latency_s, …)
        self.edges: dict[tuple[str, str], dict] = {}
        #: ``(u, w)`` → (kind, host index of u, local index of u, host of w, local of w)
        self.ends: dict[tuple[str, str], tuple[str, int, int, int, int]] = {}
        #: attributes of an imputed host→host edge, or None
        self.imputed: dict | None = None
        #: ``[H]`` bool: the hosts whose unmeasured pairs get :attr:`imputed`
        self.imputed_hosts = np.zeros(len(self.hosts), dtype=bool)
        #: ordered host-index pairs with at least one NIC→NIC edge (no imputation there)
        self.nic_pairs: set[tuple[int, int]] = set()

    def add(self, kind: str, src: tuple[str, int | None], dst: tuple[str, int | None],
            **attrs) -> None:
        """Add (or replace) the measured edge ``src → dst`` of ``kind`` (:data:`KINDS`);
        ``src``/``dst`` are ``(host name, local index)`` (index None for ``host``)."""
        (hu, lu), (hw, lw) = src, dst
        if kind == "host":
            key, lu, lw = (hu, hw), -1, -1
        else:
            key = (f"{hu}/{kind}{lu}", f"{hw}/{kind}{lw}")
        a, b = self.host_index[hu], self.host_index[hw]
        self.edges[key] = dict(attrs)
        self.ends[key] = (kind, a, lu, b, lw)
        if kind == "nic":
            self.nic_pairs.add((a, b))

    def impute_host_pairs(self, hosts: list[str], nominal_bandwidth_Bps: float) -> None:
        """Every ordered pair of ``hosts`` with no host→host and no NIC→NIC record takes the
        median bandwidth and latency of the measured host→host edges among them (numpy's
        median: the mean of the two middle values for an even count), so an unmeasured pair
        is neither the fastest (nominal) nor the slowest link of the cluster. Nothing is
        imputed when no pair of ``hosts`` was measured host to host."""
        idx = [self.host_index[h] for h in hosts]
        mask = np.zeros(len(self.hosts), dtype=bool)
        mask[idx] = True
        known = [self.edges[k] for k, (kind, a, _, b, _) in self.ends.items()
                 if kind == "host" and a != b and mask[a] and mask[b]
                 and self.edges[k].get("measured")]
        if not known:
            return
        self.imputed = dict(bandwidth_Bps=statistics.median(e["bandwidth_Bps"] for e in known),
                            nominal_bandwidth_Bps=nominal_bandwidth_Bps,
                            latency_s=statistics.median(e["latency_s"] for e in known),
                            link_class="network", measured=True, imputed=True,
                            method="imputed: median of measured host pairs")
        self.imputed_hosts = mask

    def host_edge(self, a: int, b: int) -> dict | None:
        """The host→host figures between host indices ``a`` and ``b``: the measured edge, the
        imputed one, or None."""
        e = self.edges.get((self.hosts[a], self.hosts[b]))
        if e is not None:
            return e
        if (self.imputed is not None and a != b and self.imputed_hosts[a]
                and self.imputed_hosts[b] and (a, b) not in self.nic_pairs):
            return self.imputed
        return None

    @property
    def measured(self) -> bool:
        """Whether any edge is a measurement (or imputed from them)."""
        return self.imputed is not None or any(e.get("measured") for e in self.edges.values())

    def touched_hosts(self) -> np.ndarray:
        """``[H]`` bool: the hosts with a link other than the nominal ones."""
        out = self.imputed_hosts.copy() if self.imputed is not None else np.zeros(
            len(self.hosts), dtype=bool)
        for _, a, _, b, _ in self.ends.values():
            out[a] = out[b] = True
        return out

    def subset(self, idx: list[int]) -> "MeasuredLinks":
        """The edges among the hosts ``idx`` (renumbered in that order) and the imputed
        figure for those of them that had it."""
        names = [self.hosts[i] for i in idx]
        out = MeasuredLinks(names, self.gpus_per_node)
        keep = set(idx)
        for key, (kind, a, lu, b, lw) in self.ends.items():
            if a in keep and b in keep:
                out.add(kind, (self.hosts[a], None if kind == "host" else lu),
                        (self.hosts[b], None if kind == "host" else lw), **self.edges[key])
        if self.imputed is not None:
            out.imputed = dict(self.imputed)
            out.imputed_hosts = self.imputed_hosts[np.asarray(idx, dtype=np.int64)] if idx \
                else np.zeros(0, dtype=bool)
        return out

    def graph_edges(self):
        """Every edge as ``(u, w, attrs)`` for a built graph: the measured ones, then one
        imputed edge per pair that takes it (``O(H²)``: only for small clusters)."""
        for key, attrs in self.edges.items():
            yield key[0], key[1], attrs
        if self.imputed is None:
            return
        hs = np.flatnonzero(self.imputed_hosts).tolist()
        for a in hs:
            for b in hs:
                if a != b and (self.hosts[a], self.hosts[b]) not in self.edges \
                        and (a, b) not in self.nic_pairs:
                    yield self.hosts[a], self.hosts[b], self.imputed
