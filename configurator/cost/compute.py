"""Compute time of one transformer layer for one microbatch, vectorised over plans.

Per layer and microbatch on one GPU (tokens per rank ``T = b·s/cp``):

* GEMMs (QKV, attention output, fc1, fc2; logits on the last stage) timed by a roofline
  plus a fixed cost per kernel —
  ``max(FLOPs / (η_gemm·peak), bytes / (η_hbm·HBM)) + t₀`` (:data:`GEMM_FIXED_S`) — so
  thin or small GEMMs lose efficiency; backward runs the dgrad and wgrad GEMMs (2× forward).
  (Williams et al. 2009 roofline; the fixed cost measured, :data:`GEMM_FIXED_S`.) Each
  weight gradient is accumulated into its FP32 (or BF16)
  ``main_grad`` once per microbatch, read and written, exposed where the GEMM reduces over
  few tokens (:func:`main_grad_accumulation_s`: routed experts, short microbatches).
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
  dense layer's MLP (``mlp``, with its tensor-parallel collectives), an MoE layer's MLP
  with router and all-to-alls (``moe``), the shared expert (``shared_experts``) and MLA's
  up projections with RoPE (``mla_up_proj``).
* FP8 (``fp8``, ``mxfp8``): Transformer Engine quantises every FP8 GEMM's activation input
  (forward) and output gradient (backward) into row-wise and column-wise (transposed) FP8
  copies (transformer_engine/pytorch/module/linear.py ``_Linear.forward`` quantises
  ``inputmat`` with both usages for the wgrad GEMM), at the bandwidth that kernel attains,
  measured far below the HBM's (:data:`FP8_CAST_HBM_FRACTION`, :func:`fp8_quantize_s`).
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
  (:func:`host_layer_s`; ``Efficiency.host_op_s``).
* YaRN RoPE (GPT-OSS): its concentration factor keeps megatron-core off Transformer Engine's
  fused RoPE, so q and k are rotated in eager ops (:data:`UNFUSED_ROPE_BYTES`).
* biased experts (GPT-OSS): megatron-core adds the fc2 biases outside the grouped GEMM, one
  expert at a time in FP32 (:data:`EXPERT_BIAS_BYTES`); a clamped gated MLP (GPT-OSS's
  ``activation_func_clamp_value``) clamps its fc1 output in eager ops (:data:`CLAMP_BYTES`).
"""

from __future__ import annotations

import numpy as np

from configurator.core.candidates import Candidates
from configurator.core.model import ModelSpec
from configurator.core.plan import (RECOMPUTE_CORE_ATTN, RECOMPUTE_FULL, RECOMPUTE_LAYERNORM,
                                    RECOMPUTE_MLA_UP_PROJ, RECOMPUTE_MLP, RECOMPUTE_MOE,
                                    RECOMPUTE_MOE_ACT, RECOMPUTE_SHARED_EXPERTS,
                                    capacity_share, is_fp8, main_grad_bytes)
from memory_model.activations import offloaded_layer_bytes
from memory_model.params import dense_layer_parameters, moe_layer_parameters
from topology.gpus import GPUSpec


#: Fixed time of one GEMM kernel (s): launch, the pipeline's fill and drain, the epilogue.
#: cuBLAS's Hopper kernels (nvjet, with stream-K and a choice of tiles) show no
#: wave-quantisation steps; ``t = FLOPs / (peak · η) + t₀`` fitted to 110 BF16 forward and
#: weight-gradient GEMMs timed with ``bench/gemm_shapes.py`` (``tests/data/
#: gemm_shapes_dense.csv``: weights 896–18,432 wide over 1,024–16,384 tokens) gives
#: η 0.72, the H100 preset's, and t₀ 21.5 µs (H100 21.0, H200 23.0), rms 6.6 %, where a
#: wave-quantised roofline (256×128 tiles) was 12.6 % and 14 % too fast below 0.1 TFLOP;
#: FP8 weight gradients fit η 0.66 and 25–31 µs. One figure for every GPU (not measured
#: off Hopper).
GEMM_FIXED_S = 22e-6


def gemm_time_s(M, N, K, *, batch, peak, gpu: GPUSpec, in_bytes, gemm_eff):
    """Time (s) of ``batch`` GEMMs of ``M×K · K×N`` on ``gpu`` in one kernel: the roofline
    (``peak`` FLOP/s at the attained fraction ``gemm_eff``, or the operands of ``in_bytes``
    and the 16-bit output at attained HBM bandwidth) plus :data:`GEMM_FIXED_S`."""
    eff = gpu.efficiency
    flops = 2.0 * M * N * K * batch
    t_compute = flops / (peak * gemm_eff)
    t_memory = batch * (in_bytes * (M * K + K * N) + 2.0 * M * N) / (
        gpu.hbm_bandwidth_Bps * eff.hbm)
    return np.maximum(t_compute, t_memory) + GEMM_FIXED_S


#: Reduction depth (tokens) up to which a weight-gradient GEMM's main-gradient traffic is
#: fully exposed; a deeper reduction hides the fraction ``1 − depth₀/depth`` of it under the
#: other tiles' reductions (:func:`main_grad_accumulation_s`). From ``bench/gemm_shapes.py``
#: on H100 and H200, the time an FP32 accumulation adds to the plain GEMM over the time of
#: its extra bytes (6 per weight) is ≈ 1.0 at 1,024 tokens, ≈ 0.85 at 2,048, ≈ 0.55 at 4,096
#: and 0.3–0.7 at 8,192 (dense weights and GPT-OSS's experts); ``min(1, 2048/depth)`` gives
#: 1, 1, 0.5 and 0.25.
ACCUMULATION_EXPOSED_TOKENS = 2048.0


def main_grad_accumulation_s(weights, c: Candidates, gpu: GPUSpec, tokens=None):
    """Seconds per microbatch to accumulate the gradients of ``weights`` parameters (per rank;
    broadcasts over plans) into their main gradients, on top of the weight-gradient GEMM:
    ``main_grad`` is read and written once per microbatch
    (:func:`configurator.core.plan.main_grad_bytes` each way) at the attained HBM bandwidth,
    the exposed fraction ``min(1, ACCUMULATION_EXPOSED_TOKENS / tokens)`` of it for a GEMM
    that reduces over ``tokens`` rows (None: an element-wise add, all of it).

    Megatron-LM's ``--gradient-accumulation-fusion`` (on by default) runs every weight-gradient
    GEMM with ``beta = 1`` into the parameter's ``main_grad``
    (megatron/core/tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication``;
    Transformer Engine ``fuse_wgrad_accumulation``), and a parameter without it (norms, the
    embedding) is added by the DDP hook (``main_grad.add_(param.grad)``,
    megatron/core/distributed/distributed_data_parallel.py ``_make_backward_post_hook``).
    Hopper's cooperative GEMM kernels read and write an output tile after its reduction, so
    where the reduction is short the traffic adds to the GEMM's time; a long one hides part
    of it under the other tiles' reductions. Measured with ``bench/gemm_shapes.py`` (torch
    2.11, cuBLAS, H100 and H200; ``tests/data/wgrad_accumulation.csv``): 97 weight gradients
    accumulated into FP32 or BF16 (dense 2048–16384-wide weights and GPT-OSS's 16 local
    experts, over 1,024–16,384 tokens) take 23 % longer than their roofline on average and
    0.8 % longer than roofline plus this term (rms 8.9 %); e.g. on the H100 GPT-OSS's 16
    experts' fc1 over 1,024 tokens each: 1.01 ms plainly, 1.16 into BF16 (priced 1.14),
    1.66 into FP32 (priced 1.51). It matters where a weight meets few tokens per
    microbatch: routed experts and short microbatches.

    The fit is on the accumulated GEMM's whole time, so the term also carries what a short
    reduction costs the GEMM itself, which the roofline does not see: written plainly, a
    weight gradient over 1,024 tokens runs 1.24× its roofline for dense weights and 1.33×
    for the experts (≈ 1.0 for dense weights from 4,096 tokens on). Against the plain GEMM
    alone, the accumulation's own increment is closer to ``(2·main_grad_bytes − 2)`` bytes
    with the same exposure; priced that way, with the fill cost as its own term
    (``1 + 256/tokens``), the published runs come out no closer (README, "Main-gradient
    accumulation")."""
    exposed = 1.0 if tokens is None else np.minimum(1.0, ACCUMULATION_EXPOSED_TOKENS / tokens)
    return (2.0 * main_grad_bytes(c.precision, c.grad_reduce_in_bf16) * weights * exposed
            / (gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm))


#: Bytes per embedding parameter and microbatch of its backward beyond the looked-up rows:
#: PyTorch's ``embedding_dense_backward`` returns a dense gradient (zero-filled, 2 bytes
#: written), which the DDP hook adds into ``main_grad`` (2 read; ``main_grad`` read and
#: written, :func:`main_grad_accumulation_s`).
EMBEDDING_GRAD_BYTES = 4.0


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
#: with ``bench/attention_masks.py`` (cuDNN fused attention through torch 2.11, cuDNN 9.19,
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
#: Measured with ``bench/attention_masks.py`` (``tests/data/attention_masks.csv``): cuDNN's
#: fused attention, Transformer Engine's choice on Hopper and later (``get_attention_backend``:
#: "FusedAttention preference on Hopper+"), through torch 2.11 on an H200, causal, 32 heads
#: of 128, 64k tokens per call, 512–8k keys, dropout 0.1 against none: +0.88–0.99 ps per
#: visited score forward (the forward 1.65–2.05× as long), +0.36–0.68 ps backward
#: (1.08–1.14×) over two runs; geometric means of the first over 132 SMs. FlashAttention-2
#: (Transformer Engine's backend on Ampere) pays less forward (+0.25–0.40 ps) and about as
#: much backward (+0.38–0.94 ps): A100 plans are priced at cuDNN's figures.
ATTENTION_DROPOUT_SCORES_PER_SM_S = (8.2e9, 1.6e10)
#: Bytes moved per element by Transformer Engine's FP8 quantisation of a 16-bit tensor: read
#: 2, write the row-wise and the column-wise FP8 copies, 1 each (``Float8Quantizer`` /
#: ``MXFP8Quantizer`` with both usages; MXFP8's E8M0 scales add 2/32).
FP8_CAST_BYTES = 4.0
#: Fraction of the HBM bandwidth that quantisation kernel attains: far below element-wise
#: kernels' (``Efficiency.hbm``). Measured: Transformer Engine PR #101 (H100 SXM, 3.35 TB/s):
#: the FP16 -> FP8 cast-transpose of a 4096 x 4096 tensor in 51.5 us, 67 MB at 1.30 TB/s,
#: 0.39. Check: Transformer Engine's GEMM profiling guide (docs/examples/gemm_profiling,
#: H200 NVL, 4.8 TB/s, 2026) puts current scaling's quantisation at ~17 % of 20.3 ms per
#: layer of hidden 4096, FFN 16384 over 15,872 tokens: 1.04e9 elements of 6 bytes (its amax
#: pass reads the tensor once more) at 1.8 TB/s, 0.38 of that GPU's HBM.
FP8_CAST_HBM_FRACTION = 0.39


#: Bytes per element a quantisation moves beyond :data:`FP8_CAST_BYTES`, by scaling:
#: current (``tensorwise``) scaling reads the tensor once more for its amax before the cast
#: ("two tensor reads per quantization", Transformer Engine docs, "FP8 Delayed Scaling");
#: block scales (``blockwise`` 1x128, ``mxfp8`` 1x32) write a 4-byte or 1-byte scale per
#: block in each of the two copies, their amax taken in the cast's own pass.
FP8_SCALING_EXTRA_BYTES = {"delayed": 0.0, "tensorwise": 2.0, "blockwise": 2 * 4 / 128,
                           "mxfp8": 2 * 1 / 32}


def fp8_scaling(c) -> str:
    """The plans' FP8 scaling: ``mxfp8`` for that precision, else ``fp8_recipe``."""
    return "mxfp8" if c.precision == "mxfp8" else c.fp8_recipe


def fp8_quantize_s(elements, gpu, scaling: str = "delayed"):
    """Time (s) of Transformer Engine quantising ``elements`` 16-bit elements into FP8
    row-wise and column-wise copies on ``gpu`` (:data:`FP8_CAST_BYTES` per element plus the
    scaling's :data:`FP8_SCALING_EXTRA_BYTES`, at :data:`FP8_CAST_HBM_FRACTION` of the HBM
    bandwidth; arrays ok)."""
    return (elements * (FP8_CAST_BYTES + FP8_SCALING_EXTRA_BYTES[scaling])
            / (gpu.hbm_bandwidth_Bps * FP8_CAST_HBM_FRACTION))


#: PyTorch operations the host issues per layer and microbatch, forward (backward issues
#: :data:`HOST_BACKWARD_FACTOR` times as many): a dense layer through Transformer Engine
#: (norm, QKV, RoPE ×2, core attention, projection, bias-dropout-add, norm, fc1,
#: activation, fc2, bias-dropout-add, their autograd bookkeeping and, with FP8, the casts
#: and amax/scale updates) and, for an MoE layer, the router (GEMM, softmax or sigmoid,
#: top-k, auxiliary-loss reductions), the permutation and the all-to-all dispatcher's
#: token counts, host synchronisation, exchanges and sorts (megatron-core 0.16.1
#: ``MoELayer.forward``, ``MoEAlltoAllTokenDispatcher``), plus per local expert the grouped
#: GEMMs' members (Transformer Engine ``GroupedLinear`` runs one GEMM per expert; with FP8
#: a cast per member input).
HOST_OPS_DENSE = 40
HOST_OPS_MOE = 90
HOST_OPS_PER_EXPERT = 2
HOST_BACKWARD_FACTOR = 2.0
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
HOST_OPS_MOE_PARTS = {"router": 30, "preprocess": 30, "dispatch": 30}
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


def moe_fused_ops(c: Candidates) -> float:
    """Operations an MoE layer's forward saves with the plans' ``moe_router_fusion`` and
    ``moe_permute_fusion`` (:data:`MOE_ROUTER_OPS`, :data:`MOE_PERMUTE_OPS`), on the host
    and as GPU kernels alike."""
    return ((MOE_ROUTER_OPS[0] - MOE_ROUTER_OPS[1]) * bool(c.moe_router_fusion)
            + (MOE_PERMUTE_OPS[0] - MOE_PERMUTE_OPS[1]) * bool(c.moe_permute_fusion))


def graph_scopes(c: Candidates) -> set[str]:
    """What the plans' CUDA graphs capture: ``cuda_graph_scope``'s names, ``layer`` for
    whole layers (Transformer Engine graphs without a scope), nothing without graphs."""
    if c.cuda_graph_impl == "none":
        return set()
    scopes = set(c.cuda_graph_scope.replace(",", " ").split())
    return scopes or {"layer"}


def host_layer_s(model: ModelSpec, c: Candidates, gpu: GPUSpec) -> tuple:
    """Host time (s) to issue one layer's forward for one microbatch: ``(dense, moe)``
    (:data:`HOST_OPS_DENSE` and friends × ``Efficiency.host_op_s``); FP8 doubles a grouped
    GEMM member's operations (its input cast); biased experts add their eager bias's
    operations (:data:`EXPERT_BIAS_KERNELS`), an unfused RoPE its own
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
    extra = (CLAMP_KERNELS[0] * (model.activation_func_clamp_value is not None)
             # unfused RoPE: its operations on q and k replace the two fused ones
             + (2 * UNFUSED_ROPE_KERNELS[0] - 2) * model.rope_unfused)
    attn = 0 if scopes & {"attn", "layer"} or full else HOST_OPS_ATTN
    mlp_ops = HOST_OPS_DENSE - HOST_OPS_ATTN + extra
    dense = (attn + (0 if scopes & {"mlp", "layer"} or full else mlp_ops)) * op
    if not model.is_moe:
        return dense, dense
    local = model.num_experts / c.ep.astype(float)
    per_expert = (HOST_OPS_PER_EXPERT * (2 if is_fp8(c.precision) else 1)
                  + EXPERT_BIAS_KERNELS[0][0] * model.add_bias_linear)
    parts = HOST_OPS_MOE_PARTS
    drop_pad = c.moe_expert_capacity_factor > 0 and c.moe_pad_expert_input_to_capacity
    if full or "moe" in scopes or ("layer" in scopes and drop_pad):
        moe_mlp = 0.0 * local
    else:
        moe_mlp = (mlp_ops + parts["dispatch"] + per_expert * local - moe_fused_ops(c)
                   + (0 if "moe_router" in scopes else parts["router"])
                   + (0 if "moe_preprocess" in scopes else parts["preprocess"]))
    return dense, (attn + moe_mlp) * op


def moe_host_synchronised(c: Candidates) -> bool:
    """Whether the plans' token dispatcher stops the host once per MoE layer's forward until
    the GPU has routed the tokens: dropless routing sizes the exchange on the host
    (megatron-core 0.16.1 token_dispatcher.py: the all-to-all dispatcher's
    ``_maybe_dtoh_and_synchronize`` "if not self.drop_and_pad"; DeepEP's ``.item()`` of the
    token count; HybridEP knows its sizes on the host only in drop-and-pad mode); padding to
    capacity, or graphs that capture the preprocessing (``moe_preprocess``, the whole MoE
    MLP or the whole iteration), remove it."""
    scopes = graph_scopes(c)
    drop_pad = c.moe_expert_capacity_factor > 0 and c.moe_pad_expert_input_to_capacity
    return not (drop_pad or scopes & {"moe_preprocess", "moe", "full_iteration"})


def moe_host_before_sync_s(model: ModelSpec, c: Candidates, gpu: GPUSpec) -> float:
    """Host time (s) of an MoE layer's forward before the dispatcher's synchronisation
    (:func:`moe_host_synchronised`): its attention and its router (what graphs capture of
    them excepted; :func:`host_layer_s`)."""
    scopes = graph_scopes(c)
    if "full_iteration" in scopes:
        return 0.0
    attn = 0 if scopes & {"attn", "layer"} else HOST_OPS_ATTN
    router = 0 if "moe_router" in scopes else HOST_OPS_MOE_PARTS["router"] - (
        MOE_ROUTER_OPS[0] - MOE_ROUTER_OPS[1]) * bool(c.moe_router_fusion)
    return (attn + router) * gpu.efficiency.host_op_s


#: Load-imbalance factor of routed experts: the busiest rank's tokens over the mean. 1.0
#: under force-balanced routing (Megatron ``--moe-router-force-load-balancing``, which the
#: published Megatron-Bridge MoE benchmarks use); dropless training with an auxiliary loss
#: runs above it, by an amount the routing decides, not the plan.
MOE_IMBALANCE = 1.0
#: Kernels an MoE layer launches beyond a dense MLP's, forward (router GEMM, top-k, softmax,
#: auxiliary loss, token counts, permutations, dispatcher bookkeeping and its host sync):
#: counted from megatron-core 0.16.1's ``MoELayer.forward`` with the all-to-all dispatcher.
MOE_EXTRA_KERNELS = 30


#: Attained HBM bytes per second and SM of PyTorch's eager element-wise kernels outside
#: any fusion: mixed-precision operands (16-bit with FP32), broadcasts, strided halves of a
#: tensor and 1-byte masks keep TensorIterator off its vectorised path, so each SM keeps
#: few bytes in flight and the kernels run at the rate memory latency allows per SM
#: (Little's law), not at the HBM bandwidth: an H200 runs them only 10-15 % faster than
#: an H100 although its HBM is 43 % faster. Measured with ``bench/kernel_shapes.py
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


def moe_mlp_costs(model: ModelSpec, c: Candidates, gpu: GPUSpec, T, kw):
    """Forward time (s) of one MoE layer's MLP part for one microbatch on one rank and the
    per-rank routed tokens: ``{"fwd", "eager_fwd", "eager_bwd", "act_fwd", "tokens_routed",
    "tokens_in"}`` (``eager_*``: the eager expert bias of :data:`EXPERT_BIAS_BYTES` and the
    clamp of :data:`CLAMP_BYTES`, each priced by its own backward count, 0 for a model with
    neither; ``fwd`` includes ``eager_fwd``; ``act_fwd``: the routed experts' activation
    with its clamp, what ``moe_act`` recompute re-runs).

    Tokens per rank ``X = T/tp`` (sequence parallel), routed copies ``R = k·X·etp`` over
    ``E/ep`` local experts (grouped GEMMs: ``E/ep`` GEMMs of ``R·ep/E`` rows, fc1 ``h →
    f_e/etp`` (×2 SwiGLU), fc2 back), times :data:`MOE_IMBALANCE`; the router GEMM ``X×h×E``
    (fp32 scores); a shared expert as a dense MLP over the ``T`` gathered tokens; memory-bound
    passes: permute and unpermute (read and write ``R·h``), the activation over ``R·f_e``,
    router softmax/top-k over ``X·E`` in fp32, plus :data:`MOE_EXTRA_KERNELS` launches."""
    eff = gpu.efficiency
    hbm_bw = gpu.hbm_bandwidth_Bps * eff.hbm   # attained by the fused element-wise kernels
    h, fe, E = model.hidden_size, model.moe_ffn_hidden_size, model.num_experts
    tp, etp, ep = (x.astype(float) for x in (c.tp, c.etp, c.ep))
    X = T / tp
    R = model.moe_router_topk * X * etp * MOE_IMBALANCE * capacity_share(c)
    local = E / ep
    rows = R / local
    gate = 2 if model.swiglu else 1
    grouped = dict(kw, batch=local)
    experts = (gemm_time_s(rows, gate * fe / etp, h, **grouped)
               + gemm_time_s(rows, h, fe / etp, **grouped))
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
    fused = bool(c.moe_fused_grouped_mlp)
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
    if fs:
        shared_f, shared_b = clamp_s(model, T * gate * fs / tp, gpu)
        clamp_f, clamp_b = clamp_f + shared_f, clamp_b + shared_b
        shared = shared + shared_f
    kernels = MOE_EXTRA_KERNELS - moe_fused_ops(c)
    fwd = (experts + router + shared + elem / hbm_bw + cast
           + kernels * eff.kernel_overhead_s + bias_f + clamp_f)
    return {"fwd": fwd, "eager_fwd": bias_f + clamp_f, "eager_bwd": bias_b + clamp_b,
            "act_fwd": act_fwd, "experts_fwd": experts_fwd, "shared_fwd": shared,
            "tokens_routed": R, "tokens_in": X}


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


def profiled_layer_s(profile, c: Candidates, fwd, bwd) -> tuple:
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


def layer_costs(model: ModelSpec, c: Candidates, gpu: GPUSpec, profile=None) -> dict:
    """Forward/backward/recompute times (s) of one layer for one microbatch, per plan.

    ``fwd``, ``bwd``, ``recompute`` are a dense layer's GPU times; ``moe_fwd``, ``moe_bwd``,
    ``moe_recompute`` an MoE layer's (equal to the dense ones for a dense model), its MLP
    replaced by :func:`moe_mlp_costs` (backward 2× the forward); ``tp_gemm_pairs``: the
    forward times of the GEMM after and the GEMM before each tensor-parallel collective
    pair, ``((QKV, projection), (fc1, fc2))``; ``host``, ``moe_host``:
    the host's time to issue each layer's forward (:func:`host_layer_s`), which
    :func:`configurator.cost.iteration.layer_type_times` sets against the layer's GPU time
    and communication. ``profile``: measured dense-layer times that replace the analytic
    ``fwd``/``bwd`` at the shapes it holds (:func:`profiled_layer_s`; an MoE layer keeps its
    analytic MLP difference on top). ``main_grad_acc``, ``moe_main_grad_acc``: the part of
    ``bwd``, ``moe_bwd`` that accumulates the layer's weight gradients into ``main_grad``
    (:func:`main_grad_accumulation_s`; added to a profiled layer too, which writes fresh
    gradients)."""
    eff = gpu.efficiency
    h, a, g, f = (model.hidden_size, model.num_attention_heads, model.num_query_groups,
                  model.ffn_hidden_size)
    dqk, dv = model.attention_heads_dims
    tp = c.tp.astype(float)
    s_q = model.seq_length / c.cp
    s_k = float(model.seq_length)
    T = c.mbs * s_q
    fp8 = is_fp8(c.precision)
    peak16 = gpu.peak("fp16" if c.precision == "fp16" else "bf16")
    gemm_peak, gemm_eff = gpu.gemm_rate(c.precision) if fp8 else (peak16, eff.gemm)
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
        attn_fwd = (gemm_time_s(s_q, s_k, dqk, **kw16) + gemm_time_s(s_q, dv, s_k, **kw16)
                    + (4 + 5 * (model.attention_dropout > 0)) * scores / (hbm * eff.hbm)
                    + 4 * T * a * dv / tp / (hbm * eff.hbm) + 3 * eff.kernel_overhead_s)
        attn_bwd = 2 * attn_fwd
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
            # higher precision to FP8, performs attention in FP8, and casts tensors back")
            speed = gpu.peak("fp8") / peak16
            qkv_o = T * ((a + 2 * g) * dqk + a * dv) / tp
            attn_fwd = attn_fwd / speed + fp8_quantize_s(qkv_o, gpu)
            attn_bwd = attn_bwd / speed + fp8_quantize_s(qkv_o + T * a * dv / tp, gpu)
        if model.attention_dropout > 0:   # the in-kernel dropout mask of every visited score
            visited = c.mbs * s_q * s_k * a / tp * model.attention_score_fraction
            attn_fwd = attn_fwd + visited / (ATTENTION_DROPOUT_SCORES_PER_SM_S[0] * gpu.num_sms)
            attn_bwd = attn_bwd + visited / (ATTENTION_DROPOUT_SCORES_PER_SM_S[1] * gpu.num_sms)
    cast_f = cast_b = 0.0
    hs = h / np.where(c.sequence_parallel, tp, 1.0)   # SP: cast before the all-gather
    if fp8:   # FP8 casts of the GEMM inputs (forward) and output gradients (backward)
        scaling = fp8_scaling(c)
        cast_f = fp8_quantize_s(T * (2 * hs + a * dv / tp + f / tp), gpu, scaling)
        cast_b = fp8_quantize_s(T * ((a + 2 * g) * dqk / tp + 2 * hs + fc1_n / tp), gpu,
                                scaling)
    clamp_f, clamp_b = clamp_s(model, T * fc1_n / tp, gpu)     # the dense MLP's clamp
    rope_f, rope_b = (eager_s(b * rope_qk, 2 * k, gpu) if model.rope_unfused else 0.0
                      for b, k in zip(UNFUSED_ROPE_BYTES, UNFUSED_ROPE_KERNELS))
    elem_fwd = (elem / (hbm * eff.hbm) + cast_f + n_kernels * eff.kernel_overhead_s
                + clamp_f + rope_f)
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
    # a dense MLP's forward: its GEMMs, activation, clamp and FP8 casts
    dense_mlp = gemm_mlp + mlp_elem / (hbm * eff.hbm) + clamp_f + (
        fp8_quantize_s(T * (hs + f / tp), gpu, fp8_scaling(c)) if fp8 else 0.0)
    up_proj = mla_up_projection_s(model, T, tp, kw) + (
        4 * rope_qk / (hbm * eff.hbm) + 2 * eff.kernel_overhead_s if fused_rope else rope_f)
    recompute = (np.select([rc == RECOMPUTE_FULL, (rc & RECOMPUTE_CORE_ATTN) != 0],
                           [fwd, attn_fwd], 0.0)
                 # layernorm: MLA's input norm is not fused into a linear (every layer)
                 + np.where(layernorm & bool(model.multi_latent_attention), norm_fwd, 0.0)
                 + np.where((rc & RECOMPUTE_MLA_UP_PROJ) != 0, up_proj, 0.0))
    # the MLP module: a dense layer's (an MoE layer ignores it)
    mlp_module = np.where((rc & RECOMPUTE_MLP) != 0, dense_mlp, 0.0)
    host_dense, host_moe = host_layer_s(model, c, gpu)
    off_every = off_moe = 0.0
    if c.offload_modules:
        off_every, off_moe = offloaded_layer_bytes(
            model, c.offload_modules, mbs=c.mbs, seq=s_q, tp=tp, sp=c.sequence_parallel,
            etp=c.etp, recompute=rc, precision=c.precision, capacity=capacity_share(c),
            stores_scores=c.stores_scores)
        fwd, bwd = offload_exposed(off_every, gpu, fwd, bwd)
    out = {"fwd": fwd, "bwd": bwd, "recompute": recompute + mlp_module,
           "attn": attn_fwd + attn_bwd,
           "attn_fwd": attn_fwd, "attn_bwd": attn_bwd,
           "tp_gemm_pairs": ((gemm_qkv, gemm_proj), (gemm_fc1, gemm_fc2)),
           "host": host_dense, "moe_host": host_moe,
           "moe_host_pre": moe_host_before_sync_s(model, c, gpu), "main_grad_acc": grad_acc,
           "tokens": T, "gemm_kw": kw}
    if model.is_moe:
        moe = moe_mlp_costs(model, c, gpu, T, kw)
        delta = moe["fwd"] - dense_mlp
        # the dense MLP's backward (2x its forward, and its clamp's) replaced by the MoE
        # MLP's (2x its forward, the eager bias and clamp by their own counts)
        # an MoE layer's pre-MLP norm (layernorm) and its experts' activation (moe_act)
        # (moe: the whole MLP with the router, not under the all-to-all overlap, whose
        # schedule calls the pieces itself; its all-to-alls are the EP term's)
        whole = ((rc & RECOMPUTE_MOE) != 0) & ~np.asarray(c.overlap_moe_expert_parallel_comm,
                                                          dtype=bool)
        moe_modules = (np.where(layernorm, norm_fwd, 0.0)
                       + np.where(whole, moe["fwd"],
                                  np.where((rc & RECOMPUTE_MOE_ACT) != 0, moe["act_fwd"], 0.0)
                                  + np.where((rc & RECOMPUTE_SHARED_EXPERTS) != 0,
                                             moe["shared_fwd"], 0.0)))
        non_expert, expert = moe_layer_parameters(model, c.tp, c.ep, c.etp)
        moe_acc = (main_grad_accumulation_s(non_expert, c, gpu, T)
                   + main_grad_accumulation_s(expert, c, gpu, moe["tokens_routed"]
                                              * c.ep / model.num_experts))
        moe_fwd, moe_bwd = offload_exposed(
            off_every + off_moe, gpu, fwd + delta,
            bwd - 2 * (dense_mlp - clamp_f) - clamp_b - grad_acc + moe_acc
            + 2 * (moe["fwd"] - moe["eager_fwd"]) + moe["eager_bwd"])
        out.update(moe_fwd=moe_fwd, moe_bwd=moe_bwd,
                   moe_recompute=np.where(rc == RECOMPUTE_FULL, fwd + delta,
                                          recompute + moe_modules),
                   tokens_routed=moe["tokens_routed"], tokens_in=moe["tokens_in"],
                   moe_experts_fwd=moe["experts_fwd"])
    else:
        out.update(moe_fwd=fwd, moe_bwd=bwd, moe_recompute=recompute + mlp_module,
                   tokens_routed=0.0 * T, tokens_in=0.0 * T, moe_experts_fwd=0.0 * T)
    out["moe_main_grad_acc"] = moe_acc if model.is_moe else grad_acc
    return out
