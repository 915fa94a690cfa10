"""What PyTorch's eager execution costs a layer beyond its fused kernels: the host's time
to issue its operations for one microbatch (:func:`host_layer_s`; CUDA graphs replay what
they capture, :func:`graph_scopes`), the eager element-wise kernels outside any fusion (an
MoE layer's per-expert fc2 bias, a gated MLP's clamp, YaRN's unfused RoPE), priced at the
bandwidth those kernels attain (:func:`eager_bandwidth_Bps`, :func:`eager_s`), and the
copies to and from host memory of fine-grained activation offloading
(:func:`offload_exposed`).
"""

from __future__ import annotations

import numpy as np

from configurator.core.plan_batch import PlanBatch
from configurator.core.plan_terms import moe_recompute_whole
from configurator.core.model import ModelSpec
from configurator.core.plan_values import (RECOMPUTE_CORE_ATTN, RECOMPUTE_FULL,
                                           RECOMPUTE_LAYERNORM, RECOMPUTE_MLA_UP_PROJ,
                                           RECOMPUTE_MLP, RECOMPUTE_MOE_ACT,
                                           RECOMPUTE_SHARED_EXPERTS)
from topology.gpus import GPUSpec


#: PyTorch operations the host issues per layer and microbatch, forward (backward takes
#: :data:`HOST_BACKWARD_FACTOR` times as long to issue): a dense layer through Transformer Engine
#: (norm, QKV, RoPE ×2, core attention, projection, bias-dropout-add, norm, fc1,
#: activation, fc2, bias-dropout-add, their autograd bookkeeping and, with FP8, the casts
#: and amax/scale updates) and, for an MoE layer, the router (GEMM, softmax or sigmoid,
#: top-k, auxiliary-loss reductions), the permutation and the all-to-all dispatcher's
#: token counts, host synchronisation, exchanges and sorts (megatron-core 0.16.1
#: ``MoELayer.forward``, ``MoEAlltoAllTokenDispatcher``), plus per local expert the grouped
#: GEMMs' members (Transformer Engine ``GroupedLinear`` runs one GEMM per expert).
#:
#: Source of the four counts: set by hand from the lists above (about three PyTorch
#: operations per listed module with its autograd bookkeeping), not counted from a trace and
#: not fitted. A prediction uses only their products with ``Efficiency.host_op_s``, whose
#: factor (:data:`topology.gpus.IN_TRAINING` ``host``, 3.40) is fitted with these counts
#: held fixed (``configurator validate --by-source``): a count off by a common share is
#: absorbed there. The published runs that are host-bound are Megatron-Bridge's MoE rows at
#: micro-batch 1 only (leaving that source out takes the host factor to the bottom of its
#: range; docs/model.md), so the dense and MoE counts are not checked against each other.
#: The MoE parts are checked against megatron-core 0.16.1's own MoE layer
#: (``python -m bench.kernels.host_layer``, its second table: the all-to-all dispatcher on
#: the CPU with expert parallelism over 2 and 4 processes): router 38, preprocessing 25,
#: exchanges, sorts and permutations 36-42 forward ATen operations, 99-105 in all against
#: :data:`HOST_OPS_MOE`'s 90.
#:
#: Dense layer, forward: 12 modules listed above (7 attention, 5 MLP; :data:`HOST_OPS_ATTN`).
HOST_OPS_DENSE = 40
#: An MoE layer's router and dispatcher beyond the dense attention and MLP, forward: set by
#: hand, a third each for router, preprocessing and dispatch (:data:`HOST_OPS_MOE_PARTS`).
HOST_OPS_MOE = 90
#: Per local expert, forward: one grouped-GEMM member for fc1 and one for fc2 (Transformer
#: Engine ``GroupedLinear``, whose C++ ``general_grouped_gemm`` issues one cuBLAS GEMM per
#: member). Counted, not fitted. The same in FP8: the members' input casts are one call
#: (``_split_quantize``, a C++ loop of kernel launches), and their FP8 weights are cast on the
#: iteration's first microbatch only and read from the cache on the others
#: (``quantize_weight`` with ``is_first_microbatch`` False, which megatron-core's
#: ``TEGroupedLinear`` passes; TransformerEngine transformer_engine/pytorch/module/
#: grouped_linear.py ``_GroupedLinear.forward``).
HOST_OPS_PER_EXPERT = 2
#: The host's time to issue a layer's backward over the time to issue its forward: measured on
#: megatron-core 0.16.1's own layers (``python -m bench.kernels.host_layer``: its local-spec
#: dense and MoE layers on the CPU device at tiny shapes, where the host's work is all that is
#: timed): the backward issues about 1.5 times the forward's ATen operations (145 against 99
#: dense, 287 against 204 MoE) but each at about 0.6 of the forward's cost (6.3-6.9 against
#: 10.3-11.6 us: autograd's engine in C++ against the modules' Python), 0.83-0.91 of the
#: forward's time over four runs; their mean. The counts above stay the forward's.
HOST_BACKWARD_FACTOR = 0.87
#: The dense layer's operations by CUDA graph scope, in proportion to the operations listed
#: above (attention: norm, QKV, RoPE x2, core attention, projection, bias-dropout-add, 7 of
#: 12; MLP: norm, fc1, activation, fc2, bias-dropout-add): ``attn`` and ``mlp``.
HOST_OPS_ATTN = 23
#: An MoE layer's operations beyond the dense attention by part: the router (``moe_router``
#: scope: gating GEMM, score function, top-k, routing map, auxiliary loss), the dispatcher's
#: preprocessing (``moe_preprocess``: token counts and their exchange, the host
#: synchronisation, permutation indices) and the permutations and all-to-alls around the
#: experts (in neither scope, captured only by ``moe``, which needs drop-and-pad, or
#: ``full_iteration``), a third each of :data:`HOST_OPS_MOE`.
HOST_OPS_MOE_PARTS = {part: HOST_OPS_MOE // 3 for part in ("router", "preprocess", "dispatch")}
#: Operations (host) and kernels (GPU) ``(unfused, fused)`` of an MoE layer's routing
#: (megatron-core 0.16.1 moe_utils.py ``topk_softmax_with_capacity``,
#: ``compute_routing_scores_for_aux_loss`` and the load-balancing loss: score function,
#: top-k, scatter into the routing map and probabilities, the auxiliary scores, their
#: top-k and scatter and the loss's reductions, forward; against Transformer Engine's
#: ``fused_topk_with_score_function``, ``fused_compute_score_for_moe_aux_loss`` and
#: ``fused_moe_aux_loss`` with ``--moe-router-fusion``) and of its token permutations
#: (``permute``, ``unpermute`` and ``sort_chunks_by_idxs``, each an index computation, a
#: gather or scatter and the probabilities' product in eager ops, against one Transformer
#: Engine kernel each with ``--moe-permute-fusion``). Counted from the functions.
MOE_ROUTER_OPS = (15, 3)
MOE_PERMUTE_OPS = (13, 3)


#: PyTorch operations the host issues per layer and microbatch, forward, in Megatron's own
#: layer (``attention_backend`` ``local``, ``--transformer-impl local``): every PyTorch
#: operation the layer's Python code issues (torch functions and tensor methods, views
#: included, and autograd ``Function`` applications; ``F.linear`` on a 3-D input as the
#: transpose, matmul and in-place bias add that torch/nn/functional.py's ``linear`` runs),
#: counted from Megatron-LM's ``ParallelTransformerLayer`` (megatron/model/transformer.py,
#: ``ParallelAttention.forward``, ``ParallelMLP.forward``; megatron/mpu/layers.py
#: ``ColumnParallelLinear`` and ``RowParallelLinear``; megatron/mpu/random.py
#: ``CudaRNGStatesTracker.fork``; megatron/model/fused_softmax.py; commit e270f68, April
#: 2021), a pre-norm GPT layer with the causal fused softmax and the bias-GeLU and
#: bias-dropout-add fusions, by part: ``input_norm`` apex's fused layer norm; ``qkv`` the
#: input's ``copy_to_tensor_model_parallel_region``, ``F.linear`` with its bias (transpose,
#: matmul, in-place add); ``qkv_split`` view and split into q, k, v; ``scores`` q and k
#: views, the ``torch.empty`` score buffer, three transposes, ``baddbmm`` and a view;
#: ``softmax`` a view, ``ScaledUpperTriangMaskedSoftmax`` and a view back; ``dropout_rng``
#: the tensor-parallel RNG tracker's ``fork`` (CUDA RNG state read, set, read, set) around
#: the dropout; ``context`` v and probabilities views, a transpose, ``bmm``, view, permute,
#: ``contiguous``, view; ``proj`` ``F.linear`` without bias (transpose, matmul) and
#: ``reduce_from_tensor_model_parallel_region``; ``bda_attn`` the bias's ``expand_as`` and
#: the fused bias-dropout-add; ``mlp_norm``; ``fc1`` ``copy_to`` and ``F.linear`` without
#: bias (``skip_bias_add``); ``gelu`` ``bias_gelu_impl``; ``fc2`` as ``proj``; ``bda_mlp``
#: as ``bda_attn``. The two tensor-parallel all-reduces inside the reductions
#: (:data:`HOST_OPS_LOCAL_TP_COLLECTIVES`) are issued only with tp > 1 (``_reduce`` returns
#: its input on one rank).
HOST_OPS_LOCAL_PARTS = {"input_norm": 1, "qkv": 4, "qkv_split": 2, "scores": 8, "softmax": 3,
                        "dropout_rng": 5, "context": 8, "proj": 3, "bda_attn": 2,
                        "mlp_norm": 1, "fc1": 3, "gelu": 1, "fc2": 3, "bda_mlp": 2}
#: The core attention's parts of :data:`HOST_OPS_LOCAL_PARTS` (what selective recompute's
#: ``core_attn`` re-runs: scores, softmax, dropout and context).
HOST_OPS_LOCAL_CORE_ATTN_PARTS = ("scores", "softmax", "dropout_rng", "context")
#: The attention's share of :data:`HOST_OPS_LOCAL_PARTS` (the parts up to ``bda_attn``).
HOST_OPS_LOCAL_ATTN_PARTS = ("input_norm", "qkv", "qkv_split", "scores", "softmax",
                             "dropout_rng", "context", "proj", "bda_attn")
#: ``torch.distributed.all_reduce`` calls of the local layer's forward with tp > 1 (the
#: projection's and fc2's ``reduce_from_tensor_model_parallel_region``).
HOST_OPS_LOCAL_TP_COLLECTIVES = 2
#: Host operations of a full recompute's checkpoint around each layer, ``(forward,
#: backward)``, beyond the layer's own forward that backward runs again (Megatron-LM
#: ``CheckpointFunction``, megatron/mpu/random.py, commit e270f68; megatron-core's
#: tensor_parallel/random.py saves and restores the same states through
#: ``_get_all_rng_states`` and ``_set_all_rng_states``): forward reads the CPU and CUDA RNG states
#: (the tracker's states are a dict copy, no tensor operation); backward reads both again,
#: sets the forward's two, detaches the two tensor inputs (hidden states and attention
#: mask), sets its own two back after the re-run forward and calls
#: ``torch.autograd.backward`` on the re-run outputs.
CHECKPOINT_HOST_OPS = (2, 9)
#: Host operations of megatron-core's ``CheckpointWithoutOutput`` around one module of one
#: tensor input and one output, ``(forward, backward)``, beyond the module's own re-run
#: (megatron-core 0.16.1 tensor_parallel/random.py): forward reads the CPU and CUDA RNG
#: states (``_get_all_rng_states``) and frees the output's storage
#: (``discard_output_and_register_recompute``: ``resize_(0)``); the backward hook
#: (``_recompute``) reads both states (``_fork_rng``), sets the forward's two, detaches the
#: input, and after the re-run restores the output's storage (``resize_``, ``copy_``) and
#: sets its own two states back; the function's backward calls ``torch.autograd.backward``.
#: Counted as :data:`CHECKPOINT_HOST_OPS` is.
CHECKPOINT_WITHOUT_OUTPUT_HOST_OPS = (3, 10)
#: Forward operations a selective recompute module issues again in the backward, at about
#: three per module with its autograd bookkeeping as :data:`HOST_OPS_DENSE` counts them:
#: ``core_attn`` Transformer Engine's core attention (one module; Megatron's own layer
#: re-runs its :data:`HOST_OPS_LOCAL_CORE_ATTN_PARTS`), ``layernorm`` one norm, ``moe_act``
#: the routed experts' activation (one module; a clamp adds its :data:`CLAMP_KERNELS`),
#: ``mla_up_proj`` MLA's two up projections (two modules), the query's and key's views
#: and the two fused RoPE calls (megatron-core 0.16.1 multi_latent_attention.py
#: ``qkv_up_proj_and_rope_apply``: 6 + 3 + 2), ``shared_experts`` a dense MLP's fc1,
#: activation and fc2 (three modules). ``mlp`` and ``moe`` re-run the layer's whole dense or
#: MoE MLP (:func:`layer_ops`, :func:`moe_mlp_ops`). Set by hand, not fitted.
RECOMPUTE_MODULE_OPS = {"core_attn": 3, "layernorm": 3, "moe_act": 3, "mla_up_proj": 11,
                        "shared_experts": 10}


#: Host operations per parameter tensor of the optimizer step, each issued while the GPU
#: has nothing else queued (the step reads the loss scaler's overflow flag and the gradient
#: norm back to the host, ``found_inf.item()`` and ``total_norm.item()``, so the host waits
#: for the GPU before each): Megatron-LM's ``Float16OptimizerWithFloat16Params.step``
#: (megatron/optimizer/optimizer.py, commit e270f68, April 2021) casts every main gradient
#: (``_copy_model_grads_to_main_grads``: ``main_param.grad = model_param.main_grad.float()``)
#: and ``clip_grad_norm_fp32`` (megatron/optimizer/clip_grads.py) detaches every gradient
#: (``param.grad.detach()``) before its multi-tensor norm; the unscale, norm, Adam and copy
#: back run as multi-tensor kernels over lists (a few launches in all, priced with the step's
#: bytes). megatron-core's optimizers walk their parameters the same way (the distributed
#: optimizer views, slices and casts each shard: more operations, not counted here).
OPTIMIZER_HOST_OPS_PER_TENSOR = 2


def optimizer_host_s(tensors, gpu: GPUSpec):
    """Host seconds of the optimizer step's per-parameter operations on a rank holding
    ``tensors`` parameter tensors (:data:`OPTIMIZER_HOST_OPS_PER_TENSOR` ×
    ``Efficiency.host_op_s``; :func:`memory_model.params.stage_parameter_tensors`)."""
    return np.asarray(tensors, dtype=float) * OPTIMIZER_HOST_OPS_PER_TENSOR * (
        gpu.efficiency.host_op_s)


def local_layer_ops(c: PlanBatch) -> tuple:
    """Host operations of one local layer's forward, ``(attention, MLP)``, per plan
    (:data:`HOST_OPS_LOCAL_PARTS`; tp > 1 adds the all-reduces of
    :data:`HOST_OPS_LOCAL_TP_COLLECTIVES`, one in each part)."""
    parts = HOST_OPS_LOCAL_PARTS
    attn = sum(parts[k] for k in HOST_OPS_LOCAL_ATTN_PARTS)
    mlp = sum(parts.values()) - attn
    coll = (np.asarray(c.tp) > 1) * (HOST_OPS_LOCAL_TP_COLLECTIVES / 2.0)
    return attn + coll, mlp + coll


def checkpoint_host_s(c: PlanBatch, gpu: GPUSpec) -> tuple:
    """Host seconds of a full recompute's checkpoint per layer and microbatch, ``(forward,
    backward)`` (:data:`CHECKPOINT_HOST_OPS` × ``Efficiency.host_op_s``); 0 for plans
    without full recompute."""
    full = np.asarray(c.recompute) == RECOMPUTE_FULL
    op = gpu.efficiency.host_op_s
    return tuple(np.where(full, n * op, 0.0) for n in CHECKPOINT_HOST_OPS)


def moe_fused_ops(c: PlanBatch) -> float:
    """Operations an MoE layer's forward saves with the plans' ``moe_router_fusion`` and
    ``moe_permute_fusion`` (:data:`MOE_ROUTER_OPS`, :data:`MOE_PERMUTE_OPS`), on the host
    and as GPU kernels alike."""
    return ((MOE_ROUTER_OPS[0] - MOE_ROUTER_OPS[1]) * bool(c.moe_router_fusion)
            + (MOE_PERMUTE_OPS[0] - MOE_PERMUTE_OPS[1]) * bool(c.moe_permute_fusion))


def graph_scopes(c: PlanBatch) -> set[str]:
    """What the plans' CUDA graphs capture: ``cuda_graph_scope``'s names, ``layer`` for
    whole layers (Transformer Engine graphs without a scope), nothing without graphs."""
    if c.cuda_graph_impl == "none":
        return set()
    scopes = set(c.cuda_graph_scope.replace(",", " ").split())
    return scopes or {"layer"}


def host_layer_s(model: ModelSpec, c: PlanBatch, gpu: GPUSpec) -> tuple:
    """Host time (s) to issue one layer's forward for one microbatch: ``(dense, moe)``
    (:data:`HOST_OPS_DENSE` and friends × ``Efficiency.host_op_s``; Megatron's own layer,
    ``attention_backend`` ``local``, :func:`local_layer_ops` instead); biased experts add
    their eager bias's operations (:data:`EXPERT_BIAS_KERNELS`), an unfused RoPE its own
    (:data:`UNFUSED_ROPE_KERNELS`); the routing and permutation fusions remove theirs
    (:func:`moe_fused_ops`). What CUDA graphs capture (:func:`graph_scopes`) the host
    replays without issuing its operations (Megatron's ``TECudaGraphHelper`` and
    ``FullCudaGraphWrapper``; megatron/core/transformer/moe/README.md lists graphs as the
    cure for a "CPU Overhead Bottleneck"): ``attn`` and ``mlp`` the dense layer's parts
    (:data:`HOST_OPS_ATTN`), ``moe_router`` and ``moe_preprocess`` theirs
    (:data:`HOST_OPS_MOE_PARTS`), ``moe`` an MoE layer's whole MLP, whole-layer graphs every
    dense layer and the MoE layers that drop and pad (static shapes), ``full_iteration``
    everything."""
    op = gpu.efficiency.host_op_s
    scopes = graph_scopes(c)
    full = "full_iteration" in scopes
    attn_ops, mlp_ops = layer_ops(model, c)
    attn = 0 if scopes & {"attn", "layer"} or full else attn_ops
    dense = (attn + (0 if scopes & {"mlp", "layer"} or full else mlp_ops)) * op
    if not model.is_moe:
        return dense, dense
    return dense, (attn + moe_mlp_ops(model, c)) * op


def moe_mlp_ops(model: ModelSpec, c: PlanBatch):
    """The host operations of an MoE layer's MLP, forward, per plan: its experts'
    (:func:`_expert_ops`), router, preprocessing and dispatch (:data:`HOST_OPS_MOE_PARTS`)
    less the fusions' (:func:`moe_fused_ops`) and what CUDA graphs capture
    (:func:`host_layer_s`)."""
    scopes = graph_scopes(c)
    parts = HOST_OPS_MOE_PARTS
    experts = _expert_ops(model, c)
    if _moe_mlp_graphed(c):
        return 0.0 * experts
    return (experts + parts["dispatch"] - moe_fused_ops(c)
            + (0 if "moe_router" in scopes else parts["router"])
            + (0 if "moe_preprocess" in scopes else parts["preprocess"]))


def selective_recompute_host_s(model: ModelSpec, c: PlanBatch, gpu: GPUSpec) -> tuple:
    """Host seconds of selective recompute per layer and microbatch, ``((forward,
    backward), (MoE forward, MoE backward))`` for a dense and an MoE layer: each module of
    ``recompute_modules`` that the layer runs (whose GPU time
    :func:`configurator.cost.compute.layer_costs` prices) issues its checkpoint's bookkeeping
    in the forward and, in the backward, its operations again (:data:`RECOMPUTE_MODULE_OPS`)
    with the rest of the bookkeeping, times ``Efficiency.host_op_s``. ``core_attn``,
    ``mlp``, ``moe`` and ``shared_experts`` run under ``tensor_parallel.checkpoint``
    (:data:`CHECKPOINT_HOST_OPS`; Transformer Engine's checkpoint, which megatron-core uses
    under FP8, taken as the same count), ``layernorm``, ``moe_act`` and ``mla_up_proj`` under
    ``CheckpointWithoutOutput`` (:data:`CHECKPOINT_WITHOUT_OUTPUT_HOST_OPS`), as
    megatron-core 0.16.1's attention.py, transformer_layer.py, moe/experts.py,
    moe/moe_layer.py and multi_latent_attention.py wrap them. A module that CUDA graphs
    capture costs the host nothing (:func:`host_layer_s`): core attention, MLA's input norm
    and up projections in ``attn``, the dense MLP in ``mlp``, an MoE layer's pre-MLP norm in
    ``moe_router``, its experts and shared expert where its whole MLP is graphed. 0 without
    selective recompute."""
    rc = np.asarray(c.recompute_code)
    rc = np.where(rc == RECOMPUTE_FULL, 0, rc)      # full recompute: checkpoint_host_s
    if not rc.any():                                # no module recomputed in the batch
        zero = 0.0 * rc
        return (zero, zero), (zero, zero)
    op = gpu.efficiency.host_op_s
    scopes = graph_scopes(c)
    whole = "full_iteration" in scopes
    attn_free = not (scopes & {"attn", "layer"} or whole)
    mlp_free = not (scopes & {"mlp", "layer"} or whole)
    moe_free = not _moe_mlp_graphed(c)
    norm_free = moe_free and "moe_router" not in scopes
    mla = bool(model.multi_latent_attention)
    ops = RECOMPUTE_MODULE_OPS
    core = (sum(HOST_OPS_LOCAL_PARTS[k] for k in HOST_OPS_LOCAL_CORE_ATTN_PARTS)
            if c.attention_backend == "local" else ops["core_attn"])
    clamp = CLAMP_KERNELS[0] * (model.activation_func_clamp_value is not None)
    cf, cwo = CHECKPOINT_HOST_OPS, CHECKPOINT_WITHOUT_OUTPUT_HOST_OPS

    def on(bit, free=True):
        return ((rc & bit) != 0) & free

    def pair(mask, rerun, kind):
        return (np.where(mask, kind[0], 0.0), np.where(mask, rerun + kind[1], 0.0))

    # the attention's modules, in every layer
    terms = [pair(on(RECOMPUTE_CORE_ATTN, attn_free), core, cf),
             pair(on(RECOMPUTE_MLA_UP_PROJ, attn_free and mla), ops["mla_up_proj"], cwo),
             pair(on(RECOMPUTE_LAYERNORM, attn_free and mla), ops["layernorm"], cwo)]
    dense = terms + [pair(on(RECOMPUTE_MLP, mlp_free), layer_ops(model, c)[1], cf)]
    out = [tuple(sum(t[i] for t in dense) * op for i in (0, 1))]
    if model.is_moe:
        whole_moe = moe_recompute_whole(rc, c.overlap_moe_expert_parallel_comm) & moe_free
        shared = bool(model.moe_shared_expert_intermediate_size)
        moe = terms + [pair(on(RECOMPUTE_LAYERNORM, norm_free), ops["layernorm"], cwo),
                       pair(whole_moe, moe_mlp_ops(model, c), cf),
                       pair(on(RECOMPUTE_MOE_ACT, moe_free) & ~whole_moe,
                            ops["moe_act"] + clamp, cwo),
                       pair(on(RECOMPUTE_SHARED_EXPERTS, moe_free and shared) & ~whole_moe,
                            ops["shared_experts"], cf)]
        out.append(tuple(sum(t[i] for t in moe) * op for i in (0, 1)))
    else:
        out.append(out[0])
    return tuple(out)


def layer_ops(model: ModelSpec, c: PlanBatch) -> tuple:
    """A layer's forward operations ``(attention, MLP)``: Transformer Engine's
    (:data:`HOST_OPS_ATTN`, :data:`HOST_OPS_DENSE`) or Megatron's own layer's
    (:func:`local_layer_ops`), the MLP's with a clamp's and an unfused RoPE's operations."""
    extra = (CLAMP_KERNELS[0] * (model.activation_func_clamp_value is not None)
             # unfused RoPE: its operations on q and k replace the two fused ones
             + (2 * UNFUSED_ROPE_KERNELS[0] - 2) * model.rope_unfused)
    if c.attention_backend == "local":      # Megatron's own layer: its own count
        attn_ops, mlp_base = local_layer_ops(c)
    else:
        attn_ops, mlp_base = HOST_OPS_ATTN, HOST_OPS_DENSE - HOST_OPS_ATTN
    return attn_ops, mlp_base + extra


def _expert_ops(model: ModelSpec, c: PlanBatch):
    """An MoE layer's expert operations, forward, per plan: the MLP's own
    (:func:`layer_ops`) and per local expert :data:`HOST_OPS_PER_EXPERT` (in any precision),
    plus the eager bias's with biased experts)."""
    local = model.num_experts / c.ep.astype(float)
    per_expert = HOST_OPS_PER_EXPERT + EXPERT_BIAS_KERNELS[0][0] * model.add_bias_linear
    return layer_ops(model, c)[1] + per_expert * local


def drop_and_pad(c: PlanBatch) -> bool:
    """Whether the plans' experts drop tokens beyond their capacity and pad to it: static
    shapes, known on the host (megatron-core 0.16.1 token_dispatcher.py ``drop_and_pad``)."""
    return bool(c.moe_expert_capacity_factor > 0 and c.moe_pad_expert_input_to_capacity)


def _moe_mlp_graphed(c: PlanBatch) -> bool:
    """Whether the plans' CUDA graphs capture an MoE layer's whole MLP: ``full_iteration``,
    ``moe``, or whole-layer graphs of a layer that drops and pads (static shapes)."""
    scopes = graph_scopes(c)
    return bool(scopes & {"full_iteration", "moe"}) or ("layer" in scopes and drop_and_pad(c))


#: Attained HBM bytes per second and SM of PyTorch's eager element-wise kernels outside
#: any fusion: mixed-precision operands (16-bit with FP32), broadcasts, strided halves of a
#: tensor and 1-byte masks keep TensorIterator off its vectorised path, so each SM keeps
#: few bytes in flight and the kernels run at the rate memory latency allows per SM
#: (Little's law), not at the HBM bandwidth: an H200 runs them only 10-15 % faster than
#: an H100 although its HBM is 43 % faster. Measured with ``bench/kernels/kernel_shapes.py
#: --model gpt-oss-120b --ep 8 --mbs 4`` on megatron-core's own functions (torch 2.11,
#: CUDA 13.0), the bytes of :data:`EXPERT_BIAS_BYTES`, :data:`CLAMP_BYTES` and
#: :data:`UNFUSED_ROPE_BYTES` over the time less the launches, per SM (132): expert bias
#: forward / backward, clamp forward / backward and YaRN's unfused RoPE forward / backward
#: 16.0, 15.6, 14.5, 13.7, 12.3, 12.6 GB/s on an H100 and 18.1, 18.2, 15.6, 14.8, 12.2,
#: 14.2 on an H200; their geometric mean (the bias and clamp alone: 15.7). A GPU attains the
#: lesser of this times its SMs and its vectorised rate (:func:`eager_bandwidth_Bps`).
EAGER_BYTES_PER_SM_S = 14.7e9


def eager_bandwidth_Bps(gpu: GPUSpec) -> float:
    """Attained HBM bandwidth (bytes/s) of eager element-wise kernels on ``gpu``:
    ``min(η_hbm · HBM, EAGER_BYTES_PER_SM_S · SMs)`` (:data:`EAGER_BYTES_PER_SM_S`)."""
    return min(gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm, EAGER_BYTES_PER_SM_S * gpu.num_sms)


#: HBM bytes per element of the routed experts' ``R×h`` output moved by megatron-core's
#: eager fc2 bias (models with ``add_bias_linear``: the grouped fc2 hands back its per-expert
#: biases, ``skip_bias_add=True``, and ``TEGroupedMLP._apply_bias`` adds them weighted by the
#: FP32 router probabilities, one expert at a time; megatron-core 0.16.1 and 0.17.1
#: ``transformer/moe/experts.py``), ``(forward, backward)``: per local expert ``b·p`` (write
#: 4) and ``t + b·p`` (read 2 + 4, write 4), then ``torch.cat`` (read 4, write 4) and the
#: cast back to 16 bits (read 4, write 2); backward the cast's gradient to FP32 (read 2,
#: write 4), per expert the add's gradient cast to 16 bits (read 4, write 2) and the
#: product's two, ``Σ grad·p`` and ``Σ grad·b`` (multiply: read 4, write 4; sum: read 4;
#: each), then the 16-bit gradients joined for the split (read 2, write 2). Counted op by
#: op on megatron-core's function (``tests/test_eager_mlp_ops.py``). The fc1 bias runs in
#: the grouped GEMM. Priced at :func:`eager_bandwidth_Bps`.
EXPERT_BIAS_BYTES = (28.0, 40.0)
#: Kernels of that path, ``(forward, backward)``, each ``(per local expert, once)``: the
#: multiply and the add, then the concatenation and the cast; backward per expert the add's
#: cast, the product's two multiplies and two sums and the bias gradient's cast, then the
#: cast's gradient and the two concatenations (probabilities' and inputs' gradients).
EXPERT_BIAS_KERNELS = ((2, 2), (6, 3))


#: HBM bytes per element of a gated MLP's fc1 output (``gate·f`` wide) moved by clamping it
#: (``activation_func_clamp_value``: megatron-core's ``weighted_bias_quick_geglu_impl``
#: clamps the two halves and concatenates them in eager ops before its fused activation;
#: core 0.16.1 ``fusions/fused_bias_geglu.py``), ``(forward, backward)``: the two clamps (read
#: 2, write 2) and ``torch.cat`` (read 2, write 2); backward PyTorch's ``clamp_backward``
#: (``torch/csrc/autograd/FunctionsManual.cpp``), over half the elements each: the two-sided
#: clamp ``where((x >= lo).logical_and_(x <= hi), grad, 0)`` (``>=`` and ``<=`` read 2, write
#: a 1-byte mask; the ``and`` reads 2 masks, writes 1; ``where`` reads the mask and 2, writes
#: 2: 14) and the one-sided ``where(x <= hi, grad, 0)`` (3 + 5: 8), then the halves'
#: gradients joined (read 2, write 2). Counted op by op on megatron-core's function
#: (``tests/test_eager_mlp_ops.py``). Kernels :data:`CLAMP_KERNELS`. Priced at
#: :func:`eager_bandwidth_Bps`. The clamps keep the unclamped fc1 output for backward
#: (memory_model.activations).
CLAMP_BYTES = (8.0, 15.0)
CLAMP_KERNELS = (3, 7)

#: HBM bytes per query or key element moved by megatron-core's unfused RoPE
#: (``rope_utils._apply_rotary_pos_emb_bshd``, which ``apply_rotary_pos_emb`` falls back to
#: when the model's ``mscale`` ≠ 1, i.e. YaRN; core_v0.16.1), ``(forward, backward)``:
#: ``t·cos`` (read 2, write 2), ``_rotate_half``'s negation of one half (1 + 1) and
#: concatenation (2 + 2), ``·sin`` (2 + 2), the sum (4 + 2) and the final concatenation with
#: the empty pass-through part (2 + 2): 24; backward the same chain (a copy fewer: 20), the
#: empty pass-through slice's gradient zero-filled at full size (``slice_backward``, write 2)
#: and the two slices' gradients summed (4 + 2): 28. Fused (Transformer Engine), the
#: model's default RoPE reads and writes each element once. Kernels
#: :data:`UNFUSED_ROPE_KERNELS` per tensor (q and k: two per layer). Counted op by op on
#: megatron-core's function (``tests/test_eager_mlp_ops.py``); priced at
#: :func:`eager_bandwidth_Bps` (its products broadcast cos and sin over the heads).
UNFUSED_ROPE_BYTES = (24.0, 28.0)
#: Kernels per tensor, ``(forward, backward)``: forward cos, sin, their two scalings and
#: casts (on the ``s·d`` table) and the six above; backward 7.
UNFUSED_ROPE_KERNELS = (12, 7)


def eager_s(bytes_moved, kernels, gpu: GPUSpec):
    """Seconds of eager element-wise kernels moving ``bytes_moved`` HBM bytes in ``kernels``
    launches (:func:`eager_bandwidth_Bps`)."""
    return (bytes_moved / eager_bandwidth_Bps(gpu)
            + kernels * gpu.efficiency.kernel_overhead_s)


def clamp_s(model: ModelSpec, elements, gpu: GPUSpec) -> tuple:
    """``(forward, backward)`` seconds of clamping ``elements`` fc1 outputs
    (:data:`CLAMP_BYTES`); 0 for a model without ``activation_func_clamp_value``."""
    if model.activation_func_clamp_value is None:
        return 0.0 * elements, 0.0 * elements
    return tuple(eager_s(b * elements, k, gpu) for b, k in zip(CLAMP_BYTES, CLAMP_KERNELS))


def offload_exposed(offloaded_bytes, gpu: GPUSpec, fwd, bwd) -> tuple:
    """A layer's ``(forward, backward)`` seconds with fine-grained activation offloading:
    its offloaded tensors (:func:`memory_model.activations.offloaded_layer_bytes`) go to host
    memory during the forward and come back, prefetched, during the backward, each on a side
    stream beside the layer's compute (megatron-core 0.16.1
    ``fine_grained_activation_offload.py``: ``d2h_stream``, ``h2d_stream``); a copy longer
    than the pass it hides behind, at the GPU-host link's rate (``GPUSpec.host_link_Bps``),
    sets the pass's time."""
    copy = offloaded_bytes / gpu.host_link_Bps
    return np.maximum(fwd, copy), np.maximum(bwd, copy)
