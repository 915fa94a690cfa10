"""The model presets (:data:`MODEL_PRESETS`) and :func:`load_model`, which resolves a model
reference: a preset name, a YAML/JSON file with exactly the keys of
:data:`~configurator.core.model.MODEL_KEYS`, a local Hugging Face ``config.json``
(:func:`~configurator.core.hf_import.from_hf_config`), or a Hugging Face model id whose
``config.json`` :mod:`configurator.core.hf_hub` fetches.
"""

from __future__ import annotations

import os
from typing import Any

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.hf_hub import hub_config_path, looks_like_hub_id
from configurator.core.hf_import import from_hf_config
from configurator.core.model import ModelSpec, make_model


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


#: What Llama 4 Scout and Maverick share (their text_config's dimensions).
_LLAMA4 = dict(num_layers=48, hidden_size=5120, num_attention_heads=40, num_query_groups=8,
               kv_channels=128, ffn_hidden_size=16384, vocab_size=202048, rotary_base=500000,
               moe_router_topk=1, moe_ffn_hidden_size=8192,
               moe_shared_expert_intermediate_size=8192, seq_length=8192,
               attention_chunk_size=8192)


#: Mixture-of-experts presets at Megatron-Bridge's pre-training sequence length (4096), from
#: each model's Hugging Face config.json (tests/data/hf_configs: Qwen/Qwen3-30B-A3B,
#: Qwen/Qwen3-235B-A22B, mistralai/Mixtral-8x7B-v0.1, deepseek-ai/DeepSeek-V3,
#: openai/gpt-oss-120b, meta-llama/Llama-4-Scout-17B-16E, meta-llama/Llama-4-Maverick-17B-128E;
#: Llama 4 and Grok-1 at their own lengths, below). Mixtral 8x22B as the Megatron MoE Model
#: Zoo benchmarks it (yanring/Megatron-MoE-ModelZoo
#: model_configs/benchmarking/Mixtral-8x22B.yaml at 31942f0: 56 layers, hidden 6144, FFN
#: 16384, 48 heads in 8 query groups, 8 experts top-2), with mistralai/Mixtral-8x22B-v0.1's
#: vocabulary and RoPE base. The routers' balancing, which no config.json states:
#: Qwen3's global-batch loss (Qiu et al., ACL 2025, "Global-batch LBL is also used in
#: Qwen3-MoEs"), DeepSeek-V3's sequence-wise loss beside the expert bias of its
#: auxiliary-loss-free balancing and GPT-OSS's none (Megatron-Bridge's model bridges,
#: deepseek_v3_bridge.py and gpt_oss_bridge.py); Megatron's default per-micro-batch loss for
#: the others.
_MOE_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": dict(num_layers=48, hidden_size=2048, num_attention_heads=32,
                          num_query_groups=4, kv_channels=128, ffn_hidden_size=6144,
                          vocab_size=151936, rotary_base=1000000, norm_epsilon=1e-6,
                          qk_layernorm=True, num_experts=128, moe_router_topk=8,
                          moe_ffn_hidden_size=768,
                          moe_router_load_balancing_type="global_aux_loss"),
    "qwen3-235b-a22b": dict(num_layers=94, hidden_size=4096, num_attention_heads=64,
                            num_query_groups=4, kv_channels=128, ffn_hidden_size=12288,
                            vocab_size=151936, rotary_base=1000000, norm_epsilon=1e-6,
                            qk_layernorm=True, num_experts=128, moe_router_topk=8,
                            moe_ffn_hidden_size=1536,
                            moe_router_load_balancing_type="global_aux_loss"),
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
                        qk_pos_emb_head_dim=64, v_head_dim=128, mtp_num_layers=1,
                        moe_router_load_balancing_type="seq_aux_loss",
                        moe_router_enable_expert_bias=True),
    "gpt-oss-120b": dict(num_layers=36, hidden_size=2880, num_attention_heads=64,
                         num_query_groups=8, kv_channels=64, ffn_hidden_size=2880,
                         vocab_size=201088, rotary_base=150000, add_bias_linear=True,
                         num_experts=128, moe_router_topk=4, window_size=128,
                         window_attn_skip_freq=2, activation_func_clamp_value=7.0,
                         yarn_rotary_scaling_factor=32.0, moe_router_load_balancing_type="none"),
    # Llama 4's language models (meta-llama/Llama-4-Scout-17B-16E and -Maverick-17B-128E
    # text_config: a shared expert beside the routed ones, the dense layers' MLP of
    # intermediate_size_mlp, chunked attention over 8192 tokens) at Megatron-Bridge's
    # Llama 4 pre-training length, 8192 (recipes/llama/llama4_e16.py and llama4_e128.py,
    # GPTDatasetConfig sequence_length), one chunk; Maverick's MoE on every other layer
    "llama4-scout": dict(_LLAMA4, num_experts=16),
    "llama4-maverick": dict(_LLAMA4, num_experts=128, moe_layer_freq=[0, 1] * 24),
    "mixtral-8x22b": dict(num_layers=56, hidden_size=6144, num_attention_heads=48,
                          num_query_groups=8, ffn_hidden_size=16384, vocab_size=32000,
                          rotary_base=1000000, num_experts=8, moe_router_topk=2),
    # Grok-1 (xai-org/grok-1 run.py and model.py, Apache-2.0): 64 layers, hidden 48 x 128,
    # 48 query heads in 8 groups, vocabulary 128 x 1024, 8 experts top-2 of
    # ffn_size(6144, widening 8) = 8 * 6144 * 2 // 3 = 32768, RMSNorm, RoPE of base 10^4,
    # no biases, the embedding tied to the output ("here, we use tied weights"), sequence
    # 8192. Its experts are gated GELU (gelu(x W) * x V), whose GEMMs are SwiGLU's; the two
    # extra RMSNorms after attention and after the experts are left out (2 x 6144 weights
    # and two elementwise passes per layer).
    "grok-1": dict(num_layers=64, hidden_size=6144, num_attention_heads=48,
                   num_query_groups=8, kv_channels=128, ffn_hidden_size=32768,
                   vocab_size=131072, rotary_base=10000, num_experts=8, moe_router_topk=2,
                   untie_embeddings_and_output_weights=False, seq_length=8192),
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


def load_model(ref: str) -> ModelSpec:
    """Resolve ``ref``: a preset name (any case), a Megatron-keyed YAML/JSON file, an HF
    config.json, or a Hugging Face model id (``owner/name``).

    In that order: a preset wins, then an existing path; a reference of the shape
    ``owner/name`` that is neither is a model id, whose ``config.json`` comes from the Hugging
    Face cache or the Hub (:func:`~configurator.core.hf_hub.hub_config_path`) and names the
    model ``owner/name``.

    A JSON file with ``model_type`` or ``num_hidden_layers``/``n_layer`` is read as a Hugging
    Face config, named after its folder (``…/NAME/config.json``) or its file name; any other
    file must hold exactly :data:`~configurator.core.model.MODEL_KEYS`.
    Raises :class:`InputError` (field ``model``) for an unknown preset or unreadable file.
    """
    preset = v.preset_name(ref, MODEL_PRESETS)
    if preset is not None:
        return MODEL_PRESETS[preset]
    if not os.path.exists(ref) and looks_like_hub_id(ref):
        data = v.load_mapping_file("model", hub_config_path(ref))
        return from_hf_config(data, name=ref)
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
