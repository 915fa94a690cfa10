"""Critical-path model of one Megatron-LM training iteration, vectorised over plans.

Layer compute comes from :mod:`configurator.cost.compute`, group links from
:mod:`configurator.cost.communication`, the expert-parallel exchanges from
:mod:`configurator.cost.expert_comm`, collective formulas from :mod:`topology.collectives`
and pipeline-schedule facts (bubble, p2p count) from :mod:`configurator.core.schedule`.

* tensor parallel: 2 all-reduces forward and 2 backward (all-gather + reduce-scatter pairs
  with sequence parallelism, same bytes) of ``T·h`` 16-bit values (Shoeybi et al. 2019 §3;
  Korthikanti et al. 2022 §4.2.2); forward ones exposed, backward ones hidden under the
  weight-gradient GEMMs as far as those last.
* context parallel: ring exchange of K and V (forward ``cp-1`` steps, backward K, V, dK, dV),
  hidden behind attention compute where it is shorter (Megatron-LM context parallelism,
  ``p2p``); or the exposed K/V all-gather (``all_gather``) or all-to-all of Q, K, V and
  the output (``a2a``): :func:`cp_layer_s`.

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

from configurator.core.plan_batch import PlanBatch
from configurator.core.model import ModelSpec
from configurator.core.plan_values import RECOMPUTE_FULL, RECOMPUTE_MLP, mfu_peak_precision
from configurator.core.plan_terms import tp_backward_allreduce_exposed
from configurator.core.schedule import p2p_transfers
from configurator.core.layers import stage_class_arrays
from configurator.cost.communication import comm_figures, expert_comm_figures
from configurator.cost.compute import EMBEDDING_GRAD_BYTES, layer_costs
from configurator.cost.expert_comm import ep_layer_s
from configurator.cost.gemm import gemm_time_s, main_grad_accumulation_s
from configurator.cost.host_ops import HOST_BACKWARD_FACTOR, optimizer_host_s
from configurator.cost.moe_compute import moe_host_synchronised
from memory_model.params import (embedding_parameters, padded_vocab_size,
                                 stage_parameter_split, stage_parameter_tensors)
from topology.collectives import (all_gather_time_s, all_reduce_time_s, all_to_all_time_s,
                                  p2p_time_s, small_all_reduce_s)

#: The closed form's terms of one iteration (seconds on the pacing rank; they sum to its
#: iteration time), each with what it holds.
BREAKDOWN_TERMS = {
    "compute": "forward and backward of the pacing stage's layers (embedding, logits and "
               "loss where it holds them) over every microbatch",
    "recompute": "forward passes run again in backward by activation recompute",
    "bubble": "pipeline fill and drain: time stages wait for one another",
    "tp_comm": "tensor-parallel collectives not hidden behind compute",
    "cp_comm": "context-parallel K/V exchange not hidden behind attention",
    "ep_comm": "expert-parallel all-to-all (dispatch and combine) not hidden",
    "pp_comm": "pipeline sends and receives between stages not hidden",
    "dp_comm": "data-parallel gradient reduction and parameter gather not hidden",
    "optimizer": "the optimizer step",
}
BREAKDOWN_KEYS = tuple(BREAKDOWN_TERMS)
#: The per-layer terms :func:`layer_type_times` gives (seconds per layer and microbatch),
#: each with the breakdown term (:data:`BREAKDOWN_TERMS`) it is counted in and whether it
#: runs in the backward pass. Both pricings read this table: the closed form
#: (:func:`iteration_time`) sums the terms into its breakdown, the simulated schedule
#: (:class:`configurator.cost.placed.PlacedPlan`) into every chunk's forward and backward
#: (:func:`layer_pass_s`), so a per-layer term added here and to :func:`layer_type_times`
#: reaches both.
LAYER_TERMS = {"fwd": ("compute", False), "bwd": ("compute", True),
               "recompute": ("recompute", True),
               "tp_f": ("tp_comm", False), "tp_b": ("tp_comm", True),
               "cp_f": ("cp_comm", False), "cp_b": ("cp_comm", True),
               "ep_f": ("ep_comm", False), "ep_b": ("ep_comm", True)}
#: Keys :func:`host_bound` adds to a layer's :data:`LAYER_TERMS`: its backward pass (a full
#: recompute's re-run forward, then the backward proper) as host and GPU seconds, the host
#: waits charged to it (all, and the re-run forward's), and the largest lead of the host over
#: the GPU and lag of the GPU behind the host at a boundary between the two
#: (:func:`backward_overlap_s` reads them).
BACKWARD_PASS_KEYS = ("hb_host", "hb_gpu", "hb_wait", "hb_wait_rc", "hb_lead", "hb_lag")
#: Megatron DDP bucket: ``max(40M, 1M·dp)`` parameters (megatron/core/distributed
#: distributed_data_parallel_config.py, ``bucket_size``).
BUCKET_PARAMS = 40_000_000


#: SMs Transformer Engine's userbuffers give the communication of a pipelined or bulk
#: overlap; the GEMM it overlaps runs on the others (``set_sm_margin``). A ring-exchange
#: overlap moves data with copy engines and leaves the GEMM every SM
#: (transformer_engine/pytorch/module/base.py ``initialize_ub``, ``get_default_config``:
#: ``num_sm`` 1 for ``ring_exchange``, else 16).
UB_COMM_SMS = 16


def tp_layer_s(lc: dict, c: PlanBatch, act_bytes, tp_bw, tp_lat, num_sms: int):
    """Exposed tensor-parallel collective time of one layer for one microbatch,
    ``(forward, backward)`` seconds (arrays broadcast over plans and, for a placed plan,
    over its groups' figures).

    Without ``tp_comm_overlap``: 2 forward collectives (+2 in the re-run forward of a full
    recompute), exposed; the 2 backward ones (column-parallel input gradients) run
    asynchronously under the QKV and fc1 weight-gradient GEMMs
    (megatron/core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication),
    exposed only beyond them; without ``async_tensor_model_parallel_allreduce`` and sequence
    parallelism (Megatron-LM before NVIDIA/Megatron-LM cf7efd4, 2021-08-30, "allreduce
    overlap with wgrad gemm": ``ColumnParallelLinear``'s backward all-reduced its input
    gradient on the compute stream, then ran the weight gradient), exposed whole.

    With it (:func:`configurator.core.plan_terms.tp_comm_overlapped`), Transformer Engine's
    userbuffers overlap each all-gather or reduce-scatter (half a collective pair, ``t``)
    with a GEMM ``g`` of the same sublayer (``lc["tp_gemm_pairs"]``: the QKV/fc1 GEMM after
    the all-gather, the projection/fc2 GEMM before the reduce-scatter; backward GEMMs as
    long as forward ones), by the method of its default configuration: ``ring_exchange``
    (the QKV/fc1 forward all-gather, the projection/fc2 input-gradient all-gather) exposes
    ``max(t - g, 0)``; ``pipeline`` (projection/fc2 forward reduce-scatter) and ``bulk``
    (the QKV/fc1 backward all-gather of the input under the input-gradient GEMM and
    reduce-scatter of the input gradient under the weight-gradient GEMM) run the GEMM on
    ``num_sms - UB_COMM_SMS`` SMs and expose ``max(t, g·num_sms/(num_sms - 16)) - g``
    (transformer_engine/pytorch/module/base.py ``initialize_ub``: methods per GEMM)."""
    t_coll = all_reduce_time_s(act_bytes, c.tp.astype(float), tp_bw, tp_lat)
    fwd = 2.0 * t_coll
    weight_grads = sum(g_in for g_in, _ in lc["tp_gemm_pairs"])    # QKV and fc1
    # the forward's collectives again where backward re-runs them: both with full
    # recompute, the MLP's pair with the mlp module
    rerun = np.where(c.recompute == RECOMPUTE_FULL, 2.0,
                     np.where((c.recompute_code & RECOMPUTE_MLP) != 0, 1.0, 0.0))
    exposed = tp_backward_allreduce_exposed(c.async_tensor_model_parallel_allreduce, c.tp,
                                            c.sequence_parallel)
    bwd = rerun * t_coll + np.where(exposed, 2 * t_coll,
                                    np.maximum(2 * t_coll - weight_grads, 0.0))
    on = c.tp_comm_overlap_on
    if not np.any(on):
        return fwd, bwd
    half = t_coll / 2.0
    stretch = num_sms / max(num_sms - UB_COMM_SMS, 1)     # a GPU file may give few SMs

    def ring(g):      # exposed beyond a ring-exchange overlap
        return np.maximum(half - g, 0.0)

    def margin(g):    # a pipelined or bulk overlap: the GEMM on fewer SMs
        return np.maximum(half, stretch * g) - g

    fwd_o = sum(ring(g_in) + margin(g_out) for g_in, g_out in lc["tp_gemm_pairs"])
    bwd_o = sum(ring(g_out) + 2.0 * margin(g_in) for g_in, g_out in lc["tp_gemm_pairs"])
    bwd_o = rerun / 2.0 * fwd_o + bwd_o
    return np.where(on, fwd_o, fwd), np.where(on, bwd_o, bwd)


def cp_layer_s(model: ModelSpec, lc: dict, c: PlanBatch, comm: dict, gpu):
    """Context-parallel cost of one layer for one microbatch, ``(forward, backward)``
    seconds, for the plans' ``cp_comm_type`` (Megatron ``--cp-comm-type``, run by Transformer
    Engine's ``attn_forward_func_with_cp``, transformer_engine/pytorch/attention/
    dot_product_attention/context_parallel.py). ``T`` local tokens, K/V block
    ``B = 2·T·g·d/tp`` 16-bit values. ``comm``: the cp group's figures
    (:func:`configurator.cost.communication.comm_figures`): the ring collective's
    ``cp_bw``/``cp_lat`` (``all_gather``), one send's ``cp_hop_bw``/``cp_hop_lat`` and the
    members per NVLink domain ``cp_on_node`` (``p2p``, ``a2a``), NVLink's
    ``ep_intra_bw``/``ep_intra_lat``.

    ``p2p`` (``AttnFuncWithCPAndKVP2P``): ``cp`` steps, each computing the attention of the
    local queries with one block of keys and values while the next block travels round the
    ring (one send per rank and step, ``batch_isend_irecv``: a single link's rate, NVLink
    or the sender's NIC, never rails added as a ring collective's). Per step:

    * exposed transfer: the block where it takes longer than the step's attention
      (``cp - 1`` transfers; backward also dK, dV: twice the bytes);
    * the step's own kernels (block attention, the softmax-statistics correction; backward
      also the gradient accumulation) at ``kernel_overhead_s`` each;
    * the fp32 correction of the running output and log-sum-exp (forward: read and write the
      ``T·a·d_v/tp`` fp32 output and read the step's 16-bit one; backward: accumulate dQ in
      fp32) at attained HBM bandwidth.

    ``all_gather`` (``AttnFuncWithCPAndKVAllGather``, "KV all-gather between CP ranks is
    exposed"): forward all-gathers K and V (``cp·B`` gathered) before attention; backward
    gathers them again and reduce-scatters dK and dV; one more attention call per pass (two
    local chunks).

    ``a2a`` (``AttnFuncWithCPAndQKVOA2A``, DeepSpeed Ulysses): all-to-all of Q, K, V before
    attention and of the output after it (backward: of dO, then of dQ, dK, dV), each moving
    ``(cp-1)/cp`` of the tensor over the cp group, exposed (the members in the rank's NVLink
    domain over NVLink, the others through its NIC, as
    :func:`topology.collectives.all_to_all_time_s`), plus the head/sequence reordering
    copies around each exchange (read and write) at attained HBM bandwidth.

    0 with cp = 1."""
    eff = gpu.efficiency
    cp = c.cp.astype(float)
    cp_bw, cp_lat = comm["cp_bw"], comm["cp_lat"]
    hop_bw, hop_lat = comm["cp_hop_bw"], comm["cp_hop_lat"]
    T, tp = lc["tokens"], c.tp.astype(float)
    dqk, dv = model.attention_heads_dims
    a = model.num_attention_heads
    kv_step = 2.0 * T * model.attention_kv_heads * (dqk + dv) / tp
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    kind = c.cp_comm_type
    if kind == "all_gather":
        gather = all_gather_time_s(cp * kv_step, cp, cp_bw, cp_lat)
        fwd = gather + eff.kernel_overhead_s
        bwd = 2 * gather + eff.kernel_overhead_s
    elif kind == "a2a":
        q_bytes, o_bytes = 2.0 * T * a * dqk / tp, 2.0 * T * a * dv / tp

        on = comm["cp_on_node"]
        # inside one domain the ring's NVLink figure; across domains NVLink and one NIC
        intra_bw = np.where(on >= cp, cp_bw, comm["ep_intra_bw"])
        intra_lat = np.where(on >= cp, cp_lat, comm["ep_intra_lat"])

        def a2a(size):
            return all_to_all_time_s(size, cp, on, intra_bw, intra_lat, hop_bw, hop_lat)
        moved = a2a(q_bytes + kv_step) + a2a(o_bytes)
        copies = 2 * 2 * (q_bytes + kv_step + o_bytes) / hbm + 4 * eff.kernel_overhead_s
        fwd = bwd = moved + copies
    else:
        step = p2p_time_s(kv_step, hop_bw, hop_lat)
        corr_f = (4 + 4 + 2) * T * a * dv / tp / hbm + 2 * eff.kernel_overhead_s
        corr_b = (4 + 4 + 2) * T * a * dqk / tp / hbm + 3 * eff.kernel_overhead_s
        fwd = (cp - 1) * np.maximum(step - lc["attn_fwd"] / cp, 0.0) + cp * corr_f
        bwd = (cp - 1) * np.maximum(2 * step - lc["attn_bwd"] / cp, 0.0) + cp * corr_b
    return np.where(cp > 1, fwd, 0.0), np.where(cp > 1, bwd, 0.0)


#: HBM bytes per logit element (one token × one vocabulary entry of the rank) of the loss's
#: cross entropy, ``(forward, backward)``, per ``cross_entropy_fusion``:
#: ``none`` (megatron/core/tensor_parallel/cross_entropy.py, eager): BF16 logits to FP32
#: (2+4), max (4), subtract (4+4), exp (4+4), sum (4), divide (4+4); backward: scale the
#: saved softmax by the loss gradient (4+4) and cast it to the logits' BF16 (4+2).
#: ``native`` (megatron/core/fusions/fused_cross_entropy.py, jit-fused): FP32 copy with its
#: max (2+4), subtract-exp-sum (4+4), divide (4+4); backward one pass to BF16 (4+2).
#: ``te`` (transformer_engine/pytorch/triton/cross_entropy.py): online softmax over the BF16
#: logits (2), then the FP32 gradient written in the forward (2+4); backward scales it
#: (4+4) and casts it to BF16 (4+2).
CROSS_ENTROPY_BYTES = {"none": (38.0, 14.0), "native": (22.0, 6.0), "te": (8.0, 14.0)}


def stage_extras_s(model: ModelSpec, c: PlanBatch, gpu, lc: dict, tp_bw, tp_lat):
    """First-stage extras (embedding lookup and its tensor-parallel collective; backward, its
    dense weight gradient added into the main gradient,
    :data:`~configurator.cost.compute.EMBEDDING_GRAD_BYTES`) and last-stage extras (logits
    GEMM forward and 2× backward with its main-gradient accumulation
    (:func:`~configurator.cost.gemm.main_grad_accumulation_s`), the cross entropy's
    memory-bound passes (:data:`CROSS_ENTROPY_BYTES`), and the multi-token-prediction
    modules) for one microbatch: ``{"emb_fwd", "emb_bwd", "logits_fwd", "logits_bwd"}``
    seconds. The logits GEMM runs in 16-bit in every precision: the output layer is
    Megatron's own ``tensor_parallel.ColumnParallelLinear``
    (megatron/core/models/gpt/gpt_model.py), not a Transformer Engine module, so FP8
    autocast leaves it alone (the memory model keeps no FP8 copy of it either,
    :func:`memory_model.params.stage_non_gemm_parameters`)."""
    eff = gpu.efficiency
    T = lc["tokens"]
    h = model.hidden_size
    act_bytes = 2.0 * T * h
    v_pad = padded_vocab_size(model.vocab_size, c.tp)
    hbm = gpu.hbm_bandwidth_Bps * eff.hbm
    kw16 = dict(lc["gemm_kw"], peak=gpu.peak(mfu_peak_precision(c.precision)),
                gemm_eff=eff.gemm, in_bytes=2.0)
    gemm = gemm_time_s(T, v_pad / c.tp, h, **kw16)
    ce_f, ce_b = (b * T * v_pad / c.tp / hbm
                  for b in CROSS_ENTROPY_BYTES[c.cross_entropy_fusion])
    acc = main_grad_accumulation_s(v_pad / c.tp * h, c, gpu, T)    # the output layer's GEMM
    emb_weights = embedding_parameters(model, c.tp)      # word (and learned position) tables
    out = {"emb_fwd": act_bytes / hbm + all_reduce_time_s(act_bytes, c.tp.astype(float),
                                                          tp_bw, tp_lat),
           "emb_bwd": 2 * act_bytes / hbm + EMBEDDING_GRAD_BYTES * emb_weights / hbm
                      + main_grad_accumulation_s(emb_weights, c, gpu),
           "logits_fwd": gemm + ce_f, "logits_bwd": 2 * gemm + ce_b + acc}
    D = model.mtp_num_layers or 0
    if D:
        # multi-token prediction on the last stage (multi_token_prediction.py): per module
        # the 2h -> h projection, one more layer of the last layer's type, its own logits
        # and loss
        moe = model.moe_layer_pattern[-1]
        proj = gemm_time_s(T, h / c.tp, 2 * h, **lc["gemm_kw"])
        out["logits_fwd"] = out["logits_fwd"] + D * (
            proj + (lc["moe_fwd"] if moe else lc["fwd"]) + gemm + ce_f)
        out["logits_bwd"] = out["logits_bwd"] + D * (
            2 * proj + (lc["moe_bwd"] if moe else lc["bwd"]) + 2 * gemm + ce_b + acc
            + main_grad_accumulation_s(h / c.tp * 2 * h, c, gpu, T))
    return out


def p2p_message_s(model: ModelSpec, c: PlanBatch, lc: dict, pp_bw, pp_lat, tp_bw, tp_lat):
    """One pipeline send of a microbatch's activations (or their gradient), seconds:
    ``T·h`` 16-bit values ÷ tp (scatter/gather optimisation, SC'21 §4.1, or the
    sequence-parallel shard), plus the all-gather that rebuilds them without sequence
    parallelism."""
    act_bytes = 2.0 * lc["tokens"] * model.hidden_size
    gather = np.where(c.sequence_parallel, 0.0,
                      all_gather_time_s(act_bytes, c.tp.astype(float), tp_bw, tp_lat))
    return p2p_time_s(act_bytes / c.tp, pp_bw, pp_lat) + gather


def fsdp_unit_comm_s(c: PlanBatch, params, n_ranks, bw, lat):
    """One micro-batch's Megatron FSDP traffic for ``params`` parameters sharded over
    ``n_ranks`` ranks (s): ``(gather_s, scatter_s)``, one all-gather of the 16-bit weights
    (FP8 with the FP8 weight gather) and one reduce-scatter of the main gradients (the
    main-gradient dtype), priced as the all-gather of the same bytes. Shapes broadcast."""
    params = np.maximum(np.asarray(params, dtype=float), 1.0)
    gather = all_gather_time_s(params * np.where(c.fp8_weights_gathered, 1.0, 2.0),
                               n_ranks, bw, lat)
    return gather, all_gather_time_s(params * c.main_grad_bytes, n_ranks, bw, lat)


def dp_exposed_s(c: PlanBatch, stage_params, dp_bw, dp_lat, bwd_window_s, fwd_window_s,
                 group=None, expert=None):
    """Exposed data-parallel time of one pipeline rank per iteration (s): gradient
    all-reduce (reduce-scatter + parameter all-gather with the distributed optimizer) of
    ``stage_params`` parameters over the dp·cp group, the reduction overlapped with the
    last microbatch's backward (``bwd_window_s``) and the gather with the next forward
    (``fwd_window_s``) when the overlap flags are on, never below one bucket's time
    (Megatron DDP bucket ``max(40M, 1M·dp)`` parameters). ``group``: the group size when
    not ``dp·cp``. The gather moves 16-bit weights, FP8 ones with ``fp8_param_gather``.
    ``expert``: ``(expert_params, edp_bw, edp_lat)``, the rank's expert parameters, reduced
    over the expert-data-parallel group ``tp·cp·dp/(ep·etp)`` at that bandwidth and latency
    (None: no experts). Their reduction and gather share the same windows with the dense
    ones: the backward hook of every parameter, expert ones included, marks its gradient
    ready in its bucket group (the dense groups over dp·cp, the expert groups over the
    expert-data-parallel group) and a full group starts its reduction at once under
    ``overlap_grad_reduce``; the forward pre-hook waits for each bucket group's gather,
    expert ones included (megatron-core 0.16.1 distributed_data_parallel.py
    ``_make_backward_post_hook``, ``_make_forward_pre_hook``,
    ``expert_parallel_bucket_groups``). The two groups' times add within a window (they may
    share links), never below the last bucket of each.

    With Megatron FSDP (``megatron_fsdp``, ``optim_grads_params``) every micro-batch
    gathers each unit's weights before its forward and again before its backward and
    reduce-scatters its gradients after it, each overlapped with that micro-batch's pass
    (the windows): ``m·(max(AG − fwd, 0) + max(AG + RS − bwd, 0))``. A unit (a decoder
    layer) gathers its non-expert and its expert weights in the same hook on one gather
    stream and queues both reductions after its backward (megatron_fsdp.py
    ``_pre_forward_param_unshard``, ``_pre_backward_param_unshard``,
    ``_process_post_backward_gradients``; param_and_grad_buffer.py ``AllGatherPipeline``,
    buckets grouped by ``(fsdp_unit_id, is_expert_param)``), so AG and RS add both
    groups' traffic and the expert share overlaps the same windows; see
    :func:`fsdp_unit_comm_s`."""
    n_dp = (c.dp * c.cp).astype(float) if group is None else np.asarray(group, dtype=float)
    stage_params = np.maximum(np.asarray(stage_params, dtype=float), 1.0)
    has_expert = expert is not None
    expert_params, edp_bw, edp_lat = expert if has_expert else (0.0, None, None)
    expert_params = np.asarray(expert_params, dtype=float)
    n_edp = expert_data_parallel_size(c)
    if c.megatron_fsdp:
        gather, scatter = fsdp_unit_comm_s(c, stage_params, n_dp, dp_bw, dp_lat)
        if has_expert:
            ex_gather, ex_scatter = fsdp_unit_comm_s(c, expert_params, n_edp, edp_bw, edp_lat)
            gather = gather + np.where(expert_params > 0, ex_gather, 0.0)
            scatter = scatter + np.where(expert_params > 0, ex_scatter, 0.0)
        return c.num_microbatches * (np.maximum(gather - fwd_window_s, 0.0)
                                     + np.maximum(gather + scatter - bwd_window_s, 0.0))
    do = c.distributed_optimizer
    t_grad, t_gather, last_grad, last_gather = _dp_group_s(c, stage_params, n_dp, dp_bw,
                                                           dp_lat)
    if has_expert:
        e_grad, e_gather, e_last_grad, e_last_gather = _dp_group_s(
            c, np.maximum(expert_params, 1.0), n_edp, edp_bw, edp_lat)
        some = expert_params > 0
        t_grad = t_grad + np.where(some, e_grad, 0.0)
        t_gather = t_gather + np.where(some, e_gather, 0.0)
        last_grad = last_grad + np.where(some, e_last_grad, 0.0)
        last_gather = last_gather + np.where(some, e_last_gather, 0.0)
    if c.overlap_grad_reduce:
        t_grad = np.maximum(chunked_exposed_s(c, t_grad, bwd_window_s), last_grad)
    if c.overlap_param_gather:
        t_gather = np.where(do, np.maximum(chunked_exposed_s(c, t_gather, fwd_window_s),
                                           last_gather), t_gather)
    return t_grad + t_gather


def chunked_exposed_s(c: PlanBatch, total_s, window_s):
    """Exposed part (s) of a rank's data-parallel reduction (or gather) of ``total_s``
    whose one-microbatch window through all the rank's layers is ``window_s``, with the
    rank's layers in ``vp`` model chunks: ``max((T − W)/vp, T − (1 + (vp−1)·pp)·W/vp)``,
    ``T − W`` for ``vp = 1``.

    The interleaved schedule reduces each chunk's gradients as soon as that chunk's last
    backward has run (megatron-core 0.16.1 pipeline_parallel/schedules.py
    ``backward_step_helper_postprocess``: ``grad_sync_func`` of the chunk whose last
    microbatch this was), and the cool-down runs the last ``pp`` microbatches' backward
    chunk by chunk, so chunk ``k`` finishes ``k·pp`` chunk-backward steps (``W/vp`` each)
    before chunk 0; the chunks' reductions (``T/vp`` each, one group, in turn) start under
    their own last backward and the exposure is the chain's overrun, largest for the last
    chunk alone or for all of them. The gathers mirror it: chunk ``k``'s is launched at the
    first forward of chunk ``k − 1`` (``forward_step_helper_preprocess``,
    ``param_sync_func``; chunks 0 and 1 at the start) and the warm-up runs ``pp``
    microbatches' forward per chunk. Broadcasts over plans."""
    vp, pp = c.vp.astype(float), c.pp.astype(float)
    return np.maximum((total_s - window_s) / vp,
                      total_s - (1.0 + (vp - 1.0) * pp) * window_s / vp)


def _dp_group_s(c: PlanBatch, params, n, bw, lat_s):
    """One data-parallel group's gradient reduction and parameter gather (s) of ``params``
    parameters over ``n`` ranks, whole and their last bucket's share: ``(grad, gather,
    last_grad, last_gather)``. One collective per Megatron DDP bucket (``max(40M, 1M·n)``
    parameters): the latency once per bucket, the bytes once in all; the reduction a
    reduce-scatter with the distributed optimizer (else an all-reduce), the gather of
    16-bit weights, FP8 ones with ``fp8_param_gather`` (none without the distributed
    optimizer)."""
    do = c.distributed_optimizer
    bucket = np.minimum(1.0, np.maximum(BUCKET_PARAMS, 1e6 * n) / params)
    lat = lat_s * np.ceil(1.0 / bucket)
    gb = c.main_grad_bytes
    t_grad = np.where(do, all_gather_time_s(params * gb, n, bw, lat),
                      all_reduce_time_s(params * gb, n, bw, lat))
    # --fp8-param-gather gathers FP8 weights (the embedding's 16-bit share is neglected)
    gather_bytes = np.where(c.fp8_weights_gathered, 1.0, 2.0)
    t_gather = np.where(do, all_gather_time_s(params * gather_bytes, n, bw, lat), 0.0)
    return t_grad, t_gather, t_grad * bucket, t_gather * bucket


def tied_embedding_s(model: ModelSpec, c: PlanBatch, pp_bw, pp_lat):
    """All-reduce of the tied embedding's gradient between the first and last stage (s);
    0 with untied embeddings or ``pp == 1``."""
    tied = (not model.untie_embeddings_and_output_weights) & (c.pp > 1)
    t = all_reduce_time_s(embedding_parameters(model, c.tp) * c.main_grad_bytes, 2.0,
                          pp_bw, pp_lat)
    return np.where(tied, t, 0.0)


def optimizer_s(c: PlanBatch, gpu, stage_params, expert_params=0.0, tensors=0.0):
    """Adam step over the local shard (s): master, m, v and the gradient read; master, m, v
    written; 16-bit copy written (the state bytes twice,
    :func:`configurator.core.plan_terms.optimizer_state_bytes`: 12 with FP32 state, and the
    gradient and weight: ≈ 30 bytes per parameter; sharded over dp·cp with the distributed
    optimizer, expert parameters over the expert-data-parallel group) plus a gradient-norm pass, at attained HBM bandwidth,
    plus the host's per-parameter operations on the rank's ``tensors`` parameter tensors,
    which the step's reads of the overflow flag and gradient norm leave exposed
    (:func:`configurator.cost.host_ops.optimizer_host_s`)."""
    eff = gpu.efficiency
    shard = np.where(c.distributed_optimizer, (c.dp * c.cp).astype(float), 1.0)
    eshard = np.where(c.distributed_optimizer, expert_data_parallel_size(c), 1.0)
    step = 2.0 * c.optimizer_bytes_per_parameter + c.main_grad_bytes + 2.0
    opt_bytes = (stage_params * (step / shard + c.main_grad_bytes)
                 + expert_params * (step / eshard + c.main_grad_bytes))
    return (opt_bytes / (gpu.hbm_bandwidth_Bps * eff.hbm) + 20 * eff.kernel_overhead_s
            + optimizer_host_s(tensors, gpu))


def layer_type_times(model: ModelSpec, c: PlanBatch, lc: dict, comm: dict) -> dict:
    """Per-layer times (s, one microbatch) of a dense and of an MoE layer, by term:
    ``{"dense"|"moe": {"fwd", "bwd", "recompute", "tp_f", "tp_b", "cp_f", "cp_b", "ep_f",
    "ep_b"}}``. An MoE layer runs one tensor-parallel collective pair fewer (its routed
    experts exchange tokens over EP instead; a shared expert keeps the pair)."""
    act_bytes = 2.0 * lc["tokens"] * model.hidden_size
    tp_f, tp_b = tp_layer_s(lc, c, act_bytes, comm["tp_bw"], comm["tp_lat"],
                            lc["gemm_kw"]["gpu"].num_sms)
    amax = amax_reduction_s(model, c, comm["gpus_per_node"])
    tp_f, tp_b = tp_f + amax, tp_b + amax
    cp_f, cp_b = cp_layer_s(model, lc, c, comm, lc["gemm_kw"]["gpu"])
    zero = 0.0 * tp_f
    dense = host_bound(c, dict(fwd=lc["fwd"], bwd=lc["bwd"], recompute=lc["recompute"],
                               tp_f=tp_f, tp_b=tp_b, cp_f=cp_f, cp_b=cp_b, ep_f=zero,
                               ep_b=zero), lc["host"], checkpoint=lc["host_checkpoint"],
                       selective=lc["host_selective"])
    if not model.is_moe:
        return {"dense": dense, "moe": dense}
    share = (1.0 + bool(model.moe_shared_expert_intermediate_size)) / 2.0
    ep_f, ep_b = ep_layer_s(model, lc, c, comm)
    moe = host_bound(c, dict(fwd=lc["moe_fwd"], bwd=lc["moe_bwd"],
                             recompute=lc["moe_recompute"], tp_f=share * tp_f,
                             tp_b=share * tp_b, cp_f=cp_f, cp_b=cp_b, ep_f=ep_f, ep_b=ep_b),
                     lc["moe_host"], sync=(lc["moe_host_pre"], lc["moe_fwd"]
                                           - lc["moe_experts_fwd"] + share * tp_f + cp_f)
                     if moe_host_synchronised(c) else None,
                     checkpoint=lc["host_checkpoint"], selective=lc["moe_host_selective"])
    return {"dense": dense, "moe": moe}


def amax_reduction_s(model: ModelSpec, c: PlanBatch, gpus_per_node):
    """Seconds per layer and microbatch pass (forward or backward) of FP8 delayed scaling's
    amax reduction: Transformer Engine all-reduces the amaxes of a whole autocast region, a
    model chunk's layers, once per forward and once per backward (TE 2.10
    ``quantization.py`` ``reduce_and_update_fp8_tensors``) over the tp·dp·cp ranks of the
    stage (megatron-core ``get_amax_reduction_group``); a message of a few kilobytes
    (:func:`topology.collectives.small_all_reduce_s`), spread over the chunk's layers here.
    0 for other recipes (current and block scaling reduce nothing across ranks beyond the
    tensor-parallel collectives they ride on)."""
    if not (c.precision == "fp8" and c.fp8_recipe == "delayed"):
        return 0.0
    ranks = (c.tp * c.dp * c.cp).astype(float)
    layers = model.num_layers / (c.pp * c.vp).astype(float)
    return small_all_reduce_s(ranks, gpus_per_node) / np.maximum(layers, 1.0)


def host_bound(c: PlanBatch, t: dict, host_fwd_s, sync=None, checkpoint=(0.0, 0.0),
               selective=(0.0, 0.0)) -> dict:
    """A layer's times ``t`` with the host's issue time as a floor: where the forward's GPU
    work and communication take less than ``host_fwd_s`` (the backward's less than
    :data:`~configurator.cost.host_ops.HOST_BACKWARD_FACTOR`, 0.87, times it; a full recompute's
    re-run forward less than it) the GPU waits for the host, and the wait is charged to
    compute (:func:`configurator.cost.host_ops.host_layer_s`). ``sync``: ``(host, GPU)``
    seconds of the forward before a synchronisation of the host with the GPU
    (:func:`configurator.cost.moe_compute.moe_host_synchronised`; the attention, router and
    preprocessing, :func:`~configurator.cost.moe_compute.moe_host_before_sync_s`): the two
    parts of the forward cannot overlap one another, so it takes
    ``max(host₁, GPU₁) + max(host₂, GPU₂)``.
    ``checkpoint``: ``(forward, backward)`` host seconds of a full recompute's checkpoint
    around the layer (:func:`configurator.cost.host_ops.checkpoint_host_s`), issued with
    the forward and with the re-run forward in backward. ``selective``: ``(forward,
    backward)`` host seconds of selective recompute
    (:func:`configurator.cost.host_ops.selective_recompute_host_s`): its checkpoints'
    bookkeeping issued with the forward, its modules' re-run with the rest in the backward,
    where they floor the recompute's GPU time as a full recompute's re-run does (the
    modules' re-runs are spread through the backward; they are taken here as one phase
    ahead of it)."""
    ck_f, ck_b = checkpoint
    sel_f, sel_b = selective
    host_layer = host_fwd_s                      # the layer's own operations
    host_fwd_s = host_layer + ck_f + sel_f
    gpu_f = layer_pass_s(t, False)
    gpu_b = layer_pass_s(t, True, without=("recompute",))    # recompute has its own floor
    out = dict(t)
    if sync is None:
        out["fwd"] = t["fwd"] + np.maximum(host_fwd_s - gpu_f, 0.0)
    else:
        host_pre, gpu_pre = sync
        gpu_pre = np.minimum(gpu_pre, gpu_f)
        waits = (np.maximum(host_pre - gpu_pre, 0.0)
                 + np.maximum(host_fwd_s - host_pre - (gpu_f - gpu_pre), 0.0))
        out["fwd"] = t["fwd"] + waits
    host_b = HOST_BACKWARD_FACTOR * host_layer
    host_rc = np.where(c.recompute == RECOMPUTE_FULL, host_layer + ck_b, sel_b)
    out["bwd"] = t["bwd"] + np.maximum(host_b - gpu_b, 0.0)
    out["recompute"] = np.maximum(t["recompute"], host_rc)
    # the backward pass as two phases, the re-run forward then the backward proper, for
    # backward_overlap_s: host and GPU seconds, the waits charged above, and the largest
    # lead of the host over the GPU (lag of the GPU behind it) at a phase boundary
    g_rc, h_all, g_all = t["recompute"], host_rc + host_b, t["recompute"] + gpu_b
    out["hb_host"], out["hb_gpu"] = h_all, g_all
    out["hb_wait_rc"] = out["recompute"] - t["recompute"]
    out["hb_wait"] = out["hb_wait_rc"] + (out["bwd"] - t["bwd"])
    out["hb_lead"] = np.maximum(np.maximum(host_rc - g_rc, h_all - g_all), 0.0)
    out["hb_lag"] = np.maximum(np.maximum(gpu_b - host_b, g_all - h_all), 0.0)
    return out


def backward_overlap_s(types: dict, n_dense, n_moe, logits_s=None) -> tuple:
    """``(compute, recompute)`` seconds by which one microbatch's backward through a rank's
    ``n_dense`` dense and ``n_moe`` MoE layers (arrays broadcast; ``types`` as
    :func:`layer_type_times` returns them) is shorter than the sum of its passes' times,
    where some passes are host-bound and others GPU-bound, and, given ``logits_s`` (GPU
    seconds of the last stage's output layer and loss backward, which the host issues in a
    few operations just before the layers'), a third: the seconds of it that run in the
    GPU's idle time of that backward (at most ``logits_s``). The two parts say which term's
    host waits (:func:`host_bound`'s full recompute floor, its backward floor) shrink.

    Nothing in a microbatch's backward makes the host wait for the GPU: 1F1B synchronises
    around its sends and receives (megatron-core 0.16.1 pipeline_parallel/
    p2p_communication.py ``_communicate``: ``torch.cuda.synchronize()`` after every batched
    exchange, ``batch_p2p_comm`` and ``batch_p2p_sync``, on by default and forced on
    without interleaving; Megatron-LM's 2021 p2p_communication.py synchronises
    unconditionally), the last stage exchanges nothing between a microbatch's forward and
    its backward (``send_forward_recv_backward`` with ``is_last_stage``), and the loss's
    check ends the forward: Megatron-LM's ``loss_func`` (pretrain_gpt.py, with
    ``--check-for-nan-in-loss-and-grad``, on by default) hands the loss to
    ``rerun_state_machine.validate_result``, which tests ``torch.isnan(loss)`` in an ``if``,
    on the host, so the output layer's forward cannot hide under the backward's host time
    and only its backward is ``logits_s``. Within such
    a stretch the host runs ahead of the GPU wherever the GPU is the slower, and the GPU
    catches up where the host is: a flow shop of two machines over the passes in their
    order, whose makespan is the largest, over the boundaries between passes, of the
    host's seconds before the boundary plus the GPU's after it (each pass's operations
    spread evenly over it, so no boundary inside a pass is later). With the layers' re-run
    forward (full recompute) and backward as blocks of equal figures, that is
    ``max(L + G, G + lead, H + lag)``: ``G``, ``H`` the blocks' GPU and host seconds,
    ``lead`` the host's largest excess over the GPU at a boundary inside the first block,
    ``lag`` the GPU's inside the last, ``L`` the logits (:func:`host_bound` gives each
    layer's). Each pass taken on its own, as :func:`host_bound` prices it, costs ``L + G +
    W`` with ``W`` its waits; the difference is at most ``W``. Where every pass is
    host-bound (or every pass GPU-bound) it is nothing but the logits' share of ``W``; it
    is largest where a host-bound re-run forward alternates with a GPU-bound backward: a
    24-layer, hidden-1,024 GPT at micro-batch 4 on A100s (``tests/test_host_local.py``)."""
    d, e = types["dense"], types["moe"]
    tot = layers_terms_s(types, n_dense, n_moe, keys=("hb_gpu", "hb_host", "hb_wait",
                                                      "hb_wait_rc"))

    def largest(key):       # over the layer kinds the rank holds
        if not np.any(n_moe):
            return d[key]
        return np.maximum(np.where(n_dense > 0, d[key], 0.0), np.where(n_moe > 0, e[key], 0.0))

    g, h, w, w_rc = (tot[k] for k in ("hb_gpu", "hb_host", "hb_wait", "hb_wait_rc"))
    layers = np.maximum(g + largest("hb_lead"), h + largest("hb_lag"))
    saved = np.clip(g + w - layers, 0.0, w)        # each candidate is at most g + w
    share_rc = np.divide(w_rc, w, out=np.zeros(np.broadcast(w_rc, w).shape), where=w > 0)
    out = (saved * (1.0 - share_rc), saved * share_rc)
    if logits_s is None:
        return out
    # the logits' backward first: the makespan with it, less the layers' own (clipped: where
    # the layers' makespan hides it whole, the sum and difference of floats can leave a
    # rounding's worth more than logits_s)
    hidden = np.clip(logits_s + layers - np.maximum(logits_s + g, layers), 0.0, logits_s)
    return out + (hidden,)


def expert_data_parallel_size(c: PlanBatch) -> np.ndarray:
    """Each plan's expert-data-parallel group size, ``tp·cp·dp / (ep·etp)`` ranks (float):
    the group expert gradients are reduced over and the distributed optimizer shards expert
    state over (megatron/core/parallel_state.py, the ``etp-ep-edp-pp`` expert grid)."""
    return (c.tp * c.dp * c.cp).astype(float) / (c.ep * c.etp)


def layers_terms_s(types: dict, dense_layers, moe_layers, keys=LAYER_TERMS) -> dict:
    """Each term ``keys`` (default :data:`LAYER_TERMS`; s) of one microbatch through
    ``dense_layers`` dense and ``moe_layers`` MoE layers (arrays broadcast against those of
    ``types``, the output of :func:`layer_type_times`). With no MoE layer at all the dense
    terms alone (the same floats as adding 0·moe)."""
    d, e = types["dense"], types["moe"]
    if not np.any(moe_layers):
        return {k: dense_layers * d[k] for k in keys}
    return {k: dense_layers * d[k] + moe_layers * e[k] for k in keys}


def layer_pass_s(t: dict, backward: bool, without: tuple[str, ...] = ()):
    """One microbatch's forward (``backward`` False) or backward pass (s) through a layer or
    a rank's layers ``t`` (:data:`LAYER_TERMS` keys): the sum of that pass's terms, in the
    table's order, those named in ``without`` left out."""
    keys = [k for k, (_, back) in LAYER_TERMS.items()
            if back == backward and k not in without]
    out = t[keys[0]]
    for k in keys[1:]:
        out = out + t[k]
    return out


def dp_windows_s(t: dict, saved_s=0.0):
    """``(backward, forward)`` windows (s) a rank's data-parallel traffic hides under, from
    one microbatch's terms through its layers ``t`` (:func:`layers_terms_s`): the gradient
    reduction under the last microbatch's backward (its layers' backward, recompute and
    tensor-parallel collectives, less ``saved_s``, what running that backward as one
    stretch of host and GPU work saves on its passes, :func:`backward_overlap_s`: the
    window is the backward's own length), the parameter gather under the next forward
    (:func:`dp_exposed_s`'s ``bwd_window_s`` and ``fwd_window_s``)."""
    return t["bwd"] + t["recompute"] + t["tp_f"] + t["tp_b"] - saved_s, t["fwd"]


def iteration_time(model: ModelSpec, cluster, c: PlanBatch,
                   comm: dict[str, np.ndarray] | None = None,
                   profile=None) -> dict[str, np.ndarray]:
    """Iteration time (s) and its breakdown (keys :data:`BREAKDOWN_KEYS`) for every plan,
    in closed form: every stage as slow as the slowest, every group as slow as its slowest
    hop (the exact schedule on the placed ranks is :mod:`configurator.cost.placed`).

    ``comm`` defaults to :func:`comm_figures` on ``cluster``; ``profile``: measured layer
    times (:class:`configurator.core.profile.LayerProfile` of the model and precision) in
    place of the analytic layer compute, or None. Returns arrays of seconds plus
    ``iteration_time_s``; the breakdown sums to the iteration time.
    """
    gpu = cluster.gpu
    comm = comm_figures(cluster, c) if comm is None else comm
    if "ep_on_node" not in comm:
        comm = dict(comm, **expert_comm_figures(cluster, c))
    lc = layer_costs(model, c, gpu, profile)
    pp, vp = (x.astype(float) for x in (c.pp, c.vp))
    m = c.num_microbatches.astype(float)
    types = layer_type_times(model, c, lc, comm)
    x = stage_extras_s(model, c, gpu, lc, comm["tp_bw"], comm["tp_lat"])
    emb = x["emb_fwd"] + x["emb_bwd"]
    logits = x["logits_fwd"] + x["logits_bwd"]

    # Stage classes (ranks alike in layers, MoE layers and end position) and each class's
    # terms per microbatch; the slowest class sets the pace.
    cls = stage_class_arrays(model, pp=c.pp, vp=c.vp, first=c.first, last=c.last,
                             account_embedding=c.acct_emb, account_loss=c.acct_loss,
                             layout=c.layout)
    n_moe = cls["moe_layers"].astype(float)
    n_dense = cls["layers"] - n_moe

    # each term of one microbatch through each class's layers, [plans, classes]
    per_class = {kind: {k: np.asarray(v)[:, None] for k, v in t.items()}
                 for kind, t in types.items()}
    pc = layers_terms_s(per_class, n_dense, n_moe)

    is_first = cls["stage"] == 0
    is_last = cls["stage"] == c.pp[:, None] - 1
    stage_extra = is_first * emb[:, None] + is_last * logits[:, None]
    terms: dict = {}     # the breakdown's layer terms, in LAYER_TERMS order
    for k, (key, _) in LAYER_TERMS.items():
        terms[key] = pc[k] if key not in terms else terms[key] + pc[k]
    # the backward as one stretch of host and GPU work: what the layers' passes save, and
    # what of the last stage's logits and loss backward runs in the GPU's idle time
    saved_c, saved_rc, logits_hidden = backward_overlap_s(per_class, n_dense, n_moe,
                                                          x["logits_bwd"][:, None])
    stage_extra = stage_extra - is_last * logits_hidden
    terms["compute"] = terms["compute"] + stage_extra - saved_c
    terms["recompute"] = terms["recompute"] - saved_rc
    stage_t = sum(terms.values())
    live = cls["count"] > 0
    pace_k = np.argmax(np.where(live, stage_t, -np.inf), axis=1)[:, None]
    pace = np.take_along_axis(stage_t, pace_k, axis=1)[:, 0]
    total = np.sum(np.where(live, cls["count"] * stage_t, 0.0), axis=1)

    # Bubble (SC'21 §2.2 generalised): 1F1B is the flow-shop makespan
    # sum_s t_s + (m-1)·max_s t_s, so the bubble is every stage but the pacing one once; the
    # interleaved schedule divides the core stages' share by vp and runs the lighter end
    # stage's extra (embedding, or logits and loss) pp times (the first stage's chunk 0 runs
    # the whole first group of pp microbatches while the pacing last stage waits). With an
    # even split this is (pp-1)/vp core stage times plus the lighter end's extra, once for
    # 1F1B and pp times interleaved: exact against the simulated schedule
    # (configurator.cost.schedule_sim) without sends.
    logits = logits - np.max(np.where(is_last, logits_hidden, -np.inf), axis=1)
    lighter_end = np.minimum(emb, logits)     # read where vp > 1, so pp > 1
    others = total - pace
    out = {k: m * np.take_along_axis(v, pace_k, axis=1)[:, 0] for k, v in terms.items()}
    out["bubble"] = np.where(vp == 1, others, (others - lighter_end) / vp + pp * lighter_end)

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
    # boundary's time each), an end stage once but carries its extra (the heavier end's);
    # the middle one sets the pace when that is longer
    middle = np.where((vp == 1) & (pp > 2),
                      m * np.maximum(2 * t_worst - t_end - np.maximum(emb, logits), 0.0), 0.0)
    out["pp_comm"] = np.where(pp > 1, pp_comm + middle, 0.0)

    # Data-parallel gradient reduction: non-expert parameters over the dp·cp group, expert
    # ones over the expert-data-parallel group, for the rank holding the most.
    non_expert, expert = stage_parameter_split(
        model, c.tp[:, None], c.pp[:, None], cls["stage"], layers=cls["layers"],
        moe_layers=cls["moe_layers"], ep=c.ep[:, None], etp=c.etp[:, None])
    big = np.argmax(np.where(live, non_expert + expert, -np.inf), axis=1)[:, None]
    ne_params = np.take_along_axis(np.broadcast_to(non_expert, live.shape), big, axis=1)[:, 0]
    ex_params = np.take_along_axis(np.broadcast_to(expert, live.shape) * 1.0, big, axis=1)[:, 0]

    class PaceTotal(dict):    # a term of the pacing rank's layers, one microbatch, on demand
        def __missing__(self, key):
            return np.take_along_axis(pc[key], pace_k, axis=1)[:, 0]

    pace_saved = np.take_along_axis(np.broadcast_to(saved_c + saved_rc, stage_t.shape),
                                    pace_k, axis=1)[:, 0]
    bwd_window, fwd_window = dp_windows_s(PaceTotal(), pace_saved)
    expert = (ex_params, comm["edp_bw"], comm["edp_lat"]) if model.is_moe else None
    out["dp_comm"] = dp_exposed_s(
        c, ne_params, comm["dp_bw"], comm["dp_lat"], bwd_window_s=bwd_window,
        fwd_window_s=fwd_window, expert=expert) + tied_embedding_s(model, c, comm["pp_bw"],
                                                                   comm["pp_lat"])
    tensors = stage_parameter_tensors(model, c.pp[:, None], cls["stage"], layers=cls["layers"],
                                      moe_layers=cls["moe_layers"], ep=c.ep[:, None])
    big_tensors = np.take_along_axis(np.broadcast_to(tensors, live.shape) * 1.0, big,
                                     axis=1)[:, 0]
    out["optimizer"] = optimizer_s(c, gpu, ne_params, ex_params, big_tensors)
    out["iteration_time_s"] = sum(out[k] for k in BREAKDOWN_KEYS)
    return out
