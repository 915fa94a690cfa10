import numpy as np
import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.search.evaluate import SCHEDULE_KEY, evaluate_plan
from configurator.cost.flops import megatron_model_flops, sc21_flops
from configurator.core.model import make_model
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.cost.iteration import BREAKDOWN_KEYS, iteration_time
from configurator.cost.communication import expert_comm_figures
from topology.cluster_files import cluster_from_config, load_cluster
from topology.collectives import all_gather_time_s, all_reduce_time_s, p2p_time_s

GPT175 = MODEL_PRESETS["gpt3-175b"]


def test_ring_collectives_closed_form():
    assert all_reduce_time_s(8e9, 8, 100e9, 1e-5) == pytest.approx(2 * 7 * 1e-5 + 2 * 7 / 8 * 0.08)
    assert all_gather_time_s(8e9, 4, 100e9, 0.0) == pytest.approx(3 / 4 * 0.08)
    assert all_reduce_time_s(8e9, 1, 100e9, 1e-5) == 0.0
    assert p2p_time_s(1e9, 1e9, 1e-6) == pytest.approx(1.000001)


def test_megatron_flops_reduces_to_korthikanti_formula_with_causal_half():
    m = GPT175
    B, s, L, h, V = 1536, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    # 72·B·s·L·h²·(1 + s/(12h) + V/(12hL)) once attention is counted causally (s/(2h) term)
    want = 72 * B * s * L * h * h * (1 + s / (12 * h) + V / (12 * h * L))
    assert megatron_model_flops(m, B) == pytest.approx(want, rel=1e-12)
    # SC'21 counts the recompute forward too: 4/3 of the non-causal model FLOPs
    assert sc21_flops(m, B) > megatron_model_flops(m, B) * 4 / 3


def _plan(**kw):
    base = dict(tp=8, pp=8, dp=16, vp=1, micro_batch_size=1, global_batch_size=1536,
                recompute="selective", sequence_parallel=True, distributed_optimizer=True)
    base.update(kw)
    return ParallelPlan(**base)


def test_breakdown_sums_to_iteration_time_and_is_nonnegative():
    cl = load_cluster("dgx-a100-80gb", nodes=128)
    e = evaluate_plan(GPT175, cl, _plan(vp=2))
    assert sum(e.time_breakdown_s.values()) == pytest.approx(e.iteration_time_s)
    assert set(e.time_breakdown_s) == set(BREAKDOWN_KEYS) | {SCHEDULE_KEY}
    assert all(e.time_breakdown_s[k] >= 0 for k in BREAKDOWN_KEYS)
    # uniform cluster: the simulated schedule is within 1 % of the closed form
    assert abs(e.time_breakdown_s[SCHEDULE_KEY]) <= 0.01 * e.iteration_time_s
    assert e.closed_form_iteration_time_s == pytest.approx(
        e.iteration_time_s - e.time_breakdown_s[SCHEDULE_KEY])


def test_bubble_follows_pp_minus_1_over_vm():
    cl = load_cluster("dgx-a100-80gb", nodes=128)
    from configurator.cost.communication import comm_figures
    from configurator.cost.compute import layer_costs
    from configurator.cost.iteration import stage_extras_s

    one = evaluate_plan(GPT175, cl, _plan(vp=1)).time_breakdown_s
    two = evaluate_plan(GPT175, cl, _plan(vp=4)).time_breakdown_s
    # bubble = (p-1)/v core stage times (SC'21 §2.2) + the lighter end's extra (the
    # embedding) once in 1F1B, p times interleaved; compute is unchanged
    c = PlanBatch.from_plan(_plan(vp=1))
    comm = comm_figures(cl, c)
    x = stage_extras_s(GPT175, c, cl.gpu, layer_costs(GPT175, c, cl.gpu), comm["tp_bw"],
                       comm["tp_lat"])
    emb = float((x["emb_fwd"] + x["emb_bwd"])[0])
    assert 0 < emb < 0.01 * one["bubble"]
    assert two["bubble"] - 8 * emb == pytest.approx((one["bubble"] - emb) / 4, rel=1e-9)
    assert two["compute"] == pytest.approx(one["compute"], rel=1e-9)
    # bubble / work ≈ (p-1)/m (the bubble uses the average stage, work the slowest one)
    m = _plan().num_microbatches
    work = one["compute"] + one["recompute"] + one["tp_comm"]
    assert one["bubble"] / work == pytest.approx(7 / m, rel=0.05)
    # 1F1B exposes every send of the bottleneck stage (m + 2(p-1)); interleaving overlaps
    # the steady state's sends with compute, exposing one round trip (2(p·v - 1))
    assert two["pp_comm"] / one["pp_comm"] == pytest.approx(2 * (8 * 4 - 1) / (m + 14))


def test_recompute_costs_ordered_like_korthikanti_table4():
    cl = load_cluster("dgx-a100-80gb", nodes=128)
    t = {rc: evaluate_plan(GPT175, cl, _plan(recompute=rc, attention_backend="local"))
         for rc in ("none", "selective", "full")}
    assert t["none"].iteration_time_s < t["selective"].iteration_time_s < t["full"].iteration_time_s
    # full recompute repeats the forward (≈ 1/3 of fwd+bwd compute)
    ratio = t["full"].time_breakdown_s["recompute"] / t["full"].time_breakdown_s["compute"]
    assert 0.25 < ratio < 0.4
    assert t["full"].peak_memory_bytes < t["selective"].peak_memory_bytes < t["none"].peak_memory_bytes


def test_korthikanti_table4_per_layer_time_22b():
    """One 22B layer, TP8, mbs 4, seq 2048 (Korthikanti et al. 2022 Table 4): forward+backward
    without recompute 19.6 ms, full recompute 27.2 ms, selective+SP 20.3 ms. The 22B model is
    not in the calibration set; allow 15 %."""
    m = make_model(name="22b", num_layers=48, hidden_size=6144, num_attention_heads=64,
                   vocab_size=51200, seq_length=2048)
    cl = load_cluster("dgx-a100-80gb", nodes=1)
    published = {("none", False): 19.6e-3, ("full", False): 27.2e-3,
                 ("selective", True): 20.3e-3}
    for (rc, sp), want in published.items():
        p = ParallelPlan(tp=8, pp=1, dp=1, micro_batch_size=4, global_batch_size=4,
                         recompute=rc, sequence_parallel=sp, precision="fp16",
                         attention_backend="local", overlap_grad_reduce=False)
        t = iteration_time(m, cl, PlanBatch.from_plan(p))
        per_layer = (t["compute"][0] + t["recompute"][0] + t["tp_comm"][0]) / m.num_layers
        assert per_layer == pytest.approx(want, rel=0.15), (rc, sp, per_layer)


def test_fp8_faster_than_bf16_on_h100_and_flash_faster_than_local():
    cl = load_cluster("dgx-h100-80gb", nodes=128)
    bf16 = evaluate_plan(GPT175, cl, _plan()).iteration_time_s
    fp8 = evaluate_plan(GPT175, cl, _plan(precision="fp8")).iteration_time_s
    assert fp8 < bf16
    local = evaluate_plan(GPT175, cl, _plan(attention_backend="local")).iteration_time_s
    assert bf16 < local


def test_slower_network_slows_only_communication():
    fast = load_cluster("dgx-a100-80gb", nodes=128)
    slow = load_cluster("dgx-a100-80gb", nodes=128)
    for u, v, d in slow.graph.edges(data=True):
        if d["link_class"] == "network":
            d["bandwidth_Bps"] /= 4
    slow.invalidate()
    a = evaluate_plan(GPT175, fast, _plan()).time_breakdown_s
    b = evaluate_plan(GPT175, slow, _plan()).time_breakdown_s
    assert b["compute"] == pytest.approx(a["compute"])
    assert b["pp_comm"] > 3 * a["pp_comm"]
    assert b["dp_comm"] > a["dp_comm"]
    assert b["tp_comm"] == pytest.approx(a["tp_comm"])  # tp=8 stays inside the node


def test_tp_group_straddling_nodes_is_slower():
    cl = load_cluster("dgx-a100-80gb", nodes=2)
    aligned, _ = cl.group_busbw(1, 4, 16)
    straddling, _ = cl.group_busbw(1, 6, 12)  # ranks 6..11 span two nodes
    assert straddling < aligned / 2


def test_alternating_window_layers_each_priced_at_their_own_key_length():
    """GPT-OSS alternates sliding-window (128 keys) and full causal layers
    (window_attn_skip_freq 2): a layer's fused-attention time is the mean of a full layer's
    (½ the s² pairs at the efficiency of s keys) and a window layer's (its band at the
    efficiency of 128 keys), not every layer at the window's efficiency."""
    import dataclasses

    from configurator.cost.compute import flash_efficiency, layer_costs
    from topology.gpus import GPU_PRESETS

    gpu = GPU_PRESETS["b200-180gb"]
    oss = MODEL_PRESETS["gpt-oss-120b"].with_seq_length(4096)
    assert oss.attention_layer_kinds == ((0.5, 0.5, None),
                                         (0.5, 128 / 4096 * (1 - 128 / 8192), 128))
    c = PlanBatch.from_plan(ParallelPlan(tp=1, pp=1, dp=8, ep=8, micro_batch_size=4,
                                          global_batch_size=64))
    full = dataclasses.replace(oss, window_size=None, window_attn_skip_freq=None)
    windowed = dataclasses.replace(oss, window_attn_skip_freq=None)
    assert windowed.attention_layer_kinds == ((1.0, oss.attention_layer_kinds[1][1], 128),)
    overhead = gpu.efficiency.kernel_overhead_s
    t = {name: float(layer_costs(m, c, gpu)["attn_fwd"][0]) - overhead
         for name, m in (("mixed", oss), ("full", full), ("window", windowed))}
    assert t["mixed"] == pytest.approx((t["full"] + t["window"]) / 2, rel=1e-9)
    # the full layers run at the efficiency of 4,096 keys, 7.2x that of 128
    pairs = 2.0 * 4 * 4096 * 4096 * 64 * 128
    peak = gpu.peak("bf16")
    assert t["full"] == pytest.approx(
        0.5 * pairs / (peak * flash_efficiency(gpu.efficiency.flash_attention, 4096)))
    assert flash_efficiency(1.0, 4096) / flash_efficiency(1.0, 128) > 7


def test_one_gpu_per_nvlink_domain_has_no_nvlink_figure():
    """A cluster of one GPU per node has no NVLink pair: an expert group's NVLink figures are
    (inf, 0) and its exchange crosses the network, GPU 0 to GPU 1 (communication.py
    ``expert_comm_table`` reads the pair (0, 1) as NVLink only where a domain holds two
    GPUs); one such GPU alone is priced too."""
    cfg = dict(name="one-gpu-nodes", gpu="h100-80gb", gpus_per_node=1, nodes=16,
               intra_node_bandwidth_GBps=450, inter_node_bandwidth_GBps=50,
               intra_node_latency_us=3.0, inter_node_latency_us=6.0)
    cluster = cluster_from_config(cfg)
    plan = ParallelPlan(tp=1, pp=1, dp=16, ep=8, micro_batch_size=1, global_batch_size=64)
    fig = expert_comm_figures(cluster, PlanBatch.from_plan(plan))
    assert fig["ep_on_node"][0] == 1
    assert np.isinf(fig["ep_intra_bw"][0]) and fig["ep_intra_lat"][0] == 0.0
    assert (fig["ep_inter_bw"][0], fig["ep_inter_lat"][0]) == cluster.link(0, 1)
    single = cluster_from_config(cfg, nodes=1)
    alone = ParallelPlan(tp=1, pp=1, dp=1, ep=1, micro_batch_size=1, global_batch_size=8)
    assert evaluate_plan(MODEL_PRESETS["qwen3-30b-a3b"], single, alone).iteration_time_s > 0


def test_a_plan_without_a_pipeline_pays_no_send_whatever_the_pipeline_figures():
    """pp 1 has no pipeline group: its sends are 0 even where the figures for one say no
    bytes could move (a zero bandwidth, which prices a send at infinity: 0 sends times an
    infinite send is not a number, so the sends are guarded by pp > 1, not left to the
    count)."""
    from configurator.cost.communication import comm_figures

    cl = load_cluster("dgx-a100-80gb", nodes=16)
    c = PlanBatch.from_plan(_plan(pp=1, dp=16))
    comm = comm_figures(cl, c)
    comm = dict(comm, **{k: np.zeros_like(v) for k, v in comm.items()
                         if k.startswith("pp") and k.endswith("_bw")})
    with np.errstate(divide="ignore", invalid="ignore"):
        t = iteration_time(GPT175, cl, c, comm=comm)
    assert float(t["pp_comm"][0]) == 0.0
    assert np.isfinite(t["iteration_time_s"]).all()
    assert float(t["iteration_time_s"][0]) == pytest.approx(
        float(iteration_time(GPT175, cl, c)["iteration_time_s"][0]), rel=1e-12)
