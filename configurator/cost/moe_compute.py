"""Compute of a mixture-of-experts layer's MLP for one microbatch on one rank: the router,
the routed experts' grouped GEMMs, a shared expert and the memory-bound passes around them
(:func:`moe_mlp_costs`); and the host synchronisation of the token dispatcher, which splits
the layer's forward in two parts that cannot overlap (:func:`moe_host_synchronised`,
:func:`moe_host_before_sync_s`).
"""

from __future__ import annotations

from configurator.core.plan_batch import PlanBatch
from configurator.core.model import ModelSpec
from configurator.core.plan_terms import routed_load_share
from configurator.cost.gemm import (fp8_quantize_s, fp8_scaling, gemm_time_s,
                                    grouped_gemm_time_s)
from configurator.cost.host_ops import (EXPERT_BIAS_BYTES, EXPERT_BIAS_KERNELS,
                                        HOST_OPS_MOE_PARTS, MOE_ROUTER_OPS, clamp_s,
                                        drop_and_pad, eager_s, graph_scopes, layer_ops,
                                        moe_fused_ops)
from topology.gpus import GPUSpec


def moe_host_synchronised(c: PlanBatch) -> bool:
    """Whether the plans' token dispatcher stops the host once per MoE layer's forward until
    the GPU has routed the tokens: dropless routing sizes the exchange on the host
    (megatron-core 0.16.1 token_dispatcher.py: the all-to-all dispatcher's
    ``_maybe_dtoh_and_synchronize`` "if not self.drop_and_pad"; DeepEP's ``.item()`` of the
    token count; HybridEP knows its sizes on the host only in drop-and-pad mode). Padding to
    capacity, or graphs of the whole MoE MLP or the whole iteration (static shapes), remove
    it; graphs that capture the preprocessing (``moe_preprocess``) do not: they move the
    token counts' copy to the host out of the graph, just before the expert-parallel
    exchange (``cuda_dtoh_point = "before_ep_alltoall"``), where the host still waits."""
    return not (drop_and_pad(c) or graph_scopes(c) & {"moe", "full_iteration"})


def moe_host_before_sync_s(model: ModelSpec, c: PlanBatch, gpu: GPUSpec) -> float:
    """Host time (s) of an MoE layer's forward before the dispatcher's synchronisation
    (:func:`moe_host_synchronised`): its attention, its router and the dispatcher's
    preprocessing (megatron-core 0.16.1 ``MoELayer.forward``: attention, then ``route`` and
    ``preprocess``; the all-to-all dispatcher's sync point ``before_ep_alltoall``, after the
    token counts and the first permutation), what graphs capture of them excepted
    (:func:`~configurator.cost.host_ops.host_layer_s`); the attention's operations are the
    plan's layer's (:func:`~configurator.cost.host_ops.layer_ops`: Megatron's own with the
    ``local`` backend)."""
    scopes = graph_scopes(c)
    if "full_iteration" in scopes:
        return 0.0
    attn = 0 if scopes & {"attn", "layer"} else layer_ops(model, c)[0]
    router = 0 if "moe_router" in scopes else HOST_OPS_MOE_PARTS["router"] - (
        MOE_ROUTER_OPS[0] - MOE_ROUTER_OPS[1]) * bool(c.moe_router_fusion)
    preprocess = 0 if "moe_preprocess" in scopes else HOST_OPS_MOE_PARTS["preprocess"]
    return (attn + router + preprocess) * gpu.efficiency.host_op_s


#: Kernels an MoE layer launches beyond a dense MLP's, forward (router GEMM, top-k, softmax,
#: auxiliary loss, token counts, permutations, dispatcher bookkeeping and its host sync):
#: counted from megatron-core 0.16.1's ``MoELayer.forward`` with the all-to-all dispatcher.
MOE_EXTRA_KERNELS = 30


def moe_mlp_costs(model: ModelSpec, c: PlanBatch, gpu: GPUSpec, T, kw):
    """Forward time (s) of one MoE layer's MLP part for one microbatch on one rank and the
    per-rank routed tokens: ``{"fwd", "eager_fwd", "eager_bwd", "act_fwd", "tokens_routed",
    "tokens_in"}`` (``eager_*``: the eager expert bias of
    :data:`~configurator.cost.host_ops.EXPERT_BIAS_BYTES` and the clamp of
    :data:`~configurator.cost.host_ops.CLAMP_BYTES`, each priced by its own backward count, 0
    for a model with neither; ``fwd`` includes ``eager_fwd``; ``act_fwd``: the routed
    experts' activation with its clamp, what ``moe_act`` recompute re-runs).

    Tokens per rank ``X = T/tp`` (sequence parallel), routed copies ``R = k·X·etp`` over
    ``E/ep`` local experts (grouped GEMMs: ``E/ep`` GEMMs of ``R·ep/E`` rows, fc1 ``h →
    f_e/etp`` (×2 SwiGLU), fc2 back; one cuBLAS GEMM per expert over Transformer Engine's
    streams, :func:`~configurator.cost.gemm.grouped_gemm_time_s`, or one kernel with
    ``moe_fused_grouped_mlp``), times the busiest expert-parallel rank's share
    (:func:`~configurator.core.plan_terms.routed_load_share`: the routing's load imbalance
    under dropless routing, the capacity factor's cap or padding; the other ranks wait for
    it at the combine), so ``tokens_routed`` is that rank's; the router GEMM ``X×h×E``
    (fp32 scores); a shared expert as a dense MLP over the ``T`` gathered tokens; memory-bound
    passes: permute and unpermute (read and write ``R·h``), the activation over ``R·f_e``,
    router softmax/top-k over ``X·E`` in fp32, plus :data:`MOE_EXTRA_KERNELS` launches."""
    eff = gpu.efficiency
    hbm_bw = gpu.hbm_bandwidth_Bps * eff.hbm   # attained by the fused element-wise kernels
    h, fe, E = model.hidden_size, model.moe_ffn_hidden_size, model.num_experts
    tp, etp, ep = (x.astype(float) for x in (c.tp, c.etp, c.ep))
    X = T / tp
    R = model.moe_router_topk * X * etp * routed_load_share(c, model)
    local = E / ep
    rows = R / local
    gate = 2 if model.swiglu else 1
    fused = bool(c.moe_fused_grouped_mlp)
    # one fused kernel for every local expert, or one cuBLAS GEMM per expert over TE's streams
    expert_gemm = gemm_time_s if fused else grouped_gemm_time_s
    grouped = dict(kw, batch=local)
    experts = (expert_gemm(rows, gate * fe / etp, h, **grouped)
               + expert_gemm(rows, h, fe / etp, **grouped))
    router = gemm_time_s(X, E, h, **dict(kw, peak=gpu.peak("bf16"), gemm_eff=eff.gemm,
                                         in_bytes=2.0))
    act_bytes = 2 * gate + 2     # the activation: read gate·f 16-bit inputs, write f
    shared = 0.0
    fs = model.moe_shared_expert_intermediate_size
    if fs:
        shared = (gemm_time_s(T, gate * fs / tp, h, **kw) + gemm_time_s(T, h, fs / tp, **kw)
                  + act_bytes * T * fs / tp / hbm_bw)
    # the routed experts' activation's bytes (fused into the grouped GEMMs' epilogues by the
    # op fuser, moe_fused_grouped_mlp, with the clamp, probabilities and fc2 bias)
    routed_act = 0.0 if fused else act_bytes * R * fe / etp
    elem = 2 * 2 * (X * h + R * h) + routed_act + 3 * 4 * X * E
    cast = (fp8_quantize_s(R * (h + fe / etp), gpu, fp8_scaling(c))   # FP8 casts of the
            if kw["in_bytes"] < 2 else 0.0)     # grouped GEMMs' inputs (forward)
    bias_f = bias_b = 0.0 * R
    if model.add_bias_linear and not fused:
        bias_f, bias_b = (eager_s(b * R * h, k[0] * local + k[1], gpu)
                          for b, k in zip(EXPERT_BIAS_BYTES, EXPERT_BIAS_KERNELS))
    clamp_f, clamp_b = (0.0 * R, 0.0 * R) if fused else clamp_s(model, R * gate * fe / etp,
                                                                gpu)
    # the routed experts' activation alone (what moe_act recompute re-runs) and its clamp
    act_fwd = routed_act / hbm_bw + eff.kernel_overhead_s + clamp_f
    # the experts' own work (what the all-to-all overlap runs as its "mlp" node)
    experts_fwd = experts + routed_act / hbm_bw + cast + bias_f + clamp_f
    shared_f = 0.0
    if fs:   # the shared expert's clamp: counted once, in clamp_f (eager)
        shared_f, shared_b = clamp_s(model, T * gate * fs / tp, gpu)
        clamp_f, clamp_b = clamp_f + shared_f, clamp_b + shared_b
    kernels = MOE_EXTRA_KERNELS - moe_fused_ops(c)
    fwd = (experts + router + shared + elem / hbm_bw + cast
           + kernels * eff.kernel_overhead_s + bias_f + clamp_f)
    return {"fwd": fwd, "eager_fwd": bias_f + clamp_f, "eager_bwd": bias_b + clamp_b,
            "act_fwd": act_fwd, "experts_fwd": experts_fwd, "shared_fwd": shared + shared_f,
            "tokens_routed": R, "tokens_in": X}
