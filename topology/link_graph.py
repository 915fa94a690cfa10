"""The per-GPU link graph of a homogeneous cluster: its nodes, its two kinds of nominal edge
and the facts one pass over a built graph gives (:class:`GraphFacts`).

Nodes: ``"<host>/gpu<k>"`` (kind ``gpu``), the NVLink switch of each NVLink domain
(``switch``: ``"<host>/nvswitch"`` where a domain is one host, ``"domain<d>/nvswitch"`` where
it spans several), ``"<host>/nic<k>"`` (``nic``, one rail per GPU as on DGX systems) and
``"fabric"``.
Edges are directional and carry ``bandwidth_Bps`` (what a transfer attains, bytes/s),
``nominal_bandwidth_Bps``, ``latency_s`` and ``link_class``. Measured links (a later import)
are added as direct edges ``gpu→gpu``, ``nic→nic`` (same rail, two hosts) or ``host→host``
(applies to every rail) with ``measured=True``; they take precedence over the nominal path
(:meth:`topology.cluster.Cluster.link`). Until the graph is built they are kept apart,
sparse (:class:`topology.measured_links.MeasuredLinks`), with the same precedence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

import numpy as np

if TYPE_CHECKING:
    import networkx as nx

#: Edge roles of :func:`build_graph`'s graph, by the kinds of their end nodes, and which of
#: the two nominal edges (``intra`` NVLink, ``inter`` network) each carries.
EDGE_ROLES = {("gpu", "switch"): "intra", ("switch", "gpu"): "intra", ("gpu", "nic"): "inter",
              ("nic", "gpu"): "inter", ("nic", "fabric"): "inter", ("fabric", "nic"): "inter"}
#: The nominal figures a cluster is built from (:attr:`topology.cluster.Cluster.spec`:
#: bytes/s, seconds, fractions).
SPEC_KEYS = ("intra_bandwidth_Bps", "inter_bandwidth_Bps", "intra_latency_s",
             "inter_latency_s", "intra_efficiency", "inter_efficiency")


def nominal_edges(spec: Mapping[str, float]) -> dict[str, dict]:
    """The attributes of the graph's two kinds of edge (``intra``: GPU↔NVLink switch,
    ``inter``: GPU↔NIC↔fabric) from the nominal ``spec`` (:data:`SPEC_KEYS`): attained
    bandwidth = nominal × efficiency; a path's latency split evenly over its hops."""
    return {"intra": dict(bandwidth_Bps=spec["intra_bandwidth_Bps"] * spec["intra_efficiency"],
                          nominal_bandwidth_Bps=spec["intra_bandwidth_Bps"],
                          latency_s=spec["intra_latency_s"] / 2, link_class="nvlink",
                          measured=False),
            "inter": dict(bandwidth_Bps=spec["inter_bandwidth_Bps"] * spec["inter_efficiency"],
                          nominal_bandwidth_Bps=spec["inter_bandwidth_Bps"],
                          latency_s=spec["inter_latency_s"] / 4, link_class="network",
                          measured=False)}


def path_value(path: Iterable[Mapping]) -> tuple[float, float]:
    """(bandwidth, latency) of a path of edges: its slowest edge, its summed latency."""
    path = list(path)
    return min(p["bandwidth_Bps"] for p in path), sum(p["latency_s"] for p in path)


def switch_name(hosts: list[str], host_domain, h: int, one_host_domains: bool) -> str:
    """Graph node of the NVLink switch that host index ``h`` hangs off (module docstring)."""
    return f"{hosts[h]}/nvswitch" if one_host_domains else f"domain{host_domain[h]}/nvswitch"


def build_graph(hosts: list[str], gpus_per_node: int, spec: Mapping[str, float],
                host_domain, one_host_domains: bool) -> nx.DiGraph:
    """The per-GPU link graph of a homogeneous cluster (see
    :func:`topology.cluster.build_cluster`); host ``h`` belongs to NVLink domain
    ``host_domain[h]``."""
    import networkx as nx   # here, not at import: most runs never build a graph

    e = nominal_edges(spec)
    intra, inter = e["intra"], e["inter"]
    g = nx.DiGraph()
    g.add_node("fabric", kind="fabric")
    for h, host in enumerate(hosts):
        sw = switch_name(hosts, host_domain, h, one_host_domains)
        g.add_node(host, kind="host")
        if one_host_domains:
            g.add_node(sw, kind="switch", host=host)
        elif sw in g:
            g.nodes[sw]["hosts"] += (host,)
        else:
            g.add_node(sw, kind="switch", domain=int(host_domain[h]), hosts=(host,))
        gids = [f"{host}/gpu{k}" for k in range(gpus_per_node)]
        nics = [f"{host}/nic{k}" for k in range(gpus_per_node)]
        g.add_nodes_from((gid, dict(kind="gpu", host=host, local_rank=k))
                         for k, gid in enumerate(gids))
        g.add_nodes_from((nic, dict(kind="nic", host=host, rail=k))
                         for k, nic in enumerate(nics))
        # add_edges_from copies the attribute dict into each edge's own dict
        for gid, nic in zip(gids, nics):
            g.add_edges_from(((gid, sw), (sw, gid)), **intra)
            g.add_edges_from(((gid, nic), (nic, gid), (nic, "fabric"), ("fabric", nic)),
                             **inter)
    return g


class GraphFacts:
    """One pass over the built graph of ``cluster`` (a :class:`topology.cluster.Cluster`): is
    it still uniform, has it measured edges, and which hosts have any link other than the
    nominal ones (``special``)."""

    __slots__ = ("measured", "uniform", "special", "all_special")

    def __init__(self, cluster):
        g = cluster.graph
        nodes = g.nodes
        ref = ({r: (e["bandwidth_Bps"], e["latency_s"])
                for r, e in nominal_edges(cluster.spec).items()}
               if all(k in cluster.spec for k in SPEC_KEYS) else {})
        host_index = {h: i for i, h in enumerate(cluster.hosts)}
        special = np.zeros(cluster.num_nodes, dtype=bool)
        values: dict[tuple, set] = {r: set() for r in EDGE_ROLES}
        measured = all_special = other = False
        role_edges = 0

        def host_of(x, kx):  # index into hosts, -1 for shared nodes, None if unknown
            if kx == "fabric" or (kx == "switch" and "domain" in nodes[x]):
                return -1        # the fabric, a domain's switch: its GPUs' hosts are marked
            return host_index.get(x if kx == "host" else nodes[x].get("host"))

        for u, nbrs in g.adjacency():
            ku = nodes[u].get("kind")
            hu = host_of(u, ku)
            for w, d in nbrs.items():
                if d.get("measured"):
                    measured = True
                kw = nodes[w].get("kind")
                role = EDGE_ROLES.get((ku, kw))
                val = (d.get("bandwidth_Bps"), d.get("latency_s"))
                if role is not None:
                    role_edges += 1
                    values[(ku, kw)].add(val)
                    if val == ref.get(role):
                        continue
                else:
                    other = True
                for h in (hu, host_of(w, kw)):
                    if h is None:
                        all_special = True
                    elif h >= 0:
                        special[h] = True
        complete = role_edges == 6 * cluster.num_gpus
        self.measured = measured
        self.uniform = (complete and not measured and not other
                        and all(len(v) <= 1 for v in values.values()))
        self.special = special
        self.all_special = all_special or not complete or not ref

    @classmethod
    def of_measured(cls, measured) -> "GraphFacts":
        """The same facts of a cluster whose graph is not built, from the measured edges laid
        over its nominal ones (a :class:`topology.measured_links.MeasuredLinks`): special are
        the hosts those edges (or an imputed pair) touch."""
        out = cls.__new__(cls)
        out.special = measured.touched_hosts()
        out.measured = measured.measured
        out.uniform = not measured.edges and measured.imputed is None
        out.all_special = False
        return out

