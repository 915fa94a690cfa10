"""Exact values of the cost model's formulas (``configurator.cost``), each derived here by
hand from its cited source (Megatron-LM's and Transformer Engine's kernels as the module
docstrings count them, the published papers' and recipes' figures) on small inputs chosen
so that the term under test matters: score-storing, FP8 and sliding-window attention,
clamped and YaRN-rotated layers, the MoE MLP with a clamped shared expert, biased experts
and fused routing, the expert exchange inside one NVLink domain and its overlap, the host's
operations under CUDA graphs and around the dispatcher's sync, activation offloading,
multi-token prediction, the group figures, the rank holding the most parameters, FLOP
counts and the published rows.

A companion of ``tests/test_formulas_exact.py`` (whose small models these reuse);
``bench.quality.mutation`` runs both against every mutant of the cost modules."""

import dataclasses

import numpy as np
import pytest

from configurator.core.model import make_model
from configurator.core.plan import ParallelPlan
from configurator.core.plan_batch import PlanBatch
from configurator.cost.compute import layer_costs
from configurator.cost.gemm import gemm_time_s, main_grad_accumulation_s
from configurator.cost.iteration import expert_data_parallel_size
from tests.test_formulas_exact import GQA, H100, MLA_MOE, _candidates, _gqa_layer, _one, v_pad
from topology.cluster_files import load_cluster


def _gpu():
    return load_cluster(H100, nodes=1).gpu


def _eager_bw(gpu):
    """Eager element-wise kernels' rate: ``min(η·HBM, 14.7 GB/s per SM)`` (host_ops.py)."""
    return min(gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm, 14.7e9 * gpu.num_sms)


# ---------------------------------------------------------------- attention storing scores

@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_score_storing_attention_layer(dropout):
    """Megatron's own attention (``local``): per head the two batched GEMMs ``s×d·d×s`` and
    ``s×s·s×d`` (16-bit, ``b·a/t`` of them in one kernel), the softmax over the ``a·s²``
    scores (read and write 2 bytes each: 4), with dropout its mask and the dropped scores
    (5 more), the context's 4·T·a·d/t bytes and three kernels; backward twice that."""
    model = make_model(**(GQA | dict(attention_dropout=dropout)))
    gpu = _gpu()
    eff = gpu.efficiency
    a, d, s, b, t = 8, 32, 512, 2, 2
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True,
                    attention_backend="local")
    lc = layer_costs(model, c, gpu)
    heads = b * a / t
    kw16 = dict(batch=heads, peak=gpu.peak("bf16"), gpu=gpu, in_bytes=2.0, gemm_eff=eff.gemm)
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    scores = s * s * heads
    per_score = 4 + (5 if dropout else 0)
    attn = (gemm_time_s(s, s, d, **kw16) + gemm_time_s(s, d, s, **kw16)
            + per_score * scores / hbm + 4 * b * s * a * d / t / hbm + 3 * eff.kernel_overhead_s)
    assert _one(lc["attn_fwd"]) == pytest.approx(attn, rel=1e-12)
    assert _one(lc["attn_bwd"]) == pytest.approx(2 * attn, rel=1e-12)
    assert _one(lc["attn"]) == pytest.approx(3 * attn, rel=1e-12)


# ---------------------------------------------------------------- eager element-wise passes

def test_clamped_yarn_layer_prices_its_eager_clamp_and_rope():
    """GPT-OSS's eager passes on a Llama-layout layer: the gated MLP's clamp over the fc1
    output (T·2f/t elements: 8 bytes in 3 kernels forward, 15 in 7 backward) and YaRN's
    unfused RoPE over Q and K (T·(a+g)·d/t elements: 24 bytes and 2·12 kernels forward, 28
    and 2·7 backward) at the eager kernels' rate, replacing the fused RoPE's 4 bytes; the
    other passes as a fused layer's. The host issues the clamp's 3 and RoPE's 2·12 − 2 more
    operations; the ``mlp`` recompute re-runs the MLP's GEMMs, activation and clamp and the
    norm fused into fc1."""
    model = make_model(**(GQA | dict(activation_func_clamp_value=7.0,
                                     yarn_rotary_scaling_factor=32.0)))
    gpu = _gpu()
    eff = gpu.efficiency
    kov = eff.kernel_overhead_s
    h, a, g, d, f, s, b, t = 256, 8, 2, 32, 512, 512, 2, 2
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True)
    lc = layer_costs(model, c, gpu)
    T, kw = b * s, lc["gemm_kw"]
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    ebw = _eager_bw(gpu)
    mlp_gemms = gemm_time_s(T, 2 * f / t, h, **kw) + gemm_time_s(T, h, f / t, **kw)
    gemms = (gemm_time_s(T, (a + 2 * g) * d / t, h, **kw) + gemm_time_s(T, h, a * d / t, **kw)
             + mlp_gemms)
    attn = _one(lc["attn_fwd"])
    elem = (8 + 12) * T * h / t + 6 * T * f / t
    fc1_out, qk = T * 2 * f / t, T * (a + g) * d / t
    clamp_f, clamp_b = 8 * fc1_out / ebw + 3 * kov, 15 * fc1_out / ebw + 7 * kov
    rope_f, rope_b = 24 * qk / ebw + 24 * kov, 28 * qk / ebw + 14 * kov
    fwd = gemms + attn + elem / hbm + 10 * kov + clamp_f + rope_f
    acc = main_grad_accumulation_s(_gqa_layer(t), c, gpu, T)
    bwd = 2 * gemms + 2.5 * attn + 2 * elem / hbm + 20 * kov + clamp_b + rope_b + acc
    assert _one(lc["fwd"]) == pytest.approx(fwd, rel=1e-12)
    assert _one(lc["bwd"]) == pytest.approx(_one(bwd), rel=1e-12)
    op = eff.host_op_s
    assert _one(lc["host"]) == pytest.approx((40 + 3 + 22) * op, rel=1e-12)
    c_mlp = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True,
                        recompute="selective", recompute_modules="mlp")
    norm = 4 * T * h / t / hbm + kov     # the pre-MLP norm fused into fc1
    assert _one(layer_costs(model, c_mlp, gpu)["recompute"]) == pytest.approx(
        _one(mlp_gemms + 6 * T * f / t / hbm + clamp_f + norm), rel=1e-12)


# ---------------------------------------------------------------- expert-parallel exchanges

#: A DeepSeek-V3-shaped MoE model of 16 experts, top-2 (MLA_MOE without MTP).
MOE16 = {k: v for k, v in MLA_MOE.items() if k != "mtp_num_layers"} | dict(num_experts=16)


def _ring_all_gather(size, n, bw, lat):
    """Ring all-gather of a ``size``-byte gathered buffer over ``n`` ranks."""
    return 0.0 if n == 1 else (n - 1) * lat + (n - 1) / n * size / bw


def test_expert_exchange_inside_one_nvlink_domain_with_expert_tensor_parallelism():
    """One domain of 8 GPUs, ep 8: the NCCL all-to-all moves the rank's ``2·R·h/etp`` bytes,
    7/8 of them over NVLink, plus the etp all-gather of ``2·R·h``; the flex dispatcher sends
    nothing over the network (one domain) and over NVLink each token once per other rank
    its top-2 experts lie on: ``2·h·(R/k)·(n−1)·share`` with ``share = 1 − C(14,2)/C(16,2)``
    of the ranks reached (two experts a rank), at NVLink's latency and rate."""
    from configurator.cost.expert_comm import a2a_s

    model = make_model(**MOE16)
    h, k, R = 128, 2, 4096.0
    x = dict(ep_on_node=8, ep_intra_bw=400e9, ep_intra_lat=3e-6, ep_inter_bw=40e9,
             ep_inter_lat=8e-6, etp_bw=300e9, etp_lat=2e-6)
    lc = dict(tokens_routed=R)
    for etp in (1, 2):
        kw = dict(tp=etp, dp=8 // etp, ep=8, etp=etp, sequence_parallel=etp > 1,
                  distributed_optimizer=True, global_batch_size=64)
        nccl_bytes = 2 * R * h / etp
        gather = _ring_all_gather(2 * R * h, etp, 300e9, 2e-6)
        nccl = 3e-6 + 7 / 8 * nccl_bytes / 400e9
        got = a2a_s(model, lc, _candidates(model, **kw), x)
        assert _one(got) == pytest.approx(nccl + gather, rel=1e-12)
        flex = _candidates(model, moe_token_dispatcher_type="flex", **kw)
        nvl = 2 * h * (R / k) * 7 * (1 - 91 / 120)
        assert _one(a2a_s(model, lc, flex, x)) == pytest.approx(3e-6 + nvl / 400e9 + gather,
                                                                 rel=1e-12)


# ---------------------------------------------------------------- host operations

@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_local_layer_host_operations(tp):
    """Megatron's own layer (``local``), counted op by op from ParallelTransformerLayer
    (host_ops.py): attention 1 + 4 + 2 + 8 + 3 + 5 + 8 + 3 + 2 = 36 (norm, QKV, split,
    scores, softmax, dropout RNG, context, projection, bias-dropout-add), MLP 1 + 3 + 1 +
    3 + 2 = 10, plus one all-reduce in each with tp > 1; backward issues twice the forward's."""
    from configurator.cost.host_ops import host_layer_s, local_layer_ops

    gpu = _gpu()
    op = gpu.efficiency.host_op_s
    model = make_model(**GQA)
    c = _candidates(model, tp=tp, attention_backend="local", sequence_parallel=tp > 1)
    coll = 1 if tp > 1 else 0
    attn, mlp = local_layer_ops(c)
    assert (_one(attn), _one(mlp)) == (36 + coll, 10 + coll)
    dense, moe = host_layer_s(model, c, gpu)
    assert (_one(dense), _one(moe)) == pytest.approx(((46 + 2 * coll) * op,) * 2, rel=1e-12)


def test_optimizer_step_host_operations_per_parameter_tensor():
    """The optimizer step's host work: two operations per parameter tensor (the main
    gradient's cast and the norm's detach), on top of its HBM traffic (30 bytes per
    unsharded parameter plus the gradient pass: 34) and its 20 kernel launches."""
    from configurator.cost.host_ops import optimizer_host_s
    from configurator.cost.iteration import optimizer_s

    gpu = _gpu()
    eff = gpu.efficiency
    assert optimizer_host_s(50, gpu) == pytest.approx(100 * eff.host_op_s, rel=1e-12)
    c = _candidates(None)
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    want = 1e6 * 34 / hbm + 20 * eff.kernel_overhead_s + 2 * 50 * eff.host_op_s
    assert _one(optimizer_s(c, gpu, 1e6, 0.0, 50)) == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------- model FLOPs

def test_model_flops_of_a_dense_model_with_multi_token_prediction():
    """Megatron-LM ``num_floating_point_operations``: an MTP layer after a dense last layer
    is dense (``N_dense = L + D``), adds its attention, its norms and 2h→h projection
    ``3h + 2h²`` and one more logits GEMM: ``6·B·s·[h·3f·(L+1) + (L+1)·A + 3h + 2h² +
    2·h·V]`` with GQA's ``A = h·(a·d + 2·g·d) + a·d·s + a·d·h``."""
    from configurator.cost.flops import megatron_model_flops

    B, L, h, a, g, d, f, s = 4, 4, 256, 8, 2, 32, 512, 512
    V = v_pad(1000, 1)
    attn = h * (a * d + 2 * g * d) + a * d * s + a * d * h
    want = 6 * B * s * (h * 3 * f * (L + 1) + (L + 1) * attn + 3 * h + 2 * h * h + 2 * h * V)
    got = megatron_model_flops(make_model(**GQA, mtp_num_layers=1), B)
    assert got == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------- published plans

def test_deepseek_v3_pipeline_layouts_are_the_recipes():
    """Megatron-Bridge ``set_deepseek_v3_pipeline_model_parallel_layout``: 4 stages of 16,
    16, 16 and 13 decoder layers, 8 of 8 (the last 5), 16 of 4 (the last 1; the
    performance configurations' ``pp_layout`` "Et*4|(t*4|)*14tmL"), and the H100
    configuration's 32-stage "Et|(tt|)*30mL"; every layout holds DeepSeek-V3's 61 layers
    (the MTP layer and the loss on the last stage)."""
    from configurator.core.model_presets import MODEL_PRESETS
    from configurator.cost.groundtruth import BRIDGE_DEEPSEEK_V3_STAGES, bridge_layout

    recipe = {4: [16, 16, 16, 13], 8: [8] * 7 + [5], 16: [4] * 15 + [1],
              32: [1] + [2] * 30 + [0]}
    assert {k: list(v) for k, v in BRIDGE_DEEPSEEK_V3_STAGES.items()} == recipe
    model = MODEL_PRESETS["deepseek-v3"]
    assert model.num_layers == 61
    for stages, counts in recipe.items():
        assert len(counts) == stages and sum(counts) == 61
    assert bridge_layout(model, 16) == "Et*4|(t*4|)*14tmL"
    assert bridge_layout(model, 32) == "Et|(tt|)*30mL"
    assert bridge_layout(model, 4) == "Et*16|(t*16|)*2t*13mL"
    assert bridge_layout(MODEL_PRESETS["llama3-8b"], 4) == ""


# ---------------------------------------------------------------- context parallelism

def _cp_comm(on_node):
    return dict(cp_bw=100e9, cp_lat=2e-6, cp_hop_bw=50e9, cp_hop_lat=5e-6, cp_on_node=on_node,
                ep_intra_bw=80e9, ep_intra_lat=3e-6)


def test_cp_all_to_all_inside_one_domain_runs_at_the_cp_ring_figures():
    """``a2a`` with the whole cp group in one NVLink domain (``cp_on_node`` = cp = 4): the
    exchanges of Q, K, V and of the output at the cp ring's own NVLink figures, 3/4 of each
    buffer leaving the rank, one latency each, plus the reordering copies (read and write)
    and 4 kernels; backward the same. (Across domains, tests/test_formulas_exact.py.)"""
    from configurator.cost.iteration import cp_layer_s

    gpu = _gpu()
    kov = gpu.efficiency.kernel_overhead_s
    model = make_model(**GQA)
    T, a, g, d, tp, cp = 4096.0, 8, 2, 32, 2, 4
    lc = dict(tokens=T, attn_fwd=1e-3, attn_bwd=2e-3)
    kv = 2 * T * g * 2 * d / tp
    c = _candidates(model, tp=tp, cp=cp, cp_comm_type="a2a", global_batch_size=8)
    q, o = 2 * T * a * d / tp, 2 * T * a * d / tp
    moved = (2e-6 + 3 / 4 * (q + kv) / 100e9) + (2e-6 + 3 / 4 * o / 100e9)
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    want = moved + 4 * (q + kv + o) / hbm + 4 * kov
    fwd, bwd = cp_layer_s(model, lc, c, _cp_comm(4), gpu)
    assert (_one(fwd), _one(bwd)) == pytest.approx((want, want), rel=1e-12)


# ---------------------------------------------------------------- first and last stage

@pytest.mark.parametrize("fusion,ce", [("native", (22, 6)), ("te", (8, 14))])
def test_logits_and_fused_cross_entropy(fusion, ce):
    """The last stage's 16-bit logits GEMM ``T × h → V/t`` (2× backward, plus its weight
    gradient's accumulation) and the fused cross entropies' passes over the ``T·V/t``
    logits: Megatron's jit-fused one 22 bytes forward and 6 backward, Transformer Engine's
    8 and 14 (the eager one's 38 and 14: tests/test_formulas_exact.py)."""
    from configurator.cost.iteration import stage_extras_s

    gpu = _gpu()
    eff = gpu.efficiency
    model = make_model(**GQA)
    h, t, b, s = 256, 2, 2, 512
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True,
                    cross_entropy_fusion=fusion)
    lc = layer_costs(model, c, gpu)
    T, V = b * s, v_pad(1000, t)
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    x = stage_extras_s(model, c, gpu, lc, 100e9, 4e-6)
    kw16 = dict(batch=1.0, peak=gpu.peak("bf16"), gpu=gpu, in_bytes=2.0, gemm_eff=eff.gemm)
    gemm = gemm_time_s(T, V / t, h, **kw16)
    logits = T * V / t
    acc = _one(main_grad_accumulation_s(V / t * h, c, gpu, T))
    assert _one(x["logits_fwd"]) == pytest.approx(gemm + ce[0] * logits / hbm, rel=1e-12)
    assert _one(x["logits_bwd"]) == pytest.approx(2 * gemm + ce[1] * logits / hbm + acc,
                                                  rel=1e-12)


# ---------------------------------------------------------------- mixture-of-experts MLP

def test_moe_mlp_with_a_clamped_shared_expert_and_fused_routing():
    """An MoE MLP (tp 2, ep 4: X = T/2 tokens a rank, R = 2X routed copies over 2 local
    experts) whose gated MLPs clamp their fc1 outputs and with a shared expert: the grouped
    GEMMs (a fixed time for each of their 2 members), the 16-bit router GEMM X×h→E, the shared expert's GEMMs over the T gathered tokens
    and its activation (6 bytes of T·fs/t); the passes 4·(X·h + R·h) + 6·R·fe + 12·X·E; the
    clamps, each once, of the routed fc1 output (R·2fe elements) and the shared one's
    (T·2fs/t), 8 bytes in 3 kernels forward, 15 in 7 backward; 30 extra kernels less the
    router fusion's 15 − 3 and the permute fusion's 13 − 3. The shared expert's forward
    (what its recompute re-runs) holds its clamp; the host stops before dispatch after the
    attention's 23 operations and the router's 30 less the fusion's 12."""
    from configurator.cost.moe_compute import moe_host_before_sync_s, moe_mlp_costs

    E, k, fe, fs, h = 8, 2, 64, 128, 256
    model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe,
                       moe_shared_expert_intermediate_size=fs, activation_func_clamp_value=7.0)
    gpu = _gpu()
    eff = gpu.efficiency
    kov = eff.kernel_overhead_s
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    ebw = _eager_bw(gpu)
    tp, ep = 2, 4
    c = _candidates(model, moe_router_force_load_balancing=True,
                    tp=tp, dp=4, ep=ep, sequence_parallel=True, global_batch_size=8,
                    moe_router_fusion=True, moe_permute_fusion=True)
    kw = layer_costs(model, c, gpu)["gemm_kw"]
    T = 2048.0
    X, R = T / tp, k * T / tp
    got = moe_mlp_costs(model, c, gpu, T, kw)
    grouped = dict(kw, batch=E / ep)
    experts = (gemm_time_s(R * ep / E, 2 * fe, h, **grouped)
               + gemm_time_s(R * ep / E, h, fe, **grouped) + 2 * (E / ep - 1) * 10.7e-6)
    router = gemm_time_s(X, E, h, **dict(kw, peak=gpu.peak("bf16"), gemm_eff=eff.gemm,
                                         in_bytes=2.0))
    routed_f, routed_b = 8 * R * 2 * fe / ebw + 3 * kov, 15 * R * 2 * fe / ebw + 7 * kov
    shared_f, shared_b = (8 * T * 2 * fs / tp / ebw + 3 * kov,
                          15 * T * 2 * fs / tp / ebw + 7 * kov)
    shared = (gemm_time_s(T, 2 * fs / tp, h, **kw) + gemm_time_s(T, h, fs / tp, **kw)
              + 6 * T * fs / tp / hbm)
    elem = 4 * (X * h + R * h) + 6 * R * fe + 12 * X * E
    kernels = 30 - 12 - 10
    fwd = (experts + router + shared + elem / hbm + kernels * kov + routed_f + shared_f)
    assert _one(got["fwd"]) == pytest.approx(_one(fwd), rel=1e-12)
    assert _one(got["eager_fwd"]) == pytest.approx(routed_f + shared_f, rel=1e-12)
    assert _one(got["eager_bwd"]) == pytest.approx(routed_b + shared_b, rel=1e-12)
    assert _one(got["shared_fwd"]) == pytest.approx(_one(shared) + shared_f, rel=1e-12)
    assert _one(got["act_fwd"]) == pytest.approx(6 * R * fe / hbm + kov + routed_f, rel=1e-12)
    assert _one(got["experts_fwd"]) == pytest.approx(
        _one(experts) + 6 * R * fe / hbm + routed_f, rel=1e-12)
    assert _one(moe_host_before_sync_s(model, c, gpu)) == pytest.approx(
        (23 + 30 - 12 + 30) * eff.host_op_s, rel=1e-12)


def test_grouped_gemm_pays_the_fixed_time_of_every_gemm():
    """Transformer Engine's grouped GEMM issues one cuBLAS GEMM per group (over 4 streams,
    gemm.h ``num_streams = 4``, whose overlap was not measured): the batch's roofline plus
    10.7 µs for every GEMM after the first, as 16 expert GEMMs timed one after another take:
    1 group pays none beyond the batch's one, 4 three, 5 four, 16 fifteen, 64 sixty-three."""
    from configurator.cost.gemm import grouped_gemm_time_s

    gpu = _gpu()
    kw = dict(peak=gpu.peak("bf16"), gpu=gpu, in_bytes=2.0, gemm_eff=gpu.efficiency.gemm)
    groups = np.array([1.0, 4.0, 5.0, 16.0, 64.0])
    got = grouped_gemm_time_s(512.0, 1024.0, 2048.0, batch=groups, **kw)
    for g, extra, t in zip(groups, (0, 3, 4, 15, 63), got):
        assert t == pytest.approx(
            _one(gemm_time_s(512.0, 1024.0, 2048.0, batch=g, **kw)) + extra * 10.7e-6,
            rel=1e-12)


@pytest.mark.parametrize("fused", [False, True])
def test_moe_experts_over_many_local_experts(fused):
    """16 local experts (E 32 over ep 2): unfused, each grouped GEMM (fc1 h→2fe, fc2 fe→h)
    runs one GEMM per expert, 15 fixed times of 10.7 µs beyond the batch's roofline, with
    the SwiGLU's 6 bytes per routed fc1 element on its own; the op fuser's
    one kernel (``moe_fused_grouped_mlp``) pays the batch's roofline alone, the activation in
    its epilogue."""
    from configurator.cost.moe_compute import moe_mlp_costs

    E, k, fe, h = 32, 2, 64, 256
    model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe)
    gpu = _gpu()
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    c = _candidates(model, moe_router_force_load_balancing=True, dp=2, ep=2,
                    global_batch_size=8, moe_fused_grouped_mlp=fused)
    kw = layer_costs(model, c, gpu)["gemm_kw"]
    T = 2048.0
    R = k * T
    got = moe_mlp_costs(model, c, gpu, T, kw)
    grouped = dict(kw, batch=16.0)
    experts = (gemm_time_s(R / 16, 2 * fe, h, **grouped) + gemm_time_s(R / 16, h, fe, **grouped))
    want = _one(experts) + (0.0 if fused else 2 * 15 * 10.7e-6 + 6 * R * fe / hbm)
    assert _one(got["experts_fwd"]) == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------- FP8 attention, checkpoints

def test_fp8_dot_product_attention():
    """FP8 attention (``fp8_dot_product_attention``): the fused kernels at the FP8 peak with
    the 16-bit kernels' attained fraction (½ of 2·b·s²·a·2d/t causal pairs at η·s/(s + 1024)
    of the FP8 peak, plus a launch, the launch too divided by the FP8 speed-up as priced);
    forward quantises Q, K, V and casts the output back,
    ``T·((a + 2g)·d + a·d)/t`` elements, backward the output gradient too (``T·a·d/t`` more),
    3 bytes an element (delayed scaling, a row-wise copy only: Transformer Engine's
    attention quantizers ask for no column-wise one) at 0.39 of the raw HBM bandwidth;
    backward runs 2.5× the forward kernels."""
    model = make_model(**GQA)
    gpu = _gpu()
    eff = gpu.efficiency
    a, g, d, s, b, t = 8, 2, 32, 512, 2, 2
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True, precision="fp8",
                    fp8_recipe="delayed", fp8_dot_product_attention=True)
    lc = layer_costs(model, c, gpu)
    T = b * s
    rate = eff.flash_attention * s / (s + 1024.0)
    kernels = 0.5 * 2 * b * s * s * a * 2 * d / t / (gpu.peak("fp8") * rate)
    kov = eff.kernel_overhead_s * gpu.peak("bf16") / gpu.peak("fp8")
    qkv_o = T * ((a + 2 * g) * d + a * d) / t
    raw = gpu.hbm_bandwidth_Bps * 0.39
    assert _one(lc["attn_fwd"]) == pytest.approx(kov + kernels + 3 * qkv_o / raw, rel=1e-12)
    assert _one(lc["attn_bwd"]) == pytest.approx(
        2.5 * (kov + kernels) + 3 * (qkv_o + T * a * d / t) / raw, rel=1e-12)


def test_full_recompute_checkpoint_host_operations():
    """A full recompute's checkpoint around each layer (``CheckpointFunction``): the host
    reads the two RNG states forward (2 operations) and in backward reads and sets them,
    detaches the inputs, restores its states and calls backward (9); none without it."""
    from configurator.cost.host_ops import checkpoint_host_s

    gpu = _gpu()
    op = gpu.efficiency.host_op_s
    model = make_model(**GQA)
    full = _candidates(model, recompute="full")
    assert tuple(map(_one, checkpoint_host_s(full, gpu))) == pytest.approx((2 * op, 9 * op),
                                                                           rel=1e-12)
    assert tuple(map(_one, layer_costs(model, full, gpu)["host_checkpoint"])) == \
        pytest.approx((2 * op, 9 * op), rel=1e-12)
    assert tuple(map(_one, checkpoint_host_s(_candidates(model), gpu))) == (0.0, 0.0)


def test_selective_recompute_modules_issue_their_operations_again():
    """Selective recompute's host work (megatron-core 0.16.1): each module the layer runs
    issues its checkpoint's bookkeeping forward and its operations again in the backward,
    ``tensor_parallel.checkpoint`` (2, 9) for core attention, the dense MLP, the whole MoE
    MLP and the shared expert, ``CheckpointWithoutOutput`` (3, 10) for a norm, the experts'
    activation and MLA's up projections; what CUDA graphs capture costs nothing, ``moe``
    covers ``moe_act`` and ``shared_experts``, and a host-bound layer's recompute takes at
    least the re-run's host time."""
    from configurator.cost.host_ops import (HOST_OPS_DENSE, HOST_OPS_ATTN, moe_mlp_ops,
                                            selective_recompute_host_s)
    from configurator.cost.iteration import host_bound

    gpu = _gpu()
    op = gpu.efficiency.host_op_s
    dense = make_model(**GQA)

    def host(model, **kw):
        (f, b), (mf, mb) = selective_recompute_host_s(
            model, _candidates(model, recompute="selective", **kw), gpu)
        return tuple(_one(x) / op for x in (f, b, mf, mb))

    assert host(dense, recompute_modules="core_attn") == pytest.approx((2, 3 + 9) * 2)
    assert host(dense, recompute_modules="core_attn", attention_backend="local")[:2] == \
        pytest.approx((2, 8 + 3 + 5 + 8 + 9))
    mlp = HOST_OPS_DENSE - HOST_OPS_ATTN
    assert host(dense, recompute_modules="mlp")[:2] == pytest.approx((2, mlp + 9))
    # a dense GQA layer has no norm outside a linear and no up projections: nothing
    assert host(dense, recompute_modules="layernorm,mla_up_proj") == (0.0,) * 4
    assert host(dense, recompute_modules="mlp", cuda_graph_impl="transformer_engine",
                cuda_graph_scope="mlp")[:2] == (0.0, 0.0)
    c = _candidates(dense, recompute="full")
    assert tuple(map(_one, selective_recompute_host_s(dense, c, gpu)[0])) == (0.0, 0.0)

    moe = make_model(**MLA_MOE)     # MLA, 4 experts (ep 1), a shared expert
    kw = dict(tp=2, micro_batch_size=2, sequence_parallel=True)
    f, b, mf, mb = host(moe, recompute_modules="layernorm,mla_up_proj", **kw)
    assert (f, b) == pytest.approx((3 + 3, 11 + 10 + 3 + 10))      # MLA's input norm
    assert (mf, mb) == pytest.approx((f + 3, b + 3 + 10))           # and the pre-MLP norm
    assert host(moe, recompute_modules="layernorm", cuda_graph_impl="transformer_engine",
                cuda_graph_scope="moe_router", **kw)[2:] == pytest.approx((3, 3 + 10))
    f, b, mf, mb = host(moe, recompute_modules="moe_act,shared_experts", **kw)
    assert (f, b, mf, mb) == pytest.approx((0, 0, 3 + 2, 3 + 10 + 10 + 9))
    c = _candidates(moe, recompute="selective", recompute_modules="moe,moe_act", **kw)
    whole = _one(moe_mlp_ops(moe, c))
    assert whole > 50
    assert host(moe, recompute_modules="moe,moe_act,shared_experts", **kw)[2:] == \
        pytest.approx((2, whole + 9))

    # a host-bound layer: its recompute's GPU time floored by the re-run's host time
    c = _candidates(dense, recompute="selective", recompute_modules="mlp")
    t = dict(fwd=1e-6, bwd=2e-6, recompute=1e-7, tp_f=0.0, tp_b=0.0, cp_f=0.0, cp_b=0.0,
             ep_f=0.0, ep_b=0.0)
    out = host_bound(c, t, 40 * op, selective=(2 * op, (mlp + 9) * op))
    assert _one(out["recompute"]) == pytest.approx((mlp + 9) * op, rel=1e-12)
    assert _one(out["fwd"]) == pytest.approx(42 * op, rel=1e-12)
    assert _one(out["bwd"]) == pytest.approx(0.87 * 40 * op, rel=1e-12)
    lc = layer_costs(dense, c, gpu)
    assert tuple(map(_one, lc["host_selective"])) == pytest.approx((2 * op, (mlp + 9) * op),
                                                                   rel=1e-12)


def test_sc21_flops():
    """Narayanan et al. SC'21 §5.1, recompute included:
    ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))``, here B = 4, s = 512, L = 4, h = 256,
    V = 1000 (the vocabulary unpadded)."""
    from configurator.cost.flops import sc21_flops

    B, s, L, h, V = 4, 512, 4, 256, 1000
    want = 96 * B * s * L * h * h + 16 * B * s * s * L * h + 6 * B * s * h * V
    assert sc21_flops(make_model(**GQA), B) == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------- group figures

class _Pipeline:
    """A cluster stand-in whose pipeline boundaries are given: forward and backward
    bandwidths and latencies of the ``size`` boundaries (the last the wrap-around)."""

    def __init__(self, fb, fl, bb, bl):
        self.boundaries = tuple(np.asarray(x, dtype=float) for x in (fb, fl, bb, bl))

    def p2p_boundaries(self, stride, size, world):
        return tuple(x[:size] for x in self.boundaries)


def test_pipeline_figures_path_ring_and_end():
    """Three stages: the path's boundaries 0 and 1 both ways (3, 2, 4, 6 GB/s) at their
    harmonic mean, 4/(1/3 + 1/2 + 1/4 + 1/6) = 3.2 GB/s, latency their mean 3 µs; the ring
    adds the wrap-around (0.5 and 1 GB/s): 6/4.25 GB/s, 3.5 µs; the end stages' boundaries
    (0 and 1 here) the slowest of them, 2 GB/s, and the longest latency, 5 µs. Two stages:
    one boundary. One stage: none (infinite bandwidth, no latency)."""
    from configurator.cost.communication import pipeline_figures

    cl = _Pipeline([3e9, 2e9, 0.5e9], [1e-6, 2e-6, 3e-6], [4e9, 6e9, 1e9], [4e-6, 5e-6, 6e-6])
    got = pipeline_figures(cl, 1, 3, 3)
    want = (3.2e9, 3e-6, 6 / 4.25 * 1e9, 3.5e-6, 2e9, 5e-6)
    assert got == pytest.approx(want, rel=1e-12)
    got = pipeline_figures(cl, 1, 2, 2)
    want = (2 / (1 / 3 + 1 / 4) * 1e9, 2.5e-6, 4 / (1 / 3 + 1 / 2 + 1 / 4 + 1 / 6) * 1e9,
            3e-6, 3e9, 4e-6)
    assert got == pytest.approx(want, rel=1e-12)
    assert pipeline_figures(cl, 1, 1, 1) == (float("inf"), 0.0) * 3


def test_expert_group_figures_on_two_hosts():
    """Megatron's expert grid ``etp-ep-edp-pp`` on 2 hosts of 8: tp 2, dp 8, ep 4, etp 2:
    the EP group (stride etp) holds min(ep, 8/etp) = 4 members a host, its exchange at the
    NVLink and network links of GPU 0 to GPUs 1 and 8; the ETP ring of 2 adjacent GPUs;
    the expert-data-parallel ring of 16/(ep·etp) = 2 ranks at stride etp·ep = 8, across the
    hosts; 8 GPUs a host."""
    from configurator.cost.communication import expert_comm_figures

    cl = load_cluster(H100, nodes=2)
    model = make_model(**MOE16)
    c = _candidates(model, tp=2, dp=8, ep=4, etp=2, sequence_parallel=True,
                    global_batch_size=64)
    x = {k: _one(v) for k, v in expert_comm_figures(cl, c).items()}
    assert x["ep_on_node"] == 4 and x["gpus_per_node"] == 8
    assert (x["ep_intra_bw"], x["ep_intra_lat"]) == cl.link(0, 1)
    assert (x["ep_inter_bw"], x["ep_inter_lat"]) == cl.link(0, 8)
    assert (x["etp_bw"], x["etp_lat"]) == cl.group_busbw(1, 2, 16)
    assert (x["edp_bw"], x["edp_lat"]) == cl.group_busbw(8, 2, 16)
    assert cl.group_busbw(8, 2, 16) != cl.group_busbw(1, 2, 16)
    c = _candidates(model, tp=2, dp=8, ep=8, etp=2, sequence_parallel=True,
                    global_batch_size=64)
    x = {k: _one(v) for k, v in expert_comm_figures(cl, c).items()}
    assert x["ep_on_node"] == 4
    assert (x["edp_bw"], x["edp_lat"]) == (float("inf"), 0.0)     # one rank: no ring


def test_expert_groups_count_whole_expert_tensor_groups_per_nvlink_domain():
    """An expert-tensor-parallel size that does not divide the NVLink domain (16 of an NVL72
    rack's 72 GPUs): the EP group at stride etp counts whole ETP groups a domain, 72 // 16 =
    4 of its 8 members (the rack's other 8 GPUs hold no whole one), not 4.5."""
    from configurator.cost.communication import expert_comm_figures

    cl = load_cluster("gb200-nvl72", 288)                  # 1,152 GPUs, 16 racks of 72
    assert cl.nvlink_domain_gpus == 72
    plan = ParallelPlan(tp=8, pp=1, dp=144, ep=8, etp=16, micro_batch_size=1,
                        global_batch_size=1152)
    x = {k: _one(v) for k, v in expert_comm_figures(cl, PlanBatch.from_plan(plan)).items()}
    assert x["ep_on_node"] == 4
    assert (x["ep_inter_bw"], x["ep_inter_lat"]) == cl.link(0, 72)


def test_group_figures_follow_megatrons_rank_order():
    """Megatron's rank order ``tp-cp-ep-dp-pp`` on 2 hosts of 8, tp = cp = dp = pp = 2: the
    tp ring of adjacent GPUs (stride 1), the cp ring at stride tp = 2, the dp·cp ring of 4
    at stride 2, the pipeline's neighbours 8 apart (across the hosts); the cp ring's single
    send and its 2 members a host."""
    from configurator.cost.communication import comm_figures

    cl = load_cluster(H100, nodes=2)
    model = make_model(**GQA)
    c = _candidates(model, tp=2, cp=2, dp=2, pp=2, sequence_parallel=True,
                    distributed_optimizer=True, global_batch_size=8)
    x = {k: _one(v) for k, v in comm_figures(cl, c).items()}
    assert (x["tp_bw"], x["tp_lat"]) == cl.group_busbw(1, 2, 16)
    assert (x["cp_bw"], x["cp_lat"]) == cl.group_busbw(2, 2, 16)
    assert (x["dp_bw"], x["dp_lat"]) == cl.group_busbw(2, 4, 16)
    assert (x["pp_bw"], x["pp_lat"]) == cl.p2p_worst(8, 2, 16)
    assert (x["cp_hop_bw"], x["cp_hop_lat"]) == cl.ring_hop_worst(2, 2, 16)
    assert x["cp_on_node"] == 2
    assert x["pp_bw"] < x["tp_bw"]           # the pipeline crosses the hosts
    end = (x["pp_end_bw"], x["pp_end_lat"])
    assert end == (x["pp_path_bw"], x["pp_path_lat"]) == (x["pp_ring_bw"], x["pp_ring_lat"])
    assert end == pytest.approx(cl.link(0, 8), rel=1e-12)


# ---------------------------------------------------------------- MoE recompute modules

@pytest.mark.parametrize("modules", ["layernorm,moe", "moe_act,shared_experts", "full"])
def test_moe_layer_recompute_modules(modules):
    """An MoE layer's recompute (tp 2, sequence parallel): ``layernorm`` re-runs its
    pre-MLP norm (read and write 2 bytes of each of the T·h/t elements, one kernel) and
    ``moe`` the whole MoE MLP (router, experts, shared expert, passes); ``moe_act`` the routed
    experts' activation and ``shared_experts`` the shared expert's forward; the norm and the
    activation under ``CheckpointWithoutOutput``, which copies each re-run output back into
    its freed storage (read and write 2 bytes an element: T·h/t and R·fe); full recompute
    the whole forward, the MoE MLP in place of the dense one. Core attention is not
    recomputed when the modules do not name it."""
    from configurator.cost.moe_compute import moe_mlp_costs

    E, k, fe, fs, h, t, b, s = 8, 2, 64, 128, 256, 2, 2, 512
    model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe,
                       moe_shared_expert_intermediate_size=fs)
    gpu = _gpu()
    eff = gpu.efficiency
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    kw = dict(tp=t, dp=4, ep=4, micro_batch_size=b, sequence_parallel=True,
              global_batch_size=8)
    if modules == "full":
        c = _candidates(model, recompute="full", **kw)
    else:
        c = _candidates(model, recompute="selective", recompute_modules=modules, **kw)
    lc = layer_costs(model, c, gpu)
    T = b * s
    moe = moe_mlp_costs(model, c, gpu, T, lc["gemm_kw"])
    (_, _), (fc1, fc2) = lc["tp_gemm_pairs"]
    norm = 4 * T * h / t / hbm + eff.kernel_overhead_s
    act_restore = 4 * moe["tokens_routed"] * fe / hbm + eff.kernel_overhead_s
    want = {"layernorm,moe": 2 * norm + moe["fwd"],
            "moe_act,shared_experts": moe["act_fwd"] + act_restore + moe["shared_fwd"],
            "full": lc["fwd"] - (fc1 + fc2 + 6 * T * 512 / t / hbm) + moe["fwd"]}[modules]
    assert _one(lc["moe_recompute"]) == pytest.approx(_one(want), rel=1e-12)


# ---------------------------------------------------------------- CUDA graphs and the host

#: ``(cuda_graph_impl, cuda_graph_scope, capacity padding)`` → host operations of a dense
#: and of an MoE layer's forward (E/ep = 2 local experts, biased: 2 + 2 operations each),
#: and of the MoE layer's forward before the dispatcher's host sync (None: no sync).
_GRAPH_CASES = {
    ("none", "", False): (40, 23 + 17 + 90 + 4 * 2, 23 + 30 + 30),
    ("transformer_engine", "mlp", False): (23, 23 + 17 + 90 + 4 * 2, 23 + 30 + 30),
    ("transformer_engine", "", False): (0, 17 + 90 + 4 * 2, 30 + 30),
    ("transformer_engine", "", True): (0, 0, None),
    ("transformer_engine", "moe", False): (40, 23, None),
    ("transformer_engine", "moe_preprocess", False): (40, 23 + 17 + 60 + 4 * 2, 23 + 30),
    ("transformer_engine", "attn", False): (17, 17 + 90 + 4 * 2, 30 + 30),
    ("local", "full_iteration", False): (0, 0, None),
}


@pytest.mark.parametrize("impl,scope,pad", list(_GRAPH_CASES))
def test_host_operations_under_cuda_graph_scopes(impl, scope, pad):
    """What CUDA graphs capture the host replays without issuing: ``attn`` the dense
    attention's 23 operations, ``mlp`` the dense MLP's 17, whole-layer graphs every dense
    layer and an MoE layer's attention, its MLP too where the experts are padded to capacity
    (static shapes), ``moe`` the MoE MLP, ``moe_preprocess`` the dispatcher's 30 operations
    before the exchange, ``full_iteration`` everything. An MoE layer's MLP: the dense MLP's
    17, 30 each to route, preprocess and dispatch, 2 grouped-GEMM members and 2 eager bias
    operations per local expert. Padding (or graphs of the whole MoE MLP or iteration)
    removes the host's sync; a captured preprocessing does not (its token counts reach the
    host just before the exchange); before it the host issues the attention, the router and
    the preprocessing, what graphs capture of them excepted."""
    from configurator.cost.host_ops import host_layer_s
    from configurator.cost.moe_compute import moe_host_before_sync_s, moe_host_synchronised

    model = make_model(**(GQA | dict(add_bias_linear=True)), num_experts=8, moe_router_topk=2,
                       moe_ffn_hidden_size=64)
    gpu = _gpu()
    op = gpu.efficiency.host_op_s
    kw = dict(dp=8, ep=4, global_batch_size=64, cuda_graph_impl=impl, cuda_graph_scope=scope)
    if pad:
        kw.update(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    c = _candidates(model, **kw)
    dense_ops, moe_ops, before_sync = _GRAPH_CASES[(impl, scope, pad)]
    dense, moe = host_layer_s(model, c, gpu)
    assert (_one(dense), _one(moe)) == pytest.approx((dense_ops * op, moe_ops * op),
                                                     rel=1e-12)
    assert moe_host_synchronised(c) == (before_sync is not None)
    if before_sync is not None:
        assert _one(moe_host_before_sync_s(model, c, gpu)) == pytest.approx(
            before_sync * op, rel=1e-12)
    if scope == "full_iteration":
        assert moe_host_before_sync_s(model, c, gpu) == 0.0


@pytest.mark.parametrize("capacity,pad,synchronised", [(0.0, False, True), (1.0, False, True),
                                                      (1.0, True, False)])
def test_only_padding_to_capacity_removes_the_dispatchers_sync(capacity, pad, synchronised):
    """A capacity factor alone drops the tokens beyond it but leaves each expert's count
    dynamic, so the dispatcher still copies the counts to the host and waits; only padding
    to capacity gives static shapes (megatron-core 0.16.1 token_dispatcher.py
    ``self.drop_and_pad = self.config.moe_pad_expert_input_to_capacity``, which
    transformer_config.py allows only with a capacity factor)."""
    from configurator.cost.host_ops import drop_and_pad
    from configurator.cost.moe_compute import moe_host_synchronised

    model = make_model(**GQA, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64)
    kw = dict(moe_expert_capacity_factor=capacity) if capacity else {}
    c = _candidates(model, dp=8, ep=4, global_batch_size=64,
                    moe_pad_expert_input_to_capacity=pad, **kw)
    assert drop_and_pad(c) is (not synchronised)
    assert moe_host_synchronised(c) is synchronised


# ---------------------------------------------------------------- the all-to-all overlap

def test_expert_exchange_overlap_interleaved_with_delayed_weight_gradients():
    """Megatron's combined 1F1B with the interleaved schedule (pp 2, vp 2, m = 4
    microbatches: 8 passes of a chunk, of which the warm-up's (pp − 1) + (vp − 1)·pp + 1 = 4
    are not paired: share ½) and ``delay_wgrad_compute``: the experts' weight gradients (half
    their backward) run while the dispatch's gradient travels, so the middle segments are
    ``S(D_f, M_b/2) + S(D_b, M_b/2 + M_f)`` with ``S(comm, comp) = max(comm, comp +
    0.189·min(comm, comp))``; what the pair takes beyond its compute is exposed on the
    paired passes, the four exchanges on the others, split evenly forward and backward.
    (With ``M_b = 2·M_f`` and equal exchanges the two pairings' sums are equal: the delay
    changes the segments, not their total.)"""
    from configurator.cost.expert_comm import a2a_s, ep_layer_s, overlapped_share

    model = make_model(**GQA, num_experts=16, moe_router_topk=2, moe_ffn_hidden_size=64)
    x = dict(ep_on_node=8, ep_intra_bw=400e9, ep_intra_lat=3e-6, ep_inter_bw=40e9,
             ep_inter_lat=8e-6, etp_bw=300e9, etp_lat=2e-6)
    R = 65536.0
    lc = dict(tokens_routed=R, moe_experts_fwd=1e-4, moe_fwd=1.5e-4, moe_bwd=2.5e-4)
    c = _candidates(model, pp=2, vp=2, dp=8, ep=8, distributed_optimizer=True,
                    global_batch_size=32, overlap_moe_expert_parallel_comm=True,
                    delay_wgrad_compute=True)
    assert _one(overlapped_share(c)) == pytest.approx(0.5, rel=1e-12)
    t = 3e-6 + 7 / 8 * 2 * R * 256 / 400e9          # one exchange inside the node
    assert _one(a2a_s(model, lc, c, x)) == pytest.approx(t, rel=1e-12)

    def seg(comm, comp):
        return max(comm, comp + 0.189 * min(comm, comp))
    m_f, m_b = 1e-4, 2e-4          # the experts longer, the rest shorter than an exchange
    a_f, a_b = 1.5e-4 - m_f, 2.5e-4 - m_b
    pair = seg(t, a_f) + seg(t, m_b / 2) + seg(t, m_b / 2 + m_f) + seg(t, a_b)
    exposed = 0.5 * max(pair - (a_f + a_b + m_f + m_b), 0.0) + 0.5 * 4 * t
    fwd, bwd = ep_layer_s(model, lc, c, x)
    assert (_one(fwd), _one(bwd)) == pytest.approx((exposed / 2, exposed / 2), rel=1e-12)


@pytest.mark.parametrize("shared", [False, True])
def test_moe_layer_runs_one_tensor_parallel_pair_fewer(shared):
    """Per layer term by kind: a dense layer's two tensor-parallel all-reduces of ``2·T·h``
    bytes forward (tp 2: ``2·(lat + ½·bytes/bw)`` each), backward the two exposed beyond the
    QKV and fc1 weight-gradient GEMMs; an MoE layer's routed experts exchange over EP
    instead, so it keeps half of them, or all with a shared expert (which keeps its
    pair); the expert terms the exchange's (one domain, 4 ranks: ¾ of ``2·R·h`` bytes over
    NVLink, dispatch and combine each way)."""
    from configurator.cost.iteration import layer_type_times

    extra = dict(moe_shared_expert_intermediate_size=128) if shared else {}
    model = make_model(**GQA, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64,
                       **extra)
    gpu = _gpu()
    c = _candidates(model, moe_router_force_load_balancing=True,
                    tp=2, dp=4, ep=4, micro_batch_size=2, sequence_parallel=True,
                    global_batch_size=8)
    lc = layer_costs(model, c, gpu)
    comm = dict(tp_bw=10e9, tp_lat=5e-6, cp_bw=1.0, cp_lat=0.0, cp_hop_bw=1.0,
                cp_hop_lat=0.0, cp_on_node=1, ep_on_node=8, ep_intra_bw=400e9,
                ep_intra_lat=3e-6, ep_inter_bw=40e9, ep_inter_lat=8e-6, etp_bw=300e9,
                etp_lat=2e-6, gpus_per_node=8)
    types = layer_type_times(model, c, lc, comm)
    T, h = 1024, 256
    coll = 2 * 5e-6 + 2 * 0.5 * 2 * T * h / 10e9
    (qkv, _), (fc1, _) = lc["tp_gemm_pairs"]
    tp_f, tp_b = 2 * coll, max(2 * coll - _one(qkv + fc1), 0.0)
    d, m = ({k: _one(v) for k, v in types[kind].items()} for kind in ("dense", "moe"))
    assert (d["tp_f"], d["tp_b"], d["ep_f"], d["ep_b"]) == pytest.approx(
        (tp_f, tp_b, 0.0, 0.0), rel=1e-12)
    share = 1.0 if shared else 0.5
    R = 2 * T / 2
    a2a = 3e-6 + 3 / 4 * 2 * R * h / 400e9
    assert (m["tp_f"], m["tp_b"], m["ep_f"], m["ep_b"]) == pytest.approx(
        (share * tp_f, share * tp_b, 2 * a2a, 2 * a2a), rel=1e-12)
    assert tp_b > 0 and (d["cp_f"], m["cp_b"]) == (0.0, 0.0)


# ---------------------------------------------------------------- activation offloading

def _offloading_case(**offload):
    """An MoE model at mbs 64 (its copies longer than its passes): ``(model, gpu, candidates
    with ``offload``, their layer costs, the layer costs without it)``."""
    model = make_model(**GQA, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64)
    gpu = _gpu()
    kw = dict(tp=1, dp=4, ep=4, micro_batch_size=64, global_batch_size=256)
    c = _candidates(model, **offload, **kw)
    without = layer_costs(model, _candidates(model, **kw), gpu)
    return model, gpu, c, layer_costs(model, c, gpu), without


@pytest.mark.parametrize("modules", ["attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm",
                                     "expert_fc1,moe_act"])
def test_offloaded_activations_bound_each_pass_by_their_copy(modules):
    """Fine-grained offloading: a layer's offloaded tensors go to the host during its
    forward and come back during its backward, each copy on a side stream at the host
    link's rate; a pass takes the longer of its own time and its copy. A dense layer copies
    what every layer offloads; an MoE layer that and its experts' tensors, against its own
    forward and backward (mbs 64 makes the dense modules' copy the longer)."""
    from memory_model.activations import LayerInputs, offloaded_layer_bytes

    model, gpu, c, on, off = _offloading_case(offload_modules=modules)
    every, moe = offloaded_layer_bytes(model, LayerInputs.of_plans(model, c))
    copy, moe_copy = _one(every) / gpu.host_link_Bps, _one(every + moe) / gpu.host_link_Bps
    assert moe_copy > 0
    got = {k: _one(v) for k, v in on.items() if k in ("fwd", "bwd", "moe_fwd", "moe_bwd")}
    want = {"fwd": max(_one(off["fwd"]), copy), "bwd": max(_one(off["bwd"]), copy),
            "moe_fwd": max(_one(off["moe_fwd"]), moe_copy),
            "moe_bwd": max(_one(off["moe_bwd"]), moe_copy)}
    assert got == pytest.approx(want, rel=1e-12)


def test_mtp_after_an_moe_layer_runs_an_moe_layer():
    """Multi-token prediction after an MoE last layer: the MTP module's layer is an MoE
    layer (its forward and backward the MoE layer's), beside its 2h→h projection (2× and
    its weight gradient's accumulation backward) and its own logits GEMM and eager cross
    entropy (38 and 14 bytes a logit)."""
    from configurator.cost.iteration import stage_extras_s

    gpu = _gpu()
    eff = gpu.efficiency
    model = make_model(**GQA, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64,
                       moe_layer_freq=[0, 0, 0, 1], mtp_num_layers=1)
    h, t, b, s = 256, 2, 2, 512
    c = _candidates(model, tp=t, dp=4, ep=4, micro_batch_size=b, sequence_parallel=True,
                    global_batch_size=8)
    lc = layer_costs(model, c, gpu)
    T, V = b * s, v_pad(1000, t)
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    kw16 = dict(batch=1.0, peak=gpu.peak("bf16"), gpu=gpu, in_bytes=2.0, gemm_eff=eff.gemm)
    gemm = gemm_time_s(T, V / t, h, **kw16)
    proj = gemm_time_s(T, h / t, 2 * h, **lc["gemm_kw"])
    ce_f, ce_b = 38 * T * V / t / hbm, 14 * T * V / t / hbm
    acc = _one(main_grad_accumulation_s(V / t * h, c, gpu, T))
    acc_proj = _one(main_grad_accumulation_s(h / t * 2 * h, c, gpu, T))
    x = stage_extras_s(model, c, gpu, lc, 100e9, 4e-6)
    assert _one(x["logits_fwd"]) == pytest.approx(
        2 * (gemm + ce_f) + proj + _one(lc["moe_fwd"]), rel=1e-12)
    assert _one(x["logits_bwd"]) == pytest.approx(
        2 * (2 * gemm + ce_b + acc) + 2 * proj + _one(lc["moe_bwd"]) + acc_proj, rel=1e-12)
    assert _one(lc["moe_bwd"]) != pytest.approx(_one(lc["bwd"]), rel=1e-3)


def test_fp8_block_scaling_casts():
    """Transformer Engine's quantisation of a 16-bit tensor into row- and column-wise FP8
    copies: read 2, write 1 + 1 bytes an element, plus per block of 128 a 4-byte scale in
    each copy (``blockwise``: 2·4/128) or per block of 32 a 1-byte one (``mxfp8``: 2/32),
    at 0.39 of the raw HBM bandwidth."""
    from configurator.cost.gemm import fp8_quantize_s

    gpu = _gpu()
    raw = gpu.hbm_bandwidth_Bps * 0.39
    assert fp8_quantize_s(1e6, gpu, "blockwise") == pytest.approx(1e6 * (4 + 8 / 128) / raw,
                                                                  rel=1e-12)
    assert fp8_quantize_s(1e6, gpu, "delayed") == pytest.approx(4e6 / raw, rel=1e-12)


def test_tensor_scaled_fp8_writes_one_copy_where_gemms_take_either_layout():
    """Blackwell's FP8 GEMMs take either operand layout, so Transformer Engine writes a
    tensor-scaled (delayed, current) input once, no transpose (quantizer.cpp ``create_tensor``:
    ``columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()``): read 2, write 1, and
    current scaling's amax read 2; block scales (blockwise, MXFP8) keep both copies. Hopper
    writes both. Through a layer: the B200's FP8 forward is the casts' one byte an element
    shorter than the same GPU's with TN-only GEMMs."""
    from configurator.cost.gemm import fp8_cast_bytes, fp8_quantize_s

    hopper, blackwell = (load_cluster(n, nodes=1).gpu for n in (H100, "dgx-b200-180gb"))
    assert not hopper.non_tn_fp8_gemm and blackwell.non_tn_fp8_gemm
    raw = blackwell.hbm_bandwidth_Bps * 0.39
    want = {"delayed": (4, 3), "tensorwise": (6, 5), "blockwise": (4 + 8 / 128,) * 2,
            "mxfp8": (4 + 2 / 32,) * 2}
    for scaling, (on_hopper, on_blackwell) in want.items():
        assert fp8_cast_bytes(hopper, scaling) == pytest.approx(on_hopper, rel=1e-12)
        assert fp8_cast_bytes(blackwell, scaling) == pytest.approx(on_blackwell, rel=1e-12)
        assert fp8_quantize_s(1e6, blackwell, scaling) == pytest.approx(
            1e6 * on_blackwell / raw, rel=1e-12)
    # a row-wise copy alone (FP8 attention's inputs) on either GPU: read 2 (and the amax's
    # 2), write 1 and its scales
    alone = {"delayed": 3, "tensorwise": 5, "blockwise": 3 + 4 / 128, "mxfp8": 3 + 1 / 32}
    for scaling, want_bytes in alone.items():
        for gpu in (hopper, blackwell):
            assert fp8_cast_bytes(gpu, scaling, columnwise=False) == pytest.approx(
                want_bytes, rel=1e-12)
    model = make_model(**GQA)
    h, a, d, f, t, T = 256, 8, 32, 512, 2, 2 * 512
    c = _candidates(model, tp=t, micro_batch_size=2, sequence_parallel=True, precision="fp8",
                    fp8_recipe="tensorwise")
    tn_only = dataclasses.replace(blackwell, non_tn_fp8_gemm=False)
    fwd_elements = T * (2 * h / t + a * d / t + f / t)
    assert _one(layer_costs(model, c, tn_only)["fwd"]) - _one(
        layer_costs(model, c, blackwell)["fwd"]) == pytest.approx(fwd_elements / raw,
                                                                   rel=1e-9)


def test_norm_fed_fp8_inputs_are_quantised_in_the_norms_kernel():
    """A dense layer's QKV and fc1 read their norm's output inside one Transformer Engine
    module (``LayerNormLinear``), which hands its quantiser to the norm: with delayed scaling
    the norm writes the row-wise FP8 copy (1 byte where 2 were written) and the column-wise
    copy is a transpose of it (read 1, write 1; none on Blackwell); with current scaling the
    norm takes the amax in its own pass (the cast reads its input once); block and MXFP8
    scaling quantise separately. Through a layer on an H100 (tensorwise against delayed):
    every other forward cast moves 2 bytes an element more, the norm-fed ones 2 more and
    their norms' writes 1 more, so the forward is longer by exactly that; under MLA only
    fc1's input is norm-fed (its down projections read a separate norm)."""
    from configurator.cost.gemm import FP8_CAST_HBM_FRACTION, fp8_norm_cast_bytes

    hopper, blackwell = (load_cluster(n, nodes=1).gpu for n in (H100, "dgx-b200-180gb"))
    want = {"delayed": ((2, 1), (0, 1)), "tensorwise": ((4, 0), (3, 0)),
            "blockwise": ((4 + 8 / 128, 0),) * 2, "mxfp8": ((4 + 2 / 32, 0),) * 2}
    for scaling, (on_hopper, on_blackwell) in want.items():
        assert fp8_norm_cast_bytes(hopper, scaling) == pytest.approx(on_hopper, rel=1e-12)
        assert fp8_norm_cast_bytes(blackwell, scaling) == pytest.approx(on_blackwell,
                                                                        rel=1e-12)
    with pytest.raises(KeyError):
        fp8_norm_cast_bytes(hopper, "nvfp4")
    cast_rate = hopper.hbm_bandwidth_Bps * FP8_CAST_HBM_FRACTION
    hbm = hopper.hbm_bandwidth_Bps * hopper.efficiency.hbm
    for spec, normed_inputs in ((GQA, 2), (MLA_MOE, 1)):
        model = make_model(**spec)
        h, t, b = model.hidden_size, 2, 2
        T = b * model.seq_length
        a, dv = model.num_attention_heads, model.attention_heads_dims[1]
        f = model.ffn_hidden_size
        fwd = {r: _one(layer_costs(model, _candidates(
            model, tp=t, micro_batch_size=b, sequence_parallel=True, precision="fp8",
            fp8_recipe=r), hopper)["fwd"]) for r in ("delayed", "tensorwise")}
        normed = normed_inputs * T * h / t
        other = T * (2 * h / t + a * dv / t + f / t) - normed
        assert fwd["tensorwise"] - fwd["delayed"] == pytest.approx(
            (2 * other + 2 * normed) / cast_rate + normed / hbm, rel=1e-9)


def test_an_moe_layers_passes_do_not_depend_on_the_dense_mlp_they_replace():
    """An MoE layer's passes are the dense layer's with its MLP taken out exactly and the
    MoE MLP put in: with every layer MoE, the dense ffn_hidden_size (which no layer uses)
    changes none of them, in BF16 and FP8, with a gated (SwiGLU) or plain MLP. (The dense
    MLP's backward was taken out as twice its forward, whose FP8 casts are not the
    backward's: h + f elements a token more than the backward casts without SwiGLU.)"""
    gpu = load_cluster(H100, nodes=1).gpu
    for swiglu in (True, False):
        for precision, recipe in (("bf16", "delayed"), ("fp8", "delayed"),
                                  ("fp8", "tensorwise"), ("fp8", "blockwise")):
            passes = []
            for ffn in (512, 1536):
                model = make_model(**(GQA | dict(swiglu=swiglu, ffn_hidden_size=ffn)),
                                   num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64)
                c = _candidates(model, tp=2, dp=4, ep=4, micro_batch_size=2,
                                sequence_parallel=True, global_batch_size=8,
                                precision=precision, fp8_recipe=recipe)
                lc = layer_costs(model, c, gpu)
                passes.append([_one(lc[k]) for k in ("moe_fwd", "moe_bwd", "moe_recompute")])
                assert _one(lc["fwd"]) != pytest.approx(passes[-1][0], rel=1e-6)
            assert passes[0] == pytest.approx(passes[1], rel=1e-12), (swiglu, precision)


def test_block_scaled_fp8_gemms_on_hopper_take_longer(monkeypatch):
    """Hopper applies FP8 block scales to the partial sums on its CUDA cores: its
    block-scaled GEMMs take 1.222 times the per-tensor-scaled ones (Transformer Engine's
    GEMM profiling guide on an H200: a layer's GEMMs with their quantisation 22.882 ms with
    block scales, 20.285 ms with current scaling, whose GEMMs alone 16.785 ms; the block
    scales' quantisation as the model prices it against current scaling's, 4.0625 bytes an
    element against 6). Blackwell's tensor cores read block scales themselves: its
    block-scaled GEMMs keep the FP8 efficiency. Through a layer on an H100 every FP8 GEMM
    slows by that ratio, so a blockwise plan, whose casts are the shorter, now prices
    slower than the same plan with current scaling (it priced faster)."""
    from configurator.cost.gemm import BLOCKWISE_GEMM_TIME_RATIO, fp8_gemm_efficiency

    assert BLOCKWISE_GEMM_TIME_RATIO == pytest.approx(
        (22.882 - 3.500 * 4.0625 / 6) / 16.785, rel=1e-12)
    assert BLOCKWISE_GEMM_TIME_RATIO == pytest.approx(1.222, abs=5e-4)
    hopper, blackwell = (load_cluster(n, nodes=1).gpu for n in (H100, "dgx-b200-180gb"))
    for scaling in ("delayed", "tensorwise", "mxfp8"):
        for gpu in (hopper, blackwell):
            assert fp8_gemm_efficiency(gpu, scaling, 0.66) == 0.66
    assert fp8_gemm_efficiency(blackwell, "blockwise", 0.66) == 0.66
    assert fp8_gemm_efficiency(hopper, "blockwise", 0.66) == pytest.approx(
        0.66 / BLOCKWISE_GEMM_TIME_RATIO, rel=1e-12)
    model = make_model(**GQA)
    kw = dict(tp=2, micro_batch_size=2, sequence_parallel=True, precision="fp8")
    effs = {r: layer_costs(model, _candidates(model, fp8_recipe=r, **kw), hopper)["gemm_kw"][
        "gemm_eff"] for r in ("tensorwise", "blockwise")}
    assert effs["tensorwise"] == hopper.efficiency.gemm_fp8
    assert effs["blockwise"] == pytest.approx(
        hopper.efficiency.gemm_fp8 / BLOCKWISE_GEMM_TIME_RATIO, rel=1e-12)
    from configurator.core.model_presets import load_model
    from configurator.search.evaluate import evaluate_plan

    big = load_model("llama3-70b")
    cluster = load_cluster(H100, nodes=8)

    def times():
        return {r: evaluate_plan(big, cluster, ParallelPlan(
            tp=8, pp=2, dp=4, micro_batch_size=1, global_batch_size=256, precision="fp8",
            fp8_recipe=r)).iteration_time_s for r in ("tensorwise", "blockwise")}
    now = times()
    assert now["blockwise"] > now["tensorwise"]
    monkeypatch.setattr("configurator.cost.gemm.BLOCKWISE_GEMM_TIME_RATIO", 1.0)
    before = times()
    assert before["blockwise"] < before["tensorwise"] == now["tensorwise"]


def test_data_parallel_and_optimizer_terms_of_the_rank_holding_most_parameters():
    """The closed form's data-parallel reduction and optimizer step are the rank's that holds
    the most parameters: two dense layers and the embedding (2·557,568 + 262,144) on stage 0
    against two MoE layers (166,400 non-expert each: attention, norms, router 8·256; 2 local
    experts of 3·256·512: 786,432 expert parameters each), the final norm and the output
    layer on stage 1, which holds more in all though fewer non-expert ones. Its reduction:
    non-expert gradients over dp = 4, expert ones over the expert-data-parallel group of
    4/4 = 1 (nothing to reduce); Adam's step over its shards (34 bytes a parameter
    unsharded, 30/4 + 4 sharded over 4 ranks) and the host's 2 operations on each of its 20
    parameter tensors (9 a MoE layer: 5 plus 2 per local expert; norm, output layer)."""
    from configurator.cost.iteration import dp_exposed_s, iteration_time

    model = make_model(**(GQA | dict(ffn_hidden_size=512)), num_experts=8, moe_router_topk=2,
                       moe_ffn_hidden_size=512, moe_layer_freq=[0, 0, 1, 1])
    cl = load_cluster(H100, nodes=1)
    gpu = cl.gpu
    eff = gpu.efficiency
    c = _candidates(model, pp=2, dp=4, ep=4, distributed_optimizer=True,
                    global_batch_size=8)
    from configurator.cost.communication import comm_figures, expert_comm_figures
    comm = dict(comm_figures(cl, c), **expert_comm_figures(cl, c))
    out = iteration_time(model, cl, c, comm)
    h, V = 256, v_pad(1000, 1)
    first = 2 * _gqa_layer(1) + V * h
    ne = 2 * (256 + 256 * 12 * 32 + 8 * 32 * 256 + 256 + 8 * h) + h + V * h
    ex = 2 * (8 / 4 * 3 * h * 512)
    assert ne + ex > first > ne - ex
    want = dp_exposed_s(c, ne, comm["dp_bw"], comm["dp_lat"], 0.0, 0.0,
                        expert=(ex, comm["edp_bw"], comm["edp_lat"]))
    assert _one(out["dp_comm"]) == pytest.approx(_one(want), rel=1e-12)
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    opt = ((ne * (30 / 4 + 4) + ex * 34) / hbm + 20 * eff.kernel_overhead_s
           + 2 * 20 * eff.host_op_s)
    assert _one(out["optimizer"]) == pytest.approx(opt, rel=1e-12)


def test_sliding_window_layers_attention():
    """GPT-OSS's alternation (``window_size`` 128, every 2nd layer full) on 4 layers of
    s = 512: half the layers compute ½ of the s² query-key pairs over 512 keys a call, half
    a causal window's ``w/s·(1 − w/(2s))`` = 0.21875 over at most 128 keys, each at the
    fused kernel's attained rate ``η·keys/(keys + 1024)``; with attention dropout every
    visited score (the mean fraction, 0.359375) draws its mask at the per-SM rates."""
    model = make_model(**(GQA | dict(window_size=128, window_attn_skip_freq=2,
                                     attention_dropout=0.1)))
    gpu = _gpu()
    eff = gpu.efficiency
    a, d, s, b, t = 8, 32, 512, 2, 2
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True)
    lc = layer_costs(model, c, gpu)
    pairs = 2 * b * s * s * a * 2 * d / t
    peak = gpu.peak("bf16")

    def rate(keys):
        return peak * eff.flash_attention * keys / (keys + 1024.0)
    kernels = 0.5 * pairs * 0.5 / rate(512) + 0.5 * pairs * 0.21875 / rate(128)
    visited = b * s * s * a / t * (0.5 * 0.5 + 0.5 * 0.21875)
    fwd = eff.kernel_overhead_s + kernels + visited / (8.2e9 * gpu.num_sms)
    bwd = 2.5 * (eff.kernel_overhead_s + kernels) + visited / (1.6e10 * gpu.num_sms)
    assert (_one(lc["attn_fwd"]), _one(lc["attn_bwd"])) == pytest.approx((fwd, bwd),
                                                                         rel=1e-12)


def test_model_flops_of_mla_without_a_query_latent():
    """Multi-latent attention without ``q_lora_rank`` (DeepSeek-V2-Lite's layout): the
    query's one projection ``h·a·(qk + pos)`` in place of the down and up projections;
    the rest as with it (Megatron-LM ``num_floating_point_operations``)."""
    from configurator.cost.flops import megatron_model_flops

    B, s = 4, 256
    h, a, kl, qk, pos, v, f = 128, 4, 32, 16, 8, 32, 256
    E_k, fe, fs, V = 2, 64, 64, 512
    attn = (h * a * (qk + pos) + kl * (h + a * (qk + v) + 1) + h * pos + a * v * h
            + s * a * (qk + pos) / 2 + s * a * v / 2)
    mlp = 3 * f * h * 1 + 3 * h * (E_k * fe + fs) * 2      # 1 dense; MoE layer + MTP's
    want = 6 * B * s * (mlp + 3 * attn + (3 * h + 2 * h * h) + h * V * 2)
    model = make_model(**{k: v for k, v in MLA_MOE.items() if k != "q_lora_rank"})
    assert megatron_model_flops(model, B) == pytest.approx(want, rel=1e-12)


def test_attention_gemms_of_mla_without_a_query_latent():
    """Multi-latent attention without ``q_lora_rank``: the query's one projection
    ``h → a·(qk + pos)/t`` in place of the down and up projections, the key-value down
    projection ``h → kl + pos`` (replicated over tp) and up projection ``kl → a·(qk + v)/t``;
    the output projection ``a·v/t → h``."""
    from configurator.cost.compute import _attention_gemms_s

    model = make_model(**{k: v for k, v in MLA_MOE.items() if k != "q_lora_rank"})
    gpu = _gpu()
    t, b, s = 2, 2, 256
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True)
    kw = layer_costs(model, c, gpu)["gemm_kw"]
    T = b * s
    h, a, kl, qk, pos, v = 128, 4, 32, 16, 8, 32
    want_in = (gemm_time_s(T, a * (qk + pos) / t, h, **kw) + gemm_time_s(T, kl + pos, h, **kw)
               + gemm_time_s(T, a * (qk + v) / t, kl, **kw))
    got_in, got_out = _attention_gemms_s(model, T, t, kw)
    assert _one(got_in) == pytest.approx(_one(want_in), rel=1e-12)
    assert _one(got_out) == pytest.approx(_one(gemm_time_s(T, h, a * v / t, **kw)), rel=1e-12)


def test_published_rows_iteration_times_and_immutability():
    """A published row's iteration time from its own figures: SC'21 Table 1's 1.7B row
    (24 layers of h = 2304, s = 2048, V = 51,200, batch 512 on 32 GPUs at 137 TFLOP/s,
    counted ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))``) and Megatron-Bridge 26.08's
    DeepSeek-V3 MXFP8 row on 256 GB300 (batch 4096 of 4096 tokens at 6,288 tokens/s/GPU).
    The typed rows are frozen records; a Bridge row's hosts are a whole count."""
    import dataclasses

    from configurator.cost.groundtruth import bridge_rows, sc21_rows

    row = next(r for r in sc21_rows() if r.model.name == "gpt-1.7b")
    B, s, L, h, V = 512, 2048, 24, 2304, 51200
    F = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    assert row.published_iteration_time_s == pytest.approx(F / (137e12 * 32), rel=1e-12)
    rows, _ = bridge_rows()
    dsv3 = next(r for r in rows if r.release == "26.08" and r.model.name == "deepseek-v3"
                and r.cluster == "gb300-nvl72" and r.plan.precision == "mxfp8")
    assert dsv3.published_iteration_time_s == pytest.approx(4096 * 4096 / (6288 * 256),
                                                            rel=1e-12)
    # each row's hosts, a whole count: its GPUs over the preset's GPUs per host
    from topology.cluster_files import CLUSTER_PRESETS

    for r in rows:
        assert type(r.nodes) is int
        p = r.plan
        assert r.nodes * CLUSTER_PRESETS[r.cluster]["gpus_per_node"] == p.tp * p.pp * p.cp * p.dp
    for r in (row, dsv3):
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.source = "changed"


@pytest.mark.parametrize("ffn,op_s,waits", [(64, 8.8e-6, "both"), (16384, 8.8e-6, "before"),
                                             (64, 4e-6, "after")])
def test_moe_layer_forward_waits_for_the_host_after_the_dispatcher_sync(ffn, op_s, waits):
    """The all-to-all dispatcher stops the host until the GPU has routed the tokens: before
    the sync the GPU runs the attention, router and passes (the MoE forward less the
    experts' work) with the layer's tensor-parallel collective (half the dense layer's pair:
    tp 2, two all-reduces of 2·T·h bytes) and cp term (cp 2), after it the experts and the
    exchanges. Here (h = 1024, mbs 8) the host's 23 + 30 + 30 operations before the sync
    (attention, router, preprocessing: megatron-core 0.16.1 syncs just before the exchange)
    outlast the GPU's first part, and its remaining 17 + 30 + 2·2 outlast the experts and
    the two exchanges (one domain, 4 ranks: ¾ of 2·R·h bytes each over NVLink), so the
    layer's forward waits for the host on both sides (at 8.8 us per operation). The two
    parts cannot overlap, so where one side's GPU work outlasts its host time the layer
    waits on the other side only: experts of 16,384 (the GPU's after-sync part the longer)
    or 4 us per operation (the GPU's before-sync part, cp's ring included, the longer)."""
    from configurator.cost.iteration import layer_type_times

    model = make_model(**(GQA | dict(hidden_size=1024, num_attention_heads=16,
                                     num_query_groups=4, kv_channels=64, seq_length=2048,
                                     ffn_hidden_size=2048)),
                       num_experts=8, moe_router_topk=1, moe_ffn_hidden_size=ffn)
    gpu = _gpu()
    gpu = dataclasses.replace(gpu, efficiency=dataclasses.replace(gpu.efficiency,
                                                                  host_op_s=op_s))
    op = gpu.efficiency.host_op_s
    c = _candidates(model, moe_router_force_load_balancing=True,
                    tp=2, cp=2, dp=2, ep=4, micro_batch_size=8,
                    sequence_parallel=True, global_batch_size=32)
    lc = layer_costs(model, c, gpu)
    comm = dict(tp_bw=100e9, tp_lat=5e-6, cp_bw=100e9, cp_lat=2e-6, cp_hop_bw=50e9,
                cp_hop_lat=5e-6, cp_on_node=8, ep_on_node=8, ep_intra_bw=400e9,
                ep_intra_lat=3e-6, ep_inter_bw=40e9, ep_inter_lat=8e-6, etp_bw=300e9,
                etp_lat=2e-6, gpus_per_node=8)
    types = layer_type_times(model, c, lc, comm)
    moe = {k: _one(v) for k, v in types["moe"].items()}
    T, h = 8 * 2048 / 2, 1024
    tp_f = 0.5 * 2 * (2 * 5e-6 + 2 * 0.5 * 2 * T * h / 100e9)
    R = 1 * T / 2
    ep_f = 2 * (3e-6 + 3 / 4 * 2 * R * h / 400e9)
    fwd, experts = _one(lc["moe_fwd"]), _one(lc["moe_experts_fwd"])
    host_pre, host = (23 + 30 + 30) * op, (23 + 17 + 90 + 2 * 2) * op
    cp_f = _one(types["dense"]["cp_f"])
    assert cp_f > 0 and moe["cp_f"] == cp_f
    before = host_pre - (fwd - experts + tp_f + cp_f)
    after = host - host_pre - (experts + ep_f)
    assert (before > 0, after > 0) == {"both": (True, True), "before": (True, False),
                                        "after": (False, True)}[waits]
    assert (moe["tp_f"], moe["ep_f"]) == pytest.approx((tp_f, ep_f), rel=1e-12)
    assert moe["fwd"] == pytest.approx(fwd + max(before, 0.0) + max(after, 0.0), rel=1e-12)


@pytest.mark.parametrize("fused", [False, True])
def test_biased_experts_eager_bias_and_the_fused_grouped_mlp(fused):
    """Biased experts (GPT-OSS's layout): megatron-core adds the fc2 biases outside the
    grouped GEMM, one expert at a time, over the R×h output: 28 bytes an element in 2
    kernels per local expert and 2 more forward, 40 bytes in 6 per expert and 3 more
    backward, at the eager kernels' rate. The op fuser's fused grouped MLP
    (``moe_fused_grouped_mlp``) runs the activation, clamp and bias in the GEMMs'
    epilogues: none of them is priced apart."""
    from configurator.cost.moe_compute import moe_mlp_costs

    E, k, fe, h = 8, 2, 64, 256
    model = make_model(**(GQA | dict(add_bias_linear=True, activation_func_clamp_value=7.0)),
                       num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe)
    gpu = _gpu()
    eff = gpu.efficiency
    kov = eff.kernel_overhead_s
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    ebw = _eager_bw(gpu)
    c = _candidates(model, moe_router_force_load_balancing=True,
                    dp=8, ep=4, global_batch_size=64, moe_fused_grouped_mlp=fused)
    kw = layer_costs(model, c, gpu)["gemm_kw"]
    T = 1024.0
    R, local = k * T, E / 4
    got = moe_mlp_costs(model, c, gpu, T, kw)
    experts = (gemm_time_s(R / local, 2 * fe, h, **dict(kw, batch=local))
               + gemm_time_s(R / local, h, fe, **dict(kw, batch=local)))
    if not fused:   # one cuBLAS GEMM per expert: the fixed time of each member after the first
        experts = experts + 2 * (local - 1) * 10.7e-6
    if fused:
        assert (_one(got["eager_fwd"]), _one(got["eager_bwd"])) == (0.0, 0.0)
        assert _one(got["experts_fwd"]) == pytest.approx(_one(experts), rel=1e-12)
        assert _one(got["act_fwd"]) == pytest.approx(kov, rel=1e-12)
        return
    bias_f = 28 * R * h / ebw + (2 * local + 2) * kov
    bias_b = 40 * R * h / ebw + (6 * local + 3) * kov
    clamp_f = 8 * R * 2 * fe / ebw + 3 * kov
    clamp_b = 15 * R * 2 * fe / ebw + 7 * kov
    assert (_one(got["eager_fwd"]), _one(got["eager_bwd"])) == pytest.approx(
        (bias_f + clamp_f, bias_b + clamp_b), rel=1e-12)
    assert _one(got["experts_fwd"]) == pytest.approx(
        _one(experts) + 6 * R * fe / hbm + bias_f + clamp_f, rel=1e-12)


def test_fp8_casts_of_expert_tensor_parallel_grouped_gemm_inputs(monkeypatch):
    """Under FP8 the grouped GEMMs' inputs are cast forward: fc1's input, the R routed copies
    of h values, and fc2's, R copies of the rank's fe/etp slice of each expert's FFN, so the
    cast moves R·(h + fe/etp) elements (tp 2, etp 2, ep 4, forced balance: R = k·(T/tp)·etp);
    a 16-bit plan casts nothing."""
    from configurator.cost import moe_compute

    E, k, fe, h, tp, etp, ep = 8, 2, 64, 256, 2, 2, 4
    model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe)
    gpu = _gpu()
    seen = []
    real = moe_compute.fp8_quantize_s
    monkeypatch.setattr(moe_compute, "fp8_quantize_s",
                        lambda n, *a, **kw: seen.append(float(np.ravel(n)[0])) or real(n, *a,
                                                                                        **kw))
    T = 2048.0
    for precision, want in (("fp8", [k * (T / tp) * etp * (h + fe / etp)]), ("bf16", [])):
        seen.clear()
        c = _candidates(model, moe_router_force_load_balancing=True, tp=tp, dp=4, ep=ep,
                        etp=etp, sequence_parallel=True, global_batch_size=8,
                        precision=precision)
        kw = layer_costs(model, c, gpu)["gemm_kw"]
        seen.clear()
        moe_compute.moe_mlp_costs(model, c, gpu, T, kw)
        assert seen == pytest.approx(want, rel=1e-12), precision


def test_expert_tensor_parallel_grouped_gemms():
    """Expert tensor parallelism (tp 2, etp 2, ep 4): each rank's experts take the routed
    copies of its etp group, ``R = k·X·etp`` with X = T/tp, split over the E/ep local experts,
    and hold 1/etp of each expert's FFN: the grouped fc1 ``h → 2·fe/etp`` and fc2
    ``fe/etp → h`` GEMMs of R·ep/E rows (a fixed time for each of their 2 members), the
    activation over R·fe/etp values (6 bytes)."""
    from configurator.cost.moe_compute import moe_mlp_costs

    E, k, fe, h, tp, etp, ep = 8, 2, 64, 256, 2, 2, 4
    model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe)
    gpu = _gpu()
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    c = _candidates(model, moe_router_force_load_balancing=True,
                    tp=tp, dp=4, ep=ep, etp=etp, sequence_parallel=True,
                    global_batch_size=8)
    kw = layer_costs(model, c, gpu)["gemm_kw"]
    T = 2048.0
    R = k * (T / tp) * etp
    got = moe_mlp_costs(model, c, gpu, T, kw)
    grouped = dict(kw, batch=E / ep)
    experts = (gemm_time_s(R * ep / E, 2 * fe / etp, h, **grouped)
               + gemm_time_s(R * ep / E, h, fe / etp, **grouped) + 2 * (E / ep - 1) * 10.7e-6)
    assert _one(got["tokens_routed"]) == R
    assert _one(got["experts_fwd"]) == pytest.approx(_one(experts) + 6 * R * fe / etp / hbm,
                                                     rel=1e-12)


def test_megatron_fsdp_gathers_and_scatters_expert_units_every_microbatch():
    """Megatron FSDP with experts: every microbatch gathers a unit's 16-bit non-expert
    weights over dp·cp = 8 and its expert weights over the expert-data-parallel group of
    8/ep = 2, and reduce-scatters both gradients (4 bytes), the gathers overlapped with the
    forward, gathers and scatters with the backward: ``m·(max(AG − fwd, 0) + max(AG + RS −
    bwd, 0))`` with AG and RS the sums over both groups (ring all-gather times)."""
    from configurator.cost.iteration import dp_exposed_s

    c = _candidates(None, dp=8, ep=4, distributed_optimizer=True, megatron_fsdp=True,
                    global_batch_size=32)
    ne, ex, bw, lat, ebw, elat = 3e8, 5e8, 100e9, 1e-5, 50e9, 2e-5
    ag = _ring_all_gather(2 * ne, 8, bw, lat) + _ring_all_gather(2 * ex, 2, ebw, elat)
    rs = _ring_all_gather(4 * ne, 8, bw, lat) + _ring_all_gather(4 * ex, 2, ebw, elat)
    m = 32 // 8
    want = m * (max(ag - 1e-3, 0.0) + max(ag + rs - 2e-3, 0.0))
    got = dp_exposed_s(c, ne, bw, lat, 2e-3, 1e-3, expert=(ex, ebw, elat))
    assert _one(got) == pytest.approx(want, rel=1e-12)
    # a stage without experts (an MoE model's dense first layers) moves no expert unit
    ag = _ring_all_gather(2 * ne, 8, bw, lat)
    rs = _ring_all_gather(4 * ne, 8, bw, lat)
    want = m * (max(ag - 1e-3, 0.0) + max(ag + rs - 2e-3, 0.0))
    got = dp_exposed_s(c, ne, bw, lat, 2e-3, 1e-3, expert=(0.0, ebw, elat))
    assert _one(got) == pytest.approx(want, rel=1e-12)


def test_expert_gradients_reduce_under_the_same_windows_as_the_dense_ones():
    """The distributed optimizer with both overlaps: the dense gradients' reduce-scatter
    (4 bytes) over dp = 4 and the expert ones' over the expert-data-parallel group 4/ep = 2
    run under the last microbatch's backward together, the 16-bit gathers under the next
    forward (megatron-core DDP: every parameter's backward hook marks its bucket group,
    expert ones included): ``max(RS + RSₑ − bwd, last buckets) + max(AG + AGₑ − fwd, last
    buckets)``, one latency per bucket of max(40M, 1M·n) parameters: 25 dense buckets of
    1e9, 50 expert buckets of 2e9. Windows wider than the dense traffic hide the expert
    traffic too; without experts only the dense terms."""
    from configurator.cost.iteration import dp_exposed_s

    c = _candidates(None, dp=4, ep=2, distributed_optimizer=True, overlap_grad_reduce=True,
                    overlap_param_gather=True, global_batch_size=16)
    ne, ex, bw, lat, ebw, elat = 1e9, 2e9, 50e9, 5e-6, 100e9, 5e-6
    rs = _ring_all_gather(4 * ne, 4, bw, 25 * lat)
    ag = _ring_all_gather(2 * ne, 4, bw, 25 * lat)
    rs_e = _ring_all_gather(4 * ex, 2, ebw, 50 * elat)
    ag_e = _ring_all_gather(2 * ex, 2, ebw, 50 * elat)
    for bwd, fwd in ((0.05, 0.02), (0.1, 0.05)):
        want = (max(rs + rs_e - bwd, rs * 0.04 + rs_e * 0.02)
                + max(ag + ag_e - fwd, ag * 0.04 + ag_e * 0.02))
        got = dp_exposed_s(c, ne, bw, lat, bwd, fwd, expert=(ex, ebw, elat))
        assert _one(got) == pytest.approx(want, rel=1e-12)
    # wide windows: about 5 ms exposed, where the expert traffic alone is 60 ms
    assert want < 0.006 < 0.06 < rs_e + ag_e
    got = dp_exposed_s(c, ne, bw, lat, 0.05, 0.02, expert=(0.0, ebw, elat))
    want = max(rs - 0.05, rs * 0.04) + max(ag - 0.02, ag * 0.04)
    assert _one(got) == pytest.approx(want, rel=1e-12)


def test_interleaved_chunks_reduce_and_gather_one_after_another():
    """With vp model chunks the cool-down's last pp microbatches run their backward chunk
    by chunk and each chunk reduces its gradients after its last backward: exposed
    ``max((T − W)/vp, T − (1 + (vp−1)·pp)·W/vp)`` of a reduction T whose one-microbatch
    window through all the rank's layers is W; vp 1 gives T − W. pp 4, vp 3, T 0.9 s,
    W 0.3 s: max(0.2, 0.9 − 9·0.1) = 0.2 s (the last chunk's own overrun); T 3 s:
    max(0.9, 3 − 0.9) = 2.1 s (the whole chain's). The data-parallel term takes it for both
    the reduction and the gather, never below the last bucket."""
    from configurator.cost.iteration import chunked_exposed_s, dp_exposed_s

    c = _candidates(None, pp=4, vp=3, dp=2, distributed_optimizer=True,
                    overlap_grad_reduce=True, overlap_param_gather=True,
                    global_batch_size=16)
    assert _one(chunked_exposed_s(c, 0.9, 0.3)) == pytest.approx(0.2, rel=1e-12)
    assert _one(chunked_exposed_s(c, 3.0, 0.3)) == pytest.approx(2.1, rel=1e-12)
    flat = _candidates(None, pp=4, dp=2, distributed_optimizer=True, global_batch_size=16)
    assert _one(chunked_exposed_s(flat, 0.9, 0.3)) == pytest.approx(0.6, rel=1e-12)
    params, bw, lat = 4e9, 50e9, 5e-6       # 100 buckets of 40M
    rs = _ring_all_gather(4 * params, 2, bw, 100 * lat)
    ag = _ring_all_gather(2 * params, 2, bw, 100 * lat)
    bwd, fwd = 0.06, 0.03
    want = (max((rs - bwd) / 3, rs - 9 * bwd / 3, rs / 100)
            + max((ag - fwd) / 3, ag - 9 * fwd / 3, ag / 100))
    got = dp_exposed_s(c, params, bw, lat, bwd, fwd)
    assert _one(got) == pytest.approx(want, rel=1e-12)


def test_full_recompute_checkpoint_floors_the_host_bound_passes():
    """A full recompute's checkpoint bookkeeping on the host: its forward operations add to
    the layer's own (host 1.0 + 0.25 s against the GPU's 1.0 + 0.1 s forward: 0.15 s wait);
    backward waits for the layer's own operations' backward share (0.87·1.0 s against
    0.5 + 0.2 s: 0.17 s); the re-run forward takes at least the layer's operations and the
    checkpoint's backward ones (1.0 + 0.5 s against 0.8 s)."""
    from configurator.cost.host_ops import HOST_BACKWARD_FACTOR
    from configurator.cost.iteration import host_bound

    assert HOST_BACKWARD_FACTOR == 0.87
    c = _candidates(make_model(**GQA), recompute="full")
    t = dict(fwd=1.0, bwd=0.5, recompute=0.8, tp_f=0.1, tp_b=0.2, cp_f=0.0, cp_b=0.0,
             ep_f=0.0, ep_b=0.0)
    out = host_bound(c, t, 1.0, checkpoint=(0.25, 0.5))
    assert (_one(out["fwd"]), _one(out["bwd"]), _one(out["recompute"])) == pytest.approx(
        (1.0 + 0.15, 0.5 + 0.17, 1.5), rel=1e-12)


def test_tied_embedding_gradient_joins_the_data_parallel_term():
    """Tied embeddings on 2 stages: the last stage keeps its copy of the word embedding,
    whose gradient the first and last stage all-reduce (fp32, 2 ranks, over the pipeline's
    link) on top of the data-parallel reduction of the larger stage (two layers, the final
    norm and the embedding copy)."""
    from configurator.cost.communication import comm_figures, expert_comm_figures
    from configurator.cost.iteration import dp_exposed_s, iteration_time

    model = make_model(**(GQA | dict(untie_embeddings_and_output_weights=False)))
    cl = load_cluster(H100, nodes=1)
    c = _candidates(model, pp=2, dp=2, distributed_optimizer=True, global_batch_size=8)
    comm = dict(comm_figures(cl, c), **expert_comm_figures(cl, c))
    out = iteration_time(model, cl, c, comm)
    h, V = 256, v_pad(1000, 1)
    last = 2 * _gqa_layer(1) + h + V * h
    dp = dp_exposed_s(c, last, comm["dp_bw"], comm["dp_lat"], 0.0, 0.0)
    bw, lat = _one(comm["pp_bw"]), _one(comm["pp_lat"])
    tied = 2 * lat + 2 * (1 / 2) * 4 * V * h / bw     # ring all-reduce of 4·V·h bytes, 2 ranks
    assert _one(out["dp_comm"]) == pytest.approx(_one(dp) + tied, rel=1e-12)


class _Profile:
    """A layer profile holding one shape, ``(tp 2, cp 1, mbs 1, sequence parallel)``."""

    def lookup(self, tp, cp, mbs, sequence_parallel):
        key = (int(tp), int(cp), int(mbs), bool(sequence_parallel) and int(tp) > 1)
        return (1e-3, 2e-3) if key == (2, 1, 1, True) else None


def test_profiled_layer_times_replace_the_analytic_ones_at_their_shape():
    """A measured layer profile replaces a dense layer's analytic forward and backward where
    it holds the plan's per-rank shape (the backward then adds the weight gradients'
    accumulation into the main gradient, which the profiled layer's fresh gradients do not
    include); elsewhere the analytic times stay."""
    from configurator.cost.compute import profiled_layer_s

    model = make_model(**GQA)
    gpu = _gpu()
    c = _candidates(model, tp=2, sequence_parallel=True)
    assert tuple(map(_one, profiled_layer_s(_Profile(), c, 5.0, 6.0))) == (1e-3, 2e-3)
    lc = layer_costs(model, c, gpu, _Profile())
    assert _one(lc["fwd"]) == 1e-3
    assert _one(lc["bwd"]) == pytest.approx(2e-3 + _one(lc["main_grad_acc"]), rel=1e-12)
    other = _candidates(model, tp=2, micro_batch_size=2, sequence_parallel=True)
    assert tuple(map(_one, profiled_layer_s(_Profile(), other, 5.0, 6.0))) == (5.0, 6.0)


@pytest.mark.parametrize("impl,scope,want", [
    ("local", "['full_iteration']", dict(cuda_graph_impl="local",
                                         cuda_graph_scope="full_iteration")),
    ("full_iteration", "", dict(cuda_graph_impl="local", cuda_graph_scope="full_iteration")),
    ("local", "['attn']", {}),
    ("transformer_engine", "['attn', 'moe_router']",
     dict(cuda_graph_impl="transformer_engine", cuda_graph_scope="attn,moe_router")),
    ("transformer_engine", "full", dict(cuda_graph_impl="transformer_engine",
                                        cuda_graph_scope="")),
    ("none", "", {})])
def test_bridge_recipe_cuda_graph_settings(impl, scope, want):
    """A Megatron-Bridge recipe's CUDA graphs as plan fields: whole-iteration graphs
    (``cuda_graph_impl`` ``full_iteration``, or ``local`` with the ``full_iteration``
    scope) as Megatron's local full-iteration graph; Transformer Engine graphs with their
    scopes (``full``: whole layers, no scope); a local graph of another scope is none the
    plans model."""
    from configurator.cost.groundtruth import bridge_recipe_fields

    rec = dict(recompute_modules="", recompute_granularity="", cuda_graph_impl=impl,
               cuda_graph_scope=scope, tp_comm_overlap="False")
    fields, unmodelled, notes = bridge_recipe_fields(rec, "bf16", make_model(**GQA))
    graph = {k: v for k, v in fields.items() if k.startswith("cuda_graph")}
    assert (graph, unmodelled, notes) == (want, None, [])


@pytest.mark.parametrize("precision,key,field,note", [
    ("fp8", "fp8_dot_product_attention", True, None),
    ("mxfp8", "fp8_dot_product_attention", False, "FP8 attention under MXFP8"),
    ("fp8", "moe_paged_stash", False, "the paged stash"),
    ("bf16", "moe_paged_stash", False, "the paged stash")])
def test_bridge_recipe_settings_left_unpriced(precision, key, field, note):
    """A recipe's FP8 attention is the plan's ``fp8_dot_product_attention`` under FP8 and
    left unpriced (named in the row's notes) under MXFP8; the MoE paged stash is always
    left unpriced."""
    from configurator.cost.groundtruth import bridge_recipe_fields

    rec = dict(recompute_modules="", recompute_granularity="", cuda_graph_impl="none",
               cuda_graph_scope="", tp_comm_overlap="False", fp8_recipe="tensorwise")
    rec[key] = "True"
    fields, unmodelled, notes = bridge_recipe_fields(rec, precision, make_model(**GQA))
    assert fields["fp8_dot_product_attention"] is field and unmodelled is None
    assert notes == ([note] if note else [])


@pytest.mark.parametrize("recipe,want", [("tensorwise", "tensorwise"), ("delayed", "delayed"),
                                         ("blockwise", "blockwise"),
                                         ("blockwise (1x128)", "blockwise"),
                                         ("mxfp8", "tensorwise"), ("", "tensorwise")])
def test_bridge_recipe_fp8_recipe(recipe, want):
    """A recipe's FP8 scaling under FP8: its first word where the plans model it (delayed,
    tensorwise, blockwise), current per-tensor scaling otherwise and where none is given."""
    from configurator.cost.groundtruth import bridge_recipe_fields

    rec = dict(recompute_modules="", recompute_granularity="", cuda_graph_impl="none",
               cuda_graph_scope="", tp_comm_overlap="False", fp8_recipe=recipe)
    fields, _, _ = bridge_recipe_fields(rec, "fp8", make_model(**GQA))
    assert fields["fp8_recipe"] == want


def test_a_papers_gpt_shape_is_whole_numbers():
    """A table's GPT shape (``groundtruth.gpt_model``): head dimension h/a and the 4h MLP as
    integers, as Megatron's ``--kv-channels`` and ``--ffn-hidden-size`` take them."""
    from configurator.cost.groundtruth import gpt_model

    m = gpt_model("gpt-test", 56, 7168, 48, vocab=131072, seq=4096, untied=True)
    assert (m.kv_channels, m.ffn_hidden_size, m.num_query_groups) == (128, 4 * 7168, 56)
    assert all(type(x) is int for x in (m.kv_channels, m.ffn_hidden_size, m.hidden_size))


def test_korthikanti_runs_are_single_replica_plans():
    """Korthikanti et al. Table 3 trains without data parallelism: every run's plan is one
    replica, ``dp = GPUs/(tp·pp) = 1`` as an integer, over the table's GPUs."""
    from configurator.cost.groundtruth import korthikanti_runs

    runs = korthikanti_runs()
    assert len(runs) == 8
    for run in runs:
        p = run.plan
        assert type(p.dp) is int and p.dp == 1 and p.tp * p.pp == run.num_gpus


@pytest.mark.parametrize("tp, cp, dp, pp, ep, etp", [
    (2, 2, 4, 2, 4, 2),     # 32 ranks: expert grid etp 2 × ep 4 × edp 2 × pp 2
    (4, 2, 2, 1, 2, 1),     # 16 ranks: etp 1 × ep 2 × edp 8
    (8, 1, 4, 2, 8, 4),     # 64 ranks: etp 4 × ep 8 × edp 1 × pp 2
])
def test_expert_data_parallel_group_is_the_expert_grids_rest(tp, cp, dp, pp, ep, etp):
    """The expert-data-parallel group (expert gradients reduced and the distributed
    optimizer's expert state sharded over it) is what the expert grid ``etp-ep-edp-pp``
    leaves of the world (megatron-core 0.16.1 parallel_state.py: the expert RankGenerator
    over the same ``tp·cp·dp·pp`` ranks): ``world / (pp·ep·etp)``, context parallelism
    counted among its ranks."""
    plan = ParallelPlan(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, micro_batch_size=1,
                        global_batch_size=8 * dp)
    world = tp * cp * dp * pp
    got = expert_data_parallel_size(PlanBatch.from_plans([plan]))
    assert got.tolist() == [world / (pp * ep * etp)]


@pytest.mark.parametrize("offloaded", [1, 3])
def test_cpu_offloaded_layers_bound_their_passes_by_the_whole_layers_copy(offloaded):
    """CPU offloading of whole layers (cpu_offloaded_passes): an offloaded layer's saved
    tensors, its whole activation bytes, go to the host during the forward and come back
    during the backward at the host link's rate, each pass the longer of its own time and its
    copy; ``N`` of the ``L`` layers do so, so a layer pass is priced at the share ``N / L``
    between its own time and that bound, a dense layer with its bytes and an MoE layer with
    its experts' routed tokens added (mbs 64 makes the copies the longer)."""
    from memory_model.activations import LayerInputs, layer_terms

    model, gpu, c, on, off = _offloading_case(cpu_offloading_num_layers=offloaded)
    t = layer_terms(model, LayerInputs.of_plans(model, c))
    copy = _one(t["layer"]) / gpu.host_link_Bps
    moe_copy = _one(t["layer"] + t["moe_delta"]) / gpu.host_link_Bps
    share = offloaded / model.num_layers
    want = {}
    for key, nbytes_s in (("fwd", copy), ("bwd", copy), ("moe_fwd", moe_copy),
                          ("moe_bwd", moe_copy)):
        own = _one(off[key])
        want[key] = own + share * (max(own, nbytes_s) - own)
    assert copy > _one(off["fwd"])          # the copy binds: the test sees the formula
    got = {k: _one(v) for k, v in on.items() if k in want}
    assert got == pytest.approx(want, rel=1e-12)
