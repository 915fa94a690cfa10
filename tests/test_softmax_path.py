"""The softmax of score-storing attention (``local``, ``unfused``): where the fused kernel runs
and what PyTorch's fallback costs (configurator/core/plan_terms.py ``softmax_path``,
configurator/cost/compute.py ``SOFTMAX_SCORE_BYTES``, memory_model/activations.py
``_score_bytes``)."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from configurator.core.megatron_log import runs_from_megatron_log
from configurator.core.model_presets import load_model
from configurator.core.plan import ParallelPlan
from configurator.core.plan_batch import PlanBatch
from configurator.core.plan_terms import softmax_path
from configurator.cost.compute import SOFTMAX_KERNELS, SOFTMAX_SCORE_BYTES, layer_costs
from launchers.megatron_flags import flag_argv, megatron_flags
from memory_model.activations import LayerInputs, _score_bytes, layer_terms
from topology.cluster_files import load_cluster

MODEL = load_model("gpt-1.7b")        # 24 heads, hidden 2304, seq 2048, attention dropout 0.1
GPU = load_cluster("dgx-h200-141gb", nodes=1).gpu


def _apex_batch_per_block(sq, sk, b, np_):
    """Apex's ``get_batch_per_block`` (csrc/megatron/scaled_masked_softmax.h), which
    megatron-core's ``is_kernel_available`` calls: 128 threads a block, warps of
    ``min(next power of two of sk, 32)`` threads, two rows a warp up to 128 keys."""
    pow2 = 1 << max(int(sk) - 1, 0).bit_length()
    warp = min(pow2, 32)
    return (128 // warp) * (2 if pow2 <= 128 else 1)


def test_the_shape_rule_is_megatron_cores_own(monkeypatch):
    """Every shape a grid of micro-batch sizes, heads per rank and lengths gives: the fused
    path where megatron-core 0.16.1's own ``FusedScaleMaskSoftmax.is_kernel_available``
    (the CUDA extension's rows per block stood in by Apex's formula) says the kernel runs."""
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType

    monkeypatch.setattr(FusedScaleMaskSoftmax, "get_batch_per_block",
                        staticmethod(_apex_batch_per_block))
    ref = FusedScaleMaskSoftmax(input_in_fp16=False, input_in_bf16=True,
                                attn_mask_type=AttnMaskType.causal,
                                scaled_masked_softmax_fusion=True, mask_func=None,
                                softmax_in_fp32=False, scale=None)
    checked = {True: 0, False: 0}
    for mbs in (1, 2, 3, 4):
        for heads, tp in ((24, 8), (24, 4), (24, 2), (16, 8), (16, 4), (32, 8)):
            for s in (12, 20, 64, 100, 128, 136, 2048, 2050, 4096, 4100, 8192):
                c = SimpleNamespace(attention_backend="local", mbs=np.array([mbs]),
                                    tp=np.array([tp]), masked_softmax_fusion=True,
                                    attention_softmax_in_fp32=False)
                fused, fp32 = softmax_path(c, heads, s, s)
                want = ref.is_kernel_available(None, mbs, heads // tp, s, s)
                assert bool(fused[0]) == want, (mbs, heads, tp, s)
                assert not fp32[0]
                checked[want] += 1
    assert min(checked.values()) > 50          # both paths well covered


def test_the_flag_and_the_fp32_switch():
    """``--no-masked-softmax-fusion`` sends every shape to PyTorch, in FP32 with
    ``--attention-softmax-in-fp32``; Transformer Engine's ``unfused`` backend ignores both
    (its own kernel up to 16,383 keys, FP32 where it falls back)."""
    def path(**kw):
        c = SimpleNamespace(**dict(dict(attention_backend="local", mbs=np.array([4]),
                                        tp=np.array([1]), masked_softmax_fusion=True,
                                        attention_softmax_in_fp32=False), **kw))
        fused, fp32 = softmax_path(c, 24, 2048, 2048)
        return bool(fused[0]), bool(fp32[0])

    assert path() == (True, False)
    assert path(attention_softmax_in_fp32=True) == (True, False)
    assert path(masked_softmax_fusion=False) == (False, False)
    assert path(masked_softmax_fusion=False, attention_softmax_in_fp32=True) == (False, True)
    assert path(attention_backend="unfused", masked_softmax_fusion=False) == (True, False)
    c = SimpleNamespace(attention_backend="unfused", mbs=np.array([4]), tp=np.array([1]),
                        masked_softmax_fusion=True, attention_softmax_in_fp32=False)
    assert [tuple(map(bool, (f[0], t[0]))) for f, t in
            (softmax_path(c, 24, s, s) for s in (8192, 16376, 16384))] == [
        (True, False), (True, False), (False, True)]


def _plans(**kw):
    return PlanBatch.from_plans([ParallelPlan(tp=1, pp=1, dp=1, micro_batch_size=4,
                                              global_batch_size=8, attention_backend="local",
                                              **kw)])


@pytest.mark.parametrize("kw, name", [(dict(masked_softmax_fusion=False), "torch"),
                                      (dict(masked_softmax_fusion=False,
                                            attention_softmax_in_fp32=True), "torch_fp32")])
def test_the_fallback_adds_its_bytes_and_kernels(kw, name):
    """PyTorch's softmax costs the layer its bytes per score over the fused kernel's at the
    attained HBM bandwidth, and its kernels' launch overheads, forward and (twice the
    launches) backward; nothing else moves."""
    fused = layer_costs(MODEL, _plans(), GPU)
    torch = layer_costs(MODEL, _plans(**kw), GPU)
    scores = 4 * MODEL.num_attention_heads * MODEL.seq_length ** 2
    eff = GPU.efficiency
    per_byte = scores / (GPU.hbm_bandwidth_Bps * eff.hbm)
    kernels = SOFTMAX_KERNELS[name] - SOFTMAX_KERNELS["fused"]
    (f0, b0), (f1, b1) = SOFTMAX_SCORE_BYTES["fused"], SOFTMAX_SCORE_BYTES[name]
    assert float(torch["fwd"][0] - fused["fwd"][0]) == pytest.approx(
        (f1 - f0) * per_byte + kernels * eff.kernel_overhead_s, rel=1e-9)
    assert float(torch["bwd"][0] - fused["bwd"][0]) == pytest.approx(
        (b1 - b0) * per_byte + 2 * kernels * eff.kernel_overhead_s, rel=1e-9)
    # selective recompute re-runs the core attention, softmax included
    sel = dict(kw, recompute="selective")
    assert float(layer_costs(MODEL, _plans(**sel), GPU)["recompute"][0]
                 - layer_costs(MODEL, _plans(recompute="selective"), GPU)["recompute"][0]
                 ) == pytest.approx(float(torch["fwd"][0] - fused["fwd"][0]), rel=1e-9)


def test_softmax_bytes_are_the_passes_counted():
    """``SOFTMAX_SCORE_BYTES`` recounted from the passes its comment lists (bytes read and
    written per score): the fused kernel reads and writes 16-bit scores (backward twice
    that); PyTorch's masked fill and softmax in 16 bits, backward the softmax's gradient
    (gradient and output read, gradient written) and the masked fill's; in FP32 the same
    passes at 4 bytes between a cast up (read 2, write 4) and a cast back (read 4, write 2),
    backward with both casts' gradients."""
    def passes(*rw):
        return float(sum(r + w for r, w in rw))

    def torch_path(n):          # n bytes per score inside the softmax's passes
        fwd = passes((n, n), (n, n))                       # masked fill, softmax
        bwd = passes((2 * n, n), (n, n))                   # softmax grad, masked fill grad
        return fwd, bwd

    cast_f, cast_b = passes((2, 4), (4, 2)), passes((2, 4), (4, 2))
    t32_f, t32_b = torch_path(4)
    assert SOFTMAX_SCORE_BYTES == {"fused": (passes((2, 2)), 2 * passes((2, 2))),
                                   "torch": torch_path(2),
                                   "torch_fp32": (t32_f + cast_f, t32_b + cast_b)}
    assert SOFTMAX_KERNELS == {"fused": 1, "torch": 2, "torch_fp32": 2 + 2}


def test_fp32_softmax_keeps_its_fp32_output():
    """Where PyTorch's softmax runs in FP32 it keeps its FP32 output for backward: 2 bytes a
    score more than the 16-bit output (with dropout, whose output the GEMM with V keeps)."""
    scores = 4 * MODEL.num_attention_heads * 2048 ** 2
    assert MODEL.attention_dropout > 0
    fp32 = dict(masked_softmax_fusion=False, attention_softmax_in_fp32=True)
    for recompute, layer, working in (("none", 2, 0), ("selective", 0, 2), ("full", 2, 2)):
        t32 = layer_terms(MODEL, LayerInputs.of_plans(MODEL, _plans(recompute=recompute,
                                                                     **fp32)))
        t16 = layer_terms(MODEL, LayerInputs.of_plans(MODEL, _plans(
            recompute=recompute, masked_softmax_fusion=False)))
        assert float(t32["layer"][0] - t16["layer"][0]) == pytest.approx(layer * scores)
        assert float(t32["working"][0] - t16["working"][0]) == pytest.approx(working * scores)
    x = LayerInputs.of_plans(MODEL, _plans(**fp32))
    assert bool(np.asarray(x.softmax_fp32).ravel()[0])
    x = LayerInputs.of_plans(MODEL, _plans(attention_softmax_in_fp32=True))   # fused
    assert not bool(np.asarray(x.softmax_fp32).ravel()[0])
    # and the same layer without dropout keeps 4 bytes a score more (its 16-bit cast too)
    plain = dataclasses.replace(MODEL, attention_dropout=0.0)
    assert float(_score_bytes(plain, 2048, 4, 1, True)) == pytest.approx(6 * scores)
    assert float(_score_bytes(plain, 2048, 4, 1)) == pytest.approx(2 * scores)


def test_launch_scripts_and_logs_carry_the_fields():
    """The launch flags say what the plan says, and a Megatron log's argument dump gives the
    plan back: the one-GPU trial's logs ran without the fused softmax (no Apex)."""
    plan = ParallelPlan(tp=1, pp=1, dp=1, micro_batch_size=4, global_batch_size=8,
                        attention_backend="local", masked_softmax_fusion=False,
                        attention_softmax_in_fp32=True)
    argv = flag_argv(megatron_flags(MODEL, plan))
    assert "--no-masked-softmax-fusion" in argv and "--attention-softmax-in-fp32" in argv
    argv = flag_argv(megatron_flags(MODEL, ParallelPlan(
        tp=1, pp=1, dp=1, micro_batch_size=4, global_batch_size=8, attention_backend="local")))
    assert "--no-masked-softmax-fusion" not in argv and "--attention-softmax-in-fp32" not in argv
    tarball = Path(__file__).parent / "data" / "trial_gpu" / "logs.tar.gz"
    with tarfile.open(tarball) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("trial1.log"))
        text = io.TextIOWrapper(tar.extractfile(member), encoding="utf-8").read()
    run, = runs_from_megatron_log(text, cluster="dgx-h200-141gb")
    assert run.plan.masked_softmax_fusion is False
    assert run.plan.attention_softmax_in_fp32 is False
