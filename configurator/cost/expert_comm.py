"""Expert-parallel communication of one MoE layer for one microbatch, vectorised over plans:
one exchange of the token dispatcher (the dispatch, or the combine: NCCL's all-to-all, or
the de-duplicated two-phase transfers of DeepEP and HybridEP, :func:`a2a_s`) and what of the
four per layer stays exposed, with or without the combined 1F1B schedule that overlaps them
with another microbatch's compute (:func:`ep_layer_s`). The links of the expert-parallel
groups come from :func:`configurator.cost.communication.expert_comm_figures`.
"""

from __future__ import annotations

import numpy as np

from configurator.core.plan_batch import PlanBatch
from configurator.core.model import ModelSpec
from configurator.core.plan_values import RECOMPUTE_FULL, RECOMPUTE_MOE
from topology.collectives import all_gather_time_s, all_to_all_time_s


def distinct_share(num_experts: int, topk: int, groups) -> np.ndarray:
    """Expected share of ``groups`` equal groups of experts (ranks, or NVLink domains) that
    a token routed to ``topk`` of ``num_experts`` experts reaches (uniform routing without
    replacement, as force-balanced routing spreads it): ``1 - C(E - E/G, k) / C(E, k)``."""
    groups = np.asarray(groups, dtype=float)
    miss = np.ones(groups.shape)
    per = num_experts / groups
    for i in range(topk):
        miss = miss * np.clip((num_experts - per - i) / (num_experts - i), 0.0, 1.0)
    return 1.0 - miss


#: How much slower compute runs while communication runs beside it: 18.9 % on average,
#: measured on GPT and Llama training steps on 4 A100/H100 (Lee et al. 2025, "Characterizing
#: Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning",
#: arXiv:2507.03114: SMs and memory bandwidth shared). It covers the SMs the
#: communication kernels hold: NCCL's all-to-all launches one 640-thread block per channel,
#: two per remote node for messages above 128 KiB (NVIDIA/nccl 2.27 src/enqueue.cc,
#: src/graph/paths.cc), 3-6 % of an H100's SMs on 2-4 nodes; DeepEP and HybridEP 20 and 16
#: (Megatron's ``--moe-deepep-num-sms`` and ``--moe-hybridep-num-sms``), 12-15 %.
OVERLAP_COMPUTE_SLOWDOWN = 0.189

#: NVLink peers DeepEP's normal kernels exchange with directly: ``NUM_MAX_NVL_PEERS = 8``
#: (deepseek-ai/DeepEP csrc/kernels/configs.cuh); ranks beyond them, in the same NVLink domain
#: or not, are its "RDMA" ranks, reached through NVSHMEM.
DEEPEP_MAX_NVL_PEERS = 8
#: What DeepEP attains over a multi-node NVLink domain with more than
#: :data:`DEEPEP_MAX_NVL_PEERS` of the group in it, as a share of the domain's attained NVLink
#: bandwidth, ``(dispatch, combine)``: "In the EP32 scenario, the dispatch can only reach about
#: 400 GB/s and the combine can only reach about 190 GB/s algorithm bandwidth with 24 SMs" on
#: GB200 NVL72 (DeepEP PR 218's MNNVL support; Megatron-LM
#: docs/discussions/deepseek-v3-gb200-optimization/deepseek-v3-gb200-optimization.md §2.2.1,
#: commit eb0783b6d3), over the 811 GB/s its NVLink attains (``gb200-nvl72``'s
#: ``intra_node_efficiency``). HybridEP, built for such domains ("fully adapted to the NVL72
#: architecture", §2.5), is priced at the link's rate.
DEEPEP_MNNVL_SHARE = (400.0 / 811.0, 190.0 / 811.0)


def a2a_s(model: ModelSpec, lc: dict, c: PlanBatch, x: dict):
    """One expert-parallel exchange (the dispatch, or the combine) of one MoE layer for one
    microbatch, seconds (arrays broadcast over plans).

    ``alltoall`` (megatron/core/transformer/moe/token_dispatcher.py
    ``MoEAlltoAllTokenDispatcher``): every routed token copy (``k·X·etp``, 16-bit) travels to
    its expert's rank, those of other NVLink domains over the network
    (:func:`topology.collectives.all_to_all_time_s`), plus with ``etp > 1`` the all-gather
    over the ETP group. The exchange lasts until the busiest rank's share has arrived: each
    rank sends ``k·X·etp``, the busiest receives that times
    :func:`configurator.core.plan_terms.routed_load_share` (the routing's load imbalance, or
    the capacity factor's cap or padding) and sends it back in the combine, the count
    ``tokens_routed`` of :func:`configurator.cost.moe_compute.moe_mlp_costs` holds.

    ``flex`` (``MoEFlexTokenDispatcher``: DeepEP's normal kernels, or HybridEP, which first
    send a token over RDMA to the peer GPU of each destination domain and then spread it
    over NVLink, "similar to DeepEP", deepseek-ai/DeepEP hybrid-ep branch,
    docs/Hybrid-EP_Implementation.md): a token crosses the network once per remote domain
    its ``k`` experts lie in and NVLink once per other rank they lie on
    (:func:`distinct_share`; DeepEP tests/test_internode.py counts its RDMA bytes on those
    de-duplicated tokens), the two phases pipelined: ``max(RDMA bytes / network, NVLink
    bytes / NVLink)``. Their published rates match the links' own: DeepEP 43-58 GB/s per
    GPU over 400 Gb/s InfiniBand (EP 16-64) and 153-158 GB/s inside an H800 (its NVLink
    measured at 160), HybridEP 42-58 GB/s per H100 over the network at 32-64 ranks; the
    cluster's link figures are used for both, except DeepEP's NVLink phase where more than
    :data:`DEEPEP_MAX_NVL_PEERS` ranks of the group share an NVLink domain (an NVL72 rack):
    there it runs at :data:`DEEPEP_MNNVL_SHARE` of the link, the mean of the dispatch's and
    the combine's times."""
    h = model.hidden_size
    n = c.ep.astype(float)
    g = np.minimum(np.asarray(x["ep_on_node"], dtype=float), n)
    per_rank = 2.0 * lc["tokens_routed"] / c.etp * h
    nccl = all_to_all_time_s(per_rank, n, g, x["ep_intra_bw"], x["ep_intra_lat"],
                             x["ep_inter_bw"], x["ep_inter_lat"])
    etp_coll = all_gather_time_s(2.0 * lc["tokens_routed"] * h, c.etp.astype(float),
                                 x["etp_bw"], x["etp_lat"])
    if c.moe_token_dispatcher_type != "flex":
        return nccl + etp_coll
    k, E = model.moe_router_topk, model.num_experts
    tokens = lc["tokens_routed"] / k    # the rank's tokens (the busiest rank's share included)
    domains = n / g
    rdma = 2.0 * h * tokens * (domains - 1) * distinct_share(E, k, domains)
    nvl = 2.0 * h * tokens * (n - 1) / n * n * distinct_share(E, k, n)
    lat = np.where(n > g, x["ep_inter_lat"], x["ep_intra_lat"])
    nvl_bw = x["ep_intra_bw"]
    if c.moe_flex_dispatcher_backend == "deepep":
        slow = sum(1.0 / s for s in DEEPEP_MNNVL_SHARE) / len(DEEPEP_MNNVL_SHARE)
        nvl_bw = np.where(g > DEEPEP_MAX_NVL_PEERS, nvl_bw / slow, nvl_bw)
    flex = lat + np.maximum(rdma / x["ep_inter_bw"], nvl / nvl_bw)
    return np.where(n > 1, flex, 0.0) + etp_coll


def overlapped_share(c: PlanBatch) -> np.ndarray:
    """Share of a rank's microbatch passes through a layer that the all-to-all overlap's
    schedule pairs with another's (forward of one beside backward of another): all but the
    first forward and the last backward without pipelining
    (``combined_1f1b_schedule_for_no_pipelining``); in the interleaved schedule all but the
    warm-up passes, ``(pp - r - 1)·2 + (vp - 1)·pp`` plus the one extra microbatch the
    overlap schedules before its 1F1B phase (megatron/core/pipeline_parallel/schedules.py),
    at the middle rank ``r = (pp - 1)/2``."""
    pp, vp = c.pp.astype(float), c.vp.astype(float)
    passes = c.num_microbatches * vp
    warmup = (pp - 1) + (vp - 1) * pp + 1.0     # 1 without pipelining (pp = vp = 1)
    return np.clip((passes - warmup) / np.maximum(passes, 1.0), 0.0, 1.0)


def ep_layer_s(model: ModelSpec, lc: dict, c: PlanBatch, x: dict):
    """Exposed expert-parallel communication of one MoE layer for one microbatch,
    ``(forward, backward)`` seconds: the dispatch and the combine forward, their
    gradients backward (:func:`a2a_s` each), again where backward re-runs the forward (full
    recompute, the ``moe`` module). ``x``:
    :func:`configurator.cost.communication.expert_comm_figures`.

    With ``overlap_moe_expert_parallel_comm`` (Megatron's combined 1F1B,
    megatron/core/models/common/model_chunk_schedule_plan.py: "comm_stream: combine_bwd |
    dispatch_fwd->dispatch_bwd | combine_fwd; comp_stream: attn_fwd | mlp_bwd->mlp_bwd_dw->
    mlp_fwd | attn_bwd"), a paired forward and backward of one layer take
    ``S(C_b, A_f) + S(D_f, M_b) + S(D_b, M_f) + S(C_f, A_b)`` with ``A`` the layer's work
    before dispatch and after combine (attention, router, shared expert), ``M`` the
    experts' (:func:`configurator.cost.moe_compute.moe_mlp_costs` ``experts_fwd``, backward
    twice), and ``S(comm, comp) = max(comm, comp + σ·min(comm, comp))`` (compute slowed by
    :data:`OVERLAP_COMPUTE_SLOWDOWN` while the exchange runs); with
    ``delay_wgrad_compute`` the experts' weight gradients (half their backward) run while
    ``dispatch_bwd`` travels: ``S(D_f, M_b/2) + S(D_b, M_b/2 + M_f)``. What the pair takes
    beyond its compute is exposed, on the passes the schedule pairs
    (:func:`overlapped_share`); the others expose all four exchanges. ``moe`` recompute
    does not apply under the overlap (its schedule calls the pieces itself)."""
    one = a2a_s(model, lc, c, x)
    overlap = np.asarray(c.overlap_moe_expert_parallel_comm, dtype=bool)
    rerun = (c.recompute == RECOMPUTE_FULL) | (((c.recompute_code & RECOMPUTE_MOE) != 0)
                                               & ~overlap)
    plain_f, plain_b = 2 * one, 2 * one + np.where(rerun, 2 * one, 0.0)
    if not np.any(overlap):
        return plain_f, plain_b
    def seg(comm, comp):
        return np.maximum(comm, comp + OVERLAP_COMPUTE_SLOWDOWN * np.minimum(comm, comp))

    m_f = lc["moe_experts_fwd"]
    m_b = 2.0 * m_f
    a_f = np.maximum(lc["moe_fwd"] - m_f, 0.0)
    a_b = np.maximum(lc["moe_bwd"] - m_b, 0.0)
    delay = bool(c.delay_wgrad_compute)
    middle = (seg(one, m_b / 2) + seg(one, m_b / 2 + m_f) if delay
              else seg(one, m_b) + seg(one, m_f))
    pair = seg(one, a_f) + middle + seg(one, a_b)
    exposed_pair = np.maximum(pair - (a_f + a_b + m_f + m_b), 0.0)
    share = overlapped_share(c)
    exposed = share * exposed_pair + (1.0 - share) * 4 * one
    return (np.where(overlap, exposed / 2, plain_f), np.where(overlap, exposed / 2, plain_b))
