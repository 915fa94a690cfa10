"""The analytic memory model against what megatron-core's GPTModel keeps for backward.

Measured on CPU by ``tests/megatron_reference.py`` (real megatron-core 0.16.1 code; ops whose
CPU fallback keeps other tensors than their GPU kernel are set up to keep what the GPU kernel
keeps; see that module). pp = tp = cp = 1, bf16, seq 128, micro-batch 2, local attention.
"""

import importlib.util

import pytest

from tests.megatron_reference import CONFIGS, MBS, SEQ, model_bytes, run_reference

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("megatron") is None \
        or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("needs torch and megatron-core==0.16.1 (pip install -e .[test])",
                allow_module_level=True)

TOLERANCE = 0.05


@pytest.fixture(scope="module")
def measured():
    return run_reference()


def _rel(model, measured):
    return abs(model - measured) / measured


@pytest.mark.parametrize("name", list(CONFIGS))
def test_per_layer_activations(measured, name):
    """Bytes one more decoder layer adds at the end of the forward (2 layers minus 1):
    every tensor of the layer, or the checkpoint alone with full recompute."""
    got, want = model_bytes(name)["layer_bytes"], measured[name]["layer_bytes"]
    assert _rel(got, want) <= TOLERANCE, (name, got, want)


def test_heads_wider_than_the_hidden_size_keep_a_wider_projection_input(measured):
    """linear_proj's saved input is the attention output, ``a·d`` values a token (512 here),
    not ``h`` (256): pricing it at ``h`` misses 4.3 % of the layer, inside the 5 % above,
    so this config is held to 1 %."""
    got, want = (model_bytes("llama-wide-heads")["layer_bytes"],
                 measured["llama-wide-heads"]["layer_bytes"])
    assert _rel(got, want) <= 0.01, (got, want)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stage_total(measured, name):
    """Peak bytes kept for backward over one forward and backward of the whole model
    (embedding, 2 layers, final norm, output layer, cross entropy)."""
    got, want = model_bytes(name)["stage_bytes"], measured[name]["stage_peak_bytes"]
    assert _rel(got, want) <= TOLERANCE, (name, got, want)


@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if c["recompute"] != "none"])
def test_recompute_phases(measured, name):
    """Both candidate peaks: the end of the forward, and the recomputation in backward."""
    model, meas = model_bytes(name), measured[name]
    assert meas["recompute_peak_bytes"] > 0
    for key in ("forward_end_bytes", "recompute_peak_bytes"):
        assert _rel(model[key], meas[key]) <= TOLERANCE, (name, key, model[key], meas[key])


def test_no_recompute_peaks_at_forward_end(measured):
    for name, c in CONFIGS.items():
        if c["recompute"] == "none":
            assert measured[name]["recompute_peak_bytes"] == 0
            assert measured[name]["stage_peak_bytes"] == measured[name]["forward_end_bytes"]
            assert model_bytes(name)["recompute_peak_bytes"] == 0


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameters_exact(measured, name):
    model = model_bytes(name)
    assert model["total_parameters"] == measured[name]["parameters"]
    assert model["stage_parameters"] == measured[name]["parameters"]  # pp = tp = 1


def test_measurement_sees_known_tensors(measured):
    """Guards the harness itself: a GPT layer (4h GeLU, dropout, MHA, learned positions)
    keeps exactly Korthikanti's 34·sbh + 5·a·s²·b plus the two LayerNorms' statistics
    (2 × 2 × s·b bf16 values on CPU)."""
    h, a = CONFIGS["gpt"]["hidden_size"], CONFIGS["gpt"]["num_attention_heads"]
    sbh = SEQ * MBS * h
    stats = 2 * 2 * SEQ * MBS * 2
    assert measured["gpt"]["layer_bytes"] == 34 * sbh + 5 * a * SEQ * SEQ * MBS + stats
    assert measured["gpt-full"]["layer_bytes"] == 2 * sbh
