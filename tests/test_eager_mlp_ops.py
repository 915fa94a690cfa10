"""GPT-OSS's eager operations in megatron-core.

* The fc2 bias of biased experts (``add_bias_linear``): ``TEGroupedMLP._apply_bias`` adds
  each local expert's bias, weighted by its FP32 router probability, outside the grouped
  GEMM.
* The clamp of a gated MLP's inputs (``activation_func_clamp_value``):
  ``weighted_bias_quick_geglu_impl`` clamps both halves of the fc1 output and concatenates
  them in eager ops before its fused activation, and the clamps keep the unclamped output
  for backward.
* YaRN RoPE (``yarn_rotary_scaling_factor``): its concentration factor scales cos and sin,
  which Transformer Engine's fused RoPE does not take, so ``apply_rotary_pos_emb`` rotates q
  and k in eager ops.

Each costs exactly its HBM bytes and kernels; a model without them pays nothing."""

from __future__ import annotations

import dataclasses
import math
import types

import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.plan_terms import ROUTER_LOAD_CV
from configurator.cost.compute import layer_costs
from configurator.cost.host_ops import (CLAMP_BYTES, CLAMP_KERNELS, EAGER_BYTES_PER_SM_S,
                                        EXPERT_BIAS_BYTES, EXPERT_BIAS_KERNELS,
                                        HOST_BACKWARD_FACTOR, UNFUSED_ROPE_BYTES,
                                        UNFUSED_ROPE_KERNELS, eager_s)
from memory_model.activations import (LayerInputs, layer_activation_bytes,
                                      moe_mlp_activation_delta)
from topology.cluster_files import load_cluster

OSS = MODEL_PRESETS["gpt-oss-120b"]
PLAN = ParallelPlan(tp=1, pp=4, dp=16, ep=8, etp=1, micro_batch_size=1,
                    global_batch_size=1280, distributed_optimizer=True)


def _costs(model, precision="bf16"):
    gpu = load_cluster("dgx-h100-80gb").gpu
    lc = layer_costs(model, PlanBatch.from_plan(dataclasses.replace(PLAN,
                                                                      precision=precision)),
                     gpu)
    return {k: float(lc[k][0]) if hasattr(lc[k], "__len__") else float(lc[k])
            for k in ("moe_fwd", "moe_bwd", "fwd", "bwd", "moe_host", "tokens_routed",
                      "main_grad_acc", "moe_main_grad_acc")}, gpu


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_bias_adds_its_bytes_and_kernels_and_nothing_else(precision):
    biased, gpu = _costs(OSS, precision)
    plain, _ = _costs(dataclasses.replace(OSS, add_bias_linear=False), precision)
    eff = gpu.efficiency
    elements = biased["tokens_routed"] * OSS.hidden_size        # R x h, the fc2 output
    local = OSS.num_experts / PLAN.ep                             # 16 local experts
    # the biases' own gradients are accumulated into main_grad too
    # (tests/test_main_grad_accumulation.py): set apart here
    for cost in (biased, plain):
        cost["moe_bwd"] -= cost["moe_main_grad_acc"]
        cost["bwd"] -= cost["main_grad_acc"]
    assert biased["moe_main_grad_acc"] > plain["moe_main_grad_acc"]
    for key, i in (("moe_fwd", 0), ("moe_bwd", 1)):
        want = (EXPERT_BIAS_BYTES[i] * elements
                / (EAGER_BYTES_PER_SM_S * gpu.num_sms)
                + (EXPERT_BIAS_KERNELS[i][0] * local + EXPERT_BIAS_KERNELS[i][1])
                * eff.kernel_overhead_s)
        assert biased[key] - plain[key] == pytest.approx(want, rel=1e-9)
    # the dense part of the layer and the routed tokens do not move
    assert (biased["fwd"], biased["bwd"]) == (plain["fwd"], pytest.approx(plain["bwd"],
                                                                          rel=1e-12))
    # (top-4 of 4096 tokens, on the busiest of 8 ranks of 128 experts under dropless routing;
    # GPT-OSS's router balances no micro-batch)
    imbalance = 1 + ROUTER_LOAD_CV["global"] * math.sqrt(2 * 8 * math.log(8) / 128)
    assert biased["tokens_routed"] == plain["tokens_routed"] == pytest.approx(
        4 * 4096 * imbalance, rel=1e-12)
    # the host issues the multiply and the add for every local expert
    assert biased["moe_host"] - plain["moe_host"] == pytest.approx(
        EXPERT_BIAS_KERNELS[0][0] * local * eff.host_op_s, rel=1e-9)
    assert HOST_BACKWARD_FACTOR == 0.87


def test_bias_bytes_sum_the_passes():
    """Forward: b·p (write 4), t + b·p (read 2 + 4, write 4), cat (read 4, write 4), cast
    (read 4, write 2); backward: the cast's gradient (read 2, write 4), the add's (read 4,
    write 2), the two products' gradients (multiply: read 4, write 4; sum: read 4; each),
    the inputs' gradients joined (read 2, write 2)."""
    assert EXPERT_BIAS_BYTES == (4 + (2 + 4 + 4) + (4 + 4) + (4 + 2),
                                 (2 + 4) + (4 + 2) + 2 * (4 + 4 + 4) + (2 + 2))


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_clamp_adds_its_bytes_and_kernels(precision):
    clamped, gpu = _costs(OSS, precision)
    plain, _ = _costs(dataclasses.replace(OSS, activation_func_clamp_value=None), precision)
    eff = gpu.efficiency
    routed = clamped["tokens_routed"] * 2 * OSS.moe_ffn_hidden_size    # R x 2f_e
    dense = 4096 * 2 * OSS.ffn_hidden_size                             # T x 2f (tp 1)
    for key, i, elements in (("moe_fwd", 0, routed), ("moe_bwd", 1, routed),
                             ("fwd", 0, dense), ("bwd", 1, dense)):
        want = (CLAMP_BYTES[i] * elements
                / (EAGER_BYTES_PER_SM_S * gpu.num_sms)
                + CLAMP_KERNELS[i] * eff.kernel_overhead_s)
        assert clamped[key] - plain[key] == pytest.approx(want, rel=1e-9), key


def test_clamp_bytes_sum_the_passes():
    """Forward: two clamps over the halves and the concatenation (read 2, write 2 each);
    backward, per element of either half: the two-sided clamp's gradient (two compares
    writing 1-byte masks, their and, the where: 14) and the one-sided one's (a compare and
    the where: 8), then the halves' gradients joined (read 2, write 2)."""
    two_sided = (2 + 1) + (2 + 1) + (1 + 1 + 1) + (1 + 2 + 2)
    one_sided = (2 + 1) + (1 + 2 + 2)
    assert CLAMP_BYTES == ((2 + 2) + (2 + 2), (two_sided + one_sided) / 2 + (2 + 2))


def _count_ops(torch, fn, grad):
    """``[(forward kernels, bytes), (backward kernels, bytes)]`` of ``fn()`` and its
    backward: every ATen operation that is not a view or an allocation, and the bytes of
    the tensors it reads and writes, recorded by a TorchDispatchMode."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    free = {"view", "_unsafe_view", "t", "transpose", "expand", "split", "split_with_sizes",
            "chunk", "slice", "select", "unsqueeze", "squeeze", "reshape", "alias", "detach",
            "as_strided", "permute", "unbind", "narrow", "empty", "empty_like",
            "empty_strided", "new_empty", "new_empty_strided", "scalar_tensor", "lift_fresh",
            "_local_scalar_dense"}

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.kernels, self.bytes = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ not in free:
                tensors = [t for t in tree_flatten((args, kwargs, out))[0]
                           if isinstance(t, torch.Tensor)]
                self.kernels += 1
                self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            return out

    fwd, bwd = Count(), Count()
    with fwd:
        out = fn()
    with bwd:
        out.backward(grad)
    return [(fwd.kernels, fwd.bytes), (bwd.kernels, bwd.bytes)]


def test_megatron_core_bias_moves_the_priced_bytes_on_the_cpu():
    """megatron-core's own ``TEGroupedMLP._apply_bias``, op by op: its kernels and bytes per
    routed output element are :data:`EXPERT_BIAS_KERNELS` and :data:`EXPERT_BIAS_BYTES`
    (the per-expert bias and probability vectors add well under 1 %)."""
    torch = pytest.importorskip("torch")
    experts = pytest.importorskip("megatron.core.transformer.moe.experts")
    local, per, h = 8, 256, 512
    rows = local * per
    inter = torch.randn(rows, h, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(rows, 1, dtype=torch.float32, requires_grad=True)
    biases = [torch.zeros(h, dtype=torch.bfloat16, requires_grad=True) for _ in range(local)]
    counted = _count_ops(torch, lambda: experts.TEGroupedMLP._apply_bias(
        inter, biases, [per] * local, probs), torch.randn(rows, h, dtype=torch.bfloat16))
    for (kernels, moved), (per_expert, once), priced in zip(counted, EXPERT_BIAS_KERNELS,
                                                            EXPERT_BIAS_BYTES):
        assert kernels == per_expert * local + once
        assert moved / (rows * h) == pytest.approx(priced, rel=0.01)


def test_megatron_core_clamp_moves_the_priced_bytes_on_the_cpu():
    """megatron-core's own ``weighted_bias_quick_geglu_impl`` with and without the clamp,
    op by op: the difference is :data:`CLAMP_KERNELS` kernels and :data:`CLAMP_BYTES` per
    fc1 output element."""
    torch = pytest.importorskip("torch")
    fused = pytest.importorskip("megatron.core.fusions.fused_bias_geglu")
    rows, ffn = 512, 256
    weights = torch.rand(rows, 1, dtype=torch.float32)
    grad = torch.randn(rows, ffn, dtype=torch.bfloat16)
    counted = {}
    for clamp in (None, 7.0):
        fc1_out = torch.randn(rows, 2 * ffn, dtype=torch.bfloat16, requires_grad=True)
        counted[clamp] = _count_ops(torch, lambda: fused.weighted_bias_quick_geglu_impl(
            fc1_out, None, weights, False, 1.0, clamp), grad)
    for i in range(2):
        assert counted[7.0][i][0] - counted[None][i][0] == CLAMP_KERNELS[i]
        assert ((counted[7.0][i][1] - counted[None][i][1]) / (rows * 2 * ffn)
                == pytest.approx(CLAMP_BYTES[i], rel=1e-4))   # + where's 0-d zero


def test_clamp_keeps_the_unclamped_fc1_output():
    """One more 16-bit copy of the fc1 output (2·gate bytes per token and FFN unit) in the
    dense MLP and in each routed copy's expert MLP."""
    plain = dataclasses.replace(OSS, activation_func_clamp_value=None)
    kw = dict(mbs=1, seq=4096, tp=1)
    extra = (layer_activation_bytes(OSS, sp=False, recompute=0, stores_scores=False, **kw)
             - layer_activation_bytes(plain, sp=False, recompute=0, stores_scores=False,
                                      **kw))
    assert extra == 4096 * OSS.ffn_hidden_size * 4
    x = LayerInputs(etp=1, sp=True, **kw)
    extra_moe = (moe_mlp_activation_delta(OSS, x) - moe_mlp_activation_delta(plain, x))
    routed = 4 * 4096                                   # top-4 copies of 4,096 tokens
    assert extra_moe == pytest.approx(routed * OSS.moe_ffn_hidden_size * 4 - extra)


def test_megatron_core_keeps_both_copies_on_the_cpu():
    """megatron-core's own ``weighted_bias_quick_geglu_impl`` on the CPU: the tensors it
    saves for backward hold the fc1 output once without a clamp and twice with one (the
    clamps' views of it and the concatenated copy)."""
    torch = pytest.importorskip("torch")
    fused = pytest.importorskip("megatron.core.fusions.fused_bias_geglu")
    rows, ffn = 64, 96
    fc1_out = torch.randn(rows, 2 * ffn, dtype=torch.bfloat16, requires_grad=True) * 1.0
    weights = torch.rand(rows, 1, dtype=torch.float32, requires_grad=True)
    held = {}

    def pack(t):
        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    saved = {}
    for clamp in (None, 7.0):
        held.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fused.weighted_bias_quick_geglu_impl(fc1_out, None, weights, False, 1.0, clamp)
        saved[clamp] = sum(n for n in held.values() if n >= fc1_out.numel() * 2)
    assert saved[None] == fc1_out.numel() * 2
    assert saved[7.0] == 2 * fc1_out.numel() * 2


def test_clamp_value_is_checked_and_read_from_hugging_face():
    from configurator.core.errors import InputError
    from configurator.core.hf_import import from_hf_config
    from configurator.core.model import make_model
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=100,
                seq_length=64)
    assert make_model(**base, swiglu=True,
                      activation_func_clamp_value=7).activation_func_clamp_value == 7.0
    for value, words in ((0, "positive"), (float("nan"), "positive"), ("7", "positive"),
                         (True, "positive")):
        with pytest.raises(InputError, match=words):
            make_model(**base, swiglu=True, activation_func_clamp_value=value)
    with pytest.raises(InputError, match="needs swiglu"):
        make_model(**base, activation_func_clamp_value=7.0)
    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 64,
           "num_local_experts": 4, "num_experts_per_tok": 2, "hidden_act": "silu",
           "swiglu_limit": 7.0}
    assert from_hf_config(cfg).activation_func_clamp_value == 7.0
    assert OSS.activation_func_clamp_value == 7.0


def test_eager_kernels_run_at_the_per_sm_rate_or_the_vectorised_one():
    """Latency-bound eager kernels scale with SMs: an H100 and an H200 (same 132 SMs) run them
    at the same rate though the H200's HBM is 43 % faster; a GPU whose vectorised rate is the
    lower (many SMs, slow HBM) runs them at that."""
    from configurator.cost.host_ops import eager_bandwidth_Bps
    from topology.gpus import GPU_PRESETS

    h100, h200 = GPU_PRESETS["h100-80gb"], GPU_PRESETS["h200-141gb"]
    assert eager_bandwidth_Bps(h100) == eager_bandwidth_Bps(h200) == 132 * EAGER_BYTES_PER_SM_S
    assert eager_bandwidth_Bps(h100) < h100.hbm_bandwidth_Bps * h100.efficiency.hbm
    wide = dataclasses.replace(h100, num_sms=1000)
    assert eager_bandwidth_Bps(wide) == h100.hbm_bandwidth_Bps * h100.efficiency.hbm


def test_megatron_core_falls_back_to_unfused_rope_for_yarn_and_moves_the_priced_bytes():
    """megatron-core's own ``apply_rotary_pos_emb`` with rope fusion on and GPT-OSS's
    concentration factor returns its eager ``_apply_rotary_pos_emb_bshd`` result, whose
    kernels per tensor and bytes per element are :data:`UNFUSED_ROPE_KERNELS` and
    :data:`UNFUSED_ROPE_BYTES` (the s·d cos/sin table adds under 1 % at 512 heads)."""
    torch = pytest.importorskip("torch")
    rope = pytest.importorskip("megatron.core.models.common.embeddings.rope_utils")
    assert OSS.rope_unfused and OSS.rope_mscale == pytest.approx(0.1 * math.log(32) + 1)
    s, b, h, d = 64, 1, 512, 64
    freqs = torch.randn(s, 1, 1, d)
    t = torch.randn(s, b, h, d, dtype=torch.bfloat16, requires_grad=True)
    # the TransformerConfig fields apply_rotary_pos_emb reads (a real one refuses rope fusion
    # without Transformer Engine, which the fallback under test never calls)
    cfg = types.SimpleNamespace(apply_rope_fusion=True, mrope_section=None,
                                rotary_interleaved=False, multi_latent_attention=False)
    with pytest.warns(UserWarning, match="mscale"):
        fused_asked = rope.apply_rotary_pos_emb(t, freqs, config=cfg, mscale=OSS.rope_mscale,
                                                cp_group=object())
    eager = rope._apply_rotary_pos_emb_bshd(t, freqs, mscale=OSS.rope_mscale)
    # the same eager function on the same inputs, compared within BF16 rounding: a sum of two
    # rounded BF16 products, so one unit in the last place of the largest summand absolutely
    # (2^-7 of it; the default absolute tolerance, 1e-5, failed an element that one run
    # rounded to 0 and another to 1 ulp, in a full-suite run of 039ad6b and in a mutation
    # bench run; isolated runs agree exactly). Without the concentration factor (x1.35) the
    # outputs differ far beyond that tolerance
    ulp = 2.0 ** -7 * float(t.detach().abs().max()) * OSS.rope_mscale
    torch.testing.assert_close(fused_asked, eager, rtol=1.6e-2, atol=ulp)
    assert not torch.allclose(fused_asked, rope._apply_rotary_pos_emb_bshd(t, freqs),
                              rtol=0.05, atol=0.05)
    counted = _count_ops(torch, lambda: rope._apply_rotary_pos_emb_bshd(
        t, freqs, mscale=OSS.rope_mscale), torch.randn(s, b, h, d, dtype=torch.bfloat16))
    for (kernels, moved), priced_kernels, priced in zip(counted, UNFUSED_ROPE_KERNELS,
                                                        UNFUSED_ROPE_BYTES):
        assert kernels == priced_kernels
        assert moved / t.numel() == pytest.approx(priced, rel=0.01)


def test_yarn_rope_adds_its_eager_bytes_kernels_and_host_operations():
    """Against the same model without YaRN (fused RoPE: 4 bytes per q/k element forward, 8
    backward, at the HBM rate): the eager RoPE's bytes and kernels on q and k, and 22 more
    host operations per layer (24 eager ones for the 2 fused)."""
    yarn, gpu = _costs(OSS)
    plain, _ = _costs(dataclasses.replace(OSS, yarn_rotary_scaling_factor=None))
    qk = 4096 * (OSS.num_attention_heads + OSS.num_query_groups) * OSS.kv_channels  # tp 1
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    for key, i, fused in (("fwd", 0, 4), ("bwd", 1, 8)):
        want = eager_s(UNFUSED_ROPE_BYTES[i] * qk, 2 * UNFUSED_ROPE_KERNELS[i], gpu) - \
            fused * qk / hbm
        assert yarn[key] - plain[key] == pytest.approx(want, rel=1e-9)
        assert yarn["moe_" + key] - plain["moe_" + key] == pytest.approx(want, rel=1e-9)
    assert yarn["moe_host"] - plain["moe_host"] == pytest.approx(
        (2 * UNFUSED_ROPE_KERNELS[0] - 2) * gpu.efficiency.host_op_s, rel=1e-9)
    llama = MODEL_PRESETS["llama3-8b"]
    assert not llama.rope_unfused and llama.rope_mscale == 1.0


def test_yarn_is_checked_and_read_from_hugging_face():
    from configurator.core.errors import InputError
    from configurator.core.hf_import import from_hf_config
    from configurator.core.model import make_model
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=100,
                seq_length=64)
    m = make_model(**base, position_embedding_type="rope", yarn_rotary_scaling_factor=32)
    assert m.yarn_rotary_scaling_factor == 32.0 and m.rope_unfused
    assert not make_model(**base, position_embedding_type="rope",
                          yarn_rotary_scaling_factor=1).rope_unfused      # factor 1: mscale 1
    for kw, words in ((dict(yarn_rotary_scaling_factor=32), "needs position_embedding_type"),
                      (dict(position_embedding_type="rope", yarn_rotary_scaling_factor=0),
                       "positive")):
        with pytest.raises(InputError, match=words):
            make_model(**base, **kw)
    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 64,
           "num_local_experts": 4, "num_experts_per_tok": 2, "hidden_act": "silu",
           "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32.0,
                                                  "original_max_position_embeddings": 4096}}
    assert from_hf_config(cfg).yarn_rotary_scaling_factor == 32.0
    llama3 = dict(cfg, model_type="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0})
    del llama3["num_local_experts"], llama3["num_experts_per_tok"]
    assert from_hf_config(llama3).yarn_rotary_scaling_factor is None
    with pytest.raises(InputError, match="rope_scaling.factor"):
        from_hf_config(dict(cfg, rope_scaling={"type": "yarn", "factor": "32"}))
    assert OSS.yarn_rotary_scaling_factor == 32.0
