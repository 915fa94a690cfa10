"""Evaluate plans: memory per stage, iteration time, throughput (the ``estimate`` result)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from configurator.core.candidates import Candidates
from configurator.cost.flops import megatron_model_flops
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from configurator.core.rules import check_plan
from configurator.cost.iteration import BREAKDOWN_KEYS, iteration_time
from memory_model import MemoryBreakdown, estimate_memory


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """One plan's predicted figures (SI units)."""

    plan: ParallelPlan
    iteration_time_s: float
    time_breakdown_s: dict
    model_tflops_per_gpu: float
    mfu: float
    tokens_per_s_per_gpu: float
    peak_memory_bytes: float
    memory_capacity_bytes: float
    memory_per_stage: list[MemoryBreakdown] = field(default_factory=list)
    infeasible_reasons: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    def to_dict(self) -> dict:
        return {
            "config": self.plan.to_dict(),
            "iteration_time_s": self.iteration_time_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
            "memory_per_stage": [m.to_dict() for m in self.memory_per_stage],
            "time_breakdown_s": dict(self.time_breakdown_s),
            "infeasible_reasons": list(self.infeasible_reasons),
        }


def throughput(model: ModelSpec, global_batch_size: int, world_size, iteration_time_s,
               peak_flops_per_s: float):
    """(model TFLOP/s per GPU, MFU, tokens/s per GPU) from an iteration time (arrays ok)."""
    flops = megatron_model_flops(model, global_batch_size)
    per_gpu = flops / (np.asarray(iteration_time_s) * world_size)
    tokens = global_batch_size * model.seq_length / (np.asarray(iteration_time_s) * world_size)
    return per_gpu / 1e12, per_gpu / peak_flops_per_s, tokens


def evaluate_plan(model: ModelSpec, cluster, plan: ParallelPlan) -> Evaluation:
    """Estimate one plan on ``cluster`` (it need not fit). Raises InputError if Megatron
    would reject the plan (see :func:`configurator.core.plan.check_plan`)."""
    check_plan(model, plan, plan.world_size)
    peak = cluster.gpu.peak("fp16" if plan.precision == "fp16" else "bf16")
    cluster.gpu.peak(plan.precision)  # raises for fp8 on a GPU without it
    t = iteration_time(model, cluster, Candidates.from_plan(plan))
    stages = estimate_memory(model, plan)
    peak_mem = max(s.total_bytes for s in stages)
    it = float(t["iteration_time_s"][0])
    tflops, mfu, tokens = throughput(model, plan.global_batch_size, plan.world_size, it, peak)
    reasons = []
    if peak_mem > cluster.gpu.memory_bytes:
        worst = max(stages, key=lambda s: s.total_bytes)
        reasons.append(f"stage {worst.stage} needs {peak_mem / 2**30:.1f} GiB > "
                       f"{cluster.gpu.memory_bytes / 2**30:.1f} GiB")
    return Evaluation(plan=plan, iteration_time_s=it,
                      time_breakdown_s={k: float(t[k][0]) for k in BREAKDOWN_KEYS},
                      model_tflops_per_gpu=float(tflops), mfu=float(mfu),
                      tokens_per_s_per_gpu=float(tokens), peak_memory_bytes=peak_mem,
                      memory_capacity_bytes=cluster.gpu.memory_bytes,
                      memory_per_stage=stages, infeasible_reasons=tuple(reasons))
