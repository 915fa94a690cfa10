"""Every architecture flag the launch script passes against the parameter count, both ways.

(a) flags → parameters: megatron-core 0.16.1's ``GPTModel`` (local layer spec, CPU) is built
    from a ``TransformerConfig`` read from the rendered Megatron flags alone, the way
    ``pretrain_gpt.py`` would read them (megatron/training/arguments.py
    ``core_transformer_config_from_args``; vocabulary: NullTokenizer's ``--vocab-size + 1``
    padded to a multiple of ``128·tp``, megatron/training/tokenizer ``_vocab_size_with_padding``),
    and its parameter count must equal ``memory_model.params.total_parameters`` of the
    ModelSpec (with that padded vocabulary).
(b) parameters → flags: changing any ModelSpec field alone, in a way that changes the
    parameter count, must change the emitted flags (no field the count uses is dropped).

(b) needs nothing but the configurator; (a) skips when megatron-core cannot be imported.
The whole model is built on one rank (tp = pp = 1): the total count does not depend on the
split, only the vocabulary padding reads ``--tensor-model-parallel-size``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from configurator.core.errors import InputError
from configurator.core.model import ModelSpec, make_model
from configurator.core.plan import FLAG_GROUPS, PLAN_FIELDS, ParallelPlan
from launchers.megatron_flags import FLAG_TABLE, flag_argv, megatron_flags
from memory_model.params import layer_parameters, total_parameters
from tests.megatron_argv import parse_argv

PLAN = ParallelPlan(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1)
PLAN_TP2 = ParallelPlan(tp=2, pp=1, dp=1, micro_batch_size=1, global_batch_size=1)

_TINY = dict(num_layers=2, hidden_size=128, num_attention_heads=8, vocab_size=1000,
             seq_length=64)
_LLAMA = dict(_TINY, swiglu=True, normalization="RMSNorm", add_bias_linear=False,
              position_embedding_type="rope", untie_embeddings_and_output_weights=True,
              hidden_dropout=0.0, attention_dropout=0.0)

#: name -> (ModelSpec keyword arguments, plan). Together: LayerNorm and RMSNorm, GeLU and
#: SwiGLU, with and without linear biases (either norm), MHA and GQA, tied and untied
#: embeddings, learned_absolute, rope and no positions, default and explicit FFN sizes, and a
#: tp = 2 plan whose vocabulary pads to 256 (1100 → 1280, where tp = 1 gives 1152).
VARIANTS: dict[str, tuple[dict, ParallelPlan]] = {
    "gpt": (dict(_TINY), PLAN),
    "gpt-no-bias": (dict(_TINY, add_bias_linear=False), PLAN),
    "gpt-gqa": (dict(_TINY, num_query_groups=2), PLAN),
    "gpt-rope-untied": (dict(_TINY, position_embedding_type="rope",
                             untie_embeddings_and_output_weights=True), PLAN),
    "gpt-no-positions": (dict(_TINY, hidden_size=64, num_attention_heads=4,
                              position_embedding_type="none"), PLAN),
    "gpt-tp2-vocab1100": (dict(_TINY, vocab_size=1100, ffn_hidden_size=320), PLAN_TP2),
    "llama": (dict(_LLAMA), PLAN),
    "llama-gqa": (dict(_LLAMA, num_query_groups=2), PLAN),
    "llama-gqa-tied": (dict(_LLAMA, num_query_groups=4,
                            untie_embeddings_and_output_weights=False), PLAN),
    "llama-with-bias": (dict(_LLAMA, add_bias_linear=True), PLAN),
    "swiglu-layernorm-learned": (dict(_TINY, swiglu=True, add_bias_linear=False,
                                      ffn_hidden_size=192), PLAN_TP2),
    "gelu-rmsnorm-bias": (dict(_TINY, normalization="RMSNorm", num_query_groups=4), PLAN),
}


def _spec(name: str, kw: dict) -> ModelSpec:
    return make_model(name=name, **kw)


def padded_vocab(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron's ``_vocab_size_with_padding``: up to a multiple of ``divisible_by * tp``."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


def architecture_from_flags(argv: list[str]) -> dict:
    """What pretrain_gpt.py builds from ``argv`` (the model-defining arguments only).

    Returns ``config`` (TransformerConfig keyword arguments), ``model`` (GPTModel keyword
    arguments apart from config and spec), ``normalization`` and ``tp``.
    """
    a = parse_argv(argv)
    assert a["--tokenizer-type"] == "NullTokenizer"
    tp = int(a["--tensor-model-parallel-size"])
    heads = int(a["--num-attention-heads"])
    # validate_args: num_query_groups is read only with --group-query-attention, else = heads
    groups = int(a["--num-query-groups"]) if "--group-query-attention" in a else heads
    swiglu = "--swiglu" in a
    config = dict(
        num_layers=int(a["--num-layers"]), hidden_size=int(a["--hidden-size"]),
        ffn_hidden_size=int(a["--ffn-hidden-size"]), num_attention_heads=heads,
        num_query_groups=groups, add_bias_linear="--disable-bias-linear" not in a,
        gated_linear_unit=swiglu, normalization=a["--normalization"],
        hidden_dropout=float(a["--hidden-dropout"]),
        attention_dropout=float(a["--attention-dropout"]), use_cpu_initialization=True)
    # NullTokenizer has vocab_size + 1 tokens (its EOD), padded to a multiple of 128·tp.
    vocab = padded_vocab(int(a["--vocab-size"]) + 1, tp)
    model = dict(vocab_size=vocab, max_sequence_length=int(a["--max-position-embeddings"]),
                 position_embedding_type=a["--position-embedding-type"],
                 share_embeddings_and_output_weights=(
                     "--untie-embeddings-and-output-weights" not in a))
    return dict(config=config, model=model, normalization=a["--normalization"], tp=tp,
                swiglu=swiglu)


# -- (b) parameters -> flags ----------------------------------------------------------------

#: Other legal values of every ModelSpec field (apart from ``name``), tried one at a time.
ALTERNATIVES: dict[str, tuple] = {
    "num_layers": (3, 4),
    "hidden_size": (192, 256),
    "num_attention_heads": (4, 2),
    "num_query_groups": (1, 4, 8),
    "ffn_hidden_size": (384, 320),
    "vocab_size": (1100, 2000, 1001),
    "seq_length": (128, 32),
    "swiglu": (True, False),
    "untie_embeddings_and_output_weights": (True, False),
    "normalization": ("LayerNorm", "RMSNorm"),
    "hidden_dropout": (0.0, 0.2),
    "attention_dropout": (0.0, 0.2),
    "position_embedding_type": ("learned_absolute", "rope", "none"),
    "add_bias_linear": (True, False),
}

#: The fields that change the parameter count (memory_model/params.py).
COUNT_FIELDS = {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_query_groups", "vocab_size", "swiglu",
                "untie_embeddings_and_output_weights", "normalization",
                "position_embedding_type", "add_bias_linear"}

#: Bases for the one-field changes: GPT-style and Llama-style, both with groups (2) that
#: divide every alternative head count, and explicit FFN sizes (kept when hidden changes).
BASES = {"gpt": dict(_TINY, num_query_groups=2, ffn_hidden_size=512),
         "llama": dict(_LLAMA, num_query_groups=2, ffn_hidden_size=352)}


def one_field_changes():
    """(base name, field, value, base spec, changed spec) for every legal change."""
    out = []
    for base_name, kw in BASES.items():
        base = _spec(base_name, kw)
        for field, values in ALTERNATIVES.items():
            for val in values:
                if getattr(base, field) == val:
                    continue
                changed = _spec(base_name, {**kw, field: val})   # validated, must be legal
                assert getattr(changed, field) == val
                assert {f for f in ALTERNATIVES
                        if getattr(changed, f) != getattr(base, f)} == {field}
                out.append((base_name, field, val, base, changed))
    return out


def _argv(model: ModelSpec, plan: ParallelPlan = PLAN) -> list[str]:
    return flag_argv(megatron_flags(model, plan))


def test_alternatives_cover_every_model_field():
    assert set(ALTERNATIVES) == {f.name for f in dataclasses.fields(ModelSpec)} - {"name"}


def test_changing_a_counted_field_changes_the_flags():
    changed_count: set[str] = set()
    for base_name, field, val, base, changed in one_field_changes():
        if total_parameters(changed) == total_parameters(base):
            continue
        changed_count.add(field)
        assert _argv(changed) != _argv(base), (
            f"{base_name}: {field}={val!r} changes the parameter count "
            f"({total_parameters(base)} -> {total_parameters(changed)}) but not the flags")
    # every field the count uses was exercised (seq_length counts with learned positions)
    assert changed_count == COUNT_FIELDS | {"seq_length"}, changed_count ^ COUNT_FIELDS


def test_bias_flag_follows_add_bias_linear():
    for name, (kw, plan) in VARIANTS.items():
        spec = _spec(name, kw)
        assert ("--disable-bias-linear" in _argv(spec, plan)) == (not spec.add_bias_linear), name


def test_plan_flags_come_from_the_plan_schema():
    plan_rows = [(f.flag_group, flag, f"plan.{f.name}") for f in PLAN_FIELDS for flag, _ in f.flags]
    table_plan_rows = [(r.group, r.flag, r.source) for r in FLAG_TABLE
                       if r.source.startswith("plan.")]
    assert sorted(table_plan_rows) == sorted(plan_rows)
    groups = [r.group for r in FLAG_TABLE]
    assert sorted(set(groups), key=groups.index) == list(FLAG_GROUPS)
    assert groups == sorted(groups, key=FLAG_GROUPS.index)       # each group contiguous


# -- (a) flags -> parameters ----------------------------------------------------------------

@pytest.fixture(scope="module")
def megatron():
    """megatron-core on CPU with model parallelism of 1 over a one-rank gloo group (the
    setup tests/megatron_reference.py uses); torn down after the module."""
    try:
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.core.transformer.transformer_config import TransformerConfig
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

    def build(argv: list[str]):
        arch = architecture_from_flags(argv)
        cfg = dict(arch["config"])
        cfg["activation_func"] = (torch.nn.functional.silu if arch["swiglu"]
                                  else torch.nn.functional.gelu)
        config = TransformerConfig(**cfg)
        spec = get_gpt_layer_local_spec(normalization=arch["normalization"])
        return GPTModel(config=config, transformer_layer_spec=spec, **arch["model"]), arch

    yield build
    if own_mp:
        parallel_state.destroy_model_parallel()
    if own_dist:
        dist.destroy_process_group()


def _count(module, prefix: str = "") -> int:
    return sum(p.numel() for n, p in module.named_parameters() if n.startswith(prefix))


def _check_counts(build, spec: ModelSpec, plan: ParallelPlan, label: str) -> int:
    gpt, arch = build(_argv(spec, plan))
    vocab = arch["model"]["vocab_size"]
    assert vocab == padded_vocab(spec.vocab_size, plan.tp), label
    want = total_parameters(dataclasses.replace(spec, vocab_size=vocab))
    got = _count(gpt)
    layer = _count(gpt, "decoder.layers.0.")
    assert layer == layer_parameters(spec), (label, "one layer", layer, layer_parameters(spec))
    assert got == want, (label, got, want)
    return got


@pytest.mark.parametrize("name", list(VARIANTS))
def test_gptmodel_built_from_the_flags_has_the_counted_parameters(megatron, name):
    kw, plan = VARIANTS[name]
    _check_counts(megatron, _spec(name, kw), plan, name)


def test_one_field_changes_built_from_the_flags(megatron):
    """Both ways at once: each one-field change of (b), rebuilt from its flags, still has
    exactly the parameters the count gives it."""
    for base_name, field, val, _base, changed in one_field_changes():
        _check_counts(megatron, changed, PLAN, f"{base_name} {field}={val!r}")
