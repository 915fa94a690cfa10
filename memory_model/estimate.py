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
on), so ``fp8`` adds 2 bytes per GEMM weight (1 with ``non_tn_fp8_gemm``); MXFP8 keeps row- and
column-wise blocks with their scales, ``2·(1 + 1/32)``. Embedding, output layer and norms get
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

from configurator.core.candidates import Candidates
from configurator.core.layers import rank_layer_counts, stage_class_arrays
from configurator.core.model import ModelSpec
from configurator.core.rows import row_groups
from configurator.core.plan import ParallelPlan
from configurator.core.plan_terms import (capacity_share, fp8_weights_gathered, main_grad_bytes,
                                          optimizer_state_bytes)
from configurator.core.plan_values import is_fp8
from configurator.core.units import GiB
from memory_model.activations import linear_input_bytes, stage_activation_bytes
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


def fp8_weight_bytes(precision: str, *, non_tn_fp8_gemm: bool = False) -> float:
    """Bytes per GEMM weight of Transformer Engine's cached quantised weight workspace (module
    docstring): 0 without FP8; ``fp8`` 2 (row-wise + FP8 transpose; 1 where the GPU runs
    non-TN FP8 GEMMs, Blackwell); ``mxfp8`` ``2·(1 + 1/32)``."""
    if not is_fp8(precision):
        return 0.0
    # row-wise + column-wise copies; fp8's column-wise copy is a physical transpose only
    # where the GPU runs TN FP8 GEMMs alone (MXFP8 always keeps both block layouts)
    copies = 1.0 if non_tn_fp8_gemm and precision == "fp8" else 2.0
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


def memory_arrays(model: ModelSpec, *, tp, pp, dp, cp, vp, mbs, num_microbatches,
                  recompute, sp, distributed_optimizer, stage, precision: str,
                  stores_scores: bool, ep=1, etp=1, rank_layers=None,
                  rank_moe_layers=None, non_tn_fp8_gemm: bool = False,
                  fp8_param_gather: bool = False,
                  grad_reduce_in_bf16: bool = False,
                  cp_comm_type: str = "p2p",
                  megatron_fsdp: bool = False, optimizer_bytes: float = 12.0,
                  main_grads_dtype: str = "fp32", capacity=1.0, a2a_overlap=False,
                  offload_modules: str = "", rows=None,
                  activations: bool = True, held_terms=None) -> dict[str, np.ndarray]:
    """Memory per GPU of ``stage`` for arrays of plans (bytes; keys as MemoryBreakdown).

    ``rank_layers``/``rank_moe_layers``: decoder and MoE layers the rank builds (default: an
    even split). Expert parameters' optimizer state is sharded over the expert-data-parallel
    group ``tp·cp·dp/(ep·etp)`` (Megatron's expert grid, ``parallel_state``), the others'
    over ``dp·cp``. ``non_tn_fp8_gemm``: the GPU runs FP8 GEMMs in any layout (Blackwell), so
    ``fp8`` keeps no weight transpose (:func:`fp8_weight_bytes`). ``fp8_param_gather``:
    whether the GEMM weights are FP8 only, without the 16-bit copy (arrays broadcast; the
    plan's :func:`configurator.core.plan_terms.fp8_weights_gathered`). ``grad_reduce_in_bf16``:
    the plan field (``--grad-reduce-in-bf16``; Megatron-Bridge's
    ``grad_reduce_in_fp32=False``), a 16-bit main-grad buffer
    (:func:`configurator.core.plan_terms.main_grad_bytes`). ``cp_comm_type``: the plans'
    context-parallel communication
    (:func:`cp_gather_bytes`). ``megatron_fsdp``: the weights and main gradients are sharded
    like the optimizer state, plus the full weights and gradients of
    :data:`FSDP_LIVE_UNITS` units of the largest (a layer or the embedding) being gathered
    and reduced. ``optimizer_bytes``: optimizer-state bytes per parameter before sharding
    (:func:`configurator.core.plan_terms.optimizer_state_bytes`: 12, less with the
    precision-aware optimizer's dtypes); ``main_grads_dtype``: its main-gradient dtype.
    ``capacity``, ``a2a_overlap``, ``offload_modules``: the routed copies' share under a
    capacity factor, the expert all-to-all overlap's schedule and fine-grained activation
    offloading (:func:`memory_model.activations.stage_activation_phases`, as is ``rows``,
    the plans grouped by what a layer's activations depend on). ``activations=False``:
    leave the activations out (0), a lower bound of the total; it also returns
    ``held_bytes`` (weights, gradients and optimizer state, summed) and ``cp_gather_bytes``,
    which a second call for the same plans and stage takes as ``held_terms`` (that pair) and
    then returns only ``total_bytes`` (the same floats), computing the activations alone."""
    act = 0.0 if not activations else stage_activation_bytes(
        model, mbs=mbs, seq=model.seq_length / np.asarray(cp), tp=tp, pp=pp, vp=vp, sp=sp,
        recompute=recompute, num_microbatches=num_microbatches, stage=stage,
        stores_scores=stores_scores, rank_layers=rank_layers, rank_moe_layers=rank_moe_layers,
        etp=etp, precision=precision, capacity=capacity, a2a_overlap=a2a_overlap,
        offload_modules=offload_modules, rows=rows)
    if held_terms is not None:
        held_bytes, gather = held_terms
        # the order of the full sum below: weights, gradients, optimizer, activations, other
        return {"total_bytes": held_bytes + act + _other_bytes(act, gather)}
    non_expert, expert = stage_parameter_split(model, tp, pp, stage, layers=rank_layers,
                                               moe_layers=rank_moe_layers, ep=ep, etp=etp)
    params = non_expert + expert
    gemm_params = params - stage_non_gemm_parameters(model, tp, pp, stage)
    grad_bytes = main_grad_bytes(precision, grad_reduce_in_bf16, main_grads_dtype)
    dp_cp = np.asarray(dp) * np.asarray(cp)
    shard = np.where(distributed_optimizer, dp_cp, 1)
    expert_shard = np.where(distributed_optimizer,
                            np.asarray(tp) * dp_cp / (np.asarray(ep) * np.asarray(etp)), 1)
    held, gemm_held = params, gemm_params     # parameters whose weights and grads are held
    if megatron_fsdp:
        unit = np.maximum(dense_layer_parameters(model, tp), embedding_parameters(model, tp))
        if model.is_moe:
            unit = np.maximum(unit, sum(moe_layer_parameters(model, tp, ep, etp)))
        held = non_expert / shard + expert / expert_shard + FSDP_LIVE_UNITS * unit
        gemm_held = gemm_params * held / np.maximum(params, 1.0)
    gather = cp_gather_bytes(model, tp=tp, cp=cp, mbs=mbs, cp_comm_type=cp_comm_type)
    out = {
        "parameters_bytes": held * 2.0 + gemm_held * (fp8_weight_bytes(
            precision, non_tn_fp8_gemm=non_tn_fp8_gemm) - 2.0 * (
                np.asarray(fp8_param_gather, dtype=bool))),
        "gradients_bytes": held * grad_bytes,
        "optimizer_bytes": (non_expert * optimizer_bytes / shard
                            + expert * optimizer_bytes / expert_shard),
        "activations_bytes": act,
        "other_bytes": _other_bytes(act, gather),
    }
    out["total_bytes"] = sum(out.values())
    if not activations:
        out["held_bytes"] = (out["parameters_bytes"] + out["gradients_bytes"]
                             + out["optimizer_bytes"])
        out["cp_gather_bytes"] = gather
    return out


def _other_bytes(act, gather):
    """The allowance beyond weights, state and activations (module docstring): the fixed
    overhead, fragmentation of the activations ``act`` and the CP gather's ``gather``."""
    return FIXED_OVERHEAD_BYTES + FRAGMENTATION_FRACTION * act + gather


#: Plans above which :func:`peak_memory_arrays` groups them by their layer's inputs.
GROUP_ROWS_ABOVE = 1024


def peak_memory_arrays(model: ModelSpec, *, first=0, last=0, account_embedding=False,
                       account_loss=False, layout: str = "", limit_bytes: float | None = None,
                       **kw) -> np.ndarray:
    """Worst stage's total bytes. Ranks are grouped by what they hold
    (:func:`configurator.core.layers.stage_class_arrays`); within a group the lowest rank
    holds the most microbatches in flight, so only it is evaluated. ``first``, ``last``,
    ``account_*``, ``layout``: the plan's layer-split fields (default: even). Above
    :data:`GROUP_ROWS_ABOVE` plans, a layer's activation terms are computed once per
    distinct (micro_batch_size, cp, tp, sp, recompute, etp, all-to-all overlap) row
    (:func:`configurator.core.rows.row_groups`) and shared by every stage class.

    ``limit_bytes`` (a capacity): plans whose weights, gradients, optimizer state and fixed
    allowance alone exceed it get that figure, a lower bound above the limit, instead of
    their peak (their activations are not computed); the others get their peak, their
    weights, gradients and optimizer state taken from that first pass, not computed again."""
    split = dict(first=first, last=last, account_embedding=account_embedding,
                 account_loss=account_loss, layout=layout)
    classes = stage_class_arrays(model, pp=kw["pp"], vp=kw["vp"], **split)
    n = np.size(kw["pp"])
    if limit_bytes is not None and np.ndim(kw["pp"]) == 1 and n > GROUP_ROWS_ABOVE:
        held_terms = {}
        peak = _class_peak(model, classes, dict(kw, activations=False), held_terms=held_terms)
        keep = np.flatnonzero(peak <= limit_bytes)
        if len(keep) < n:
            pick = lambda v: np.take(v, keep) if np.ndim(v) == 1 else v   # noqa: E731
            if len(keep):
                peak[keep] = _grouped_peak(
                    model, {k: np.take(v, keep, axis=0) for k, v in classes.items()},
                    {k: pick(v) for k, v in kw.items()},
                    held_terms={k: (pick(h), pick(g)) for k, (h, g) in held_terms.items()})
            return peak
        return _grouped_peak(model, classes, kw, held_terms=held_terms)
    peak = _grouped_peak(model, classes, kw)
    return peak if np.ndim(kw["pp"]) or np.size(peak) != 1 else peak.reshape(())


def _grouped_peak(model: ModelSpec, classes: dict, kw: dict,
                  held_terms=None) -> np.ndarray:
    """:func:`_class_peak`, a layer's activation terms computed once per distinct row above
    :data:`GROUP_ROWS_ABOVE` plans."""
    if np.size(kw["pp"]) > GROUP_ROWS_ABOVE:
        kw = dict(kw, rows=row_groups(kw["mbs"], kw["cp"], kw["tp"], kw["sp"], kw["recompute"],
                                      kw.get("etp", 1), kw.get("a2a_overlap", False)))
    return _class_peak(model, classes, kw, held_terms=held_terms)


def _class_peak(model: ModelSpec, classes: dict, kw: dict, held_terms=None) -> np.ndarray:
    """The largest :func:`memory_arrays` total over the stage ``classes``' lowest ranks.
    ``held_terms``: a dict; with ``activations=False`` in ``kw`` it is filled with each class's
    ``(held_bytes, cp_gather_bytes)`` (:func:`memory_arrays`), which a later call for the
    same plans (or a subset of them, sliced alike) passes back to add the activations to."""
    peak = None
    last = np.asarray(kw["pp"]) - 1
    filling = held_terms is not None and not kw.get("activations", True)
    for k in range(classes["stage"].shape[1]):
        # a class holding what rank 0 holds, and not the last rank, is never above rank 0
        # (fewer microbatches in flight, no embedding): skip it where every plan says so
        if k and not np.any((classes["count"][:, k] > 0)
                            & ((classes["layers"][:, k] != classes["layers"][:, 0])
                               | (classes["moe_layers"][:, k] != classes["moe_layers"][:, 0])
                               | (classes["stage"][:, k] == last))):
            continue
        out = memory_arrays(model, stage=classes["stage"][:, k],
                            rank_layers=classes["layers"][:, k],
                            rank_moe_layers=classes["moe_layers"][:, k],
                            held_terms=None if held_terms is None or filling
                            else held_terms[k], **kw)
        if filling:
            held_terms[k] = (out["held_bytes"], out["cp_gather_bytes"])
        tot = out["total_bytes"]
        tot = np.where(classes["count"][:, k] > 0, tot, 0.0)
        peak = tot if peak is None else np.maximum(peak, tot)
    return peak


def memory_inputs(c: Candidates, *, non_tn_fp8_gemm: bool = False) -> dict:
    """The keyword arguments of :func:`memory_arrays` and :func:`peak_memory_arrays` for the
    plans of ``c`` (:class:`configurator.core.candidates.Candidates`; one plan:
    ``Candidates.from_plan``): the one place the memory model reads plan fields.
    ``non_tn_fp8_gemm``: the GPU's (:func:`fp8_weight_bytes`)."""
    return dict(
        tp=c.tp, pp=c.pp, dp=c.dp, cp=c.cp, vp=c.vp, mbs=c.mbs,
        num_microbatches=c.num_microbatches, recompute=c.recompute_code,
        sp=c.sequence_parallel, distributed_optimizer=c.distributed_optimizer,
        precision=c.precision, stores_scores=c.stores_scores, ep=c.ep, etp=c.etp,
        fp8_param_gather=fp8_weights_gathered(c.fp8_param_gather, c.distributed_optimizer,
                                              c.precision),
        grad_reduce_in_bf16=c.grad_reduce_in_bf16, cp_comm_type=c.cp_comm_type,
        megatron_fsdp=c.megatron_fsdp, non_tn_fp8_gemm=non_tn_fp8_gemm,
        optimizer_bytes=optimizer_state_bytes(c), main_grads_dtype=c.main_grads_dtype,
        capacity=capacity_share(c), a2a_overlap=c.overlap_moe_expert_parallel_comm,
        offload_modules=c.offload_modules)


def peak_memory(model: ModelSpec, c: Candidates, *, non_tn_fp8_gemm: bool = False,
                limit_bytes: float | None = None) -> np.ndarray:
    """Peak bytes over pipeline stages for every plan of ``c`` (shape ``(len(c),)``), its
    layer-split fields included (:func:`peak_memory_arrays`, as is ``limit_bytes``)."""
    return peak_memory_arrays(
        model, first=c.first, last=c.last, account_embedding=c.acct_emb,
        account_loss=c.acct_loss, layout=c.layout, limit_bytes=limit_bytes,
        **memory_inputs(c, non_tn_fp8_gemm=non_tn_fp8_gemm))


def estimate_memory(model: ModelSpec, plan: ParallelPlan, *,
                    non_tn_fp8_gemm: bool = False) -> list[MemoryBreakdown]:
    """Memory of every pipeline stage of ``plan`` (one :class:`MemoryBreakdown` each);
    ``non_tn_fp8_gemm``: the GPU's (:func:`fp8_weight_bytes`)."""
    stages = np.arange(plan.pp)
    counts = rank_layer_counts(model, *plan.layer_split)
    arrays = memory_arrays(model, stage=stages, rank_layers=counts[:, 0],
                           rank_moe_layers=counts[:, 1],
                           **memory_inputs(Candidates.from_plan(plan),
                                           non_tn_fp8_gemm=non_tn_fp8_gemm))
    columns = {k: np.broadcast_to(np.asarray(v, dtype=float), stages.shape).tolist()
               for k, v in arrays.items()}
    return [MemoryBreakdown(stage=i, **{k: v[i] for k, v in columns.items()})
            for i in range(plan.pp)]
