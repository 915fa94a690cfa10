"""Parameter counts per GPU, per pipeline stage (Megatron-LM GPT layer layout, dense and MoE).

Layer layout (megatron/core/models/gpt/gpt_layer_specs.py, local and TE specs):
input norm; attention; pre-MLP norm; MLP (dense) or MoE layer.

* attention: QKV ColumnParallelLinear ``h → (a + 2g)·d`` (bias with ``add_bias_linear`` or
  ``add_qkv_bias``), output RowParallelLinear ``a·d → h``; ``qk_layernorm`` adds a norm over
  the head dimension for queries and keys. Multi-latent attention
  (megatron/core/transformer/multi_latent_attention.py, ``MLASelfAttention``): the down
  projections ``h → q_lora`` and ``h → kv_lora + qk_pos`` and their norms are replicated
  over tp; the up projections ``q_lora → a·(qk + qk_pos)`` (or ``h →`` that without
  ``q_lora_rank``) and ``kv_lora → a·(qk + v)`` are column-parallel, ``a·v → h`` row-parallel.
* dense MLP: fc1 ``h → f`` (``2f`` with SwiGLU), fc2 ``f → h``, split over tp.
* MoE layer (megatron/core/transformer/moe: ``TopKRouter``, ``GroupedMLP``/``SequentialMLP``,
  ``SharedExpertMLP``): router weight ``E × h`` replicated; ``E`` experts of
  ``moe_ffn_hidden_size`` each, ``E/ep`` per rank, each split over ``etp``; a shared expert
  of ``moe_shared_expert_intermediate_size``, split over tp.

Column-parallel weights and biases are split over tp; row-parallel biases and norms are
replicated. LayerNorm has weight and bias (2h), RMSNorm a weight (h).
Embedding: ``V_pad·h/tp`` (VocabParallelEmbedding) plus ``s·h`` learned positions on the first
stage; the last stage holds the final norm and the output layer ``V_pad·h/tp`` (untied), or,
when tied and pp > 1, a copy of the word embedding (Megatron keeps one on the last stage).
Multi-token prediction (``mtp_num_layers``, megatron/core/transformer/multi_token_prediction.py):
per module three norms, a ``2h → h`` projection and one more transformer layer of the last
decoder layer's type, on the last stage. A router has a bias with ``add_bias_linear``. Shared REFERENCE §3 gives the attention ``2h²(1+g/n)`` and MLP ``2·h·ffn`` terms.
"""

from __future__ import annotations

import numpy as np

from configurator.core.model import ModelSpec

#: Megatron's ``--make-vocab-size-divisible-by`` default.
VOCAB_DIVISIBLE_BY = 128


def padded_vocab_size(vocab_size: int, tp):
    """Vocabulary padded to a multiple of ``128·tp`` (megatron/training/tokenizer
    ``_vocab_size_with_padding``). Broadcasts over ``tp``; an integer array of many plans
    is looked up in a table of every tp up to its largest (the same integers, without a
    division per plan)."""
    tp = np.asarray(tp)
    if tp.ndim == 1 and tp.size > 64 and tp.dtype.kind in "iu":
        hi = int(tp.max())
        if 0 < hi <= 4096 and int(tp.min()) > 0:
            mult = VOCAB_DIVISIBLE_BY * np.arange(1, hi + 1, dtype=tp.dtype)
            return np.take(-(-vocab_size // mult) * mult, tp - 1)
    mult = VOCAB_DIVISIBLE_BY * tp
    return -(-vocab_size // mult) * mult


def _norm_params(model: ModelSpec, width: int | None = None) -> int:
    return (2 if model.normalization == "LayerNorm" else 1) * (width or model.hidden_size)


def attention_parameters(model: ModelSpec, tp=1):
    """``(split over tp, replicated)`` parameters of one layer's attention block, its input
    norm included, on one tensor-parallel rank (counts; ``tp`` broadcasts)."""
    h, a, g = model.hidden_size, model.num_attention_heads, model.num_query_groups
    tp = np.asarray(tp, dtype=float)
    replicated = _norm_params(model)
    if model.multi_latent_attention:
        qk, pos, vd = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        q_in = model.q_lora_rank or h
        sharded = q_in * a * (qk + pos) + model.kv_lora_rank * a * (qk + vd) + a * vd * h
        replicated += h * (model.kv_lora_rank + pos)
        if model.q_lora_rank:
            replicated += h * model.q_lora_rank
        if model.qk_layernorm:   # MLA's qk_layernorm: norms on the latents (mla spec)
            replicated += _norm_params(model, model.kv_lora_rank) + (
                _norm_params(model, model.q_lora_rank) if model.q_lora_rank else 0)
        out_bias = h
    else:
        d = model.kv_channels
        qkv_out = (a + 2 * g) * d
        sharded = h * qkv_out + a * d * h
        if model.add_bias_linear or model.add_qkv_bias:
            sharded = sharded + qkv_out
        out_bias = h
    if model.add_bias_linear:
        replicated += out_bias
    if model.qk_layernorm and not model.multi_latent_attention:
        replicated += 2 * _norm_params(model, model.kv_channels)
    return sharded / tp, replicated


def mlp_parameters(model: ModelSpec, ffn: int, split=1):
    """Parameters of one (dense or expert) MLP of FFN size ``ffn`` split over ``split`` ranks:
    fc1 ``h → ffn`` (×2 with SwiGLU) and fc2 ``ffn → h``, biases with ``add_bias_linear``
    (fc2's bias is not split)."""
    h = model.hidden_size
    fc1 = ffn * (2 if model.swiglu else 1)
    n = (h * fc1 + ffn * h) / np.asarray(split, dtype=float)
    if model.add_bias_linear:
        n = n + fc1 / np.asarray(split, dtype=float) + h
    return n


def dense_layer_parameters(model: ModelSpec, tp=1):
    """Parameters of one dense transformer layer on one tensor-parallel rank (count)."""
    sharded, replicated = attention_parameters(model, tp)
    return sharded + replicated + mlp_parameters(model, model.ffn_hidden_size, tp) + \
        _norm_params(model)


def moe_layer_parameters(model: ModelSpec, tp=1, ep=1, etp=1):
    """``(non-expert, expert)`` parameters of one MoE layer on one rank: attention, norms,
    router (``E·h``, replicated) and shared expert (split over tp); the ``E/ep`` local
    experts, each split over ``etp``."""
    sharded, replicated = attention_parameters(model, tp)
    router = model.num_experts * (model.hidden_size + model.add_bias_linear)  # weight, bias
    shared = (mlp_parameters(model, model.moe_shared_expert_intermediate_size, tp)
              if model.moe_shared_expert_intermediate_size else 0.0)
    non_expert = sharded + replicated + _norm_params(model) + router + shared
    expert = (model.num_experts / np.asarray(ep, dtype=float)) * mlp_parameters(
        model, model.moe_ffn_hidden_size, etp)
    return non_expert, expert


def embedding_parameters(model: ModelSpec, tp=1):
    """Word (and learned position) embedding parameters on one tp rank of the first stage."""
    pos = model.seq_length * model.hidden_size if (
        model.position_embedding_type == "learned_absolute") else 0
    return padded_vocab_size(model.vocab_size, tp) * model.hidden_size / np.asarray(tp) + pos


def output_parameters(model: ModelSpec, tp=1, pp=1):
    """Final norm plus output-layer weights on one tp rank of the last stage."""
    out = padded_vocab_size(model.vocab_size, tp) * model.hidden_size / np.asarray(tp)
    has_out = model.untie_embeddings_and_output_weights | (np.asarray(pp) > 1)
    return _norm_params(model) + np.where(has_out, out, 0.0)


def mtp_parameters(model: ModelSpec, tp=1, ep=1, etp=1):
    """``(non-expert, expert)`` parameters of the multi-token-prediction modules on the last
    stage: per module three norms (``enorm``, ``hnorm``, ``final_layernorm``), the ``2h → h``
    projection (split over tp) and one layer of the last decoder layer's type."""
    if not model.mtp_num_layers:
        return 0.0, 0.0
    h = model.hidden_size
    if model.moe_layer_pattern[-1]:   # the MTP layer takes the last decoder layer's spec
        non_expert, expert = moe_layer_parameters(model, tp, ep, etp)
    else:
        non_expert, expert = dense_layer_parameters(model, tp), 0.0
    k = model.mtp_num_layers
    return k * (non_expert + 3 * _norm_params(model) + 2 * h * h / np.asarray(tp, float)), \
        k * expert


def stage_parameter_split(model: ModelSpec, tp, pp, stage, *, layers=None, moe_layers=None,
                          ep=1, etp=1):
    """``(non-expert, expert)`` parameters held by one GPU of pipeline ``stage`` (0-based;
    arrays broadcast). ``layers``/``moe_layers``: decoder and MoE layers the rank builds
    (:func:`configurator.core.layers.rank_layer_counts`; default: an even split of the
    model's layers and MoE layers). Non-expert parameters are replicated over the
    ``dp·cp`` group, expert ones over the expert-data-parallel group ``tp·cp·dp/(ep·etp)``.

    With the interleaved schedule a rank holds ``vp`` chunks; the embedding sits on rank 0
    and the output layer (and MTP modules) on rank ``pp-1`` either way.
    """
    tp, pp, stage = (np.asarray(x) for x in (tp, pp, stage))
    if layers is None:
        layers = model.num_layers / pp
    if moe_layers is None:
        moe_layers = model.num_moe_layers / pp
    layers, moe_layers = np.asarray(layers, dtype=float), np.asarray(moe_layers, dtype=float)
    non_expert = dense_layer_parameters(model, tp) * (layers - moe_layers)
    expert = 0.0
    if model.is_moe:
        ne, ex = moe_layer_parameters(model, tp, ep, etp)
        non_expert = non_expert + ne * moe_layers
        expert = ex * moe_layers
    non_expert = non_expert + np.where(stage == 0, embedding_parameters(model, tp), 0.0)
    last = stage == pp - 1
    mtp_ne, mtp_ex = mtp_parameters(model, tp, ep, etp)
    # MTP needs the word embedding on the last stage too (a copy when pp > 1)
    mtp_emb = np.where(pp > 1, embedding_parameters(model, tp), 0.0) if (
        model.mtp_num_layers and model.untie_embeddings_and_output_weights) else 0.0
    non_expert = non_expert + np.where(last, output_parameters(model, tp, pp) + mtp_ne
                                       + mtp_emb, 0.0)
    expert = expert + np.where(last, mtp_ex, 0.0)
    return non_expert, expert


def stage_non_gemm_parameters(model: ModelSpec, tp, pp, stage):
    """Parameters of ``stage`` outside Transformer Engine's linear layers (arrays broadcast):
    the word (and position) embedding on the first stage, the output layer and final norm on
    the last, and the embedding copy MTP needs there. These get no FP8 weight copy; the
    layers' norms, biases and routers (under 0.1 % of a layer) are counted with the GEMMs."""
    tp, pp, stage = (np.asarray(x) for x in (tp, pp, stage))
    out = np.where(stage == 0, embedding_parameters(model, tp), 0.0)
    mtp_emb = np.where(pp > 1, embedding_parameters(model, tp), 0.0) if (
        model.mtp_num_layers and model.untie_embeddings_and_output_weights) else 0.0
    return out + np.where(stage == pp - 1, output_parameters(model, tp, pp) + mtp_emb, 0.0)


def stage_parameters(model: ModelSpec, tp, pp, stage, **kw):
    """All parameters held by one GPU of pipeline ``stage`` (count; see
    :func:`stage_parameter_split` for the keyword arguments)."""
    non_expert, expert = stage_parameter_split(model, tp, pp, stage, **kw)
    return non_expert + expert


def total_parameters(model: ModelSpec) -> int:
    """All parameters of the model (no padding beyond 128, tied embeddings counted once,
    multi-token-prediction modules left out, as model cards count)."""
    n_moe = model.num_moe_layers
    n = dense_layer_parameters(model, 1) * (model.num_layers - n_moe)
    if model.is_moe:
        ne, ex = moe_layer_parameters(model)
        n = n + (ne + ex) * n_moe
    n = n + embedding_parameters(model, 1) + output_parameters(model, 1, 1)
    return int(round(float(n)))


def active_parameters(model: ModelSpec) -> int:
    """Parameters one token passes through: :func:`total_parameters` with each MoE layer's
    routed experts counted ``moe_router_topk`` times instead of ``num_experts`` (the
    figure MoE model cards give as "active")."""
    if not model.is_moe:
        return total_parameters(model)
    ne, ex = moe_layer_parameters(model)
    unused = float(ex) * (1 - model.moe_router_topk / model.num_experts)
    return int(round(total_parameters(model) - unused * model.num_moe_layers))


def layer_parameter_tensors(model: ModelSpec, ep=1) -> tuple:
    """``(dense, moe)`` parameter tensors of one layer on one rank (counts; ``ep``
    broadcasts), the units an optimizer's per-parameter loops walk over, following
    :func:`attention_parameters`, :func:`mlp_parameters` and :func:`moe_layer_parameters`:
    the two norms (weight, and bias with LayerNorm), the attention's weights (QKV and
    projection; MLA's down and up projections and the latents' norms instead), qk norms,
    biases with ``add_bias_linear`` (and the QKV bias with ``add_qkv_bias``), an MLP's fc1
    and fc2; an MoE layer's router, shared expert and, per local expert, its fc1 and fc2
    (one weight each, as Transformer Engine's ``GroupedLinear`` and megatron-core's
    ``SequentialMLP`` hold them)."""
    norm = 2 if model.normalization == "LayerNorm" else 1
    bias = int(model.add_bias_linear)
    attn = norm                                            # the input norm
    if model.multi_latent_attention:
        attn += 3 + (2 if model.q_lora_rank else 1)       # kv down, kv up, projection; q
        if model.qk_layernorm:
            attn += norm * (1 + bool(model.q_lora_rank))
        attn += bias
    else:
        attn += 2 + (1 if (model.add_bias_linear or model.add_qkv_bias) else 0) + bias
        if model.qk_layernorm:
            attn += 2 * norm
    mlp = 2 * (1 + bias)
    dense = attn + norm + mlp
    if not model.is_moe:
        return dense, dense
    router = 1 + bias
    shared = mlp if model.moe_shared_expert_intermediate_size else 0
    local = model.num_experts / np.asarray(ep, dtype=float)
    return dense, attn + norm + router + shared + local * mlp


def stage_parameter_tensors(model: ModelSpec, pp, stage, *, layers, moe_layers, ep=1):
    """Parameter tensors held by one GPU of pipeline ``stage`` (counts; arrays broadcast):
    its layers' (:func:`layer_parameter_tensors`), the word (and learned position)
    embedding on the first stage, the final norm and an output layer (untied, or the tied
    copy with ``pp > 1``) on the last."""
    pp, stage = np.asarray(pp), np.asarray(stage)
    layers, moe_layers = np.asarray(layers, dtype=float), np.asarray(moe_layers, dtype=float)
    dense, moe = layer_parameter_tensors(model, ep)
    n = dense * (layers - moe_layers) + moe * moe_layers
    emb = 1 + (model.position_embedding_type == "learned_absolute")
    norm = 2 if model.normalization == "LayerNorm" else 1
    out = norm + np.where(model.untie_embeddings_and_output_weights | (pp > 1), 1, 0)
    return n + np.where(stage == 0, emb, 0) + np.where(stage == pp - 1, out, 0)
