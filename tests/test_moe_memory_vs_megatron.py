"""The analytic memory model against megatron-core's mixture-of-experts GPTModel.

Measured on CPU by ``tests/megatron_reference.py`` (real megatron-core 0.16.1 ``MoELayer``:
``TopKRouter`` with the default ``aux_loss`` load balancing, coefficient 1e-2; all-to-all
dispatcher; ``SequentialMLP`` experts; ep = etp = tp = pp = cp = 1; bf16, seq 128, micro-batch
2, local attention). Configs: :data:`tests.megatron_reference.MOE_CONFIGS` (4 experts of 384,
top-2, SwiGLU, RMSNorm, RoPE, 8 heads / 4 groups; with a shared expert; a dense layer followed
by MoE ones; selective and full recompute).
"""

import importlib.util

import pytest

from tests.megatron_reference import MBS, MOE_CONFIGS, SEQ, model_bytes, model_spec, run_reference

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("megatron") is None \
        or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("needs torch and megatron-core==0.16.1 (pip install -e .[test])",
                allow_module_level=True)

TOLERANCE = 0.05

#: Known gaps of the memory model (strict xfail: an XPASS means the gap is closed; drop
#: the entry). The shared expert's recompute in backward: the model re-materialises it
#: beside all the layer's kept tensors, while megatron-core has freed the routed experts'
#: by then (the shared expert's backward runs after theirs): +29 %, on the safe side, and
#: below the forward's end, which sets the peak.
KNOWN_GAPS: dict = {("moe-shared-recompute", "recompute_peak_bytes"): pytest.mark.xfail(
    strict=True, reason="shared_experts recompute peak overestimated (conservative)")}


def _cases(names, key):
    return [pytest.param(n, marks=KNOWN_GAPS.get((n, key), ())) for n in names]


@pytest.fixture(scope="module")
def measured():
    return run_reference(list(MOE_CONFIGS))


def _rel(model, measured):
    return abs(model - measured) / measured


@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_moe_parameters_exact(measured, name):
    """Parameter counts to the element: all, the stage's (pp = 1), the routed experts'
    (``stage_parameter_split``'s expert part) and the active ones (top-k of E experts)."""
    model, meas = model_bytes(name), measured[name]
    assert model["total_parameters"] == meas["parameters"]
    assert model["stage_parameters"] == meas["parameters"]
    assert model["expert_parameters"] == meas["expert_parameters"]
    assert model["active_parameters"] == meas["active_parameters"]


@pytest.mark.parametrize("name", list(MOE_CONFIGS))
def test_moe_per_layer_activations(measured, name):
    """Bytes the last decoder layer (an MoE layer) adds at the end of the forward: every
    tensor of the layer, or the checkpoint alone with full recompute."""
    got, want = model_bytes(name)["layer_bytes"], measured[name]["layer_bytes"]
    assert _rel(got, want) <= TOLERANCE, (name, got, want)


@pytest.mark.parametrize("name", [n for n, c in MOE_CONFIGS.items() if c["recompute"] != "full"])
def test_moe_block_activations(measured, name):
    """What the MoE layer's ``mlp`` (router, dispatcher, experts, shared expert) keeps: the
    dense MLP's terms plus ``moe_mlp_activation_delta``."""
    got, want = model_bytes(name)["moe_block_bytes"], measured[name]["moe_block_bytes"]
    assert _rel(got, want) <= TOLERANCE, (name, got, want)


@pytest.mark.parametrize("name", _cases(MOE_CONFIGS, "stage_bytes"))
def test_moe_stage_total(measured, name):
    """Peak bytes kept for backward over one forward and backward of the whole model."""
    got, want = model_bytes(name)["stage_bytes"], measured[name]["stage_peak_bytes"]
    assert _rel(got, want) <= TOLERANCE, (name, got, want)


@pytest.mark.parametrize("name,key", [
    pytest.param(n, key, marks=KNOWN_GAPS.get((n, key), ()))
    for n, c in MOE_CONFIGS.items() if c["recompute"] != "none"
    for key in ("forward_end_bytes", "recompute_peak_bytes")])
def test_moe_recompute_phases(measured, name, key):
    """Both candidate peaks: the end of the forward, and the recomputation in backward."""
    model, meas = model_bytes(name), measured[name]
    assert meas["recompute_peak_bytes"] > 0
    assert _rel(model[key], meas[key]) <= TOLERANCE, (name, key, model[key], meas[key])


def test_moe_no_recompute_peaks_at_forward_end(measured):
    for name, c in MOE_CONFIGS.items():
        if c["recompute"] == "none":
            assert measured[name]["recompute_peak_bytes"] == 0
            assert measured[name]["stage_peak_bytes"] == measured[name]["forward_end_bytes"]
            assert model_bytes(name)["recompute_peak_bytes"] == 0


def test_moe_measurement_sees_known_tensors(measured):
    """Guards the harness itself: dropless routing sends exactly ``R = k·X`` token copies to
    the experts, so the MoE block keeps, byte for byte: its input (2Xh); the permuted tokens
    (2Rh, one storage the experts' fc1 inputs are views of), the SwiGLU inputs (2R·2f_e) and
    the fc2 inputs (2R·f_e), summed over experts; the per-token probabilities (2R, bf16);
    the router's top-k indices (8Xk, int64) and fp32 top-k probabilities (4Xk), the aux
    loss's fp32 softmax scores (4XE), token counts (8E) and scalar loss (4); the transposed
    routing map and probabilities (XE bool + 2XE bf16) and the sorted indices (8R, int64)."""
    spec = model_spec("moe")
    X, h, E, k, fe = SEQ * MBS, spec.hidden_size, spec.num_experts, spec.moe_router_topk, \
        spec.moe_ffn_hidden_size
    R = k * X
    want = (2 * X * h + 2 * R * h + 2 * R * 3 * fe + 2 * R + 8 * X * k + 4 * X * k
            + 4 * X * E + 8 * E + 4 + 3 * X * E + 8 * R)
    assert measured["moe"]["moe_block_bytes"] == want
    # a shared expert adds a dense SwiGLU MLP of its size (its fc1 input is the block input)
    fs = MOE_CONFIGS["moe-shared"]["moe_shared_expert_intermediate_size"]
    assert measured["moe-shared"]["moe_block_bytes"] == want + 2 * X * 3 * fs
    # full recompute keeps the layer input only
    assert measured["moe-full"]["layer_bytes"] == 2 * X * h
