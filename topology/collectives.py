"""α–β times of NCCL-style ring collectives and point-to-point transfers.

Bytes in bytes, bandwidths in bytes/s (the ring's *bus* bandwidth, i.e. the slowest link's
attained rate), latencies in seconds per step. All functions broadcast over numpy arrays.

Ring algorithm costs (Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective
Communication Operations in MPICH", §4; the same bus-bandwidth factors nccl-tests reports,
NVIDIA/nccl-tests doc/PERFORMANCE.md): all-reduce moves ``2(n-1)/n·S`` per GPU in ``2(n-1)``
steps; all-gather and reduce-scatter ``(n-1)/n·S`` in ``n-1`` steps, where ``S`` is the full
(gathered / unreduced) buffer size.
"""

from __future__ import annotations

import numpy as np


def all_reduce_time_s(size_bytes, n, busbw_Bps, latency_s):
    """Ring all-reduce of ``size_bytes`` over ``n`` GPUs; 0 where ``n == 1``."""
    n = np.asarray(n, dtype=float)
    t = 2 * (n - 1) * latency_s + 2 * (n - 1) / n * size_bytes / busbw_Bps
    return np.where(n > 1, t, 0.0)


def all_gather_time_s(size_bytes, n, busbw_Bps, latency_s):
    """Ring all-gather (or reduce-scatter) whose gathered buffer is ``size_bytes``."""
    n = np.asarray(n, dtype=float)
    t = (n - 1) * latency_s + (n - 1) / n * size_bytes / busbw_Bps
    return np.where(n > 1, t, 0.0)


reduce_scatter_time_s = all_gather_time_s


def p2p_time_s(size_bytes, bandwidth_Bps, latency_s):
    """One send/recv of ``size_bytes`` over a link of ``bandwidth_Bps``."""
    return latency_s + np.asarray(size_bytes, dtype=float) / bandwidth_Bps


def all_to_all_time_s(size_bytes, n, on_node, intra_bw_Bps, intra_lat_s, inter_bw_Bps,
                      inter_lat_s):
    """All-to-all of ``size_bytes`` per GPU (``size_bytes/n`` to each of ``n`` peers) in a
    group with ``on_node`` members per NVLink domain (a host, or an NVL72 rack):
    ``(on_node-1)/n`` of the buffer crosses NVLink and ``(n-on_node)/n`` the network,
    concurrently (a GPU's NVLink and its NIC are separate ports); one latency of the slower
    path (NCCL runs the sends and receives as one grouped call). 0 where ``n == 1``."""
    n, g = np.asarray(n, dtype=float), np.asarray(on_node, dtype=float)
    intra = (g - 1) / n * size_bytes / intra_bw_Bps
    inter = (n - g) / n * size_bytes / inter_bw_Bps
    lat = np.where(n > g, inter_lat_s, intra_lat_s)
    return np.where(n > 1, lat + np.maximum(intra, inter), 0.0)


#: NCCL's latency model for a small all-reduce on its tree algorithm with the LL protocol
#: (NVIDIA/nccl v2.27.7 src/graph/tuning.cc: ``baseLat`` Tree/LL 6.8 us, ``hwLat`` NVLink
#: Tree/LL 0.6 us and network Tree/LL 5.0 us per hop; the tree all-reduce's latency
#: ``baseLat + 2·((ppn - 1)·intraLat + log2(nodes)·interLat)``), what NCCL picks for
#: messages of a few kilobytes at any scale.
NCCL_TREE_LL_BASE_S, NCCL_TREE_LL_NVLINK_S, NCCL_TREE_LL_NET_S = 6.8e-6, 0.6e-6, 5.0e-6


def small_all_reduce_s(ranks, ranks_per_node):
    """Seconds of an all-reduce of a few kilobytes over ``ranks`` GPUs,
    ``ranks_per_node`` of them per host (NCCL's tree/LL latency model,
    :data:`NCCL_TREE_LL_BASE_S`); 0 for one rank. Broadcasts."""
    n = np.asarray(ranks, dtype=float)
    ppn = np.minimum(np.asarray(ranks_per_node, dtype=float), n)
    nodes = np.maximum(n / np.maximum(ppn, 1.0), 1.0)
    t = NCCL_TREE_LL_BASE_S + 2 * ((ppn - 1) * NCCL_TREE_LL_NVLINK_S
                                   + np.floor(np.log2(nodes)) * NCCL_TREE_LL_NET_S)
    return np.where(n > 1, t, 0.0)
