"""FP8 memory: what Transformer Engine keeps for backward and as weight copies, and the
Llama-3 70B FP8 recipe on 64 H100 (Megatron-Bridge ``llama3_70b_pretrain_64gpu_h100_fp8cs``).

The byte accounting is derived in ``memory_model/activations.py`` ("FP8") and
``memory_model/estimate.py`` (FP8 weights) from TE 2.x's ``_Linear.forward``,
``_LayerNormLinear.forward``, ``FusedAttnFunc.forward`` and ``get_qkv_layout``. FP8 cannot be
measured against megatron-core on CPU (it needs TE and a GPU), so these tests check the
formula term by term.
"""

import dataclasses

import numpy as np
import pytest

from configurator.core.model import make_model
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.schedule import inflight_layers
from configurator.core.units import GiB
from memory_model.activations import (LayerInputs, StagePosition, layer_activation_bytes,
                                      linear_input_bytes, stage_activation_bytes)
from configurator.core.plan_batch import PlanBatch
from configurator.search.engine import peak_memory
from memory_model.estimate import fp8_weight_bytes, held_memory, memory_arrays
from memory_model.params import dense_layer_parameters, stage_non_gemm_parameters, \
    stage_parameters

H100_BYTES = 79.6474609375 * GiB        # torch.cuda total_memory of an H100 80 GB

LLAMA70 = dataclasses.replace(MODEL_PRESETS["llama3-70b"], seq_length=8192)


def _llama_like(h, a, g, f, seq, rope=True):
    return make_model(num_layers=4, hidden_size=h, num_attention_heads=a, num_query_groups=g,
                      ffn_hidden_size=f, vocab_size=32000, seq_length=seq, swiglu=True,
                      normalization="RMSNorm", add_bias_linear=False, hidden_dropout=0.0,
                      attention_dropout=0.0,
                      position_embedding_type="rope" if rope else "learned_absolute")


def _fp8_layer_formula(model, *, s, b, t, sp, q8, selective, flash):
    """Per-layer bytes of a Llama-style layer (no dropout, SwiGLU) under FP8, written out
    from the TE facts independently of the module's helpers."""
    h, f, a, g = (model.hidden_size, model.ffn_hidden_size, model.num_attention_heads,
                  model.num_query_groups)
    d = h // a
    X = s * b
    r = t if sp else 1
    norms = 2 * 2 * X * h / r                  # two 16-bit norm inputs
    gemm_in = 2 * q8 * X * h / r               # ln_out of QKV and of fc1, quantised
    qkv = 2 * X * d * (a + 2 * max(g, t)) / t  # contiguous Q, K, V (V copied by TE)
    m = qkv                                    # the QKV GEMM output, same size
    q_new, k_new = 2 * X * a * d / t, 2 * X * d * max(g, t) / t
    lse = 4 * a * X / t
    if selective:                              # checkpoint: M (pinned by V) + new Q, K
        attn = m + q_new + k_new
        proj = q8 * X * h / t                  # linear_proj's quantised input only
    else:
        attn = qkv + lse
        proj = (2 + q8) * X * h / t            # kernel's 16-bit out + quantised copy
    mlp = (2 * 2 + q8) * X * f / t             # 16-bit SwiGLU input + quantised fc2 input
    assert flash
    return norms + gemm_in + attn + proj + mlp


SHAPES = [  # (h, a, g, f, seq, mbs, tp, sp)
    (8192, 64, 8, 28672, 8192, 1, 4, True),     # Llama-3 70B, the recipe
    (4096, 32, 8, 14336, 8192, 1, 1, False),    # Llama-3 8B
    (4096, 32, 8, 14336, 4096, 2, 2, True),
    (16384, 128, 8, 53248, 8192, 1, 8, True),   # Llama-3.1 405B
    (2048, 16, 16, 5632, 2048, 4, 2, False),    # MHA
    (2048, 16, 2, 5632, 2048, 1, 4, True),      # g < tp
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("precision", ["fp8", "mxfp8"])
def test_fp8_layer_bytes_term_by_term(shape, precision):
    h, a, g, f, s, b, t, sp = shape
    model = _llama_like(h, a, g, f, s)
    q8 = {"fp8": 1.0, "mxfp8": 33 / 32}[precision]
    assert linear_input_bytes(precision) == q8 and linear_input_bytes("bf16") == 2.0
    for rc in (0, 1):
        kw = dict(mbs=b, seq=s, tp=t, sp=sp, recompute=rc, stores_scores=False)
        got = float(layer_activation_bytes(model, precision=precision, **kw))
        want = _fp8_layer_formula(model, s=s, b=b, t=t, sp=sp, q8=q8, selective=rc == 1,
                                  flash=True)
        assert got == pytest.approx(want, rel=1e-12)
        # against bf16: the three quantised GEMM inputs (QKV, fc1, fc2) save 2 - q8 bytes a
        # value; linear_proj's input saves 2 - q8 under selective recompute and costs q8
        # more without (the flash kernel keeps its own 16-bit output)
        bf16 = float(layer_activation_bytes(model, precision="bf16", **kw))
        X, r = s * b, (t if sp else 1)
        proj = (2 - q8) * X * h / t if rc == 1 else -q8 * X * h / t
        saved = (2 - q8) * (2 * X * h / r + X * f / t) + proj
        assert bf16 - got == pytest.approx(saved, rel=1e-12)
        assert got < bf16


def test_llama3_70b_fp8_layer_mib():
    """The recipe's layer, tp 4 with SP, s 8192, b 1: 536.5 MiB in bf16, 464.5 MiB in FP8
    (norm inputs 64, QKV/fc1 inputs 32, Q/K/V 40 + LSE 0.5, proj input 32 + 16, SwiGLU
    input 224 + fc2 input 56)."""
    kw = dict(mbs=1, seq=8192, tp=4, sp=True, recompute=0, stores_scores=False)
    mib = 2 ** 20
    assert float(layer_activation_bytes(LLAMA70, precision="bf16", **kw)) / mib == 536.5
    assert float(layer_activation_bytes(LLAMA70, precision="fp8", **kw)) / mib == 464.5


def test_score_storing_backend_fp8_proj_input():
    """With the local/unfused backend nothing but linear_proj keeps the context: FP8 saves
    2 - q bytes a value on it, in either recompute mode."""
    model = _llama_like(4096, 32, 8, 14336, 2048)
    X, h, f, t = 2048, 4096, 14336, 2
    for rc in (0, 1):
        kw = dict(mbs=1, seq=2048, tp=t, sp=True, recompute=rc, stores_scores=True)
        diff = float(layer_activation_bytes(model, precision="bf16", **kw)
                     - layer_activation_bytes(model, precision="fp8", **kw))
        assert diff == pytest.approx(2 * X * h / t + X * f / t + X * h / t, rel=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_flash_selective_vs_none(shape, precision):
    """Selective recompute of a flash kernel's core attention keeps the checkpoint's inputs;
    without it the kernel keeps contiguous Q, K, V (TE ``get_qkv_layout`` copies the strided
    V), its 16-bit output and the LSE. Exactly: selective - none = (M - V) - LSE - [FP8: the
    kernel's output], where M - V (the Q and K parts of the QKV output) stays pinned because
    V, a view of M, is saved (``CheckpointFunction.forward``: ``save_for_backward(*args)``).
    Selective never adds more than M - V; with learned positions and MHA (Q, K, V all views of
    M) it keeps at most what the kernel keeps."""
    h, a, g, f, s, b, t, sp = shape
    for rope in (True, False):
        model = _llama_like(h, a, g, f, s, rope=rope)
        kw = dict(mbs=b, seq=s, tp=t, sp=sp, stores_scores=False, precision=precision)
        none = float(layer_activation_bytes(model, recompute=0, **kw))
        sel = float(layer_activation_bytes(model, recompute=1, **kw))
        X, d = s * b, h // a
        q_part = 2 * X * a * d / t
        k_part = 2 * X * d * max(g, t) / t
        lse = 4 * a * X / t
        kernel_out = 2 * X * h / t if precision == "fp8" else 0.0
        new_q = q_part * (rope or g < a)        # RoPE's output, or GQA's reshape copy
        new_k = k_part * rope
        assert sel - none == pytest.approx(new_q + new_k - lse - kernel_out, rel=1e-9)
        assert sel - none <= q_part + k_part
        if not rope and g == a:
            assert sel <= none


def test_flash_selective_never_above_none_when_qkv_are_views():
    """Grid over shapes of MHA with learned positions: selective <= none, by the LSE (and
    the kernel's output under FP8), for every tp, sp, sequence and precision."""
    for h, a in ((1024, 16), (4096, 32), (12288, 96)):
        model = _llama_like(h, a, a, 4 * h, 4096, rope=False)
        for t in (1, 2, 8):
            for s in (512, 4096):
                for prec in ("bf16", "fp16", "fp8", "mxfp8"):
                    kw = dict(mbs=2, seq=s, tp=t, sp=t > 1, stores_scores=False, precision=prec)
                    none = layer_activation_bytes(model, recompute=0, **kw)
                    sel = layer_activation_bytes(model, recompute=1, **kw)
                    assert float(sel) < float(none)


def test_fp8_weight_copies():
    """bf16 weights plus TE's cached FP8 workspace of every GEMM weight (row-wise + FP8
    transpose on Hopper: 2 bytes; 1 on Blackwell; MXFP8 2·33/32); embedding and output
    layer get none. ``--fp8-param-gather`` drops the 16-bit copy of the GEMM weights. A GPU
    that runs FP8 GEMMs in any layout is the exception: ``held_memory`` assumes Hopper's
    two bytes unless told."""
    assert fp8_weight_bytes("bf16") == fp8_weight_bytes("fp16") == 0.0
    assert fp8_weight_bytes("fp8") == 2.0
    assert fp8_weight_bytes("fp8", non_tn_fp8_gemm=True) == 1.0
    # a per-tensor scale serves either layout on Blackwell; 1x128 block scales run along the
    # reduction dimension, so a blockwise weight keeps its column-wise copy there too
    assert fp8_weight_bytes("fp8", non_tn_fp8_gemm=True, fp8_recipe="tensorwise") == 1.0
    assert fp8_weight_bytes("fp8", non_tn_fp8_gemm=True, fp8_recipe="blockwise") == 2.0
    assert fp8_weight_bytes("mxfp8") == 2 * 33 / 32
    model = MODEL_PRESETS["llama3-8b"]
    kw = dict(tp=2, pp=2, dp=4, cp=1, vp=1, mbs=1, global_batch_size=32, recompute="none",
              sequence_parallel=True, distributed_optimizer=True, fp8_param_gather=False)
    for stage in (0, 1):
        params = float(stage_parameters(model, 2, 2, stage))
        non_gemm = float(stage_non_gemm_parameters(model, 2, 2, stage))
        gemm = params - non_gemm
        assert gemm == pytest.approx(float(dense_layer_parameters(model, 2)) * 16)
        w = {p: float(memory_arrays(model, PlanBatch.of(precision=p, **kw),
                                    stage)["parameters_bytes"][0])
             for p in ("bf16", "fp8", "mxfp8")}
        assert w["bf16"] == pytest.approx(2 * params)
        assert w["fp8"] == pytest.approx(2 * params + 2 * gemm)
        assert w["mxfp8"] == pytest.approx(2 * params + 2 * 33 / 32 * gemm)
        gather = memory_arrays(model, PlanBatch.of(**{**kw, "precision": "fp8",
                                                      "fp8_param_gather": True}),
                               stage)["parameters_bytes"]
        assert float(gather[0]) == pytest.approx(2 * non_gemm + 2 * gemm)
        blackwell = memory_arrays(model, PlanBatch.of(precision="fp8", **kw), stage,
                                  non_tn_fp8_gemm=True)["parameters_bytes"]
        assert float(blackwell[0]) == pytest.approx(2 * params + gemm)
        held = held_memory(model, PlanBatch.of(precision="fp8", **kw), stage)
        assert float(held["parameters_bytes"][0]) == pytest.approx(2 * params + 2 * gemm)


RECIPE = dict(tp=4, pp=8, dp=2, cp=1, vp=5, mbs=1, global_batch_size=128,
              sequence_parallel=True, distributed_optimizer=True, precision="fp8",
              fp8_param_gather=False)


def test_recipe_inflight_interleaved():
    """Rank 0 of pp 8, vp 5 holds 2·(pp-1) + (vp-1)·pp + 1 = 47 chunks of 2 layers
    (megatron/core/pipeline_parallel/schedules.py ``get_pp_rank_microbatches``:
    num_warmup_microbatches + 1), i.e. 80·(1 + 7/40) = 94 layer-microbatches, as Megatron's
    theoretical_memory_usage.py interleaved penalty."""
    n = inflight_layers(80, pp=8, vp=5, num_microbatches=64, stage=0)
    assert float(n) == 94 == 80 * (1 + 7 / 40)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_llama3_70b_fp8_recipe_fits_h100(recompute):
    """Megatron-Bridge runs this on 64 H100 80 GB with ``bf16_with_fp8_current_scaling_mixed``
    (``fp8_param_gather=True``) and ``grad_reduce_in_fp32=False`` (perf_recipes/_common.py
    ``_perf_precision``): it fits with room for the allowances. With Megatron-LM's defaults
    (fp32 main grads, 16-bit weights plus TE's FP8 workspace) the same shape is at the
    capacity; the difference is exactly those two terms."""
    recipe = float(peak_memory(LLAMA70, PlanBatch.of(**{
        **RECIPE, "recompute": recompute, "fp8_param_gather": True,
        "grad_reduce_in_bf16": True}))[0])
    assert recipe < H100_BYTES - 4 * GiB
    plain = float(peak_memory(LLAMA70, PlanBatch.of(recompute=recompute, **RECIPE))[0])
    params = float(stage_parameters(LLAMA70, 4, 8, 0))
    gemm = params - float(stage_non_gemm_parameters(LLAMA70, 4, 8, 0))
    assert plain - recipe == pytest.approx(2 * params + 2 * gemm, rel=1e-9)
    assert plain < 1.01 * H100_BYTES
    # bf16 control: the FP8 activations and weights are below bf16's in total
    bf16 = float(peak_memory(LLAMA70, PlanBatch.of(recompute=recompute, **{
        **RECIPE, "precision": "bf16"}))[0])
    assert plain < bf16


def test_fp8_stage_activations_vectorised():
    """FP8 terms broadcast over arrays of plans like the 16-bit ones."""
    tp = np.array([1, 2, 4, 8])
    rc = np.array([0, 1, 2, 1])
    sp = np.array([False, True, True, True])
    at = StagePosition(pp=4, vp=1, num_microbatches=8, stage=0)
    x = LayerInputs(mbs=1, seq=8192, stores_scores=False, precision="fp8")
    batch = stage_activation_bytes(LLAMA70, x.replace(tp=tp, recompute=rc, sp=sp), at)
    for i in range(len(tp)):
        one = stage_activation_bytes(LLAMA70, x.replace(tp=tp[i], recompute=rc[i], sp=sp[i]),
                                     at)
        assert float(batch[i]) == pytest.approx(float(one), rel=1e-12)


def test_fp8_param_gather_plan_field_makes_the_recipe_fit():
    """The plan field ``fp8_param_gather`` (Megatron ``--fp8-param-gather``, on by default as
    NeMo's and Megatron-Bridge's FP8 presets set it): ``estimate`` of the Megatron-Bridge
    Llama-3 70B FP8 shape on 64 H100 fits with the default and with the flag, not with
    ``--no-fp8-param-gather``; it drops 2 bytes per GEMM weight, only with FP8 and the
    distributed optimizer (Megatron requires it), and the launch flags carry it."""
    import json

    from tests.conftest import run_cli

    argv = ("estimate", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--nodes", "8",
            "--gbs", "128", "--tp", "4", "--pp", "8", "--vp", "5", "--mbs", "1",
            "--precision", "fp8", "--json")
    out = {}
    for extra in (("--no-fp8-param-gather",), ("--fp8-param-gather",), (),
                  ("--fp8-param-gather", "--no-distributed-optimizer")):
        res = run_cli(*argv, *extra)
        assert res.returncode == 0, res.stderr
        out[extra] = json.loads(res.stdout)
    plain, gather, default, no_dopt = out.values()
    assert not plain["fits"] and gather["fits"]
    assert default["config"]["fp8_param_gather"] is True
    assert default["memory_per_stage"] == gather["memory_per_stage"]
    params = float(stage_parameters(LLAMA70, 4, 8, 0))
    gemm = params - float(stage_non_gemm_parameters(LLAMA70, 4, 8, 0))
    stage0 = {k: d["memory_per_stage"][0]["parameters_bytes"] for k, d in out.items()}
    off = ("--no-fp8-param-gather",)
    assert stage0[off] - stage0[("--fp8-param-gather",)] == pytest.approx(2 * gemm, rel=1e-9)
    assert no_dopt["config"]["fp8_param_gather"] is True
    assert no_dopt["memory_per_stage"][0]["parameters_bytes"] == stage0[off]
    bf16 = run_cli(*argv[:-3], "--precision", "bf16", "--fp8-param-gather", "--json")
    plain16 = run_cli(*argv[:-3], "--precision", "bf16", "--no-fp8-param-gather", "--json")
    assert json.loads(bf16.stdout)["memory_per_stage"] == json.loads(
        plain16.stdout)["memory_per_stage"]


def test_blackwell_presets_keep_no_fp8_weight_transpose():
    """B200, B300, GB200 and GB300 run FP8 GEMMs in any layout (TE
    ``is_non_tn_fp8_gemm_supported``), Hopper TN only: the same FP8 plan holds one byte less
    per GEMM weight on Blackwell, in the search's vectorised memory and in estimate's alike;
    a custom GPU says so in its file."""
    from configurator.core.plan_batch import PlanBatch
    from configurator.core.errors import InputError
    from configurator.core.plan import ParallelPlan
    from configurator.search.evaluate import evaluate_plan
    from topology.cluster_files import load_cluster
    from topology.gpus import GPU_PRESETS, gpu_from_config

    assert {n for n, g in GPU_PRESETS.items() if g.non_tn_fp8_gemm} == {
        "b200-180gb", "b300-288gb", "gb200-186gb", "gb300-288gb"}
    model = MODEL_PRESETS["llama3-8b"]
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8,
                        precision="fp8", distributed_optimizer=True)
    gemm = float(stage_parameters(model, 1, 1, 0) - stage_non_gemm_parameters(model, 1, 1, 0))
    hopper, blackwell = (GPU_PRESETS[n] for n in ("h100-80gb", "b200-180gb"))
    c = PlanBatch.from_plan(plan)
    assert float(peak_memory(model, c, non_tn_fp8_gemm=hopper.non_tn_fp8_gemm)[0]
                 - peak_memory(model, c, non_tn_fp8_gemm=blackwell.non_tn_fp8_gemm)[0]) \
        == pytest.approx(gemm)
    b200 = evaluate_plan(model, load_cluster("dgx-b200-180gb", 1), plan)
    assert b200.peak_memory_bytes == pytest.approx(
        float(peak_memory(model, c, non_tn_fp8_gemm=blackwell.non_tn_fp8_gemm)[0]))
    custom = {"name": "x", "peak_tflops": {"bf16": 100, "fp8": 200}, "memory_GiB": 80,
              "hbm_bandwidth_GBps": 1000, "num_sms": 100, "non_tn_fp8_gemm": True,
              "efficiency": {"gemm": 0.7, "gemm_fp8": 0.6, "hbm": 0.8, "flash_attention": 0.5}}
    assert gpu_from_config(custom).non_tn_fp8_gemm
    with pytest.raises(InputError, match="non_tn_fp8_gemm"):
        gpu_from_config({**custom, "non_tn_fp8_gemm": "maybe"})
