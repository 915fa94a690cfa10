"""Closed-form checks of the memory model against published formulas and configurations."""

import csv
import dataclasses
import os

import pytest

from configurator.core.model import make_model
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.plan_values import RECOMPUTE_CODES
from configurator.core.rules import check_plan
from configurator.core.units import GiB
from memory_model import estimate_memory
from configurator.core.schedule import inflight_layers
from configurator.core.plan_batch import PlanBatch
from configurator.search.engine import peak_memory
from memory_model.activations import (LayerInputs, StagePosition, checkpoint_bytes,
                                      layer_activation_bytes, stage_activation_bytes,
                                      stage_activation_phases)
from memory_model.estimate import memory_arrays
from memory_model.params import stage_parameters

#: Korthikanti et al. 2022 Table 2, typed from the paper (its citation is the file's first line).
TABLE2 = os.path.join(os.path.dirname(__file__), "data",
                      "korthikanti_table2_activation_memory_formulas.csv")

#: Korthikanti Table 2 rows: (tp > 1, sequence parallel, recompute).
ROW_SETTINGS = {
    "no parallelism": (False, False, "none"),
    "tensor parallel (baseline)": (True, False, "none"),
    "tensor + sequence parallel": (True, True, "none"),
    "tensor parallel + selective recompute": (True, False, "selective"),
    "tensor + sequence parallel + selective recompute": (True, True, "selective"),
    "full activation recompute": (True, False, "full"),
}

#: GPT layers as in the paper: 4h GeLU MLP, g = a, dropout 0.1, learned positions.
GPT_SIZES = [  # (hidden, heads, seq, mbs, tp)
    (12288, 96, 2048, 1, 8),    # GPT-3 175B, Korthikanti Table 3
    (6144, 64, 2048, 4, 8),     # 22B
    (25600, 160, 2048, 1, 8),   # 1T
    (1024, 16, 1024, 3, 4),
]


def _table2_rows():
    if not os.path.exists(TABLE2):
        pytest.skip(f"{TABLE2} not present")
    with open(TABLE2) as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def _gpt(hidden, heads, seq, layers=4, vocab=51200):
    return make_model(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                      vocab_size=vocab, seq_length=seq)


def _formula(expr, **vals):
    return eval(compile(expr, TABLE2, "eval"), {"__builtins__": {}}, vals)  # noqa: S307


@pytest.mark.parametrize("size", GPT_SIZES)
def test_korthikanti_table2_per_layer(size):
    h, a, s, b, t = size
    model = _gpt(h, a, s)
    rows = _table2_rows()
    assert {r["configuration"] for r in rows} == set(ROW_SETTINGS)
    for row in rows:
        uses_tp, sp, recompute = ROW_SETTINGS[row["configuration"]]
        tp = t if uses_tp else 1
        want = _formula(row["activation_bytes_per_layer"], s=s, b=b, h=h, a=a, t=tp)
        if recompute == "full":
            got = checkpoint_bytes(model, mbs=b, seq=s, tp=tp, sp=sp)
        else:
            got = layer_activation_bytes(model, mbs=b, seq=s, tp=tp, sp=sp,
                                         recompute=RECOMPUTE_CODES[recompute],
                                         stores_scores=True)
        assert float(got) == pytest.approx(want, rel=1e-12), row["configuration"]


def test_full_recompute_checkpoint_split_by_sequence_parallel():
    model = _gpt(12288, 96, 2048)
    sbh = 2048 * 1 * 12288
    assert float(checkpoint_bytes(model, mbs=1, seq=2048, tp=8, sp=True)) == 2 * sbh / 8


@pytest.mark.parametrize("size", GPT_SIZES)
def test_korthikanti_first_stage_extras_pp1(size):
    """pp = 1 with TP + SP: L layers, embedding dropout sbh/t, and 4sbh/t·(1 + V/h)
    (final norm input, output-layer input, fp32 logits; Korthikanti §4.2.2)."""
    h, a, s, b, t = size
    layers, vocab = 4, 51200          # 51200 is a multiple of 128·t for t ≤ 8
    model = _gpt(h, a, s, layers, vocab)
    sbh = s * b * h
    per_layer = sbh * (34 / t + 5 * a * s / (h * t))
    want = layers * per_layer + sbh / t + 4 * sbh / t * (1 + vocab / h)
    got = stage_activation_bytes(
        model, LayerInputs(mbs=b, seq=s, tp=t, sp=True, recompute=0, stores_scores=True),
        StagePosition(pp=1, vp=1, num_microbatches=8, stage=0))
    assert float(got) == pytest.approx(want, rel=1e-12)


def test_flash_attention_keeps_no_scores():
    model = _gpt(4096, 32, 4096)
    kw = dict(mbs=1, seq=4096, tp=1, sp=False, recompute=0)
    local = layer_activation_bytes(model, stores_scores=True, **kw)
    flash = layer_activation_bytes(model, stores_scores=False, **kw)
    sbh = 4096 * 4096
    assert float(local - flash) == pytest.approx(5 * 32 * 4096 * 4096 - 4 * 32 * 4096)
    assert float(flash) == pytest.approx(34 * sbh + 4 * 32 * 4096)


def test_no_dropout_keeps_no_masks():
    with_drop = _gpt(1024, 16, 1024)
    without = dataclasses.replace(with_drop, hidden_dropout=0.0, attention_dropout=0.0)
    kw = dict(mbs=1, seq=1024, tp=1, sp=False, recompute=0, stores_scores=True)
    diff = layer_activation_bytes(with_drop, **kw) - layer_activation_bytes(without, **kw)
    sbh = 1024 * 1024
    assert float(diff) == 2 * sbh + 3 * 16 * 1024 * 1024   # 2 masks; scores mask + output


@pytest.mark.parametrize("p,m", [(1, 1), (4, 2), (4, 16), (8, 8), (64, 512)])
def test_1f1b_inflight(p, m):
    """1F1B: rank r holds min(p - r, m) microbatches of its L/p layers (SC'21 §2.2)."""
    layers = 128
    for r in range(p):
        got = inflight_layers(layers, pp=p, vp=1, num_microbatches=m, stage=r)
        assert float(got) == min(p - r, m) * layers / p
    if m >= p:
        assert float(inflight_layers(layers, pp=p, vp=1, num_microbatches=m, stage=0)) == layers


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 4), (8, 3), (16, 2)])
def test_interleaved_inflight_factor(p, v):
    """Interleaved: rank 0 holds p + (p-1)/v stage-microbatches, factor 1 + (p-1)/(p·v)."""
    layers = p * v * 4
    got = inflight_layers(layers, pp=p, vp=v, num_microbatches=4 * p, stage=0)
    assert float(got) / layers == pytest.approx(1 + (p - 1) / (p * v), rel=1e-12)
    last = inflight_layers(layers, pp=p, vp=v, num_microbatches=4 * p, stage=p - 1)
    assert float(last) < float(got)


@pytest.mark.parametrize("precision,grad_bytes", [("bf16", 4), ("fp16", 2)])
@pytest.mark.parametrize("dp,cp", [(1, 1), (8, 1), (4, 2), (64, 1)])
def test_distributed_optimizer_sharding(precision, grad_bytes, dp, cp):
    """Bytes per parameter: 16-bit weight, main grad (fp32 for bf16), 12 B of fp32 master
    weight + Adam m, v, sharded over dp·cp by the distributed optimizer."""
    model = MODEL_PRESETS["gpt-7.5b"]
    common = dict(tp=2, pp=2, dp=dp, cp=cp, vp=1, mbs=1, global_batch_size=4 * dp,
                  recompute="none", sequence_parallel=True, precision=precision)
    params = float(stage_parameters(model, 2, 2, 0))
    for dist, opt in ((True, 12 / (dp * cp)), (False, 12)):
        out = memory_arrays(model, PlanBatch.of(distributed_optimizer=dist, **common), 0)
        state = out["parameters_bytes"] + out["gradients_bytes"] + out["optimizer_bytes"]
        assert float(state[0]) / params == pytest.approx(2 + grad_bytes + opt, rel=1e-12)


def test_full_recompute_peak_is_in_backward():
    """With full recompute the stage peaks while one layer is recomputed: the other
    checkpoints plus one whole layer, not all checkpoints plus the output-layer terms."""
    model = _gpt(4096, 32, 2048, layers=8, vocab=51200)
    x = LayerInputs(mbs=1, seq=2048, tp=1, sp=False, recompute=2, stores_scores=True)
    at = StagePosition(pp=1, vp=1, num_microbatches=1, stage=0)
    fwd, rec = stage_activation_phases(model, x, at)
    ckpt = checkpoint_bytes(model, mbs=1, seq=2048, tp=1, sp=False)
    layer = layer_activation_bytes(model, mbs=1, seq=2048, tp=1, sp=False, recompute=0,
                                   stores_scores=True)
    emb = 2048 * 4096
    assert float(rec) == pytest.approx(float(7 * ckpt + layer + emb))
    assert float(fwd) == pytest.approx(float(8 * ckpt + emb + 4 * 2048 * 4096
                                             + 4 * 2048 * 51200))
    total = stage_activation_bytes(model, x, at)
    assert float(total) == max(float(fwd), float(rec))


def test_selective_recompute_peak_counts_recomputed_scores():
    """Long sequences: re-running one layer's core attention in backward brings its s×s
    scores back, which can exceed the output-layer terms freed by then."""
    model = _gpt(4096, 32, 8192, layers=2, vocab=51200)
    x = LayerInputs(mbs=1, seq=8192, tp=1, sp=False, recompute=1, stores_scores=True)
    at = StagePosition(pp=1, vp=1, num_microbatches=1, stage=0)
    fwd, rec = stage_activation_phases(model, x, at)
    assert float(rec) > float(fwd)
    assert float(stage_activation_bytes(model, x, at)) == float(rec)


def test_sc21_1t_fits_80gib():
    """SC'21 Table 1's 1T model: tp 8, pp 64, dp 6, mbs 1, GBS 3072, full recompute, fp16,
    local attention (2021 Megatron), on A100 80 GB."""
    model = MODEL_PRESETS["gpt-1t"]
    plan = ParallelPlan(tp=8, pp=64, dp=6, micro_batch_size=1, global_batch_size=3072,
                        recompute="full", precision="fp16", attention_backend="local")
    check_plan(model, plan, 3072)
    stages = estimate_memory(model, PlanBatch.from_plan(plan))
    peak = max(st.total_bytes for st in stages)
    assert peak <= 80 * GiB
    assert peak > 20 * GiB                       # weights and optimizer state alone: ~33 GiB
    # Without recompute the same plan would not fit (the reason SC'21 recomputes).
    none = dataclasses.replace(plan, recompute="none")
    stages = estimate_memory(model, PlanBatch.from_plan(none))
    assert max(st.total_bytes for st in stages) > 80 * GiB


def test_vectorised_matches_scalar():
    """The search evaluates arrays of plans: the broadcast result equals per-plan calls."""
    model = MODEL_PRESETS["llama3-8b"]
    tp = [1, 2, 4, 8, 8]
    rc = ["none", "selective", "full", "selective", "none"]
    sp = [False, True, True, False, True]
    pp = [1, 2, 4, 2, 8]
    kw = dict(dp=1, cp=1, vp=1, mbs=1, global_batch_size=8, distributed_optimizer=True,
              precision="bf16")
    batch = peak_memory(model, PlanBatch.of(tp=tp, pp=pp, recompute=rc, sequence_parallel=sp,
                                            **kw))
    for i in range(len(tp)):
        one = peak_memory(model, PlanBatch.of(tp=tp[i], pp=pp[i], recompute=rc[i],
                                              sequence_parallel=sp[i], **kw))
        assert float(batch[i]) == pytest.approx(float(one[0]), rel=1e-12)


def test_a_layers_inputs_are_frozen_and_keyword_only():
    """One layer's inputs are read by every activation term of a stage: they cannot change
    between terms, nor be built from positional figures in the wrong order."""
    model = MODEL_PRESETS["llama3-8b"]
    inputs = LayerInputs.of_plans(model, PlanBatch.of(tp=2, pp=1, dp=4, mbs=1,
                                                      global_batch_size=8))
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.mbs = 2
    with pytest.raises(TypeError):
        LayerInputs(*dataclasses.astuple(inputs))


def test_a_stage_position_is_frozen_and_keyword_only():
    """Where a pipeline rank sits is read by every activation term of its stage: it cannot
    change between terms, nor be built with its pipeline size and stage index swapped."""
    at = StagePosition(pp=4, vp=1, num_microbatches=8, stage=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        at.stage = 0
    with pytest.raises(TypeError):
        StagePosition(4, 1, 8, 1)


def test_a_memory_breakdown_is_frozen_and_keyword_only():
    """Estimates are shared between the table, the JSON and the launch scripts: a breakdown
    cannot be changed after it is made, nor built from positional figures in the wrong order."""
    from memory_model.estimate import MemoryBreakdown

    m = MemoryBreakdown(stage=0, parameters_bytes=1.0, gradients_bytes=2.0, optimizer_bytes=3.0,
                        activations_bytes=4.0, other_bytes=5.0, total_bytes=15.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.total_bytes = 0.0
    with pytest.raises(TypeError):
        MemoryBreakdown(0, 1.0, 2.0, 3.0, 4.0, 5.0, 15.0)
