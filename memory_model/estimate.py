"""Per-stage memory totals: weights, gradients, optimizer state, activations, overheads.

Bytes per parameter with mixed-precision Adam (Rajbhandari et al. 2020, ZeRO §3; Megatron-LM
theoretical_memory_usage.py; shared REFERENCE §3): 16-bit weights (2), gradients in the
main-grad buffer (4 in fp32 for bf16/fp8, since Megatron forces
``accumulate_allreduce_grads_in_fp32`` with bf16; 2 for fp16, ``--grad-reduce-in-bf16`` or
the precision-aware optimizer's ``--main-grads-dtype bf16``), fp32 master weights, Adam m
and v (12; the precision-aware optimizer's dtypes make it less:
:func:`configurator.core.plan_terms.optimizer_state_bytes`). The distributed optimizer shards the
state over the data-parallel group (dp·cp ranks: with context parallelism gradients are
reduced over the combined dp-cp group).

CUDA graphs add no term: Transformer Engine's graphs (2.7 and later, which core_v0.16.1
requires) reuse their static inputs' and outputs' buffers once a microbatch's backward is
done (``_reuse_graph_input_output_buffers``), and what a graphed layer keeps for backward
is the activations counted here; a full-iteration graph's copies of each microbatch's
token inputs are of order ``s·b`` bytes.

FP8 weights (:func:`fp8_weight_bytes`): without ``--fp8-param-gather`` (the plans' flags) the
parameters stay 16-bit and every TE linear keeps a quantised workspace of its weight, cached
across the microbatches of an iteration (Megatron's TE wrappers pass ``is_first_microbatch``
unless ``--disable-parameter-transpose-cache``; TE ``module/linear.py`` ``_Linear.forward`` →
``quantize_weight(..., cache=...)`` with ``weight_quantizer.set_usage(rowwise=True,
columnwise=is_grad_enabled and inp.requires_grad)``). On Hopper a Float8Tensor's column-wise
data is a physical FP8 transpose (``tensor/float8_tensor.py``: ``if self.columnwise_usage and
not non_tn`` allocates ``_transpose``; ``is_non_tn_fp8_gemm_supported`` is true from Blackwell
on), so ``fp8`` adds 2 bytes per GEMM weight (1 with ``non_tn_fp8_gemm`` and a per-tensor
scale; 1x128 blockwise scaling keeps both); MXFP8 keeps row- and column-wise blocks with their
scales, ``2·(1 + 1/32)``. Embedding, output layer and norms get
no copy (:func:`memory_model.params.stage_non_gemm_parameters`). With ``--fp8-param-gather``
(the plan field ``fp8_param_gather``; Megatron-Bridge's FP8 mixed-precision presets) the
16-bit weights are replaced by FP8 ones (row-wise plus transpose): 2 bytes per GEMM weight in
all, not 4.

Allowance (``other_bytes``): CUDA context with cuBLAS/cuDNN workspaces (≈ 1 GiB) plus NCCL
communicator buffers (≈ 1 GiB: NCCL_BUFFSIZE 4 MiB × channels × peers over a few groups),
and 10 % of activation bytes for caching-allocator fragmentation, a typical gap between
``torch.cuda.max_memory_reserved`` and ``max_memory_allocated`` in Megatron runs; with
``cp_comm_type`` ``all_gather`` also one layer's transient full-sequence buffers
(:func:`cp_gather_bytes`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from configurator.core.plan_batch import PlanBatch
from configurator.core.layers import rank_layer_counts
from configurator.core.model import ModelSpec
from configurator.core.plan_values import fp8_copies, fp8_scaling, is_fp8
from configurator.core.units import GiB
from memory_model.activations import (LayerInputs, StagePosition, layer_terms,
                                      linear_input_bytes, stage_activation_bytes)
from memory_model.params import (dense_layer_parameters, embedding_parameters,
                                  moe_layer_parameters, stage_non_gemm_parameters,
                                  stage_parameter_split)

#: Per-GPU memory beyond weights, state and activations: CUDA context with cuBLAS/cuDNN
#: workspaces (≈ 1 GiB) plus NCCL communicator buffers (≈ 1 GiB; module docstring). Set by
#: hand from those two estimates, not fitted. Checked, with :data:`FRAGMENTATION_FRACTION`,
#: against three Megatron-LM runs on one H200 (docs/accuracy.md, "Megatron-LM on one GPU";
#: ``python -m bench.accuracy.megatron_gpu compare``): the predicted peak is within −1.0 to
#: +5.7 % of ``torch.cuda.max_memory_reserved``.
FIXED_OVERHEAD_BYTES = 2 * GiB
#: Megatron FSDP units (a decoder layer, the embedding) whose full weights and gradients are
#: live at once: the one computing and the one prefetched (``--fsdp-double-buffer``: two
#: persistent buffers; megatron-fsdp-user-guide.md).
FSDP_LIVE_UNITS = 2
#: Caching-allocator fragmentation, as a fraction of the activation bytes: set by hand as a
#: typical gap between ``max_memory_reserved`` and ``max_memory_allocated`` in Megatron runs
#: (module docstring), not fitted; checked with :data:`FIXED_OVERHEAD_BYTES` on the three
#: one-H200 runs above (reserved minus allocated there: 0.76, 1.86 and 2.14 GiB).
FRAGMENTATION_FRACTION = 0.10


def cp_gather_bytes(model: ModelSpec, *, tp, cp, mbs, cp_comm_type: str) -> np.ndarray:
    """Transient bytes of context parallelism's K/V all-gather (``cp_comm_type``
    ``all_gather``) in one layer's backward, the larger of its two passes: the gathered K and V
    of the whole sequence and their full-sequence gradients before the reduce-scatter, 16-bit
    (Transformer Engine ``AttnFuncWithCPAndKVAllGather.backward``: ``gather_along_first_dim``
    of k and v, then ``reduce_scatter_along_first_dim`` of dk and dv), beyond the local shard
    the activations already hold. 0 for ``p2p`` and ``a2a`` (their exchange buffers hold one
    local block) and with cp = 1."""
    if cp_comm_type != "all_gather":
        return np.zeros(np.broadcast(np.asarray(tp), np.asarray(cp)).shape)
    dqk, dv = model.attention_heads_dims
    cp = np.asarray(cp, dtype=float)
    full = 2.0 * mbs * model.seq_length * model.attention_kv_heads / np.asarray(tp) * (dqk + dv)
    return np.where(cp > 1, 2.0 * full * (cp - 1) / cp, 0.0)


def fp8_weight_bytes(precision: str, *, non_tn_fp8_gemm: bool = False,
                     fp8_recipe: str = "delayed") -> float:
    """Bytes per GEMM weight of Transformer Engine's cached quantised weight workspace (module
    docstring): 0 without FP8; ``fp8`` 2 (row-wise + FP8 transpose; 1 where the GPU runs
    non-TN FP8 GEMMs, Blackwell, with a per-tensor scale: the copies of
    :func:`configurator.core.plan_values.fp8_copies`); ``mxfp8`` ``2·(1 + 1/32)``."""
    if not is_fp8(precision):
        return 0.0
    copies = fp8_copies(fp8_scaling(precision, fp8_recipe), non_tn_fp8_gemm)
    return copies * linear_input_bytes(precision)


#: Share of GPU memory a recommended plan may use (``search --max-memory-fraction``'s
#: default). The estimate already allows for fragmentation of activations; what it cannot
#: see varies from run to run: PyTorch's caching allocator rounds large blocks up to 2 MiB
#: and splits them (``torch.cuda.memory_stats`` "inactive_split" bytes of a few GiB are
#: common late in training), NCCL grows buffers per new communicator and algorithm
#: (``NCCL_BUFFSIZE`` 4 MiB × channels × peers), and spikes of the first iterations
#: (optimizer state creation). 5 % of an 80 GiB GPU (4 GiB) covers the typical gap between
#: ``max_memory_reserved`` and ``max_memory_allocated``; a published plan that uses more is
#: still estimated (``estimate`` reports fits against the whole memory).
DEFAULT_MAX_MEMORY_FRACTION = 0.95


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


def held_memory(model: ModelSpec, plans: PlanBatch, stage, rank_layers=None,
                rank_moe_layers=None, non_tn_fp8_gemm: bool = False) -> dict[str, np.ndarray]:
    """What a GPU of pipeline rank ``stage`` holds whatever its activations, for every plan of
    ``plans`` (bytes, arrays broadcast): ``parameters_bytes``, ``gradients_bytes``,
    ``optimizer_bytes`` and ``cp_gather_bytes`` (:func:`cp_gather_bytes`).

    ``rank_layers``/``rank_moe_layers``: decoder and MoE layers the rank builds (default: an
    even split). Expert parameters' optimizer state is sharded over the expert-data-parallel
    group ``tp·cp·dp/(ep·etp)`` (Megatron's expert grid, ``parallel_state``), the others'
    over ``dp·cp``. ``non_tn_fp8_gemm``: the GPU runs FP8 GEMMs in any layout (Blackwell), so
    ``fp8`` keeps no weight transpose (:func:`fp8_weight_bytes`). The plans' FP8 weight gather
    (:attr:`~configurator.core.plan_batch.PlanBatch.fp8_weights_gathered`) keeps the GEMM
    weights in FP8 only, without the 16-bit copy; ``grad_reduce_in_bf16`` and
    ``main_grads_dtype`` set the main-gradient bytes
    (:func:`configurator.core.plan_terms.main_grad_bytes`). Megatron FSDP
    (``megatron_fsdp``): the weights and main gradients are sharded like the optimizer state,
    plus the full weights and gradients of :data:`FSDP_LIVE_UNITS` units of the largest (a
    layer or the embedding) being gathered and reduced. The optimizer state per parameter
    before sharding is the plans'
    :attr:`~configurator.core.plan_batch.PlanBatch.optimizer_bytes_per_parameter`."""
    tp, pp, ep, etp = plans.tp, plans.pp, plans.ep, plans.etp
    non_expert, expert = stage_parameter_split(model, tp, pp, stage, layers=rank_layers,
                                               moe_layers=rank_moe_layers, ep=ep, etp=etp)
    params = non_expert + expert
    gemm_params = params - stage_non_gemm_parameters(model, tp, pp, stage)
    grad_bytes = plans.main_grad_bytes
    distributed_optimizer = plans.distributed_optimizer
    dp_cp = np.asarray(plans.dp) * np.asarray(plans.cp)
    shard = np.where(distributed_optimizer, dp_cp, 1)
    expert_shard = np.where(distributed_optimizer,
                            np.asarray(tp) * dp_cp / (np.asarray(ep) * np.asarray(etp)), 1)
    held, gemm_held = params, gemm_params     # parameters whose weights and grads are held
    if plans.megatron_fsdp:
        unit = np.maximum(dense_layer_parameters(model, tp), embedding_parameters(model, tp))
        if model.is_moe:
            unit = np.maximum(unit, sum(moe_layer_parameters(model, tp, ep, etp)))
        held = non_expert / shard + expert / expert_shard + FSDP_LIVE_UNITS * unit
        gemm_held = gemm_params * held / np.maximum(params, 1.0)
    optimizer_bytes = plans.optimizer_bytes_per_parameter
    return {
        "parameters_bytes": held * 2.0 + gemm_held * (fp8_weight_bytes(
            plans.precision, non_tn_fp8_gemm=non_tn_fp8_gemm,
            fp8_recipe=plans.fp8_recipe) - 2.0 * (
                np.asarray(plans.fp8_weights_gathered, dtype=bool))),
        "gradients_bytes": held * grad_bytes,
        "optimizer_bytes": (non_expert * optimizer_bytes / shard
                            + expert * optimizer_bytes / expert_shard),
        "cp_gather_bytes": cp_gather_bytes(model, tp=tp, cp=plans.cp, mbs=plans.mbs,
                                           cp_comm_type=plans.cp_comm_type),
    }


def plan_layer_terms(model: ModelSpec, plans: PlanBatch) -> dict:
    """What one layer and microbatch of each plan keep and re-materialise
    (:func:`memory_model.activations.layer_terms` of the plans' :class:`LayerInputs`)."""
    return layer_terms(model, LayerInputs.of_plans(model, plans))


def activation_memory(model: ModelSpec, plans: PlanBatch, stage, rank_layers=None,
                      rank_moe_layers=None, terms: dict | None = None) -> np.ndarray:
    """Peak activation bytes of a GPU of pipeline rank ``stage`` for every plan of ``plans``
    (:func:`memory_model.activations.stage_activation_bytes`; ``rank_*`` as
    :func:`held_memory`; ``terms``: the plans' layer terms when the caller has them)."""
    at = StagePosition(pp=plans.pp, vp=plans.vp, num_microbatches=plans.num_microbatches,
                       stage=stage, rank_layers=rank_layers, rank_moe_layers=rank_moe_layers,
                       offloaded_layers=plans.cpu_offloading_num_layers)
    return stage_activation_bytes(model, LayerInputs.of_plans(model, plans), at, terms)


def total_memory(held_bytes, activations_bytes, cp_gather) -> np.ndarray:
    """A GPU's total (bytes): ``held_bytes`` (weights, gradients and optimizer state, summed in
    that order), then the activations, then :func:`other_memory`."""
    return held_bytes + activations_bytes + other_memory(activations_bytes, cp_gather)


def other_memory(activations_bytes, cp_gather):
    """The allowance beyond weights, state and activations (module docstring): the fixed
    overhead, fragmentation of the activations and the CP gather's bytes."""
    return FIXED_OVERHEAD_BYTES + FRAGMENTATION_FRACTION * activations_bytes + cp_gather


def memory_arrays(model: ModelSpec, plans: PlanBatch, stage, rank_layers=None,
                  rank_moe_layers=None, non_tn_fp8_gemm: bool = False) -> dict[str, np.ndarray]:
    """Memory per GPU of pipeline rank ``stage`` for every plan of ``plans`` (bytes; keys as
    :class:`MemoryBreakdown`): :func:`held_memory` (same arguments), the activations
    (:func:`activation_memory`) and the allowance (:func:`other_memory`)."""
    held = held_memory(model, plans, stage, rank_layers, rank_moe_layers, non_tn_fp8_gemm)
    act = activation_memory(model, plans, stage, rank_layers, rank_moe_layers)
    gather = held.pop("cp_gather_bytes")
    out = {**held, "activations_bytes": act, "other_bytes": other_memory(act, gather)}
    out["total_bytes"] = total_memory(
        out["parameters_bytes"] + out["gradients_bytes"] + out["optimizer_bytes"], act, gather)
    return out


def estimate_memory(model: ModelSpec, plans: PlanBatch, *,
                    non_tn_fp8_gemm: bool = False) -> list[MemoryBreakdown]:
    """Memory of every pipeline stage of one plan (``plans``, a :class:`PlanBatch` of one;
    one :class:`MemoryBreakdown` per stage); ``non_tn_fp8_gemm``: the GPU's
    (:func:`fp8_weight_bytes`). Raises ValueError if ``plans`` is not one plan."""
    if len(plans) != 1:
        raise ValueError(f"estimate_memory prices one plan, not a batch of {len(plans)}")
    split = plans.layer_split(0)
    pp = split[0]
    stages = np.arange(pp)
    counts = rank_layer_counts(model, *split)
    arrays = memory_arrays(model, plans, stages, counts[:, 0], counts[:, 1], non_tn_fp8_gemm)
    columns = {k: np.broadcast_to(np.asarray(v, dtype=float), stages.shape).tolist()
               for k, v in arrays.items()}
    return [MemoryBreakdown(stage=i, **{k: v[i] for k, v in columns.items()})
            for i in range(pp)]
