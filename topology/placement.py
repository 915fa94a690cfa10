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
any other placement.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

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


# -- choosing a placement -------------------------------------------------------------------

@dataclass(frozen=True)
class PlacementChoice:
    """A placement found by :func:`search_placement`: ``node_hosts[n]`` the host index of
    node rank ``n``, ``gpu_order[n][k]`` the GPU index of local rank ``k`` there;
    ``objective`` its value (seconds when the objective is a time), ``evaluations`` how many
    distinct placements were priced, ``wall_time_s``, ``exhaustive`` whether every placement was."""

    node_hosts: tuple[int, ...]
    gpu_order: tuple[tuple[int, ...], ...]
    objective: float
    evaluations: int
    wall_time_s: float
    exhaustive: bool


def placement_count(num_hosts: int, num_nodes: int, gpus_per_node: int,
                    move_gpus: bool) -> int:
    """How many distinct placements there are: ordered choices of ``num_nodes`` of
    ``num_hosts`` hosts, times ``(G!)^num_nodes`` GPU orders when GPUs move."""
    n = math.perm(num_hosts, num_nodes)
    return n * math.factorial(gpus_per_node) ** num_nodes if move_gpus else n


def search_placement(objective: Callable[[np.ndarray, np.ndarray], float], *,
                     num_hosts: int, num_nodes: int, gpus_per_node: int,
                     host_preference: Sequence[int] | None = None, move_gpus: bool = True,
                     seed: int = 0, time_budget_s: float = 5.0, max_evaluations: int = 20_000,
                     exhaustive_limit: int = 20_000, patience: int = 30,
                     objective_many: Callable[[list], Sequence[float]] | None = None
                     ) -> PlacementChoice:
    """Minimise ``objective(node_hosts [N], gpu_order [N, G])`` over placements of
    ``num_nodes`` node ranks on ``num_hosts`` hosts of ``gpus_per_node`` GPUs.
    ``objective_many(list of (node_hosts, gpu_order))``, when given, prices several
    placements at once (the same values as ``objective``, e.g.
    :meth:`configurator.cost.placed.PlacedPlan.times`): the exhaustive pass and each
    neighbourhood scan then price in batches (of 1, 2, 4, … up to 64 moves within one
    scan), taking the first improving move in the same order as one at a time, so the
    search path is the same and only extra moves of the last batch are priced.

    Every placement is priced when there are at most ``exhaustive_limit``
    (:func:`placement_count`). Otherwise an iterated local search: start from the better of
    Megatron's sequential mapping on the first N hosts and the N hosts listed first in
    ``host_preference`` (e.g. healthiest first); moves are swapping two node ranks' hosts,
    replacing a node rank's host by an idle one, and (``move_gpus``) swapping two local
    ranks' GPUs; the first improving move is taken (moves in a seeded random order); at a
    local optimum the best placement is kicked by a few random swaps and the search goes on,
    until ``patience`` kicks in a row found nothing better, or ``max_evaluations``, or
    ``time_budget_s``. Deterministic for a ``seed`` when the
    evaluation budget, not the time, ends the search. Never worse than the sequential
    mapping (it is priced first). Raises ValueError for impossible sizes.
    """
    t0 = time.perf_counter()
    M, N, G = int(num_hosts), int(num_nodes), int(gpus_per_node)
    if not (1 <= N <= M) or G < 1:
        raise ValueError(f"cannot place {N} node ranks on {M} hosts of {G} GPUs")
    rng = np.random.default_rng(seed)
    ident = np.arange(G, dtype=np.int64)
    evals = 0

    seen: dict[int, float] = {}     # placements priced, by hash (64-bit: no collision in
                                    # any budget this search runs)

    def price(nh, go) -> float:
        return price_many([(nh, go)])[0]

    def price_many(cands: list) -> list[float]:
        """Values of ``cands`` (``(nh, go)`` pairs), new ones priced in one batch."""
        nonlocal evals
        keys = [hash(nh.tobytes() + go.tobytes()) for nh, go in cands]
        new = {}
        for key, c in zip(keys, cands):
            if key not in seen and key not in new:
                new[key] = c
        if new:
            if objective_many is None:
                vals = [float(objective(nh, go)) for nh, go in new.values()]
            else:
                vals = [float(x) for x in objective_many(list(new.values()))]
            seen.update(zip(new.keys(), vals))
            evals += len(new)
        return [seen[key] for key in keys]

    def done() -> bool:
        return evals >= max_evaluations or time.perf_counter() - t0 > time_budget_s

    def result(nh, go, val, exhaustive) -> PlacementChoice:
        return PlacementChoice(tuple(int(h) for h in nh), tuple(tuple(int(x) for x in row)
                                                                for row in go),
                               float(val), evals, time.perf_counter() - t0, exhaustive)

    if placement_count(M, N, G, move_gpus) <= exhaustive_limit:
        best = None
        gpu_perms = (list(itertools.permutations(range(G))) if move_gpus
                     else [tuple(range(G))])
        every = ((np.array(hosts, dtype=np.int64),
                  np.array(orders, dtype=np.int64) if move_gpus else np.tile(ident, (N, 1)))
                 for hosts in itertools.permutations(range(M), N)
                 for orders in itertools.product(gpu_perms, repeat=N if move_gpus else 1))
        while chunk := list(itertools.islice(every, 256)):
            for (nh, go), val in zip(chunk, price_many(chunk)):
                if best is None or val < best[2] - 1e-15:
                    best = (nh, go, val)
        return result(*best, True)

    go0 = np.tile(ident, (N, 1))
    nh0 = np.arange(N, dtype=np.int64)
    best = (nh0, go0, price(nh0, go0))
    if host_preference is not None:
        pref = np.array([int(h) for h in host_preference][:N], dtype=np.int64)
        if len(pref) == N and not np.array_equal(np.sort(pref), nh0):
            nh1 = np.sort(pref)
            val = price(nh1, go0)
            if val < best[2]:
                best = (nh1, go0, val)
    cur = [best[0].copy(), best[1].copy(), best[2]]
    best_seen = best[2]

    def moves(nh):
        out = [("swap", i, j) for i in range(N) for j in range(i + 1, N)]
        idle = sorted(set(range(M)) - set(nh.tolist()))
        out += [("idle", i, u) for i in range(N) for u in idle]
        if move_gpus and G > 1:
            out += [("gpu", n, (a, b)) for n in range(N) for a in range(G)
                    for b in range(a + 1, G)]
        return out

    def apply(nh, go, mv):
        nh, go = nh.copy(), go.copy()
        kind, i, j = mv
        if kind == "swap":
            nh[i], nh[j] = nh[j], nh[i]
        elif kind == "idle":
            nh[i] = j
        else:
            a, b = j
            go[i, a], go[i, b] = go[i, b], go[i, a]
        return nh, go

    stale = 0
    while not done() and stale < patience:
        improved = False
        cand = moves(cur[0])
        order = rng.permutation(len(cand)).tolist()
        pos, size = 0, 1
        while pos < len(order) and not improved and not done():
            room = max(1, max_evaluations - evals)
            batch = [apply(cur[0], cur[1], cand[k]) for k in order[pos:pos + min(size, room)]]
            pos += len(batch)
            size = size if objective_many is None else min(2 * size, 64)
            for (nh, go), val in zip(batch, price_many(batch)):
                if val < cur[2] * (1 - 1e-12):
                    cur = [nh, go, val]
                    improved = True
                    break
        if cur[2] < best[2]:
            best = (cur[0].copy(), cur[1].copy(), cur[2])
        if not improved and not done():
            # local optimum: kick the best by a few random swaps (or idle swaps)
            stale += 1
            nh, go = best[0].copy(), best[1].copy()
            for _ in range(max(2, N // 8)):
                cand = moves(nh)
                nh, go = apply(nh, go, cand[int(rng.integers(len(cand)))])
            cur = [nh, go, price(nh, go)]
            if cur[2] < best[2]:
                best = (cur[0].copy(), cur[1].copy(), cur[2])
        if best[2] < best_seen:
            best_seen, stale = best[2], 0
    return result(*best, False)
