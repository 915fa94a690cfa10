"""Critical-path model of one Megatron-LM training iteration, vectorised over plans.

Layer compute comes from :mod:`configurator.cost.compute`, group links from
:mod:`configurator.cost.communication`, collective formulas from :mod:`topology.collectives`
and pipeline-schedule facts (bubble, p2p count) from :mod:`configurator.core.schedule`.

* tensor parallel: 2 all-reduces forward and 2 backward (all-gather + reduce-scatter pairs
  with sequence parallelism, same bytes) of ``T·h`` 16-bit values (Shoeybi et al. 2019 §3;
  Korthikanti et al. 2022 §4.2.2); forward ones exposed, backward ones hidden under the
  weight-gradient GEMMs as far as those last.
* context parallel: ring exchange of K and V (forward ``cp-1`` steps, backward K, V, dK, dV),
  hidden behind attention compute where it is shorter (Megatron-LM context parallelism).

Pipeline (Narayanan et al. SC'21 §2.2): ``m`` microbatches at the slowest stage's pace plus
the schedule's bubble (``(pp-1)/vp`` average stage times); p2p of ``T·h`` values (÷t: scatter/gather
optimisation, SC'21 §4.1, or the sequence-parallel shard) twice per chunk-microbatch.
Data parallel: gradient all-reduce (or reduce-scatter + parameter all-gather with the
distributed optimizer) over the dp·cp group, overlapped with the last microbatch's backward
(and the next forward) when the overlap flags are on, never below one bucket's time.
Optimizer: Adam reads and writes ≈ 30 bytes per (sharded) parameter from HBM.
"""

from __future__ import annotations

import numpy as np

from configurator.core.candidates import Candidates
from configurator.core.model import ModelSpec
from configurator.core.schedule import bubble_stage_times, p2p_transfers
from configurator.cost.communication import comm_figures
from configurator.cost.compute import gemm_time_s, layer_costs
from memory_model.params import (embedding_parameters, padded_vocab_size,
                                 stage_parameters)
from topology.collectives import all_gather_time_s, all_reduce_time_s, p2p_time_s

BREAKDOWN_KEYS = ("compute", "recompute", "bubble", "tp_comm", "cp_comm", "pp_comm",
                  "dp_comm", "optimizer")
#: Megatron DDP bucket: ``max(40M, 1M·dp)`` parameters (megatron/core/distributed
#: distributed_data_parallel_config.py, ``bucket_size``).
BUCKET_PARAMS = 40_000_000


def iteration_time(model: ModelSpec, cluster, c: Candidates,
                   comm: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Iteration time (s) and its breakdown (keys :data:`BREAKDOWN_KEYS`) for every plan.

    ``comm`` defaults to :func:`comm_figures` on ``cluster``. Returns arrays of seconds plus
    ``iteration_time_s``; the breakdown sums to the iteration time.
    """
    gpu = cluster.gpu
    eff = gpu.efficiency
    comm = comm_figures(cluster, c) if comm is None else comm
    lc = layer_costs(model, c, gpu)
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
    logits = 3 * gemm_time_s(T, v_pad / tp, h, **lc["gemm_kw"]) + 16.0 * T * v_pad / tp / (
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
        "bubble": bubble_stage_times(pp, vp) * stage_avg,
    }
    # Pipeline p2p: forward and backward sends per chunk-microbatch, exposed.
    p2p_bytes = act_bytes / tp
    gather = np.where(c.sequence_parallel, 0.0, all_gather_time_s(act_bytes, tp, comm["tp_bw"],
                                                     comm["tp_lat"]))
    t_p2p = p2p_time_s(p2p_bytes, comm["pp_bw"], comm["pp_lat"]) + gather
    out["pp_comm"] = p2p_transfers(pp, vp, m) * t_p2p

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
