"""Compute time of one transformer layer for one microbatch, vectorised over plans.

Per layer and microbatch on one GPU (tokens per rank ``T = b·s/cp``):

* GEMMs (QKV, attention output, fc1, fc2; logits on the last stage) timed by a roofline
  plus a fixed cost per kernel (:mod:`configurator.cost.gemm`) —
  ``max(FLOPs / (η_gemm·peak), bytes / (η_hbm·HBM)) + t₀``
  (:data:`~configurator.cost.gemm.GEMM_FIXED_S`) — so thin or small GEMMs lose efficiency;
  backward runs the dgrad and wgrad GEMMs (2× forward). (Williams et al. 2009 roofline; the
  fixed cost measured, :data:`~configurator.cost.gemm.GEMM_FIXED_S`.) Each weight gradient
  is accumulated into its FP32 (or BF16) ``main_grad`` once per microbatch, read and
  written, exposed where the GEMM reduces over few tokens
  (:func:`~configurator.cost.gemm.main_grad_accumulation_s`: routed experts, short
  microbatches).
* core attention: score-storing backends (``local``/``unfused``) run two batched GEMMs per
  head plus softmax (and dropout) over ``a·s²`` scores from HBM; flash-style kernels do
  ``2·b·s_q·s_k·a·(d_qk + d_v)/t`` FLOPs times the fraction of query-key pairs computed
  (½ causal; less with a sliding window) at η_flash over the keys one call sees (a
  window's layers see at most the window), averaged over the layers' kinds
  (``ModelSpec.attention_layer_kinds``: GPT-OSS alternates windowed and full layers);
  backward 2.5×.
* memory-bound ops (norms, bias-dropout-add, GeLU/SwiGLU, RoPE, copies) from bytes moved
  and attained HBM bandwidth; backward moves ≈ 2× the forward bytes.
* recompute: ``full`` repeats the layer's forward (and its tensor-parallel collectives);
  ``selective`` repeats its ``recompute_modules``: core attention (the default; Korthikanti
  et al. 2022 §5), the norms not fused into a linear (``layernorm``: an MoE layer's pre-MLP
  norm, MLA's input norm), the routed experts' activation with its clamp (``moe_act``), a
  dense layer's MLP (``mlp``, with its tensor-parallel collectives and the norm fused into
  its fc1), an MoE layer's MLP with router and all-to-alls (``moe``), the shared expert
  (``shared_experts``) and MLA's up projections with RoPE (``mla_up_proj``); the norms, the
  activation and the up projections then copy their re-run outputs into the storage the
  forward freed (:func:`checkpoint_restore_s`).
* FP8 (``fp8``, ``mxfp8``): Transformer Engine quantises every FP8 GEMM's activation input
  (forward) and output gradient (backward) into row-wise and column-wise (transposed) FP8
  copies (transformer_engine/pytorch/module/linear.py ``_Linear.forward`` quantises
  ``inputmat`` with both usages for the wgrad GEMM; one copy serves both for tensor scaling
  on Blackwell, whose FP8 GEMMs take either layout,
  :func:`~configurator.cost.gemm.fp8_cast_bytes`), at the bandwidth that kernel attains,
  measured far below the HBM's (:data:`~configurator.cost.gemm.FP8_CAST_HBM_FRACTION`,
  :func:`~configurator.cost.gemm.fp8_quantize_s`).
  Weights are cast once per iteration (``is_first_microbatch``) and not charged per
  microbatch. Attention, norms, element-wise ops and the logits GEMM (Megatron's own
  output layer) stay in 16-bit.
* attention dropout in a fused kernel costs a fixed time per visited score for its random
  draws (:data:`ATTENTION_DROPOUT_SCORES_PER_SM_S`); score-storing attention moves its mask.
* fused attention efficiency grows with the key length the kernel sees (tile and pipeline
  fill, :func:`flash_efficiency`): with context parallelism one K/V block of ``s/cp``
  tokens per call for ``p2p``, the whole sequence for ``a2a`` (heads split instead), the
  visible prefix for ``all_gather``, on average half the sequence
  (:func:`cp_key_tokens`); ``p2p``'s ring steps after the first run without the causal
  mask, which saturates at far fewer keys (:func:`cp_causal_share`).
* the host: PyTorch issues every kernel from one CPU thread; where a layer's kernels are
  shorter than issuing them (small microbatches, MoE layers with many small kernels and the
  all-to-all dispatcher's host synchronisation) the layer takes the host's time instead
  (:func:`~configurator.cost.host_ops.host_layer_s`; ``Efficiency.host_op_s``).
* YaRN RoPE (GPT-OSS): its concentration factor keeps megatron-core off Transformer Engine's
  fused RoPE, so q and k are rotated in eager ops
  (:data:`~configurator.cost.host_ops.UNFUSED_ROPE_BYTES`).
* biased experts (GPT-OSS): megatron-core adds the fc2 biases outside the grouped GEMM, one
  expert at a time in FP32 (:data:`~configurator.cost.host_ops.EXPERT_BIAS_BYTES`); a clamped
  gated MLP (GPT-OSS's ``activation_func_clamp_value``) clamps its fc1 output in eager ops
  (:data:`~configurator.cost.host_ops.CLAMP_BYTES`).
* a mixture-of-experts layer's MLP: router, grouped expert GEMMs, shared expert and the
  passes around them (:mod:`configurator.cost.moe_compute`).
"""

from __future__ import annotations

import numpy as np

from configurator.core.plan_batch import PlanBatch
from configurator.core.plan_terms import moe_recompute_whole, softmax_path
from configurator.core.model import ModelSpec
from configurator.core.plan_values import (RECOMPUTE_CORE_ATTN, RECOMPUTE_FULL, RECOMPUTE_LAYERNORM,
                                           RECOMPUTE_MLA_UP_PROJ, RECOMPUTE_MLP,
                                           RECOMPUTE_MOE_ACT, RECOMPUTE_SHARED_EXPERTS, is_fp8,
                                           mfu_peak_precision)
from configurator.cost.gemm import (fp8_gemm_efficiency, fp8_norm_cast_bytes,
                                    fp8_norm_quantize_s, fp8_quantize_s, fp8_scaling,
                                    gemm_time_s, main_grad_accumulation_s)
from configurator.cost.host_ops import (UNFUSED_ROPE_BYTES, UNFUSED_ROPE_KERNELS,
                                        checkpoint_host_s, clamp_s, eager_s, host_layer_s,
                                        offload_exposed, selective_recompute_host_s)
from configurator.cost.moe_compute import moe_host_before_sync_s, moe_mlp_costs
from memory_model.activations import LayerInputs, layer_terms, offloaded_layer_bytes
from memory_model.params import dense_layer_parameters, moe_layer_parameters
from topology.gpus import GPUSpec


#: Bytes per embedding parameter and microbatch of its backward beyond the looked-up rows:
#: PyTorch's ``embedding_dense_backward`` returns a dense gradient (zero-filled, 2 bytes
#: written), which the DDP hook adds into ``main_grad`` (2 read; ``main_grad`` read and
#: written, :func:`~configurator.cost.gemm.main_grad_accumulation_s`).
EMBEDDING_GRAD_BYTES = 4.0


#: HBM bytes per element with which megatron-core's ``CheckpointWithoutOutput`` restores
#: an output it freed in the forward: after the backward's re-run it copies the re-run's
#: output into the original tensor's storage (megatron-core 0.16.1
#: tensor_parallel/random.py ``_recompute``: ``untyped_storage().resize_`` then ``.copy_``),
#: reading and writing 2 bytes an element of a 16-bit tensor.
CHECKPOINT_RESTORE_BYTES = 4.0


def checkpoint_restore_s(elements, gpu: GPUSpec):
    """GPU seconds of ``CheckpointWithoutOutput`` copying ``elements`` re-run output
    elements back into their freed storage (:data:`CHECKPOINT_RESTORE_BYTES` each at the
    attained HBM bandwidth, one kernel)."""
    eff = gpu.efficiency
    return (CHECKPOINT_RESTORE_BYTES * elements / (gpu.hbm_bandwidth_Bps * eff.hbm)
            + eff.kernel_overhead_s)


def mla_up_projection_s(model: ModelSpec, T, tp, kw):
    """Forward GEMM time of multi-latent attention's up projections (the query's from its
    latent, or its one projection without ``q_lora_rank``, and the key/value one), what
    ``mla_up_proj`` recompute re-runs; 0 without MLA."""
    if not model.multi_latent_attention:
        return 0.0 * T
    a, qk, pos, vd = (model.num_attention_heads, model.qk_head_dim,
                      model.qk_pos_emb_head_dim, model.v_head_dim)
    q_in = model.q_lora_rank or model.hidden_size
    return (gemm_time_s(T, a * (qk + pos) / tp, q_in, **kw)
            + gemm_time_s(T, a * (qk + vd) / tp, model.kv_lora_rank, **kw))


def _attention_gemms_s(model: ModelSpec, T, tp, kw):
    """Forward GEMM time of the attention projections ``(input side, output projection)``:
    QKV (or MLA's down and up projections; the down ones are replicated over tp) and the
    output projection."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.multi_latent_attention:
        qk, pos, vd = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        if model.q_lora_rank:
            q = (gemm_time_s(T, model.q_lora_rank, h, **kw)
                 + gemm_time_s(T, a * (qk + pos) / tp, model.q_lora_rank, **kw))
        else:
            q = gemm_time_s(T, a * (qk + pos) / tp, h, **kw)
        kv = (gemm_time_s(T, model.kv_lora_rank + pos, h, **kw)
              + gemm_time_s(T, a * (qk + vd) / tp, model.kv_lora_rank, **kw))
        return q + kv, gemm_time_s(T, h, a * vd / tp, **kw)
    g, d = model.num_query_groups, model.kv_channels
    return (gemm_time_s(T, (a + 2 * g) * d / tp, h, **kw),
            gemm_time_s(T, h, a * d / tp, **kw))


#: Key length (tokens) at which a fused attention kernel attains half of its long-sequence
#: efficiency: ``η(s_k) = η_flash · s_k / (s_k + FLASH_HALF_TOKENS)``. FlashAttention-3
#: (Shah et al. 2024, Fig. 5: H100, BF16, causal, head dim 128, forward) runs ≈ 225, 450,
#: 545 and 640 TFLOP/s at 512, 2k, 4k and 16k tokens; this form with 1,024 tokens and
#: η_flash ≈ 0.69 of 989 TFLOP/s passes within 3 % of each.
FLASH_HALF_TOKENS = 1024.0

#: The same for a kernel without a mask (every query sees every key of the block), as
#: context parallelism's ``p2p`` ring runs all but its first step: it saturates at far fewer
#: keys than a causal kernel, whose diagonal tiles are half wasted and unbalanced. Measured
#: with ``bench/kernels/attention_masks.py`` (cuDNN fused attention through torch 2.11, cuDNN 9.19,
#: on an H200; 32 heads of 128, 64k query tokens per call, 512–64k keys): the forward plus
#: 2.5× the backward at one rate, as :func:`layer_costs` prices them, fits a half-efficiency
#: length of 384 keys unmasked and 901 causal (a second run, ``tests/data/
#: attention_masks.csv``: 351 and 897; :data:`FLASH_HALF_TOKENS` is kept), the
#: unmasked/causal rate ratio within 9 % of the forms' at every length; forward alone
#: 67–140, as FlashAttention-3's unmasked forward figures (Shah et al. 2024, Fig. 5: 497–648
#: TFLOP/s at 512–16k keys), the backward 450–469.
FLASH_HALF_TOKENS_NO_MASK = 384.0

#: Attention dropout inside a fused attention kernel (``attention_dropout > 0``): the kernel
#: draws a Philox random number for every score it visits, forward and again backward, an
#: ALU cost on top of its matrix work, ``(forward, backward)`` scores per second per SM.
#: Measured with ``bench/kernels/attention_masks.py`` (``tests/data/attention_masks.csv``): cuDNN's
#: fused attention, Transformer Engine's choice on Hopper and later (``get_attention_backend``:
#: "FusedAttention preference on Hopper+"), through torch 2.11 on an H200, causal, 32 heads
#: of 128, 64k tokens per call, 512–8k keys, dropout 0.1 against none: +0.88–0.99 ps per
#: visited score forward (the forward 1.65–2.05× as long), +0.36–0.68 ps backward
#: (1.08–1.14×) over two runs; geometric means of the first over 132 SMs. FlashAttention-2
#: (Transformer Engine's backend on Ampere) pays less forward (+0.25–0.40 ps) and about as
#: much backward (+0.38–0.94 ps): A100 plans are priced at cuDNN's figures.
ATTENTION_DROPOUT_SCORES_PER_SM_S = (8.2e9, 1.6e10)


#: HBM bytes per attention score of the softmax over the stored scores, ``(forward,
#: backward)``, and its kernels (forward; backward as many again), by path: ``fused``, the
#: one kernel reading and writing 16-bit scores (backward priced at twice the forward, as
#: every score-storing pass here); ``torch``, PyTorch's in-place masked fill (read 2, write
#: 2; the causal mask, a cached ``s×s`` boolean, read from L2) and softmax (read 2, write 2),
#: backward the softmax's gradient (read the gradient and the output, write 2 each) and the
#: masked fill's (read 2, write 2); ``torch_fp32``, the same in FP32 between a cast up
#: (read 2, write 4) and a cast back (read 4, write 2), backward with both casts' gradients
#: (megatron-core 0.16.1 ``FusedScaleMaskSoftmax.forward_torch_softmax`` with
#: ``attention_softmax_in_fp32``, Transformer Engine's with its default
#: ``softmax_in_fp32=True``). Counted from the functions; Megatron-LM's query-key layer
#: scaling (``--apply-query-key-layer-scaling``, the 2021 default) multiplies the FP32
#: scores once more forward and backward (8 bytes each), not priced.
SOFTMAX_SCORE_BYTES = {"fused": (4.0, 8.0), "torch": (8.0, 10.0),
                       "torch_fp32": (28.0, 32.0)}
SOFTMAX_KERNELS = {"fused": 1, "torch": 2, "torch_fp32": 4}


def cp_key_tokens(seq_length: int, cp, cp_comm_type: str):
    """Keys per fused-attention call of one rank (before any sliding window): ``p2p`` runs
    one call per ring step over a block of ``s/cp`` keys; ``a2a`` one call over the whole
    sequence for ``a/cp`` heads; ``all_gather`` one call per local chunk (Transformer
    Engine's dual-chunk load balancing: chunks ``i`` and ``2cp-1-i`` of ``2cp``) over the
    keys it can see, ``(2cp+1)/(4cp)·s`` on average. Transformer Engine
    ``attn_forward_func_with_cp``."""
    cp = np.asarray(cp, dtype=float)
    s = float(seq_length)
    if cp_comm_type == "a2a":
        return np.full(cp.shape, s)
    if cp_comm_type == "all_gather":
        return (2 * cp + 1) / (4 * cp) * s
    return s / cp


def cp_causal_share(cp, cp_comm_type: str):
    """Share of a causal layer's attention work that runs in causal-masked kernel calls.

    ``p2p`` (Transformer Engine ``AttnFuncWithCPAndKVP2P``, dual-chunk load balancing): of
    its ``cp`` ring steps, each with the same work (two chunks' queries against two chunks'
    keys, half of them masked, or one chunk's against two), only the first, the
    ``"diagonal"`` section, is causal; the ``"lower-triangle"`` and ``"upper-triangle"``
    sections run with ``attn_mask_type "no_mask"``
    (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py):
    ``1/cp``. ``a2a`` and ``all_gather`` (and ``cp = 1``) run causal calls only: 1."""
    cp = np.asarray(cp, dtype=float)
    return 1.0 / cp if cp_comm_type == "p2p" else np.ones(cp.shape)


def flash_efficiency(eta_max: float, key_tokens, causal_share=1.0):
    """Attained fraction of peak of a fused attention kernel over ``key_tokens`` keys per
    call: ``eta_max · s / (s + FLASH_HALF_TOKENS)`` for causal calls, with
    :data:`FLASH_HALF_TOKENS_NO_MASK` for unmasked ones; ``causal_share`` of the work in the
    former (:func:`cp_causal_share`), the two rates combined by time (harmonic mean)."""
    key_tokens = np.asarray(key_tokens, dtype=float)
    causal = eta_max * key_tokens / (key_tokens + FLASH_HALF_TOKENS)
    no_mask = eta_max * key_tokens / (key_tokens + FLASH_HALF_TOKENS_NO_MASK)
    return 1.0 / (causal_share / causal + (1.0 - causal_share) / no_mask)


def profiled_layer_s(profile, c: PlanBatch, fwd, bwd) -> tuple:
    """``(fwd, bwd)`` with the measured times of ``profile`` (a
    :class:`configurator.core.profile.LayerProfile` of the model and precision) where it holds
    the plan's per-rank shape ``(tp, cp, mbs, sequence_parallel)``; analytic elsewhere.
    Arrays of seconds, one per plan."""
    keys = np.stack([c.tp, c.cp, c.mbs, c.sequence_parallel & (c.tp > 1)], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    measured = np.array([profile.lookup(*(int(x) for x in key)) or (np.nan, np.nan)
                         for key in uniq], dtype=float)[inverse.reshape(-1)]
    return tuple(np.where(np.isnan(measured[:, i]), analytic, measured[:, i])
                 for i, analytic in enumerate((fwd, bwd)))


def layer_costs(model: ModelSpec, c: PlanBatch, gpu: GPUSpec, profile=None) -> dict:
    """Forward/backward/recompute times (s) of one layer for one microbatch, per plan.

    ``fwd``, ``bwd``, ``recompute`` are a dense layer's GPU times; ``moe_fwd``, ``moe_bwd``,
    ``moe_recompute`` an MoE layer's (equal to the dense ones for a dense model), its MLP
    replaced by :func:`~configurator.cost.moe_compute.moe_mlp_costs` (backward 2× the
    forward); ``tp_gemm_pairs``: the forward times of the GEMM after and the GEMM before
    each tensor-parallel collective pair, ``((QKV, projection), (fc1, fc2))``; ``host``,
    ``moe_host``: the host's time to issue each layer's forward
    (:func:`~configurator.cost.host_ops.host_layer_s`), which
    :func:`configurator.cost.iteration.layer_type_times` sets against the layer's GPU time
    and communication; ``host_checkpoint``: a full recompute's checkpoint bookkeeping on the
    host, ``(forward, backward)`` seconds (:func:`~configurator.cost.host_ops.checkpoint_host_s`);
    ``host_selective``, ``moe_host_selective``: selective recompute's host seconds, its
    checkpoints' bookkeeping in the forward and the re-run modules with the rest of it in the
    backward, ``(forward, backward)``, of a dense and an MoE layer
    (:func:`~configurator.cost.host_ops.selective_recompute_host_s`).
    ``profile``: measured dense-layer times that replace the analytic
    ``fwd``/``bwd`` at the shapes it holds (:func:`profiled_layer_s`; an MoE layer keeps its
    analytic MLP difference on top). ``main_grad_acc``, ``moe_main_grad_acc``: the part of
    ``bwd``, ``moe_bwd`` that accumulates the layer's weight gradients into ``main_grad``
    (:func:`~configurator.cost.gemm.main_grad_accumulation_s`; added to a profiled layer
    too, which writes fresh gradients)."""
    eff = gpu.efficiency
    h, a, g, f = (model.hidden_size, model.num_attention_heads, model.num_query_groups,
                  model.ffn_hidden_size)
    dqk, dv = model.attention_heads_dims
    tp = c.tp.astype(float)
    s_q = model.seq_length / c.cp
    s_k = float(model.seq_length)
    T = c.mbs * s_q
    fp8 = is_fp8(c.precision)
    peak16 = gpu.peak(mfu_peak_precision(c.precision))
    gemm_peak, gemm_eff = gpu.gemm_rate(c.precision) if fp8 else (peak16, eff.gemm)
    if fp8:
        gemm_eff = fp8_gemm_efficiency(gpu, fp8_scaling(c), gemm_eff)
    hbm = gpu.hbm_bandwidth_Bps
    kw = dict(batch=1.0, peak=gemm_peak, gpu=gpu, in_bytes=1.0 if fp8 else 2.0,
              gemm_eff=gemm_eff)
    fc1_n = f * (2 if model.swiglu else 1)
    gemm_qkv, gemm_proj = _attention_gemms_s(model, T, tp, kw)
    gemm_fc1 = gemm_time_s(T, fc1_n / tp, h, **kw)
    gemm_fc2 = gemm_time_s(T, h, f / tp, **kw)
    gemm_mlp = gemm_fc1 + gemm_fc2
    gemm_fwd = gemm_qkv + gemm_proj + gemm_mlp
    rep = T * h / np.where(c.sequence_parallel, tp, 1.0)  # elements of replicated-or-SP activations
    drop = model.hidden_dropout > 0
    mlp_elem = (6 if model.swiglu else 4) * T * f / tp
    rope_qk = T * (a * dqk + g * dqk) / tp          # query and key elements RoPE rotates
    fused_rope = model.position_embedding_type == "rope" and not model.rope_unfused
    elem = (2 * 4 * rep + 2 * (6 + drop) * rep + mlp_elem + (4 * rope_qk if fused_rope else 0.0))
    n_kernels = 10
    key_tokens = cp_key_tokens(model.seq_length, c.cp, c.cp_comm_type)  # keys per call
    causal_share = cp_causal_share(c.cp, c.cp_comm_type)
    if c.stores_scores:
        heads = c.mbs * a / tp
        kw16 = dict(kw, peak=peak16, gemm_eff=eff.gemm, in_bytes=2.0, batch=heads)
        scores = s_q * s_k * heads
        fused, fp32 = softmax_path(c, a, s_q, s_k)
        path = np.where(fused, 0, np.where(fp32, 2, 1))     # fused, torch, torch_fp32
        names = ("fused", "torch", "torch_fp32")
        sm_f, sm_b = (np.choose(path, [SOFTMAX_SCORE_BYTES[k][i] for k in names])
                      for i in (0, 1))
        sm_k = np.choose(path, [SOFTMAX_KERNELS[k] for k in names])
        drop = 5 * (model.attention_dropout > 0)
        rest = (gemm_time_s(s_q, s_k, dqk, **kw16) + gemm_time_s(s_q, dv, s_k, **kw16)
                + drop * scores / (hbm * eff.hbm) + 4 * T * a * dv / tp / (hbm * eff.hbm)
                + (2 + sm_k) * eff.kernel_overhead_s)
        attn_fwd = rest + sm_f * scores / (hbm * eff.hbm)
        attn_bwd = 2 * rest + sm_b * scores / (hbm * eff.hbm)
    else:
        pairs = 2.0 * c.mbs * s_q * s_k * a * (dqk + dv) / tp
        attn_fwd = eff.kernel_overhead_s
        for share, fraction, window in model.attention_layer_kinds:
            # a sliding window's band is masked in every call
            keys, masked = ((key_tokens, causal_share) if window is None
                            else (np.minimum(key_tokens, window), 1.0))
            attn_fwd = attn_fwd + share * pairs * fraction / (
                peak16 * flash_efficiency(eff.flash_attention, keys, masked))
        attn_bwd = 2.5 * attn_fwd
        if c.fp8_dot_product_attention:
            # FP8 attention (cuDNN through Transformer Engine, fp8_dpa): the kernels at the
            # FP8 peak with the attained fraction of the 16-bit ones; Q, K, V quantised and
            # the output cast back forward, the output gradient quantised and dQ, dK, dV cast
            # back backward (transformer_engine/common/recipe: "DPA casts the inputs from
            # higher precision to FP8, performs attention in FP8, and casts tensors back"),
            # row-wise copies only (dot_product_attention/utils.py get_attention_quantizers:
            # set_usage(rowwise=True, columnwise=False))
            speed = gpu.peak("fp8") / peak16
            qkv_o = T * ((a + 2 * g) * dqk + a * dv) / tp
            attn_fwd = attn_fwd / speed + fp8_quantize_s(qkv_o, gpu, columnwise=False)
            attn_bwd = attn_bwd / speed + fp8_quantize_s(qkv_o + T * a * dv / tp, gpu,
                                                         columnwise=False)
        if model.attention_dropout > 0:   # the in-kernel dropout mask of every visited score
            visited = c.mbs * s_q * s_k * a / tp * model.attention_score_fraction
            attn_fwd = attn_fwd + visited / (ATTENTION_DROPOUT_SCORES_PER_SM_S[0] * gpu.num_sms)
            attn_bwd = attn_bwd + visited / (ATTENTION_DROPOUT_SCORES_PER_SM_S[1] * gpu.num_sms)
    cast_f = cast_b = cast_mlp_f = cast_mlp_b = norm_saved = mlp_norm_saved = 0.0
    hs = h / np.where(c.sequence_parallel, tp, 1.0)   # SP: cast before the all-gather
    # the norm outputs a LayerNormLinear quantises (fp8_norm_cast_bytes): fc1's, and QKV's
    # but under MLA, whose down projections read a separate norm's output
    qkv_normed = 0.0 if model.multi_latent_attention else T * hs
    if fp8:   # FP8 casts of the GEMM inputs (forward) and output gradients (backward)
        scaling = fp8_scaling(c)
        saved = fp8_norm_cast_bytes(gpu, scaling)[1] / (hbm * eff.hbm)
        mlp_norm_saved = T * hs * saved
        norm_saved = qkv_normed * saved + mlp_norm_saved
        cast_mlp_f = fp8_quantize_s(T * f / tp, gpu, scaling) + fp8_norm_quantize_s(
            T * hs, gpu, scaling)
        cast_mlp_b = fp8_quantize_s(T * (hs + fc1_n / tp), gpu, scaling)
        # QKV's input in its norm's kernel (but under MLA), the projection's apart
        cast_f = (cast_mlp_f + fp8_norm_quantize_s(qkv_normed, gpu, scaling)
                  + fp8_quantize_s(T * hs - qkv_normed + T * a * dv / tp, gpu, scaling))
        cast_b = cast_mlp_b + fp8_quantize_s(T * ((a + 2 * g) * dqk / tp + hs), gpu, scaling)
    clamp_f, clamp_b = clamp_s(model, T * fc1_n / tp, gpu)     # the dense MLP's clamp
    rope_f, rope_b = (eager_s(b * rope_qk, 2 * k, gpu) if model.rope_unfused else 0.0
                      for b, k in zip(UNFUSED_ROPE_BYTES, UNFUSED_ROPE_KERNELS))
    elem_fwd = (elem / (hbm * eff.hbm) - norm_saved + cast_f
                + n_kernels * eff.kernel_overhead_s + clamp_f + rope_f)
    elem_bwd = (2 * elem / (hbm * eff.hbm) + cast_b + 2 * n_kernels * eff.kernel_overhead_s
                + clamp_b + rope_b)
    fwd = gemm_fwd + attn_fwd + elem_fwd
    bwd = 2 * gemm_fwd + attn_bwd + elem_bwd
    if profile is not None:
        fwd, bwd = profiled_layer_s(profile, c, fwd, bwd)
    # Megatron's main-gradient accumulation (a profiled layer writes fresh gradients)
    grad_acc = main_grad_accumulation_s(dense_layer_parameters(model, c.tp), c, gpu, T)
    bwd = bwd + grad_acc
    rc = c.recompute_code
    layernorm = (rc & RECOMPUTE_LAYERNORM) != 0
    # one norm's forward (read 2, write 2 bytes per element of the replicated or SP slice)
    norm_fwd = 4 * rep / (hbm * eff.hbm) + eff.kernel_overhead_s
    # a dense MLP's forward: its GEMMs, activation, clamp and FP8 casts (fc1's input in its
    # norm's kernel); its backward: twice the GEMMs and activation, the clamp's, the casts of
    # fc2's and fc1's output gradients
    dense_mlp = gemm_mlp + mlp_elem / (hbm * eff.hbm) + clamp_f + cast_mlp_f
    dense_mlp_bwd = 2 * (gemm_mlp + mlp_elem / (hbm * eff.hbm)) + clamp_b + cast_mlp_b
    # the modules under CheckpointWithoutOutput (a norm, MLA's up projections, the experts'
    # activation) also copy the re-run's outputs back into the storage freed in the forward
    # (checkpoint_restore_s)
    norm_rerun = norm_fwd + checkpoint_restore_s(rep, gpu)
    up_proj = mla_up_projection_s(model, T, tp, kw) + (
        4 * rope_qk / (hbm * eff.hbm) + 2 * eff.kernel_overhead_s if fused_rope else rope_f)
    if model.multi_latent_attention:     # the query, key and value the up projections give
        up_proj = up_proj + checkpoint_restore_s(
            T * a * (2 * (model.qk_head_dim + model.qk_pos_emb_head_dim) + model.v_head_dim)
            / tp, gpu)
    recompute = (np.select([rc == RECOMPUTE_FULL, (rc & RECOMPUTE_CORE_ATTN) != 0],
                           [fwd, attn_fwd], 0.0)
                 # layernorm: MLA's input norm is not fused into a linear (every layer)
                 + np.where(layernorm & bool(model.multi_latent_attention), norm_rerun, 0.0)
                 + np.where((rc & RECOMPUTE_MLA_UP_PROJ) != 0, up_proj, 0.0))
    # the MLP module: a dense layer's with the norm fused into its fc1 (megatron-core
    # transformer_layer.py checkpoints ``self.mlp``, whose ``linear_fc1`` is Transformer
    # Engine's LayerNormLinear, the pre-MLP norm an IdentityOp); an MoE layer ignores it
    mlp_module = np.where((rc & RECOMPUTE_MLP) != 0,
                          dense_mlp + norm_fwd - mlp_norm_saved, 0.0)
    host_dense, host_moe = host_layer_s(model, c, gpu)
    selective = selective_recompute_host_s(model, c, gpu)
    off_every = off_moe = 0.0
    gpu_fwd, gpu_bwd = fwd, bwd     # the layer's own passes, before any offload copy
    if c.offload_modules:
        off_every, off_moe = offloaded_layer_bytes(model, LayerInputs.of_plans(model, c))
        fwd, bwd = offload_exposed(off_every, gpu, fwd, bwd)
    out = {"fwd": fwd, "bwd": bwd, "recompute": recompute + mlp_module,
           "attn": attn_fwd + attn_bwd,
           "attn_fwd": attn_fwd, "attn_bwd": attn_bwd,
           "tp_gemm_pairs": ((gemm_qkv, gemm_proj), (gemm_fc1, gemm_fc2)),
           "host": host_dense, "moe_host": host_moe,
           "host_checkpoint": checkpoint_host_s(c, gpu),
           "host_selective": selective[0], "moe_host_selective": selective[1],
           "moe_host_pre": moe_host_before_sync_s(model, c, gpu), "main_grad_acc": grad_acc,
           "tokens": T, "gemm_kw": kw}
    if model.is_moe:
        moe = moe_mlp_costs(model, c, gpu, T, kw)
        # the dense MLP replaced by the MoE MLP, and the pre-MLP norm's FP8 write by a 16-bit
        # one (a separate norm: the router and the dispatcher read its output)
        delta = moe["fwd"] - dense_mlp + mlp_norm_saved
        # the dense MLP's backward (dense_mlp_bwd) replaced by the MoE MLP's (2x its
        # forward, the eager bias and clamp by their own counts)
        # an MoE layer's pre-MLP norm (layernorm) and its experts' activation (moe_act)
        # (moe: the whole MLP with the router, not under the all-to-all overlap, whose
        # schedule calls the pieces itself; its all-to-alls are the EP term's)
        whole = moe_recompute_whole(rc, c.overlap_moe_expert_parallel_comm)
        # (fused into the grouped GEMMs' epilogues, the activation has no output of its own)
        act_rerun = moe["act_fwd"] + (0.0 if c.moe_fused_grouped_mlp else checkpoint_restore_s(
            moe["tokens_routed"] * model.moe_ffn_hidden_size / c.etp, gpu))
        moe_modules = (np.where(layernorm, norm_rerun, 0.0)
                       + np.where(whole, moe["fwd"],
                                  np.where((rc & RECOMPUTE_MOE_ACT) != 0, act_rerun, 0.0)
                                  + np.where((rc & RECOMPUTE_SHARED_EXPERTS) != 0,
                                             moe["shared_fwd"], 0.0)))
        non_expert, expert = moe_layer_parameters(model, c.tp, c.ep, c.etp)
        moe_acc = (main_grad_accumulation_s(non_expert, c, gpu, T)
                   + main_grad_accumulation_s(expert, c, gpu, moe["tokens_routed"]
                                              * c.ep / model.num_experts))
        # (from the dense layer's own passes: its offload copy is not the MoE layer's)
        moe_fwd, moe_bwd = offload_exposed(
            off_every + off_moe, gpu, gpu_fwd + delta,
            gpu_bwd - dense_mlp_bwd - grad_acc + moe_acc
            + 2 * (moe["fwd"] - moe["eager_fwd"]) + moe["eager_bwd"])
        out.update(moe_fwd=moe_fwd, moe_bwd=moe_bwd,
                   moe_recompute=np.where(rc == RECOMPUTE_FULL, gpu_fwd + delta,
                                          recompute + moe_modules),
                   tokens_routed=moe["tokens_routed"], tokens_in=moe["tokens_in"],
                   moe_experts_fwd=moe["experts_fwd"])
    else:
        out.update(moe_fwd=fwd, moe_bwd=bwd, moe_recompute=out["recompute"],
                   tokens_routed=0.0 * T, tokens_in=0.0 * T, moe_experts_fwd=0.0 * T)
    out["moe_main_grad_acc"] = moe_acc if model.is_moe else grad_acc
    if c.cpu_offloading_num_layers:
        out.update(cpu_offloaded_passes(model, c, gpu, out))
    return out


def cpu_offloaded_passes(model: ModelSpec, c: PlanBatch, gpu: GPUSpec, costs: dict) -> dict:
    """A layer's passes (``fwd``, ``bwd``, ``moe_fwd``, ``moe_bwd``; s) under CPU offloading of
    whole layers (``c.cpu_offloading_num_layers``, ``N`` of the model's ``L``): an offloaded
    layer's saved tensors (its activation bytes, :func:`memory_model.activations.layer_terms`
    ``layer`` and ``moe_delta``) go to host memory on a side stream while the next layers'
    forward runs and come back, prefetched a layer ahead, during the backward (Transformer
    Engine's CPU offload context as megatron-core 0.16.1 ``TransformerBlock`` sets it up), so
    each copy sets its pass's time where it is longer, at the GPU-host link's rate
    (:func:`configurator.cost.host_ops.offload_exposed`); the share ``N / L`` of the layers
    does so, dense and MoE alike (the offloaded layers are the first ``N``; a model whose
    first layers are dense offloads those first, which the share leaves out)."""
    t = layer_terms(model, LayerInputs.of_plans(model, c))
    share = c.cpu_offloading_num_layers / model.num_layers
    out = {}
    for fwd_key, bwd_key, nbytes in (("fwd", "bwd", t["layer"]),
                                     ("moe_fwd", "moe_bwd", t["layer"] + t["moe_delta"])):
        fwd, bwd = costs[fwd_key], costs[bwd_key]
        off_fwd, off_bwd = offload_exposed(nbytes, gpu, fwd, bwd)
        out[fwd_key] = fwd + share * (off_fwd - fwd)
        out[bwd_key] = bwd + share * (off_bwd - bwd)
    return out
