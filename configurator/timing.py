"""Critical-path model of one Megatron-LM training iteration, vectorised over plans.

Per layer and microbatch on one GPU (tokens per rank ``T = b·s/cp``):

* GEMMs (QKV, attention output, fc1, fc2; logits on the last stage) timed by a roofline —
  ``max(FLOPs / (η_gemm·peak·wave_quantisation), bytes / (η_hbm·HBM))`` — so thin or small
  GEMMs lose efficiency; backward runs the dgrad and wgrad GEMMs (2× forward).
  (Williams et al. 2009 roofline; wave quantisation per NVIDIA "Matrix Multiplication
  Background" user guide.)
* core attention: score-storing backends (``local``/``unfused``) run two batched GEMMs per
  head plus softmax (and dropout) over ``a·s²`` scores from HBM; flash-style kernels do
  ``4·b·s_q·s_k·h/t`` FLOPs, halved for the causal mask, at η_flash (backward 2.5×).
* memory-bound ops (norms, bias-dropout-add, GeLU/SwiGLU, RoPE, copies) from bytes moved
  and attained HBM bandwidth; backward moves ≈ 2× the forward bytes.
* recompute: ``full`` repeats the layer's forward (and its tensor-parallel collectives);
  ``selective`` repeats core attention only (Korthikanti et al. 2022 §5).
* tensor parallel: 2 all-reduces forward and 2 backward (all-gather + reduce-scatter pairs
  with sequence parallelism, same bytes) of ``T·h`` 16-bit values (Shoeybi et al. 2019 §3;
  Korthikanti et al. 2022 §4.2.2); forward ones exposed, backward ones hidden under the
  weight-gradient GEMMs as far as those last.
* context parallel: ring exchange of K and V (forward ``cp-1`` steps, backward K, V, dK, dV),
  hidden behind attention compute where it is shorter (Megatron-LM context parallelism).

Pipeline (Narayanan et al. SC'21 §2.2): ``m`` microbatches at the slowest stage's pace plus
a bubble of ``(pp-1)/vp`` average stage times; p2p of ``T·h`` values (÷t: scatter/gather
optimisation, SC'21 §4.1, or the sequence-parallel shard) twice per chunk-microbatch.
Data parallel: gradient all-reduce (or reduce-scatter + parameter all-gather with the
distributed optimizer) over the dp·cp group, overlapped with the last microbatch's backward
(and the next forward) when the overlap flags are on, never below one bucket's time.
Optimizer: Adam reads and writes ≈ 30 bytes per (sharded) parameter from HBM.
"""

from __future__ import annotations

import numpy as np

from configurator.candidates import Candidates
from configurator.efficiency import Efficiency, efficiency_for
from configurator.model import ModelSpec
from memory_model.params import (embedding_parameters, padded_vocab_size,
                                 stage_parameters)
from topology.collectives import all_gather_time_s, all_reduce_time_s, p2p_time_s

BREAKDOWN_KEYS = ("compute", "recompute", "bubble", "tp_comm", "cp_comm", "pp_comm",
                  "dp_comm", "optimizer")
#: Megatron DDP bucket: ``max(40M, 1M·dp)`` parameters (megatron/core/distributed
#: distributed_data_parallel_config.py, ``bucket_size``).
BUCKET_PARAMS = 40_000_000


def comm_figures(cluster, c: Candidates) -> dict[str, np.ndarray]:
    """Worst ring bus bandwidth (B/s) and latency (s) of each plan's tp, cp, dp·cp groups and
    pipeline neighbours on ``cluster`` under Megatron's rank order ``tp-cp-dp-pp``."""
    world = int(c.tp[0] * c.pp[0] * c.dp[0] * c.cp[0])
    if c.group is not None:
        uniq, inv = c.group_keys, c.group
    else:
        keys = np.stack([c.tp, c.cp, c.dp, c.pp], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
    table = np.empty((len(uniq), 8))
    for i, (tp, cp, dp, pp) in enumerate(uniq.tolist()):
        table[i, 0:2] = cluster.group_busbw(1, tp, world)
        table[i, 2:4] = cluster.group_busbw(tp, cp, world)
        table[i, 4:6] = cluster.group_busbw(tp, cp * dp, world)
        table[i, 6:8] = cluster.p2p_worst(tp * cp * dp, pp, world)
    names = ("tp_bw", "tp_lat", "cp_bw", "cp_lat", "dp_bw", "dp_lat", "pp_bw", "pp_lat")
    return {n: table[inv, j] for j, n in enumerate(names)}


def _gemm_time(M, N, K, *, batch, peak, eff: Efficiency, hbm, in_bytes, gemm_eff):
    """Roofline time (s) of ``batch`` GEMMs of ``M×K · K×N`` with wave quantisation."""
    flops = 2.0 * M * N * K * batch
    tiles = np.ceil(M / 256.0) * np.ceil(N / 128.0) * batch
    waves = np.ceil(tiles / eff.num_sms)
    quant = tiles / (waves * eff.num_sms)
    t_compute = flops / (peak * gemm_eff * quant)
    t_memory = batch * (in_bytes * (M * K + K * N) + 2.0 * M * N) / (hbm * eff.hbm)
    return np.maximum(t_compute, t_memory) + eff.kernel_overhead_s


def layer_costs(model: ModelSpec, c: Candidates, gpu, eff: Efficiency) -> dict:
    """Forward/backward/recompute times (s) of one layer for one microbatch, per plan."""
    h, a, g, f, d = (model.hidden_size, model.num_attention_heads, model.num_query_groups,
                     model.ffn_hidden_size, model.kv_channels)
    tp = c.tp.astype(float)
    s_q = model.seq_length / c.cp
    s_k = float(model.seq_length)
    T = c.mbs * s_q
    fp8 = c.precision == "fp8"
    peak16 = gpu.peak("fp16" if c.precision == "fp16" else "bf16")
    gemm_peak = gpu.peak("fp8") if fp8 else peak16
    gemm_eff = eff.gemm_fp8 if fp8 else eff.gemm
    hbm = gpu.hbm_bandwidth_Bps
    kw = dict(batch=1.0, peak=gemm_peak, eff=eff, hbm=hbm, in_bytes=1.0 if fp8 else 2.0,
              gemm_eff=gemm_eff)
    fc1_n = f * (2 if model.swiglu else 1)
    gemm_qkv = _gemm_time(T, (a + 2 * g) * d / tp, h, **kw)
    gemm_fc1 = _gemm_time(T, fc1_n / tp, h, **kw)
    gemm_fwd = (gemm_qkv + _gemm_time(T, h, a * d / tp, **kw) + gemm_fc1
                + _gemm_time(T, h, f / tp, **kw))
    rep = T * h / np.where(c.sp, tp, 1.0)  # elements of replicated-or-SP activations
    drop = model.hidden_dropout > 0
    elem = (2 * 4 * rep + 2 * (6 + drop) * rep
            + (6 if model.swiglu else 4) * T * f / tp
            + (4 * T * (a + g) * d / tp if model.position_embedding_type == "rope" else 0.0))
    n_kernels = 10
    if c.stores_scores:
        heads = c.mbs * a / tp
        kw16 = dict(kw, peak=peak16, gemm_eff=eff.gemm, in_bytes=2.0, batch=heads)
        scores = s_q * s_k * heads
        attn_fwd = (_gemm_time(s_q, s_k, d, **kw16) + _gemm_time(s_q, d, s_k, **kw16)
                    + (4 + 5 * (model.attention_dropout > 0)) * scores / (hbm * eff.hbm)
                    + 4 * T * h / tp / (hbm * eff.hbm) + 3 * eff.kernel_overhead_s)
        attn_bwd = 2 * attn_fwd
    else:
        flops = 4.0 * c.mbs * s_q * s_k * h / tp * 0.5  # causal
        attn_fwd = flops / (peak16 * eff.flash_attention) + eff.kernel_overhead_s
        attn_bwd = 2.5 * attn_fwd
    elem_fwd = elem / (hbm * eff.hbm) + n_kernels * eff.kernel_overhead_s
    fwd = gemm_fwd + attn_fwd + elem_fwd
    bwd = 2 * gemm_fwd + attn_bwd + 2 * elem_fwd
    recompute = np.select([c.recompute == 2, c.recompute == 1], [fwd, attn_fwd], 0.0)
    return {"fwd": fwd, "bwd": bwd, "recompute": recompute, "attn": attn_fwd + attn_bwd,
            "wgrad_overlap": gemm_qkv + gemm_fc1,
            "tokens": T, "gemm_kw": kw}


def iteration_time(model: ModelSpec, cluster, c: Candidates,
                   comm: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Iteration time (s) and its breakdown (keys :data:`BREAKDOWN_KEYS`) for every plan.

    ``comm`` defaults to :func:`comm_figures` on ``cluster``. Returns arrays of seconds plus
    ``iteration_time_s``; the breakdown sums to the iteration time.
    """
    gpu = cluster.gpu
    eff = efficiency_for(gpu.name)
    comm = comm_figures(cluster, c) if comm is None else comm
    lc = layer_costs(model, c, gpu, eff)
    tp, pp, vp, cp = (x.astype(float) for x in (c.tp, c.pp, c.vp, c.cp))
    m = c.num_microbatches.astype(float)
    T = lc["tokens"]
    h = model.hidden_size
    act_bytes = 2.0 * T * h

    # Tensor-parallel collectives per layer: 2 forward (+2 in a full recompute), exposed;
    # the 2 backward ones (column-parallel input gradients) run asynchronously under the
    # QKV and fc1 weight-gradient GEMMs (megatron/core/tensor_parallel/layers.py,
    # LinearWithGradAccumulationAndAsyncCommunication), exposed only beyond them.
    t_coll = all_reduce_time_s(act_bytes, tp, comm["tp_bw"], comm["tp_lat"])
    n_fwd = np.where(c.recompute == 2, 4.0, 2.0)
    tp_layer = n_fwd * t_coll + np.maximum(2 * t_coll - lc["wgrad_overlap"], 0.0)
    # Context-parallel K/V ring, hidden behind attention when shorter.
    kv_step = 2 * 2.0 * T * model.num_query_groups * model.kv_channels / tp
    cp_raw = 3 * (cp - 1) * p2p_time_s(kv_step, comm["cp_bw"], comm["cp_lat"])
    cp_layer = np.where(cp > 1, np.maximum(cp_raw - lc["attn"], 0.0), 0.0)

    # First-stage extras (embedding lookup + its tp collective) and last-stage ones
    # (logits GEMM fwd + 2x bwd, fp32 cross-entropy passes).
    v_pad = padded_vocab_size(model.vocab_size, c.tp)
    emb = 3 * act_bytes / (gpu.hbm_bandwidth_Bps * eff.hbm) + all_reduce_time_s(
        act_bytes, tp, comm["tp_bw"], comm["tp_lat"])
    logits = 3 * _gemm_time(T, v_pad / tp, h, **lc["gemm_kw"]) + 16.0 * T * v_pad / tp / (
        gpu.hbm_bandwidth_Bps * eff.hbm)

    layers = model.num_layers / pp
    comp_layer = lc["fwd"] + lc["bwd"]
    first = layers * (comp_layer + lc["recompute"] + tp_layer + cp_layer) + emb
    last = layers * (comp_layer + lc["recompute"] + tp_layer + cp_layer) + logits
    single = pp == 1
    first = np.where(single, first + logits, first)
    last = np.where(single, first, last)
    slow_is_last = last > first
    extra = np.where(single, emb + logits, np.where(slow_is_last, logits, emb))
    stage_avg = layers * (comp_layer + lc["recompute"] + tp_layer + cp_layer) + np.where(
        single, emb + logits, (emb + logits) / pp)

    out = {
        "compute": m * (layers * comp_layer + extra),
        "recompute": m * layers * lc["recompute"],
        "tp_comm": m * layers * tp_layer,
        "cp_comm": m * layers * cp_layer,
        "bubble": (pp - 1) / vp * stage_avg,
    }
    # Pipeline p2p: forward and backward sends per chunk-microbatch, exposed.
    p2p_bytes = act_bytes / tp
    gather = np.where(c.sp, 0.0, all_gather_time_s(act_bytes, tp, comm["tp_bw"],
                                                     comm["tp_lat"]))
    t_p2p = p2p_time_s(p2p_bytes, comm["pp_bw"], comm["pp_lat"]) + gather
    out["pp_comm"] = np.where(pp > 1, 2 * (m * vp + pp - 1) * t_p2p, 0.0)

    # Data-parallel gradient reduction over the dp·cp group.
    stage_params = np.maximum(stage_parameters(model, c.tp, c.pp, 0),
                              stage_parameters(model, c.tp, c.pp, c.pp - 1))
    grad_bytes = 2.0 if c.precision == "fp16" else 4.0
    n_dp = (c.dp * c.cp).astype(float)
    do = c.distributed_optimizer
    t_grad = np.where(do, all_gather_time_s(stage_params * grad_bytes, n_dp, comm["dp_bw"],
                                            comm["dp_lat"]),
                      all_reduce_time_s(stage_params * grad_bytes, n_dp, comm["dp_bw"],
                                        comm["dp_lat"]))
    t_gather = np.where(do, all_gather_time_s(stage_params * 2.0, n_dp, comm["dp_bw"],
                                              comm["dp_lat"]), 0.0)
    bucket = np.minimum(1.0, np.maximum(BUCKET_PARAMS, 1e6 * n_dp) / stage_params)
    if c.overlap_grad_reduce:
        window = layers * (lc["bwd"] + lc["recompute"] + tp_layer)
        t_grad = np.maximum(t_grad - window, t_grad * bucket)
    if c.overlap_param_gather:
        window = layers * lc["fwd"]
        t_gather = np.where(do, np.maximum(t_gather - window, t_gather * bucket), t_gather)
    # Tied embeddings with pp > 1: first and last stage all-reduce the embedding gradient.
    tied = (not model.untie_embeddings_and_output_weights) & (pp > 1)
    emb_grad = all_reduce_time_s(embedding_parameters(model, c.tp) * grad_bytes, 2.0,
                                 comm["pp_bw"], comm["pp_lat"])
    out["dp_comm"] = t_grad + t_gather + np.where(tied, emb_grad, 0.0)

    # Adam step (fp32 master, m, v, grad read; master, m, v written; 16-bit copy written)
    # plus a gradient-norm pass, over the local shard.
    shard = np.where(do, n_dp, 1.0)
    opt_bytes = stage_params * (30.0 / shard + grad_bytes)
    out["optimizer"] = opt_bytes / (gpu.hbm_bandwidth_Bps * eff.hbm) + 20 * eff.kernel_overhead_s

    out["iteration_time_s"] = sum(out[k] for k in BREAKDOWN_KEYS)
    return out
