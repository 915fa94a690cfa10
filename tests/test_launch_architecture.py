"""Every architecture flag the launch script passes against the parameter count, both ways.

(a) flags → parameters: megatron-core 0.16.1's ``GPTModel`` (local layer spec, CPU) is built
    from a ``TransformerConfig`` (``MLATransformerConfig`` with ``--multi-latent-attention``)
    read from the rendered Megatron flags alone, the way ``pretrain_gpt.py`` would read them
    (megatron/training/arguments.py ``validate_args`` and ``core_transformer_config_from_args``,
    Megatron-LM's gpt_builders.py ``gpt_builder`` with ``--transformer-impl local``;
    vocabulary: NullTokenizer's ``--vocab-size + 1`` padded to a multiple of ``128·tp``,
    megatron/training/tokenizer ``_vocab_size_with_padding``). Its parameters must equal
    ``memory_model.params``: ``total_parameters`` without the multi-token-prediction (MTP)
    modules (as model cards count), everything one pp = 1 stage holds
    (``stage_parameter_split``) with them, each decoder layer the dense or MoE layer count of
    its kind, and the MTP block ``mtp_parameters``.
(b) parameters → flags: changing any ModelSpec field alone, in a way that changes the
    parameter count, must change the emitted flags (no field the count uses is dropped), and
    the flags must carry every field's value back (``architecture_from_flags``).

(b) needs nothing but the configurator; (a) skips when megatron-core cannot be imported.
The whole model is built on one rank (tp = pp = ep = 1): the total count does not depend on
the split, only the vocabulary padding reads ``--tensor-model-parallel-size``.

Known disagreements between the configurator and Megatron are listed in :data:`KNOWN_BUGS`;
the cases they hit are strict xfails (they fail loudly once the bug is fixed, so the entry
can go).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest

from configurator.core.errors import InputError
from configurator.core.model import ModelSpec, make_model
from configurator.core.plan import FLAG_GROUPS, PLAN_FIELDS, ParallelPlan
from launchers.megatron_flags import FLAG_TABLE, flag_argv, megatron_flags
from memory_model.params import (dense_layer_parameters, moe_layer_parameters,
                                 mtp_parameters, stage_parameter_split, total_parameters)
from tests.megatron_argv import megatron_arguments_preamble, parse_argv

PLAN = ParallelPlan(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1)
PLAN_TP2 = ParallelPlan(tp=2, pp=1, dp=1, micro_batch_size=1, global_batch_size=1)

_TINY = dict(num_layers=2, hidden_size=128, num_attention_heads=8, vocab_size=1000,
             seq_length=64)
_LLAMA = dict(_TINY, swiglu=True, normalization="RMSNorm", add_bias_linear=False,
              position_embedding_type="rope", untie_embeddings_and_output_weights=True,
              hidden_dropout=0.0, attention_dropout=0.0)
#: Qwen3-MoE-like: 4 experts of 96, top-2, every layer MoE (moe_layer_freq 1).
_MOE = dict(_LLAMA, num_query_groups=2, ffn_hidden_size=352, num_experts=4,
            moe_router_topk=2, moe_ffn_hidden_size=96)
#: DeepSeek-V3-like attention (query compression, latent norms through qk_layernorm as
#: Megatron-Bridge's DeepSeek recipes set it); no GQA (validate_args forbids it with MLA).
_MLA = dict(_LLAMA, multi_latent_attention=True, q_lora_rank=48, kv_lora_rank=32,
            qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16, qk_layernorm=True)

#: name -> (ModelSpec keyword arguments, plan). Together: LayerNorm and RMSNorm, GeLU and
#: SwiGLU, with and without linear biases (either norm), MHA and GQA, tied and untied
#: embeddings, learned_absolute, rope and no positions, default and explicit FFN sizes, a
#: tp = 2 plan whose vocabulary pads to 256 (1100 → 1280, where tp = 1 gives 1152); a head
#: dimension other than h/a, QKV biases alone, QK layernorm, RoPE base, norm epsilon and
#: sliding windows; MoE (4 experts, top-2) with and without a shared expert, every layer or
#: a mixed moe_layer_freq (list, and int 2); multi-latent attention with and without query
#: compression and latent norms, dense and MoE; MTP after a dense, an MoE and an MLA layer.
VARIANTS: dict[str, tuple[dict, ParallelPlan]] = {
    "gpt": (dict(_TINY), PLAN),
    "gpt-no-bias": (dict(_TINY, add_bias_linear=False), PLAN),
    "gpt-gqa": (dict(_TINY, num_query_groups=2), PLAN),
    "gpt-rope-untied": (dict(_TINY, position_embedding_type="rope",
                             untie_embeddings_and_output_weights=True), PLAN),
    "gpt-no-positions": (dict(_TINY, hidden_size=64, num_attention_heads=4,
                              position_embedding_type="none"), PLAN),
    "gpt-tp2-vocab1100": (dict(_TINY, vocab_size=1100, ffn_hidden_size=320), PLAN_TP2),
    "gpt-window": (dict(_TINY, window_size=16, window_attn_skip_freq=2, norm_epsilon=1e-6),
                   PLAN),
    "llama": (dict(_LLAMA), PLAN),
    "llama-gqa": (dict(_LLAMA, num_query_groups=2), PLAN),
    "llama-gqa-tied": (dict(_LLAMA, num_query_groups=4,
                            untie_embeddings_and_output_weights=False), PLAN),
    "llama-with-bias": (dict(_LLAMA, add_bias_linear=True), PLAN),
    "llama-qwen-attention": (dict(_LLAMA, num_query_groups=2, kv_channels=32,
                                  add_qkv_bias=True, qk_layernorm=True, rotary_base=1000000,
                                  norm_epsilon=1e-6), PLAN),
    "llama-mtp2": (dict(_LLAMA, num_query_groups=2, mtp_num_layers=2), PLAN),
    "swiglu-layernorm-learned": (dict(_TINY, swiglu=True, add_bias_linear=False,
                                      ffn_hidden_size=192), PLAN_TP2),
    "gelu-rmsnorm-bias": (dict(_TINY, normalization="RMSNorm", num_query_groups=4), PLAN),
    "moe-top2": (dict(_MOE), PLAN),
    "moe-top2-shared": (dict(_MOE, moe_shared_expert_intermediate_size=128), PLAN),
    "moe-mixed-list": (dict(_MOE, num_layers=4, moe_layer_freq=[0, 1, 1, 0]), PLAN),
    "moe-mixed-list-shared": (dict(_MOE, num_layers=4, moe_layer_freq=[0, 1, 0, 1],
                                   moe_shared_expert_intermediate_size=128), PLAN),
    "moe-freq2": (dict(_MOE, num_layers=3, moe_layer_freq=2), PLAN),
    "moe-qwen3-like": (dict(_MOE, kv_channels=32, qk_layernorm=True, rotary_base=1000000,
                            norm_epsilon=1e-6, moe_layer_freq=[0, 1], vocab_size=1100),
                       PLAN_TP2),
    "moe-gpt-oss-like": (dict(_MOE, add_bias_linear=True, kv_channels=32, window_size=16,
                              window_attn_skip_freq=2, moe_router_topk=4), PLAN),
    "moe-mtp": (dict(_MOE, moe_layer_freq=[0, 1], mtp_num_layers=1,
                     moe_shared_expert_intermediate_size=64), PLAN),
    "moe-mtp-after-dense": (dict(_MOE, moe_layer_freq=[1, 0], mtp_num_layers=1), PLAN),
    "mla": (dict(_MLA), PLAN),
    "mla-no-q-lora-no-norms": (dict(_MLA, q_lora_rank=None, qk_layernorm=False), PLAN),
    "mla-layernorm-bias-learned": (dict(_TINY, multi_latent_attention=True, q_lora_rank=48,
                                        kv_lora_rank=32, qk_head_dim=16,
                                        qk_pos_emb_head_dim=8, v_head_dim=16,
                                        qk_layernorm=True, rotary_base=500000), PLAN),
    "mla-moe-mtp": (dict(_MLA, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=96,
                         moe_shared_expert_intermediate_size=128, moe_layer_freq=[0, 1],
                         mtp_num_layers=1, norm_epsilon=1e-6), PLAN),
}


def _spec(name: str, kw: dict) -> ModelSpec:
    return make_model(name=name, **kw)


def padded_vocab(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron's ``_vocab_size_with_padding``: up to a multiple of ``divisible_by * tp``."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


def moe_freq_type(x: str) -> int | list:
    """megatron/training/arguments.py ``moe_freq_type``: an int, or a list expression of
    digits, ``[ ] ( ) , + *`` only (``_eval_pattern``)."""
    if "[" not in x:
        return int(x)
    if re.search(r"[^,\d\[\]\(\)\+\*]", x):
        raise ValueError(f"Invalid pattern: {x}")
    return eval(x)  # noqa: S307  (what Megatron does, on the checked characters only)


def tuple_type(x: str) -> tuple[int, ...]:
    """megatron/training/arguments.py ``tuple_type``: ``"(a,b)"`` -> ``(a, b)``."""
    return tuple(int(i) for i in x.strip("()").split(","))


def architecture_from_flags(argv: list[str]) -> dict:
    """What pretrain_gpt.py builds from ``argv`` (the model-defining arguments only).

    Returns ``config`` (TransformerConfig / MLATransformerConfig keyword arguments, as
    ``core_transformer_config_from_args`` passes them after ``validate_args``),
    ``config_class`` (``"MLATransformerConfig"`` with ``--multi-latent-attention``),
    ``model`` (GPTModel keyword arguments apart from config and the specs),
    ``normalization``, ``tp`` and ``swiglu``. Asserts the ``validate_args`` rules on model
    arguments that make pretrain_gpt.py refuse the flags.
    """
    a = parse_argv(argv)
    assert a["--tokenizer-type"] == "NullTokenizer"
    tp = int(a["--tensor-model-parallel-size"])
    hidden, heads = int(a["--hidden-size"]), int(a["--num-attention-heads"])
    swiglu = "--swiglu" in a
    # core_transformer_config_from_args: --swiglu and --quick-geglu each make the MLP gated
    # (SiLU and quick-GELU); asserts they are not both given
    assert not (swiglu and "--quick-geglu" in a), "core_transformer_config_from_args"
    gated = swiglu or "--quick-geglu" in a
    mla = "--multi-latent-attention" in a
    gqa = "--group-query-attention" in a
    pos_type = a["--position-embedding-type"]
    # validate_args: kv_channels defaults to h / heads (asserting divisibility)
    if "--kv-channels" in a:
        kv_channels = int(a["--kv-channels"])
    else:
        assert hidden % heads == 0, "validate_args: hidden_size % num_attention_heads"
        kv_channels = hidden // heads
    # validate_args: "Group query attention is mutually exclusive with multi latent attention."
    assert not (mla and gqa), "validate_args: --group-query-attention with --multi-latent-attention"
    mtp = int(a["--mtp-num-layers"]) if "--mtp-num-layers" in a else None
    if mtp:   # validate_args: MTP "is not supported with learned_absolute position embedding"
        assert pos_type in ("rope", "none"), f"validate_args: MTP with {pos_type} positions"
    add_bias = "--disable-bias-linear" not in a
    # --num-experts 0 means None; moe_ffn_hidden_size defaults to ffn_hidden_size
    experts = int(a.get("--num-experts", 0)) or None
    ffn = int(a["--ffn-hidden-size"])
    moe_ffn = int(a["--moe-ffn-hidden-size"]) if "--moe-ffn-hidden-size" in a else None
    if experts is not None and moe_ffn is None:
        moe_ffn = ffn
    shared = a.get("--moe-shared-expert-intermediate-size")
    rotary_base = int(a.get("--rotary-base", 10000))
    config = dict(
        num_layers=int(a["--num-layers"]), hidden_size=hidden, ffn_hidden_size=ffn,
        num_attention_heads=heads, kv_channels=kv_channels,
        # core_transformer_config_from_args: None (TransformerConfig: = heads) unless GQA
        num_query_groups=int(a["--num-query-groups"]) if gqa else None,
        add_bias_linear=add_bias,
        # validate_args: "Keep the 'add bias' args in sync": add_bias_linear sets add_qkv_bias
        add_qkv_bias="--add-qkv-bias" in a or add_bias,
        qk_layernorm="--qk-layernorm" in a,
        gated_linear_unit=gated, normalization=a["--normalization"],
        layernorm_epsilon=float(a.get("--norm-epsilon", 1e-5)),
        hidden_dropout=float(a["--hidden-dropout"]),
        attention_dropout=float(a["--attention-dropout"]),
        num_moe_experts=experts,
        moe_router_topk=int(a.get("--moe-router-topk", 2)),
        moe_router_pre_softmax="--moe-router-pre-softmax" in a,
        moe_router_load_balancing_type=a.get("--moe-router-load-balancing-type", "aux_loss"),
        moe_router_enable_expert_bias="--moe-router-enable-expert-bias" in a,
        moe_router_score_function=a.get("--moe-router-score-function", "softmax"),
        moe_ffn_hidden_size=moe_ffn,
        moe_shared_expert_intermediate_size=None if shared is None else int(shared),
        moe_layer_freq=moe_freq_type(a.get("--moe-layer-freq", "1")),
        moe_token_dispatcher_type=a.get("--moe-token-dispatcher-type", "allgather"),
        moe_grouped_gemm="--moe-grouped-gemm" in a,
        mtp_num_layers=mtp,
        window_size=tuple_type(a["--window-size"]) if "--window-size" in a else None,
        window_attn_skip_freq=(moe_freq_type(a["--window-attn-skip-freq"])
                               if "--window-attn-skip-freq" in a else None),
        activation_func_clamp_value=(float(a["--activation-func-clamp-value"])
                                     if "--activation-func-clamp-value" in a else None),
        glu_linear_offset=float(a.get("--glu-linear-offset", 0.0)),
        use_cpu_initialization=True)
    if mla:   # MLATransformerConfig; the mla argument group's defaults (not the config's)
        config.update(
            multi_latent_attention=True,
            q_lora_rank=int(a["--q-lora-rank"]) if "--q-lora-rank" in a else None,
            kv_lora_rank=int(a.get("--kv-lora-rank", 32)),
            qk_head_dim=int(a.get("--qk-head-dim", 128)),
            qk_pos_emb_head_dim=int(a.get("--qk-pos-emb-head-dim", 64)),
            v_head_dim=int(a.get("--v-head-dim", 128)),
            # MLA's own rotary embedding reads the config (args.rotary_base is copied
            # because MLATransformerConfig has the field); rope_type None is popped
            rotary_base=rotary_base, rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0)
    # NullTokenizer has vocab_size + 1 tokens (its EOD), padded to a multiple of 128·tp.
    vocab = padded_vocab(int(a["--vocab-size"]) + 1, tp)
    model = dict(vocab_size=vocab, max_sequence_length=int(a["--max-position-embeddings"]),
                 position_embedding_type=pos_type, rotary_base=rotary_base,
                 share_embeddings_and_output_weights=(
                     "--untie-embeddings-and-output-weights" not in a))
    return dict(config=config, model=model, normalization=a["--normalization"], tp=tp,
                swiglu=swiglu, quick_geglu="--quick-geglu" in a,
                config_class="MLATransformerConfig" if mla else "TransformerConfig")


# -- known disagreements between the configurator and Megatron ------------------------------

#: (tests it breaks, predicate on the ModelSpec, what goes wrong): "flags" is
#: test_flags_carry_every_field (validate_args refuses the flags, or a value is lost), "build"
#: the two GPTModel tests (Megatron refuses to build, or builds other parameters than
#: memory_model/params.py counts). The cases an entry matches are strict xfails there: remove
#: the entry when its bug is fixed.
FLAGS, BUILD, FLAGS_BUILD = {"flags"}, {"build"}, {"flags", "build"}
KNOWN_BUGS: list[tuple] = []


def known_bug(spec: ModelSpec, test: str) -> str | None:
    """The reasons of the :data:`KNOWN_BUGS` entries breaking ``test`` that ``spec`` hits."""
    hits = [why for tests, pred, why in KNOWN_BUGS if test in tests and pred(spec)]
    return "; ".join(hits) or None


def _xfail_known(request, spec: ModelSpec, test: str) -> None:
    why = known_bug(spec, test)
    if why:
        request.applymarker(pytest.mark.xfail(reason=why, strict=True))


# -- (b) parameters -> flags ----------------------------------------------------------------

#: Other legal values of every ModelSpec field (apart from ``name``), tried one at a time on
#: every base where the field means something (:data:`NEEDS`).
ALTERNATIVES: dict[str, tuple] = {
    "num_layers": (3, 4),
    "hidden_size": (192, 256),
    "num_attention_heads": (4, 2),
    "num_query_groups": (1, 4, 8),
    "ffn_hidden_size": (384, 320),
    "vocab_size": (1100, 2000, 1001),
    "seq_length": (128, 32),
    "kv_channels": (32, 8),
    "swiglu": (True, False),
    "untie_embeddings_and_output_weights": (True, False),
    "normalization": ("LayerNorm", "RMSNorm"),
    "norm_epsilon": (1e-6,),
    "hidden_dropout": (0.0, 0.2),
    "attention_dropout": (0.0, 0.2),
    "position_embedding_type": ("learned_absolute", "rope", "none"),
    "rotary_base": (500000,),
    "add_bias_linear": (True, False),
    "add_qkv_bias": (True, False),
    "qk_layernorm": (True, False),
    "num_experts": (2, 4, 8),
    "moe_router_topk": (1, 3),
    "moe_ffn_hidden_size": (64, 192),
    "moe_shared_expert_intermediate_size": (128, 256),
    "moe_layer_freq": (1, 2, (0, 1), (1, 0)),
    "moe_router_load_balancing_type": ("global_aux_loss", "seq_aux_loss", "none"),
    "moe_router_enable_expert_bias": (True, False),
    "multi_latent_attention": (True, False),
    "q_lora_rank": (None, 32, 64),
    "kv_lora_rank": (16, 64),
    "qk_head_dim": (8, 32),
    "qk_pos_emb_head_dim": (4, 16),
    "v_head_dim": (8, 32),
    "mtp_num_layers": (None, 1, 2),
    "window_size": (None, 8, 32),
    "window_attn_skip_freq": (2,),
    "activation_func_clamp_value": (7.0,),
    "yarn_rotary_scaling_factor": (32.0,),
}

#: Fields make_model accepts only when the base has the named field set (MoE fields need
#: experts, MLA fields multi-latent attention, the skip frequency a window).
NEEDS = {**{f: "num_experts" for f in ("moe_router_topk", "moe_ffn_hidden_size",
                                       "moe_shared_expert_intermediate_size",
                                       "moe_layer_freq", "moe_router_load_balancing_type",
                                       "moe_router_enable_expert_bias")},
         **{f: "multi_latent_attention" for f in ("q_lora_rank", "kv_lora_rank", "qk_head_dim",
                                                  "qk_pos_emb_head_dim", "v_head_dim")},
         "window_attn_skip_freq": "window_size", "activation_func_clamp_value": "swiglu"}

#: Fields make_model derives when they are not given (kv_channels = h/a, groups = heads,
#: moe_ffn_hidden_size = ffn_hidden_size): a one-field change may move them too.
DERIVED = {"kv_channels", "num_query_groups", "moe_ffn_hidden_size"}

#: The fields that change the parameter count (memory_model/params.py; MTP included).
COUNT_FIELDS = {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_query_groups", "vocab_size", "swiglu",
                "untie_embeddings_and_output_weights", "normalization",
                "position_embedding_type", "add_bias_linear", "kv_channels", "add_qkv_bias",
                "qk_layernorm", "num_experts", "moe_ffn_hidden_size",
                "moe_shared_expert_intermediate_size", "moe_layer_freq",
                "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers"}

#: Bases for the one-field changes: GPT-style and Llama-style, both with groups (2) that
#: divide every alternative head count, and explicit FFN sizes (kept when hidden changes);
#: an MoE one (Llama-style, 4 experts top-2, every layer MoE, a sliding window, no GQA so
#: that multi_latent_attention may be switched on) and an MLA one (Llama-style, query
#: compression, latent norms, no GQA).
BASES = {"gpt": dict(_TINY, num_query_groups=2, ffn_hidden_size=512),
         "llama": dict(_LLAMA, num_query_groups=2, ffn_hidden_size=352),
         "moe": dict(_LLAMA, ffn_hidden_size=352, num_experts=4, moe_router_topk=2,
                     moe_ffn_hidden_size=96, window_size=16),
         "mla": dict(_MLA, ffn_hidden_size=352)}


def _refusal_expected(kw: dict, base: ModelSpec, field: str, val) -> bool:
    """make_model must refuse a field whose prerequisite the base lacks, and switching a
    prerequisite off while the base gives fields that need it; it may refuse a change that
    Megatron refuses (:func:`megatron_refuses`)."""
    if field in NEEDS and not getattr(base, NEEDS[field]):
        return True
    if field == "yarn_rotary_scaling_factor" and (base.position_embedding_type != "rope"
                                                  or base.multi_latent_attention):
        return True
    if val in (None, False) and any(NEEDS.get(k) == field for k in kw):
        return True
    return megatron_refuses({**kw, field: val})


def megatron_refuses(kw: dict) -> bool:
    """Model fields Megatron refuses together, which make_model refuses too: MLA with query
    groups (validate_args), MTP with learned positions (validate_args), a shared expert
    with linear biases (SharedExpertMLP)."""
    heads = kw["num_attention_heads"]
    return bool(
        (kw.get("multi_latent_attention") and kw.get("num_query_groups", heads) != heads)
        or (kw.get("mtp_num_layers")
            and kw.get("position_embedding_type", "learned_absolute") == "learned_absolute")
        or (kw.get("num_experts") and kw.get("moe_shared_expert_intermediate_size")
            and kw.get("add_bias_linear", True)))


def one_field_changes():
    """``(changes, refusals)``: (base name, field, value, base spec, changed spec) for every
    change make_model accepts; (base name, field, value, error) for those it refuses."""
    out, refused = [], []
    for base_name, kw in BASES.items():
        base = _spec(base_name, kw)
        for field, values in ALTERNATIVES.items():
            for val in values:
                if getattr(base, field) == val:
                    continue
                try:
                    changed = _spec(base_name, {**kw, field: val})
                except InputError as exc:
                    refused.append((base_name, field, val, str(exc)))
                    continue
                out.append((base_name, field, val, base, changed))
    return out, refused


ONE_FIELD_CHANGES, ONE_FIELD_REFUSALS = one_field_changes()


def test_one_field_changes_are_what_they_say():
    """Each change moves its field alone (and fields make_model derives and the base does not
    give); make_model refuses exactly the changes :func:`_refusal_expected` names; every field
    is changed on some base and every value is tried or is some base's own."""
    for base_name, field, val, base, changed in ONE_FIELD_CHANGES:
        kw = BASES[base_name]
        assert not _refusal_expected(kw, base, field, val), (base_name, field, val,
                                                              "accepted")
        want = tuple(val) if isinstance(val, list) else val
        assert getattr(changed, field) == want
        moved = {f for f in ALTERNATIVES if getattr(changed, f) != getattr(base, f)}
        assert field in moved and moved - {field} <= DERIVED - set(kw), (
            base_name, field, val, moved)
    for base_name, field, val, err in ONE_FIELD_REFUSALS:
        kw = BASES[base_name]
        assert _refusal_expected(kw, _spec(base_name, kw), field, val), (
            f"{base_name}: {field}={val!r} refused: {err}")
    tried = {(f, repr(v)) for _b, f, v, _s, _c in ONE_FIELD_CHANGES}
    tried |= {(f, repr(getattr(_spec(b, kw), f))) for b, kw in BASES.items()
              for f in ALTERNATIVES}
    assert {f for _b, f, _v, _s, _c in ONE_FIELD_CHANGES} == set(ALTERNATIVES)
    assert {(f, repr(v)) for f, vals in ALTERNATIVES.items() for v in vals} <= tried




def _argv(model: ModelSpec, plan: ParallelPlan = PLAN) -> list[str]:
    return flag_argv(megatron_flags(model, plan))


def counted_parameters(model: ModelSpec) -> int:
    """Everything one pp = 1 stage holds (MTP included): the count a launch trains."""
    non_expert, expert = stage_parameter_split(model, 1, 1, 0)
    return int(round(float(non_expert + expert)))


def test_alternatives_cover_every_model_field():
    # fields left out of comparison (max_position_embeddings, seq_length_source) say where
    # the length came from; they are not the model
    assert set(ALTERNATIVES) == {f.name for f in dataclasses.fields(ModelSpec)
                                 if f.compare} - {"name"}
    assert COUNT_FIELDS < set(ALTERNATIVES) and set(NEEDS) < set(ALTERNATIVES)


def test_changing_a_counted_field_changes_the_flags():
    changed_count: set[str] = set()
    for base_name, field, val, base, changed in ONE_FIELD_CHANGES:
        if counted_parameters(changed) == counted_parameters(base):
            continue
        changed_count.add(field)
        assert _argv(changed) != _argv(base), (
            f"{base_name}: {field}={val!r} changes the parameter count "
            f"({counted_parameters(base)} -> {counted_parameters(changed)}) but not the flags")
    # every field the count uses was exercised (seq_length counts with learned positions)
    assert changed_count == COUNT_FIELDS | {"seq_length"}, changed_count ^ COUNT_FIELDS


def test_changing_any_field_changes_the_flags():
    """Fields that leave the count alone (dropouts, epsilon, RoPE base, top-k, windows) still
    reach Megatron. Left out only: a RoPE base where nothing applies RoPE, QKV biases
    with the linear biases on (validate_args turns add_qkv_bias on with add_bias_linear), and
    YaRN, which core_v0.16.1's arguments cannot express without multi-latent attention (the
    script's header says so: tests/test_launchers.py)."""
    for base_name, field, val, base, changed in ONE_FIELD_CHANGES:
        if field == "yarn_rotary_scaling_factor":
            continue
        if field == "rotary_base" and base.position_embedding_type != "rope" \
                and not base.multi_latent_attention:
            continue
        if field == "add_qkv_bias" and base.add_bias_linear:
            continue
        assert _argv(changed) != _argv(base), (base_name, field, val)


def _check_fields_round_trip(spec: ModelSpec, plan: ParallelPlan, label: str) -> None:
    arch = architecture_from_flags(_argv(spec, plan))
    c, m = arch["config"], arch["model"]
    got = dict(
        num_layers=c["num_layers"], hidden_size=c["hidden_size"],
        num_attention_heads=c["num_attention_heads"],
        num_query_groups=c["num_query_groups"] or c["num_attention_heads"],
        ffn_hidden_size=c["ffn_hidden_size"], kv_channels=c["kv_channels"],
        vocab_size=m["vocab_size"], seq_length=m["max_sequence_length"],
        swiglu=c["gated_linear_unit"],
        untie_embeddings_and_output_weights=not m["share_embeddings_and_output_weights"],
        normalization=c["normalization"], norm_epsilon=c["layernorm_epsilon"],
        hidden_dropout=c["hidden_dropout"], attention_dropout=c["attention_dropout"],
        position_embedding_type=m["position_embedding_type"], rotary_base=m["rotary_base"],
        add_bias_linear=c["add_bias_linear"], add_qkv_bias=c["add_qkv_bias"],
        qk_layernorm=c["qk_layernorm"], num_experts=c["num_moe_experts"],
        moe_ffn_hidden_size=c["moe_ffn_hidden_size"],
        moe_shared_expert_intermediate_size=c["moe_shared_expert_intermediate_size"],
        mtp_num_layers=c["mtp_num_layers"],
        window_size=c["window_size"][0] if c["window_size"] else None,
        window_attn_skip_freq=c["window_attn_skip_freq"],
        activation_func_clamp_value=c["activation_func_clamp_value"],
        multi_latent_attention=c.get("multi_latent_attention", False))
    want = {k: getattr(spec, k) for k in got}
    want["vocab_size"] = padded_vocab(spec.vocab_size, plan.tp)
    # validate_args turns add_qkv_bias on with the linear biases
    want["add_qkv_bias"] = spec.add_qkv_bias or spec.add_bias_linear
    if spec.position_embedding_type != "rope" and not spec.multi_latent_attention:
        want["rotary_base"] = 10000        # not passed, and nothing reads it
    if spec.is_moe:
        got["moe_router_topk"], want["moe_router_topk"] = c["moe_router_topk"], \
            spec.moe_router_topk
        freq = c["moe_layer_freq"]
        got["moe_layer_freq"] = tuple(freq) if isinstance(freq, list) else tuple(
            int(i % freq == 0) for i in range(c["num_layers"]))
        want["moe_layer_freq"] = spec.moe_layer_pattern
        for k in ("moe_router_load_balancing_type", "moe_router_enable_expert_bias"):
            got[k], want[k] = c[k], getattr(spec, k)
    if spec.multi_latent_attention:
        for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                  "v_head_dim"):
            got[k], want[k] = c[k], getattr(spec, k)
        got["rotary_base"] = c["rotary_base"]
    assert got == want, (label, {k: (got[k], want[k]) for k in got if got[k] != want[k]})


#: (label, spec, plan) of every variant and one-field change.
ALL_CASES = ([(name, _spec(name, kw), plan) for name, (kw, plan) in VARIANTS.items()]
             + [(f"{b}-{f}={v!r}", changed, PLAN) for b, f, v, _s, changed in ONE_FIELD_CHANGES])


@pytest.mark.parametrize("case", ALL_CASES, ids=[c[0] for c in ALL_CASES])
def test_flags_carry_every_field(request, case):
    """flags -> fields: architecture_from_flags gives back each ModelSpec field (the padded
    vocabulary; the MoE / MLA fields where they apply)."""
    label, spec, plan = case
    _xfail_known(request, spec, "flags")
    _check_fields_round_trip(spec, plan, label)


MEGATRON_SRC = os.environ.get("MEGATRON_LM_SRC")


@pytest.mark.skipif(not MEGATRON_SRC, reason="set MEGATRON_LM_SRC to a Megatron-LM "
                    "core_v0.16.x checkout to check architecture_from_flags against its own "
                    "parse_args / validate_args / core_transformer_config_from_args")
def test_architecture_from_flags_matches_megatrons_own_parser(tmp_path):
    """architecture_from_flags against Megatron-LM's own argument code, on every case (one
    subprocess; the setup of tests/test_megatron_flags.py test_megatron_own_validate_args).
    Megatron must refuse exactly the cases a KNOWN_BUGS entry says it refuses before the
    model is built (validate_args, TransformerConfig)."""
    cases = []
    for label, spec, plan in ALL_CASES:
        argv = _argv(spec, plan)
        if spec.position_embedding_type == "rope" or spec.multi_latent_attention:
            argv.append("--no-rope-fusion")      # rope fusion needs Transformer Engine
        cases.append({"label": label, "argv": argv, "world": plan.world_size})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    code = megatron_arguments_preamble(MEGATRON_SRC) + textwrap.dedent(f"""
        out = {{}}
        for case in json.load(open({str(tmp_path / "cases.json")!r})):
            os.environ.update(WORLD_SIZE=str(case["world"]), RANK="0",
                              CUDA_DEVICE_MAX_CONNECTIONS="1")
            sys.argv = ["pretrain_gpt.py"] + case["argv"]
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    args = A.validate_args(A.parse_args())
                    cfg = A.core_transformer_config_from_args(args)
            except (AssertionError, ValueError) as exc:
                out[case["label"]] = {{"error": f"{{type(exc).__name__}}: {{exc}}"}}
                continue
            fields = {{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}}
            fields["class"] = type(cfg).__name__
            fields["args"] = {{k: getattr(args, k) for k in (
                "rotary_base", "max_position_embeddings", "position_embedding_type",
                "untie_embeddings_and_output_weights", "normalization", "swiglu",
                "quick_geglu", "tensor_model_parallel_size")}}
            fields["activation"] = getattr(cfg.activation_func, "__name__", "?")
            out[case["label"]] = json.loads(json.dumps(fields, default=repr))
        print("OK " + json.dumps(out))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    if res.stdout.startswith("SKIP"):
        pytest.skip(res.stdout.strip())
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stderr[-3000:]
    megatron_cfg = json.loads(res.stdout[3:])
    for label, spec, plan in ALL_CASES:
        got = megatron_cfg[label]
        arch = architecture_from_flags_or_refusal(_argv(spec, plan))
        if "error" in got:      # refused before any module is built: a known launch bug
            assert known_bug(spec, "build"), (label, got["error"])
            assert arch is None or "pre-softmax" in got["error"], (label, got["error"])
            continue
        assert arch is not None, (label, "Megatron accepts what architecture_from_flags refuses")
        mine = json.loads(json.dumps(arch["config"], default=repr))
        mine.pop("use_cpu_initialization")
        if mine["num_query_groups"] is None:        # TransformerConfig.__post_init__
            mine["num_query_groups"] = mine["num_attention_heads"]
        theirs = {k: got[k] for k in mine}
        assert theirs == mine, (label, {k: (theirs[k], mine[k]) for k in mine
                                        if theirs[k] != mine[k]})
        assert got["class"] == arch["config_class"], label
        args, model = got["args"], arch["model"]
        assert (args["rotary_base"], args["max_position_embeddings"],
                args["position_embedding_type"], not args["untie_embeddings_and_output_weights"],
                args["normalization"], args["swiglu"], args["quick_geglu"],
                args["tensor_model_parallel_size"]) == (
            model["rotary_base"], model["max_sequence_length"],
            model["position_embedding_type"], model["share_embeddings_and_output_weights"],
            arch["normalization"], arch["swiglu"], arch["quick_geglu"], arch["tp"]), label
        # GPT-OSS's clamped gate is quick-GELU with (up + 1), as Megatron-Bridge builds it
        assert got["activation"] == ("quick_gelu" if spec.activation_func_clamp_value
                                     else "silu" if spec.swiglu else "gelu"), label


def architecture_from_flags_or_refusal(argv: list[str]) -> dict | None:
    """:func:`architecture_from_flags`, or None where it asserts a validate_args rule."""
    try:
        return architecture_from_flags(argv)
    except AssertionError as exc:
        if "validate_args" not in str(exc):
            raise
        return None


def test_bias_flag_follows_add_bias_linear():
    for name, (kw, plan) in VARIANTS.items():
        spec = _spec(name, kw)
        assert ("--disable-bias-linear" in _argv(spec, plan)) == (not spec.add_bias_linear), name


def test_plan_flags_come_from_the_plan_schema():
    plan_rows = [(f.flag_group, flag, f"plan.{f.name}") for f in PLAN_FIELDS for flag, _ in f.flags]
    # rows of one plan field (a row read from several sources, like --ckpt-format from the
    # plan and the checkpoint settings, is the launcher's own)
    table_plan_rows = [(r.group, r.flag, r.source) for r in FLAG_TABLE
                       if r.source.startswith("plan.") and "," not in r.source]
    assert sorted(table_plan_rows) == sorted(plan_rows)
    groups = [r.group for r in FLAG_TABLE]
    assert sorted(set(groups), key=groups.index) == list(FLAG_GROUPS)
    assert groups == sorted(groups, key=FLAG_GROUPS.index)       # each group contiguous


# -- (a) flags -> parameters ----------------------------------------------------------------

@pytest.fixture(scope="module")
def megatron():
    """megatron-core on CPU with model parallelism of 1 over a one-rank gloo group (the
    setup tests/megatron_reference.py uses); torn down after the module.

    Builds as Megatron-LM's ``gpt_builder`` does with ``--transformer-impl local``: MoE
    models from ``get_gpt_decoder_block_spec`` (dense and MoE layers by moe_layer_freq), dense
    ones from ``get_gpt_layer_local_spec``, the MTP block from the last decoder layer's spec.
    Three substitutions, none of which changes a parameter:

    * ``--moe-grouped-gemm`` selects TEGroupedMLP under Transformer Engine and the legacy
      GroupedMLP (grouped_gemm package, CUDA) in the local spec; SequentialMLP is built
      instead: the same experts, each fc1 ``h → f`` (2f with SwiGLU) and fc2 ``f → h``
      (biases with add_bias_linear), as separate Linear layers.
    * MLA's local spec gives megatron-core's DotProductAttention, which in 0.16.1 does not
      take the ``k_channels`` / ``v_channels`` MLASelfAttention passes (TypeError; the TE
      spec's TEDotProductAttention does). A subclass that drops them (they only size
      activations; core attention holds no parameters) stands in.
    * ``MoEAlltoAllTokenDispatcher.__init__`` creates a ``torch.cuda.Stream`` (class
      attribute ``cuda_dtoh_stream``): a placeholder is set for the build; MLA's
      YarnRotaryEmbedding puts its frequencies on ``torch.cuda.current_device()``: "cpu";
      multi_latent_attention's ``HAVE_TE`` is True without Transformer Engine (a MagicMock
      stands in for it) and breaks an fp8-only isinstance check: set to False.
    """
    try:
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_decoder_block_spec, get_gpt_decoder_layer_specs, get_gpt_layer_local_spec,
            get_gpt_mtp_block_spec)
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.transformer import multi_latent_attention
        from megatron.core.transformer.dot_product_attention import DotProductAttention
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
        from megatron.core.transformer.transformer_config import (MLATransformerConfig,
                                                                  TransformerConfig)
    except Exception as exc:   # ImportError, or a broken install failing at import time
        pytest.skip(f"megatron-core (0.16.1) and torch are needed to build GPTModel from the "
                    f"flags: cannot import them ({type(exc).__name__}: {exc})")
    from tests.megatron_reference import _init_distributed

    own_dist = own_mp = False
    if not dist.is_initialized():
        with pytest.MonkeyPatch.context() as mp:      # _init_distributed sets MASTER_*
            mp.setenv("MASTER_ADDR", "127.0.0.1")
            mp.setenv("MASTER_PORT", "0")
            _init_distributed()
        own_dist = own_mp = True
    elif not parallel_state.model_parallel_is_initialized():
        if dist.get_world_size() != 1:
            pytest.skip("torch.distributed already runs with more than one rank")
        parallel_state.initialize_model_parallel(1, 1)
        own_mp = True

    class MLACoreAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kw):
            super().__init__(*args, **kw)

    def use_mla_core_attention(layer_spec):
        attn = layer_spec.submodules.self_attention
        if attn.submodules.core_attention is DotProductAttention and hasattr(
                attn.submodules, "linear_kv_down_proj"):
            attn.submodules.core_attention = MLACoreAttention

    patches = pytest.MonkeyPatch()
    # MLA's YarnRotaryEmbedding (rope_type "yarn", MLATransformerConfig's default) builds its
    # frequencies on torch.cuda.current_device() (it is not passed use_cpu_initialization)
    patches.setattr(torch.cuda, "current_device", lambda: "cpu")
    # Without Transformer Engine, megatron.core.extensions.transformer_engine still imports
    # (te is a MagicMock), so multi_latent_attention sets HAVE_TE = True with TELinear a
    # MagicMock, and MLASelfAttention.__init__'s fp8 branch `HAVE_TE and isinstance(
    # self.linear_proj, TELinear)` raises TypeError. That branch is its only HAVE_TE use.
    patches.setattr(multi_latent_attention, "HAVE_TE", False)
    if MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:
        patches.setattr(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", object())

    def build(argv: list[str]):
        arch = architecture_from_flags(argv)
        cfg = dict(arch["config"], moe_grouped_gemm=False)     # SequentialMLP, see above
        cfg["activation_func"] = (torch.nn.functional.silu if arch["swiglu"]
                                  else torch.nn.functional.gelu)
        config_class = (MLATransformerConfig if arch["config_class"] == "MLATransformerConfig"
                        else TransformerConfig)
        config = config_class(**cfg)
        norm = arch["normalization"]
        if config.num_moe_experts:
            spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                              normalization=norm)
            layer_specs = spec.layer_specs
        else:
            spec = get_gpt_layer_local_spec(None, False, config.qk_layernorm,
                                            config.multi_latent_attention, normalization=norm)
            layer_specs = [spec]
        mtp_spec = None
        if config.mtp_num_layers:
            last = get_gpt_decoder_layer_specs(config, use_transformer_engine=False,
                                               normalization=norm)[-1]
            layer_specs = [*layer_specs, last]
            mtp_spec = get_gpt_mtp_block_spec(config, last, use_transformer_engine=False)
        for layer_spec in layer_specs:
            use_mla_core_attention(layer_spec)
        gpt = GPTModel(config=config, transformer_layer_spec=spec, mtp_block_spec=mtp_spec,
                       **arch["model"])
        return gpt, arch

    yield build
    patches.undo()
    if own_mp:
        parallel_state.destroy_model_parallel()
    if own_dist:
        dist.destroy_process_group()


def _count(module, prefix: str = "") -> int:
    return sum(p.numel() for n, p in module.named_parameters() if n.startswith(prefix))


def _check_counts(build, spec: ModelSpec, plan: ParallelPlan, label: str) -> dict:
    """Built vs counted: every decoder layer by kind, the MTP block, the total without MTP
    (total_parameters) and with it (the pp = 1 stage). Returns the numbers."""
    gpt, arch = build(_argv(spec, plan))
    vocab = arch["model"]["vocab_size"]
    assert vocab == padded_vocab(spec.vocab_size, plan.tp), label
    padded = dataclasses.replace(spec, vocab_size=vocab)
    moe_layer = float(sum(moe_layer_parameters(spec))) if spec.is_moe else None
    for i, is_moe in enumerate(spec.moe_layer_pattern):
        layer = _count(gpt, f"decoder.layers.{i}.")
        want = moe_layer if is_moe else float(dense_layer_parameters(spec))
        assert layer == want, (label, f"layer {i}", "MoE" if is_moe else "dense", layer, want)
    if not spec.is_moe:
        assert _count(gpt, "decoder.layers.0.") == dense_layer_parameters(spec), label
    mtp_built = _count(gpt, "mtp.")
    mtp_counted = int(round(float(sum(mtp_parameters(spec)))))
    assert mtp_built == mtp_counted, (label, "MTP", mtp_built, mtp_counted)
    got = _count(gpt)
    assert got - mtp_built == total_parameters(padded), (
        label, "without MTP", got - mtp_built, total_parameters(padded))
    assert got == counted_parameters(padded), (label, "pp=1 stage", got,
                                               counted_parameters(padded))
    return dict(built=got, built_mtp=mtp_built, total_parameters=total_parameters(padded),
                stage=counted_parameters(padded))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_gptmodel_built_from_the_flags_has_the_counted_parameters(megatron, request, name):
    kw, plan = VARIANTS[name]
    spec = _spec(name, kw)
    _xfail_known(request, spec, "build")
    _check_counts(megatron, spec, plan, name)


@pytest.mark.parametrize("change", ONE_FIELD_CHANGES,
                         ids=[f"{b}-{f}={v!r}" for b, f, v, _s, _c in ONE_FIELD_CHANGES])
def test_one_field_changes_built_from_the_flags(megatron, request, change):
    """Both ways at once: each one-field change of (b), rebuilt from its flags, still has
    exactly the parameters the count gives it."""
    base_name, field, val, _base, changed = change
    _xfail_known(request, changed, "build")
    _check_counts(megatron, changed, PLAN, f"{base_name} {field}={val!r}")


@pytest.mark.parametrize("kw", [
    dict(_MOE, add_bias_linear=True, moe_shared_expert_intermediate_size=128),
    dict(_MLA, num_query_groups=2),
    dict(_TINY, mtp_num_layers=1),
], ids=["shared-expert-bias", "mla-gqa", "mtp-learned-positions"])
def test_make_model_refuses_what_megatron_refuses(kw):
    assert megatron_refuses(kw)
    with pytest.raises(InputError):
        make_model(name="x", **kw)
