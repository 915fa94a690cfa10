"""``configurator trial``: the few short runs that best settle a job's ranking.

For a job (model, cluster, global batch, nodes) the plans are those the search ranks (every
legal plan that fits, with the recipe mechanisms the search turns on where no option given
pins them: the ranking of its best plan's regime, :func:`configurator.search.rank.search`)
or those of a file the user can run (``plans``). Each plan's
sensitivity to the calibrated parameters (:data:`topology.calibration.PARAMETER_RANGES`) is
taken numerically from the same cost model: ``S[p, j] = d log T_p / d log x_j`` by a forward
step of :data:`LOG_STEP` (down for a fraction at its bound), every plan priced at once in
closed form (:func:`configurator.cost.iteration.iteration_time`). Before any run each
parameter is uncertain by ``σ_j``: its plausible range taken as ±2 σ in log
(:func:`prior_log_sd`).

The runs chosen (``k``, default 5):

1. **contenders**: the best plan and the next ones whose time is within the uncertainty of
   their difference from the best's, ``log T_p − log T_b ≤ 1.96 ‖(S_p − S_b) σ‖`` (the
   parameters move both plans, so the difference's uncertainty is what matters), at most
   ``k − probes``;
2. **probes**: for each parameter the contenders' ranking depends on (largest
   ``max_p |S_p − S_b|_j σ_j`` first), the plan that most lowers that parameter's variance
   given the runs already chosen: the Fisher information of the runs
   ``F = diag(σ⁻²) + Σ S_p S_pᵀ / NOISE_LOG²`` and the drop of ``(F⁻¹)_jj`` by one more run
   (Sherman-Morrison), every plan of the pool at once, among those at most
   :data:`PROBE_MAX_SLOWDOWN` times the best plan's time (the runs are short; the best's
   as it is shown, its fastest variant on the exact schedule, where that is shorter). Each probe
   is named by the parameter it pins (host-bound, GEMM-bound, attention-bound,
   communication-heavy). A parameter no plan informs is passed over. In a second pass a
   parameter whose information one chosen run carries (more than ``calibrate``'s
   :data:`~configurator.app.calibrate_jobs.MAX_ONE_RUN_SHARE` of it: ``calibrate`` would
   not fit it) gets a second run, the plan left whose time moves most with it: at the
   value the runs find, a plan that says little at the presets may be as host-bound as the
   first (the one-GPU trial: mbs 1 without recompute beside mbs 1 with full recompute).

Each chosen plan then runs as the search's shortlist would price it
(:func:`fastest_variant`), and the contenders stand in the order of that plan's exact-schedule
time, with their percentages from it.

The scripts are :func:`launchers.launch_files`' (mock data, ``iterations`` iterations,
logging every one), one directory per run, with the SLURM job named ``trialN`` so that its
log (``sbatch --output``) is the Megatron-LM log ``configurator calibrate`` reads. An MoE
plan that routes by its scores runs with the router's balance forced (:func:`trial_plan`).

With a measured topology (``--topology``) the job is the topology's first ``nodes`` hosts on
their measured links (:func:`trial_job`): the plans are priced and the runs chosen there, the
scripts pinned to those hosts in node_rank order (their logs name them: the scripts print
them before Megatron starts), and the next step calibrates and searches with the topology,
so that the runs are chosen, run and fitted on the same links (a log naming no hosts would
be priced on the topology's first ones too). The link efficiencies are then not among the
parameters the runs settle.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from configurator.app.calibrate_jobs import (MAX_ONE_RUN_SHARE, NOISE_LOG, default_parameters,
                                            fittable)
from configurator.app.inputs import JobInputs, resolve_uncalibrated
from configurator.app.plan_jobs import SearchLimits
from configurator.core import validate as v
from configurator.core.plan_batch import PlanBatch
from configurator.core.errors import InputError
from configurator.core.plan import (SEARCH_OPTIONS, describe_search_options, plan_from_dict,
                                    search_option_words, search_options)
from configurator.core.rules import check_plan
from configurator.cost.communication import comm_figures, expert_comm_figures
from configurator.cost.iteration import iteration_time
from configurator.search.evaluate import evaluate_plan
from configurator.search.engine import in_chunks
from configurator.search.mechanisms import Regime, mechanisms_on, plan_variants
from configurator.search.rank import search
from memory_model.estimate import DEFAULT_MAX_MEMORY_FRACTION
from topology.calibration import (PARAMETER_RANGES,
                                  parameter_value, with_link_parameters, with_parameters)

#: Step of the numerical sensitivity, in log of the parameter.
LOG_STEP = 0.1
#: Default number of runs, and of iterations each.
DEFAULT_RUNS = 5
DEFAULT_ITERATIONS = 30
#: What a run that pins each parameter is called.
PROBE_KIND = {"gemm": "GEMM-bound", "gemm_fp8": "GEMM-bound", "gemm_mxfp8": "GEMM-bound",
              "flash_attention": "attention-bound", "host_op_us": "host-bound",
              "intra_node_efficiency": "communication-heavy (NVLink)",
              "inter_node_efficiency": "communication-heavy (network)"}


#: A probe's predicted iteration time at most this many times the best plan's: the runs are
#: short, and a probe ten times slower than the plan it helps rank would cost more GPU time
#: than the contenders together (a host-bound plan of 64 microbatches at full recompute can
#: run 30-40 times slower than the best).
PROBE_MAX_SLOWDOWN = 4.0
#: Why a trial of an MoE plan forces the router's balance (:func:`trial_plan`).
FORCED_BALANCE_NOTE = (
    "the MoE runs route with --moe-router-force-load-balancing: a router a few dozen "
    "iterations from initialisation does not spread tokens as the trained router does (its "
    "busiest expert rank sets the pace), so its time would fold that transient into the "
    "calibrated efficiencies; the search prices the trained router's spread on top of what "
    "these runs measure")


def trial_plan(model, plan):
    """The plan a short trial runs for ``plan``: the same, except that an MoE plan whose
    experts are not padded to their capacity routes with its balance forced
    (``moe_router_force_load_balancing``: Megatron's benchmarking switch, every expert its
    even share). A router a few dozen iterations from initialisation routes neither as the
    trained router the model prices for routed plans does
    (:func:`configurator.core.plan_terms.expert_load_imbalance`) nor evenly, and the spread
    matters: the Megatron MoE Model Zoo ran Qwen3-235B-A22B from its released checkpoint on
    256 H100 dropless at 237, 277, 320 and 357 TFLOP/s per GPU against 295, 335, 368 and 389
    with forced balance (sequence 16k to 128k; yanring/Megatron-MoE-ModelZoo
    best_practice/Qwen3/readme.md at b0b92ff, 'Long Context'), 9-24 % more time. Forced, the
    runs measure what the calibrated parameters describe, and ``calibrate`` prices them as
    forced (the log's arguments say so); the router's spread is added back for the routed
    plan. Padded experts run at their capacity either way: unchanged."""
    if (not model.is_moe or plan.moe_router_force_load_balancing
            or plan.moe_pad_expert_input_to_capacity):
        return plan
    return dataclasses.replace(plan, moe_router_force_load_balancing=True)


def prior_log_sd(name: str) -> float:
    """σ of ``log x`` before any run: the plausible range taken as ±2 σ."""
    lo, hi, _ = PARAMETER_RANGES[name]
    return (math.log(hi) - math.log(lo)) / 4


@dataclass(frozen=True, kw_only=True)
class TrialRequest:
    """``configurator trial``: the job, the plan settings every plan carries (``options``,
    as ``search``'s), an optional file of plans the user can run, or the limits of the
    search that finds them, how many runs and iterations, and where to write the
    scripts."""

    inputs: JobInputs
    global_batch_size: int
    options: Mapping[str, Any] = field(default_factory=dict)
    plans: str | None = None
    runs: int = DEFAULT_RUNS
    iterations: int = DEFAULT_ITERATIONS
    out: str | None = None
    force: bool = False
    #: the search's limits (:class:`~configurator.app.plan_jobs.SearchLimits`; not with
    #: ``plans``)
    limits: SearchLimits = field(default_factory=SearchLimits)


@dataclass(frozen=True, kw_only=True)
class TrialRun:
    """One chosen run: its plan (as the trial runs it, :func:`trial_plan`), the predicted
    time of that run (s, the exact schedule: what its log should show) and of the plan as
    the job would run it (``job_iteration_time_s``: the trained router's spread where the
    trial forces the balance; the time the ranking and the contenders' percentages are
    about), why it was chosen (``contender`` or ``probe``), the parameter it pins (probes),
    and its sensitivities ``d log T / d log x`` per parameter (those the choice was made on:
    the plan as the search's ranking holds it, before :func:`fastest_variant`)."""

    index: int
    plan: Any
    predicted_iteration_time_s: float
    job_iteration_time_s: float
    role: str
    reason: str
    sensitivity: dict
    directory: str | None = None

    def to_dict(self) -> dict:
        return {"index": self.index, "role": self.role, "reason": self.reason,
                "predicted_iteration_time_s": self.predicted_iteration_time_s,
                "job_iteration_time_s": self.job_iteration_time_s,
                "sensitivity": self.sensitivity, "directory": self.directory,
                "plan": self.plan.to_dict()}


@dataclass(frozen=True, kw_only=True)
class TrialOutcome:
    """The runs, the pool they were chosen from, each parameter's σ (log) before and after
    the runs (the Fisher information of the chosen runs), the files written, the next
    step's commands and, with a topology, the hosts the runs are pinned to (node_rank
    order; None without)."""

    runs: list[TrialRun]
    pool: int
    contenders: int
    sd_before: dict
    sd_after: dict
    written: list[str]
    next_steps: list[str]
    header: str
    notes: list[str] = field(default_factory=list)
    hosts: tuple[str, ...] | None = None

    def to_dict(self) -> dict:
        return {"runs": [r.to_dict() for r in self.runs], "pool": self.pool,
                "contenders": self.contenders, "log_sd_before": self.sd_before,
                "log_sd_after": self.sd_after, "written": self.written,
                "next_steps": self.next_steps, "header": self.header, "notes": self.notes,
                "hosts": None if self.hosts is None else list(self.hosts)}


def _load_plans(path: str, model, cluster, gbs: int) -> tuple[list, int]:
    """The plans of ``path``: a ``plans.json`` (``search --out``/``--json``: its entries'
    ``config``) or a YAML/JSON mapping ``plans: [plan, ...]`` (:meth:`ParallelPlan.to_dict`
    mappings), each checked against Megatron's rules, the cluster's GPU count and ``gbs``,
    and how many entries repeat an earlier plan (kept once: two runs of one plan settle
    nothing one run does not, and a plan beside its copy is no contender). Raises
    :class:`InputError` naming the entry and field."""
    data = v.load_mapping_file("plans", path)
    entries = data.get("plans")
    if not isinstance(entries, list) or not entries:
        raise InputError("plans", path, "must hold a non-empty list 'plans' (a plans.json "
                                        "of 'search --out', or plan mappings)")
    plans, seen = [], set()
    for i, e in enumerate(entries):
        where = f"plans[{i}]"
        cfg = e.get("config", e) if isinstance(e, Mapping) else e
        plan = plan_from_dict(cfg, where + ".")
        if plan.world_size != cluster.num_gpus:
            raise InputError(f"{where}.world_size", plan.world_size,
                             f"must be the job's {cluster.num_gpus} GPUs (--nodes)")
        if plan.global_batch_size != gbs:
            raise InputError(f"{where}.global_batch_size", plan.global_batch_size,
                             f"must be the job's --gbs {gbs}")
        check_plan(model, plan, plan.world_size)
        if plan not in seen:
            seen.add(plan)
            plans.append(plan)
    return plans, len(entries) - len(plans)


def _batches(plans) -> list[tuple[np.ndarray, PlanBatch]]:
    """Plans grouped by their shared (non-column) fields, each group one column store."""
    groups: dict = {}
    for i, p in enumerate(plans):
        groups.setdefault(repr(sorted(PlanBatch.from_plan(p).shared.items())), []).append(i)
    return [(np.array(ix), PlanBatch.from_plans([plans[i] for i in ix]))
            for ix in groups.values()]


def pool_times(model, cluster, pool, names: tuple[str, ...], values: Mapping[str, float]
               ) -> np.ndarray:
    """Closed-form iteration times (s) of every plan of ``pool`` (a :class:`PlanBatch` or
    a list of plans) with the parameters ``values`` in place of the cluster's."""
    cl = with_link_parameters(cluster.with_gpu(with_parameters(cluster.gpu, values, "trial")),
                              values)
    batches = [(None, pool)] if isinstance(pool, PlanBatch) else _batches(pool)
    n = len(pool)
    out = np.empty(n)
    for ix, cand in batches:
        def price(c, _rows, cl=cl):
            comm = comm_figures(cl, c) | expert_comm_figures(cl, c)
            return iteration_time(model, cl, c, comm=comm)["iteration_time_s"]
        t = in_chunks(cand, price)
        if ix is None:
            out[:] = t
        else:
            out[ix] = t
    return out


def fastest_variant(model, cluster, plan, mechanisms: tuple[str, ...]):
    """``plan`` (a plan of the search's ranking, carrying its regime's options) as the
    search's shortlist prices it: the fastest in closed form of its variants
    (:func:`configurator.search.mechanisms.plan_variants`: the per-plan mechanisms of
    ``mechanisms`` applied where they apply, each that only moves time switched off where
    that is faster); ``plan`` itself without mechanisms."""
    if not mechanisms:
        return plan
    regime = Regime(options={name: getattr(plan, name) for name in SEARCH_OPTIONS},
                    restrict={}, mechanisms=tuple(mechanisms))
    variants = plan_variants(model, cluster, plan, regime)
    if len(variants) == 1:
        return variants[0]
    return variants[int(np.argmin(pool_times(model, cluster, variants, (), {})))]


def sensitivities(model, cluster, pool, names: tuple[str, ...]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(times, S)``: the closed-form times of ``pool`` at the cluster's figures and
    ``S[p, j] = d log T_p / d log x_j`` by a step of :data:`LOG_STEP` (downwards where the
    step would leave the parameter's range)."""
    base = {n: parameter_value(cluster.gpu, n, cluster) for n in names}
    t0 = pool_times(model, cluster, pool, names, {})
    cols = []
    for n in names:
        lo, hi, _ = PARAMETER_RANGES[n]
        step = LOG_STEP if base[n] * math.exp(LOG_STEP) <= hi else -LOG_STEP
        x = min(max(base[n] * math.exp(step), lo), hi)
        t = pool_times(model, cluster, pool, names, {n: x})
        cols.append(np.log(t / t0) / math.log(x / base[n]))
    return t0, np.stack(cols, axis=1)


def difference_sd(S: np.ndarray, sd: np.ndarray, b: int) -> np.ndarray:
    """σ (log) of each plan's time relative to plan ``b``'s, ``‖(S_p − S_b) σ‖``: the
    parameters move both plans, so what they leave uncertain is the difference."""
    return np.sqrt((((S - S[b]) * sd) ** 2).sum(axis=1))


def contender_reason(time_s: float, best_s: float, diff_sd: float, best: bool) -> str:
    """Why a contender runs: the best plan (``best``), or its time over the best's with the
    95 % uncertainty of that difference (one decimal, so that a narrow one does not read
    ±0)."""
    if best:
        return "predicted best"
    return (f"{100 * (time_s / best_s - 1):+.1f} % vs the best, within the uncertainty of "
            f"the difference (±{196 * diff_sd:.1f} %)")


def by_job_time(chosen: list[tuple[int, str, str]], job_s: Mapping[int, float],
                S: np.ndarray, sd: np.ndarray) -> list[tuple[int, str, str]]:
    """``chosen`` (:func:`choose_runs`, picked on the closed form) with its contenders
    ordered, fastest first, by their exact-schedule times ``job_s`` (pool index → s), the
    times the output shows, and their reasons taken from those times; the probes after them
    as they were."""
    contenders = sorted((i for i, role, _ in chosen if role == "contender"),
                        key=lambda i: job_s[i])
    if not contenders:
        return chosen
    b = contenders[0]
    diff = difference_sd(S, sd, b)
    return ([(i, "contender", contender_reason(job_s[i], job_s[b], diff[i], i == b))
             for i in contenders] + [c for c in chosen if c[1] != "contender"])


def choose_runs(times: np.ndarray, S: np.ndarray, sd: np.ndarray, k: int,
                names: tuple[str, ...], best_s: float | None = None
                ) -> tuple[list[tuple[int, str, str]], int, np.ndarray]:
    """The module docstring's selection: ``([(pool index, role, reason)], contenders found,
    σ (log) of each parameter after the chosen runs)``. ``best_s``: the best plan's time as
    the runs are shown (its fastest variant on the exact schedule), where shorter than its
    closed-form time: a probe stays within :data:`PROBE_MAX_SLOWDOWN` times that."""
    n = len(times)
    order = np.argsort(times, kind="stable")
    b = int(order[0])
    logt = np.log(times)
    diff_sd = difference_sd(S, sd, b)
    close = [int(i) for i in order if logt[i] - logt[b] <= 1.96 * diff_sd[i]]
    probes_wanted = min(3, k - 1, len(names))
    n_top = max(1, min(len(close), k - probes_wanted))
    chosen = [(i, "contender", contender_reason(times[i], times[b], diff_sd[i], i == b))
              for i in close[:n_top]]
    F = np.diag(1.0 / sd ** 2)
    for i, *_ in chosen:
        F += np.outer(S[i], S[i]) / NOISE_LOG ** 2
    # which parameters decide the contenders' order
    spread = np.max(np.abs(S[[i for i in close[:max(n_top, 2)]]] - S[b]), axis=0) * sd
    wanted = [j for j in np.argsort(-spread, kind="stable")]
    taken = {i for i, *_ in chosen}
    shortest = times[b] if best_s is None else min(times[b], best_s)
    too_long = times > PROBE_MAX_SLOWDOWN * shortest    # a probe is a short run too
    j_iter = iter(wanted * 2)
    probed: set[int] = set()
    while len(chosen) < min(k, n):
        j = next(j_iter, None)
        if j is None:
            break
        if j in probed:
            # calibrate fits no parameter one run carries (more than MAX_ONE_RUN_SHARE of its
            # squared sensitivity): where one run does, a second probe, the plan left whose
            # time moves most with the parameter
            w = S[[i for i, *_ in chosen], j] ** 2
            if w.sum() <= 0 or w.max() <= MAX_ONE_RUN_SHARE * w.sum():
                continue
            score = np.abs(S[:, j])
            score[list(taken)] = -1.0
            score[too_long] = -1.0
            i = int(np.argmax(score))
            if score[i] <= 0:
                continue
            F += np.outer(S[i], S[i]) / NOISE_LOG ** 2
            chosen.append((i, "probe", f"{PROBE_KIND.get(names[j], names[j])}: a second run "
                                       f"for {names[j]} (calibrate fits none on one run)"))
            taken.add(i)
            continue
        Finv = np.linalg.inv(F)
        G = S @ Finv                                  # [plans, params]
        denom = NOISE_LOG ** 2 + np.einsum("ij,ij->i", G, S)
        gain = G[:, j] ** 2 / denom                   # drop of (F^-1)_jj by each plan
        gain[list(taken)] = -1.0
        gain[too_long] = -1.0
        i = int(np.argmax(gain))
        if gain[i] <= 0:        # no plan of the pool tells this one: the next parameter
            continue
        before = math.sqrt(Finv[j, j])
        F += np.outer(S[i], S[i]) / NOISE_LOG ** 2
        after = math.sqrt(np.linalg.inv(F)[j, j])
        chosen.append((i, "probe", f"{PROBE_KIND.get(names[j], names[j])}: pins {names[j]} "
                                   f"(log σ {before:.2f} -> {after:.2f})"))
        taken.add(i)
        probed.add(j)
    sd_after = np.sqrt(np.diag(np.linalg.inv(F)))
    return chosen, len(close), sd_after


def trial_job(inputs: JobInputs) -> tuple[Any, Any, tuple[str, ...] | None]:
    """``(model, cluster, hosts)`` of a trial. Without a topology: the cluster's ``nodes``
    nodes on its nominal links, ``hosts`` None. With one (``inputs.topology``): ``nodes``
    (default every host it may use) on the links of the topology's first ``nodes`` hosts
    (with ``inputs.exclude_flagged``, the first the topology's audit does not flag:
    :func:`configurator.app.inputs.host_pool`), ``hosts`` their names in node_rank order:
    the hosts the scripts pin and their logs name
    (:func:`configurator.app.validate_jobs.on_topology` prices the logs there), so that
    the runs are chosen, launched and then fitted on the same links. Raises
    :class:`InputError`."""
    from configurator.app.inputs import host_pool, load_measured_topology
    from configurator.app.validate_jobs import on_topology

    if not inputs.topology:
        job = resolve_uncalibrated(inputs)
        return job.model, job.cluster, None
    # the checks search makes (nodes, the measured GPU), and the hosts it may use
    whole = resolve_uncalibrated(inputs).cluster
    pool, nodes, _ = host_pool(inputs, whole)
    hosts = tuple(whole.hosts[i] for i in pool[:nodes])
    job = resolve_uncalibrated(dataclasses.replace(inputs, topology=None, nodes=nodes,
                                                   exclude_flagged=False))
    cluster = on_topology(job.cluster, load_measured_topology(inputs.topology), part=False,
                          hosts=hosts)
    return job.model, cluster, hosts


def run_trial(req: TrialRequest) -> TrialOutcome:
    """Choose the runs (module docstring) and, with ``req.out``, write their launch
    scripts. Raises :class:`InputError` (bad input) or
    :class:`~configurator.core.errors.NoFeasiblePlanError` (no plan fits)."""
    from launchers import TrainingArgs, check_out_dir, launch_files, write_files

    if isinstance(req.runs, bool) or not isinstance(req.runs, int) or not 1 <= req.runs <= 64:
        raise InputError("runs", req.runs, "must be in 1..64")
    if (isinstance(req.iterations, bool) or not isinstance(req.iterations, int)
            or not 10 <= req.iterations <= 10_000):
        raise InputError("iterations", req.iterations, "must be in 10..10000 (the log's "
                         "first iterations are warm-up)")
    v.int_in_range("gbs", req.global_batch_size)
    if req.inputs.calibration:
        raise InputError("calibration", req.inputs.calibration,
                         "trial chooses the runs that settle the presets' figures: not with "
                         "--calibration")
    options = search_options(**req.options)
    # the options given (not None) pin a setting; the search chooses the mechanisms of the
    # rest, as `search` does, so that the contenders are the plans it ranks
    given = {name: value for name, value in req.options.items() if value is not None}
    model, cluster, hosts = trial_job(req.inputs)
    # the parameters the runs settle: those calibrate fits by default (on measured links
    # not the link efficiencies)
    names = tuple(n for n in default_parameters(options["precision"])
                  if fittable(n, cluster.gpu, nominal_links=hosts is None))
    notes = []
    if hosts is not None:
        # the audit only on request (--exclude-flagged): on thousands of hosts it takes
        # longer than the trial itself
        which = (f"first {len(hosts)} hosts the audit does not flag"
                 if req.inputs.exclude_flagged else f"first {len(hosts)} host(s)")
        notes.append(f"the runs are pinned to the topology's {which} "
                     f"({', '.join(hosts)}) and chosen on their measured links; their "
                     f"logs name them, and calibrate --topology prices them there"
                     + ("" if req.inputs.exclude_flagged else
                        f"; a fault of theirs beyond the links would go into the calibrated "
                        f"figures: --exclude-flagged leaves out the hosts configurator audit "
                        f"--topology {shlex.quote(req.inputs.topology)} says to drain"))
    mechanisms: tuple[str, ...] = ()
    limits = req.limits.words()
    if req.plans and limits:
        raise InputError("plans", req.plans, f"gives the plans to choose among: not with "
                                             f"{' '.join(limits)} (restrict the file instead)")
    if req.plans:
        pool, repeats = _load_plans(req.plans, model, cluster, req.global_batch_size)
        plan_of = pool.__getitem__
        if repeats:
            notes.append(f"{repeats} of the {len(pool) + repeats} plans of {req.plans} repeat "
                         f"an earlier one: each plan is a candidate once")
    else:
        res = search(model, cluster, req.global_batch_size, top_k=1,
                     space=req.limits.space(model), keep_ranking=True,
                     max_memory_fraction=DEFAULT_MAX_MEMORY_FRACTION, **given, **req.limits.ddp)
        pool = res.ranked
        plan_of = pool.plan
        mechanisms = res.mechanisms
    times, S = sensitivities(model, cluster, pool, names)
    sd = np.array([prior_log_sd(n) for n in names])
    # each chosen run as the search's shortlist prices it; the best first, whose time as
    # shown bounds the probes'
    job_plan: dict = {}
    job_s: dict = {}

    def as_shown(i: int) -> float:
        if i not in job_s:
            job_plan[i] = fastest_variant(model, cluster, plan_of(i), mechanisms)
            job_s[i] = evaluate_plan(model, cluster, job_plan[i]).iteration_time_s
        return job_s[i]
    chosen, n_close, sd_after = choose_runs(times, S, sd, req.runs, names,
                                            as_shown(int(np.argmin(times))))
    for i, *_ in chosen:
        as_shown(i)
    chosen = by_job_time(chosen, job_s, S, sd)

    training = TrainingArgs(train_iters=req.iterations,
                            lr_warmup_iters=min(10, req.iterations // 3)).checked()
    runs, files = [], {}
    for k, (i, role, reason) in enumerate(chosen, start=1):
        ranked = job_plan[i]
        plan = trial_plan(model, ranked)
        if plan != ranked and FORCED_BALANCE_NOTE not in notes:
            notes.append(FORCED_BALANCE_NOTE)
        ev = evaluate_plan(model, cluster, plan) if plan != ranked else None
        run_s = job_s[i] if ev is None else ev.iteration_time_s
        d = f"trial{k}"
        summary = {"iteration_time_s": round(run_s, 3), "trial": f"{k} ({role})"}
        files[k] = launch_files(model, plan, nodes=cluster.num_nodes,
                                gpus_per_node=cluster.gpus_per_node, training=training,
                                summary=summary, job_name=d,
                                hosts=list(hosts) if hosts is not None else None)
        runs.append(TrialRun(index=k, plan=plan, predicted_iteration_time_s=run_s,
                             job_iteration_time_s=job_s[i], role=role, reason=reason,
                             sensitivity={n: round(float(S[i, j]), 4)
                                          for j, n in enumerate(names)},
                             directory=os.path.join(req.out, d) if req.out else None))
    on: list[str] = []
    for r in runs:
        on += [name for name in mechanisms_on(r.plan, mechanisms) if name not in on]
    on.sort(key=lambda name: mechanisms.index(name.split(" ")[0]))
    if on:
        notes.append("the runs carry the recipe mechanisms the search turns on where the "
                     "cluster allows them and no option says otherwise, as its plans do: "
                     + ", ".join(on))
    written = []
    job = _job_words(req)
    topology = (f" --topology {shlex.quote(req.inputs.topology)}" if req.inputs.topology
                else "")
    out = (req.out or "trial").rstrip("/") or "/"
    logs = os.path.join(out, "logs")
    torchrun = f"bash {shlex.quote(out)}/trialN/launch_torchrun.sh"
    tee = f"2>&1 | tee {shlex.quote(logs)}/trialN.log"
    nodes = cluster.num_nodes
    if hosts is not None and nodes == 1:
        # node_rank 0 given: a host named after its nvidia-smi file is no hostname
        by_hand = f"or on {hosts[0]}: {torchrun} 0 {tee}"
    elif hosts is not None:
        by_hand = (f"or on each of its {nodes} hosts, {' '.join(hosts)} (the script finds "
                   f"its node_rank from the hostname): {torchrun}, with `{tee}` on "
                   f"{hosts[-1]}, whose last rank prints the iteration times")
    elif nodes == 1:
        by_hand = f"or on its node: {torchrun} {tee}"
    else:
        # training_log's iteration lines come from the last rank, on node_rank nodes-1
        by_hand = (f"or on each of its {nodes} nodes, NODE_RANK 0..{nodes - 1}: "
                   f"MASTER_ADDR=<node_rank 0's address> "
                   f"{torchrun} NODE_RANK, with `{tee}` on node_rank {nodes - 1}, whose last "
                   f"rank prints the iteration times")
    next_steps = [
        f"run each (N = 1..{len(runs)}): MEGATRON_LM_DIR=/path/to/Megatron-LM sbatch "
        f"--output={shlex.quote(logs)}/trialN.log "
        f"{shlex.quote(out)}/trialN/launch_slurm.sbatch   ({by_hand})",
        f"configurator calibrate {shlex.quote(logs)}/*.log --cluster "
        f"{shlex.quote(req.inputs.cluster)}{topology} -o calib.yaml && configurator search "
        f"{job} --calibration calib.yaml"]
    if req.out:
        from configurator.core import jsonout
        from launchers import FILE_MODE

        doc = {"model": model.to_dict(), "cluster": cluster.to_dict(),
               "hosts": None if hosts is None else list(hosts),
               "runs": [r.to_dict() for r in runs]}
        top = {"trials.json": (jsonout.dumps(doc, indent=2).encode(), FILE_MODE)}
        check_out_dir(req.out, list(top) + [f"trial{r.index}" for r in runs], req.force)
        for r in runs:
            check_out_dir(r.directory, files[r.index], req.force)
        for r in runs:
            written += write_files(r.directory, files[r.index], force=req.force)
        written += write_files(req.out, top, force=req.force)
        if not os.path.lexists(logs):       # where the runs' logs go (never through a link)
            os.mkdir(logs)
    header = (f"{model.name} on {cluster.num_nodes}x{cluster.gpus_per_node} "
              f"{cluster.gpu.name}, gbs {req.global_batch_size}, seq {model.seq_length}, "
              f"{options['precision']}{describe_search_options(options)}: "
              f"{len(pool)} plans, {n_close} within the uncertainty of the best")
    return TrialOutcome(runs=runs, pool=len(pool), contenders=n_close,
                        sd_before={n: round(float(s), 3) for n, s in zip(names, sd)},
                        sd_after={n: round(float(s), 3) for n, s in zip(names, sd_after)},
                        written=written, next_steps=next_steps, header=header, notes=notes,
                        hosts=hosts)


def _job_words(req: TrialRequest) -> str:
    words = ["--model", req.inputs.model, "--cluster", req.inputs.cluster]
    if req.inputs.topology:
        words += ["--topology", req.inputs.topology]
    if req.inputs.exclude_flagged:
        words += ["--exclude-flagged"]
    if req.inputs.nodes is not None:
        words += ["--nodes", str(req.inputs.nodes)]
    if req.inputs.gpus is not None:
        words += ["--gpus", str(req.inputs.gpus)]
    words += ["--gbs", str(req.global_batch_size)]
    if req.inputs.seq_length is not None:
        words += ["--seq-length", str(req.inputs.seq_length)]
    words += search_option_words(req.options)
    words += req.limits.words()
    return " ".join(shlex.quote(w) for w in words)
