"""Where each plan's collectives run: the bus bandwidth and latency of its groups' links.

The collective formulas themselves (ring all-reduce, all-gather, reduce-scatter, p2p) are in
:mod:`topology.collectives`; this module picks, for every plan, the groups its ranks form
(tensor, context, data·context parallel, pipeline neighbours) and asks the cluster for
their slowest hop (:meth:`topology.cluster.Cluster.group_busbw`, ``p2p_worst``: from the
groups' shape on a uniform cluster, so the cost does not grow with the GPU count; hop by hop
where links were measured). Each distinct group shape is asked once.
"""

from __future__ import annotations

import numpy as np

from configurator.core.plan_batch import GROUP_KEY_FIELDS, PlanBatch
from topology.rank_order import group_shape


def comm_figures(cluster, c: PlanBatch) -> dict[str, np.ndarray]:
    """Worst ring bus bandwidth (B/s) and latency (s) of each plan's tp, cp, dp·cp groups and
    pipeline neighbours on ``cluster``, the groups laid out by Megatron's rank order
    (:func:`topology.rank_order.group_shape`) and placed on GPUs by ``cluster.placement``.
    Returns arrays (one value per plan) keyed ``{tp,cp,dp,pp}_{bw,lat}``, the pipeline's
    ``pp_{path,ring,end}_{bw,lat}`` (:func:`pipeline_figures`) and the context-parallel
    ring's single-send figures ``cp_hop_{bw,lat}`` and ``cp_on_node``: :data:`NAMES`.

    Ring bus bandwidths never exceed what the group's cut through the topology carries: a
    ring that leaves an NVLink domain runs one rail per member the domain holds, each
    through that member's own NIC (every group of the shape runs at once, and each GPU has
    one NIC), so a domain-to-domain hop carries at most ``k × NIC rate × efficiency``;
    point-to-point rings (``cp_hop``) get one link per send, no rails added
    (``tests/test_collective_bandwidth.py`` checks every figure against the cut)."""
    return gather_figures([comm_table(cluster, c)])


def gather_figures(tables, rows=slice(None)) -> dict[str, np.ndarray]:
    """Each plan's figures from ``tables`` (:func:`comm_table`, :func:`expert_comm_table`),
    for the plans ``rows`` (a slice of those the tables were made for), keyed by name."""
    out = {}
    for names, table, inv in tables:
        at = inv[rows]
        out.update({n: table[at, j] for j, n in enumerate(names)})
    return out


def comm_table(cluster, c: PlanBatch) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """:func:`comm_figures` before it is gathered per plan: ``(NAMES, table, inverse)``, one
    table row per distinct ``(tp, cp, dp, pp)`` layout and each plan's row."""
    world = int(c.tp[0] * c.pp[0] * c.dp[0] * c.cp[0])
    if c.group is not None:
        uniq, inv = c.group_keys, c.group
    else:
        keys = np.stack([getattr(c, n) for n in GROUP_KEY_FIELDS], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
    table = np.empty((len(uniq), len(NAMES)))
    pipelines: dict[tuple[int, int], tuple] = {}    # (stride, size) -> the pipeline's figures
    cp_rings: dict[tuple[int, int], tuple] = {}     # (stride, size) -> cp_hop_*, cp_on_node
    for i, row in enumerate(uniq.tolist()):
        sizes = dict(zip(GROUP_KEY_FIELDS, row))
        # the cluster caches each (stride, size, world): layouts share most group shapes
        table[i, 0:2] = cluster.group_busbw(*group_shape(("tp",), sizes), world)
        table[i, 2:4] = cluster.group_busbw(*group_shape(("cp",), sizes), world)
        table[i, 4:6] = cluster.group_busbw(*group_shape(("cp", "ep", "dp"), sizes), world)
        pipe = group_shape(("pp",), sizes)
        table[i, 6:8] = cluster.p2p_worst(*pipe, world)
        if pipe not in pipelines:   # the pipeline group's shape is set by pp alone
            pipelines[pipe] = pipeline_figures(cluster, *pipe, world)
        table[i, 8:14] = pipelines[pipe]
        cp = group_shape(("cp",), sizes)
        if cp not in cp_rings:     # set by tp and cp alone
            cp_rings[cp] = (*cluster.ring_hop_worst(*cp, world),
                            cluster.members_per_domain(*cp, world))
        table[i, 14:17] = cp_rings[cp]
    return NAMES, table, np.asarray(inv).reshape(-1)


#: Keys of :func:`comm_figures`: the worst figures of each group kind, then the pipeline's
#: path, ring and end-boundary figures (:func:`pipeline_figures`); then the context-parallel
#: ring's worst single send (``cp_hop``: :meth:`~topology.group_figures.GroupFigures.ring_hop_worst`,
#: what its p2p K/V exchange and the network share of its all-to-all run at) and its members
#: per NVLink domain (``cp_on_node``).
NAMES = ("tp_bw", "tp_lat", "cp_bw", "cp_lat", "dp_bw", "dp_lat", "pp_bw", "pp_lat",
         "pp_path_bw", "pp_path_lat", "pp_ring_bw", "pp_ring_lat", "pp_end_bw", "pp_end_lat",
         "cp_hop_bw", "cp_hop_lat", "cp_on_node")


def pipeline_figures(cluster, stride: int, size: int, world: int) -> tuple[float, ...]:
    """The pipeline's boundaries (:meth:`topology.cluster.Cluster.p2p_boundaries`) as the
    schedule meets them, ``(bw B/s, lat s)`` three times:

    * *path*: the ``size - 1`` boundaries forward and back (1F1B's fill and drain cross each
      once each way): harmonic-mean bandwidth and mean latency, so that ``n`` hops of
      ``x`` bytes cost ``n·(lat + x/bw)``, the sum of the hops' own times;
    * *ring*: the same over all ``size`` boundaries with the wrap-around ``size-1 → 0``
      (interleaved schedules go round it);
    * *end*: the slower of the first and the last boundary, both directions (1F1B's
      steady state is paced by an end stage, which sends over one of them).

    A single stage has no boundary: infinite bandwidth, zero latency."""
    if size < 2:
        return (float("inf"), 0.0) * 3
    fb, fl, bb, bl = cluster.p2p_boundaries(stride, size, world)

    def mean_hop(bw, lat):
        return float(len(bw) / np.sum(1.0 / bw)), float(np.mean(lat))

    path = mean_hop(np.concatenate((fb[:-1], bb[:-1])), np.concatenate((fl[:-1], bl[:-1])))
    ring = mean_hop(np.concatenate((fb, bb)), np.concatenate((fl, bl)))
    ends = [0, size - 2]
    end = (float(min(fb[ends].min(), bb[ends].min())), float(max(fl[ends].max(),
                                                                 bl[ends].max())))
    return path + ring + end


#: Keys of :func:`expert_comm_figures`.
EXPERT_NAMES = ("ep_on_node", "ep_intra_bw", "ep_intra_lat", "ep_inter_bw", "ep_inter_lat",
                "etp_bw", "etp_lat", "edp_bw", "edp_lat", "gpus_per_node")


def expert_comm_figures(cluster, c: PlanBatch) -> dict[str, np.ndarray]:
    """Figures of each plan's expert groups, laid out by Megatron's expert grid
    (``etp-ep-edp-pp``, megatron/core/parallel_state.py): the EP group (stride ``etp``,
    size ``ep``) as members per NVLink domain and NVLink / network (bandwidth B/s, latency s) for
    its all-to-all; the ETP and expert-data-parallel (stride ``etp·ep``) rings' bus
    bandwidth and latency; the GPUs per host. Arrays keyed :data:`EXPERT_NAMES`; dense plans
    get (1, inf, 0…)."""
    return gather_figures([expert_comm_table(cluster, c)])


def expert_comm_table(cluster, c: PlanBatch) -> tuple[tuple[str, ...], np.ndarray,
                                                        np.ndarray]:
    """:func:`expert_comm_figures` before it is gathered per plan: ``(EXPERT_NAMES, table,
    inverse)``, one table row per distinct ``(ep, etp, pp)`` and each plan's row."""
    world = int(c.tp[0] * c.pp[0] * c.dp[0] * c.cp[0]) if len(c) else 1
    ep, etp, pp = (np.asarray(x, dtype=np.int64) for x in (c.ep, c.etp, c.pp))
    # one int64 key per plan (ep < 2^17, etp < 2^19, pp < 2^12): a fast 1-D unique
    _, first, inv = np.unique((ep << 31) | (etp << 12) | pp, return_index=True,
                              return_inverse=True)
    uniq = np.stack([ep[first], etp[first], pp[first]], axis=1)
    table = np.empty((len(uniq), len(EXPERT_NAMES)))
    G = cluster.nvlink_domain_gpus   # members per NVLink domain (a host, or an NVL72 rack)
    intra = cluster.link(0, 1) if G > 1 else (float("inf"), 0.0)
    inter = cluster.link(0, G) if cluster.num_gpus > G else intra
    for i, (ep, etp, pp) in enumerate(uniq.tolist()):
        edp = world // (ep * etp * pp)
        on_node = min(ep, max(G // etp, 1))
        table[i, 0] = on_node
        table[i, 1:3] = intra
        table[i, 3:5] = inter
        table[i, 5:7] = cluster.group_busbw(1, etp, world)
        table[i, 7:9] = cluster.group_busbw(etp * ep, edp, world)
        table[i, 9] = cluster.gpus_per_node
    return EXPERT_NAMES, table, np.asarray(inv).reshape(-1)
