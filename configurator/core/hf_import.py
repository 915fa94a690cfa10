"""Hugging Face ``config.json`` import: :func:`from_hf_config` maps a model's config (Llama,
Mistral, Qwen2/Qwen3 and their MoE variants, Mixtral, DeepSeek-V2/V3, GPT-2, GPT-OSS) to a
:class:`~configurator.core.model.ModelSpec`, refusing any key that changes the model and is
not mapped.
"""

from __future__ import annotations

from typing import Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec, make_model


#: Hugging Face ``config.json`` keys that do not change what is trained or what it costs
#: (tokens, initialisation, inference caches, routing losses and scoring, RoPE scaling that
#: keeps the parameter count (a ``yarn`` one is read: megatron-core applies it unfused),
#: quantisation of released weights). Any other key the import does not map and that names
#: a model dimension is an error, never silently dropped.
HF_KEYS_NO_COST = frozenset((
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
    "rope_scaling", "rope_theta", "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps",
    "max_position_embeddings", "max_window_layers", "use_sliding_window", "sliding_window",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "norm_topk_prob",
    "scoring_func", "routed_scaling_factor", "n_group", "topk_group", "topk_method",
    "aux_loss_alpha", "seq_aux", "ep_size", "quantization_config", "auto_map",
    "pretraining_tp", "tie_word_embeddings", "attention_dropout", "hidden_dropout",
    "resid_pdrop", "attn_pdrop", "embd_pdrop", "summary_activation", "summary_first_dropout",
    "summary_proj_to_labels", "summary_type", "summary_use_proj", "task_specific_params",
    "scale_attn_weights", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx",
    "activation_function", "hidden_act", "torchscript", "return_dict", "name_or_path",
    "_name_or_path", "id2label", "label2id", "tokenizer_class", "problem_type",
    "swiglu_limit", "router_bias", "experts_per_token", "rope_interleave",
    "_attn_implementation", "_attn_implementation_autoset",
))
#: A key naming one of these, when not mapped, changes the model: refuse to drop it.
_HF_ARCH_WORDS = ("expert", "moe", "lora", "head_dim", "layer", "hidden", "intermediate",
                  "inner", "heads", "window", "softcap", "partial_rotary", "nextn", "mtp",
                  "dense", "sparse", "shared", "latent", "vocab", "embd", "n_", "num_",
                  "bias", "norm")


#: The sequence length a family was pretrained at (its main pre-training stage, before any
#: long-context extension), with the source that states it: ``model_type`` -> (tokens,
#: family, source). Llama 3 is told from Llama 1/2 by :func:`_hf_family`.
PRETRAINING_SEQ_LENGTHS: dict[str, tuple[int, str, str]] = {
    "llama3": (8192, "Llama 3", "Llama 3 paper, arXiv:2407.21783 §3.4.1"),
    "llama": (4096, "Llama 2", "Llama 2 paper, arXiv:2307.09288 §2.2"),
    "mixtral": (32768, "Mixtral", "Mixtral paper, arXiv:2401.04088 §2"),
    "qwen2": (4096, "Qwen2", "Qwen2 report, arXiv:2407.10671 §3.2"),
    "qwen2_moe": (4096, "Qwen2", "Qwen2 report, arXiv:2407.10671 §3.2"),
    "qwen3": (4096, "Qwen3", "Qwen3 report, arXiv:2505.09388 §3.2"),
    "qwen3_moe": (4096, "Qwen3", "Qwen3 report, arXiv:2505.09388 §3.2"),
    "deepseek_v2": (4096, "DeepSeek-V2", "DeepSeek-V2 report, arXiv:2405.04434 §3.1.2"),
    "deepseek_v3": (4096, "DeepSeek-V3", "DeepSeek-V3 report, arXiv:2412.19437 §4.2"),
    "gpt2": (1024, "GPT-2", "GPT-2 paper, Radford et al. 2019 §2.3"),
}
#: The length for a family with no published pretraining length: the one most families of
#: :data:`PRETRAINING_SEQ_LENGTHS` were pretrained at (Llama 2, Qwen2, Qwen3, DeepSeek-V2/V3).
DEFAULT_PRETRAINING_SEQ_LENGTH = 4096


def _hf_family(cfg: Mapping[str, Any]) -> str:
    """The key of :data:`PRETRAINING_SEQ_LENGTHS` for a config: its ``model_type``, with
    ``llama`` split into Llama 3 (``rope_scaling`` of type ``llama3``, ``rope_theta`` 500000
    or the 128,256-token vocabulary, as Meta's Llama 3.x configs) and earlier Llamas."""
    mtype = cfg.get("model_type", "")
    if mtype == "gpt2" or "n_embd" in cfg:
        return "gpt2"
    if mtype == "llama":
        scaling = cfg.get("rope_scaling")
        kind = (scaling.get("rope_type") or scaling.get("type")
                if isinstance(scaling, Mapping) else None)
        if kind == "llama3" or cfg.get("rope_theta") == 500000 or (
                cfg.get("vocab_size") == 128256):
            return "llama3"
    return mtype if isinstance(mtype, str) else ""


def pretraining_seq_length(cfg: Mapping[str, Any], max_positions: int) -> tuple[int, str]:
    """``(seq_length, why)``: the sequence length a Hugging Face config is planned at when
    the user gives none. The family's published pretraining length
    (:data:`PRETRAINING_SEQ_LENGTHS`), else :data:`DEFAULT_PRETRAINING_SEQ_LENGTH`; at most
    ``max_positions`` (the config's ``max_position_embeddings``, the model's maximum
    context, which is what a long-context fine-tune uses, not what pretraining costs)."""
    family = _hf_family(cfg)
    if family in PRETRAINING_SEQ_LENGTHS:
        seq, name, source = PRETRAINING_SEQ_LENGTHS[family]
        why = f"pretraining length of {name}, {source}"
    else:
        seq = DEFAULT_PRETRAINING_SEQ_LENGTH
        what = f"model_type {family!r}" if family else "a config without model_type"
        why = (f"{what} has no published pretraining length here: that of Llama 2, "
               "Qwen2/3, DeepSeek-V2/V3")
    if seq > max_positions:
        return max_positions, f"the config's maximum context, below the {seq} {why}"
    return seq, why


def from_hf_config(cfg: Mapping[str, Any], name: str = "hf-model") -> ModelSpec:
    """Map a Hugging Face ``config.json`` to a :class:`ModelSpec`.

    Families (``model_type``): Llama, Mistral, Qwen2/Qwen3 (dense), GPT-2; Mixtral
    (``num_local_experts``, ``num_experts_per_tok``, experts of ``intermediate_size``),
    Qwen2-MoE/Qwen3-MoE (``num_experts``, ``moe_intermediate_size``,
    ``shared_expert_intermediate_size``, ``decoder_sparse_step``, ``mlp_only_layers``),
    DeepSeek-V2/V3 (``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``,
    ``moe_layer_freq``, multi-latent attention ``q_lora_rank``, ``kv_lora_rank``,
    ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``, ``num_nextn_predict_layers``)
    and GPT-OSS (``num_local_experts``, ``experts_per_token``, biases everywhere). Common
    fields: ``num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
    head_dim, intermediate_size, vocab_size, max_position_embeddings, tie_word_embeddings,
    rope_theta, rms_norm_eps``; ``rope_scaling`` of type ``yarn`` (not MLA's) gives
    ``yarn_rotary_scaling_factor``. Raises :class:`InputError` naming the missing field, or a
    field that changes the model and is not supported (sliding-window attention shorter
    than the sequence, soft-capping, partial rotary, unknown expert or layer fields).
    """
    used: set[str] = set()

    def get(key, default=None):
        used.add(key)
        val = cfg.get(key, default)
        return default if val is None else val

    def need(*keys):
        for k in keys:
            used.add(k)
            if k in cfg and cfg[k] is not None:
                return cfg[k]
        raise InputError(f"config.json.{keys[0]}", None, "missing required key")

    def flag(key, default=False):
        return v.boolean(f"config.json.{key}", get(key, default))

    mtype = cfg.get("model_type", "")
    if not isinstance(mtype, str):
        raise InputError("config.json.model_type", mtype, "must be a string")
    if mtype == "llama4":
        # the multimodal wrapper (Llama4ForConditionalGeneration): its language model, what
        # Megatron-Bridge's Llama 4 recipes pretrain; the vision encoder is not priced
        text = cfg.get("text_config")
        if not isinstance(text, Mapping):
            raise InputError("config.json.text_config", text,
                             "a llama4 config holds its language model in text_config")
        top = {k: cfg[k] for k in ("tie_word_embeddings",) if k in cfg}
        return from_hf_config({**top, **text, "model_type": "llama4_text"}, name)
    if mtype == "gpt2" or "n_embd" in cfg:
        hidden = v.int_in_range("config.json.n_embd", need("n_embd"), key="hidden_size")
        spec = make_model(
            name=name, num_layers=need("n_layer"), hidden_size=hidden,
            num_attention_heads=need("n_head"),
            ffn_hidden_size=get("n_inner") or 4 * hidden, vocab_size=need("vocab_size"),
            **_seq_kw(cfg, "n_positions", need("n_positions", "n_ctx")),
            hidden_dropout=get("resid_pdrop", 0.1), attention_dropout=get("attn_pdrop", 0.1),
            norm_epsilon=get("layer_norm_epsilon", 1e-5))
        _refuse_unmapped(cfg, used)
        return spec
    layers = v.int_in_range("config.json.num_hidden_layers", need("num_hidden_layers"),
                            key="num_layers")
    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    act = get("hidden_act", "silu")
    if act not in ("silu", "swiglu", "gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise InputError("config.json.hidden_act", act, "supported: silu/swiglu (gated), gelu")
    kw: dict[str, Any] = dict(
        name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_query_groups=get("num_key_value_heads") or heads,
        vocab_size=need("vocab_size"),
        **_seq_kw(cfg, "max_position_embeddings", need("max_position_embeddings")),
        swiglu=act in ("silu", "swiglu"),
        untie_embeddings_and_output_weights=not flag("tie_word_embeddings"),
        normalization="RMSNorm" if "rms_norm_eps" in cfg else "LayerNorm",
        norm_epsilon=get("rms_norm_eps", get("layer_norm_eps", 1e-5)),
        hidden_dropout=get("hidden_dropout", 0.0), attention_dropout=get("attention_dropout",
                                                                         0.0),
        position_embedding_type="rope" if "rope_theta" in cfg or mtype in (
            "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
            "deepseek_v2", "deepseek_v3", "gpt_oss") else "learned_absolute")
    if kw["position_embedding_type"] == "rope":
        theta = get("rope_theta", 10000)
        if isinstance(theta, float) and theta.is_integer():
            theta = int(theta)
        kw["rotary_base"] = theta
        scaling = cfg.get("rope_scaling")
        if (isinstance(scaling, Mapping) and not mtype.startswith("deepseek")
                and (scaling.get("rope_type") or scaling.get("type")) == "yarn"):
            # GPT-OSS: factor 32 (MLA's YaRN is its own rotary embedding, not this one)
            kw["yarn_rotary_scaling_factor"] = v.positive_float(
                "config.json.rope_scaling.factor", scaling.get("factor"))
    if get("head_dim") is not None and not (mtype.startswith("deepseek")):
        kw["kv_channels"] = get("head_dim")
    attention_bias = flag("attention_bias")
    mlp_bias = flag("mlp_bias")
    # Qwen2 (dense and MoE) always has q/k/v biases and no others (modeling_qwen2.py).
    kw["add_qkv_bias"] = mtype in ("qwen2", "qwen2_moe")
    kw["add_bias_linear"] = attention_bias or mlp_bias
    kw["qk_layernorm"] = mtype in ("qwen3", "qwen3_moe")
    window = get("sliding_window")
    if window is not None:
        window = v.int_in_range("config.json.sliding_window", window, key="window_size")
    # against the maximum context: a window shorter than it matters at some --seq-length
    seq = kw["max_position_embeddings"]
    if window is not None and (get("use_sliding_window", True) is not False) and (
            mtype not in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")
            or cfg.get("use_sliding_window")) and window < seq:
        kw.update(_hf_window(cfg, window, layers))
        used.add("layer_types")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key):
            raise InputError(f"config.json.{key}", cfg[key], "soft-capping is not supported")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise InputError("config.json.partial_rotary_factor", cfg["partial_rotary_factor"],
                         "partial rotary embeddings are not supported")
    used.add("partial_rotary_factor")

    if mtype in ("mixtral", "gpt_oss"):
        kw.update(num_experts=need("num_local_experts"),
                  moe_router_topk=need("num_experts_per_tok", "experts_per_token"),
                  ffn_hidden_size=need("intermediate_size"))
        used.update(("experts_per_token",))
        if mtype == "gpt_oss":
            # biases on q/k/v/o and on the experts (modeling_gpt_oss.py); the per-head
            # attention sinks (a·L parameters, < 1e-7 of the model) are not counted.
            kw["add_bias_linear"] = True
            if get("swiglu_limit") is not None:   # GptOssExperts clamps gate and up
                kw["activation_func_clamp_value"] = get("swiglu_limit")
            # no balancing loss (Megatron-Bridge's gpt_oss_bridge.py)
            kw["moe_router_load_balancing_type"] = "none"
    elif mtype in ("qwen2_moe", "qwen3_moe"):
        dense = get("mlp_only_layers", []) or []
        if not isinstance(dense, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                              for i in dense):
            raise InputError("config.json.mlp_only_layers", dense,
                             "must be a list of layer numbers")
        step = v.int_in_range("config.json.decoder_sparse_step", get("decoder_sparse_step", 1),
                              key="moe_layer_freq")
        # modeling_qwen2_moe.py: layer i is sparse when i not in mlp_only_layers and
        # (i + 1) % decoder_sparse_step == 0
        pattern = [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]
        kw.update(num_experts=need("num_experts"),
                  moe_router_topk=need("num_experts_per_tok"),
                  moe_ffn_hidden_size=need("moe_intermediate_size"),
                  ffn_hidden_size=get("intermediate_size") or need("moe_intermediate_size"),
                  moe_layer_freq=1 if all(pattern) else pattern)
        shared = get("shared_expert_intermediate_size")
        if shared is not None and shared != 0:
            kw["moe_shared_expert_intermediate_size"] = shared
        if mtype == "qwen3_moe":
            # balanced over the global batch (Qiu et al., ACL 2025: "Global-batch LBL is
            # also used in Qwen3-MoEs"), which no config.json states
            kw["moe_router_load_balancing_type"] = "global_aux_loss"
    elif mtype == "llama4_text":
        kw.update(_llama4_moe(cfg, layers, get, need))
    elif mtype in ("deepseek_v2", "deepseek_v3"):
        first_dense = get("first_k_dense_replace", 0)
        if isinstance(first_dense, bool) or not isinstance(first_dense, int) or not (
                0 <= first_dense < layers):
            raise InputError("config.json.first_k_dense_replace", first_dense,
                             f"must be an integer in [0, {layers})")
        freq = v.int_in_range("config.json.moe_layer_freq", get("moe_layer_freq", 1),
                              key="moe_layer_freq")
        pattern = [int(i >= first_dense and i % freq == 0) for i in range(layers)]
        kw.update(num_experts=need("n_routed_experts"),
                  moe_router_topk=need("num_experts_per_tok"),
                  moe_ffn_hidden_size=need("moe_intermediate_size"),
                  ffn_hidden_size=need("intermediate_size"),
                  moe_layer_freq=1 if all(pattern) else pattern,
                  multi_latent_attention=True, qk_layernorm=True,   # q_a/kv_a layernorms
                  q_lora_rank=get("q_lora_rank"),
                  kv_lora_rank=need("kv_lora_rank"), qk_head_dim=need("qk_nope_head_dim"),
                  qk_pos_emb_head_dim=need("qk_rope_head_dim"), v_head_dim=need("v_head_dim"))
        n_shared = get("n_shared_experts", 0)
        if n_shared:
            n_shared = v.int_in_range("config.json.n_shared_experts", n_shared,
                                      key="num_experts")
            kw["moe_shared_expert_intermediate_size"] = n_shared * v.int_in_range(
                "config.json.moe_intermediate_size", need("moe_intermediate_size"),
                key="moe_ffn_hidden_size")
        # a sequence-wise loss (DeepSeek-V2/V3 reports; Megatron-Bridge's deepseek bridges)
        # and, with topk_method noaux_tc, V3's auxiliary-loss-free expert bias
        kw["moe_router_load_balancing_type"] = "seq_aux_loss"
        kw["moe_router_enable_expert_bias"] = get("topk_method") == "noaux_tc"
        mtp = get("num_nextn_predict_layers", 0)
        if mtp is not False and mtp != 0:
            kw["mtp_num_layers"] = mtp
        used.add("head_dim")
    else:
        for key in ("num_local_experts", "num_experts", "n_routed_experts"):
            if cfg.get(key):
                raise InputError(f"config.json.{key}", cfg[key],
                                 f"experts in a model_type {mtype!r} config are not supported "
                                 "(supported MoE families: mixtral, qwen2_moe, qwen3_moe, "
                                 "deepseek_v2, deepseek_v3, gpt_oss, llama4)")
        kw["ffn_hidden_size"] = need("intermediate_size")
    spec = make_model(**kw)
    _refuse_unmapped(cfg, used)
    return spec


def _llama4_moe(cfg: Mapping[str, Any], layers: int, get, need) -> dict:
    """The MoE and attention fields of a Llama 4 language model (``llama4_text``; Hugging
    Face transformers ``modeling_llama4.py``, ``configuration_llama4.py``): ``moe_layers``
    (default every ``interleave_moe_layer_step``-th layer, from layer ``step − 1``) hold
    ``num_local_experts`` routed experts of ``intermediate_size`` and one shared expert of
    the same size (``Llama4TextMoe.shared_expert``); the other layers a dense MLP of
    ``intermediate_size_mlp``. ``attention_chunk_size``: chunked attention
    (:attr:`~configurator.core.model.ModelSpec.attention_chunk_size`). The NoPE layers
    (``no_rope_layers``), the query/key L2 norm (``use_qk_norm``, no parameters) and the
    attention temperature tuning leave the cost alone."""
    step = v.int_in_range("config.json.interleave_moe_layer_step",
                          get("interleave_moe_layer_step", 1), key="moe_layer_freq")
    moe = get("moe_layers")
    if moe is None:
        moe = list(range(step - 1, layers, step))
    if not isinstance(moe, list) or any(isinstance(i, bool) or not isinstance(i, int)
                                        or not 0 <= i < layers for i in moe):
        raise InputError("config.json.moe_layers", moe,
                         f"must be a list of layer numbers in [0, {layers})")
    pattern = [int(i in set(moe)) for i in range(layers)]
    if not any(pattern):
        raise InputError("config.json.moe_layers", moe, "must name at least one MoE layer")
    expert = v.int_in_range("config.json.intermediate_size", need("intermediate_size"),
                            key="moe_ffn_hidden_size")
    for key in ("no_rope_layers", "no_rope_layer_interval", "use_qk_norm",
                "attn_temperature_tuning", "attn_scale", "floor_scale"):
        get(key)
    chunk = get("attention_chunk_size")
    return dict(num_experts=need("num_local_experts"),
                moe_router_topk=need("num_experts_per_tok"), moe_ffn_hidden_size=expert,
                moe_shared_expert_intermediate_size=expert,
                ffn_hidden_size=get("intermediate_size_mlp") or expert,
                moe_layer_freq=1 if all(pattern) else pattern,
                **({} if chunk is None else {"attention_chunk_size": v.int_in_range(
                    "config.json.attention_chunk_size", chunk, key="attention_chunk_size")}))


def _seq_kw(cfg: Mapping[str, Any], key: str, max_positions: Any) -> dict:
    """``seq_length``, ``max_position_embeddings`` and ``seq_length_source`` of a config
    whose maximum context is ``max_positions`` (read from ``key``)."""
    ctx = v.int_in_range(f"config.json.{key}", max_positions, key="max_position_embeddings")
    seq, why = pretraining_seq_length(cfg, ctx)
    return {"seq_length": seq, "max_position_embeddings": ctx, "seq_length_source": why}


def _hf_window(cfg: Mapping[str, Any], window: Any, layers: int) -> dict:
    """``window_size`` and ``window_attn_skip_freq`` from ``sliding_window`` and, where
    given, ``layer_types`` (every layer windowed, or a full-attention layer every N-th,
    1-based, as Megatron's ``is_layer_window_attention``). Any other pattern is an error."""
    w = v.int_in_range("config.json.sliding_window", window, key="window_size")
    types = cfg.get("layer_types")
    if not types:
        return {"window_size": w}
    if not isinstance(types, list) or len(types) != layers:
        raise InputError("config.json.layer_types", types, f"must list {layers} layer types")
    full = [i + 1 for i, t in enumerate(types) if t == "full_attention"]
    if not full:
        return {"window_size": w}
    n = full[0]
    if full != list(range(n, layers + 1, n)) or any(
            t not in ("full_attention", "sliding_attention") for t in types):
        raise InputError("config.json.layer_types", types,
                         "only a full-attention layer every N-th layer is supported")
    return {"window_size": w, "window_attn_skip_freq": n}


def _refuse_unmapped(cfg: Mapping[str, Any], used: set[str]) -> None:
    for key, val in cfg.items():
        if key in used or key in HF_KEYS_NO_COST or val in (None, False, 0, [], {}):
            continue
        low = key.lower()
        if any(w in low for w in _HF_ARCH_WORDS):
            raise InputError(f"config.json.{key}", val,
                             "changes the model and is not supported by the import")
