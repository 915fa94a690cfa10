"""The placement search: which hosts a plan's node ranks run on and which GPU each of
their local ranks gets, chosen to minimise the simulated iteration time on the measured
links, and what that gains.

:func:`search_placement` minimises any objective over placements (exhaustive when small,
iterated local search otherwise); :func:`place_plan` runs it with
:class:`configurator.cost.placed.PlacedPlan` (the exact schedule of every data-parallel
replica on its own links) as the objective and returns the placement as a
:class:`~configurator.core.document.PlacementRecord` with the chosen placement's simulated
iteration. Three figures per plan, all simulated the same way:

* ``default_iteration_time_s``: Megatron's sequential mapping on the first N hosts of the
  pool (node rank ``n`` on the pool's ``n``-th host, local rank ``k`` on GPU ``k``);
* ``random_median_iteration_time_s``: the median over random placements (random hosts of
  the pool in random order, random GPU order on each host where GPU links differ);
* ``iteration_time_s``: the optimised placement.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from configurator.core.document import PlacementRecord
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from configurator.cost.placed import PlacedPlan, PlacedTime
from configurator.core.plan_values import mfu_peak_precision
from configurator.core.plan_batch import PlanBatch

# -- searching placements under any objective -----------------------------------------------


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


#: Moves from a placement the local search lists and scans in a random order; beyond it
#: (some 360 node ranks on as many hosts) it scans MOVES_DRAWN moves drawn at random.
MOVES_LISTED = 1 << 16
MOVES_DRAWN = 4096
#: Moves of a listed scan priced in one batch before the scan reaches them: most scans
#: find their improving move among the first few, which the doubling batches (1, 2, 4, …)
#: would price in as many calls.
SCAN_AHEAD = 8


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
    search path is the same and only extra moves of the last batch are priced; a listed
    scan's first :data:`SCAN_AHEAD` moves are priced in one batch when it starts, counted
    as evaluations only when the scan reaches them.

    Every placement is priced when there are at most ``exhaustive_limit``
    (:func:`placement_count`). Otherwise an iterated local search: start from the better of
    Megatron's sequential mapping on the first N hosts and the N hosts listed first in
    ``host_preference`` (e.g. healthiest first); moves are swapping two node ranks' hosts,
    replacing a node rank's host by an idle one, and (``move_gpus``) swapping two local
    ranks' GPUs; the first improving move is taken (moves in a seeded random order; beyond
    :data:`MOVES_LISTED` moves, :data:`MOVES_DRAWN` of them drawn at random); at a
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

    ahead_values: dict[int, float] = {}     # priced, not yet counted as evaluations

    def key_of(nh, go) -> int:
        return hash(nh.tobytes() + go.tobytes())

    def price_ahead(cands: list) -> None:
        """Price those of ``cands`` never priced, in one batch; their values wait, uncounted,
        until :func:`price_many` asks (a listed scan prices its first moves this way: one
        batch instead of the doubling ones, the same values, evaluations and path)."""
        todo = {}
        for nh, go in cands:
            key = key_of(nh, go)
            if key not in seen and key not in ahead_values and key not in todo:
                todo[key] = (nh, go)
        if not todo:
            return
        if objective_many is None:
            vals = [float(objective(nh, go)) for nh, go in todo.values()]
        else:
            vals = [float(x) for x in objective_many(list(todo.values()))]
        ahead_values.update(zip(todo.keys(), vals))

    def price_many(cands: list) -> list[float]:
        """Values of ``cands`` (``(nh, go)`` pairs), new ones priced in one batch (or taken
        from those :func:`price_ahead` priced); each new one counts as an evaluation."""
        nonlocal evals
        price_ahead(cands)
        keys = [key_of(nh, go) for nh, go in cands]
        new = {key for key in keys if key not in seen}
        seen.update((k, ahead_values.pop(k)) for k in new)
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

    # the moves from a placement: N(N-1)/2 swaps, N(M-N) idle swaps, N·G(G-1)/2 GPU swaps;
    # listed (and scanned in a random order) up to MOVES_LISTED, else drawn at random
    num_moves = (N * (N - 1) // 2 + N * (M - N)
                 + (N * G * (G - 1) // 2 if move_gpus and G > 1 else 0))
    listed = num_moves <= MOVES_LISTED

    def idle_of(nh) -> np.ndarray:
        used = np.zeros(M, dtype=bool)
        used[nh] = True
        return np.flatnonzero(~used)

    def pair(n):                   # two distinct indices below n, the smaller first
        i, j = int(rng.integers(n)), int(rng.integers(n - 1))
        j += j >= i
        return min(i, j), max(i, j)

    def draw(idle):
        """One move drawn at random (``idle``: the hosts no node rank uses), each kind as
        likely as its share of the moves."""
        k = int(rng.integers(num_moves))
        if k < N * (N - 1) // 2:
            return ("swap", *pair(N))
        if k < N * (N - 1) // 2 + N * (M - N):
            return ("idle", int(rng.integers(N)), int(idle[rng.integers(idle.size)]))
        return ("gpu", int(rng.integers(N)), pair(G))

    def scan_order(nh):
        """The moves from ``nh`` in the order the scan tries them: all of them shuffled, or
        up to MOVES_DRAWN drawn one by one as the scan reaches them."""
        if listed:
            cand = moves(nh)
            yield from (cand[k] for k in rng.permutation(len(cand)).tolist())
        else:
            idle = idle_of(nh)
            for _ in range(MOVES_DRAWN):
                yield draw(idle)

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

    # a listed scan's order is fixed when it starts, so its first moves can be priced ahead
    # in one batch; a drawn scan draws each move from the random generator the kicks use,
    # and drawing ahead would change the kicks
    look_ahead = SCAN_AHEAD if listed and objective_many is not None else 0
    stale = 0
    while not done() and stale < patience:
        improved = False
        order = scan_order(cur[0])
        ahead: list = []                # placements taken from ``order``, not yet scanned
        ahead_values.clear()
        size = 1
        while not improved and not done():
            room = max(1, max_evaluations - evals)
            want = min(size, room)
            if len(ahead) < want:
                ahead.extend(apply(cur[0], cur[1], mv) for mv in itertools.islice(
                    order, max(want, look_ahead) - len(ahead)))
                if look_ahead:
                    price_ahead(ahead)
            batch, ahead = ahead[:want], ahead[want:]
            if not batch:
                break
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
                if listed:
                    cand = moves(nh)
                    nh, go = apply(nh, go, cand[int(rng.integers(len(cand)))])
                else:
                    nh, go = apply(nh, go, draw(idle_of(nh)))
            cur = [nh, go, price(nh, go)]
            if cur[2] < best[2]:
                best = (cur[0].copy(), cur[1].copy(), cur[2])
        if best[2] < best_seen:
            best_seen, stale = best[2], 0
    return result(*best, False)


# -- placing a plan on a cluster ------------------------------------------------------------

#: Random placements behind ``random_median_iteration_time_s``.
RANDOM_PLACEMENTS = 100
#: GPUs of the random placements priced in one batch at most (their rank → GPU maps: some
#: 8 MiB; a 16,384-host plan is priced 8 placements at a time, a 17-host one all at once).
RANDOM_BATCH_GPUS = 1 << 20


def host_health_order(cluster, pool: Sequence[int]) -> list[int]:
    """The hosts of ``pool`` (indices), healthiest first: by the median of their measured
    host-to-host bandwidths (out and in), then their slowest NVLink pair; ties by index."""
    table = cluster.link_table()
    G = cluster.gpus_per_node
    pool = [int(h) for h in pool]
    medians = table.host_bandwidth_medians(pool)
    off = ~np.eye(G, dtype=bool)
    slowest_nvlink = (table.intra_bw[:, off].min(axis=1) if G > 1
                      else np.zeros(cluster.num_nodes))
    score = {h: (-(medians[h] or 0.0), -float(slowest_nvlink[h]), h) for h in pool}
    return sorted(pool, key=lambda h: score[h])


def gpu_links_vary(cluster) -> bool:
    """Whether the order of GPUs on some host can matter: its NVLink pairs or its GPU↔NIC
    edges are not all alike."""
    t = cluster.link_table()
    G = cluster.gpus_per_node
    if G < 2:
        return False
    off = ~np.eye(G, dtype=bool)
    intra = t.intra_bw[:, off]
    if np.any(intra.max(axis=1) > intra.min(axis=1)) or t.overrides:
        return True
    return any(np.any(np.nanmax(a, axis=1) > np.nanmin(a, axis=1))
               for a in t.edge_bw.values())


def place_plan(model: ModelSpec, cluster, plan: ParallelPlan, *,
               pool: Sequence[int] | None = None, method: str = "optimized",
               node_hosts: Sequence[int] | None = None,
               gpu_order: Sequence[Sequence[int]] | None = None,
               seed: int = 0, time_budget_s: float = 5.0, max_evaluations: int = 20_000,
               random_samples: int = RANDOM_PLACEMENTS, profile=None
               ) -> tuple[PlacementRecord, PlacedTime]:
    """Place ``plan`` on ``cluster`` (whose hosts may outnumber the plan's nodes):
    ``(record, schedule)``, the placement (host names, GPU orders, idle hosts, the three
    figures in seconds, the search's counts) and its simulated iteration
    (:meth:`PlacedPlan.time`, priced once here; an evaluation keeps it for its per-stage
    times and the Gantt chart).

    ``pool``: host indices the plan may use (default all; e.g. without the hosts an audit
    flags), in preference order for the default mapping (its first N). ``method``:
    ``"default"`` (sequential on the pool's first N hosts), ``"optimized"``
    (:func:`search_placement` within ``max_evaluations`` placements,
    seeded: the same result on every run, unless ``time_budget_s`` ends it first), or
    ``"file"`` (the given ``node_hosts`` and ``gpu_order``). ``profile``: measured layer
    times the plan is priced with (:class:`configurator.cost.placed.PlacedPlan`), or None.
    Raises ValueError when the pool has fewer hosts than the plan needs.
    """
    pool = list(range(cluster.num_nodes)) if pool is None else [int(h) for h in pool]
    priced = PlacedPlan(model, cluster, PlanBatch.from_plan(plan), profile)
    memo: dict[int, float] = {}

    def objective_many(placements) -> list[float]:
        """Placements priced once each (random draws repeat), new ones in one batch."""
        arrs = [(np.asarray(nh, dtype=np.int64), np.asarray(go, dtype=np.int64))
                for nh, go in placements]
        keys = [hash(nh.tobytes() + go.tobytes()) for nh, go in arrs]
        new = {k: a for k, a in zip(keys, arrs) if k not in memo}
        if new:
            memo.update(zip(new.keys(), priced.times(list(new.values())).tolist()))
        return [memo[k] for k in keys]

    def objective(nh, go) -> float:
        return objective_many([(nh, go)])[0]

    N, G = priced.num_nodes, cluster.gpus_per_node
    if N > len(pool):
        raise ValueError(f"the plan needs {N} hosts; only {len(pool)} may be used")
    ident = np.tile(np.arange(G, dtype=np.int64), (N, 1))
    default_nh = np.array(pool[:N], dtype=np.int64)
    default_t = objective(default_nh, ident)
    pool_arr = np.array(pool, dtype=np.int64)
    move_gpus = gpu_links_vary(cluster)
    rng = np.random.default_rng(seed)
    rand = []
    batch = max(1, RANDOM_BATCH_GPUS // (N * G))     # placements priced at once
    for start in range(0, random_samples, batch):
        draws = []
        for _ in range(min(batch, random_samples - start)):
            nh = rng.permutation(pool_arr)[:N]
            go = (np.array([rng.permutation(G) for _ in range(N)]) if move_gpus else ident)
            draws.append((nh, go))
        rand += objective_many(draws)
    rand_med = float(statistics.median(rand)) if rand else None

    evals, wall, exhaustive = 0, 0.0, False
    if method == "default":
        nh, go, t = default_nh, ident, default_t
    elif method == "file":
        nh = np.asarray(node_hosts, dtype=np.int64)
        go = np.asarray(gpu_order, dtype=np.int64)
        t = objective(nh, go)
    elif method == "optimized":
        pref = host_health_order(cluster, pool)
        choice = search_placement(
            lambda a, b: objective(pool_arr[a], b), num_hosts=len(pool),
            num_nodes=N, gpus_per_node=G, move_gpus=move_gpus, seed=seed,
            host_preference=[pool.index(h) for h in pref], time_budget_s=time_budget_s,
            max_evaluations=max_evaluations,
            objective_many=lambda cands: objective_many([(pool_arr[a], b)
                                                         for a, b in cands]))
        nh = pool_arr[np.asarray(choice.node_hosts, dtype=np.int64)]
        go = np.asarray(choice.gpu_order, dtype=np.int64)
        t, evals, wall, exhaustive = (choice.objective, choice.evaluations,
                                      choice.wall_time_s, choice.exhaustive)
        if default_t <= t:          # the search starts there; keep it on a tie
            nh, go, t = default_nh, ident, default_t
    else:
        raise ValueError(f"unknown placement method {method!r}")
    used = set(nh.tolist())
    record = PlacementRecord(
        hosts=tuple(cluster.hosts[h] for h in nh.tolist()),
        gpu_order=tuple(tuple(o) for o in go.tolist()),
        excluded_hosts=tuple(h for i, h in enumerate(cluster.hosts) if i not in used),
        iteration_time_s=float(t), default_iteration_time_s=float(default_t),
        random_median_iteration_time_s=rand_med, method=method, evaluations=evals,
        wall_time_s=wall, exhaustive=exhaustive)
    return record, priced.time(nh, go)


def place_search_result(model: ModelSpec, cluster, res, *, pool: Sequence[int],
                        time_budget_s: float = 1.0, max_evaluations: int = 20_000,
                        seed: int = 0, progress: bool | None = None,
                        random_samples: int = RANDOM_PLACEMENTS, profile=None):
    """``res`` (a :class:`~configurator.search.rank.SearchResult` made on some of
    ``cluster``'s hosts) with every plan placed on ``cluster`` (:func:`place_plan`,
    ``optimized``, hosts from ``pool``), re-timed under its placement and re-ranked.
    ``progress``: a bar on stderr (None: only on a terminal); ``random_samples``: random
    placements behind each plan's random median; ``profile``: as :func:`place_plan` takes
    it."""
    import dataclasses

    from configurator.core.progress import progress as bar
    from configurator.search.evaluate import with_placement
    from configurator.search.intervals import rank_with_intervals

    placed = []
    for e in bar(res.plans, desc="placement", unit="plan", shown=progress):
        record, schedule = place_plan(model, cluster, e.plan, pool=pool,
                                      time_budget_s=time_budget_s,
                                      max_evaluations=max_evaluations, seed=seed,
                                      random_samples=random_samples, profile=profile)
        peak = cluster.gpu.peak(mfu_peak_precision(e.plan.precision))
        placed.append(with_placement(model, e, record, schedule, peak))
    placed.sort(key=lambda e: e.iteration_time_s)
    placed, note = rank_with_intervals(model, cluster, placed, profile)
    return dataclasses.replace(res, plans=placed, pick_note=note)


def placement_on_cluster(data, cluster, num_nodes: int, where: str = "placement"):
    """``(node_hosts, gpu_order)`` of a :class:`PlacementRecord`, a placement object
    (``{"hosts": [...], "gpu_order": [[...], ...]}``; ``gpu_order`` defaults to every GPU
    in index order) or a plan document holding one under ``"placement"``, validated
    (:func:`configurator.core.document.as_placement`) and its host names resolved on
    ``cluster``. Raises :class:`InputError` naming the field."""
    from configurator.core.document import as_placement
    from configurator.core.errors import InputError

    if isinstance(data, dict) and isinstance(data.get("placement"), dict):
        data, where = data["placement"], f"{where}.placement"
    if isinstance(data, dict) and "hosts" in data and "gpu_order" not in data:
        data = {**data, "gpu_order": [list(range(cluster.gpus_per_node))] * (
            len(data["hosts"]) if isinstance(data["hosts"], list) else 0)}
    rec = as_placement(data, where, nodes=num_nodes, gpus_per_node=cluster.gpus_per_node)
    index = {h: i for i, h in enumerate(cluster.hosts)}
    for i, h in enumerate(rec.hosts):
        if h not in index:
            raise InputError(f"{where}.hosts[{i}]", h, "must be a host of the topology")
    return [index[h] for h in rec.hosts], [list(o) for o in rec.gpu_order]
