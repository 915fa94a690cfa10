"""Megatron's rank order and the map from global ranks to physical GPUs.

Rank order (Megatron-LM core_v0.16.1 ``megatron/core/parallel_state.py``, ``RankGenerator``
with the default ``order="tp-cp-ep-dp-pp"``; shared REFERENCE §1): a global rank is a
mixed-radix number whose fastest digit is the tensor-parallel rank, then context, expert,
data and pipeline rank. A group of one parallel dimension therefore holds ranks spaced by the
product of the sizes of the dimensions before it (its *stride*).

Physical placement: torchrun gives node ``node_rank`` the global ranks
``node_rank·G … node_rank·G + G - 1`` (``G`` GPUs per node), local rank ``k`` on device
``k``; :class:`Placement` is that map, rank ``r`` → (host index ``r // G``, local GPU
``r % G``), the one every plan uses today. It is the *identity* map of ranks onto host-major
GPU indices (:attr:`Placement.is_identity`); :class:`topology.cluster.Cluster`'s closed-form
link figures for uniform clusters rely on that and fall back to walking every group under
any other placement (:class:`MappedPlacement`). Choosing one (which hosts, which GPU order)
is the placement search, :mod:`configurator.search.placement_search`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

#: Megatron's default order, fastest-varying first.
RANK_ORDER = ("tp", "cp", "ep", "dp", "pp")


def group_stride(dim: str, sizes: Mapping[str, int]) -> int:
    """Distance between consecutive ranks of one ``dim`` group: the product of the sizes of
    the dimensions before ``dim`` in :data:`RANK_ORDER` (missing sizes count as 1)."""
    stride = 1
    for d in RANK_ORDER[:RANK_ORDER.index(dim)]:
        stride *= int(sizes.get(d, 1))
    return stride


def group_shape(dims: tuple[str, ...], sizes: Mapping[str, int]) -> tuple[int, int]:
    """``(stride, size)`` of the group spanning the adjacent dimensions ``dims`` (e.g.
    ``("cp", "dp")``: the data-parallel group with context parallelism, over which
    gradients are reduced). Raises ValueError if ``dims`` are not adjacent in the order."""
    idx = [RANK_ORDER.index(d) for d in dims]
    if idx != list(range(idx[0], idx[0] + len(idx))):
        raise ValueError(f"dimensions {dims} are not adjacent in {RANK_ORDER}")
    size = 1
    for d in dims:
        size *= int(sizes.get(d, 1))
    return group_stride(dims[0], sizes), size


def rank_groups(stride: int, size: int, world: int) -> Iterator[list[int]]:
    """Every group of ``size`` ranks spaced ``stride`` apart among ``world`` ranks, in rank
    order (the groups ``RankGenerator.get_ranks`` returns for one dimension)."""
    block = stride * size
    for start in range(0, world, block):
        for off in range(stride):
            yield [start + off + i * stride for i in range(size)]


@dataclass(frozen=True)
class Placement:
    """Global rank → (host index, local GPU index) on ``gpus_per_node``-GPU hosts: torchrun's
    default, rank ``r`` on host ``r // gpus_per_node``, GPU ``r % gpus_per_node``."""

    gpus_per_node: int

    def gpu_of_rank(self, rank: int) -> tuple[int, int]:
        return divmod(rank, self.gpus_per_node)

    def gpu_index(self, rank: int) -> int:
        """Host-major physical GPU index of ``rank`` (``host·G + local``)."""
        host, local = self.gpu_of_rank(rank)
        return host * self.gpus_per_node + local

    @property
    def is_identity(self) -> bool:
        """True when rank ``r`` runs on host-major GPU ``r`` (torchrun's default, this class
        exactly). A subclass (another map) reports False unless it overrides this, so code
        that assumes the identity (the uniform-cluster shortcuts) cannot silently apply."""
        return type(self) is Placement

    def gpu_indices(self, ranks: np.ndarray) -> np.ndarray:
        """:meth:`gpu_index` of every element of the integer array ``ranks`` (same shape)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if self.is_identity:
            host, local = np.divmod(ranks, self.gpus_per_node)
            return host * self.gpus_per_node + local
        flat = np.fromiter((self.gpu_index(int(r)) for r in ranks.ravel()), dtype=np.int64,
                           count=ranks.size)
        return flat.reshape(ranks.shape)


@dataclass(frozen=True)
class MappedPlacement(Placement):
    """Any node-granular placement: node rank ``n`` (global ranks ``n·G … n·G+G-1``) on host
    index ``node_hosts[n]``, its local rank ``k`` on GPU ``gpu_order[n][k]`` of that host
    (torchrun with a host → node_rank table and a per-node ``CUDA_VISIBLE_DEVICES``)."""

    node_hosts: tuple[int, ...] = ()
    gpu_order: tuple[tuple[int, ...], ...] = ()

    def gpu_of_rank(self, rank: int) -> tuple[int, int]:
        n, k = divmod(rank, self.gpus_per_node)
        return self.node_hosts[n], self.gpu_order[n][k]

    @property
    def is_identity(self) -> bool:
        G = self.gpus_per_node
        return (tuple(self.node_hosts) == tuple(range(len(self.node_hosts)))
                and all(tuple(o) == tuple(range(G)) for o in self.gpu_order))

    def gpu_indices(self, ranks: np.ndarray) -> np.ndarray:
        ranks = np.asarray(ranks, dtype=np.int64)
        n, k = np.divmod(ranks, self.gpus_per_node)
        nh = np.asarray(self.node_hosts, dtype=np.int64)
        go = np.asarray(self.gpu_order, dtype=np.int64).reshape(len(nh), self.gpus_per_node)
        return nh[n] * self.gpus_per_node + go[n, k]
