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
the schedule's bubble (``(pp-1)/vp`` core stage times plus the lighter end stage's extra
work, once for 1F1B and ``pp`` times interleaved); p2p of ``T·h`` values (÷t: scatter/gather
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


def tp_layer_s(lc: dict, c: Candidates, act_bytes, tp_bw, tp_lat):
    """Exposed tensor-parallel collective time of one layer for one microbatch,
    ``(forward, backward)`` seconds (arrays broadcast over plans and, for a placed plan,
    over its groups' figures).

    2 forward collectives (+2 in the re-run forward of a full recompute), exposed; the 2
    backward ones (column-parallel input gradients) run asynchronously under the QKV and fc1
    weight-gradient GEMMs (megatron/core/tensor_parallel/layers.py,
    LinearWithGradAccumulationAndAsyncCommunication), exposed only beyond them."""
    t_coll = all_reduce_time_s(act_bytes, c.tp.astype(float), tp_bw, tp_lat)
    fwd = 2.0 * t_coll
    bwd = (np.where(c.recompute == 2, 2.0 * t_coll, 0.0)
           + np.maximum(2 * t_coll - lc["wgrad_overlap"], 0.0))
    return fwd, bwd


def cp_layer_s(model: ModelSpec, lc: dict, c: Candidates, cp_bw, cp_lat):
    """Exposed context-parallel K/V ring time of one layer for one microbatch (s): ``cp-1``
    steps forward and twice that backward (K, V, dK, dV), hidden behind attention where
    shorter (Megatron-LM context parallelism, ``attention.py`` p2p ring). The exposure is
    charged 1/3 to the forward and 2/3 to the backward: ``(forward, backward)``."""
    cp = c.cp.astype(float)
    kv_step = 2 * 2.0 * lc["tokens"] * model.num_query_groups * model.kv_channels / c.tp
    cp_raw = 3 * (cp - 1) * p2p_time_s(kv_step, cp_bw, cp_lat)
    total = np.where(cp > 1, np.maximum(cp_raw - lc["attn"], 0.0), 0.0)
    return total / 3.0, 2.0 * total / 3.0


def stage_extras_s(model: ModelSpec, c: Candidates, gpu, lc: dict, tp_bw, tp_lat):
    """First-stage extras (embedding lookup and its tensor-parallel collective) and
    last-stage extras (logits GEMM forward and 2× backward, fp32 cross-entropy passes) for
    one microbatch: ``{"emb_fwd", "emb_bwd", "logits_fwd", "logits_bwd"}`` seconds."""
    eff = gpu.efficiency
    T = lc["tokens"]
    h = model.hidden_size
    act_bytes = 2.0 * T * h
    v_pad = padded_vocab_size(model.vocab_size, c.tp)
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    gemm = gemm_time_s(T, v_pad / c.tp, h, **lc["gemm_kw"])
    ce = 8.0 * T * v_pad / c.tp / hbm
    return {"emb_fwd": act_bytes / hbm + all_reduce_time_s(act_bytes, c.tp.astype(float),
                                                           tp_bw, tp_lat),
            "emb_bwd": 2 * act_bytes / hbm,
            "logits_fwd": gemm + ce, "logits_bwd": 2 * gemm + ce}


def p2p_message_s(model: ModelSpec, c: Candidates, lc: dict, pp_bw, pp_lat, tp_bw, tp_lat):
    """One pipeline send of a microbatch's activations (or their gradient), seconds:
    ``T·h`` 16-bit values ÷ tp (scatter/gather optimisation, SC'21 §4.1, or the
    sequence-parallel shard), plus the all-gather that rebuilds them without sequence
    parallelism."""
    act_bytes = 2.0 * lc["tokens"] * model.hidden_size
    gather = np.where(c.sequence_parallel, 0.0,
                      all_gather_time_s(act_bytes, c.tp.astype(float), tp_bw, tp_lat))
    return p2p_time_s(act_bytes / c.tp, pp_bw, pp_lat) + gather


def grad_bytes(c: Candidates) -> float:
    """Bytes of one main gradient: fp32 main grads with bf16/fp8, fp16 grads with fp16."""
    return 2.0 if c.precision == "fp16" else 4.0


def dp_exposed_s(c: Candidates, stage_params, dp_bw, dp_lat, bwd_window_s, fwd_window_s):
    """Exposed data-parallel time of one pipeline rank per iteration (s): gradient
    all-reduce (reduce-scatter + parameter all-gather with the distributed optimizer) of
    ``stage_params`` parameters over the dp·cp group, the reduction overlapped with the
    last microbatch's backward (``bwd_window_s``) and the gather with the next forward
    (``fwd_window_s``) when the overlap flags are on, never below one bucket's time
    (Megatron DDP bucket ``max(40M, 1M·dp)`` parameters)."""
    gb = grad_bytes(c)
    n_dp = (c.dp * c.cp).astype(float)
    do = c.distributed_optimizer
    t_grad = np.where(do, all_gather_time_s(stage_params * gb, n_dp, dp_bw, dp_lat),
                      all_reduce_time_s(stage_params * gb, n_dp, dp_bw, dp_lat))
    t_gather = np.where(do, all_gather_time_s(stage_params * 2.0, n_dp, dp_bw, dp_lat), 0.0)
    bucket = np.minimum(1.0, np.maximum(BUCKET_PARAMS, 1e6 * n_dp) / stage_params)
    if c.overlap_grad_reduce:
        t_grad = np.maximum(t_grad - bwd_window_s, t_grad * bucket)
    if c.overlap_param_gather:
        t_gather = np.where(do, np.maximum(t_gather - fwd_window_s, t_gather * bucket),
                            t_gather)
    return t_grad + t_gather


def tied_embedding_s(model: ModelSpec, c: Candidates, pp_bw, pp_lat):
    """All-reduce of the tied embedding's gradient between the first and last stage (s);
    0 with untied embeddings or ``pp == 1``."""
    tied = (not model.untie_embeddings_and_output_weights) & (c.pp > 1)
    t = all_reduce_time_s(embedding_parameters(model, c.tp) * grad_bytes(c), 2.0,
                          pp_bw, pp_lat)
    return np.where(tied, t, 0.0)


def optimizer_s(c: Candidates, gpu, stage_params):
    """Adam step over the local shard (s): fp32 master, m, v, grad read; master, m, v
    written; 16-bit copy written (≈ 30 bytes per parameter, sharded over dp·cp with the
    distributed optimizer) plus a gradient-norm pass, at attained HBM bandwidth."""
    eff = gpu.efficiency
    shard = np.where(c.distributed_optimizer, (c.dp * c.cp).astype(float), 1.0)
    opt_bytes = stage_params * (30.0 / shard + grad_bytes(c))
    return opt_bytes / (gpu.hbm_bandwidth_Bps * eff.hbm) + 20 * eff.kernel_overhead_s


def iteration_time(model: ModelSpec, cluster, c: Candidates,
                   comm: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Iteration time (s) and its breakdown (keys :data:`BREAKDOWN_KEYS`) for every plan,
    in closed form: every stage as slow as the slowest, every group as slow as its slowest
    hop (the exact schedule on the placed ranks is :mod:`configurator.cost.placed`).

    ``comm`` defaults to :func:`comm_figures` on ``cluster``. Returns arrays of seconds plus
    ``iteration_time_s``; the breakdown sums to the iteration time.
    """
    gpu = cluster.gpu
    comm = comm_figures(cluster, c) if comm is None else comm
    lc = layer_costs(model, c, gpu)
    pp, vp = (x.astype(float) for x in (c.pp, c.vp))
    m = c.num_microbatches.astype(float)
    act_bytes = 2.0 * lc["tokens"] * model.hidden_size

    tp_f, tp_b = tp_layer_s(lc, c, act_bytes, comm["tp_bw"], comm["tp_lat"])
    tp_layer = tp_f + tp_b
    cp_f, cp_b = cp_layer_s(model, lc, c, comm["cp_bw"], comm["cp_lat"])
    cp_layer = cp_f + cp_b
    x = stage_extras_s(model, c, gpu, lc, comm["tp_bw"], comm["tp_lat"])
    emb = x["emb_fwd"] + x["emb_bwd"]
    logits = x["logits_fwd"] + x["logits_bwd"]

    layers = model.num_layers / pp
    comp_layer = lc["fwd"] + lc["bwd"]
    core = layers * (comp_layer + lc["recompute"] + tp_layer + cp_layer)
    single = pp == 1
    slow_is_last = logits > emb
    extra = np.where(single, emb + logits, np.where(slow_is_last, logits, emb))

    # Bubble: (pp-1)/vp core stage times (SC'21 §2.2) plus the lighter end stage's extra
    # (embedding, or logits and loss), once in 1F1B (the flow-shop makespan
    # sum_s t_s + (m-1)·max_s t_s: every stage but the pacing one adds its time once while
    # the pipeline fills and drains) and pp times when interleaved (the first stage's chunk 0
    # runs the whole first group of pp microbatches forward, and the last group backward,
    # while the pacing last stage waits). Both exact against the simulated schedule
    # (configurator.cost.schedule_sim) for any m, vp and core/extra split, without sends,
    # when the last stage is the heavier end (the logits outweigh the embedding lookup).
    lighter_end = np.where(single, 0.0, np.minimum(emb, logits))
    out = {
        "compute": m * (layers * comp_layer + extra),
        "recompute": m * layers * lc["recompute"],
        "tp_comm": m * layers * tp_layer,
        "cp_comm": m * layers * cp_layer,
        "bubble": bubble_stage_times(pp, vp) * core
        + np.where(vp == 1, 1.0, pp) * lighter_end,
    }
    # Pipeline p2p, each send at the figures of the boundaries it crosses: the fill and
    # drain cross every boundary (1F1B: once each way; interleaved: round the ring, the
    # first microbatch through all pp·vp virtual stages and back); 1F1B's steady state adds
    # one send per microbatch at the pacing end stage's boundary.
    def send_s(kind):
        return p2p_message_s(model, c, lc, comm[f"pp{kind}_bw"], comm[f"pp{kind}_lat"],
                             comm["tp_bw"], comm["tp_lat"])

    t_worst, t_end = send_s(""), send_s("_end")
    fill = p2p_transfers(pp, vp, np.zeros_like(m))
    steady = p2p_transfers(pp, vp, m) - fill
    pp_comm = fill * np.where(vp > 1, send_s("_ring"), send_s("_path")) + steady * t_end
    # 1F1B with pp > 2: a middle stage sends twice per microbatch (at most the slowest
    # boundary's time each), an end stage once but carries its extra; the middle one sets
    # the pace when that is longer
    middle = np.where((vp == 1) & (pp > 2),
                      m * np.maximum(2 * t_worst - t_end - extra, 0.0), 0.0)
    out["pp_comm"] = np.where(pp > 1, pp_comm + middle, 0.0)

    # Data-parallel gradient reduction over the dp·cp group, for the larger end stage.
    stage_params = np.maximum(stage_parameters(model, c.tp, c.pp, 0),
                              stage_parameters(model, c.tp, c.pp, c.pp - 1))
    out["dp_comm"] = dp_exposed_s(
        c, stage_params, comm["dp_bw"], comm["dp_lat"],
        bwd_window_s=layers * (lc["bwd"] + lc["recompute"] + tp_layer),
        fwd_window_s=layers * lc["fwd"]) + tied_embedding_s(model, c, comm["pp_bw"],
                                                             comm["pp_lat"])
    out["optimizer"] = optimizer_s(c, gpu, stage_params)
    out["iteration_time_s"] = sum(out[k] for k in BREAKDOWN_KEYS)
    return out
