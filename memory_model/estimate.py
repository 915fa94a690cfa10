"""Per-stage memory totals: weights, gradients, optimizer state, activations, overheads.

Bytes per parameter with mixed-precision Adam (Rajbhandari et al. 2020, ZeRO §3; Megatron-LM
theoretical_memory_usage.py; shared REFERENCE §3): 16-bit weights (2), gradients in the
main-grad buffer (4 in fp32 for bf16/fp8, since Megatron forces
``accumulate_allreduce_grads_in_fp32`` with bf16; 2 for fp16), fp32 master weights, Adam m
and v (12). The distributed optimizer shards the 12 over the data-parallel group (dp·cp ranks:
with context parallelism gradients are reduced over the combined dp-cp group). FP8
(Transformer Engine; ``fp8`` and ``mxfp8``) keeps an FP8 copy of the weights (+1 byte per
parameter).

Allowance (``other_bytes``): CUDA context with cuBLAS/cuDNN workspaces (≈ 1 GiB) plus NCCL
communicator buffers (≈ 1 GiB: NCCL_BUFFSIZE 4 MiB × channels × peers over a few groups),
and 10 % of activation bytes for caching-allocator fragmentation, a typical gap between
``torch.cuda.max_memory_reserved`` and ``max_memory_allocated`` in Megatron runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from configurator.core.model import ModelSpec
from configurator.core.plan import RECOMPUTE_CODES, ParallelPlan, is_fp8
from configurator.core.units import GiB
from memory_model.activations import stage_activation_bytes
from memory_model.params import stage_parameters

FIXED_OVERHEAD_BYTES = 2 * GiB
FRAGMENTATION_FRACTION = 0.10


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Memory of one GPU of pipeline ``stage`` (bytes)."""

    stage: int
    parameters_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    total_bytes: float

    def to_dict(self) -> dict:
        return asdict(self)


def memory_arrays(model: ModelSpec, *, tp, pp, dp, cp, vp, mbs, num_microbatches,
                  recompute, sp, distributed_optimizer, stage, precision: str,
                  stores_scores: bool) -> dict[str, np.ndarray]:
    """Memory per GPU of ``stage`` for arrays of plans (bytes; keys as MemoryBreakdown)."""
    params = stage_parameters(model, tp, pp, stage)
    weight_bytes = 2 + is_fp8(precision)
    grad_bytes = 2 if precision == "fp16" else 4
    shard = np.where(distributed_optimizer, np.asarray(dp) * np.asarray(cp), 1)
    act = stage_activation_bytes(model, mbs=mbs, seq=model.seq_length / np.asarray(cp), tp=tp,
                                 pp=pp, vp=vp, sp=sp, recompute=recompute,
                                 num_microbatches=num_microbatches, stage=stage,
                                 stores_scores=stores_scores)
    out = {
        "parameters_bytes": params * weight_bytes,
        "gradients_bytes": params * grad_bytes,
        "optimizer_bytes": params * 12.0 / shard,
        "activations_bytes": act,
        "other_bytes": FIXED_OVERHEAD_BYTES + FRAGMENTATION_FRACTION * act,
    }
    out["total_bytes"] = sum(out.values())
    return out


def peak_memory_arrays(model: ModelSpec, **kw) -> np.ndarray:
    """Worst stage's total bytes: the first stage (most microbatches in flight, embedding)
    or the last (output layer, logits); middle stages never exceed the first."""
    first = memory_arrays(model, stage=0, **kw)["total_bytes"]
    last = memory_arrays(model, stage=np.asarray(kw["pp"]) - 1, **kw)["total_bytes"]
    return np.maximum(first, last)


def estimate_memory(model: ModelSpec, plan: ParallelPlan) -> list[MemoryBreakdown]:
    """Memory of every pipeline stage of ``plan`` (one :class:`MemoryBreakdown` each)."""
    stages = np.arange(plan.pp)
    arrays = memory_arrays(
        model, tp=plan.tp, pp=plan.pp, dp=plan.dp, cp=plan.cp, vp=plan.vp,
        mbs=plan.micro_batch_size, num_microbatches=plan.num_microbatches,
        recompute=RECOMPUTE_CODES[plan.recompute], sp=plan.sequence_parallel,
        distributed_optimizer=plan.distributed_optimizer, stage=stages,
        precision=plan.precision, stores_scores=plan.stores_attention_scores)
    return [MemoryBreakdown(stage=int(i), **{k: float(np.broadcast_to(v, stages.shape)[i])
                                             for k, v in arrays.items()})
            for i in stages]
