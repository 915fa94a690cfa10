"""Exact values of the memory and cost formulas, each derived here by hand from its source
(Megatron-LM's layer shapes, DeepSeek-V3's multi-latent attention, Korthikanti et al. 2022
Table 2) rather than read back from the model: a wrong operator, constant or dropped term in
``memory_model`` or ``configurator.cost`` changes a figure below (``bench.quality.mutation``
measures how many such mutants these tests catch).

Small models keep the arithmetic checkable: every expected figure is a sum of the tensors
or parameters the cited source names, written out term by term."""

import math

import numpy as np
import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.core.model import make_model
from configurator.core.plan import ParallelPlan
from configurator.core.plan_terms import ROUTER_LOAD_CV
from configurator.cost.communication import comm_figures, expert_comm_figures
from configurator.cost.compute import layer_costs
from configurator.cost.gemm import gemm_time_s, main_grad_accumulation_s
from configurator.cost.iteration import (cp_layer_s, dp_exposed_s, iteration_time,
                                         optimizer_s, stage_extras_s)
from memory_model import estimate_memory
from topology.cluster_files import load_cluster
from topology.collectives import all_to_all_time_s

GiB = 1024 ** 3


def v_pad(vocab, tp):
    """Megatron's padded vocabulary: a multiple of 128·tp (``_vocab_size_with_padding``)."""
    return -(-vocab // (128 * tp)) * 128 * tp


def _plan(**kw):
    base = dict(tp=1, pp=1, dp=1, vp=1, micro_batch_size=1, global_batch_size=8,
                recompute="none", sequence_parallel=False, distributed_optimizer=False,
                overlap_grad_reduce=False, overlap_param_gather=False)
    return ParallelPlan(**(base | kw))


def _batch(**kw):
    """:func:`_plan` as a batch of one (the single-plan form the models take)."""
    return PlanBatch.from_plan(_plan(**kw))


# ---------------------------------------------------------------- parameters (Megatron)

#: Dense GQA model: RMSNorm, SwiGLU, RoPE, untied output layer, no biases (Llama layout).
GQA = dict(num_layers=4, hidden_size=256, num_attention_heads=8, num_query_groups=2,
           kv_channels=32, ffn_hidden_size=512, vocab_size=1000, seq_length=512,
           swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
           untie_embeddings_and_output_weights=True, add_bias_linear=False,
           hidden_dropout=0.0, attention_dropout=0.0)


def _gqa_layer(tp):
    """One Llama-layout layer on one tp rank (megatron/core/models/gpt/gpt_layer_specs.py):
    input norm h, QKV h→(a+2g)·d and proj a·d→h split over tp, pre-MLP norm h, fc1 h→2f and
    fc2 f→h split over tp."""
    h, a, g, d, f = 256, 8, 2, 32, 512
    return h + h * (a + 2 * g) * d / tp + a * d * h / tp + h + (h * 2 * f + f * h) / tp


@pytest.mark.parametrize("tp", [1, 2])
def test_dense_gqa_parameters_per_stage(tp):
    model = make_model(**GQA)
    stages = estimate_memory(model, _batch(tp=tp, pp=2, dp=2, distributed_optimizer=True))
    h, V = 256, v_pad(1000, tp)
    first = 2 * _gqa_layer(tp) + V * h / tp               # two layers + word embedding
    last = 2 * _gqa_layer(tp) + h + V * h / tp            # two layers + final norm + output
    for st, n in zip(stages, (first, last)):
        assert st.parameters_bytes == pytest.approx(2 * n, rel=1e-12)      # bf16 weights
        assert st.gradients_bytes == pytest.approx(4 * n, rel=1e-12)       # fp32 main grads
        assert st.optimizer_bytes == pytest.approx(12 * n / 2, rel=1e-12)  # sharded over dp


#: A DeepSeek-V3-shaped model made small: multi-latent attention (q_lora, kv_lora, decoupled
#: RoPE head dim), a dense first layer then MoE (routed + shared experts), one MTP module.
MLA_MOE = dict(num_layers=2, hidden_size=128, num_attention_heads=4, ffn_hidden_size=256,
               vocab_size=500, seq_length=256, swiglu=True, normalization="RMSNorm",
               position_embedding_type="rope", untie_embeddings_and_output_weights=True,
               add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
               multi_latent_attention=True, qk_layernorm=True, q_lora_rank=64,
               kv_lora_rank=32, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=32,
               num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=64,
               moe_shared_expert_intermediate_size=64, moe_layer_freq=[0, 1],
               mtp_num_layers=1)


def _mla_attention(tp):
    """DeepSeek-V3 attention (multi_latent_attention.py): input norm h; q down h→q_lora and
    its norm; q up q_lora→a·(qk+pos); kv down h→kv_lora+pos and the kv norm; kv up
    kv_lora→a·(qk+v); out a·v→h (up and out split over tp)."""
    h, a, ql, kl, qk, pos, v = 128, 4, 64, 32, 16, 8, 32
    return (h + h * ql + ql + ql * a * (qk + pos) / tp + h * (kl + pos) + kl
            + kl * a * (qk + v) / tp + a * v * h / tp)


def _moe_parts(tp, ep):
    """(non-expert, expert) of one MoE layer: attention, pre-MLP norm, router E·h, shared
    expert (SwiGLU, split over tp); E/ep routed experts of 3·h·fe."""
    h, E, fe, fs = 128, 4, 64, 64
    non_expert = _mla_attention(tp) + h + E * h + 3 * h * fs / tp
    return non_expert, E / ep * 3 * h * fe


def test_mla_moe_mtp_parameters_and_expert_sharding():
    model = make_model(**MLA_MOE)
    tp, pp, dp, ep = 1, 2, 4, 2
    stages = estimate_memory(model, _batch(tp=tp, pp=pp, dp=dp, ep=ep,
                                          distributed_optimizer=True, global_batch_size=16))
    h, V, f = 128, v_pad(500, 1), 256
    dense_layer = _mla_attention(tp) + h + 3 * h * f
    first = dense_layer + V * h                                 # layer 0 + embedding
    ne, ex = _moe_parts(tp, ep)
    # last stage: the MoE layer, final norm, output layer; the MTP module (enorm, hnorm,
    # final norm, the 2h→h projection, one layer of the last layer's type: MoE) and its copy
    # of the word embedding (untied, pp > 1)
    last_ne = ne + h + V * h + (3 * h + 2 * h * h + ne) + V * h
    last_ex = 2 * ex
    assert stages[0].parameters_bytes == pytest.approx(2 * first, rel=1e-12)
    assert stages[1].parameters_bytes == pytest.approx(2 * (last_ne + last_ex), rel=1e-12)
    # optimizer state: non-expert over dp·cp = 4, expert over tp·cp·dp/(ep·etp) = 2
    assert stages[0].optimizer_bytes == pytest.approx(12 * first / dp, rel=1e-12)
    assert stages[1].optimizer_bytes == pytest.approx(12 * last_ne / dp + 12 * last_ex / 2,
                                                      rel=1e-12)


# ---------------------------------------------------------------- activations

def test_korthikanti_sequence_parallel_activations_through_estimate_memory():
    """Korthikanti Table 2, tensor + sequence parallel: ``sbh(34/t + 5as/(ht))`` a layer, plus
    the embedding-dropout mask ``sbh/t`` and the last stage's ``4sbh/t·(1 + V/h)`` (§4.2.2);
    pp 1 keeps one microbatch in flight. The allowance is 2 GiB + 10 % of the activations."""
    L, h, a, s, b, t, V = 4, 1024, 16, 1024, 2, 4, 51200
    model = make_model(num_layers=L, hidden_size=h, num_attention_heads=a, vocab_size=V,
                       seq_length=s)
    st, = estimate_memory(model, _batch(tp=t, micro_batch_size=b, sequence_parallel=True,
                                       attention_backend="local", global_batch_size=8))
    sbh = s * b * h
    want = L * sbh * (34 / t + 5 * a * s / (h * t)) + sbh / t + 4 * sbh / t * (1 + V / h)
    assert st.activations_bytes == pytest.approx(want, rel=1e-12)
    assert st.other_bytes == pytest.approx(2 * GiB + 0.1 * want, rel=1e-12)


#: Dense multi-latent attention (a·v = h, so the projection's input is X·h).
MLA_DENSE = {k: v for k, v in MLA_MOE.items()
             if not k.startswith(("num_experts", "moe_", "mtp_"))}


def _mla_layer_bytes(s, b, t):
    """One MLA layer's activations, flash kernel, bf16, sequence parallel (÷t on the
    replicated terms): norm inputs 2·2Xh, QKV (down projections') input 2Xh, fc1 input 2Xh;
    the latents, replicated: down outputs 2X(q_lora + kv_lora + pos) and the normalised
    latents 2X(q_lora + kv_lora); Q and K of a heads of (qk + pos), V of a heads of v, the
    fp32 log-sum-exp 4aX, all ÷t; proj input 2Xh/t; SwiGLU MLP 4Xf/t + 2Xf/t."""
    h, a, ql, kl, qk, pos, v, f = 128, 4, 64, 32, 16, 8, 32, 256
    X = s * b
    q = 2 * X * a * (qk + pos) / t
    k = 2 * X * a * (qk + pos) / t
    vv = 2 * X * a * v / t
    lse = 4 * a * X / t
    latents = 2 * X * (ql + kl + pos) + 2 * X * (ql + kl)
    return (8 * X * h / t + latents + q + k + vv + lse + 2 * X * h / t + 6 * X * f / t), \
        q + k + vv + lse


def test_mla_activations_with_sequence_parallel():
    model = make_model(**MLA_DENSE)
    s, b, t, L, h = 256, 2, 2, 2, 128
    st, = estimate_memory(model, _batch(tp=t, micro_batch_size=b, sequence_parallel=True,
                                       global_batch_size=8))
    layer, _ = _mla_layer_bytes(s, b, t)
    last = 4 * s * b * h / t + 4 * s * b * v_pad(500, t) / t   # final norm/output input, logits
    assert st.activations_bytes == pytest.approx(L * layer + last, rel=1e-12)


def test_offloaded_core_attention_leaves_the_device():
    """Fine-grained offloading of ``core_attn``: every layer-microbatch but the last one in
    flight moves its Q, K, V and log-sum-exp to the host (pp 1: L layers in flight)."""
    model = make_model(**MLA_DENSE)
    s, b, t, L = 256, 2, 2, 2
    kw = dict(tp=t, micro_batch_size=b, sequence_parallel=True, global_batch_size=8)
    on, = estimate_memory(model, _batch(offload_modules="core_attn", **kw))
    off, = estimate_memory(model, _batch(**kw))
    _, attn = _mla_layer_bytes(s, b, t)
    assert off.activations_bytes - on.activations_bytes == pytest.approx((L - 1) * attn,
                                                                         rel=1e-9)


# ---------------------------------------------------------------- cost model

H100 = "dgx-h100-80gb"


def _one(x) -> float:
    """The single plan's figure of an array of one plan."""
    return float(np.asarray(x, dtype=float).ravel()[0])


def _candidates(model, **kw):
    return PlanBatch.from_plan(_plan(**kw))


def test_mtp_adds_a_projection_a_layer_and_a_logits_pass_on_the_last_stage():
    """Multi-token prediction (multi_token_prediction.py): per module the 2h→h projection,
    one more layer of the last layer's type and its own logits and loss; backward 2× the
    projection and logits GEMMs plus their main-gradient accumulation."""
    with_mtp = make_model(**GQA, mtp_num_layers=1)
    plain = make_model(**GQA)
    gpu = load_cluster(H100, nodes=1).gpu
    c = _candidates(plain, tp=2, micro_batch_size=2)
    lc = layer_costs(with_mtp, c, gpu)
    x = stage_extras_s(with_mtp, c, gpu, lc, 100e9, 1e-6)
    y = stage_extras_s(plain, c, gpu, layer_costs(plain, c, gpu), 100e9, 1e-6)
    T, h = lc["tokens"], 256
    proj = gemm_time_s(T, h / c.tp, 2 * h, **lc["gemm_kw"])
    assert x["emb_fwd"] == pytest.approx(y["emb_fwd"], rel=1e-12)
    assert x["logits_fwd"] == pytest.approx(2 * y["logits_fwd"] + proj + lc["fwd"], rel=1e-12)
    acc = main_grad_accumulation_s(h / c.tp * 2 * h, c, gpu, T)
    assert x["logits_bwd"] == pytest.approx(2 * y["logits_bwd"] + 2 * proj + lc["bwd"] + acc,
                                            rel=1e-12)


def test_optimizer_step_shards_expert_state_over_the_expert_data_parallel_group():
    """Adam reads and writes 2·12 bytes of state, the gradient and the 16-bit weight
    (30 bytes with fp32 state and main grads) per sharded parameter, plus one gradient pass
    over the whole local copy; expert parameters shard over tp·cp·dp/(ep·etp)."""
    gpu = load_cluster(H100, nodes=1).gpu
    c = _candidates(None, tp=2, dp=4, ep=2,
                    distributed_optimizer=True, global_batch_size=8)
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    ne, ex = 3e8, 5e8
    edp = 2 * 4 / 2
    want = (ne * (30 / 4 + 4) + ex * (30 / edp + 4)) / hbm + 20 * gpu.efficiency.kernel_overhead_s
    assert _one(optimizer_s(c, gpu, ne, ex)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("ep", [2, 8])
def test_expert_gradients_reduce_over_the_expert_data_parallel_group(ep):
    """Expert gradients reduce over tp·cp·dp/(ep·etp) ranks (Megatron's expert grid): with
    ep = 8 on 8 GPUs that group is one rank and moves nothing."""
    model = make_model(**{k: v for k, v in MLA_MOE.items() if k != "mtp_num_layers"})
    cl = load_cluster(H100, nodes=1)
    c = _candidates(model, dp=8, ep=ep, distributed_optimizer=True,
                    global_batch_size=64)
    comm = dict(comm_figures(cl, c), **expert_comm_figures(cl, c))
    out = iteration_time(model, cl, c, comm)
    h, V, f = 128, v_pad(500, 1), 256
    ne, ex = _moe_parts(1, ep)
    ne_total = (_mla_attention(1) + h + 3 * h * f) + ne + V * h + h + V * h
    want = dp_exposed_s(c, ne_total, comm["dp_bw"], comm["dp_lat"], 0.0, 0.0)
    edp = 8 / ep
    want = want + (0.0 if edp == 1 else dp_exposed_s(c, ex, comm["edp_bw"], comm["edp_lat"],
                                                     0.0, 0.0, group=edp))
    assert _one(out["dp_comm"]) == pytest.approx(_one(want), rel=1e-9)


def test_cp_all_to_all_moves_q_k_v_and_the_output():
    """Ulysses context parallelism (``a2a``): all-to-all of Q (a heads of d), K and V
    (g heads each) before attention and of the output (a heads) after it, plus the reordering
    copies (read and write of each) at HBM bandwidth; the same in backward."""
    gpu = load_cluster(H100, nodes=1).gpu
    model = make_model(**GQA)
    c = _candidates(model, tp=2, cp=4, cp_comm_type="a2a", global_batch_size=8)
    T, a, g, d, tp, cp = 4096.0, 8, 2, 32, 2, 4
    comm = dict(cp_bw=100e9, cp_lat=2e-6, cp_hop_bw=50e9, cp_hop_lat=5e-6, cp_on_node=8,
                ep_intra_bw=80e9, ep_intra_lat=3e-6)
    lc = dict(tokens=T, attn_fwd=1e-3, attn_bwd=2e-3)
    fwd, bwd = cp_layer_s(model, lc, c, comm, gpu)
    qkv = 2 * T * (a * d + 2 * g * d) / tp
    o = 2 * T * a * d / tp
    moved = (all_to_all_time_s(qkv, cp, 8, 100e9, 2e-6, 50e9, 5e-6)
             + all_to_all_time_s(o, cp, 8, 100e9, 2e-6, 50e9, 5e-6))
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    want = moved + 4 * (qkv + o) / hbm + 4 * gpu.efficiency.kernel_overhead_s
    assert _one(fwd) == pytest.approx(_one(want), rel=1e-12)
    assert _one(bwd) == pytest.approx(_one(want), rel=1e-12)


def test_mla_projection_gemm_widths():
    """DeepSeek-V3 attention's GEMMs (multi_latent_attention.py), T tokens: q down
    h→q_lora and q up q_lora→a·(qk+pos)/t; kv down h→kv_lora+pos and kv up
    kv_lora→a·(qk+v)/t (the down projections replicated over tp); out a·v/t→h. Recomputing
    ``mla_up_proj`` re-runs the two up projections and the fused RoPE of Q and K (read and
    write, 2 bytes each, of a·(qk+pos)/t and g·(qk+pos)/t values a token; two kernels), and
    ``CheckpointWithoutOutput`` copies the re-run query, key and value back into their freed
    storage (read and write 2 bytes each of a·(2·(qk+pos)+v)/t values a token; one kernel)."""
    model = make_model(**MLA_DENSE)
    gpu = load_cluster(H100, nodes=1).gpu
    h, a, ql, kl, qk, pos, v, t = 128, 4, 64, 32, 16, 8, 32, 2
    c = _candidates(model, tp=t, micro_batch_size=2, sequence_parallel=True)
    lc = layer_costs(model, c, gpu)
    T, kw = lc["tokens"], lc["gemm_kw"]
    up = gemm_time_s(T, a * (qk + pos) / t, ql, **kw) + gemm_time_s(T, a * (qk + v) / t, kl,
                                                                     **kw)
    qkv = gemm_time_s(T, ql, h, **kw) + gemm_time_s(T, kl + pos, h, **kw) + up
    (got_qkv, got_proj), _ = lc["tp_gemm_pairs"]
    assert _one(got_qkv) == pytest.approx(_one(qkv), rel=1e-12)
    assert _one(got_proj) == pytest.approx(_one(gemm_time_s(T, h, a * v / t, **kw)), rel=1e-12)
    c_up = _candidates(model, tp=t, micro_batch_size=2, sequence_parallel=True,
                       recompute="selective", recompute_modules="mla_up_proj")
    lc_up = layer_costs(model, c_up, gpu)
    g = model.num_query_groups
    eff = gpu.efficiency
    rope = 4 * T * (a + g) * (qk + pos) / t / (gpu.hbm_bandwidth_Bps * eff.hbm)
    restore = 4 * T * a * (2 * (qk + pos) + v) / t / (gpu.hbm_bandwidth_Bps * eff.hbm)
    assert _one(lc_up["recompute"]) == pytest.approx(
        _one(up + rope + restore + 3 * eff.kernel_overhead_s), rel=1e-12)


def test_placed_plan_reduces_expert_gradients_over_the_expert_data_parallel_group():
    """The placed plan's data-parallel tail on one uniform node: the closed form's figure
    (non-expert over dp·cp, expert over tp·cp·dp/(ep·etp))."""
    from configurator.cost.placed import PlacedPlan

    model = make_model(**{k: v for k, v in MLA_MOE.items() if k != "mtp_num_layers"})
    cl = load_cluster(H100, nodes=1)
    plan = _plan(dp=8, ep=2, distributed_optimizer=True, global_batch_size=64)
    placed = PlacedPlan(model, cl, PlanBatch.from_plan(plan))
    tail = placed.terms(placed.rank_gpus(*placed.default_placement()))["tail"]
    closed = iteration_time(model, cl, PlanBatch.from_plan(plan))["dp_comm"]
    assert _one(tail) == pytest.approx(_one(closed), rel=1e-9)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_dense_layer_time_is_its_gemms_attention_and_elementwise_passes(precision):
    """One Llama-layout layer (flash attention, fused RoPE, no dropout, sequence parallel),
    T = b·s tokens: the four GEMMs (QKV h→(a+2g)·d/t, proj a·d/t→h, fc1 h→2f/t, fc2
    f/t→h); causal attention, ½ of 2·b·s²·a·(d+d)/t multiply-adds at the fused kernel's
    attained rate, backward 2.5×; the elementwise passes, 2·4 + 2·6 bytes of each replicated
    (÷t) element, 6 per SwiGLU element and 4 per RoPE-rotated Q/K element, and 10 kernels;
    under FP8 the casts of the GEMM inputs (a·d/t + f/t a token, and the 2h/t of QKV's and
    fc1's in their norms' kernels, whose 16-bit writes they save) and of the output
    gradients ((a+2g)·d/t + 2h/t + 2f/t). Backward: 2× the GEMMs and passes, plus the
    weight gradients' accumulation into the main gradient."""
    from configurator.core.plan_values import mfu_peak_precision
    from configurator.cost.compute import flash_efficiency
    from configurator.cost.gemm import (fp8_norm_cast_bytes, fp8_norm_quantize_s,
                                        fp8_quantize_s, fp8_scaling)

    model = make_model(**GQA)
    gpu = load_cluster(H100, nodes=1).gpu
    eff = gpu.efficiency
    h, a, g, d, f, s, b, t = 256, 8, 2, 32, 512, 512, 2, 2
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True,
                    precision=precision)
    lc = layer_costs(model, c, gpu)
    T, kw = b * s, lc["gemm_kw"]
    assert _one(lc["tokens"]) == T
    gemms = (gemm_time_s(T, (a + 2 * g) * d / t, h, **kw) + gemm_time_s(T, h, a * d / t, **kw)
             + gemm_time_s(T, 2 * f / t, h, **kw) + gemm_time_s(T, h, f / t, **kw))
    peak16 = gpu.peak(mfu_peak_precision(precision))
    attn = eff.kernel_overhead_s + 0.5 * 2 * b * s * s * a * 2 * d / t / (
        peak16 * flash_efficiency(eff.flash_attention, s, 1.0))
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    elem = (8 + 12) * T * h / t + 6 * T * f / t + 4 * T * (a + g) * d / t
    cast_f = cast_b = 0.0
    if precision == "fp8":
        scaling = fp8_scaling(c)
        cast_f = (fp8_quantize_s(T * (a * d / t + f / t), gpu, scaling)
                  + fp8_norm_quantize_s(T * 2 * h / t, gpu, scaling)
                  - T * 2 * h / t * fp8_norm_cast_bytes(gpu, scaling)[1] / hbm)
        cast_b = fp8_quantize_s(T * ((a + 2 * g) * d / t + 2 * h / t + 2 * f / t), gpu,
                                scaling)
    fwd = gemms + attn + elem / hbm + 10 * eff.kernel_overhead_s + cast_f
    acc = main_grad_accumulation_s(_gqa_layer(t), c, gpu, T)
    bwd = 2 * gemms + 2.5 * attn + 2 * elem / hbm + 20 * eff.kernel_overhead_s + cast_b + acc
    assert _one(lc["attn_fwd"]) == pytest.approx(_one(attn), rel=1e-12)
    assert _one(lc["fwd"]) == pytest.approx(_one(fwd), rel=1e-12)
    assert _one(lc["bwd"]) == pytest.approx(_one(bwd), rel=1e-12)
    assert _one(lc["main_grad_acc"]) == pytest.approx(_one(acc), rel=1e-12)
    # recompute: selective re-runs core attention, full the whole forward
    for recompute, want in (("selective", attn), ("full", fwd)):
        c_r = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True,
                          precision=precision, recompute=recompute)
        assert _one(layer_costs(model, c_r, gpu)["recompute"]) == pytest.approx(_one(want),
                                                                                rel=1e-12)


def test_expert_exchange_times():
    """NCCL all-to-all dispatch (every routed copy, 16-bit, ``k·X`` a rank) and the
    de-duplicated flex dispatch (a token crosses the network once per remote NVLink domain
    its k experts lie in, NVLink once per other rank: ``1 − C(E − E/G, k)/C(E, k)`` of the
    G groups); a layer exposes the dispatch and combine forward, their gradients backward,
    and again under full recompute; under the all-to-all overlap each exchange hides behind
    the compute it pairs with, ``max(comm, comp + 0.189·min(comm, comp))``."""
    from configurator.cost.expert_comm import a2a_s, distinct_share, ep_layer_s

    assert _one(distinct_share(16, 2, 2)) == pytest.approx(1 - 28 / 120, rel=1e-12)
    assert _one(distinct_share(16, 2, 16)) == pytest.approx(1 - 105 / 120, rel=1e-12)
    model = make_model(**{k: v for k, v in MLA_MOE.items() if k != "mtp_num_layers"}
                       | dict(num_experts=16))
    h, k, R = 128, 2, 4096.0
    x = dict(ep_on_node=8, ep_intra_bw=400e9, ep_intra_lat=3e-6, ep_inter_bw=40e9,
             ep_inter_lat=8e-6, etp_bw=300e9, etp_lat=2e-6)
    lc = dict(tokens_routed=R, moe_experts_fwd=2e-4, moe_fwd=5e-4, moe_bwd=1.1e-3)
    kw = dict(dp=16, ep=16, distributed_optimizer=True, global_batch_size=64)
    c = _candidates(model, **kw)
    one = all_to_all_time_s(2 * R * h, 16, 8, 400e9, 3e-6, 40e9, 8e-6)
    assert _one(a2a_s(model, lc, c, x)) == pytest.approx(_one(one), rel=1e-12)
    fwd, bwd = ep_layer_s(model, lc, c, x)
    assert (_one(fwd), _one(bwd)) == pytest.approx((2 * _one(one), 2 * _one(one)), rel=1e-12)
    _, bwd_full = ep_layer_s(model, lc, _candidates(model, recompute="full", **kw), x)
    assert _one(bwd_full) == pytest.approx(4 * _one(one), rel=1e-12)
    flex = _candidates(model, moe_token_dispatcher_type="flex", **kw)
    tokens = R / k
    rdma = 2 * h * tokens * (2 - 1) * (1 - 28 / 120)
    nvl = 2 * h * tokens * 15 * (1 - 105 / 120)
    assert _one(a2a_s(model, lc, flex, x)) == pytest.approx(
        8e-6 + max(rdma / 40e9, nvl / 400e9), rel=1e-12)
    over = _candidates(model, overlap_moe_expert_parallel_comm=True, **kw)
    t = _one(one)

    def seg(comm, comp):
        return max(comm, comp + 0.189 * min(comm, comp))
    m_f, m_b = 2e-4, 4e-4
    a_f, a_b = 5e-4 - m_f, 1.1e-3 - m_b
    pair = seg(t, a_f) + seg(t, m_b) + seg(t, m_f) + seg(t, a_b)
    exposed_pair = max(pair - (a_f + a_b + m_f + m_b), 0.0)
    m = 64 // 16            # microbatches: gbs / (dp·mbs)
    share = (m - 1) / m      # all but the first forward and the last backward
    want = (share * exposed_pair + (1 - share) * 4 * t) / 2
    fwd, bwd = ep_layer_s(model, lc, over, x)
    assert (_one(fwd), _one(bwd)) == pytest.approx((want, want), rel=1e-12)


def test_model_flops_of_mla_moe_mtp_and_gqa_models():
    """Megatron-LM core_v0.16.1 ``num_floating_point_operations``, term by term: 6·B·s times
    the multiply-adds a token runs. MLA: q down and up ``r_q·(h + a·(qk+pos) + 1)``, kv down
    and up ``r_kv·(h + a·(qk+v) + 1) + h·pos``, out ``a·v·h``, causal scores
    ``s·a·(qk+pos)/2 + s·a·v/2``; SwiGLU MLPs 3·f·h, MoE layers 3·h·(k·f_e + f_shared);
    the MTP layer takes the last layer's type, plus its norms and 2h→h projection, and one
    more logits GEMM. GQA: ``h·(a·d + 2·g·d) + a·d·s + a·d·h`` (scores doubled when not
    causal)."""
    from configurator.cost.flops import megatron_model_flops

    B, s = 4, 256
    h, a, ql, kl, qk, pos, v, f = 128, 4, 64, 32, 16, 8, 32, 256
    E_k, fe, fs, V = 2, 64, 64, 512
    attn = (ql * (h + a * (qk + pos) + 1) + kl * (h + a * (qk + v) + 1) + h * pos + a * v * h
            + s * a * (qk + pos) / 2 + s * a * v / 2)
    mlp = 3 * f * h * 1 + 3 * h * (E_k * fe + fs) * 2      # 1 dense; MoE layer + MTP's
    want = 6 * B * s * (mlp + 3 * attn + (3 * h + 2 * h * h) + h * V * 2)
    got = megatron_model_flops(make_model(**MLA_MOE), B)
    assert got == pytest.approx(want, rel=1e-12)
    L, hh, aa, g, d, ff, VV = 4, 256, 8, 2, 32, 512, v_pad(1000, 1)
    gqa_attn = hh * (aa * d + 2 * g * d) + aa * d * 512 + aa * d * hh
    want = 6 * B * 512 * (3 * ff * hh * L + L * gqa_attn + hh * VV)
    assert megatron_model_flops(make_model(**GQA), B) == pytest.approx(want, rel=1e-12)
    noncausal = want + 6 * B * 512 * L * aa * d * 512
    assert megatron_model_flops(make_model(**GQA), B, causal=False) == pytest.approx(
        noncausal, rel=1e-12)


def _gqa_flash_layer_bytes(s, b, t):
    """One Llama-layout layer's activations, flash kernel, bf16, sequence parallel: norm
    inputs 2·2Xh, QKV and fc1 inputs 2Xh each (÷t); contiguous Q (a heads), K and V
    (max(g, t) heads of d each over t ranks) and the fp32 log-sum-exp 4aX/t; proj input
    2Xh/t; SwiGLU MLP 4Xf/t + 2Xf/t."""
    h, a, g, d, f = 256, 8, 2, 32, 512
    X = s * b
    qkv = 2 * X * d * (a + 2 * max(g, t)) / t
    return 8 * X * h / t + qkv + 4 * a * X / t + 2 * X * h / t + 6 * X * f / t


def test_moe_layer_activations_with_sequence_parallel():
    """An MoE layer keeps what a dense one does but its MLP's: X/t tokens a rank, R = k·X/t·I
    routed copies on the busiest rank (etp 1; I = 1 + c·sqrt(2·2·ln 2/4), the busiest of ep 2
    ranks' load of E 4 experts under dropless routing); the permuted input 2Rh, fc1 output
    4R·f_e and fc2 input 2R·f_e, the per-copy probabilities 2R, the router's scores, map and probabilities 7·X·E/t, the
    int64 indices and fp32 top-k probabilities 20·X·k/t (megatron-core 0.16.1, measured on
    CPU in tests/megatron_reference.py)."""
    E, k, fe = 4, 2, 64
    model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe,
                       moe_layer_freq=[0, 1, 0, 1])
    s, b, t, h, f = 512, 2, 2, 256, 512
    st, = estimate_memory(model, _batch(tp=t, dp=2, ep=2, micro_batch_size=b,
                                       sequence_parallel=True, global_batch_size=8))
    X = s * b
    dense = _gqa_flash_layer_bytes(s, b, t)
    R = k * X / t * (1 + ROUTER_LOAD_CV["per_batch"] * math.sqrt(2 * 2 * math.log(2) / E))
    moe = dense - 6 * X * f / t + (2 * R * h + 6 * R * fe + 2 * R + 7 * X / t * E
                                   + 20 * X / t * k)
    last = 4 * X * h / t + 4 * X * v_pad(1000, t) / t
    assert st.activations_bytes == pytest.approx(2 * dense + 2 * moe + last, rel=1e-12)


def test_gqa_activations_under_recompute():
    """Full recompute keeps each layer's input 2Xh/t (÷t with SP) and, in the backward of
    the last layer, re-materialises that layer (its activations less its input, the
    checkpoint); selective recompute with a flash kernel keeps the handed Q, K, V storages
    (the QKV output M = 2X·d·(a + 2·max(g,t))/t plus RoPE's new Q and K) instead of the
    kernel's copies and log-sum-exp, and in backward re-runs core attention (M, the output
    2Xh/t and the log-sum-exp again) after the last layer's forward terms are freed."""
    model = make_model(**GQA)
    s, b, t, h, a, g, d, L = 512, 2, 2, 256, 8, 2, 32, 4
    X = s * b
    kw = dict(tp=t, micro_batch_size=b, sequence_parallel=True, global_batch_size=8)
    full, = estimate_memory(model, _batch(recompute="full", **kw))
    layer = _gqa_flash_layer_bytes(s, b, t)
    last = 4 * X * h / t + 4 * X * v_pad(1000, t) / t
    ckpt = 2 * X * h / t
    # forward end: L checkpoints and the output-layer terms; backward of the last layer:
    # L - 1 checkpoints, the checkpoint and the layer's re-materialised activations
    assert full.activations_bytes == pytest.approx(max(L * ckpt + last, L * ckpt + layer - ckpt),
                                                   rel=1e-12)
    sel, = estimate_memory(model, _batch(recompute="selective", **kw))
    M = 2 * X * d * (a + 2 * max(g, t)) / t
    q, kv = 2 * X * a * d / t, 2 * X * d * max(g, t) / t
    handed = M + q + kv                     # M, RoPE's new Q (GQA) and new K
    lse = 4 * a * X / t
    kept = layer - (M + lse) + handed
    left = (2 + 2) * X * h / t + handed     # norm input, QKV input, the checkpointed Q, K, V
    working = M + 2 * X * h / t + lse
    want = max(L * kept + last, (L - 1) * kept + left + working)
    assert sel.activations_bytes == pytest.approx(want, rel=1e-12)


def test_gemm_roofline_accumulation_and_fp8_cast():
    """A GEMM M×K·K×N: ``max(2MNK / (peak·η), (in_bytes·(MK + KN) + 2MN) / HBM) + 10.7 µs``
    (compute- and memory-bound shapes both checked); the main-gradient accumulation reads
    and writes 4-byte main grads, ``2·4·weights / HBM`` scaled by ``min(1, 1400/tokens)``;
    an FP8 cast moves 4 bytes an element (+2 with current scaling) at 0.39 of the HBM."""
    gpu = load_cluster(H100, nodes=1).gpu
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    peak, eta = 1e15, 0.7
    kw = dict(batch=1.0, peak=peak, gpu=gpu, in_bytes=2.0, gemm_eff=eta)
    assert gemm_time_s(4096, 4096, 4096, **kw) == pytest.approx(
        2 * 4096 ** 3 / (peak * eta) + 10.7e-6, rel=1e-12)
    slim = (2 * (8 * 4096 + 4096 * 4096) + 2 * 8 * 4096) / hbm   # 8 tokens: weight-bound
    assert gemm_time_s(8, 4096, 4096, **kw) == pytest.approx(slim + 10.7e-6, rel=1e-12)
    assert gemm_time_s(8, 4096, 4096, **dict(kw, batch=3.0)) == pytest.approx(
        3 * slim + 10.7e-6, rel=1e-12)
    c = _candidates(None)
    assert _one(main_grad_accumulation_s(1e6, c, gpu)) == pytest.approx(8e6 / hbm, rel=1e-12)
    assert _one(main_grad_accumulation_s(1e6, c, gpu, 8192)) == pytest.approx(
        8e6 / hbm * 1400 / 8192, rel=1e-12)
    assert _one(main_grad_accumulation_s(1e6, c, gpu, 1024)) == pytest.approx(8e6 / hbm,
                                                                               rel=1e-12)
    from configurator.cost.gemm import fp8_quantize_s

    raw = gpu.hbm_bandwidth_Bps * 0.39
    assert fp8_quantize_s(1e6, gpu) == pytest.approx(4e6 / raw, rel=1e-12)
    assert fp8_quantize_s(1e6, gpu, "tensorwise") == pytest.approx(6e6 / raw, rel=1e-12)
    assert fp8_quantize_s(1e6, gpu, "mxfp8") == pytest.approx(1e6 * (4 + 2 / 32) / raw,
                                                              rel=1e-12)


def test_tensor_parallel_collectives_per_layer():
    """Two all-reduces (or all-gather + reduce-scatter pairs) of ``T·h`` 16-bit values a layer
    forward, exposed; two backward under the QKV and fc1 weight-gradient GEMMs, exposed beyond
    them, plus the forward's two again under full recompute (one with the ``mlp`` module).
    With ``tp_comm_overlap`` each half-collective ``t/2`` hides behind its GEMM: a ring
    exchange exposes ``max(t/2 − g, 0)``, a pipelined or bulk overlap
    ``max(t/2, g·S/(S − 16)) − g`` (its GEMM on S − 16 of S SMs)."""
    from configurator.core.plan_batch import PlanBatch as C
    from configurator.cost.iteration import tp_layer_s
    from topology.collectives import all_reduce_time_s

    lc = dict(tp_gemm_pairs=((3e-5, 2e-5), (7e-5, 4e-5)))
    act, bw, lat, sms = 2 * 4096 * 1024.0, 100e9, 5e-6, 132
    t = all_reduce_time_s(act, 4.0, bw, lat)
    c = C.from_plan(_plan(tp=4, sequence_parallel=True))
    fwd, bwd = tp_layer_s(lc, c, act, bw, lat, sms)
    assert (_one(fwd), _one(bwd)) == pytest.approx((2 * t, max(2 * t - 1e-4, 0.0)), rel=1e-12)
    full = C.from_plan(_plan(tp=4, sequence_parallel=True, recompute="full"))
    assert _one(tp_layer_s(lc, full, act, bw, lat, sms)[1]) == pytest.approx(
        2 * t + max(2 * t - 1e-4, 0.0), rel=1e-12)
    mlp = C.from_plan(_plan(tp=4, sequence_parallel=True, recompute="selective",
                            recompute_modules="mlp"))
    assert _one(tp_layer_s(lc, mlp, act, bw, lat, sms)[1]) == pytest.approx(
        t + max(2 * t - 1e-4, 0.0), rel=1e-12)
    over = C.from_plan(_plan(tp=4, sequence_parallel=True, tp_comm_overlap=True))
    half, S = t / 2, sms / (sms - 16)

    def ring(g):
        return max(half - g, 0.0)

    def margin(g):
        return max(half, S * g) - g
    pairs = lc["tp_gemm_pairs"]
    want_f = sum(ring(gi) + margin(go) for gi, go in pairs)
    want_b = sum(ring(go) + 2 * margin(gi) for gi, go in pairs)
    fwd, bwd = tp_layer_s(lc, over, act, bw, lat, sms)
    assert (_one(fwd), _one(bwd)) == pytest.approx((want_f, want_b), rel=1e-12)


def test_the_backward_all_reduce_before_its_overlap_with_the_weight_gradient():
    """Without ``async_tensor_model_parallel_allreduce`` (Megatron-LM before cf7efd4,
    2021-08-30) the backward's two input-gradient all-reduces run before the weight-gradient
    GEMMs, exposed whole: ``2t`` (with full recompute ``2t + 2t``), where with it they hide
    under those GEMMs (``max(2t − g, 0)``). Sequence parallelism's backward collectives keep
    their overlap either way (Megatron turned the flag off with it and overlapped them its
    own way); the forward is the same."""
    from configurator.core.plan_batch import PlanBatch as C
    from configurator.cost.iteration import tp_layer_s
    from topology.collectives import all_reduce_time_s

    lc = dict(tp_gemm_pairs=((3e-5, 2e-5), (7e-5, 4e-5)))
    act, bw, lat, sms = 2 * 4096 * 1024.0, 100e9, 5e-6, 132
    t = all_reduce_time_s(act, 4.0, bw, lat)
    assert 2 * t > 1e-4 > 0     # the GEMMs hide part of it, not all: the two cases differ
    for recompute, rerun in (("none", 0.0), ("full", 2 * t)):
        on, off, sp_off = (C.from_plan(_plan(tp=4, sequence_parallel=sp, recompute=recompute,
                                             async_tensor_model_parallel_allreduce=a))
                           for sp, a in ((False, True), (False, False), (True, False)))
        f_on, b_on = tp_layer_s(lc, on, act, bw, lat, sms)
        f_off, b_off = tp_layer_s(lc, off, act, bw, lat, sms)
        assert _one(f_off) == pytest.approx(_one(f_on), rel=1e-12)
        assert _one(b_on) == pytest.approx(rerun + 2 * t - 1e-4, rel=1e-12)
        assert _one(b_off) == pytest.approx(rerun + 2 * t, rel=1e-12)
        assert _one(tp_layer_s(lc, sp_off, act, bw, lat, sms)[1]) == pytest.approx(
            _one(b_on), rel=1e-12)


def test_pipeline_send_tied_embedding_and_data_parallel_reduction():
    """A pipeline send: ``T·h`` 16-bit values ÷ tp, plus the all-gather that rebuilds them
    without sequence parallelism. The tied embedding's gradient all-reduce between the first
    and last stage (fp32, 2 ranks), none when untied. Data-parallel: the gradients'
    reduce-scatter and the weights' all-gather with the distributed optimizer (all-reduce
    without), over dp·cp, minus the windows they overlap, never below one bucket's share
    (max(40M, 1M·dp) parameters); with Megatron FSDP every microbatch gathers and scatters."""
    from configurator.core.plan_batch import PlanBatch as C
    from configurator.cost.iteration import p2p_message_s, tied_embedding_s
    from topology.collectives import all_gather_time_s, all_reduce_time_s, p2p_time_s

    model = make_model(**GQA)
    T, h = 4096.0, 256
    act = 2 * T * h
    lc = dict(tokens=T)
    sp = C.from_plan(_plan(tp=4, pp=2, sequence_parallel=True))
    assert _one(p2p_message_s(model, sp, lc, 50e9, 4e-6, 200e9, 2e-6)) == pytest.approx(
        p2p_time_s(act / 4, 50e9, 4e-6), rel=1e-12)
    nosp = C.from_plan(_plan(tp=4, pp=2))
    assert _one(p2p_message_s(model, nosp, lc, 50e9, 4e-6, 200e9, 2e-6)) == pytest.approx(
        p2p_time_s(act / 4, 50e9, 4e-6) + all_gather_time_s(act, 4.0, 200e9, 2e-6), rel=1e-12)
    tied = make_model(**(GQA | dict(untie_embeddings_and_output_weights=False)))
    emb = v_pad(1000, 4) * h / 4
    assert _one(tied_embedding_s(tied, sp, 50e9, 4e-6)) == pytest.approx(
        all_reduce_time_s(emb * 4, 2.0, 50e9, 4e-6), rel=1e-12)
    assert _one(tied_embedding_s(model, sp, 50e9, 4e-6)) == 0.0
    assert _one(tied_embedding_s(tied, C.from_plan(_plan(tp=4)), 50e9, 4e-6)) == 0.0

    P, bw, lat = 2e8, 100e9, 1e-5
    n_buckets = 5                     # 200M parameters in buckets of 40M (dp 8: max(40M, 8M))
    base = dict(dp=8, global_batch_size=64)
    do = C.from_plan(_plan(distributed_optimizer=True, **base))
    rs = all_gather_time_s(P * 4, 8.0, bw, lat * n_buckets)
    ag = all_gather_time_s(P * 2, 8.0, bw, lat * n_buckets)
    assert _one(dp_exposed_s(do, P, bw, lat, 0.01, 0.01)) == pytest.approx(rs + ag, rel=1e-12)
    plain = C.from_plan(_plan(**base))
    ar = all_reduce_time_s(P * 4, 8.0, bw, lat * n_buckets)
    assert _one(dp_exposed_s(plain, P, bw, lat, 0.01, 0.01)) == pytest.approx(ar, rel=1e-12)
    over = C.from_plan(_plan(distributed_optimizer=True, overlap_grad_reduce=True,
                             overlap_param_gather=True, **base))
    for win in (1e-4, 1.0):
        want = max(rs - win, rs / n_buckets) + max(ag - win, ag / n_buckets)
        assert _one(dp_exposed_s(over, P, bw, lat, win, win)) == pytest.approx(want, rel=1e-12)
    fsdp = C.from_plan(_plan(distributed_optimizer=True, megatron_fsdp=True, **base))
    g1 = all_gather_time_s(P * 2, 8.0, bw, lat)
    s1 = all_gather_time_s(P * 4, 8.0, bw, lat)
    m = 64 // 8
    want = m * (max(g1 - 1e-3, 0.0) + max(g1 + s1 - 2e-3, 0.0))
    assert _one(dp_exposed_s(fsdp, P, bw, lat, 2e-3, 1e-3)) == pytest.approx(want, rel=1e-12)


def test_host_issue_time_and_eager_kernels():
    """Host operations a layer's forward issues: 40 a dense layer (23 its attention); an MoE
    layer the attention's 23 and the MLP's 17, 30 each to route, preprocess and dispatch, 2
    per local expert (FP8 too: its weights cast once an iteration, its inputs in one call), less
    12 with the router fusion and 10 with the permute fusion; CUDA graphs replay what they capture. Eager kernels move their bytes at
    ``min(η·HBM, 14.7 GB/s per SM)`` plus a launch each; a clamp 8 and 15 bytes an element in
    3 and 7 kernels; offloaded bytes go over the host link beside the pass."""
    from configurator.cost.host_ops import (clamp_s, eager_s, host_layer_s,
                                            offload_exposed)

    gpu = load_cluster(H100, nodes=1).gpu
    op = gpu.efficiency.host_op_s
    E = 8
    moe = make_model(**GQA, num_experts=E, moe_router_topk=2, moe_ffn_hidden_size=64)
    base = dict(dp=8, ep=4, global_batch_size=64)
    dense, moe_s = host_layer_s(moe, _candidates(moe, **base), gpu)
    assert (_one(dense), _one(moe_s)) == pytest.approx(
        (40 * op, (23 + 17 + 90 + 2 * E / 4) * op), rel=1e-12)
    fused = _candidates(moe, precision="fp8", moe_router_fusion=True, moe_permute_fusion=True,
                        **base)
    assert _one(host_layer_s(moe, fused, gpu)[1]) == pytest.approx(
        (23 + 17 + 90 + 2 * E / 4 - 12 - 10) * op, rel=1e-12)
    graphs = _candidates(moe, cuda_graph_impl="transformer_engine",
                         cuda_graph_scope="attn moe_router", **base)
    dense, moe_s = host_layer_s(moe, graphs, gpu)
    assert (_one(dense), _one(moe_s)) == pytest.approx(
        (17 * op, (17 + 60 + 2 * E / 4) * op), rel=1e-12)
    bw = min(gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm, 14.7e9 * gpu.num_sms)
    kov = gpu.efficiency.kernel_overhead_s
    assert eager_s(1e9, 3, gpu) == pytest.approx(1e9 / bw + 3 * kov, rel=1e-12)
    clamped = make_model(**GQA, activation_func_clamp_value=7.0)
    assert clamp_s(clamped, 1e8, gpu) == pytest.approx(
        (8e8 / bw + 3 * kov, 15e8 / bw + 7 * kov), rel=1e-12)
    assert clamp_s(make_model(**GQA), 1e8, gpu) == (0.0, 0.0)
    copy = 1e9 / gpu.host_link_Bps
    assert offload_exposed(1e9, gpu, copy / 2, copy * 2) == pytest.approx((copy, copy * 2),
                                                                          rel=1e-12)


@pytest.mark.parametrize("vp", [1, 2])
def test_iteration_time_assembles_the_pipeline_schedule(vp):
    """SC'21 §2.2 on two stages of four layers: m microbatches at the slower stage's pace
    (its layers' forward, backward and exposed tensor-parallel terms, plus its end's extra:
    embedding or logits and loss), the bubble the other stage once (1F1B) or, interleaved,
    ``(others − lighter end)/vp + pp·lighter end``; sends ``m + 2(pp − 1)`` (1F1B) or
    ``2(pp·vp − 1)`` at one send each (one uniform node); the data-parallel reduction of the
    larger stage's parameters and Adam's step over them; the breakdown sums to the time.
    Each stage's backward is one stretch of host and GPU work: its layers' passes take
    what :func:`backward_overlap_s` saves off, the last stage's logits what of their
    backward it hides (at micro-batch 1 these small layers wait for the host)."""
    from configurator.cost.iteration import (backward_overlap_s, layer_type_times,
                                             p2p_message_s)

    model = make_model(**(GQA | dict(num_layers=8, hidden_size=1024, num_attention_heads=8,
                                     kv_channels=128, ffn_hidden_size=4096,
                                     seq_length=2048)))
    cl = load_cluster(H100, nodes=1)
    gpu = cl.gpu
    m, dp = 8, 2
    c = _candidates(model, tp=2, pp=2, vp=vp, dp=dp, micro_batch_size=1,
                    sequence_parallel=True, distributed_optimizer=True,
                    global_batch_size=m * dp)
    comm = dict(comm_figures(cl, c), **expert_comm_figures(cl, c))
    out = iteration_time(model, cl, c, comm)
    lc = layer_costs(model, c, gpu)
    d = layer_type_times(model, c, lc, comm)["dense"]
    layer = sum(_one(d[k]) for k in ("fwd", "bwd", "recompute", "tp_f", "tp_b", "cp_f", "cp_b"))
    x = {k: _one(v) for k, v in stage_extras_s(model, c, gpu, lc, comm["tp_bw"],
                                               comm["tp_lat"]).items()}
    emb, logits = x["emb_fwd"] + x["emb_bwd"], x["logits_fwd"] + x["logits_bwd"]
    types = layer_type_times(model, c, lc, comm)
    saved = _one(sum(backward_overlap_s(types, 4, 0)))
    hidden = _one(backward_overlap_s(types, 4, 0, x["logits_bwd"])[2])
    assert saved >= 0 and 0 < hidden <= x["logits_bwd"] * (1 + 1e-12)
    logits -= hidden
    first, last = 4 * layer - saved + emb, 4 * layer - saved + logits
    pace, other = max(first, last), min(first, last)
    assert _one(out["compute"]) + _one(out["tp_comm"]) + _one(out["recompute"]) == \
        pytest.approx(m * pace, rel=1e-9)
    lighter = min(emb, logits)
    bubble = other if vp == 1 else (other - lighter) / vp + 2 * lighter
    assert _one(out["bubble"]) == pytest.approx(bubble, rel=1e-9)
    send = _one(p2p_message_s(model, c, lc, comm["pp_bw"], comm["pp_lat"], comm["tp_bw"],
                              comm["tp_lat"]))
    sends = m + 2 * (2 - 1) if vp == 1 else 2 * (2 * vp - 1)
    assert _one(out["pp_comm"]) == pytest.approx(sends * send, rel=1e-9)
    h, f, V = 1024, 4096, v_pad(1000, 2)
    layer_params = h + h * (8 + 4) * 128 / 2 + 8 * 128 * h / 2 + h + 3 * h * f / 2
    big = 4 * layer_params + max(V * h / 2, h + V * h / 2)
    fwd_win = 4 * _one(d["fwd"])
    bwd_win = 4 * (_one(d["bwd"]) + _one(d["recompute"]) + _one(d["tp_f"]) + _one(d["tp_b"]))
    dp_want = dp_exposed_s(c, big, comm["dp_bw"], comm["dp_lat"], bwd_win, fwd_win)
    assert _one(out["dp_comm"]) == pytest.approx(_one(dp_want), rel=1e-9)
    # the larger (last) stage's parameter tensors: 4 layers × (2 norms, QKV, projection,
    # fc1, fc2) + the final norm + the untied output layer
    tensors = 4 * 6 + 2
    assert _one(out["optimizer"]) == pytest.approx(
        _one(optimizer_s(c, gpu, big, 0.0, tensors)), rel=1e-9)
    keys = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "bubble", "pp_comm",
            "dp_comm", "optimizer")
    assert _one(out["iteration_time_s"]) == pytest.approx(sum(_one(out[k]) for k in keys),
                                                          rel=1e-12)



def test_interleaved_bubble_runs_the_logits_end_less_what_its_backward_hides(monkeypatch):
    """The interleaved bubble's lighter end is the last stage's logits and loss *less* the
    part of their backward the layers' backward hides (``backward_overlap_s``'s third
    figure), as the last stage's own time takes it. The model of
    :func:`test_iteration_time_assembles_the_pipeline_schedule` at vp 2, with the embedding's
    extra set between the two (the logits' full time): less the hidden part the logits end
    is the lighter, with it added back the embedding would be."""
    from configurator.cost import iteration
    from configurator.cost.iteration import backward_overlap_s, layer_type_times

    model = make_model(**(GQA | dict(num_layers=8, hidden_size=1024, num_attention_heads=8,
                                     kv_channels=128, ffn_hidden_size=4096,
                                     seq_length=2048)))
    cl = load_cluster(H100, nodes=1)
    m, dp, vp = 8, 2, 2
    c = _candidates(model, tp=2, pp=2, vp=vp, dp=dp, micro_batch_size=1,
                    sequence_parallel=True, distributed_optimizer=True,
                    global_batch_size=m * dp)
    comm = dict(comm_figures(cl, c), **expert_comm_figures(cl, c))
    lc = layer_costs(model, c, cl.gpu)
    x = {k: _one(v) for k, v in stage_extras_s(model, c, cl.gpu, lc, comm["tp_bw"],
                                               comm["tp_lat"]).items()}
    logits = x["logits_fwd"] + x["logits_bwd"]
    emb = logits                                     # the embedding's extra, as heavy
    extras = stage_extras_s

    def heavier_embedding(*args):
        out = extras(*args)
        scale = emb / (x["emb_fwd"] + x["emb_bwd"])
        return dict(out, emb_fwd=out["emb_fwd"] * scale, emb_bwd=out["emb_bwd"] * scale)
    monkeypatch.setattr(iteration, "stage_extras_s", heavier_embedding)
    out = iteration_time(model, cl, c, comm)
    types = layer_type_times(model, c, lc, comm)
    d = types["dense"]
    layer = sum(_one(d[k]) for k in ("fwd", "bwd", "recompute", "tp_f", "tp_b", "cp_f", "cp_b"))
    saved = _one(sum(backward_overlap_s(types, 4, 0)))
    hidden = _one(backward_overlap_s(types, 4, 0, x["logits_bwd"])[2])
    assert 0 < hidden and logits - hidden < emb < logits + hidden
    first, last = 4 * layer - saved + emb, 4 * layer - saved + logits - hidden
    other, lighter = min(first, last), logits - hidden
    assert _one(out["bubble"]) == pytest.approx((other - lighter) / vp + 2 * lighter,
                                                rel=1e-9)

def test_total_parameters_match_the_published_checkpoints():
    """Parameter counts of the released checkpoints (their Hugging Face safetensors index's
    ``total_size`` in bf16 bytes over 2): Llama-3-8B 8,030,261,248; Llama-3-70B
    70,553,706,496; Mixtral-8x7B 46,702,792,704, of which 12.9B active (its model card);
    DeepSeek-V3 and Llama 4 Maverick in their model cards' billions."""
    from configurator.core.model_presets import MODEL_PRESETS
    from memory_model.params import active_parameters, total_parameters

    assert total_parameters(MODEL_PRESETS["llama3-8b"]) == 16_060_522_496 // 2
    assert total_parameters(MODEL_PRESETS["llama3-70b"]) == 141_107_412_992 // 2
    assert total_parameters(MODEL_PRESETS["mixtral-8x7b"]) == 93_405_585_408 // 2
    assert round(active_parameters(MODEL_PRESETS["mixtral-8x7b"]) / 1e8) == 129
    assert active_parameters(MODEL_PRESETS["llama3-8b"]) == 8_030_261_248
    # MoE models with dense layers beside their MoE ones (their model cards): DeepSeek-V3
    # "671B total parameters" (its 3 dense layers among 61; the 14B of its MTP module are
    # counted apart), Llama 4 Maverick "400B total parameters" (24 dense of 48)
    assert total_parameters(MODEL_PRESETS["deepseek-v3"]) // 10**9 == 671
    assert total_parameters(MODEL_PRESETS["llama4-maverick"]) // 10**9 == 400
    # Mixtral 8x22B: "39B active parameters out of 141B" (Mistral AI's release, 2024-04-17)
    m = MODEL_PRESETS["mixtral-8x22b"]
    assert (round(total_parameters(m) / 1e9), round(active_parameters(m) / 1e9)) == (141, 39)
    # Grok-1, "314B parameters" (xai-org/grok-1 README): per layer 8 experts of three
    # 6144 x 32768 matrices, attention 6144 x (48 + 2 x 8) x 128 and 48 x 128 x 6144, the
    # router and two norms; one embedding, tied to the output, and the final norm
    h, f = 6144, 32768
    layer = 8 * 3 * h * f + h * (48 + 2 * 8) * 128 + 48 * 128 * h + h * 8 + 2 * h
    grok = MODEL_PRESETS["grok-1"]
    assert total_parameters(grok) == 64 * layer + 131072 * h + h
    assert total_parameters(grok) == pytest.approx(314e9, rel=0.01)


@pytest.mark.parametrize("precision", ["fp8", "mxfp8"])
def test_fp8_activations_keep_quantised_gemm_inputs(precision):
    """Under FP8 Transformer Engine's linears save their input quantised, ``q`` bytes a value
    (1 for fp8, 1 + 1/32 for mxfp8's E8M0 block scales): the QKV and fc1 inputs ``q·Xh``
    (÷t with SP; MLA's two down projections quantise a copy each, ``2q·Xh``), the latents' up
    projections ``q`` a value, fc2 ``q·Xf/t`` beside the 16-bit SwiGLU input ``4Xf/t``, the
    projection ``q·Xh/t`` plus the flash kernel's own 16-bit output ``2Xh/t`` (megatron-core
    0.16.1 MLA under mxfp8 saves the 16-bit input alone, ``2Xh/t``); the norms' inputs,
    attention and the output layer stay 16-bit."""
    q = 1.0 if precision == "fp8" else 1 + 1 / 32
    s, b, t, L = 512, 2, 2, 4
    X = s * b
    h, a, g, d, f = 256, 8, 2, 32, 512
    gqa, = estimate_memory(make_model(**GQA), _batch(tp=t, micro_batch_size=b, precision=precision,
                                                    sequence_parallel=True))
    attn = 2 * X * d * (a + 2 * max(g, t)) / t + 4 * a * X / t
    layer = (4 + q + q) * X * h / t + attn + (q + 2) * X * h / t + (4 + q) * X * f / t
    last = 4 * X * h / t + 4 * X * v_pad(1000, t) / t
    assert gqa.activations_bytes == pytest.approx(L * layer + last, rel=1e-12)

    s, L = 256, 2
    X = s * b
    h, ql, kl, pos, f = 128, 64, 32, 8, 256
    mla, = estimate_memory(make_model(**MLA_DENSE), _batch(tp=t, micro_batch_size=b,
                                                         precision=precision,
                                                         sequence_parallel=True))
    _, attn = _mla_layer_bytes(s, b, t)
    proj = 2 * X * h / t if precision == "mxfp8" else (q + 2) * X * h / t
    layer = ((4 + 2 * q + q) * X * h / t + X * (2 * (ql + kl + pos) + q * (ql + kl)) + attn
             + proj + (4 + q) * X * f / t)
    last = 4 * X * h / t + 4 * X * v_pad(500, t) / t
    assert mla.activations_bytes == pytest.approx(L * layer + last, rel=1e-12)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_moe_mlp_forward_time(precision):
    """An MoE MLP on one rank, T tokens, X = T/tp routed by each tensor-parallel rank,
    R = k·X·etp·I copies over E/ep local experts on the busiest of the ep ranks (dropless
    routing: I = 1 + c·sqrt(2·ep·ln(ep)/E), c the experts' load spread): the grouped fc1
    (h → 2f_e/etp) and fc2 GEMMs of R·ep/E rows each, one GEMM per expert (a fixed time for
    each of the 2 members); the router GEMM X×E×h in 16-bit; a shared expert as a dense SwiGLU
    MLP over T tokens with its activation (6 bytes per element); memory-bound passes:
    permute and unpermute ``2·2·(Xh + Rh)``, the routed activation ``6·R·f_e``, the router's
    fp32 softmax and top-k ``12·X·E``; 30 extra kernels; under FP8 the casts of the grouped
    GEMMs' inputs ``R·(h + f_e/etp)``. The host stops before dispatch after the attention's
    23 operations and the router's 30."""
    from configurator.cost.gemm import fp8_quantize_s, fp8_scaling
    from configurator.cost.moe_compute import moe_host_before_sync_s, moe_mlp_costs

    E, k, fe, fs, h = 8, 2, 64, 128, 256
    model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe,
                       moe_shared_expert_intermediate_size=fs)
    gpu = load_cluster(H100, nodes=1).gpu
    eff = gpu.efficiency
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    tp, ep = 2, 4
    c = _candidates(model, tp=tp, dp=4, ep=ep, sequence_parallel=True, precision=precision,
                    global_batch_size=8)
    kw = layer_costs(model, c, gpu)["gemm_kw"]
    T = 2048.0
    X = T / tp
    R = k * X * (1 + ROUTER_LOAD_CV["per_batch"] * math.sqrt(2 * ep * math.log(ep) / E))
    got = moe_mlp_costs(model, c, gpu, T, kw)
    grouped = dict(kw, batch=E / ep)
    experts = (gemm_time_s(R * ep / E, 2 * fe, h, **grouped)
               + gemm_time_s(R * ep / E, h, fe, **grouped) + 2 * (E / ep - 1) * 10.7e-6)
    router = gemm_time_s(X, E, h, **dict(kw, peak=gpu.peak("bf16"), gemm_eff=eff.gemm,
                                         in_bytes=2.0))
    shared = (gemm_time_s(T, 2 * fs / tp, h, **kw) + gemm_time_s(T, h, fs / tp, **kw)
              + 6 * T * fs / tp / hbm)
    elem = 4 * (X * h + R * h) + 6 * R * fe + 12 * X * E
    cast = fp8_quantize_s(R * (h + fe), gpu, fp8_scaling(c)) if precision == "fp8" else 0.0
    want = experts + router + shared + elem / hbm + cast + 30 * eff.kernel_overhead_s
    assert _one(got["fwd"]) == pytest.approx(_one(want), rel=1e-12)
    assert _one(got["tokens_routed"]) == R and _one(got["tokens_in"]) == X
    assert _one(got["experts_fwd"]) == pytest.approx(_one(experts + 6 * R * fe / hbm + cast),
                                                     rel=1e-12)
    assert _one(got["act_fwd"]) == pytest.approx(6 * R * fe / hbm + eff.kernel_overhead_s,
                                                 rel=1e-12)
    assert _one(moe_host_before_sync_s(model, c, gpu)) == pytest.approx(
        (23 + 30 + 30) * eff.host_op_s, rel=1e-12)


def test_cp_ring_and_all_gather_exchanges():
    """Context parallelism's ``p2p`` ring: cp − 1 sends of the K/V block
    ``B = 2·T·g·(d_qk + d_v)/tp`` bytes, each exposed beyond its step's attention (1/cp of
    the layer's), backward twice the bytes (dK, dV too); per step the fp32 correction of the
    output (forward: read and write ``T·a·d_v/tp`` fp32 and read the 16-bit step output,
    10 bytes; backward the same over d_qk) with 2 and 3 kernels. ``all_gather``: the
    gathered K/V (cp·B) before attention, twice backward, one more kernel a pass."""
    from topology.collectives import all_gather_time_s, p2p_time_s

    gpu = load_cluster(H100, nodes=1).gpu
    eff = gpu.efficiency
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    model = make_model(**GQA)
    T, a, g, d, tp, cp = 4096.0, 8, 2, 32, 2, 4
    comm = dict(cp_bw=100e9, cp_lat=2e-6, cp_hop_bw=50e9, cp_hop_lat=5e-6, cp_on_node=8,
                ep_intra_bw=80e9, ep_intra_lat=3e-6)
    B = 2 * T * g * 2 * d / tp
    step = p2p_time_s(B, 50e9, 5e-6)
    corr = 10 * T * a * d / tp / hbm
    for attn_f, attn_b in ((1e-5, 2e-5), (1e-2, 2e-2)):     # exposed, then hidden sends
        lc = dict(tokens=T, attn_fwd=attn_f, attn_bwd=attn_b)
        ring = _candidates(model, tp=tp, cp=cp, global_batch_size=8)
        fwd, bwd = cp_layer_s(model, lc, ring, comm, gpu)
        want_f = (cp - 1) * max(step - attn_f / cp, 0.0) + cp * (corr + 2 * eff.kernel_overhead_s)
        want_b = ((cp - 1) * max(2 * step - attn_b / cp, 0.0)
                  + cp * (corr + 3 * eff.kernel_overhead_s))
        assert (_one(fwd), _one(bwd)) == pytest.approx((want_f, want_b), rel=1e-12)
    gather = _candidates(model, tp=tp, cp=cp, cp_comm_type="all_gather", global_batch_size=8)
    ag = all_gather_time_s(cp * B, cp, 100e9, 2e-6)
    fwd, bwd = cp_layer_s(model, lc, gather, comm, gpu)
    assert (_one(fwd), _one(bwd)) == pytest.approx(
        (ag + eff.kernel_overhead_s, 2 * ag + eff.kernel_overhead_s), rel=1e-12)
    one = _candidates(model, tp=tp, global_batch_size=8)
    assert tuple(map(_one, cp_layer_s(model, lc, one, comm, gpu))) == (0.0, 0.0)


def test_fp8_amax_reduction_and_the_measured_time_of_a_run():
    """Delayed scaling all-reduces the amaxes once per forward and backward of a model
    chunk over its tp·dp·cp ranks, spread over the chunk's layers (0 for other recipes).
    A run's measured seconds per iteration: given, or ``B·s/(tokens/s per GPU · GPUs)``, or
    its counted FLOPs over ``TFLOP/s per GPU · GPUs``."""
    import dataclasses

    from configurator.core.runs import MeasuredRun
    from configurator.cost.flops import megatron_model_flops
    from configurator.cost.iteration import amax_reduction_s
    from configurator.cost.measured import measured_iteration_time_s
    from topology.collectives import small_all_reduce_s

    model = make_model(**GQA)
    c = _candidates(model, tp=2, pp=2, dp=2, precision="fp8", fp8_recipe="delayed",
                    global_batch_size=8)
    assert _one(amax_reduction_s(model, c, 8)) == pytest.approx(
        _one(small_all_reduce_s(4.0, 8)) / (4 / 2), rel=1e-12)
    current = _candidates(model, tp=2, pp=2, dp=2, precision="fp8", fp8_recipe="tensorwise",
                          global_batch_size=8)
    assert amax_reduction_s(model, current, 8) == 0.0
    plan = _plan(tp=2, dp=4, global_batch_size=64)
    run = MeasuredRun(name="r", group="g", source="s", model=model, cluster=H100,
                      num_gpus=8, seq_length=512, plan=plan, iteration_time_s=None,
                      tokens_per_s_per_gpu=1000.0)
    assert measured_iteration_time_s(model, run) == pytest.approx(64 * 512 / (1000 * 8),
                                                                  rel=1e-12)
    run = dataclasses.replace(run, tokens_per_s_per_gpu=None, tflops_per_gpu=100.0)
    assert measured_iteration_time_s(model, run) == pytest.approx(
        megatron_model_flops(model, 64, tp=2) / (100e12 * 8), rel=1e-12)
    assert measured_iteration_time_s(model, dataclasses.replace(run, iteration_time_s=3.0)) \
        == 3.0


def test_flash_efficiency_and_context_parallel_attention_calls():
    """A fused kernel over s keys attains ``η·s/(s + 1024)`` of peak with the causal mask and
    ``η·s/(s + 384)`` without, a mix by time (harmonic); with cp the ``p2p`` ring calls over
    s/cp keys, 1/cp of the work causal; ``all_gather`` over ``(2cp+1)/(4cp)·s`` keys, all
    causal; the layer's causal attention work is ½·2·b·(s/cp)·s·a·(d+d)/t."""
    from configurator.core.plan_values import mfu_peak_precision
    from configurator.cost.compute import flash_efficiency

    assert _one(flash_efficiency(0.7, 2048)) == pytest.approx(0.7 * 2048 / 3072, rel=1e-12)
    assert _one(flash_efficiency(0.7, 2048, 0.0)) == pytest.approx(0.7 * 2048 / 2432,
                                                                   rel=1e-12)
    mix = 1 / (0.25 / (0.7 * 2048 / 3072) + 0.75 / (0.7 * 2048 / 2432))
    assert _one(flash_efficiency(0.7, 2048, 0.25)) == pytest.approx(mix, rel=1e-12)
    model = make_model(**GQA)
    gpu = load_cluster(H100, nodes=1).gpu
    eff = gpu.efficiency
    s, a, d, t, cp, b = 512, 8, 32, 2, 4, 1
    peak = gpu.peak(mfu_peak_precision("bf16"))
    work = 0.5 * 2 * b * (s / cp) * s * a * 2 * d / t
    for kind, keys, causal in (("p2p", s / cp, 1 / cp),
                               ("all_gather", (2 * cp + 1) / (4 * cp) * s, 1.0)):
        c = _candidates(model, tp=t, cp=cp, cp_comm_type=kind, global_batch_size=8)
        attn = eff.kernel_overhead_s + work / (peak * _one(flash_efficiency(
            eff.flash_attention, keys, causal)))
        assert _one(layer_costs(model, c, gpu)["attn_fwd"]) == pytest.approx(attn, rel=1e-12)


def test_recompute_modules_rerun_their_forward():
    """The ``mlp`` module re-runs the dense MLP's forward (its two GEMMs and the SwiGLU pass,
    6 bytes an element of T·f/t) and the pre-MLP norm fused into its fc1 (read and write 2
    bytes of each element of T·h/t, one kernel); ``layernorm`` MLA's input norm (read and
    write 2 bytes of each replicated element, one kernel) and ``CheckpointWithoutOutput``'s
    copy of its output back into the freed storage (the same bytes, one kernel); full
    recompute with tp-comm overlap re-runs the forward's exposed collectives too."""
    gpu = load_cluster(H100, nodes=1).gpu
    eff = gpu.efficiency
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    model = make_model(**GQA)
    f, t, b, s = 512, 2, 2, 512
    T = b * s
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True,
                    recompute="selective", recompute_modules="mlp")
    lc = layer_costs(model, c, gpu)
    (_, _), (fc1, fc2) = lc["tp_gemm_pairs"]
    norm = 4 * T * 256 / t / hbm + eff.kernel_overhead_s     # h = 256
    assert _one(lc["recompute"]) == pytest.approx(_one(fc1 + fc2) + 6 * T * f / t / hbm + norm,
                                                  rel=1e-12)
    mla = make_model(**MLA_DENSE)
    c = _candidates(mla, tp=t, micro_batch_size=b, sequence_parallel=True,
                    recompute="selective", recompute_modules="layernorm")
    # the norm, then CheckpointWithoutOutput's copy of its output into the freed storage
    assert _one(layer_costs(mla, c, gpu)["recompute"]) == pytest.approx(
        2 * (4 * (b * 256) * 128 / t / hbm + eff.kernel_overhead_s), rel=1e-12)   # s = 256

    from configurator.core.plan_batch import PlanBatch as C
    from configurator.cost.iteration import tp_layer_s
    from topology.collectives import all_reduce_time_s

    lc = dict(tp_gemm_pairs=((3e-5, 2e-5), (7e-5, 4e-5)))
    act, bw, lat, sms = 2 * 4096 * 1024.0, 100e9, 5e-6, 132
    over = C.from_plan(_plan(tp=4, sequence_parallel=True, tp_comm_overlap=True,
                             recompute="full"))
    plain = C.from_plan(_plan(tp=4, sequence_parallel=True, tp_comm_overlap=True))
    f_full, b_full = tp_layer_s(lc, over, act, bw, lat, sms)
    f_plain, b_plain = tp_layer_s(lc, plain, act, bw, lat, sms)
    assert _one(f_full) == pytest.approx(_one(f_plain), rel=1e-12)
    assert _one(b_full) == pytest.approx(_one(b_plain) + _one(f_plain), rel=1e-12)
    assert all_reduce_time_s(act, 4.0, bw, lat) > 0


def test_moe_layer_backward_replaces_the_dense_mlp():
    """An MoE layer's backward: the dense layer's, its MLP's twice-forward and gradient
    accumulation taken out, the MoE MLP's twice-forward and its accumulation put in (the
    non-expert parameters over the layer's T tokens, the experts' over their R·ep/E rows)."""
    from configurator.cost.moe_compute import moe_mlp_costs

    E, k, fe = 8, 2, 64
    model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe,
                       moe_layer_freq=[0, 1, 0, 1])
    gpu = load_cluster(H100, nodes=1).gpu
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    h, f, t, ep, b, s = 256, 512, 2, 4, 2, 512
    c = _candidates(model, tp=t, dp=4, ep=ep, micro_batch_size=b, sequence_parallel=True,
                    global_batch_size=8)
    lc = layer_costs(model, c, gpu)
    T = b * s
    (_, _), (fc1, fc2) = lc["tp_gemm_pairs"]
    dense_mlp = fc1 + fc2 + 6 * T * f / t / hbm
    moe = moe_mlp_costs(model, c, gpu, T, lc["gemm_kw"])
    attn_params = 256 + 256 * (8 + 4) * 32 / t + 8 * 32 * 256 / t
    non_expert = attn_params + 256 + E * h
    expert = E / ep * 3 * h * fe
    moe_acc = (main_grad_accumulation_s(non_expert, c, gpu, T)
               + main_grad_accumulation_s(expert, c, gpu, _one(moe["tokens_routed"]) * ep / E))
    want = (lc["bwd"] - 2 * dense_mlp - lc["main_grad_acc"] + moe_acc + 2 * moe["fwd"])
    assert _one(lc["moe_bwd"]) == pytest.approx(_one(want), rel=1e-12)
    assert _one(lc["moe_fwd"]) == pytest.approx(_one(lc["fwd"] - dense_mlp + moe["fwd"]),
                                                rel=1e-12)


def test_first_and_last_stage_extras():
    """First stage: the embedding lookup writes ``2·T·h`` bytes and its tensor-parallel
    all-reduce; backward reads and writes them, adds the dense embedding gradient (4 bytes a
    weight) and accumulates it into the main gradient. Last stage: the logits GEMM
    ``T × V/t × h`` in 16-bit, the unfused cross entropy's 38 (forward) and 14 (backward)
    bytes a logit; backward twice the GEMM and the output layer's gradient accumulation."""
    from configurator.cost.compute import layer_costs as costs
    from topology.collectives import all_reduce_time_s

    model = make_model(**GQA)
    gpu = load_cluster(H100, nodes=1).gpu
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    t, b, s, h = 2, 2, 512, 256
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True)
    lc = costs(model, c, gpu)
    x = stage_extras_s(model, c, gpu, lc, 100e9, 1e-6)
    T, V = b * s, v_pad(1000, t)
    act = 2 * T * h
    emb = V * h / t
    assert _one(x["emb_fwd"]) == pytest.approx(
        act / hbm + all_reduce_time_s(act, 2.0, 100e9, 1e-6), rel=1e-12)
    assert _one(x["emb_bwd"]) == pytest.approx(
        2 * act / hbm + 4 * emb / hbm + _one(main_grad_accumulation_s(emb, c, gpu)), rel=1e-12)
    kw16 = dict(lc["gemm_kw"], peak=gpu.peak("bf16"), gemm_eff=gpu.efficiency.gemm,
                in_bytes=2.0)
    gemm = gemm_time_s(T, V / t, h, **kw16)
    assert _one(x["logits_fwd"]) == pytest.approx(_one(gemm + 38 * T * V / t / hbm),
                                                  rel=1e-12)
    acc = main_grad_accumulation_s(V / t * h, c, gpu, T)
    assert _one(x["logits_bwd"]) == pytest.approx(_one(2 * gemm + 14 * T * V / t / hbm + acc),
                                                  rel=1e-12)


@pytest.mark.parametrize("moe", [False, True])
def test_placed_plan_terms_on_one_uniform_node(moe):
    """The placed plan's stage terms on one uniform node are the closed form's pieces: a
    chunk's forward (backward) its layers' forward (backward, recompute) with their exposed
    tensor-parallel and expert terms, the embedding on the first chunk, the logits on the
    last; a send of ``p2p_message_s``; each stage's data-parallel tail over its parameters
    with the windows of its layers (an MoE stage adds its experts' reduction over the
    expert-data-parallel group); Adam's step. What each stage's backward saves as one
    stretch of host and GPU work (:func:`backward_overlap_s`) comes off its chunks' backward,
    half each here, what it hides of the logits' backward off the last chunk's."""
    from configurator.cost.iteration import backward_overlap_s, layer_type_times, p2p_message_s
    from configurator.cost.placed import PlacedPlan

    extra = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=64) if moe else {}
    model = make_model(**(GQA | dict(num_layers=8)), **extra)
    cl = load_cluster(H100, nodes=1)
    plan = _plan(tp=2, pp=2, vp=2, dp=2, ep=2 if moe else 1, sequence_parallel=True,
                 distributed_optimizer=True, overlap_grad_reduce=True, global_batch_size=8)
    placed = PlacedPlan(model, cl, PlanBatch.from_plan(plan))
    got = placed.terms(placed.rank_gpus(*placed.default_placement()))
    c = PlanBatch.from_plan(plan)
    comm = dict(comm_figures(cl, c), **expert_comm_figures(cl, c))
    lc = layer_costs(model, c, cl.gpu)
    types = layer_type_times(model, c, lc, comm)
    kind = types["moe" if moe else "dense"]
    f = sum(_one(kind[k]) for k in ("fwd", "tp_f", "cp_f", "ep_f"))
    b = sum(_one(kind[k]) for k in ("bwd", "recompute", "tp_b", "cp_b", "ep_b"))
    x = {k: _one(v) for k, v in stage_extras_s(model, c, cl.gpu, lc, comm["tp_bw"],
                                               comm["tp_lat"]).items()}
    want_f = np.full((2, 2, 2), 2 * f)     # [dp, pp, vp]: two layers a chunk
    want_b = np.full((2, 2, 2), 2 * b)
    want_f[:, 0, 0] += x["emb_fwd"]
    want_b[:, 0, 0] += x["emb_bwd"]
    n_dense, n_moe = (0, 4) if moe else (4, 0)
    saved = _one(sum(backward_overlap_s(types, n_dense, n_moe)))
    hidden = _one(backward_overlap_s(types, n_dense, n_moe, x["logits_bwd"])[2])
    want_b -= saved / 2
    want_f[:, 1, 1] += x["logits_fwd"]
    want_b[:, 1, 1] += x["logits_bwd"] - hidden
    np.testing.assert_allclose(got["fwd"], want_f, rtol=1e-12)
    np.testing.assert_allclose(got["bwd"], want_b, rtol=1e-12)
    send = _one(p2p_message_s(model, c, lc, comm["pp_bw"], comm["pp_lat"], comm["tp_bw"],
                              comm["tp_lat"]))
    np.testing.assert_allclose(got["p2p_f"], np.full((2, 2), send), rtol=1e-12)
    np.testing.assert_allclose(got["p2p_b"], np.full((2, 2), send), rtol=1e-12)
    h, V = 256, v_pad(1000, 2)
    attn = 256 + 256 * (8 + 4) * 32 / 2 + 8 * 32 * 256 / 2
    layer = attn + 256 + 3 * 256 * 512 / 2
    non_expert = (attn + 256 + 4 * h) if moe else layer
    expert = 4 / 2 * 3 * h * 64 if moe else 0.0
    d = types["dense"]
    for s, end in ((0, V * h / 2), (1, h + V * h / 2)):
        params = 4 * non_expert + end
        tail = dp_exposed_s(c, params, comm["dp_bw"], comm["dp_lat"],
                            bwd_window_s=4 * (_one(d["bwd"]) + _one(d["recompute"])
                                              + _one(d["tp_f"]) + _one(d["tp_b"])) - saved,
                            fwd_window_s=4 * _one(d["fwd"]))
        if moe:
            tail = tail + dp_exposed_s(c, 4 * expert, comm["edp_bw"], comm["edp_lat"], 0.0,
                                       0.0, group=2 * 2 / 2)
        assert _one(got["tail"][s]) == pytest.approx(_one(tail), rel=1e-9)



def test_placed_plan_sends_nothing_with_one_stage():
    """pp 1: no pipeline send, so the placed plan's send terms are zero (with two stages the
    same plan's are a send each, :func:`test_placed_plan_terms_on_one_uniform_node`)."""
    from configurator.cost.placed import PlacedPlan

    model = make_model(**GQA)
    cl = load_cluster(H100, nodes=1)
    for pp in (1, 2):
        plan = _plan(tp=2, pp=pp, dp=4 // pp, sequence_parallel=True, global_batch_size=8)
        placed = PlacedPlan(model, cl, PlanBatch.from_plan(plan))
        got = placed.terms(placed.rank_gpus(*placed.default_placement()))
        sends = np.concatenate([np.ravel(got["p2p_f"]), np.ravel(got["p2p_b"])])
        assert np.all(sends == 0.0) if pp == 1 else np.all(sends > 0.0), (pp, sends)

#: A GPT-2-layout model: LayerNorm (weight and bias), GeLU MLP, learned position embedding,
#: biases on every linear, tied embedding (the last stage keeps its copy of it when pp > 1).
GPT2 = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=4,
            kv_channels=16, ffn_hidden_size=256, vocab_size=300, seq_length=128, swiglu=False,
            normalization="LayerNorm", position_embedding_type="learned_absolute",
            untie_embeddings_and_output_weights=False, add_bias_linear=True,
            hidden_dropout=0.0, attention_dropout=0.0)


def test_linear_biases_and_the_fp8_copy_of_the_gemm_weights():
    """Megatron's GPT-2 layer on one tp rank (gpt_layer_specs.py, ColumnParallelLinear /
    RowParallelLinear): LayerNorm 2h; linear_qkv h→3h with its bias 3h, both split over tp;
    linear_proj h→h split, its bias h not split; LayerNorm 2h; fc1 h→f with bias f split;
    fc2 f→h split, bias h not split. Under fp8 every TE linear's layer parameters (norms and
    biases counted with them) get a 2-byte quantised copy (row-wise + transpose on Hopper);
    the word and position embedding (first stage), the final norm and the output layer (last
    stage) get none."""
    tp, pp = 2, 2
    h, f, V, s = 64, 256, v_pad(300, 2), 128
    layer = (2 * h + (h * 3 * h + 3 * h) / tp + h * h / tp + h + 2 * h
             + (h * f + f) / tp + f * h / tp + h)
    first_other = V * h / tp + s * h                 # word + learned position embedding
    last_other = 2 * h + V * h / tp                  # final LayerNorm + output layer copy
    model = make_model(**GPT2)
    bf16 = estimate_memory(model, _batch(tp=tp, pp=pp, dp=2))
    fp8 = estimate_memory(model, _batch(tp=tp, pp=pp, dp=2, precision="fp8"))
    for st16, st8, other in zip(bf16, fp8, (first_other, last_other)):
        assert st16.parameters_bytes == pytest.approx(2 * (layer + other), rel=1e-12)
        assert st8.parameters_bytes == pytest.approx(2 * (layer + other) + 2 * layer,
                                                     rel=1e-12)


def test_mtp_embedding_copy_gets_no_fp8_weight_copy():
    """The MLA/MoE/MTP model's last stage under fp8 (pp = 2): its non-GEMM parameters are
    the final RMSNorm h, the output layer V·h and the MTP's copy of the word embedding V·h;
    every other parameter (the MoE layer, the MTP module) gets 2 bytes more (no distributed
    optimizer, so the 16-bit weights stay beside the FP8 copy)."""
    model = make_model(**MLA_MOE)
    kw = dict(tp=1, pp=2, dp=4, ep=2, global_batch_size=16)
    h, V = 128, v_pad(500, 1)
    ne, ex = _moe_parts(1, 2)
    total = ne + h + V * h + (3 * h + 2 * h * h + ne) + V * h + 2 * ex
    gemm = total - (h + V * h + V * h)
    last = estimate_memory(model, _batch(precision="fp8", **kw))[1]
    assert last.parameters_bytes == pytest.approx(2 * total + 2 * gemm, rel=1e-12)


def test_megatron_fsdp_shards_expert_weights_over_the_expert_data_parallel_group():
    """Megatron FSDP (optim_grads_params): the weights and main gradients are sharded like the
    optimizer state, non-expert over dp·cp = 4, expert over tp·cp·dp/(ep·etp) = 2, plus two
    live units of the largest unit being gathered and reduced (the one computing and the one
    prefetched: --fsdp-double-buffer's two persistent buffers, megatron-fsdp-user-guide.md):
    here the dense layer, larger than the MoE layer (non-expert + its E/ep experts) and the
    embedding."""
    model = make_model(**MLA_MOE)
    h, V, f = 128, v_pad(500, 1), 256
    ne, ex = _moe_parts(1, 2)
    dense_layer = _mla_attention(1) + h + 3 * h * f
    unit = max(dense_layer, V * h, ne + ex)
    assert unit == dense_layer
    last_ne = ne + h + V * h + (3 * h + 2 * h * h + ne) + V * h
    last_ex = 2 * ex
    held = last_ne / 4 + last_ex / 2 + 2 * unit
    last = estimate_memory(model, _batch(tp=1, pp=2, dp=4, ep=2, distributed_optimizer=True,
                                        megatron_fsdp=True, global_batch_size=16))[1]
    assert last.parameters_bytes == pytest.approx(2 * held, rel=1e-12)
    assert last.gradients_bytes == pytest.approx(4 * held, rel=1e-12)
    # FP8 without the FP8 weight gather keeps a copy of the GEMM weights beside the 16-bit
    # ones: under FSDP the same share of what the rank holds as without it
    fp8 = dict(tp=1, pp=2, dp=4, ep=2, distributed_optimizer=True, global_batch_size=16,
               precision="fp8", fp8_param_gather=False)
    for pp_rank in (0, 1):
        sharded = estimate_memory(model, _batch(megatron_fsdp=True, **fp8))[pp_rank]
        whole = estimate_memory(model, _batch(**fp8))[pp_rank]
        assert sharded.parameters_bytes > 2 * sharded.gradients_bytes / 4
        assert sharded.parameters_bytes / sharded.gradients_bytes == pytest.approx(
            whole.parameters_bytes / whole.gradients_bytes, rel=1e-12)


# ---------------------------------------------------------------- activations by module

def _activations():
    from memory_model import activations
    from configurator.core.plan_terms import recompute_code
    return activations, recompute_code


def test_local_attention_keeps_new_q_and_k_after_rope():
    """megatron-core's local DotProductAttention with multi-head attention (g = a) keeps the
    QKV output M (Q, K, V are views of it); RoPE (apply_rotary_pos_emb, not in place) makes a
    new Q and a new K, 2·X·a·d/t bytes each, that a learned position embedding does not."""
    act, _ = _activations()
    s, b, t = 512, 2, 2
    X = s * b
    a, d = 8, 32
    mha = dict(GQA, num_query_groups=8)
    kw = dict(mbs=b, seq=s, tp=t, sp=True, recompute=0, stores_scores=True)
    rope = act.layer_activation_bytes(make_model(**mha), **kw)
    learned = act.layer_activation_bytes(
        make_model(**(mha | dict(position_embedding_type="learned_absolute"))), **kw)
    assert rope - learned == pytest.approx(2 * (2 * X * a * d / t), rel=1e-12)


def test_selective_recompute_working_set_of_core_attention():
    """While core attention is recomputed (selective): the local backend keeps the scores
    again, softmax output 2 bytes a score (no attention dropout), a·s²·b/t scores, plus GQA's
    K and V expanded to all heads (2·X·a·d/t each); a flash-style kernel keeps contiguous Q,
    K, V (2·X·(a + 2·max(g, t))·d/t), its output 2·X·h/t and the fp32 log-sum-exp
    4·a·X/t."""
    act, code = _activations()
    s, b, t = 512, 2, 2
    X = s * b
    h, a, g, d = 256, 8, 2, 32
    model = make_model(**GQA)
    kw = dict(mbs=b, seq=s, tp=t, sp=True, recompute=code("selective", "core_attn"))
    local = act.recompute_working_bytes(model, stores_scores=True, **kw)
    assert local == pytest.approx(2 * a * s * s * b / t + 2 * (2 * X * a * d / t), rel=1e-12)
    flash = act.recompute_working_bytes(model, stores_scores=False, **kw)
    assert flash == pytest.approx(2 * X * (a + 2 * max(g, t)) * d / t + 2 * X * h / t
                                  + 4 * a * X / t, rel=1e-12)


def test_recompute_modules_drop_mla_norm_mlp_and_up_projections():
    """The bytes selective recompute's layernorm, mlp and mla_up_proj modules drop from an
    MLA layer (bf16, sequence parallel, flash kernel): the input norm's output 2·X·h/t (not
    fused into a TE linear under MLA); the MLP's fc1 input 2·X·h/t (its fused norm's output)
    with the SwiGLU input 2·2f and fc2 input 2·f a token, ÷t; the Q, K, V storages
    2·X·a·(qk + pos + qk + pos + v)/t."""
    act, code = _activations()
    s, b, t = 256, 2, 2
    X = s * b
    h, a, qk, pos, v, f = 128, 4, 16, 8, 32, 256
    x = act.LayerInputs(seq=s, mbs=b, tp=t, sp=True,
                        recompute=code("selective", "layernorm,mlp,mla_up_proj"))
    every, moe = act.recompute_module_bytes(make_model(**MLA_DENSE), x)
    expected = (2 * X * h / t + (2 * X * h / t + 6 * X * f / t)
                + 2 * X * a * (2 * (qk + pos) + v) / t)
    assert every == pytest.approx(expected, rel=1e-12)
    assert moe == 0.0


def test_offloaded_modules_bytes():
    """Fine-grained offloading of qkv_linear (MLA: the shared 16-bit norm output, 2·X·h/t),
    attn_norm (MLA's separate input norm: its 16-bit input, 2·X·h/t more), attn_proj (its
    16-bit input 2·X·h/t) and moe_act (the routed experts' fc1 output, SwiGLU:
    2·2 bytes a routed token and expert FFN unit, R = k·X/t·etp tokens over fe/etp units)."""
    act, _ = _activations()
    s, b, t, etp = 256, 2, 2, 2
    X = s * b
    h, k, fe = 128, 2, 64
    x = act.LayerInputs(seq=s, mbs=b, tp=t, sp=True, etp=etp,
                        offload_modules="qkv_linear,attn_norm,attn_proj,moe_act")
    every, moe = act.offloaded_layer_bytes(make_model(**MLA_MOE), x)
    R = k * X / t * etp
    assert every == pytest.approx(2 * X * h / t + 2 * X * h / t + 2 * X * h / t, rel=1e-12)
    assert moe == pytest.approx(2 * 2 * R * fe / etp, rel=1e-12)


def test_offloaded_moe_act_and_the_layernorm_module_peak():
    """One pipeline stage, two layers (one MoE) of one microbatch in flight (pp = 1): the
    first layer's offloaded moe_act bytes wait in host memory at the end of the forward,
    weighted by the MoE share 1/2 of the stage's layers (the last layer's stay). With the
    layernorm module on a dense MLA stage (pp = 2, first stage: one layer of pp = 2
    microbatches in flight), the last layer's backward holds the forward's bytes plus the
    input norm output it re-materialises, 2·X·h/t."""
    act, code = _activations()
    s, b, t = 256, 2, 2
    X = s * b
    h, k, fe = 128, 2, 64
    model = make_model(**MLA_MOE)
    at = act.StagePosition(pp=1, stage=0, num_microbatches=4, rank_layers=2,
                           rank_moe_layers=1)
    x = act.LayerInputs(seq=s, mbs=b, tp=t, sp=True)
    kept, _ = act.stage_activation_phases(model, x, at)
    off, _ = act.stage_activation_phases(model, x.replace(offload_modules="moe_act"), at)
    R = k * X / t
    assert kept - off == pytest.approx((2 - 1) * 0.5 * (2 * 2 * R * fe), rel=1e-12)

    at = act.StagePosition(pp=2, stage=0, num_microbatches=4, rank_layers=1)
    x = act.LayerInputs(seq=s, mbs=b, tp=t, sp=True, recompute=code("selective", "layernorm"))
    fwd, peak = act.stage_activation_phases(make_model(**MLA_DENSE), x, at)
    assert peak - fwd == pytest.approx(2 * X * h / t, rel=1e-12)


# ---------------------------------------------------------------- attention dropout, clamps

def test_flash_attention_dropout_adds_its_mask_pass():
    """With attention dropout the flash kernel draws a mask for every visited score, ½ of the
    b·s²·a/t pairs causal, at ATTENTION_DROPOUT_SCORES_PER_SM_S per SM (forward, backward):
    the layer's attention time grows by exactly that."""
    from configurator.cost.compute import ATTENTION_DROPOUT_SCORES_PER_SM_S as rate
    gpu = load_cluster(H100, nodes=1).gpu
    a, s, b, t = 8, 512, 2, 2
    kw = dict(tp=t, micro_batch_size=b, sequence_parallel=True)
    plain = make_model(**GQA)
    drop = make_model(**(GQA | dict(attention_dropout=0.1)))
    lc0 = layer_costs(plain, _candidates(plain, **kw), gpu)
    lc1 = layer_costs(drop, _candidates(drop, **kw), gpu)
    visited = b * s * s * a / t * 0.5
    assert _one(lc1["attn_fwd"] - lc0["attn_fwd"]) == pytest.approx(
        visited / (rate[0] * gpu.num_sms), rel=1e-9)
    assert _one(lc1["attn_bwd"] - lc0["attn_bwd"]) == pytest.approx(
        visited / (rate[1] * gpu.num_sms), rel=1e-9)


def test_clamped_mlp_recompute_and_moe_backward():
    """activation_func_clamp_value: the eager clamps of the fc1 output (T·2f/t elements,
    SwiGLU) move 8 bytes an element in 3 kernels forward and 15 in 7 backward (eager
    element-wise bandwidth). The mlp recompute module re-runs the dense MLP's forward: its
    GEMMs, the SwiGLU pass (6 bytes an element of T·f/t), the clamp, the norm fused into fc1
    (its FP8 write priced with the cast), and under fp8 the casts of its GEMM inputs (h/t
    with sequence parallelism, f/t a token). An MoE layer's backward
    takes the dense MLP's out: twice its GEMMs and SwiGLU pass, and the clamp's own
    backward once (under fp8 also the casts of fc2's and fc1's output gradients, h/t + 2f/t
    a token; below in bf16). Under fp8 fc1's input is cast in its norm's kernel."""
    from configurator.cost.gemm import (fp8_norm_cast_bytes, fp8_norm_quantize_s,
                                        fp8_quantize_s, fp8_scaling)
    from configurator.cost.host_ops import eager_s
    from configurator.cost.moe_compute import moe_mlp_costs

    gpu = load_cluster(H100, nodes=1).gpu
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    h, f, t, b, s = 256, 512, 2, 2, 512
    T = b * s
    clamp_f = eager_s(8 * T * 2 * f / t, 3, gpu)
    clamp_b = eager_s(15 * T * 2 * f / t, 7, gpu)
    model = make_model(**(GQA | dict(activation_func_clamp_value=7.0)))
    c = _candidates(model, tp=t, micro_batch_size=b, sequence_parallel=True, precision="fp8",
                    recompute="selective", recompute_modules="mlp")
    lc = layer_costs(model, c, gpu)
    (_, _), (fc1, fc2) = lc["tp_gemm_pairs"]
    cast = (fp8_quantize_s(T * f / t, gpu, fp8_scaling(c))
            + fp8_norm_quantize_s(T * h / t, gpu, fp8_scaling(c)))
    # the fused pre-MLP norm, its 16-bit write replaced by the FP8 one the cast prices
    norm = ((4 - fp8_norm_cast_bytes(gpu, fp8_scaling(c))[1]) * T * h / t / hbm
            + gpu.efficiency.kernel_overhead_s)
    assert _one(lc["recompute"]) == pytest.approx(
        _one(fc1 + fc2) + 6 * T * f / t / hbm + _one(clamp_f) + _one(cast) + norm, rel=1e-12)

    E, k, fe = 8, 2, 64
    moe_model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe,
                           moe_layer_freq=[0, 1, 0, 1], activation_func_clamp_value=7.0)
    c = _candidates(moe_model, tp=t, dp=4, ep=4, micro_batch_size=b, sequence_parallel=True,
                    global_batch_size=8)
    lc = layer_costs(moe_model, c, gpu)
    (_, _), (fc1, fc2) = lc["tp_gemm_pairs"]
    dense_mlp = fc1 + fc2 + 6 * T * f / t / hbm          # without its clamp
    moe = moe_mlp_costs(moe_model, c, gpu, T, lc["gemm_kw"])
    attn_params = 256 + 256 * (8 + 4) * 32 / t + 8 * 32 * 256 / t
    non_expert, expert = attn_params + h + E * h, E / 4 * 3 * h * fe
    moe_acc = (main_grad_accumulation_s(non_expert, c, gpu, T)
               + main_grad_accumulation_s(expert, c, gpu, _one(moe["tokens_routed"]) * 4 / E))
    # the MoE MLP's forward twice but its eager kernels (bias, clamp) by their own counts
    want = (lc["bwd"] - 2 * dense_mlp - clamp_b - lc["main_grad_acc"] + moe_acc
            + 2 * (moe["fwd"] - moe["eager_fwd"]) + moe["eager_bwd"])
    assert _one(lc["moe_bwd"]) == pytest.approx(_one(want), rel=1e-12)


def test_host_bound_waits_on_both_sides_of_the_dispatcher_sync():
    """A layer's forward split by the dispatcher's host/GPU synchronisation into two parts
    that cannot overlap: ``max(host₁, GPU₁) + max(host₂, GPU₂)``, the GPU's forward being
    the sum of its compute and collectives (1.0 + 0.2 + 0.1 + 0.3 = 1.6 s). Host 0.9 s
    before the sync against the GPU's 0.5 s: 0.4 s wait; after it host 2.5 − 0.9 = 1.6 s
    against 1.6 − 0.5 = 1.1 s: 0.5 s more. Backward: the host's 0.87 of the forward's 2.5 s
    (2.175 s) against the GPU's 2.0 + 0.4 + 0.2 + 0.6 = 3.2 s, no wait; with 5 s of host,
    4.35 s, 1.15 s. When the GPU's part before the sync is the longer one, the host's second
    part alone can make a wait: host 0.2 s against the GPU's 1.2 s, then 2.5 − 0.2 = 2.3 s
    against 0.4 s, so 1.9 s. A GPU part before the sync said to be longer than the whole
    forward counts as the whole forward (1.6 s): then 2.3 s against nothing."""
    from configurator.cost.iteration import host_bound
    c = _candidates(make_model(**GQA))
    t = dict(fwd=1.0, bwd=2.0, recompute=0.5, tp_f=0.2, tp_b=0.4, cp_f=0.1, cp_b=0.2,
             ep_f=0.3, ep_b=0.6)
    out = host_bound(c, t, 2.5, sync=(0.9, 0.5))
    assert _one(out["fwd"]) == pytest.approx(1.0 + 0.4 + 0.5, rel=1e-12)
    assert _one(out["bwd"]) == pytest.approx(2.0, rel=1e-12)
    assert _one(out["recompute"]) == pytest.approx(0.5, rel=1e-12)
    assert _one(host_bound(c, t, 5.0, sync=(0.9, 0.5))["bwd"]) == pytest.approx(2.0 + 1.15,
                                                                                rel=1e-12)
    out = host_bound(c, t, 2.5, sync=(0.2, 1.2))
    assert _one(out["fwd"]) == pytest.approx(1.0 + 0.0 + 1.9, rel=1e-12)
    out = host_bound(c, t, 2.5, sync=(0.2, 3.0))
    assert _one(out["fwd"]) == pytest.approx(1.0 + 0.0 + 2.3, rel=1e-12)
    out = host_bound(c, t, 2.5)
    assert _one(out["fwd"]) == pytest.approx(1.0 + 0.9, rel=1e-12)


# ---------------------------------------------------------------- training time

def test_objective_keys_and_the_cluster_file_training_section():
    """Each objective minimises its own figure (days, cost or GPU-hours without a price,
    energy); any other is refused with the list. A cluster file's ``training`` section in
    SI: storage GB/s ×1e9, the rest as written. The node overhead defaults: the DGX data
    sheets' maximum system power less eight GPUs' rated power (A100 6.5 kW − 8·400 W, H100
    and H200 10.2 kW − 8·700 W, B200 14.3 kW − 8·1000 W)."""
    from types import SimpleNamespace
    from configurator.core.errors import InputError
    from configurator.cost import training_time as tt
    t = SimpleNamespace(wall_time_s=86400.0, cost=None, gpu_hours=192.0, energy_J=3.6e9)
    assert tt.objective_key("time-to-train", t) == 86400.0
    assert tt.objective_key("cost", t) == 192.0
    assert tt.objective_key("cost", SimpleNamespace(cost=500.0, gpu_hours=192.0)) == 500.0
    assert tt.objective_key("energy", t) == 3.6e9
    with pytest.raises(InputError, match="must be one of time-to-train, cost, energy"):
        tt.objective_key("iteration", t)
    section = {"failure_rate_per_node_day": 0.002, "restart_overhead_s": 240.0,
               "storage_write_GBps_per_node": 2.0, "storage_write_GBps_aggregate": 500.0,
               "storage_read_GBps_per_node": 3.0, "storage_read_GBps_aggregate": 700.0,
               "gpu_hour_price": 2.5, "gpu_power_fraction": 0.8, "node_overhead_W": 3000.0,
               "pue": 1.3}
    assert tt.training_settings(section) == {
        "failure_rate_per_node_day": 0.002, "restart_overhead_s": 240.0,
        "node_write_Bps": 2e9, "aggregate_write_Bps": 5e11, "node_read_Bps": 3e9,
        "aggregate_read_Bps": 7e11, "gpu_hour_price": 2.5, "gpu_power_fraction": 0.8,
        "node_overhead_W": 3000.0, "pue": 1.3}
    assert tt.DEFAULT_NODE_OVERHEAD_W == {"a100-80gb": 3300.0, "h100-80gb": 4600.0,
                                          "h200-141gb": 4600.0, "b200-180gb": 6300.0}


def test_data_parallel_windows_and_a_placed_iteration_per_stage():
    """The windows data-parallel traffic hides under: the gradient reduction under the last
    microbatch's backward, its recompute and its tensor-parallel collectives (forward and
    backward: both run in the backward pass with recompute), less what running them as one
    stretch saves; the parameter gather under the next forward. A placed iteration's stage table: m microbatches through the stage's
    chunks forward and backward, busy their sum, idle what is left of the makespan
    (iteration less optimizer) after busy and the exposed reduction."""
    from configurator.cost.iteration import dp_windows_s
    from configurator.cost.placed import PlacedTime
    t = dict(fwd=1.0, bwd=2.0, recompute=0.5, tp_f=0.1, tp_b=0.2, cp_f=0.3, cp_b=0.4,
             ep_f=0.6, ep_b=0.7)
    bwd, fwd = dp_windows_s(t)
    assert bwd == pytest.approx(2.0 + 0.5 + 0.1 + 0.2, rel=1e-12)
    assert fwd == 1.0
    # what the backward's one stretch of host and GPU work saves shortens its window only
    bwd, fwd = dp_windows_s(t, 0.3)
    assert (bwd, fwd) == (pytest.approx(2.0 + 0.5 + 0.1 + 0.2 - 0.3, rel=1e-12), 1.0)
    # dp = 1, pp = 2, vp = 2; 4 microbatches
    f = np.array([[[0.10, 0.15], [0.20, 0.05]]])
    b = np.array([[[0.30, 0.25], [0.35, 0.30]]])
    zero = np.zeros((1, 2))
    pt = PlacedTime(iteration_time_s=5.0, stage_fwd_s=f, stage_bwd_s=b, p2p_fwd_s=zero,
                    p2p_bwd_s=zero, dp_tail_s=np.array([0.4, 0.1]), optimizer_s=0.5,
                    critical_replica=0, sim=None, num_microbatches=4)
    rows = pt.stage_times()
    for s, (fs, bs, tail) in enumerate(((1.0, 2.2, 0.4), (1.0, 2.6, 0.1))):
        r = rows[s]
        assert r["stage"] == s
        assert r["forward_s"] == pytest.approx(fs, rel=1e-12)
        assert r["backward_s"] == pytest.approx(bs, rel=1e-12)
        assert r["busy_s"] == pytest.approx(fs + bs, rel=1e-12)
        assert r["dp_exposed_s"] == tail
        assert r["idle_s"] == pytest.approx(5.0 - 0.5 - fs - bs - tail, rel=1e-12)


# ---------------------------------------------------------------- pipeline schedule

def test_1f1b_schedule_extrapolation_and_replica_passes():
    """1F1B on pp = 2 uniform stages, forward 1 s and backward 2 s a microbatch, free sends:
    the last stage starts after one forward and alternates, the first stage ends one
    backward after it: (m + pp − 1)·(f + b). Up to m1 + 5k microbatches (k = 12 groups of
    pp = 24, m1 = 2k + m mod k) the schedule is walked op by op; from m1 + 5k on (m = 168:
    m1 = 48) it is extrapolated from m1 and m1 + k, exactly for a periodic steady state. A
    long interleaved schedule (2·pp·vp·m ops over MAX_OPS) whose base would be itself (pp = 8,
    vp = 32, m = 280: k = 96, m1 = 2k + 280 mod 96 = 280) is walked whole. Many replicas are
    walked in passes of MAX_CELLS ops (here 1600 replicas of 4·167 ops, 1569 a pass), each
    replica with its own tail (work after its last backward: here i ms on the first
    stage)."""
    from configurator.cost.schedule_sim import simulate
    f, b = np.array([[1.0], [1.0]]), np.array([[2.0], [2.0]])
    walked = simulate(f, b, 0.0, 0.0, 167)
    assert walked.extrapolated_to is None
    assert _one(walked.iteration_time_s) == pytest.approx(168 * 3.0, rel=1e-12)
    extrapolated = simulate(f, b, 0.0, 0.0, 168)
    assert extrapolated.extrapolated_to == 168
    assert _one(extrapolated.iteration_time_s) == pytest.approx(169 * 3.0, rel=1e-12)

    long = simulate(np.full((8, 32), 1e-3), np.full((8, 32), 2e-3), 0.0, 0.0, 280)
    assert long.extrapolated_to is None

    D, m = 1600, 167
    tails = np.zeros((D, 2))
    tails[:, 0] = 1e-3 * np.arange(D)
    res = simulate(f, b, 0.0, 0.0, m, tail_s=tails)
    np.testing.assert_allclose(res.iteration_time_s, (m + 1) * 3.0 + 1e-3 * np.arange(D),
                               rtol=1e-12)


@pytest.mark.parametrize("pp", [2, 4])
def test_1f1b_middle_stage_sends_twice_per_microbatch(pp):
    """1F1B on pp = 4 (one uniform node, every boundary alike): the fill and drain cross
    every boundary once each way and the steady state adds one send per microbatch at the
    pacing end's boundary, m + 2(pp − 1) sends; a middle stage sends twice per microbatch
    while an end stage sends once but carries its extra (the slower end's: embedding, or
    logits and loss; the end stages' layers are alike), so the middle one paces the sends by
    m·max(send − extra, 0) more. A tiny vocabulary and tp = 1 (no embedding all-reduce) keep
    the extras shorter than a send of the s·b·h activations. On pp = 2 there is no middle
    stage: the sends alone."""
    from configurator.cost.iteration import p2p_message_s

    model = make_model(**(GQA | dict(num_layers=8, hidden_size=4096, num_attention_heads=32,
                                     kv_channels=128, ffn_hidden_size=4096,
                                     seq_length=16384, vocab_size=200)))
    cl = load_cluster(H100, nodes=1)
    m = 8
    c = _candidates(model, tp=1, pp=pp, micro_batch_size=1, global_batch_size=m)
    comm = dict(comm_figures(cl, c), **expert_comm_figures(cl, c))
    out = iteration_time(model, cl, c, comm)
    lc = layer_costs(model, c, cl.gpu)
    x = {k: _one(v) for k, v in stage_extras_s(model, c, cl.gpu, lc, comm["tp_bw"],
                                               comm["tp_lat"]).items()}
    extra = max(x["logits_fwd"] + x["logits_bwd"], x["emb_fwd"] + x["emb_bwd"])
    send = _one(p2p_message_s(model, c, lc, comm["pp_bw"], comm["pp_lat"], comm["tp_bw"],
                              comm["tp_lat"]))
    assert send > extra
    middle = m * (send - extra) if pp > 2 else 0.0
    assert _one(out["pp_comm"]) == pytest.approx((m + 2 * (pp - 1)) * send + middle,
                                                 rel=1e-9)


def test_moe_act_recompute_reruns_the_clamped_expert_activation():
    """The moe_act module re-runs the routed experts' activation: SwiGLU reads 2·2 bytes and
    writes 2 a routed token and expert FFN unit of this rank (R = k·X·etp·I rows, X = T/tp,
    fe/etp units, I the busiest of ep 4 ranks' load of E 8 experts under dropless routing,
    1 + c·sqrt(2·4·ln 4/8)), one kernel, and with activation_func_clamp_value its eager
    clamps (8 bytes an element of the fc1 output, R·2·fe/etp, in 3 kernels); then
    ``CheckpointWithoutOutput`` copies the re-run output back into its freed storage (read
    and write 2 bytes of each of its R·fe/etp elements, one kernel)."""
    from configurator.cost.host_ops import eager_s
    E, k, fe = 8, 2, 64
    model = make_model(**GQA, num_experts=E, moe_router_topk=k, moe_ffn_hidden_size=fe,
                       moe_layer_freq=[0, 1, 0, 1], activation_func_clamp_value=7.0)
    gpu = load_cluster(H100, nodes=1).gpu
    eff = gpu.efficiency
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    t, etp, b, s = 2, 2, 2, 512
    c = _candidates(model, tp=t, dp=4, ep=4, etp=etp, micro_batch_size=b,
                    sequence_parallel=True, global_batch_size=8, recompute="selective",
                    recompute_modules="moe_act")
    lc = layer_costs(model, c, gpu)
    R = k * (b * s / t) * etp * (1 + ROUTER_LOAD_CV["per_batch"]
                                 * math.sqrt(2 * 4 * math.log(4) / E))
    want = (6 * R * fe / etp / hbm + eff.kernel_overhead_s
            + eager_s(8 * R * 2 * fe / etp, 3, gpu)
            + 4 * R * fe / etp / hbm + eff.kernel_overhead_s)
    assert _one(lc["moe_recompute"]) == pytest.approx(want, rel=1e-12)
    # fused into the grouped GEMMs (moe_fused_grouped_mlp) the activation and its clamp
    # have no kernels or output of their own: one launch is left
    c = _candidates(model, tp=t, dp=4, ep=4, etp=etp, micro_batch_size=b,
                    sequence_parallel=True, global_batch_size=8, recompute="selective",
                    recompute_modules="moe_act", moe_fused_grouped_mlp=True)
    assert _one(layer_costs(model, c, gpu)["moe_recompute"]) == pytest.approx(
        eff.kernel_overhead_s, rel=1e-12)
