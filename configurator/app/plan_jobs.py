"""The ``search``, ``estimate`` and ``launch`` jobs: one library function each, taking a
request dataclass and returning the result the CLI prints."""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from configurator.app.inputs import JobInputs, host_pool, resolve
from configurator.app.training_jobs import (TrainingRequest, objective_note,
                                            pick_scaling_row, price_evaluation, rank_plans,
                                            scaling_summary, training_inputs, training_line)
from configurator.app.outputs import (LAUNCH_FILES, SEARCH_FILES, check_out, checkpoint_args,
                                      script_summary,
                                      write_search_outputs)
from configurator.core import validate as v
from configurator.core.document import read_plan_document
from configurator.core.errors import InputError, NoFeasiblePlanError
from configurator.core.plan import describe_search_options, field_words, search_options
from configurator.core.plan_batch import COLUMN_FIELDS, PlanBatch
from configurator.core.plan_terms import routed_load_share, router_balance
from configurator.core.plan_values import RECOMPUTE
from configurator.core.rules import SPLIT_FIELDS, plan_for_world
from configurator.search.evaluate import Evaluation, evaluate_plan
from configurator.search.intervals import with_intervals
from configurator.search.placement_search import (RANDOM_PLACEMENTS, host_health_order,
                                                  place_plan, place_search_result,
                                                  placement_on_cluster)
from configurator.search.rank import RERANK_K, SearchResult, best_layer_split, search
from configurator.search.space import SearchSpace
from memory_model.estimate import DEFAULT_MAX_MEMORY_FRACTION


#: Integer plan fields ``search`` can be restricted to given values (``--tp 4 8``,
#: ``--ep 8 16``; dp, derived by ``estimate``, is one of them).
SEARCH_RESTRICTIONS = ("tp", "pp", "dp", "cp", "vp", "micro_batch_size", "ep", "etp",
                       "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
#: Boolean plan fields ``search`` can fix (``--no-sequence-parallel``; default both values).
SEARCH_SWITCHES = ("sequence_parallel", "distributed_optimizer")
#: The data-parallel overlap every plan of a search runs with (``--no-overlap-grad-reduce``
#: for a stack that reduces gradients after the backward, as Megatron's local DDP did;
#: default on, as ``estimate``'s).
SEARCH_DDP = ("overlap_grad_reduce",)


@dataclass(frozen=True)
class SearchLimits:
    """What a search may choose among, as the user limited it (``search``, ``trial``,
    ``plan``: :func:`configurator.cli.plan_commands.search_limits`): the recompute choices,
    the fields restricted (plan field -> the values kept, e.g. ``ep``: (8, 16), or a boolean
    field's one value, ``sequence_parallel``: False; :data:`SEARCH_RESTRICTIONS`,
    :data:`SEARCH_SWITCHES`) and the data-parallel overlaps every plan runs with, those given
    (``overlap_grad_reduce`` -> bool, as :func:`configurator.search.rank.search` takes it;
    left out: on; :data:`SEARCH_DDP`). False when nothing is limited."""

    recompute: tuple[str, ...] = RECOMPUTE
    restrict: Mapping[str, Any] = field(default_factory=dict)
    ddp: Mapping[str, bool] = field(default_factory=dict)

    def __post_init__(self):
        # one form whatever the caller passed (argparse gives lists): values as tuples
        object.__setattr__(self, "recompute", tuple(self.recompute))
        object.__setattr__(self, "restrict", {
            k: vals if isinstance(vals, bool) else tuple(vals)
            for k, vals in self.restrict.items()})
        object.__setattr__(self, "ddp", dict(self.ddp))

    def __bool__(self) -> bool:
        return bool(self.words())

    def words(self) -> list[str]:
        """The command-line words of the limits (``--recompute full``, ``--tp 1 2``,
        ``--no-sequence-parallel``, ``--no-overlap-grad-reduce``): what ``trial``'s next
        step repeats so that ``search --calibration`` ranks the plans it chose among."""
        words: list[str] = []
        if self.recompute != tuple(RECOMPUTE):
            words += ["--recompute", *self.recompute]
        for name in SEARCH_RESTRICTIONS + SEARCH_SWITCHES + SEARCH_DDP:
            value = self.restrict.get(name, self.ddp.get(name))
            if value is not None:
                words += field_words(name, value)
        return words

    def space(self, model) -> SearchSpace:
        """The limits as a :class:`SearchSpace` for ``model``; expert options on a dense
        model are an input error (field ``ep`` or ``etp``), not an empty search."""
        for k in ("ep", "etp"):
            vals = self.restrict.get(k)
            if vals and not model.is_moe and any(x != 1 for x in vals):
                raise InputError(k, vals[0] if len(vals) == 1 else list(vals),
                                 "expert parallelism needs a model "
                                 "with num_experts")
        return SearchSpace(recompute=tuple(self.recompute), **{
            k: (vals,) if isinstance(vals, bool) else tuple(v.int_in_range(k, x) for x in vals)
            for k, vals in self.restrict.items()})


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """``configurator search``: inputs, the shared plan settings (``options``: plan field ->
    value for :data:`~configurator.core.plan.SEARCH_OPTIONS`, the others at their defaults),
    the search restrictions and where to write (``out``: a directory, or None)."""

    inputs: JobInputs
    global_batch_size: int
    options: Mapping[str, Any] = field(default_factory=dict)
    #: what the search may choose among (recompute, restricted fields, overlaps given)
    limits: SearchLimits = field(default_factory=SearchLimits)
    top: int = 10
    max_memory_fraction: float = DEFAULT_MAX_MEMORY_FRACTION
    out: str | None = None
    force: bool = False
    placement_time_s: float = 10.0
    placement_evaluations: int = 100
    seed: int = 0
    #: random placements behind each placed plan's random median
    random_placements: int = RANDOM_PLACEMENTS
    #: time, cost and energy to train (``--train-tokens`` and its options), or None
    training: TrainingRequest | None = None
    #: the options the user gave (not None in ``options``); the search chooses the others
    given: frozenset = field(default=frozenset(), init=False)

    def __post_init__(self):
        object.__setattr__(self, "given", frozenset(
            k for k, v in self.options.items() if v is not None))
        object.__setattr__(self, "options", search_options(**self.options))

    @property
    def precision(self) -> str:
        return self.options["precision"]

    @property
    def search_kwargs(self) -> dict:
        """The options as :func:`configurator.search.rank.search` takes them: those the user
        gave, the others None (the search completes them with the recipe mechanisms the
        cluster allows, :mod:`configurator.search.mechanisms`), and the data-parallel
        overlaps given (``limits.ddp``)."""
        return {**{k: (v if k in self.given else None) for k, v in self.options.items()},
                **self.limits.ddp}

    def check(self) -> None:
        """Check the request's own settings: the global batch size (field ``gbs``), ``top``,
        ``max_memory_fraction`` (in (0, 1]), then the placement search's
        (:func:`check_placement_options`). Raises :class:`InputError` naming the first out
        of range."""
        v.int_in_range("gbs", self.global_batch_size)
        v.int_in_range("top", self.top)
        if not 0 < self.max_memory_fraction <= 1:
            raise InputError("max_memory_fraction", self.max_memory_fraction,
                             "must be in (0, 1]")
        check_placement_options(self)


@dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    """What a search found: the result, the header line(s), the JSON document, and the
    files written (if any). The table is rendered by whoever shows it
    (:func:`configurator.report.table.format_table`)."""

    result: SearchResult
    header: str
    document: dict
    #: nodes of the cluster the plans run on
    nodes: int
    written: list[str] = field(default_factory=list)


def check_placement_options(req: SearchRequest | EstimateRequest) -> None:
    """Check the placement search's settings of ``req``: its time cap
    (``placement_time_s``), placements priced per plan (``placement_evaluations``) and
    ``seed``. Raises :class:`InputError` naming the first out of range."""
    v.float_in_range("placement_time_s", req.placement_time_s)
    v.int_in_range("placement_evaluations", req.placement_evaluations)
    v.int_in_range("seed", req.seed)


def run_search(req: SearchRequest) -> SearchOutcome:
    """Rank every legal plan that fits; with ``req.out`` write the outputs there. With a
    topology, the plan uses ``nodes`` of its hosts (the healthiest for the ranking), then
    every ranked plan is placed on the measured links (hosts and GPU order chosen,
    :func:`configurator.search.placement_search.place_plan`) and re-ranked by its placed
    time.
    Raises :class:`InputError` (bad input) or :class:`NoFeasiblePlanError`."""
    job = resolve(req.inputs, precision=req.precision)
    model, cluster, profile = job.model, job.cluster, job.profile
    req.check()
    train = training_inputs(req.training, job.training)
    if req.out:
        check_out(req.out, SEARCH_FILES, req.force)
    space = req.limits.space(model)
    note = nodes_note(req.inputs, cluster)
    try:
        compare = bool(req.inputs.calibration) and not req.inputs.topology
        (res, used), fewer = search_on_fewer_hosts(
            req, model, cluster, space, req.top, nodes=req.inputs.nodes,
            keep_ranking=bool(req.out) or compare, profile=profile)
    except NoFeasiblePlanError as err:
        raise NoFeasiblePlanError(f"{err}{note}") from None
    if fewer:
        note += f" ({fewer})"
    header = (f"{model.name} on {used.num_nodes}x{used.gpus_per_node} "
              f"{used.gpu.name}{note}, gbs {req.global_batch_size}, "
              f"seq {model.seq_length}{model.seq_length_note}, "
              f"{req.precision}{describe_search_options(req.options)}"
              f": {res.candidates_evaluated} plans evaluated, "
              f"{res.feasible} fit, {res.search_time_s:.2f} s")
    if train is not None:
        priced = [price_evaluation(model, used, e, train, req.global_batch_size)
                  for e in res.plans]
        res = dataclasses.replace(res, plans=rank_plans(priced, req.training.objective,
                                                        req.training.deadline_days))
        header += "\n" + "\n".join(textwrap.wrap(
            objective_note(train, req.training) + "; plan 1: " + training_line(res.plans[0]),
            100, subsequent_indent="  ", break_on_hyphens=False))
    best = res.plans[0]
    if best.placement is not None:
        pl = best.placement
        gain = 100 * (pl.iteration_time_s / pl.default_iteration_time_s - 1)
        header += (f"\nplaced on {pl.nodes} of {cluster.num_nodes} hosts (idle: "
                   f"{', '.join(pl.excluded_hosts) or 'none'}): "
                   f"{pl.iteration_time_s:.3f} s vs {pl.default_iteration_time_s:.3f} s "
                   f"Megatron's order on the first hosts ({gain:+.1f} %), random median "
                   f"{pl.random_median_iteration_time_s:.3f} s")
    if res.pick_note:
        header += "\n" + res.pick_note
    if res.mechanisms:
        header += "\n" + mechanisms_line(res)
    routing = routing_note(model, best.plan)
    if routing:
        header += "\nplan 1" + routing[1:]
    doc = search_document(model, used, res)
    if compare:
        doc["calibration_change"] = calibration_change(req, model, job.uncalibrated_cluster,
                                                       res, profile)
        header += "\n" + doc["calibration_change"]["summary"]
    if req.inputs.exclude_flagged:
        doc["exclusion"] = exclusion_effect(req, model, cluster, res, space, profile)
        header += "\n" + doc["exclusion"]["summary"]
    written = []
    if req.out:
        written = write_search_outputs(req.out, model, used, res, header, req.force,
                                       document=doc)
    return SearchOutcome(result=res, header=header, document=doc, nodes=used.num_nodes,
                         written=written)


def mechanisms_line(res: SearchResult) -> str:
    """The line naming the recipe mechanisms the search turned on in plan 1 (and those it
    chose that plan 1 runs without)."""
    on = res.mechanisms_of(res.plans[0].plan)
    bare = {name.split(" ")[0] for name in on}
    off = [name for name in res.mechanisms if name not in bare]
    return (f"mechanisms turned on in plan 1: {', '.join(on) or 'none'}"
            + (f"; chosen where they apply, not in plan 1: {', '.join(off)}" if off else ""))


def _short(plan) -> str:
    return (f"tp {plan.tp} pp {plan.pp} dp {plan.dp} cp {plan.cp} mbs "
            f"{plan.micro_batch_size} recompute {plan.recompute}")


def calibration_change(req: SearchRequest, model, base, res: SearchResult,
                       profile=None) -> dict:
    """How the calibration (``req.inputs.calibration``) changed the ranking of a search
    kept with its ranking: every feasible plan priced again in closed form on ``base``, the
    cluster with the presets' figures
    (:attr:`configurator.app.inputs.ResolvedJob.uncalibrated_cluster`); the uncalibrated
    best's rank under the calibration and the calibrated best's rank without it (ranks from
    1, closed form), with ``summary`` a line saying so."""
    from configurator.cost.iteration import iteration_time
    from configurator.search.engine import in_chunks

    cand, t_cal = res.ranked, res.ranked_time_s
    t_unc = in_chunks(cand, lambda c, _rows: iteration_time(model, base, c, profile=profile)[
        "iteration_time_s"])
    old = int(np.argmin(t_unc))
    best = res.plans[0].plan
    # the ranked plan of the best one: its per-candidate fields (the search may have applied
    # a per-plan mechanism to the best, configurator.search.mechanisms.plan_variants)
    new = next((i for i in range(min(len(cand), 4 * RERANK_K))
                if all(getattr(cand.plan(i), f.name) == getattr(best, f.name)
                       for f in COLUMN_FIELDS)), 0)
    old_rank = 1 + int(np.sum(t_cal < t_cal[old]))
    new_rank = 1 + int(np.sum(t_unc < t_unc[new]))
    out = {"uncalibrated_best": cand.plan(old).to_dict(), "uncalibrated_best_rank": old_rank,
           "calibrated_best_rank_uncalibrated": new_rank,
           "uncalibrated_best_time_s": {"uncalibrated": float(t_unc[old]),
                                        "calibrated": float(t_cal[old])},
           "calibrated_best_time_s": {"uncalibrated": float(t_unc[new]),
                                      "calibrated": float(t_cal[new])}}
    if old == new or old_rank == 1:
        out["summary"] = (f"calibration {req.inputs.calibration}: the best plan is the same "
                          f"as without it ({_short(best)}; closed form {t_unc[new]:.3f} s "
                          f"-> {t_cal[new]:.3f} s)")
    else:
        out["summary"] = (f"calibration {req.inputs.calibration} changed the ranking: the "
                          f"best without it ({_short(cand.plan(old))}) ranks #{old_rank} "
                          f"here ({t_unc[old]:.3f} s -> {t_cal[old]:.3f} s, closed form); "
                          f"this best ranked #{new_rank} without it ({t_unc[new]:.3f} s -> "
                          f"{t_cal[new]:.3f} s)")
    return out


def nodes_note(inputs: JobInputs, cluster) -> str:
    """`` (N nodes: the cluster's default; --nodes to change)`` when the node count was not
    given (nor ``gpus``, nor taken from a measured topology), else empty: a defaulted count
    is stated."""
    if inputs.nodes is not None or inputs.gpus is not None or inputs.topology:
        return ""
    return f" ({cluster.num_nodes} nodes: the cluster's default; --nodes N to change)"


def search_document(model, cluster, res: SearchResult) -> dict:
    """The JSON of a search (``search --json``, ``plans.json``): the model and the cluster
    searched (as a plan document has them), then the ranked plans and the search's counts.
    Entry ``N`` of ``plans`` with them is a plan document (:func:`plans_entry_document`)."""
    return {"model": model.to_dict(), "cluster": cluster.to_dict(), **res.to_dict()}


def ranked_search(req: SearchRequest, model, cluster, space: SearchSpace, top: int, *,
                  keep_ranking: bool = False, exclude_flagged: bool | None = None,
                  nodes: int | None = None, profile=None, rerank: int | None = None):
    """The search of ``req`` on ``cluster``: ``(result, cluster searched)``. With a topology
    the result's plans carry their placement (``exclude_flagged`` and ``nodes`` override the
    request's). ``profile``: the layer profile :func:`resolve` gave, or None. ``rerank``:
    the closed form's best the simulated schedule re-ranks (default the search's)."""
    kw = dict(req.search_kwargs, top_k=top, space=space, keep_ranking=keep_ranking,
              max_memory_fraction=req.max_memory_fraction, profile=profile,
              **({} if rerank is None else {"rerank": rerank}))
    if not req.inputs.topology:
        return search(model, cluster, req.global_batch_size, **kw), cluster
    inputs = req.inputs if nodes is None else dataclasses.replace(req.inputs, nodes=nodes)
    pool, n, _ = host_pool(inputs, cluster, exclude_flagged=exclude_flagged)
    used = cluster.subset(sorted(host_health_order(cluster, pool)[:n]))
    res = search(model, used, req.global_batch_size, **kw)
    return place_search_result(model, cluster, res, pool=pool,
                               time_budget_s=req.placement_time_s,
                               max_evaluations=req.placement_evaluations, seed=req.seed,
                               random_samples=req.random_placements, profile=profile), used


def search_on_fewer_hosts(sreq, model, cluster, space, top: int, *,
                          exclude_flagged: bool | None = None, nodes: int | None, **kw):
    """``((result, cluster used), why)``: the placed search of ``sreq`` on the measured
    hosts (all of them, or those the audit does not flag with ``exclude_flagged``). When
    ``nodes`` is not given and no tp·pp·cp·dp layout of that many GPUs takes the batch
    (e.g. 13 hosts, 104 GPUs, global batch 128), the most hosts that have a legal layout
    are used instead (as ``--nodes-range`` would try them, from the most down) and ``why``
    says so; else ``why`` is ``""``. Raises :class:`InputError` naming the flags that would
    give a plan when no count of hosts has one, :class:`NoFeasiblePlanError` when legal
    plans exist but none fits. ``kw``: :func:`ranked_search`'s own (``keep_ranking``,
    ``profile``)."""
    if not sreq.inputs.topology:
        return ranked_search(sreq, model, cluster, space, top, **kw), ""
    try:
        return ranked_search(sreq, model, cluster, space, top,
                             exclude_flagged=exclude_flagged, **kw), ""
    except InputError as err:
        if nodes is not None or err.field != "global_batch_size":
            raise
    pool, _, _ = host_pool(sreq.inputs, cluster, exclude_flagged=exclude_flagged)
    gpn = cluster.gpus_per_node
    for n in range(len(pool) - 1, 0, -1):
        try:
            found = ranked_search(sreq, model, cluster, space, top,
                                  exclude_flagged=exclude_flagged, nodes=n, **kw)
        except InputError as err:
            if err.field != "global_batch_size":
                raise
            continue
        return found, (f"no legal layout of all {len(pool)} hosts ({len(pool) * gpn} GPUs) "
                       f"for global batch {sreq.global_batch_size}: {n} is the most hosts "
                       f"with one (--nodes N to choose, --gbs to change the batch)")
    raise InputError("global_batch_size", sreq.global_batch_size,
                     f"no legal plan on any 1..{len(pool)} of the measured hosts (no "
                     f"tp*pp*cp*dp layout takes the batch under the search restrictions): "
                     f"another --gbs gives one") from None


def exclusion_effect(req: SearchRequest, model, cluster, res: SearchResult,
                     space: SearchSpace, profile=None) -> dict:
    """Compare the best plan without the flagged hosts with the best on every host
    (``profile``: the layer profile, or None)."""
    pool, _, flagged = host_pool(req.inputs, cluster)
    best = res.plans[0]
    kept = best.plan.world_size
    out = {"excluded_hosts": flagged, "gpus_kept": kept, "gpus_all": cluster.num_gpus,
           "iteration_time_s": best.iteration_time_s,
           "tokens_per_s": best.tokens_per_s_per_gpu * kept}
    try:
        alls, _ = ranked_search(req, model, cluster, space, 1, exclude_flagged=False,
                          nodes=cluster.num_nodes, profile=profile)
        a = alls.plans[0]
        out["all_hosts_iteration_time_s"] = a.iteration_time_s
        out["all_hosts_tokens_per_s"] = a.tokens_per_s_per_gpu * cluster.num_gpus
        change = 100 * (best.iteration_time_s / a.iteration_time_s - 1)
        out["summary"] = (f"excluding {', '.join(flagged) or 'no host'}: best iteration "
                          f"{best.iteration_time_s:.3f} s on {kept} GPUs vs "
                          f"{a.iteration_time_s:.3f} s on all {cluster.num_gpus} GPUs "
                          f"({change:+.1f} %)")
    except (InputError, NoFeasiblePlanError) as err:
        out["summary"] = (f"excluding {', '.join(flagged) or 'no host'}; with all hosts no "
                          f"plan: {err}")
    return out


@dataclass(frozen=True, kw_only=True)
class EstimateRequest:
    """``configurator estimate``: inputs and the plan's fields as given (``None``: the
    default the field's help states; ``dp`` is derived from the GPU count)."""

    inputs: JobInputs
    fields: dict
    placement: str = "default"
    placement_time_s: float = 60.0
    placement_evaluations: int = 1000
    seed: int = 0
    #: where to save the plan document (``plan.json`` schema), or None
    out: str | None = None
    force: bool = False


@dataclass(frozen=True, kw_only=True)
class EstimateOutcome:
    """The estimate, its title line and the plan document's path when one was saved."""

    evaluation: Evaluation
    title: str
    written: str | None = None


def split_note(fields: dict, plan) -> str:
    """``; layer split chosen: …`` when the split was chosen for the user, else empty."""
    given = any(fields.get(k) for k in SPLIT_FIELDS if k not in ("pp", "vp"))
    if given or not plan.custom_layer_split:
        return ""
    if plan.pipeline_model_parallel_layout:
        return "; layer split chosen: layout " + plan.pipeline_model_parallel_layout
    words = [f"first={plan.decoder_first_pipeline_num_layers}",
             f"last={plan.decoder_last_pipeline_num_layers}"] if (
        plan.decoder_first_pipeline_num_layers or plan.decoder_last_pipeline_num_layers) else [
        w for w, on in (("account_for_embedding", plan.account_for_embedding_in_pipeline_split),
                        ("account_for_loss", plan.account_for_loss_in_pipeline_split)) if on]
    return "; layer split chosen: " + " ".join(words)


def seq_note(model) -> str:
    """``", seq N (why)"`` for a model whose sequence length was chosen for the user (a
    Hugging Face config's: :attr:`ModelSpec.seq_length_note`), else ``""``."""
    note = model.seq_length_note
    return f", seq {model.seq_length}{note}" if note else ""


def routing_note(model, plan) -> str:
    """``"; routing: …"`` for an MoE plan whose routing leaves the expert ranks
    uneven: the busiest rank's share of the routed tokens over the even one
    (:func:`configurator.core.plan_terms.routed_load_share`) and how the model's router
    balances (:func:`~configurator.core.plan_terms.router_balance`); else ``""`` (a share of
    at most 1: no expert parallelism, forced balance; experts padded to their capacity, which
    every rank runs)."""
    if not model.is_moe or plan.moe_pad_expert_input_to_capacity:
        return ""
    share = float(np.ravel(routed_load_share(PlanBatch.from_plan(plan), model))[0])
    if share <= 1.0:
        return ""
    how = ("evens every batch" if router_balance(model) == "per_batch"
           else "balances the global batch only")
    why = [f"the router {how}: moe_router_load_balancing_type "
           f"{model.moe_router_load_balancing_type}"
           + (" with the expert bias" if model.moe_router_enable_expert_bias else "")]
    if plan.moe_expert_capacity_factor > 0:
        why.insert(0, f"capacity factor {plan.moe_expert_capacity_factor:g}, tokens beyond "
                      "it dropped")
    return (f"; routing: the busiest of {plan.ep} expert ranks takes {share:.2f}x the even "
            f"share ({'; '.join(why)})")


def run_estimate(req: EstimateRequest) -> EstimateOutcome:
    """Memory per stage and iteration time of one plan (also one that does not fit).

    With a topology the plan runs on ``nodes`` of its hosts placed by ``req.placement``:
    ``default`` (Megatron's order on the first hosts), ``optimized`` (the placement search,
    ``placement_time_s``, ``seed``) or a file (a plan.json with a ``placement``, or a
    mapping with ``hosts`` and ``gpu_order``); the result carries the placement record."""
    from launchers import check_out_file

    job = resolve(req.inputs, precision=req.fields.get("precision") or "bf16")
    model, cluster, profile = job.model, job.cluster, job.profile
    if req.out:
        check_out_file(req.out, req.force)
    if not req.inputs.topology:
        if req.placement != "default":
            raise InputError("placement", req.placement, "needs --topology FILE")
        plan = best_layer_split(model, cluster, plan_for_world(req.fields, cluster.num_gpus),
                                profile)
        e = with_intervals(model, cluster, [evaluate_plan(model, cluster, plan,
                                                          profile=profile)], profile)[0]
        title = (f"{model.name} on {cluster.num_nodes} x {cluster.gpus_per_node} "
                 f"{cluster.gpu.name} ({cluster.name})" + nodes_note(req.inputs, cluster)
                 + seq_note(model) + split_note(req.fields, plan)
                 + routing_note(model, plan))
        return EstimateOutcome(evaluation=e, title=title,
                               written=_save_plan(req, model, cluster.to_dict(), e))
    check_placement_options(req)
    pool, nodes, _ = host_pool(req.inputs, cluster)
    plan = best_layer_split(model, cluster,
                            plan_for_world(req.fields, nodes * cluster.gpus_per_node), profile)
    method, hosts, order = req.placement, None, None
    if method not in ("default", "optimized"):
        hosts, order = placement_on_cluster(v.load_mapping_file("placement", method), cluster,
                                            nodes)
        method = "file"
    try:
        placed = place_plan(model, cluster, plan, pool=pool, method=method, node_hosts=hosts,
                            gpu_order=order, time_budget_s=req.placement_time_s,
                            max_evaluations=req.placement_evaluations, seed=req.seed,
                            profile=profile)
    except ValueError as err:
        raise InputError("placement", req.placement, str(err)) from None
    e = with_intervals(model, cluster, [evaluate_plan(model, cluster, plan, placed=placed,
                                                      profile=profile)], profile)[0]
    pl = e.placement
    title = (f"{model.name} on {nodes} of {cluster.num_nodes} x {cluster.gpus_per_node} "
             f"{cluster.gpu.name} ({cluster.name}){seq_note(model)}, placement {pl.method}: "
             f"{pl.iteration_time_s:.3f} s vs {pl.default_iteration_time_s:.3f} s default, "
             f"random median {pl.random_median_iteration_time_s:.3f} s"
             + routing_note(model, plan))
    used = dict(cluster.to_dict(), nodes=nodes, num_gpus=nodes * cluster.gpus_per_node)
    return EstimateOutcome(evaluation=e, title=title, written=_save_plan(req, model, used, e))


def _save_plan(req: EstimateRequest, model, cluster: dict, e: Evaluation) -> str | None:
    """Write the plan document of ``e`` to ``req.out`` (with its placement, if placed);
    returns the path, or None without ``req.out``."""
    if not req.out:
        return None
    from configurator.core import jsonout
    from configurator.core.document import plan_document
    from launchers import write_text_file

    doc = plan_document(model=model, cluster=cluster, plan=e.plan, estimate=e.to_dict(),
                        placement=e.placement)
    return write_text_file(req.out, jsonout.dumps(doc, indent=2) + "\n", req.force)


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """``configurator launch``: a plan document, where to write, data and tokenizer.

    ``nodes``: if given, must equal the plan's node count (a plan for another count is
    another plan: re-plan with ``search --nodes``). ``data_path``: the words of Megatron's
    ``--data-path``: one path, or a blend (several paths, or weights and paths alternating:
    ``("0.3", "/a", "0.7", "/b")``); it requires ``tokenizer_model``. None: mock data."""

    plan_path: str
    out: str
    nodes: int | None = None
    data_path: str | tuple[str, ...] | None = None
    tokenizer_model: str | None = None
    force: bool = False


@dataclass(frozen=True, kw_only=True)
class LaunchOutcome:
    """The scripts written, a line saying which placement they enforce, and how to start
    the job (:func:`launchers.start_instructions`)."""

    paths: list[str]
    placement: str
    next_steps: list[str] = field(default_factory=list)


def run_launch(req: LaunchRequest) -> LaunchOutcome:
    """Write the torchrun and SLURM scripts of a saved plan document, enforcing its placement
    when it has one (host → node_rank table, per-node GPU order, hosts left out); returns
    the paths. Nothing is written when an input is refused (the scripts are rendered
    first); the output directory and files must not be symbolic links."""
    from launchers import start_instructions, write_launch_files

    doc = read_plan_document(v.load_mapping_file("plan", req.plan_path))
    plan = doc.plan
    if req.nodes is not None:
        v.int_in_range("nodes", req.nodes)
        if req.nodes != doc.nodes:
            raise InputError("nodes", req.nodes, f"the plan was made for {doc.nodes} nodes "
                             f"of {doc.gpus_per_node} GPUs; a plan for {req.nodes} nodes is "
                             f"another plan: run configurator search --nodes {req.nodes}")
    check_out(req.out, LAUNCH_FILES, req.force)
    paths = write_launch_files(req.out, doc.model, plan, nodes=doc.nodes,
                               gpus_per_node=doc.gpus_per_node, force=req.force,
                               data_path=req.data_path, tokenizer_model=req.tokenizer_model,
                               summary=script_summary(doc.estimate), placement=doc.placement,
                               training=checkpoint_args(doc.estimate))
    if doc.placement:
        line = "placement: " + doc.placement.describe()
    elif doc.nodes == 1:
        line = "placement: none recorded (one node; GPUs in CUDA_VISIBLE_DEVICES order)"
    else:
        line = ("placement: none recorded (each node passes its node rank; MASTER_ADDR must "
                "name node_rank 0)")
    steps = start_instructions(req.out, nodes=doc.nodes, placed=doc.placement is not None,
                               data=req.data_path is not None, plan_file=req.plan_path)
    return LaunchOutcome(paths=list(paths.values()), placement=line, next_steps=steps)


#: Most node counts one ``--nodes-range`` may ask for.
MAX_SCALING_POINTS = 256


def parse_nodes_range(text: str, *, sample: bool = False) -> tuple[int, int]:
    """``"A:B"`` → ``(A, B)`` with ``1 <= A <= B``, at most :data:`MAX_SCALING_POINTS`
    counts (any number with ``sample``: :func:`scaling_counts` then samples the range).
    Raises :class:`InputError` (field ``nodes_range``)."""
    parts = str(text).split(":")
    try:
        lo, hi = (int(x) for x in parts)
    except ValueError:
        raise InputError("nodes_range", text, "must be A:B, two node counts") from None
    v.int_in_range("nodes_range", lo, key="nodes")
    v.int_in_range("nodes_range", hi, key="nodes")
    if lo > hi or (hi - lo + 1 > MAX_SCALING_POINTS and not sample):
        raise InputError("nodes_range", text, f"must have A <= B and at most "
                         f"{MAX_SCALING_POINTS} node counts" + ("" if lo > hi else
                         " (with --train-tokens a longer range is sampled)"))
    return lo, hi


def scaling_counts(lo: int, hi: int) -> list[int]:
    """The node counts a sweep of ``lo..hi`` prices: every count when there are at most
    :data:`MAX_SCALING_POINTS`, else ``lo``, ``hi`` and the powers of two between (a
    geometric sample, one count an octave)."""
    if hi - lo + 1 <= MAX_SCALING_POINTS:
        return list(range(lo, hi + 1))
    counts = {lo, hi}
    k = 1
    while k < hi:
        if k > lo:
            counts.add(k)
        k *= 2
    return sorted(counts)


@dataclass(frozen=True, kw_only=True)
class ScalingOutcome:
    """Best plan per node count: ``rows`` (one dict per count), the header, the JSON
    document and the files written."""

    rows: list[dict]
    header: str
    document: dict
    written: list[str] = field(default_factory=list)


SCALING_FILES = ("scaling.png", "scaling.json")
#: Plans of the closed form's ranking the simulated schedule re-ranks per node count in a
#: priced sweep (``--train-tokens``; the plain sweep: the search's
#: :data:`~configurator.search.rank.RERANK_K`): a day count does not hinge on the last
#: per cent of the iteration, and the sweep stays within seconds.
PRICED_SWEEP_RERANK = 4
#: What a priced sweep (``--train-tokens``) writes besides: days and cost against nodes,
#: and a report page with both plots and the table.
TRAINING_SCALING_FILES = ("training.png", "report.html")


def run_scaling(req: SearchRequest, lo: int, hi: int) -> ScalingOutcome:
    """The best plan of ``req`` for every node count ``lo..hi`` (placed, with a topology):
    iteration time, tokens/s and tokens/s per GPU, so a user sees where more nodes stop
    paying. A count with no plan gets a row saying why. With ``req.out``: ``scaling.png``
    (tokens/s and per-GPU tokens/s against nodes) and ``scaling.json``."""
    from configurator.core.progress import progress

    job = resolve(dataclasses.replace(req.inputs, nodes=None), precision=req.precision)
    model, cluster, profile = job.model, job.cluster, job.profile
    v.int_in_range("gbs", req.global_batch_size)
    check_placement_options(req)
    if not 0 < req.max_memory_fraction <= 1:
        raise InputError("max_memory_fraction", req.max_memory_fraction, "must be in (0, 1]")
    if req.inputs.topology:
        pool, _, _ = host_pool(dataclasses.replace(req.inputs, nodes=None), cluster)
        if hi > len(pool):
            raise InputError("nodes_range", f"{lo}:{hi}", f"must end at most at the "
                             f"{len(pool)} hosts the topology offers")
    train = training_inputs(req.training, job.training)
    if hi - lo + 1 > MAX_SCALING_POINTS and train is None:
        parse_nodes_range(f"{lo}:{hi}")      # refused: too many counts without a sample
    if req.out:
        check_out(req.out, SCALING_FILES + (TRAINING_SCALING_FILES if train else ()),
                  req.force)
    space = req.limits.space(model)
    rows = []
    counts = scaling_counts(lo, hi)
    for n in progress(counts, desc="nodes", unit="count"):
        row = {"nodes": n}
        try:
            rerank = None if train is None else PRICED_SWEEP_RERANK
            if req.inputs.topology:
                res, used = ranked_search(req, model, cluster, space, 1, nodes=n,
                                          profile=profile, rerank=rerank)
            else:
                cl = resolve(dataclasses.replace(req.inputs, nodes=n),
                             precision=req.precision).cluster
                res, used = ranked_search(req, model, cl, space, 1, profile=profile,
                                          rerank=rerank)
        except (InputError, NoFeasiblePlanError) as err:
            row.update(num_gpus=None, plan=None, iteration_time_s=None, tokens_per_s=None,
                       tokens_per_s_per_gpu=None, excluded_hosts=None, reason=str(err))
            rows.append(row)
            continue
        e = res.plans[0]
        gpus = e.plan.world_size
        row.update(num_gpus=gpus, plan=e.plan.to_dict(), iteration_time_s=e.iteration_time_s,
                   tokens_per_s=e.tokens_per_s_per_gpu * gpus,
                   tokens_per_s_per_gpu=e.tokens_per_s_per_gpu,
                   excluded_hosts=None if e.placement is None
                   else list(e.placement.excluded_hosts), reason=None)
        if train is not None:
            row["training"] = price_evaluation(model, used, e, train,
                                               req.global_batch_size).training.to_dict()
        rows.append(row)
    header = (f"{model.name} on {lo}..{hi} nodes of {cluster.gpus_per_node} "
              f"{cluster.gpu.name}, gbs {req.global_batch_size}, "
              f"seq {model.seq_length}{model.seq_length_note}, "
              f"{req.precision}: best plan per node count")
    if len(counts) < hi - lo + 1:
        header += (f" ({len(counts)} of the {hi - lo + 1} counts: {lo}, {hi} and the powers "
                   "of two between)")
    doc = {"scaling": rows}
    if train is not None:
        chosen = pick_scaling_row(rows, req.training.objective, req.training.deadline_days,
                                  train.gpu_hour_price is not None)
        summary = scaling_summary(rows)
        doc["training"] = {"inputs": train.to_dict(), "objective": req.training.objective,
                           "deadline_days": req.training.deadline_days,
                           "chosen_nodes": None if chosen is None else chosen["nodes"],
                           **summary}
        header += "\n" + objective_note(train, req.training)
        if chosen is not None:
            header += (f"; chosen: {chosen['nodes']} nodes; goodput per GPU is highest at "
                       f"{summary['best_goodput_per_gpu_nodes']} nodes; " + (
                           f"total goodput stops rising after "
                           f"{summary['goodput_stops_rising_after_nodes']} nodes"
                           if summary["goodput_stops_rising_after_nodes"] is not None
                           else "total goodput still rises at the last count"))
    written = []
    if req.out:
        from configurator.report.plot import scaling_png
        from launchers import FILE_MODE, write_files

        from configurator.core import jsonout

        first = header.split("\n")[0]
        files = {"scaling.json": (jsonout.dumps(doc, indent=2).encode(), FILE_MODE),
                 "scaling.png": (scaling_png(rows, title=first), FILE_MODE)}
        if train is not None:
            from configurator.report.plot import training_scaling_png
            from configurator.report.training_html import training_scaling_html

            png = training_scaling_png(rows, title=first)
            files["training.png"] = (png, FILE_MODE)
            files["report.html"] = (training_scaling_html(header, rows, png).encode(),
                                    FILE_MODE)
        write_files(req.out, files, force=req.force)
        written = list(files)
    return ScalingOutcome(rows=rows, header=header, document=doc, written=written)
