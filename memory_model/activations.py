"""Activation bytes stored for backward, per transformer layer and per pipeline stage.

Per layer and microbatch, 16-bit activations, following Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198, §4.1 and
Table 2) and the tensors megatron-core 0.16.1 keeps (``tests/megatron_reference.py``
measures them), with ``s`` the sequence held by one rank (``seq_length / cp``), ``b`` the
micro-batch size, ``h`` hidden, ``a`` heads, ``g`` query groups, ``d = h/a``, ``f`` FFN size,
``t`` tp, ``X = s·b``:

* replicated over tp (÷t with sequence parallelism): the inputs of the two norms
  (``TransformerLayer._forward_attention`` / ``_forward_mlp``; 2Xh each) and of QKV and fc1
  (``LinearWithGradAccumulationAndAsyncCommunication.forward`` saves its input; 2Xh each),
  and the two bias-dropout-add masks (``fused_bias_dropout._bias_dropout_add_func``; 1-byte
  masks of ``torch.native_dropout``, Xh each, only when ``hidden_dropout > 0``: a dropout of
  0 returns its input and keeps nothing). Table 2's ``10·sbh``.
* split over tp: the core-attention output (linear_proj's input, 2Xh; ``2X·a·d_v`` where the
  heads' width differs from ``h``, :func:`attention_output_elements`); fc1 output (2Xf; 4Xf
  with SwiGLU: ``fused_bias_gelu.GeLUFunction`` / ``fused_bias_swiglu.SwiGLUFunction`` keep
  the activation input, Megatron's default ``--bias-gelu-fusion``/``--bias-swiglu-fusion``)
  and fc2's input (2Xf); and the query/key/value storages below. Table 2's ``24·sbh/t``.
* query/key/value (``attention.py`` ``SelfAttention.get_query_key_value_tensors``): Q, K, V
  are views of one QKV output ``M = 2X·d·(a + 2g)``. A view keeps its whole storage alive, so
  whatever keeps V keeps M. RoPE (``rope_utils.apply_rotary_pos_emb``) makes new Q, K
  (2Xh, 2Xh·g/a); with GQA the query ``reshape`` copies (2Xh). megatron-core's local
  ``DotProductAttention.forward`` then ``repeat_interleave``-s K and V to ``a`` heads for GQA
  (2Xh each, which ``baddbmm``/``bmm`` keep instead of M). Kept: MHA ``M`` (+ Q, K with RoPE);
  GQA ``3·2Xh``. Flash/fused kernels (Transformer Engine) are modelled as keeping contiguous
  Q, K, V (``2Xh(1 + 2g/a)``) plus the fp32 log-sum-exp ``4·a·X``; that path is not measured
  here (it needs TE and a GPU).
* attention scores (score-storing backends, no selective recompute): the 16-bit softmax
  output ``2·a·s·X`` (``FusedScaleMaskSoftmax``; the fused CUDA kernel keeps its 16-bit
  ``softmax_results``), plus the 1-byte dropout mask ``a·s·X`` and the dropout output
  ``2·a·s·X`` (kept by the ``bmm`` with V) when ``attention_dropout > 0``; Table 2's
  ``5as²b``; ÷t.
* selective recompute (``recompute_modules=["core_attn"]``:
  ``Attention._checkpointed_attention_forward`` → ``tensor_parallel.checkpoint``) keeps the
  checkpoint's inputs, i.e. Q, K, V as handed to core attention: ``M`` plus new Q (RoPE or
  GQA) and new K (RoPE). The scores (and GQA's expanded K, V) exist again while a layer's
  attention is recomputed in backward.
* full recompute (``TransformerBlock._checkpointed_forward``, uniform, 1 layer) keeps the
  layer input (``2Xh``, ÷t with sequence parallelism) and re-materialises one layer's
  activations during its backward.

FP8 (``fp8``: Transformer Engine Float8 tensors, delayed or current scaling alike; ``mxfp8``:
MXFP8 blocks of 32 with an E8M0 scale each, ``q = 1 + 1/32`` bytes a value;
:func:`linear_input_bytes`). With
Megatron's TE spec the GEMMs are TE modules, which save the *quantised* input for the
weight-gradient GEMM instead of the 16-bit one (Transformer Engine 2.x,
``transformer_engine/pytorch/module/linear.py`` ``_Linear.forward`` — "Prepare backward state":
``saved_inputmat = inputmat`` after ``input_quantizer(inputmat)``, with the row-wise data
dropped by ``update_usage(rowwise_usage=False, columnwise_usage=True)``, or the column-wise
data never made when sequence parallelism gathers it again in backward, "All-gather is not
supported with FP8 column-wise data"; ``layernorm_linear.py`` ``_LayerNormLinear.forward``
saves ``inputmat`` (the 16-bit norm input), the quantised ``ln_out`` (local shard with
sequence parallelism, ``ctx.ln_out_needs_gather``), ``mu`` and ``rsigma``). Either way one
quantised copy of ``q`` bytes a value is kept (the other orientation exists only during the
forward GEMM). Per layer and microbatch, against the 16-bit terms above:

* QKV and fc1 inputs (``TELayerNormColumnParallelLinear``'s ``ln_out``): ``q·Xh`` each instead
  of ``2Xh`` (÷t with SP); the norm inputs stay 16-bit. With MLA the norm output feeds two TE
  linears (q and kv down projections), each quantising its own copy: ``2·q·Xh``; the latents'
  up projections save ``q`` bytes a value, their norms' inputs 16-bit (:func:`mla_latent_bytes`).
* linear_proj input: ``TERowParallelLinear`` saves ``q·Xh/t``. A flash/fused kernel also keeps
  its own 16-bit output for backward (TE ``backends.py`` ``FusedAttnFunc.forward``:
  ``qkvo_tensors = (q, k, v, out)``), so without selective recompute both are kept
  (``(2 + q)·Xh/t``). megatron-core 0.16.1 drops the quantised copy only for MLA with a
  non-delayed recipe (``multi_latent_attention.py`` ``set_save_original_input(self.linear_proj)``
  when ``fp8_recipe != 'delayed'``: here ``mxfp8``); later versions do it for every attention
  (Megatron-LM ``attention.py``, same condition).
* MLP: the activation's input stays 16-bit (``fused_bias_swiglu.SwiGLUFunction`` /
  ``GeLUFunction``, Megatron's own, not TE; ``activation_func_fp8_input_store`` is off by
  default), fc2 (``TERowParallelLinear``) keeps ``q·Xf/t``: ``(2·gate + q)·Xf/t``.
* core attention runs in 16-bit (``--fp8-dot-product-attention`` is off): Q, K, V, scores and
  log-sum-exp as above. Residual-stream tensors, checkpoints and the output layer (Megatron's
  own ``ColumnParallelLinear``) stay 16-bit.

Flash attention and selective recompute: a TE kernel saves the Q, K, V it runs on, and
``dot_product_attention/utils.py`` ``get_qkv_layout`` copies them to contiguous tensors when
their strides match no supported layout ("force q,k,v to be contiguous") — the case for V, a
strided view of the QKV output, next to RoPE's new Q and K. Without recompute the QKV output
``M`` is then freed after the forward (nothing else saves it: ``_SplitAlongDim`` and the fused
RoPE keep no input), so the layer keeps ``2Xh(1 + 2g/a)/t`` plus the log-sum-exp. Selective
recompute saves the checkpoint's inputs (``CheckpointFunction.forward``:
``ctx.save_for_backward(*args)``), V among them, and a saved view pins its base: ``M`` plus the
new Q and K. For RoPE models (and GQA) selective recompute of a flash kernel therefore keeps
``M − V`` (the Q and K parts of ``M``) more than no recompute and saves only the
log-sum-exp — and, with FP8, the kernel's 16-bit output. Where the handed tensors are all
views of ``M`` (MHA without RoPE) or contiguous, selective keeps at most what the kernel keeps.

Multi-latent attention (DeepSeek-V3): Q and K have ``a`` heads of ``qk + qk_pos`` and V of
``v`` (``_attention_sizes``), plus the replicated low-rank latents (:func:`mla_latent_bytes`).
Mixture-of-experts layers: :func:`moe_mlp_activation_delta`. Neither is measured against
megatron-core with Transformer Engine here (the MoE one is, on CPU:
``tests/megatron_reference.py``).

Terms of order ``X`` or ``s·d`` (norm statistics, RoPE frequencies, int64 token ids and
cross-entropy targets) are left out: below 0.1 % of a layer at ``h ≥ 1024``.

Stage extras: the first stage keeps the embedding-dropout mask (``LanguageModelEmbedding``,
Xh bytes, ÷t with SP; none when ``hidden_dropout == 0``) per microbatch in flight; the last
stage keeps the final-norm input and output-layer input (2Xh each, ÷t with SP) and the fp32
softmax of the cross entropy ``4·X·V/t`` (``tensor_parallel/cross_entropy.py``
``_VocabParallelCrossEntropy.forward`` saves ``exp_logits``) of one microbatch
(Korthikanti §4.2.2: ``4sbh/t·(1 + V/h)``).

Peak per stage: the larger of the end of the forward of the last microbatch in flight and
the recomputation of one layer (full) or one layer's core attention (selective) during
backward, when the output-layer terms are already freed (``stage_activation_phases``).

Microbatches in flight on pipeline rank ``r`` come from the schedule seam,
:mod:`configurator.core.schedule` (1F1B ``min(pp - r, m)``; interleaved
``min(m·vp, 2(pp-r-1) + (vp-1)·pp + 1)`` model chunks of ``L/(pp·vp)`` layers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from configurator.core.model import ModelSpec
from configurator.core.plan_batch import PlanBatch
from configurator.core.plan_terms import moe_recompute_whole, routed_load_share, softmax_path
from configurator.core.plan_values import (RECOMPUTE_CORE_ATTN, RECOMPUTE_FULL, RECOMPUTE_LAYERNORM,
                                           RECOMPUTE_MLA_UP_PROJ, RECOMPUTE_MLP,
                                           RECOMPUTE_MOE_ACT, RECOMPUTE_SHARED_EXPERTS)
from configurator.core.schedule import inflight_layers, inflight_microbatches_1f1b
from memory_model.params import padded_vocab_size


@dataclass(frozen=True, kw_only=True)
class LayerInputs:
    """What the activations of one transformer layer and microbatch depend on, per plan
    (numpy arrays broadcast, or scalars): the layer's view of a
    :class:`~configurator.core.plan_batch.PlanBatch` (:meth:`of_plans`).

    ``seq``: tokens of a sequence one rank holds (``seq_length / cp``); ``mbs``:
    micro_batch_size; ``tp``, ``etp``: tensor and expert-tensor parallel sizes; ``sp``:
    sequence parallelism; ``recompute``: the recompute code
    (:func:`configurator.core.plan_terms.recompute_code`); ``precision``: the plan's (FP8 keeps
    GEMM inputs quantised, module docstring); ``capacity``: the routed copies the busiest
    expert-parallel rank holds over the balanced dropless count, its peak being the one that
    counts (:func:`configurator.core.plan_terms.routed_load_share`: the routing's load
    imbalance, the capacity factor's cap or padding); ``a2a_overlap``: the
    expert all-to-all overlap's schedule (Megatron ``--overlap-moe-expert-parallel-comm``),
    which does not apply the ``moe`` recompute module; ``stores_scores``: a backend that keeps
    the ``s×s`` scores (megatron-core's local ``DotProductAttention``) rather than a
    flash-style kernel; ``softmax_fp32``: such a backend's softmax runs in PyTorch in FP32
    (:func:`configurator.core.plan_terms.softmax_path`); ``offload_modules``: fine-grained
    activation offloading's modules (comma-separated
    :data:`configurator.core.plan_values.OFFLOAD_MODULES`)."""

    seq: Any
    mbs: Any = 1
    tp: Any = 1
    sp: Any = False
    etp: Any = 1
    recompute: Any = 0
    precision: str = "bf16"
    capacity: Any = 1.0
    a2a_overlap: Any = False
    stores_scores: bool = False
    softmax_fp32: Any = False
    offload_modules: str = ""

    @classmethod
    def of_plans(cls, model: ModelSpec, plans: PlanBatch) -> "LayerInputs":
        """The layer inputs of every plan of ``plans`` (arrays of ``len(plans)``)."""
        seq = model.seq_length / np.asarray(plans.cp)
        return cls(seq=seq, mbs=plans.mbs, tp=plans.tp,
                   sp=plans.sequence_parallel, etp=plans.etp, recompute=plans.recompute_code,
                   precision=plans.precision,
                   capacity=(routed_load_share(plans, model) if model.is_moe
                             else 1.0),
                   a2a_overlap=plans.overlap_moe_expert_parallel_comm,
                   stores_scores=plans.stores_scores,
                   softmax_fp32=(softmax_path(plans, model.num_attention_heads, seq,
                                              model.seq_length)[1]
                                 if plans.stores_scores else False),
                   offload_modules=plans.offload_modules)

    def replace(self, **changes: Any) -> "LayerInputs":
        """A copy with ``changes`` (field name → value)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class StagePosition:
    """Where a pipeline rank sits, per plan (arrays broadcast): ``pp``, ``vp`` (virtual
    stages per rank), ``num_microbatches`` per iteration, ``stage`` (the pipeline rank), the
    decoder and MoE layers it builds (``rank_layers``, ``rank_moe_layers``; None: an even
    split of the model's) and how many of them offload their activations to host memory
    (``offloaded_layers``: Megatron's ``cpu_offloading_num_layers``, pp 1 only)."""

    pp: Any
    stage: Any
    num_microbatches: Any
    vp: Any = 1
    rank_layers: Any = None
    rank_moe_layers: Any = None
    offloaded_layers: Any = 0


def _attention_sizes(model: ModelSpec, s, b, tp):
    """Per-rank bytes of Q (= K or V expanded to all heads), one of K/V, and the QKV output
    ``M`` (arrays broadcast). K/V heads per rank: ``max(g, t)/t`` (Megatron gathers and
    slices the QKV output when ``g < t``)."""
    a, g = model.num_attention_heads, model.num_query_groups
    if model.multi_latent_attention:   # a heads of (qk + qk_pos) for Q and K, v for V
        dqk, dv = model.attention_heads_dims
        q = 2 * s * b * a * dqk / tp
        kv = 2 * s * b * a * (dqk + dv) / 2 / tp    # the mean of K and V
        return q, kv, q + 2 * kv
    d = model.kv_channels
    q = 2 * s * b * a * d / tp
    kv = 2 * s * b * d * np.maximum(g, tp) / tp
    return q, kv, q + 2 * kv


#: Bytes a value of a saved GEMM input: 16-bit, FP8 (Float8Tensor, one byte; the per-tensor
#: scale is negligible) or MXFP8 (one byte plus an E8M0 scale per 32 values,
#: transformer_engine/pytorch/tensor/mxfp8_tensor.py).
LINEAR_INPUT_BYTES = {"fp8": 1.0, "mxfp8": 1.0 + 1.0 / 32}


def linear_input_bytes(precision: str = "bf16") -> float:
    """Bytes per value of the input a linear layer saves for its weight-gradient GEMM under
    ``precision``: 2 for bf16/fp16, 1 for ``fp8``, 33/32 for ``mxfp8`` (module docstring)."""
    return LINEAR_INPUT_BYTES.get(precision, 2.0)


def _saves_original_proj_input(model: ModelSpec, precision: str) -> bool:
    """Whether linear_proj saves its 16-bit input (shared with the attention kernel's output)
    rather than a quantised copy: megatron-core 0.16.1 ``MLASelfAttention`` with a non-delayed
    FP8 recipe (``set_save_original_input``), i.e. MLA under ``mxfp8``."""
    return bool(model.multi_latent_attention) and precision == "mxfp8"


def mla_latent_bytes(model: ModelSpec, s, b, precision: str = "bf16"):
    """Multi-latent attention's replicated low-rank activations per layer and microbatch:
    the down projections' outputs (the norms' inputs, 16-bit: ``q_lora`` and
    ``kv_lora + qk_pos``, the kv norm's input a view of the latter) and the normalised latents
    (the up projections' inputs, :func:`linear_input_bytes` a value)
    (megatron/core/transformer/multi_latent_attention.py); 0 without MLA."""
    if not model.multi_latent_attention:
        return 0.0
    q_lat = model.q_lora_rank or 0
    q8 = linear_input_bytes(precision)
    return s * b * (2 * (q_lat + model.kv_lora_rank + model.qk_pos_emb_head_dim)
                    + q8 * (q_lat + model.kv_lora_rank))


def _qkv_input_bytes(model: ModelSpec, precision: str) -> float:
    """Bytes a value of Xh the QKV GEMM(s) keep of the norm output: one 16-bit tensor (shared by
    MLA's two down projections), or one quantised copy per TE linear under FP8."""
    q8 = linear_input_bytes(precision)
    return q8 * (2 if model.multi_latent_attention and q8 != 2.0 else 1)


def _handed_qkv_bytes(model: ModelSpec, q, kv, qkv):
    """Storages behind Q, K, V as handed to core attention (what the selective-recompute
    checkpoint keeps): ``M`` (V is a view of it), a new Q with RoPE or GQA, a new K with
    RoPE."""
    rope = model.position_embedding_type == "rope"
    gqa = model.num_query_groups < model.num_attention_heads
    return qkv + q * (rope or gqa) + kv * rope


def _score_bytes(model: ModelSpec, s, b, tp, fp32=False):
    """Softmax output, dropout mask and dropout output of a score-storing backend: 2 + 1 + 2
    bytes per score, the 16-bit softmax output alone without dropout (the batched GEMM with
    V keeps the same tensor). ``fp32``: PyTorch's softmax in FP32
    (:func:`configurator.core.plan_terms.softmax_path`) keeps its FP32 output (4 bytes) and,
    without dropout, the GEMM its own 16-bit cast of it (2 more)."""
    drop = model.attention_dropout > 0
    fp32 = np.asarray(fp32, dtype=bool)
    per_score = 2 + 3 * drop + np.where(fp32, 2 + 2 * (not drop), 0)
    return per_score * model.num_attention_heads * s * s * b / tp


def _lse_bytes(model: ModelSpec, s, b, tp):
    """fp32 log-sum-exp a flash-style kernel keeps instead of the scores."""
    return 4 * model.num_attention_heads * s * b / tp


def layer_activation_bytes(model: ModelSpec, *, mbs, seq, tp, sp, recompute,
                           stores_scores: bool, precision: str = "bf16"):
    """Activation bytes one layer stores for one microbatch *without* full recompute.

    ``seq`` is the sequence per rank (``seq_length / cp``); ``recompute`` is the code array
    (0 none, 1 selective; 2 full is treated as 0 here: it is the working set while a layer
    is recomputed). ``stores_scores``: megatron-core's local ``DotProductAttention`` (or
    another backend materialising the s×s scores, its 16-bit softmax output:
    :func:`_score_bytes`) rather than a flash-style kernel. ``precision``: with
    ``fp8``/``mxfp8`` the GEMM inputs are kept quantised (module docstring, "FP8").
    Broadcasts over numpy arrays; returns bytes per tensor-parallel rank.
    """
    h, f = model.hidden_size, model.ffn_hidden_size
    s, b = np.asarray(seq, dtype=float), np.asarray(mbs, dtype=float)
    tp = np.asarray(tp, dtype=float)
    xh = s * b * h
    rep_div = np.where(sp, tp, 1.0)
    masks = 2 * (model.hidden_dropout > 0)
    q8 = linear_input_bytes(precision)
    # norm inputs (16-bit, 2 × 2Xh), QKV and fc1 inputs (q8 each), dropout masks
    replicated = (xh * (4 + _qkv_input_bytes(model, precision) + q8 + masks) / rep_div
                  + mla_latent_bytes(model, s, b, precision))
    selective = (np.asarray(recompute) & RECOMPUTE_CORE_ATTN) != 0
    q, kv, qkv = _attention_sizes(model, s, b, tp)
    handed = _handed_qkv_bytes(model, q, kv, qkv)
    if stores_scores:
        rope = model.position_embedding_type == "rope"
        if model.num_query_groups < model.num_attention_heads:
            kept = 3 * q                      # Q, repeat_interleave-d K and V
        else:
            kept = qkv + (q + kv) * rope      # M (views), new Q and K with RoPE
        attention = np.where(selective, handed, kept + _score_bytes(model, s, b, tp))
    else:
        attention = np.where(selective, handed, qkv + _lse_bytes(model, s, b, tp))
    out = _proj_input_bytes(model, attention_output_elements(model, s, b), tp, precision,
                            selective, stores_scores)
    mlp = s * b * f * mlp_bytes_per_ffn_element(model, precision) / tp
    dropped, _ = recompute_module_bytes(model, LayerInputs(
        mbs=b, seq=s, tp=tp, sp=sp, recompute=recompute, precision=precision,
        stores_scores=stores_scores))
    return replicated + attention + out + mlp - dropped


def recompute_module_bytes(model: ModelSpec, x: LayerInputs):
    """``(every layer, an MoE layer's MLP)``: bytes per layer and microbatch that selective
    recompute's modules (bits of the recompute code,
    :func:`configurator.core.plan_terms.recompute_code`) drop from what a layer keeps, and
    re-materialise while that layer's backward recomputes them (arrays broadcast; 0 without
    those bits; ``x``: the layer's :class:`LayerInputs`).

    ``mlp`` (a dense layer's ``_forward_mlp`` checkpointed on its input): the MLP terms
    (:func:`mlp_bytes_per_ffn_element`) go, and with Transformer Engine's layers, whose
    fc1 carries the pre-MLP norm (its input, the residual stream, is the checkpoint's),
    also fc1's saved norm output; megatron-core's local layers (``stores_scores``) run the
    norm apart and the checkpoint keeps its output. An MoE layer ignores the module, so its
    MLP term gives the bytes back. ``mla_up_proj``: the query, key and value storages
    (``M``) go, freed after core attention and rebuilt from the latents in backward.
    ``moe`` (``MoELayer``'s ``custom_forward`` checkpointed on its input, which it keeps):
    everything else the MoE MLP keeps. ``shared_experts``: the shared expert's fc1 output
    and fc2 input.

    ``layernorm`` (megatron-core 0.16.1 ``TransformerLayer``: ``CheckpointWithoutOutput``
    around a norm that is not an ``IdentityOp``): with Transformer Engine the input norm is
    fused into the QKV linear except under multi-latent attention, whose input norm output
    (:func:`_qkv_input_bytes` a value of ``Xh``) goes; the pre-MLP norm is fused into fc1
    except in an MoE layer, whose norm output (the router's and dispatcher's input, kept as
    the ``q·Xh`` fc1-input term) goes. ``moe_act`` (``TEGroupedMLP.forward``): the
    activation runs under ``CheckpointWithoutOutput``, which keeps its input, the fc1 output
    (``2·gate`` bytes per routed token and expert FFN unit), and discards its output after
    fc2 has run (with FP8, fc2 saves that 16-bit output, ``set_save_original_input``):
    fc2's input and the activation's own saved tensors (the clamp's copy) go, the rest of
    :func:`mlp_bytes_per_ffn_element`."""
    rc = np.asarray(x.recompute)
    s, b, tp, etp = (np.asarray(v, dtype=float) for v in (x.seq, x.mbs, x.tp, x.etp))
    sp, precision, capacity = x.sp, x.precision, x.capacity
    stores_scores = x.stores_scores
    h = model.hidden_size
    layernorm = (rc & RECOMPUTE_LAYERNORM) != 0
    xh_rep = s * b * h / np.where(sp, tp, 1.0)
    q8 = linear_input_bytes(precision)
    per_ffn = mlp_bytes_per_ffn_element(model, precision)
    _, _, qkv = _attention_sizes(model, s, b, tp)
    dense_mlp = (0.0 if stores_scores else q8 * xh_rep) + (
        s * b * model.ffn_hidden_size * per_ffn / tp)
    every = (np.where(layernorm & bool(model.multi_latent_attention),
                      _qkv_input_bytes(model, precision) * xh_rep, 0.0)
             + np.where((rc & RECOMPUTE_MLP) != 0, dense_mlp, 0.0)
             + np.where(((rc & RECOMPUTE_MLA_UP_PROJ) != 0)
                        & bool(model.multi_latent_attention), qkv, 0.0))
    if not model.is_moe:
        return every, 0.0 * every
    gate = 2 if model.swiglu else 1
    X = s * b / tp
    R = model.moe_router_topk * X * etp * capacity
    fe, fs = model.moe_ffn_hidden_size, model.moe_shared_expert_intermediate_size or 0
    routed_act = R * fe / etp * (per_ffn - 2 * gate)
    shared = s * b * fs * per_ffn / tp
    whole = moe_recompute_whole(rc, x.a2a_overlap)
    moe = np.where(whole,
                   moe_mlp_kept_bytes(model, mbs=b, seq=s, tp=tp, etp=etp,
                                      precision=precision, capacity=capacity),
                   np.where(layernorm, q8 * X * h, 0.0)
                   + np.where((rc & RECOMPUTE_MOE_ACT) != 0, routed_act, 0.0)
                   + np.where((rc & RECOMPUTE_SHARED_EXPERTS) != 0, shared, 0.0))
    # the mlp module's bytes come back in an MoE layer, which does not drop them
    moe = moe - np.where((rc & RECOMPUTE_MLP) != 0, dense_mlp, 0.0)
    return every, moe


def moe_mlp_kept_bytes(model: ModelSpec, *, mbs, seq, tp, etp, precision="bf16",
                       capacity=1.0):
    """Bytes an MoE layer's MLP keeps for one microbatch beyond its input, per rank: the
    routed experts' and router's tensors and the shared expert's
    (:func:`moe_mlp_activation_delta` lists them)."""
    s, b, tp, etp = (np.asarray(x, dtype=float) for x in (seq, mbs, tp, etp))
    h, fe = model.hidden_size, model.moe_ffn_hidden_size
    q8 = linear_input_bytes(precision)
    per_ffn = mlp_bytes_per_ffn_element(model, precision)
    X = s * b / tp
    R = model.moe_router_topk * X * etp * capacity
    k = model.moe_router_topk
    routed = (q8 * R * h + R * fe * per_ffn / etp + 2 * R
              + 7 * X * model.num_experts + (16 + 4) * X * k)
    fs = model.moe_shared_expert_intermediate_size or 0
    return routed + s * b * fs * per_ffn / tp


def mlp_bytes_per_ffn_element(model: ModelSpec, precision: str = "bf16") -> float:
    """Bytes an MLP keeps per token and FFN unit: the activation's 16-bit input (``2·gate``,
    gate 2 with a gated linear unit), fc2's input (16-bit or quantised, ``q``) and, with
    ``activation_func_clamp_value``, the unclamped fc1 output the eager clamps save for
    their gradient (``2·gate`` more: megatron-core 0.16.1 ``weighted_bias_quick_geglu_impl``
    clamps views of it, and a clamp's backward needs its input)."""
    gate = 2 if model.swiglu else 1
    clamped = model.activation_func_clamp_value is not None
    return 2 * gate * (1 + clamped) + linear_input_bytes(precision)


def attention_output_elements(model: ModelSpec, s, b):
    """Values of the core-attention output of ``s·b`` tokens, linear_proj's input: ``a·d_v``
    per token (``d_v`` = ``v_head_dim`` with MLA, else ``kv_channels``; ``h`` only where
    ``a·d_v = h``: megatron-core ``Attention.forward`` reshapes the context to
    ``[s, b, a·d_v]`` before ``linear_proj``, whose input width is
    ``num_attention_heads·v_head_dim`` (MLA) or the ``kv_channels``·heads projection size)."""
    dv = model.attention_heads_dims[1] if model.multi_latent_attention else model.kv_channels
    return s * b * model.num_attention_heads * dv


def _proj_input_bytes(model: ModelSpec, xh, tp, precision, selective, stores_scores):
    """Core-attention output kept per layer (÷t; ``xh``: its values,
    :func:`attention_output_elements`): linear_proj's saved input (16-bit, or a quantised
    copy under FP8), plus under FP8 the flash kernel's own 16-bit output when core attention
    is not recomputed (module docstring, "FP8"). The score-storing backends keep no output
    of their own (``bmm`` saves the probabilities and V)."""
    q8 = linear_input_bytes(precision)
    if q8 == 2.0 or _saves_original_proj_input(model, precision):
        return 2 * xh / tp
    kernel_out = 0.0 if stores_scores else np.where(selective, 0.0, 2 * xh / tp)
    return q8 * xh / tp + kernel_out


def moe_mlp_activation_delta(model: ModelSpec, x: LayerInputs):
    """Bytes an MoE layer keeps for one microbatch *beyond* a dense layer's, per rank
    (arrays broadcast; 0 for a dense model): the dense MLP's terms (fc1 output, fc2 input)
    replaced by the routed experts', plus the router's and the shared expert's.

    Tokens per rank entering the MoE layer: ``X = s·b/t`` (each tensor/sequence-parallel
    rank routes its own slice; Megatron's ``MoELayer.forward`` requires sequence parallelism
    when tp > 1). With the all-to-all dispatcher
    (megatron/core/transformer/moe/token_dispatcher.py ``MoEAlltoAllTokenDispatcher``) each
    rank's local experts receive ``R = k·X·etp`` token copies on average under balanced
    routing (``k`` = ``moe_router_topk``; the expert-tensor-parallel group gathers its ranks'
    tokens), the busiest rank that times ``x.capacity`` (:class:`LayerInputs`). Kept
    (megatron-core 0.16.1, measured on CPU): the permuted expert input
    (fc1's input, ``2Rh``), fc1's output (``2R·f_e/etp``, ×2 with SwiGLU) and fc2's input
    (``2R·f_e/etp``); the router's fp32 softmax scores of the auxiliary loss (``4·X·E``),
    the transposed routing map and probabilities (``X·E`` bool + ``2·X·E``), two int64
    index arrays (``2·8·X·k``), the fp32 top-k probabilities (``4·X·k``) and the per-copy
    probabilities the experts apply (``2R``); a shared expert as a dense MLP of its size.
    A fully recomputed MoE layer re-materialises all of it (``stage_activation_phases``).
    Under FP8 the experts' and shared expert's fc1 and fc2 inputs are kept quantised
    (:func:`linear_input_bytes`; TE ``GroupedLinear``/``Linear`` save the quantised input as
    ``_Linear`` does, and ``Fp8Padding``/``permute`` keep no 16-bit copy); not measured.
    ``x``: the layer's :class:`LayerInputs`; its recompute code's module bits drop
    :func:`recompute_module_bytes`' MoE terms.
    """
    if not model.is_moe:
        return 0.0
    s, b, tp, etp = (np.asarray(v, dtype=float) for v in (x.seq, x.mbs, x.tp, x.etp))
    per_ffn = mlp_bytes_per_ffn_element(model, x.precision)
    dense = s * b * model.ffn_hidden_size * per_ffn / tp
    _, dropped = recompute_module_bytes(model, x)
    return (moe_mlp_kept_bytes(model, mbs=b, seq=s, tp=tp, etp=etp, precision=x.precision,
                               capacity=x.capacity) - dense - dropped)


def checkpoint_bytes(model: ModelSpec, *, mbs, seq, tp, sp):
    """Bytes full recompute keeps per layer and microbatch: the layer input ``2·s·b·h``
    (÷tp with sequence parallelism), saved by ``CheckpointFunction.forward``
    (megatron/core/tensor_parallel/random.py) called from
    ``TransformerBlock._checkpointed_forward``. Broadcasts."""
    s, b, tp = (np.asarray(x, dtype=float) for x in (seq, mbs, tp))
    return 2 * s * b * model.hidden_size / np.where(sp, tp, 1.0)


def recompute_working_bytes(model: ModelSpec, *, mbs, seq, tp, sp, recompute,
                            stores_scores: bool, precision: str = "bf16"):
    """Extra bytes while one layer is recomputed in backward, on top of what the layer
    keeps from the forward (arrays broadcast; 0 without recompute).

    Full: the whole layer re-materialised (:func:`layer_activation_bytes`) minus its input,
    which is the checkpoint itself. Selective: ``CheckpointFunction.backward`` re-runs core
    attention, keeping the scores again (plus GQA's expanded K, V for the local backend);
    a flash-style kernel keeps contiguous Q, K, V, its output and the log-sum-exp.
    """
    s, b, tp = (np.asarray(x, dtype=float) for x in (seq, mbs, tp))
    rc = np.asarray(recompute)
    full = (layer_activation_bytes(model, mbs=b, seq=s, tp=tp, sp=sp, recompute=0,
                                   stores_scores=stores_scores, precision=precision)
            - checkpoint_bytes(model, mbs=b, seq=s, tp=tp, sp=sp))
    q, kv, qkv = _attention_sizes(model, s, b, tp)
    if stores_scores:
        gqa = model.num_query_groups < model.num_attention_heads
        selective = _score_bytes(model, s, b, tp) + 2 * q * gqa
    else:
        selective = qkv + 2 * s * b * model.hidden_size / tp + _lse_bytes(model, s, b, tp)
    return np.where(rc == RECOMPUTE_FULL, full,
                    np.where((rc & RECOMPUTE_CORE_ATTN) != 0, selective, 0.0))


def offloaded_layer_bytes(model: ModelSpec, x: LayerInputs):
    """``(every layer, an MoE layer's extra)``: bytes per layer and microbatch that
    fine-grained activation offloading of ``x.offload_modules`` (comma-separated
    :data:`configurator.core.plan_values.OFFLOAD_MODULES`) moves to host memory between forward and
    backward (megatron-core 0.16.1 ``fine_grained_activation_offload.py``: each module's
    saved tensors). ``qkv_linear``: the QKV linear's saved inputs (with the input norm fused
    into it, the norm's 16-bit input too); ``attn_norm``: a separate input norm's input
    (multi-latent attention); ``core_attn``: the attention kernel's saved Q, K, V and
    log-sum-exp, unless core attention is recomputed; ``attn_proj``: the projection's input;
    ``mlp_norm``: an MoE layer's separate pre-MLP norm's input; ``expert_fc1``: the permuted
    expert input; ``moe_act``: the routed experts' fc1 output."""
    names = set(x.offload_modules.replace(",", " ").split())
    s, b, tp, etp = (np.asarray(v, dtype=float) for v in (x.seq, x.mbs, x.tp, x.etp))
    sp, precision, capacity = x.sp, x.precision, x.capacity
    h = model.hidden_size
    xh = s * b * h
    xh_rep = xh / np.where(sp, tp, 1.0)
    q8 = linear_input_bytes(precision)
    mla = bool(model.multi_latent_attention)
    every = 0.0 * xh
    if "qkv_linear" in names:
        every = every + (_qkv_input_bytes(model, precision) + (0 if mla else 2)) * xh_rep
    if "attn_norm" in names and mla:
        every = every + 2 * xh_rep
    if "core_attn" in names and not x.stores_scores:
        _, _, qkv = _attention_sizes(model, s, b, tp)
        every = every + np.where((np.asarray(x.recompute) & RECOMPUTE_CORE_ATTN) != 0, 0.0,
                                 qkv + _lse_bytes(model, s, b, tp))
    if "attn_proj" in names:
        every = every + q8 * attention_output_elements(model, s, b) / tp
    moe = 0.0 * xh
    if model.is_moe:
        gate = 2 if model.swiglu else 1
        R = model.moe_router_topk * s * b / tp * etp * capacity
        if "mlp_norm" in names:
            moe = moe + 2 * xh_rep
        if "expert_fc1" in names:
            moe = moe + q8 * R * h
        if "moe_act" in names:
            moe = moe + 2 * gate * R * model.moe_ffn_hidden_size / etp
    return every, moe


def layer_terms(model: ModelSpec, x: LayerInputs) -> dict:
    """What one layer and microbatch keep and re-materialise, by what they depend on alone
    (``x``, :class:`LayerInputs`): the terms :func:`stage_activation_phases` combines with the
    stage's layers and microbatches in flight (arrays broadcast; bytes)."""
    b, s, tp = (np.asarray(v, dtype=float) for v in (x.mbs, x.seq, x.tp))
    sp, rc, precision, stores_scores = np.asarray(x.sp), np.asarray(x.recompute), \
        x.precision, x.stores_scores
    xh = s * b * model.hidden_size
    rep_div = np.where(sp, tp, 1.0)
    t = {"moe_delta": moe_mlp_activation_delta(model, x),
         "layer": layer_activation_bytes(model, mbs=b, seq=s, tp=tp, sp=sp, recompute=rc,
                                         stores_scores=stores_scores, precision=precision)}
    if x.offload_modules:
        t["off_every"], t["off_moe"] = offloaded_layer_bytes(model, x)
    t["ckpt"] = checkpoint_bytes(model, mbs=b, seq=s, tp=tp, sp=sp)
    t["emb_mask"] = (model.hidden_dropout > 0) * xh / rep_div
    v_pad = padded_vocab_size(model.vocab_size, tp)
    t["last"] = 4 * xh / rep_div + 4 * s * b * v_pad / tp
    q, kv, qkv = _attention_sizes(model, s, b, tp)
    # norm input (16-bit) and QKV input (quantised under FP8) plus the checkpointed Q, K, V
    t["layer_left"] = np.where(rc == RECOMPUTE_FULL, t["ckpt"],
                               (2 + _qkv_input_bytes(model, precision)) * xh / rep_div
                               + _handed_qkv_bytes(model, q, kv, qkv))
    t["working"] = recompute_working_bytes(model, mbs=b, seq=s, tp=tp, sp=sp, recompute=rc,
                                           stores_scores=stores_scores, precision=precision)
    if stores_scores:   # PyTorch's FP32 softmax keeps more per score than the 16-bit output
        extra = _score_bytes(model, s, b, tp, x.softmax_fp32) - _score_bytes(model, s, b, tp)
        scores_kept = (rc & RECOMPUTE_CORE_ATTN) == 0     # not dropped by core_attn recompute
        t["layer"] = t["layer"] + np.where(scores_kept, extra, 0.0)
        t["working"] = t["working"] + np.where(
            (rc == RECOMPUTE_FULL) | ~scores_kept, extra, 0.0)
    t["every"], t["moe"] = recompute_module_bytes(model, x)
    return t


def stage_activation_phases(model: ModelSpec, x: LayerInputs, at: StagePosition,
                            terms: dict | None = None):
    """Activation bytes on one GPU of pipeline rank ``at`` at the two candidate peaks (arrays
    broadcast); ``x``: the layers' :class:`LayerInputs`.

    Returns ``(forward_end, recompute)``: at the end of the forward of the last microbatch in
    flight (``n`` layer-microbatches kept, embedding-dropout masks on the first stage, the
    output-layer terms on the last); and while the oldest microbatch's last layer is
    recomputed in its backward (output-layer terms freed, that layer down to what its
    recomputation needs: the checkpoint for full recompute; norm input, QKV input and the
    checkpointed Q, K, V for selective; plus :func:`recompute_working_bytes`). The second
    is 0 without recompute. An MoE layer keeps :func:`moe_mlp_activation_delta` more than a
    dense one. The expert all-to-all overlap's schedule (``x.a2a_overlap``) keeps one more
    layer: it runs one microbatch's forward and another's backward layer by layer, each
    pair the forward of layer ``j`` beside the backward of layer ``L − 1 − j``, whose state
    is released after the pair (megatron-core 0.16.1
    ``TransformerModelChunkSchedulePlan.run``: ``b_layer.release_state()``), so at most
    one layer's activations of the forward microbatch stand beside the backward
    microbatch's before it frees its own. The warm-up microbatch it adds with pipelining
    (schedules.py ``get_pp_rank_microbatches``: ``num_warmup_microbatches + 1``) only
    moves the schedule's peak from the end of each forward to the start of each pair: the
    same chunks in flight as without the overlap. Fine-grained activation
    offloading (:func:`offloaded_layer_bytes`) keeps every layer-microbatch's offloaded
    tensors in host memory but the last one's (the last group of each module stays, so that
    its reload never waits). CPU offloading of whole layers (``at.offloaded_layers``, ``N``
    of the model's first layers; pp 1 and no recompute by rule) keeps ``N − 1`` of them in
    host memory at the end of the forward: Transformer Engine's offload handler copies each
    offloaded layer's saved tensors out on a side stream while the next layers compute and
    waits for that copy a layer window later, so the last one may still be on the GPU, and
    the backward reloads each a layer ahead of its use (megatron-core 0.16.1
    ``TransformerBlock``: ``get_cpu_offload_context(cpu_offloading,
    cpu_offloading_num_layers, num_layers, activations on, weights off, no double
    buffering)``; Transformer Engine ``pytorch/cpu_offload.py``,
    ``AsyncDoubleBufferGroupOffloadHandler``). ``terms``: :func:`layer_terms` of ``x`` when
    the caller has them (the same values, computed once per distinct layer elsewhere).
    """
    t = layer_terms(model, x) if terms is None else terms
    pp, stage = np.asarray(at.pp), np.asarray(at.stage)
    rc = np.asarray(x.recompute)
    overlap = np.asarray(x.a2a_overlap, dtype=bool)
    rank_layers, rank_moe_layers = at.rank_layers, at.rank_moe_layers
    if rank_layers is None:
        rank_layers = model.num_layers / pp
    if rank_moe_layers is None:
        rank_moe_layers = model.num_moe_layers / pp
    rank_layers = np.asarray(rank_layers, dtype=float)
    moe_share = np.asarray(rank_moe_layers, dtype=float) / np.maximum(rank_layers, 1.0)
    n = inflight_layers(model.num_layers, pp=pp, vp=at.vp,
                        num_microbatches=at.num_microbatches, stage=stage,
                        rank_layers=rank_layers) + np.where(
        overlap, np.minimum(rank_layers / np.asarray(at.vp, dtype=float), 1.0), 0.0)
    per_layer = t["layer"] + moe_share * t["moe_delta"]
    offloaded = t["off_every"] + moe_share * t["off_moe"] if x.offload_modules else 0.0
    kept = np.where(rc == RECOMPUTE_FULL, t["ckpt"], per_layer)
    mb_first = inflight_microbatches_1f1b(pp, at.num_microbatches, stage)
    emb = np.where(stage == 0, t["emb_mask"] * mb_first, 0.0)
    # the other layer-microbatches' offloaded tensors wait in host memory
    on_host = np.maximum(n - 1, 0.0) * np.where(rc == RECOMPUTE_FULL, 0.0, offloaded)
    # whole layers offloaded to the host (all but the last, whose copy may still run)
    on_host = on_host + np.maximum(np.asarray(at.offloaded_layers, dtype=float) - 1.0,
                                   0.0) * kept
    forward_end = n * kept - on_host + emb + np.where(stage == pp - 1, t["last"], 0.0)
    # a fully recomputed MoE layer re-materialises its routed tokens too
    working = t["working"] + np.where(
        (rc == RECOMPUTE_FULL) & (np.asarray(rank_moe_layers) > 0), t["moe_delta"], 0.0)
    recompute_peak = (n - 1) * kept + t["layer_left"] + working + emb - on_host
    attn_or_full = (rc == RECOMPUTE_FULL) | ((rc & RECOMPUTE_CORE_ATTN) != 0)
    # layernorm / moe_act: the last layer's MLP backward re-materialises what they dropped
    modules = (rc & ~(RECOMPUTE_CORE_ATTN | RECOMPUTE_FULL)) != 0
    module_peak = ((n - 1) * kept + per_layer + t["every"]
                   + np.where(np.asarray(rank_moe_layers) > 0, t["moe"], 0.0) + emb - on_host)
    peak = np.maximum(np.where(attn_or_full, recompute_peak, 0.0),
                      np.where(modules, module_peak, 0.0))
    return forward_end, np.where(rc == 0, 0.0, peak)


def stage_activation_bytes(model: ModelSpec, x: LayerInputs, at: StagePosition,
                           terms: dict | None = None):
    """Peak activation bytes on one GPU of pipeline rank ``at`` (arrays broadcast): the larger
    of the two phases of :func:`stage_activation_phases` (same arguments)."""
    fwd, rec = stage_activation_phases(model, x, at, terms)
    return np.maximum(fwd, rec)
