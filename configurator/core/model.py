"""Model specification (Megatron-LM argument names), presets and loaders.

A model is given as a preset name, a YAML/JSON file with exactly the keys of
:data:`MODEL_KEYS`, or a local Hugging Face ``config.json`` (Llama, GPT-2, Mistral, Qwen).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError


def swiglu_ffn_hidden_size(hidden_size: int) -> int:
    """Megatron's default FFN size with SwiGLU: ``int(8h/3/64)*64``.

    Source: megatron/training/arguments.py (``if args.swiglu: args.ffn_hidden_size =
    int((4 * args.hidden_size * 2 / 3) / 64) * 64``).
    """
    return int((4 * hidden_size * 2 / 3) / 64) * 64


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A GPT-style decoder (dense or mixture of experts), in Megatron-LM's argument names.

    Sizes are counts (layers, hidden units, heads, tokens). ``hidden_dropout`` and
    ``attention_dropout`` are probabilities (Megatron's defaults 0.1; Llama-family 0.0); a
    dropout of 0 stores no mask. ``position_embedding_type`` is ``learned_absolute`` (GPT,
    an s×h table on the first stage) or ``rope`` (no parameters). ``kv_channels`` is the
    head dimension (Megatron's default ``h / a``).

    Mixture of experts (megatron/core/transformer/moe): ``num_experts`` routed experts
    (``None``: dense), each token to ``moe_router_topk`` of them; experts of
    ``moe_ffn_hidden_size`` (default ``ffn_hidden_size``), an optional shared expert of
    ``moe_shared_expert_intermediate_size``; ``moe_layer_freq`` an int ``N`` (every N-th
    layer is MoE, counting from layer 0) or one 0/1 per layer (1 = MoE), as Megatron's
    ``--moe-layer-freq``. Dense layers use ``ffn_hidden_size``.

    Multi-latent attention (DeepSeek-V2/V3; megatron/core/transformer/multi_latent_attention.py):
    ``q_lora_rank`` (``None``: no query compression), ``kv_lora_rank``, ``qk_head_dim`` (the
    no-position part of a query/key head), ``qk_pos_emb_head_dim`` (its RoPE part) and
    ``v_head_dim``; with MLA, ``qk_layernorm`` means the norms on the latents (DeepSeek's
    ``q_a_layernorm``/``kv_a_layernorm``). ``mtp_num_layers`` multi-token-prediction
    modules (each one more transformer layer, a 2h×h projection and three norms, on the last
    stage).
    ``window_size``: sliding-window attention over that many past keys (Megatron
    ``--window-size (w,0)``), on every layer or, with ``window_attn_skip_freq`` N, on all but
    every N-th layer (``--window-attn-skip-freq``, GPT-OSS: 2).
    ``activation_func_clamp_value``: the gated MLP's inputs clamped to it before the
    activation (TransformerConfig, GPT-OSS: 7.0, Hugging Face ``swiglu_limit``; megatron-core
    clamps them in eager ops ahead of its fused activation, ``weighted_bias_quick_geglu_impl``).
    ``yarn_rotary_scaling_factor``: RoPE extended by YaRN with this factor (megatron-core's
    ``position_embedding_type='yarn'``, ``YarnRotaryEmbedding``; Megatron-Bridge's GPT-OSS:
    32, Hugging Face ``rope_scaling`` of type ``yarn``); its attention concentration factor
    (:attr:`rope_mscale`) scales cos and sin, which Transformer Engine's fused RoPE does not
    take, so megatron-core applies RoPE in eager ops (``rope_utils.apply_rotary_pos_emb``).
    No parameters. Needs ``position_embedding_type: rope`` and no multi-latent attention.
    """

    name: str = "custom"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    kv_channels: int
    swiglu: bool = False
    untie_embeddings_and_output_weights: bool = False
    normalization: str = "LayerNorm"
    norm_epsilon: float = 1e-5
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    position_embedding_type: str = "learned_absolute"
    rotary_base: int = 10000
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | tuple[int, ...] = 1
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    mtp_num_layers: int | None = None
    window_size: int | None = None
    window_attn_skip_freq: int | None = None
    activation_func_clamp_value: float | None = None
    yarn_rotary_scaling_factor: float | None = None

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def rope_mscale(self) -> float:
        """YaRN's attention concentration factor ``0.1·ln(factor) + 1`` (1 without YaRN or
        with a factor ≤ 1): megatron-core ``yarn_rotary_pos_embedding._yarn_get_mscale``, as
        ``_yarn_get_concentration_factor`` takes it with ``yarn_mscale`` and
        ``yarn_mscale_all_dim`` unset (Megatron-Bridge's GPT-OSS sets both to None)."""
        f = self.yarn_rotary_scaling_factor
        return 1.0 if f is None or f <= 1 else 0.1 * math.log(f) + 1.0

    @property
    def rope_unfused(self) -> bool:
        """megatron-core applies this model's RoPE in eager ops: TE's fused RoPE takes no
        ``mscale`` (core_v0.16.1 ``rope_utils.apply_rotary_pos_emb``: "mscale ... is not
        supported by TE's fused RoPE. Using unfused implementation")."""
        return self.position_embedding_type == "rope" and self.rope_mscale != 1.0

    @property
    def moe_layer_pattern(self) -> tuple[int, ...]:
        """One 0/1 per layer, 1 for an MoE layer (all 0 for a dense model); Megatron's
        ``TransformerConfig.moe_layer_freq`` expansion (int N: ``i % N == 0``)."""
        if not self.num_experts:
            return (0,) * self.num_layers
        if isinstance(self.moe_layer_freq, int):
            return tuple(int(i % self.moe_layer_freq == 0) for i in range(self.num_layers))
        return tuple(self.moe_layer_freq)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_pattern)

    @property
    def attention_heads_dims(self) -> tuple[int, int]:
        """``(query/key head dim, value head dim)``: MLA ``(qk + qk_pos_emb, v)``, else
        ``(kv_channels, kv_channels)``."""
        if self.multi_latent_attention:
            return self.qk_head_dim + self.qk_pos_emb_head_dim, self.v_head_dim
        return self.kv_channels, self.kv_channels

    @property
    def attention_kv_heads(self) -> int:
        """Key/value heads the attention kernel sees: the query groups, or every head with
        multi-latent attention (K and V are up-projected per head)."""
        return self.num_attention_heads if self.multi_latent_attention else self.num_query_groups

    @property
    def num_window_layers(self) -> int:
        """Layers with sliding-window attention (Megatron's ``is_layer_window_attention``:
        every layer, or all but every ``window_attn_skip_freq``-th, 1-based)."""
        if not self.window_size:
            return 0
        if not self.window_attn_skip_freq:
            return self.num_layers
        return self.num_layers - self.num_layers // self.window_attn_skip_freq

    @property
    def attention_layer_kinds(self) -> tuple[tuple[float, float, int | None], ...]:
        """The layers' kinds of self-attention as ``(share of the layers, fraction of the
        s × s query-key pairs computed, window in keys or None)``: full causal attention
        computes ½ of the pairs; a causal window of ``w`` keys ``w/s·(1 − w/(2s))``
        (Megatron ``is_layer_window_attention`` decides which layers,
        :attr:`num_window_layers`). A window of ``s`` keys or more is full attention."""
        s = self.seq_length
        n = self.num_window_layers
        if not n or self.window_size >= s:
            return ((1.0, 0.5, None),)
        w = self.window_size
        window = (n / self.num_layers, w / s * (1 - w / (2 * s)), w)
        if n == self.num_layers:
            return (window,)
        return ((1.0 - n / self.num_layers, 0.5, None), window)

    @property
    def attention_score_fraction(self) -> float:
        """Mean fraction of the ``s × s`` query-key pairs a layer computes, over the layers
        (:attr:`attention_layer_kinds`)."""
        return sum(share * fraction for share, fraction, _ in self.attention_layer_kinds)

    def with_seq_length(self, seq_length: int) -> "ModelSpec":
        return dataclasses.replace(self, seq_length=v.int_in_range("seq_length", seq_length))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if isinstance(self.moe_layer_freq, tuple):
            d["moe_layer_freq"] = list(self.moe_layer_freq)
        return d


MODEL_KEYS_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size",
                       "seq_length")
#: Keys with their defaults filled in by :func:`make_model` (Megatron's defaults).
MODEL_KEYS_OPTIONAL = ("name", "num_query_groups", "ffn_hidden_size", "kv_channels", "swiglu",
                       "untie_embeddings_and_output_weights", "normalization", "norm_epsilon",
                       "hidden_dropout", "attention_dropout", "position_embedding_type",
                       "rotary_base", "add_bias_linear", "add_qkv_bias", "qk_layernorm",
                       "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
                       "moe_shared_expert_intermediate_size", "moe_layer_freq",
                       "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                       "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers", "window_size",
                       "window_attn_skip_freq", "activation_func_clamp_value",
                       "yarn_rotary_scaling_factor")
MODEL_KEYS = MODEL_KEYS_REQUIRED + MODEL_KEYS_OPTIONAL


def _optional_int(kw: Mapping[str, Any], key: str, default=None):
    val = kw.get(key, default)
    return None if val is None else v.int_in_range(key, val)


def _probability(key: str, val: Any) -> float:
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val < 1:
        raise InputError(key, val, "must be a probability in [0, 1)")
    return float(val)


def _layer_freq(val: Any, num_layers: int) -> int | tuple[int, ...]:
    """``moe_layer_freq``: a positive int, or a list of one 0/1 per layer with at least one 1
    (Megatron's ``--moe-layer-freq``, transformer_config.py)."""
    if isinstance(val, (list, tuple)):
        if len(val) != num_layers or any(isinstance(x, bool) or x not in (0, 1) for x in val):
            raise InputError("moe_layer_freq", val,
                             f"a list must hold one 0 or 1 per layer ({num_layers})")
        if not any(val):
            raise InputError("moe_layer_freq", val, "must mark at least one MoE layer")
        return tuple(int(x) for x in val)
    n = v.int_in_range("moe_layer_freq", val)
    if n > num_layers:
        raise InputError("moe_layer_freq", n, f"must be at most num_layers ({num_layers})")
    return n


def make_model(**kw: Any) -> ModelSpec:
    """Build a validated :class:`ModelSpec` from Megatron-named keyword arguments.

    Raises :class:`InputError` naming the field for a non-positive size, heads that do not
    divide the hidden size (when ``kv_channels`` is not given), query groups that do not
    divide the heads, an unknown normalization, MoE fields without ``num_experts``,
    ``moe_router_topk`` above ``num_experts``, MLA fields without
    ``multi_latent_attention``, or a bad ``moe_layer_freq``. Rules from Megatron-LM
    core_v0.16.1 ``megatron/training/arguments.py`` (``validate_args``) and
    ``transformer_config.py`` (``__post_init__``).
    """
    v.exact_keys("model", kw, MODEL_KEYS_REQUIRED, MODEL_KEYS_OPTIONAL)
    n = {k: v.int_in_range(k, kw[k]) for k in MODEL_KEYS_REQUIRED}
    heads, hidden = n["num_attention_heads"], n["hidden_size"]
    if kw.get("kv_channels") is None and hidden % heads:
        raise InputError("num_attention_heads", heads,
                         f"must divide hidden_size ({hidden}) to give the head dimension "
                         "(or give kv_channels)")
    kv_channels = _optional_int(kw, "kv_channels") or hidden // heads
    groups = v.int_in_range("num_query_groups", kw.get("num_query_groups", heads))
    if heads % groups:
        raise InputError("num_query_groups", groups,
                         f"must divide num_attention_heads ({heads})")
    swiglu = v.boolean("swiglu", kw.get("swiglu", False))
    ffn_default = swiglu_ffn_hidden_size(hidden) if swiglu else 4 * hidden
    ffn = v.int_in_range("ffn_hidden_size", kw.get("ffn_hidden_size", ffn_default))
    flags = {k: v.boolean(k, kw.get(k, d)) for k, d in (
        ("untie_embeddings_and_output_weights", False), ("add_bias_linear", True),
        ("add_qkv_bias", False), ("qk_layernorm", False), ("multi_latent_attention", False))}
    norm = v.choice("normalization", kw.get("normalization", "LayerNorm"),
                    ("LayerNorm", "RMSNorm"))
    eps = kw.get("norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise InputError("norm_epsilon", eps, "must be a number in (0, 1)")
    drops = {k: _probability(k, kw.get(k, 0.1)) for k in ("hidden_dropout", "attention_dropout")}
    pos = v.choice("position_embedding_type", kw.get("position_embedding_type",
                                                      "learned_absolute"),
                   ("learned_absolute", "rope", "none"))
    rotary_base = v.int_in_range("rotary_base", kw.get("rotary_base", 10000))
    experts = _optional_int(kw, "num_experts")
    moe = {"moe_router_topk": v.int_in_range("moe_router_topk", kw.get("moe_router_topk", 2)),
           "moe_ffn_hidden_size": _optional_int(kw, "moe_ffn_hidden_size"),
           "moe_shared_expert_intermediate_size": _optional_int(
               kw, "moe_shared_expert_intermediate_size"),
           "moe_layer_freq": _layer_freq(kw.get("moe_layer_freq", 1), n["num_layers"])}
    if experts is None:
        defaults = {"moe_router_topk": 2, "moe_layer_freq": 1}
        given = [k for k in moe if kw.get(k) not in (None, defaults.get(k))]
        if given:
            raise InputError(given[0], kw[given[0]], "needs num_experts (a dense model has "
                             "no experts)")
    else:
        if moe["moe_router_topk"] > experts:
            raise InputError("moe_router_topk", moe["moe_router_topk"],
                             f"must be at most num_experts ({experts})")
        moe["moe_ffn_hidden_size"] = moe["moe_ffn_hidden_size"] or ffn
    mla_keys = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                "v_head_dim")
    if not flags["multi_latent_attention"]:
        mla_defaults = {"kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                        "v_head_dim": 128}
        given = [k for k in mla_keys if kw.get(k) not in (None, mla_defaults.get(k))]
        if given:
            raise InputError(given[0], kw[given[0]], "needs multi_latent_attention: true")
    mla = {"q_lora_rank": _optional_int(kw, "q_lora_rank"),
           **{k: _optional_int(kw, k, d) for k, d in (("kv_lora_rank", 512),
                                                       ("qk_head_dim", 128),
                                                       ("qk_pos_emb_head_dim", 64),
                                                       ("v_head_dim", 128))}}
    mtp = _optional_int(kw, "mtp_num_layers")
    # validate_args / TransformerConfig / SharedExpertMLP rules
    if flags["multi_latent_attention"] and groups != heads:
        raise InputError("num_query_groups", groups, "multi-latent attention has no query "
                         f"groups: leave it at num_attention_heads ({heads})")
    if mtp and pos == "learned_absolute":
        raise InputError("mtp_num_layers", mtp, "multi-token prediction needs rope or no "
                         "position embedding")
    if experts is not None and moe["moe_shared_expert_intermediate_size"] and \
            flags["add_bias_linear"]:
        raise InputError("moe_shared_expert_intermediate_size",
                         moe["moe_shared_expert_intermediate_size"],
                         "a shared expert has no biases: needs add_bias_linear false")
    window = {k: _optional_int(kw, k) for k in ("window_size", "window_attn_skip_freq")}
    if window["window_attn_skip_freq"] and not window["window_size"]:
        raise InputError("window_attn_skip_freq", window["window_attn_skip_freq"],
                         "needs window_size")
    clamp = kw.get("activation_func_clamp_value")
    if clamp is not None:
        clamp = v.positive_float("activation_func_clamp_value", clamp)
        if not swiglu:
            raise InputError("activation_func_clamp_value", clamp,
                             "clamps a gated MLP's inputs: needs swiglu (a gated linear unit)")
    yarn = kw.get("yarn_rotary_scaling_factor")
    if yarn is not None:
        yarn = v.positive_float("yarn_rotary_scaling_factor", yarn)
        if pos != "rope" or flags["multi_latent_attention"]:
            raise InputError("yarn_rotary_scaling_factor", yarn,
                             "scales RoPE: needs position_embedding_type rope and no "
                             "multi-latent attention (MLA has its own rotary embedding)")
    name = v.display_name("name", kw.get("name", "custom"))
    return ModelSpec(name=name, num_query_groups=groups, ffn_hidden_size=ffn,
                     activation_func_clamp_value=clamp, yarn_rotary_scaling_factor=yarn,
                     kv_channels=kv_channels, swiglu=swiglu, normalization=norm,
                     norm_epsilon=float(eps), position_embedding_type=pos,
                     rotary_base=rotary_base, num_experts=experts, mtp_num_layers=mtp,
                     **window, **flags, **drops, **moe, **mla, **n)


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 2048) -> ModelSpec:
    # GPT-3 style: 4h GELU MLP, LayerNorm, tied embeddings, learned positions, vocab 51200
    # (the vocabulary SC'21 Table 1 and Korthikanti et al. Table 3 use).
    return make_model(name=name, num_layers=layers, hidden_size=hidden,
                      num_attention_heads=heads, vocab_size=51200, seq_length=seq)


def _llama(name, layers, hidden, heads, groups, ffn, vocab, seq, rotary_base) -> ModelSpec:
    # Llama family: SwiGLU, RMSNorm (eps 1e-5), RoPE, untied output layer, no biases, no
    # dropout (Touvron et al. 2023, Llama 2 Table 1; Meta Llama 3 / 3.1 model cards and
    # config.json: rope_theta 10000 for Llama 2, 500000 for Llama 3).
    return make_model(name=name, num_layers=layers, hidden_size=hidden,
                      num_attention_heads=heads, num_query_groups=groups, ffn_hidden_size=ffn,
                      vocab_size=vocab, seq_length=seq, swiglu=True,
                      untie_embeddings_and_output_weights=True, normalization="RMSNorm",
                      hidden_dropout=0.0, attention_dropout=0.0, position_embedding_type="rope",
                      add_bias_linear=False, rotary_base=rotary_base)


#: Mixture-of-experts presets at Megatron-Bridge's pre-training sequence length (4096), from
#: each model's Hugging Face config.json (tests/data/hf_configs: Qwen/Qwen3-30B-A3B,
#: Qwen/Qwen3-235B-A22B, mistralai/Mixtral-8x7B-v0.1, deepseek-ai/DeepSeek-V3,
#: openai/gpt-oss-120b).
_MOE_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": dict(num_layers=48, hidden_size=2048, num_attention_heads=32,
                          num_query_groups=4, kv_channels=128, ffn_hidden_size=6144,
                          vocab_size=151936, rotary_base=1000000, norm_epsilon=1e-6,
                          qk_layernorm=True, num_experts=128, moe_router_topk=8,
                          moe_ffn_hidden_size=768),
    "qwen3-235b-a22b": dict(num_layers=94, hidden_size=4096, num_attention_heads=64,
                            num_query_groups=4, kv_channels=128, ffn_hidden_size=12288,
                            vocab_size=151936, rotary_base=1000000, norm_epsilon=1e-6,
                            qk_layernorm=True, num_experts=128, moe_router_topk=8,
                            moe_ffn_hidden_size=1536),
    "mixtral-8x7b": dict(num_layers=32, hidden_size=4096, num_attention_heads=32,
                         num_query_groups=8, ffn_hidden_size=14336, vocab_size=32000,
                         rotary_base=1000000, num_experts=8, moe_router_topk=2),
    "deepseek-v3": dict(num_layers=61, hidden_size=7168, num_attention_heads=128,
                        ffn_hidden_size=18432, vocab_size=129280, norm_epsilon=1e-6,
                        num_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048,
                        moe_shared_expert_intermediate_size=2048,
                        moe_layer_freq=[0] * 3 + [1] * 58, multi_latent_attention=True,
                        qk_layernorm=True,
                        q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128,
                        qk_pos_emb_head_dim=64, v_head_dim=128, mtp_num_layers=1),
    "gpt-oss-120b": dict(num_layers=36, hidden_size=2880, num_attention_heads=64,
                         num_query_groups=8, kv_channels=64, ffn_hidden_size=2880,
                         vocab_size=201088, rotary_base=150000, add_bias_linear=True,
                         num_experts=128, moe_router_topk=4, window_size=128,
                         window_attn_skip_freq=2, activation_func_clamp_value=7.0,
                         yarn_rotary_scaling_factor=32.0),
}


def _moe(name: str, **kw: Any) -> ModelSpec:
    # SwiGLU, RMSNorm, RoPE, untied output layer, no dropout, no biases unless given
    base = dict(swiglu=True, untie_embeddings_and_output_weights=True, normalization="RMSNorm",
                hidden_dropout=0.0, attention_dropout=0.0, position_embedding_type="rope",
                add_bias_linear=False, seq_length=4096)
    return make_model(name=name, **(base | kw))


#: Presets. ``gpt-*``: the ten models of Narayanan et al. SC'21 Table 1 (heads, hidden,
#: layers as published). ``gpt3-175b``: Brown et al. 2020 Table 2.1.
MODEL_PRESETS: dict[str, ModelSpec] = {m.name: m for m in [
    _gpt("gpt-1.7b", 24, 2304, 24),
    _gpt("gpt-3.6b", 30, 3072, 32),
    _gpt("gpt-7.5b", 36, 4096, 32),
    _gpt("gpt-18.4b", 40, 6144, 48),
    _gpt("gpt-39.1b", 48, 8192, 64),
    _gpt("gpt-76.1b", 60, 10240, 80),
    _gpt("gpt-145.6b", 80, 12288, 96),
    _gpt("gpt-310.1b", 96, 16384, 128),
    _gpt("gpt-529.6b", 105, 20480, 128),
    _gpt("gpt-1t", 128, 25600, 160),
    _gpt("gpt3-175b", 96, 12288, 96),
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 10000),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 10000),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 10000),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 500000),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 500000),
    _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 500000),
    *(_moe(name, **kw) for name, kw in _MOE_PRESETS.items()),
]}


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
))
#: A key naming one of these, when not mapped, changes the model: refuse to drop it.
_HF_ARCH_WORDS = ("expert", "moe", "lora", "head_dim", "layer", "hidden", "intermediate",
                  "inner", "heads", "window", "softcap", "partial_rotary", "nextn", "mtp",
                  "dense", "sparse", "shared", "latent", "vocab", "embd", "n_", "num_",
                  "bias", "norm")


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
    if mtype == "gpt2" or "n_embd" in cfg:
        hidden = v.int_in_range("config.json.n_embd", need("n_embd"), key="hidden_size")
        spec = make_model(
            name=name, num_layers=need("n_layer"), hidden_size=hidden,
            num_attention_heads=need("n_head"),
            ffn_hidden_size=get("n_inner") or 4 * hidden, vocab_size=need("vocab_size"),
            seq_length=need("n_positions", "n_ctx"),
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
        vocab_size=need("vocab_size"), seq_length=need("max_position_embeddings"),
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
    seq = v.int_in_range("config.json.max_position_embeddings", kw["seq_length"],
                         key="seq_length")
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
                                 "deepseek_v2, deepseek_v3, gpt_oss)")
        kw["ffn_hidden_size"] = need("intermediate_size")
    spec = make_model(**kw)
    _refuse_unmapped(cfg, used)
    return spec


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


def load_model(ref: str) -> ModelSpec:
    """Resolve ``ref``: a preset name (any case), a Megatron-keyed YAML/JSON file, or an HF
    config.json.

    A JSON file with ``model_type`` or ``num_hidden_layers``/``n_layer`` is read as a Hugging
    Face config, named after its folder (``…/NAME/config.json``) or its file name; any other
    file must hold exactly :data:`MODEL_KEYS`.
    Raises :class:`InputError` (field ``model``) for an unknown preset or unreadable file.
    """
    preset = v.preset_name(ref, MODEL_PRESETS)
    if preset is not None:
        return MODEL_PRESETS[preset]
    if not os.path.exists(ref):
        raise InputError("model", ref, "not a preset name nor an existing file"
                         + (v.did_you_mean(ref, MODEL_PRESETS)
                            or " (presets: " + ", ".join(MODEL_PRESETS) + ")"))
    data = v.load_mapping_file("model", ref)
    if any(k in data for k in ("model_type", "num_hidden_layers", "n_layer")):
        path = os.path.abspath(ref)
        base = (os.path.basename(os.path.dirname(path)) if os.path.basename(path) == "config.json"
                else os.path.splitext(os.path.basename(path))[0])
        # the folder's name, made displayable: printable characters, at most 64
        base = "".join(c for c in base if c.isprintable())[:64] or "hf-model"
        return from_hf_config(data, name=base)
    return make_model(**dict(data))
