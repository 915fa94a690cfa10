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

from configurator.core.candidates import Candidates
from topology.placement import group_shape


def comm_figures(cluster, c: Candidates) -> dict[str, np.ndarray]:
    """Worst ring bus bandwidth (B/s) and latency (s) of each plan's tp, cp, dp·cp groups and
    pipeline neighbours on ``cluster``, the groups laid out by Megatron's rank order
    (:func:`topology.placement.group_shape`) and placed on GPUs by ``cluster.placement``.
    Returns arrays (one value per plan) keyed ``{tp,cp,dp,pp}_{bw,lat}``."""
    world = int(c.tp[0] * c.pp[0] * c.dp[0] * c.cp[0])
    if c.group is not None:
        uniq, inv = c.group_keys, c.group
    else:
        keys = np.stack([c.tp, c.cp, c.dp, c.pp], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
    table = np.empty((len(uniq), 8))
    for i, (tp, cp, dp, pp) in enumerate(uniq.tolist()):
        sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        # the cluster caches each (stride, size, world): layouts share most group shapes
        table[i, 0:2] = cluster.group_busbw(*group_shape(("tp",), sizes), world)
        table[i, 2:4] = cluster.group_busbw(*group_shape(("cp",), sizes), world)
        table[i, 4:6] = cluster.group_busbw(*group_shape(("cp", "ep", "dp"), sizes), world)
        table[i, 6:8] = cluster.p2p_worst(*group_shape(("pp",), sizes), world)
    names = ("tp_bw", "tp_lat", "cp_bw", "cp_lat", "dp_bw", "dp_lat", "pp_bw", "pp_lat")
    return {n: table[inv, j] for j, n in enumerate(names)}
