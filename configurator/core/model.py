"""Model specification (Megatron-LM argument names), presets and loaders.

A model is given as a preset name, a YAML/JSON file with exactly the keys of
:data:`MODEL_KEYS`, or a local Hugging Face ``config.json`` (Llama, GPT-2, Mistral, Qwen).
"""

from __future__ import annotations

import dataclasses
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
    """A dense GPT-style decoder, in Megatron-LM's argument names.

    Sizes are counts (layers, hidden units, heads, tokens). ``hidden_dropout`` and
    ``attention_dropout`` are probabilities (Megatron's defaults 0.1; Llama-family 0.0); a
    dropout of 0 stores no mask. ``position_embedding_type`` is ``learned_absolute`` (GPT,
    an s×h table on the first stage) or ``rope`` (no parameters).
    """

    name: str = "custom"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    swiglu: bool = False
    untie_embeddings_and_output_weights: bool = False
    normalization: str = "LayerNorm"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    position_embedding_type: str = "learned_absolute"
    add_bias_linear: bool = True

    @property
    def kv_channels(self) -> int:
        """Head dimension ``h / a`` (Megatron's default ``--kv-channels``)."""
        return self.hidden_size // self.num_attention_heads

    def with_seq_length(self, seq_length: int) -> "ModelSpec":
        return dataclasses.replace(self, seq_length=v.int_in_range("seq_length", seq_length))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


MODEL_KEYS_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size",
                       "seq_length")
MODEL_KEYS_OPTIONAL = ("name", "num_query_groups", "ffn_hidden_size", "swiglu",
                       "untie_embeddings_and_output_weights", "normalization",
                       "hidden_dropout", "attention_dropout", "position_embedding_type",
                       "add_bias_linear")
MODEL_KEYS = MODEL_KEYS_REQUIRED + MODEL_KEYS_OPTIONAL


def make_model(**kw: Any) -> ModelSpec:
    """Build a validated :class:`ModelSpec` from Megatron-named keyword arguments.

    Raises :class:`InputError` naming the field for a non-positive size, heads that do not
    divide the hidden size, query groups that do not divide the heads, or an unknown
    normalization.
    """
    v.exact_keys("model", kw, MODEL_KEYS_REQUIRED, MODEL_KEYS_OPTIONAL)
    n = {k: v.int_in_range(k, kw[k]) for k in MODEL_KEYS_REQUIRED}
    heads, hidden = n["num_attention_heads"], n["hidden_size"]
    if hidden % heads:
        raise InputError("num_attention_heads", heads,
                         f"must divide hidden_size ({hidden}) to give the head dimension")
    groups = v.int_in_range("num_query_groups", kw.get("num_query_groups", heads))
    if heads % groups:
        raise InputError("num_query_groups", groups,
                         f"must divide num_attention_heads ({heads})")
    swiglu = v.boolean("swiglu", kw.get("swiglu", False))
    ffn_default = swiglu_ffn_hidden_size(hidden) if swiglu else 4 * hidden
    ffn = v.int_in_range("ffn_hidden_size", kw.get("ffn_hidden_size", ffn_default))
    untie = v.boolean("untie_embeddings_and_output_weights",
                      kw.get("untie_embeddings_and_output_weights", False))
    norm = v.choice("normalization", kw.get("normalization", "LayerNorm"),
                    ("LayerNorm", "RMSNorm"))
    drops = {}
    for key in ("hidden_dropout", "attention_dropout"):
        val = kw.get(key, 0.1)
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val < 1:
            raise InputError(key, val, "must be a probability in [0, 1)")
        drops[key] = float(val)
    pos = v.choice("position_embedding_type", kw.get("position_embedding_type",
                                                      "learned_absolute"),
                   ("learned_absolute", "rope", "none"))
    bias = v.boolean("add_bias_linear", kw.get("add_bias_linear", True))
    name = v.display_name("name", kw.get("name", "custom"))
    return ModelSpec(name=name, num_query_groups=groups, ffn_hidden_size=ffn, swiglu=swiglu,
                     untie_embeddings_and_output_weights=untie, normalization=norm,
                     position_embedding_type=pos, add_bias_linear=bias, **drops, **n)


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 2048) -> ModelSpec:
    # GPT-3 style: 4h GELU MLP, LayerNorm, tied embeddings, learned positions, vocab 51200
    # (the vocabulary SC'21 Table 1 and Korthikanti et al. Table 3 use).
    return make_model(name=name, num_layers=layers, hidden_size=hidden,
                      num_attention_heads=heads, vocab_size=51200, seq_length=seq)


def _llama(name, layers, hidden, heads, groups, ffn, vocab, seq) -> ModelSpec:
    # Llama family: SwiGLU, RMSNorm, RoPE, untied output layer, no biases, no dropout
    # (Touvron et al. 2023, Llama 2 Table 1; Meta Llama 3 / 3.1 model cards).
    return make_model(name=name, num_layers=layers, hidden_size=hidden,
                      num_attention_heads=heads, num_query_groups=groups, ffn_hidden_size=ffn,
                      vocab_size=vocab, seq_length=seq, swiglu=True,
                      untie_embeddings_and_output_weights=True, normalization="RMSNorm",
                      hidden_dropout=0.0, attention_dropout=0.0, position_embedding_type="rope",
                      add_bias_linear=False)


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
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
]}


def from_hf_config(cfg: Mapping[str, Any], name: str = "hf-model") -> ModelSpec:
    """Map a Hugging Face ``config.json`` (Llama, Mistral, Qwen2, GPT-2) to a ModelSpec.

    Llama-style fields: ``num_hidden_layers, hidden_size, num_attention_heads,
    num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings,
    tie_word_embeddings``; GPT-2 fields: ``n_layer, n_embd, n_head, n_inner, n_positions``.
    Raises :class:`InputError` naming the missing field.
    """
    def need(*keys):
        for k in keys:
            if k in cfg and cfg[k] is not None:
                return cfg[k]
        raise InputError(f"config.json.{keys[0]}", None, "missing required key")

    mtype = cfg.get("model_type", "")
    if mtype == "gpt2" or "n_embd" in cfg:
        hidden = v.int_in_range("config.json.n_embd", need("n_embd"), key="hidden_size")
        return make_model(
            name=name, num_layers=need("n_layer"), hidden_size=hidden,
            num_attention_heads=need("n_head"),
            ffn_hidden_size=cfg.get("n_inner") or 4 * hidden, vocab_size=need("vocab_size"),
            seq_length=need("n_positions", "n_ctx"),
            hidden_dropout=cfg.get("resid_pdrop", 0.1),
            attention_dropout=cfg.get("attn_pdrop", 0.1))
    heads = need("num_attention_heads")
    act = cfg.get("hidden_act", "silu")
    flag = {k: v.boolean(f"config.json.{k}", cfg.get(k, False) or False)
            for k in ("tie_word_embeddings", "attention_bias", "mlp_bias")}
    return make_model(
        name=name, num_layers=need("num_hidden_layers"), hidden_size=need("hidden_size"),
        num_attention_heads=heads,
        num_query_groups=cfg.get("num_key_value_heads") or heads,
        ffn_hidden_size=need("intermediate_size"), vocab_size=need("vocab_size"),
        seq_length=need("max_position_embeddings"),
        swiglu=act in ("silu", "swiglu"),
        untie_embeddings_and_output_weights=not flag["tie_word_embeddings"],
        normalization="RMSNorm" if "rms_norm_eps" in cfg else "LayerNorm",
        add_bias_linear=flag["attention_bias"] or flag["mlp_bias"],
        hidden_dropout=cfg.get("hidden_dropout", 0.0) or 0.0,
        attention_dropout=cfg.get("attention_dropout", 0.0) or 0.0,
        position_embedding_type="rope" if "rope_theta" in cfg or mtype in (
            "llama", "mistral", "qwen2", "qwen3") else "learned_absolute")


def load_model(ref: str) -> ModelSpec:
    """Resolve ``ref``: a preset name, a Megatron-keyed YAML/JSON file, or an HF config.json.

    A JSON file with ``model_type`` or ``num_hidden_layers``/``n_layer`` is read as a Hugging
    Face config; any other file must hold exactly :data:`MODEL_KEYS`.
    Raises :class:`InputError` (field ``model``) for an unknown preset or unreadable file.
    """
    if ref in MODEL_PRESETS:
        return MODEL_PRESETS[ref]
    if not os.path.exists(ref):
        raise InputError("model", ref, "not a preset name ("
                         + ", ".join(MODEL_PRESETS) + ") nor an existing file")
    data = v.load_mapping_file("model", ref)
    if any(k in data for k in ("model_type", "num_hidden_layers", "n_layer")):
        base = os.path.basename(os.path.dirname(os.path.abspath(ref)))
        # the folder's name, made displayable: printable characters, at most 64
        base = "".join(c for c in base if c.isprintable())[:64] or "hf-model"
        return from_hf_config(data, name=base)
    return make_model(**dict(data))
