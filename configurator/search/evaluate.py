"""Evaluate plans: memory per stage, iteration time, throughput (the ``estimate`` result)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from configurator.core.plan_batch import PlanBatch
from configurator.core.document import PlacementRecord
from configurator.cost.flops import megatron_model_flops
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from configurator.core.rules import check_plan
from configurator.cost.iteration import BREAKDOWN_KEYS, BREAKDOWN_TERMS, iteration_time
from configurator.cost.placed import PlacedPlan, PlacedTime
from configurator.cost.training_time import TrainingEstimate
from configurator.core.plan_values import mfu_peak_precision
from memory_model import MemoryBreakdown, estimate_memory


#: Breakdown entry for what the simulated schedule on the placed ranks' links adds to (or
#: takes from) the closed form.
SCHEDULE_KEY = "schedule_and_placement"
#: Every term of ``Evaluation.time_breakdown_s`` with what it holds: the closed form's, then
#: the correction the simulated schedule makes (negative where it overlaps more).
TIME_TERMS = {**BREAKDOWN_TERMS,
              SCHEDULE_KEY: "a correction, not a cost: the simulated schedule on the ranks' "
                            "own links minus the closed form's terms (negative where the "
                            "simulation overlaps more than the closed form assumes)"}


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """One plan's predicted figures (SI units)."""

    plan: ParallelPlan
    iteration_time_s: float
    time_breakdown_s: dict
    model_tflops_per_gpu: float
    mfu: float
    tokens_per_s_per_gpu: float
    #: MFU against the dense peak of the plan's own precision (FP8 plans: the FP8 peak;
    #: ``mfu`` is always against the 16-bit peak)
    mfu_precision_peak: float | None = None
    peak_memory_bytes: float
    memory_capacity_bytes: float
    memory_per_stage: list[MemoryBreakdown] = field(default_factory=list)
    infeasible_reasons: tuple[str, ...] = ()
    closed_form_iteration_time_s: float | None = None
    placement: PlacementRecord | None = None
    time_per_stage: list[dict] = field(default_factory=list)
    #: the simulated iteration under the plan's placement, priced once (its ``recorded()``
    #: schedule draws the Gantt chart); not in :meth:`to_dict`
    schedule: PlacedTime | None = field(default=None, compare=False, repr=False)
    #: ``(lo, hi)`` seconds the measured time should fall within, and the plan's regime
    #: (:mod:`configurator.search.intervals`); None until intervals are attached
    iteration_time_interval_s: tuple[float, float] | None = None
    regime: str | None = None
    #: inside the best plan's interval (a search's ranking marks it)
    tie: bool = False
    #: time, cost and energy to train (``--train-tokens``;
    #: :class:`configurator.cost.training_time.TrainingEstimate`), or None
    training: TrainingEstimate | None = None

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    def to_dict(self) -> dict:
        return {
            "config": self.plan.to_dict(),
            "iteration_time_s": self.iteration_time_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "mfu_peak": mfu_peak_precision(self.plan.precision),
            "mfu_precision_peak": self.mfu_precision_peak,
            "mfu_precision": self.plan.precision,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
            "memory_per_stage": [m.to_dict() for m in self.memory_per_stage],
            "time_breakdown_s": dict(self.time_breakdown_s),
            "time_per_stage": [dict(t) for t in self.time_per_stage],
            "infeasible_reasons": list(self.infeasible_reasons),
            "closed_form_iteration_time_s": self.closed_form_iteration_time_s,
            "iteration_time_interval_s": (None if self.iteration_time_interval_s is None
                                          else list(self.iteration_time_interval_s)),
            "regime": self.regime,
            "tie": self.tie,
            **({"placement": self.placement.to_estimate_dict()}
               if self.placement is not None else {}),
            **({"training": self.training.to_dict()} if self.training is not None else {}),
        }


def throughput(model: ModelSpec, global_batch_size: int, world_size, iteration_time_s,
               peak_flops_per_s: float):
    """(model TFLOP/s per GPU, MFU, tokens/s per GPU) from an iteration time (arrays ok)."""
    flops = megatron_model_flops(model, global_batch_size)
    per_gpu = flops / (np.asarray(iteration_time_s) * world_size)
    tokens = global_batch_size * model.seq_length / (np.asarray(iteration_time_s) * world_size)
    return per_gpu / 1e12, per_gpu / peak_flops_per_s, tokens


def evaluate_plan(model: ModelSpec, cluster, plan: ParallelPlan, *,
                  placed: tuple[PlacementRecord, PlacedTime] | None = None,
                  measured: bool = False, profile=None,
                  closed_form: Mapping[str, float] | None = None) -> Evaluation:
    """Estimate one plan on ``cluster`` (it need not fit). Raises InputError if Megatron
    would reject the plan (see :func:`configurator.core.rules.check_plan`; ``measured``: the
    plan of a measured run, checked as that function says).

    The iteration time is the exact schedule simulated on the ranks' own links
    (:class:`configurator.cost.placed.PlacedPlan`) under Megatron's sequential mapping on
    the cluster's first hosts, or under a placement already priced: ``placed``, the
    ``(record, schedule)`` of :func:`configurator.search.placement_search.place_plan` (its
    schedule is used, not priced again; the record becomes ``placement``).
    ``time_breakdown_s`` is the closed form's (:func:`iteration_time`) plus
    ``schedule_and_placement``: what the exact schedule and the ranks' own links change
    against it, so the breakdown sums to the iteration time. ``profile``: measured layer
    times (:class:`configurator.core.profile.LayerProfile`) in place of the analytic layer
    compute, or None. ``closed_form``: the plan's :func:`iteration_time` terms where the
    caller has them (a search's batch gives the same floats), not computed again.
    """
    check_plan(model, plan, plan.world_size, measured=measured)
    one = PlanBatch.from_plan(plan)
    peak = cluster.gpu.peak(mfu_peak_precision(plan.precision))
    cluster.gpu.peak(plan.precision)  # raises for fp8 on a GPU without it
    t = ({k: np.asarray([v]) for k, v in closed_form.items()} if closed_form is not None
         else iteration_time(model, cluster, one, profile=profile))
    stages = estimate_memory(model, one, non_tn_fp8_gemm=cluster.gpu.non_tn_fp8_gemm)
    peak_mem = max(s.total_bytes for s in stages)
    closed = float(t["iteration_time_s"][0])
    if placed is None:
        priced = PlacedPlan(model, cluster, one, profile)
        placement, timed = None, priced.time(*priced.default_placement())
    else:
        placement, timed = placed
    it = timed.iteration_time_s
    breakdown = {k: float(t[k][0]) for k in BREAKDOWN_KEYS}
    breakdown[SCHEDULE_KEY] = it - closed
    tflops, mfu, tokens = throughput(model, plan.global_batch_size, plan.world_size, it, peak)
    reasons = []
    if peak_mem > cluster.gpu.memory_bytes:
        worst = max(stages, key=lambda s: s.total_bytes)
        reasons.append(f"stage {worst.stage} needs {peak_mem / 2**30:.1f} GiB > "
                       f"{cluster.gpu.memory_bytes / 2**30:.1f} GiB")
    return Evaluation(plan=plan, iteration_time_s=it,
                      time_breakdown_s=breakdown,
                      model_tflops_per_gpu=float(tflops), mfu=float(mfu),
                      mfu_precision_peak=float(mfu) * peak / cluster.gpu.peak(plan.precision),
                      tokens_per_s_per_gpu=float(tokens), peak_memory_bytes=peak_mem,
                      memory_capacity_bytes=cluster.gpu.memory_bytes,
                      memory_per_stage=stages, infeasible_reasons=tuple(reasons),
                      closed_form_iteration_time_s=closed, placement=placement,
                      time_per_stage=timed.stage_times(), schedule=timed)


def with_placement(model: ModelSpec, e: Evaluation, placement: PlacementRecord,
                   schedule: PlacedTime, peak_flops_per_s: float) -> Evaluation:
    """``e`` re-timed under ``placement`` (its ``iteration_time_s``) and ``schedule`` (its
    simulated iteration, from the same :func:`~configurator.search.placement_search.place_plan`):
    throughput, breakdown (``schedule_and_placement`` absorbs the change), per-stage times,
    the record and the schedule."""
    iteration_time_s = placement.iteration_time_s
    tflops, mfu, tokens = throughput(model, e.plan.global_batch_size, e.plan.world_size,
                                     iteration_time_s, peak_flops_per_s)
    breakdown = dict(e.time_breakdown_s)
    breakdown[SCHEDULE_KEY] = breakdown.get(SCHEDULE_KEY, 0.0) + (iteration_time_s
                                                                  - e.iteration_time_s)
    return dataclasses.replace(e, iteration_time_s=float(iteration_time_s),
                               time_breakdown_s=breakdown, model_tflops_per_gpu=float(tflops),
                               mfu=float(mfu), tokens_per_s_per_gpu=float(tokens),
                               mfu_precision_peak=None if e.mfu_precision_peak is None
                               else e.mfu_precision_peak * e.iteration_time_s
                               / float(iteration_time_s),
                               placement=placement, time_per_stage=schedule.stage_times(),
                               schedule=schedule)
