"""Where a plan's ranks run: choose the hosts and the rank → GPU map that minimise the
simulated iteration time on the measured links, and say what it gains.

The objective is :class:`configurator.cost.placed.PlacedPlan` (the exact schedule of every
data-parallel replica on its own links); the search over placements is
:func:`topology.placement.search_placement` (exhaustive when small, iterated local search
otherwise). Three figures per plan, all simulated the same way:

* ``default_iteration_time_s``: Megatron's sequential mapping on the first N hosts of the
  pool (node rank ``n`` on the pool's ``n``-th host, local rank ``k`` on GPU ``k``);
* ``random_median_iteration_time_s``: the median over random placements (random hosts of
  the pool in random order, random GPU order on each host where GPU links differ);
* ``iteration_time_s``: the optimised placement.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from configurator.cost.placed import PlacedPlan
from topology.placement import search_placement

#: Random placements behind ``random_median_iteration_time_s``.
RANDOM_PLACEMENTS = 100


@dataclass(frozen=True)
class PlacementOutcome:
    """A plan's placement and its simulated figures (seconds). ``hosts``: host name of node
    rank 0..N-1; ``gpu_order``: per node rank, the GPU index of local rank 0..G-1;
    ``excluded_hosts``: the cluster's hosts left idle; ``method``: ``default``,
    ``optimized`` or ``file``."""

    hosts: list[str]
    gpu_order: list[list[int]]
    excluded_hosts: list[str]
    iteration_time_s: float
    default_iteration_time_s: float
    random_median_iteration_time_s: float | None
    method: str
    evaluations: int = 0
    wall_time_s: float = 0.0
    exhaustive: bool = False
    node_hosts: tuple[int, ...] = field(default=(), repr=False)
    time_per_stage: list[dict] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        return {"hosts": list(self.hosts), "gpu_order": [list(o) for o in self.gpu_order],
                "excluded_hosts": list(self.excluded_hosts), "method": self.method,
                "iteration_time_s": self.iteration_time_s,
                "default_iteration_time_s": self.default_iteration_time_s,
                "random_median_iteration_time_s": self.random_median_iteration_time_s,
                "evaluations": self.evaluations, "wall_time_s": self.wall_time_s,
                "exhaustive": self.exhaustive}


def host_health_order(cluster, pool: Sequence[int]) -> list[int]:
    """The hosts of ``pool`` (indices), healthiest first: by the median of their measured
    host-to-host bandwidths (out and in), then their slowest NVLink pair; ties by index."""
    table = cluster.link_table()
    G = cluster.gpus_per_node
    src, dst = np.divmod(table.host_keys, cluster.num_nodes)
    off = ~np.eye(G, dtype=bool)
    score = {}
    for h in pool:
        vals = table.host_bw[(src == h) | (dst == h)].tolist()
        nv = float(np.min(table.intra_bw[h][off])) if G > 1 else 0.0
        score[h] = (-(statistics.median(vals) if vals else 0.0), -nv, h)
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
               random_samples: int = RANDOM_PLACEMENTS) -> PlacementOutcome:
    """Place ``plan`` on ``cluster`` (whose hosts may outnumber the plan's nodes).

    ``pool``: host indices the plan may use (default all; e.g. without the hosts an audit
    flags), in preference order for the default mapping (its first N). ``method``:
    ``"default"`` (sequential on the pool's first N hosts), ``"optimized"``
    (:func:`topology.placement.search_placement` within ``max_evaluations`` placements,
    seeded: the same result on every run, unless ``time_budget_s`` ends it first), or
    ``"file"`` (the given ``node_hosts`` and ``gpu_order``). Raises ValueError when the pool
    has fewer hosts than the plan needs.
    """
    pool = list(range(cluster.num_nodes)) if pool is None else [int(h) for h in pool]
    priced = PlacedPlan(model, cluster, plan)
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
    draws = []
    for _ in range(random_samples):
        nh = rng.permutation(pool_arr)[:N]
        go = (np.array([rng.permutation(G) for _ in range(N)]) if move_gpus else ident)
        draws.append((nh, go))
    rand = objective_many(draws) if draws else []
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
    stage_times = priced.time(nh, go).stage_times()
    return PlacementOutcome(
        hosts=[cluster.hosts[h] for h in nh.tolist()], gpu_order=go.tolist(),
        excluded_hosts=[h for i, h in enumerate(cluster.hosts) if i not in used],
        iteration_time_s=float(t), default_iteration_time_s=float(default_t),
        random_median_iteration_time_s=rand_med, method=method, evaluations=evals,
        wall_time_s=wall, exhaustive=exhaustive, node_hosts=tuple(nh.tolist()),
        time_per_stage=stage_times)


def place_search_result(model: ModelSpec, cluster, res, *, pool: Sequence[int],
                        time_budget_s: float = 1.0, max_evaluations: int = 20_000,
                        seed: int = 0, progress: bool | None = None,
                        random_samples: int = RANDOM_PLACEMENTS):
    """``res`` (a :class:`~configurator.search.rank.SearchResult` made on some of
    ``cluster``'s hosts) with every plan placed on ``cluster`` (:func:`place_plan`,
    ``optimized``, hosts from ``pool``), re-timed under its placement and re-ranked.
    ``progress``: a bar on stderr (None: only on a terminal); ``random_samples``: random
    placements behind each plan's random median."""
    import dataclasses

    from tqdm import tqdm

    from configurator.search.evaluate import with_placement

    placed = []
    for e in tqdm(res.plans, desc="placement", unit="plan", disable=None if progress is None
                  else not progress, leave=False):
        out = place_plan(model, cluster, e.plan, pool=pool, time_budget_s=time_budget_s,
                         max_evaluations=max_evaluations, seed=seed,
                         random_samples=random_samples)
        peak = cluster.gpu.peak("fp16" if e.plan.precision == "fp16" else "bf16")
        placed.append(with_placement(model, e, out.to_dict(), out.iteration_time_s, peak,
                                     out.time_per_stage))
    placed.sort(key=lambda e: e.iteration_time_s)
    return dataclasses.replace(res, plans=placed)


def placement_on_cluster(data, cluster, num_nodes: int, where: str = "placement"):
    """``(node_hosts, gpu_order)`` from a placement object (``{"hosts": [...],
    "gpu_order": [[...], ...]}``, validated by :func:`configurator.core.document.read_placement`;
    ``gpu_order`` defaults to every GPU in index order) or a plan document holding one under
    ``"placement"``, host names resolved on ``cluster``. Raises :class:`InputError` naming
    the field."""
    from configurator.core.document import read_placement
    from configurator.core.errors import InputError

    if isinstance(data, dict) and isinstance(data.get("placement"), dict):
        data, where = data["placement"], f"{where}.placement"
    if isinstance(data, dict) and "hosts" in data and "gpu_order" not in data:
        data = {**data, "gpu_order": [list(range(cluster.gpus_per_node))] * (
            len(data["hosts"]) if isinstance(data["hosts"], list) else 0)}
    rec = read_placement(data, where, nodes=num_nodes, gpus_per_node=cluster.gpus_per_node)
    index = {h: i for i, h in enumerate(cluster.hosts)}
    for i, h in enumerate(rec.hosts):
        if h not in index:
            raise InputError(f"{where}.hosts[{i}]", h, "must be a host of the topology")
    return [index[h] for h in rec.hosts], [list(o) for o in rec.gpu_order]
