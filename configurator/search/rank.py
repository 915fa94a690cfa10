"""Search: every legal plan, memory filter, rank by predicted iteration time.

Vectorised end to end: :func:`configurator.search.space.enumerate_plans` builds the column store,
:func:`configurator.search.engine.peak_memory` filters it, and
:func:`configurator.cost.iteration.iteration_time` ranks the survivors in closed form. The best
``max(k, RERANK_K)`` are turned into full :class:`~configurator.search.evaluate.Evaluation`
objects, whose time is the exact schedule simulated on the ranks' links, and re-ranked by it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from configurator.core.plan_batch import SHARED_FIELDS, PlanBatch
from configurator.core.errors import InputError, NoFeasiblePlanError
from configurator.core.layers import split_ok
from configurator.search.engine import in_chunks, peak_memory
from configurator.search.evaluate import Evaluation, evaluate_plan
from configurator.core.model import ModelSpec
from configurator.core.plan import search_options
from configurator.core.rules import check_search_options
from configurator.search.space import (SearchSpace, enumerate_plans, layer_splits,
                                        layout_splits)
from configurator.cost.communication import comm_table, expert_comm_table, gather_figures
from configurator.search.intervals import rank_with_intervals
from configurator.search.mechanisms import (CPU_OFFLOADING, MECHANISM, MEGATRON_FSDP, Regime,
                                            mechanisms_on, plan_variants, search_regimes)
from configurator.cost.iteration import iteration_time


#: Plans of the closed-form ranking re-ranked by the simulated schedule (at least).
RERANK_K = 16


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    plans: list[Evaluation]
    candidates_evaluated: int
    feasible: int
    search_time_s: float
    ranked: PlanBatch | None = field(default=None, repr=False)
    ranked_time_s: np.ndarray | None = field(default=None, repr=False)
    #: one line on the default pick when plans tie within the best plan's interval
    #: (:func:`configurator.search.intervals.rank_with_intervals`), else None
    pick_note: str | None = None
    #: the recipe mechanisms the search turned on where they apply
    #: (:mod:`configurator.search.mechanisms`), in :data:`MECHANISMS` order
    mechanisms: tuple[str, ...] = ()

    def mechanisms_of(self, plan) -> list[str]:
        """The mechanisms the search turned on that take effect in ``plan``."""
        return mechanisms_on(plan, self.mechanisms)

    def to_dict(self) -> dict:
        return {"plans": [p.to_dict() for p in self.plans],
                "candidates_evaluated": self.candidates_evaluated,
                "feasible": self.feasible, "search_time_s": self.search_time_s,
                "pick_note": self.pick_note,
                "mechanisms": {"chosen": list(self.mechanisms),
                               "by_plan": [self.mechanisms_of(p.plan) for p in self.plans]}}


def _refuse_restrictions(model: ModelSpec, world: int, global_batch_size: int,
                         space: SearchSpace, options: dict) -> None:
    """Raise :class:`InputError` naming the search restrictions (``space`` beyond the
    recompute choices) when they, not the GPU count and batch, leave no legal plan: the
    same enumeration without them finds some."""
    named = {k: v for k, v in space.allowed.items() if k != "recompute"}
    if not named:
        return
    free = SearchSpace(**{k: v for k, v in space.allowed.items() if k == "recompute"})
    if not len(enumerate_plans(model, world, global_batch_size, space=free, **options)):
        return
    field, values = next(iter(named.items()))
    shown = ", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in named.items())
    raise InputError(field, values[0] if len(values) == 1 else list(values),
                     f"no legal plan of {world} GPUs at global batch {global_batch_size} "
                     f"has {shown} (tp*pp*cp*dp = GPUs, tp divides the heads, pp the "
                     f"layers, mbs*dp the batch): widen the restrictions")


def search(model: ModelSpec, cluster, global_batch_size: int, *, top_k: int = 10,
           space: SearchSpace = SearchSpace(), overlap_grad_reduce: bool = True,
           overlap_param_gather: bool = True, keep_ranking: bool = False,
           max_memory_fraction: float = 1.0, rerank: int = RERANK_K, profile=None,
           choose_mechanisms: bool = True, **options) -> SearchResult:
    """Rank every legal plan for ``model`` on all GPUs of ``cluster``; ``options``: the
    :data:`~configurator.core.plan.SEARCH_OPTIONS` (precision, attention backend, …) every
    plan carries (default: the plan defaults; a value of None is not given).

    With ``choose_mechanisms`` the options not given are completed by the recipe mechanisms
    the cluster allows (:mod:`configurator.search.mechanisms`): the search runs once per
    regime of them, each regime on its part of the plans, and each shortlisted plan is
    priced without the mechanisms that only move time where that is faster. An option given
    (not None) is never changed.

    Raises :class:`InputError` when no plan is legal at all (e.g. a batch size no data-parallel
    degree divides) and :class:`NoFeasiblePlanError` when legal plans exist but none fits
    (the message gives the smallest peak memory found against the capacity).
    ``max_memory_fraction`` keeps plans whose peak is at most that fraction of GPU memory
    (headroom beyond the model's own allowance for fragmentation and buffers). ``rerank``:
    how many of the closed form's best the simulated schedule re-ranks (at least
    ``top_k``). ``profile``: measured layer times the cost prices layers with
    (:class:`configurator.core.profile.LayerProfile`), or None.
    """
    t0 = time.perf_counter()
    pinned = {name for name, value in options.items() if value is not None}
    options = search_options(**options)
    cluster.gpu.peak(options["precision"])
    check_search_options(model, options)
    world = cluster.num_gpus
    regimes = search_regimes(model, cluster, options, pinned, space.allowed) \
        if choose_mechanisms else []
    if not regimes:
        regimes = [Regime(options=options, restrict={}, mechanisms=())]
    limit = cluster.gpu.memory_bytes * max_memory_fraction
    n = nfeas = 0
    # (regime, feasible plans, closed form, link tables); the legal plans of a regime none fits
    parts, unfit = [], []
    for regime in regimes:
        cand = enumerate_plans(model, world, global_batch_size,
                               overlap_grad_reduce=overlap_grad_reduce,
                               overlap_param_gather=overlap_param_gather,
                               space=SearchSpace(**(space.allowed | regime.restrict)),
                               **regime.options)
        if not len(cand):
            continue
        mem = in_chunks(cand, lambda c, _rows: peak_memory(
            model, c, limit_bytes=limit, non_tn_fp8_gemm=cluster.gpu.non_tn_fp8_gemm))
        fits = mem <= limit
        n, nfeas = n + len(cand), nfeas + int(fits.sum())
        if not fits.any():
            unfit.append(cand)
            continue
        feas = cand.take(np.flatnonzero(fits))
        # the groups' link figures once for every slice (each slice would price every
        # layout), gathered per plan slice by slice
        tables = [comm_table(cluster, feas), expert_comm_table(cluster, feas)]
        closed = in_chunks(feas, lambda c, rows: iteration_time(
            model, cluster, c, comm=gather_figures(tables, rows), profile=profile))
        parts.append((regime, feas, closed, tables))
    if n == 0:
        _refuse_restrictions(model, world, global_batch_size, space, regimes[0].options)
        raise InputError("global_batch_size", global_batch_size,
                         f"no legal plan: no tp*pp*cp*dp layout of {world} GPUs with "
                         f"global_batch_size % (micro_batch_size*dp) == 0 under the "
                         f"search restrictions: another --gbs or --nodes gives one")
    if nfeas == 0:
        mem, p = min(((m[i], c.plan(i)) for c in unfit
                      for m in [peak_memory(model, c,
                                            non_tn_fp8_gemm=cluster.gpu.non_tn_fp8_gemm)]
                      for i in [int(np.argmin(m))]), key=lambda x: x[0])
        raise NoFeasiblePlanError(
            f"{n} legal plans, none fits: smallest peak memory {mem / 2**30:.1f} GiB > "
            f"capacity {limit / 2**30:.1f} GiB (tp={p.tp} pp={p.pp} "
            f"dp={p.dp} cp={p.cp} mbs={p.micro_batch_size} recompute={p.recompute}); "
            f"add GPUs or lower the batch size per GPU")
    times = np.concatenate([closed["iteration_time_s"] for _, _, closed, _ in parts])
    part = np.concatenate([np.full(len(feas), k) for k, (_, feas, _, _) in enumerate(parts)])
    row = np.concatenate([np.arange(len(feas)) for _, feas, _, _ in parts])
    order = np.argsort(times, kind="stable")
    # the closed form ranks everything; the exact schedule re-ranks its best, each in the
    # fastest of its mechanism variants
    entries = []
    for j in order[:max(top_k, rerank)]:
        _, feas, closed, _ = parts[part[j]]
        i = int(row[j])
        entries.append((feas.plan(i), int(part[j]), i,
                        {k: float(v[i]) for k, v in closed.items()}))
    shortlist = [evaluate_plan(model, cluster, plan, profile=profile, closed_form=figures)
                 for plan, figures in _fastest_variants(model, cluster, parts, entries,
                                                        profile)]
    best = sorted(shortlist, key=lambda e: e.iteration_time_s)[:top_k]
    best, pick_note = rank_with_intervals(model, cluster, best, profile)
    chosen = tuple(name for name in (*MECHANISM, CPU_OFFLOADING, MEGATRON_FSDP)
                   if any(name in regime.mechanisms for regime in regimes))
    # the ranking kept is that of the best plan's regime (one set of search-wide options)
    k = int(part[order[0]])
    mine = order[part[order] == k]
    return SearchResult(plans=best, candidates_evaluated=n, feasible=nfeas, pick_note=pick_note,
                        search_time_s=time.perf_counter() - t0, mechanisms=chosen,
                        ranked=parts[k][1].take(row[mine]) if keep_ranking else None,
                        ranked_time_s=times[mine] if keep_ranking else None)


def _fastest_variants(model: ModelSpec, cluster, parts: list, entries: list,
                      profile=None) -> list:
    """``(plan, closed-form figures)`` of each ``(plan, part, row, figures)`` of ``entries``
    (a plan of the search's ``parts[part]``, ``(regime, feasible plans, closed form, link
    tables)``, at ``row``): the fastest in closed form of the plan's mechanism variants
    (:func:`configurator.search.mechanisms.plan_variants`; ``figures``: the plan's own).
    Variants of one part that share their search-wide fields are priced as one batch, with
    the part's link figures (a variant keeps its plan's layout)."""
    variants = [plan_variants(model, cluster, plan, parts[k][0]) for plan, k, _, _ in entries]
    groups: dict[tuple, list] = {}     # (part, shared fields) -> [(entry, variant index)]
    for e, (vs, (plan, k, _, _)) in enumerate(zip(variants, entries)):
        for j, v in enumerate(vs):
            if v != plan:
                groups.setdefault((k, *(getattr(v, f.name) for f in SHARED_FIELDS)),
                                  []).append((e, j))
    priced = [{} for _ in entries]     # entry -> variant index -> figures
    for key, members in groups.items():
        rows = np.array([entries[e][2] for e, _ in members])
        closed = iteration_time(model, cluster, PlanBatch.from_plans(
            [variants[e][j] for e, j in members]), comm=gather_figures(parts[key[0]][3], rows),
            profile=profile)
        for r, (e, j) in enumerate(members):
            priced[e][j] = {name: float(np.broadcast_to(x, (len(members),))[r])
                            for name, x in closed.items()}
    out = []
    for e, (plan, _, _, figures) in enumerate(entries):
        f, v = min(((figures if v == plan else priced[e][j], v)
                    for j, v in enumerate(variants[e])),
                   key=lambda x: x[0]["iteration_time_s"])
        out.append((v, f))
    return out


def best_layer_split(model: ModelSpec, cluster, plan, profile=None):
    """``plan`` with the fastest legal layer split at its pp and vp that fits in memory (the
    smallest in memory when none fits; closed form), for a plan whose pp does not divide the
    layers and which names no split itself: an uneven or embedding/loss-aware one
    (:func:`configurator.search.space.layer_splits`), else a pipeline layout
    (:func:`configurator.search.space.layout_splits`); ``plan`` unchanged when its split is
    already legal. Raises :class:`InputError` when Megatron builds none at that pp and
    vp. ``profile``: as :func:`search` takes it."""
    if plan.custom_layer_split or split_ok(
            model.num_layers, pp=plan.pp, vp=plan.vp, first=0, last=0,
            account_embedding=False, account_loss=False):
        return plan
    options = [x for x in layer_splits(model, plan.pp) if x[0] == plan.vp]
    if not options:    # a vp the search passes over (few layers a stage): any layout
        options = [(plan.vp, 0, 0, False, False, x)
                   for x in layout_splits(model, plan.pp, plan.vp)]
    if not options:
        raise InputError("pp", plan.pp, f"no layer split of {model.num_layers} layers over "
                                        f"pp={plan.pp} with vp={plan.vp} (even, uneven, "
                                        f"accounting for the embedding/loss or a pipeline "
                                        f"layout)")
    plans = [dataclasses.replace(
        plan, decoder_first_pipeline_num_layers=first, decoder_last_pipeline_num_layers=last,
        account_for_embedding_in_pipeline_split=ae, account_for_loss_in_pipeline_split=al,
        pipeline_model_parallel_layout=layout)
        for _vp, first, last, ae, al, layout in options]
    cand = PlanBatch.from_plans(plans)
    times = iteration_time(model, cluster, cand, profile=profile)["iteration_time_s"]
    mem = peak_memory(model, cand, non_tn_fp8_gemm=cluster.gpu.non_tn_fp8_gemm)
    fits = mem <= cluster.gpu.memory_bytes
    best = int(np.argmin(np.where(fits, times, np.inf))) if fits.any() else int(np.argmin(mem))
    return plans[best]
