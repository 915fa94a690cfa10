"""Evaluate plans: memory per stage, iteration time, throughput (the ``estimate`` result)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from configurator.core.candidates import Candidates
from configurator.cost.flops import megatron_model_flops
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from configurator.core.rules import check_plan
from configurator.cost.iteration import BREAKDOWN_KEYS, BREAKDOWN_TERMS, iteration_time
from configurator.cost.placed import PlacedPlan
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
    placement: dict | None = None
    time_per_stage: list[dict] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    def to_dict(self) -> dict:
        return {
            "config": self.plan.to_dict(),
            "iteration_time_s": self.iteration_time_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "mfu_peak": "bf16" if self.plan.precision != "fp16" else "fp16",
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
            **({"placement": dict(self.placement)} if self.placement is not None else {}),
        }


def throughput(model: ModelSpec, global_batch_size: int, world_size, iteration_time_s,
               peak_flops_per_s: float):
    """(model TFLOP/s per GPU, MFU, tokens/s per GPU) from an iteration time (arrays ok)."""
    flops = megatron_model_flops(model, global_batch_size)
    per_gpu = flops / (np.asarray(iteration_time_s) * world_size)
    tokens = global_batch_size * model.seq_length / (np.asarray(iteration_time_s) * world_size)
    return per_gpu / 1e12, per_gpu / peak_flops_per_s, tokens


def evaluate_plan(model: ModelSpec, cluster, plan: ParallelPlan, *,
                  node_hosts=None, gpu_order=None, measured: bool = False) -> Evaluation:
    """Estimate one plan on ``cluster`` (it need not fit). Raises InputError if Megatron
    would reject the plan (see :func:`configurator.core.rules.check_plan`; ``measured``: the
    plan of a measured run, checked as that function says).

    The iteration time is the exact schedule simulated on the ranks' own links
    (:class:`configurator.cost.placed.PlacedPlan`) under the placement ``node_hosts`` /
    ``gpu_order`` (default: Megatron's sequential mapping on the cluster's first hosts).
    ``time_breakdown_s`` is the closed form's (:func:`iteration_time`) plus
    ``schedule_and_placement``: what the exact schedule and the ranks' own links change
    against it, so the breakdown sums to the iteration time.
    """
    check_plan(model, plan, plan.world_size, measured=measured)
    peak = cluster.gpu.peak("fp16" if plan.precision == "fp16" else "bf16")
    cluster.gpu.peak(plan.precision)  # raises for fp8 on a GPU without it
    t = iteration_time(model, cluster, Candidates.from_plan(plan))
    stages = estimate_memory(model, plan, non_tn_fp8_gemm=cluster.gpu.non_tn_fp8_gemm)
    peak_mem = max(s.total_bytes for s in stages)
    closed = float(t["iteration_time_s"][0])
    priced = PlacedPlan(model, cluster, plan)
    if node_hosts is None:
        node_hosts, gpu_order = priced.default_placement()
    timed = priced.time(node_hosts, gpu_order)
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
                      closed_form_iteration_time_s=closed, time_per_stage=timed.stage_times())


def with_placement(model: ModelSpec, e: Evaluation, placement: dict, iteration_time_s: float,
                   peak_flops_per_s: float, time_per_stage: list[dict]) -> Evaluation:
    """``e`` re-timed under a placement: its iteration time, throughput, breakdown
    (``schedule_and_placement`` absorbs the change), per-stage times and the ``placement``
    record."""
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
                               placement=dict(placement),
                               time_per_stage=[dict(t) for t in time_per_stage])
