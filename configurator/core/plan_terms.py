"""Derived quantities of plan fields, vectorised over candidates.

Each function takes the fields of one plan or the search's candidate columns
(:class:`~configurator.core.plan_batch.PlanBatch`; numpy arrays broadcast) and gives what
the cost and memory models use: the recompute code, whether an overlap or an FP8 weight
gather takes effect, the bytes of a main gradient and of optimizer state per parameter, the
share of routed tokens an expert computes and the load of the busiest expert-parallel rank.
The values named (:data:`RECOMPUTE_CODES`, :data:`DTYPE_BYTES`, ...) are those of
:mod:`configurator.core.plan_values`. Sources: Megatron-LM core_v0.16.1, as each function's
docstring says.
"""

from __future__ import annotations

import numpy as np

from configurator.core.errors import InputError
from configurator.core.plan_values import (DTYPE_BYTES, RECOMPUTE_CODES, RECOMPUTE_CORE_ATTN,
                                           RECOMPUTE_MODULE_BITS, RECOMPUTE_MOE, is_fp8,
                                           recompute_module_list)


def recompute_code(recompute, modules: str):
    """The recompute code of plans (arrays broadcast): 0 none, :data:`RECOMPUTE_FULL` full,
    and for selective the OR of the :data:`RECOMPUTE_MODULE_BITS` of ``modules`` (a bad
    ``modules`` reads as core attention alone; the rules report it). ``recompute``: a
    :data:`RECOMPUTE` name or its :data:`RECOMPUTE_CODES` code (array)."""
    try:
        bits = sum(RECOMPUTE_MODULE_BITS[m] for m in recompute_module_list(modules))
    except InputError:
        bits = RECOMPUTE_CORE_ATTN
    rc = RECOMPUTE_CODES[recompute] if isinstance(recompute, str) else np.asarray(recompute)
    return np.where(rc == RECOMPUTE_CODES["selective"], bits, rc)


def moe_recompute_whole(recompute_code, a2a_overlap):
    """Where selective recompute's ``moe`` module re-runs an MoE layer's whole MLP (router,
    experts and both all-to-alls), per plan (arrays broadcast): the module named in
    ``recompute_code`` (:func:`recompute_code`) and the expert all-to-all overlap off, whose
    schedule calls the layer's pieces itself and does not apply it (megatron-core 0.16.1
    ``MoELayer``; ``combined_1f1b``)."""
    return (((np.asarray(recompute_code) & RECOMPUTE_MOE) != 0)
            & ~np.asarray(a2a_overlap, dtype=bool))


def fp8_weights_gathered(requested, distributed_optimizer, precision: str):
    """Whether the plan's GEMM weights are kept and all-gathered in FP8 only
    (``--fp8-param-gather``): where it was requested, the precision is FP8 and the plan has the
    distributed optimizer (Megatron: "--fp8-param-gather only supported with distributed
    optimizer"). Broadcasts over numpy boolean arrays."""
    return requested & distributed_optimizer & is_fp8(precision)


def main_grad_bytes(precision: str, grad_reduce_in_bf16, main_grads_dtype: str = "fp32"
                    ) -> float:
    """Bytes of one main gradient (Megatron's DDP grad buffer, what the data-parallel
    reduction moves): 4 (FP32, ``accumulate_allreduce_grads_in_fp32``, Megatron's default
    with BF16 parameters), 2 with ``--grad-reduce-in-bf16``, the precision-aware optimizer's
    ``--main-grads-dtype bf16`` (which leaves the FP32 accumulation off) or FP16 parameters
    (megatron/training/arguments.py ``validate_args``)."""
    return 2.0 if (precision == "fp16" or bool(grad_reduce_in_bf16)
                   or main_grads_dtype == "bf16") else 4.0


def capacity_share(c) -> float:
    """Routed token copies an expert computes with the plan's (or candidates') capacity
    factor ``f``, over the dropless count, under balanced routing (the experts' even share
    fills every expert):
    1 dropless; ``min(1, f)`` when tokens beyond ``ceil(T·k/E·f)`` are dropped; ``f`` when
    every expert is padded to that capacity (megatron-core 0.16.1 moe_utils.py
    ``get_capacity``, ``apply_router_token_dropping``; token_dispatcher.py, drop-and-pad)."""
    f = float(c.moe_expert_capacity_factor)
    if f <= 0:
        return 1.0
    return f if c.moe_pad_expert_input_to_capacity else min(1.0, f)


#: How unevenly one micro-batch's routed tokens fall on a model's experts under dropless
#: routing: the coefficient of variation of one expert's share of a micro-batch's tokens
#: (``c``), by how the model's router keeps its experts' loads even (:func:`router_balance`).
#:
#: ``per_batch``: it evens every batch it routes: a loss on each micro-batch (Megatron's
#: ``aux_loss``, computed per micro-batch; ``seq_aux_loss``, per sequence; ``sinkhorn``), or
#: the expert bias of auxiliary-loss-free balancing (``moe_router_enable_expert_bias``),
#: updated from every step's counts, which keeps the batch's busiest expert near the mean
#: throughout training (Wang et al., "Auxiliary-Loss-Free Load Balancing Strategy for
#: Mixture-of-Experts", arXiv:2408.15664, MaxVio_batch). ``global``: a loss over the global
#: batch (``global_aux_loss``) or none evens only the training corpus: the experts
#: specialise by domain (Qiu et al., "Demons in the Detail: On Implementing Load Balancing
#: Loss for Training Specialized Mixture-of-Expert Models", ACL 2025: micro-batch balancing
#: "is almost at the sequence level"; "Global-batch LBL is also used in Qwen3-MoEs"), and on
#: other data some experts stay popular.
#:
#: Measured on twin runs of the Megatron MoE Model Zoo, each plan run from the released
#: checkpoint on the Zoo's data with and without ``--moe-router-force-load-balancing`` (same
#: plan, code and cluster: only the routing differs; ``tests/data/modelzoo_mixtral.csv`` and
#: ``modelzoo_qwen3.csv``): the ``c`` whose predicted extra seconds of the dropless twin are
#: the measured ones (``python -m bench.accuracy.modelzoo``, "twins"). ``per_batch``: Mixtral
#: 8x22B (8 experts, top-2, ep 8; 445 against 465 TFLOP/s per GPU): 0.037, its busiest
#: expert 1.08 times the mean. ``global``: Qwen3-235B-A22B's four long-context twins (128
#: experts, top-8, ep 8; 16k to 128k tokens, 2.8 to 22.2 s more): 1.34, 1.41, 1.43 and 1.39,
#: their median, the busiest rank 1.71 times the mean. The four agree over 16k to 128k
#: tokens and one or two sequences in the exchange: the spread does not average out over a
#: micro-batch's tokens (no token count enters); it is the experts' standing popularity on
#: data other than the training mix, which a long run's global balancing would even out on
#: its own data (the figure is the released checkpoints', as benchmarks run them).
ROUTER_LOAD_CV = {"per_batch": 0.037, "global": 1.40}
#: ``moe_router_load_balancing_type`` values that even each micro-batch (Megatron-LM
#: core_v0.16.1 ``TransformerConfig.moe_router_load_balancing_type``).
PER_BATCH_BALANCING = ("aux_loss", "seq_aux_loss", "sinkhorn")


def router_balance(model) -> str:
    """``"per_batch"`` or ``"global"``: the key of :data:`ROUTER_LOAD_CV` for ``model``'s
    router (``moe_router_load_balancing_type`` and ``moe_router_enable_expert_bias``); an
    expert bias evens every step's batch whatever loss is beside it."""
    if model.moe_router_enable_expert_bias:
        return "per_batch"
    return ("per_batch" if model.moe_router_load_balancing_type in PER_BATCH_BALANCING
            else "global")


def expert_load_imbalance(model, ep, forced=False):
    """Routed token copies the busiest of the ``ep`` expert-parallel ranks receives, over
    the mean (arrays broadcast; 1 for ``ep`` 1, where one rank holds every expert).

    Each rank holds ``E/ep`` of ``model``'s ``E`` experts whose shares of a micro-batch vary
    with spread ``c`` (:data:`ROUTER_LOAD_CV` of :func:`router_balance`), so a rank's share
    varies with ``c·sqrt(ep/E)`` and the largest of ``ep`` of them is ``1 +
    c·sqrt(ep/E)·sqrt(2 ln ep) = 1 + c·sqrt(2·ep·ln(ep)/E)`` (the busiest rank runs the
    expert GEMMs and receives the all-to-all's bytes; the others wait for it), at most what
    a rank can receive: every token once on each of its ``min(k, E/ep)`` experts, ``ep ·
    min(k, E/ep) / k`` times the mean with top-``k`` routing. ``forced``: Megatron's
    ``--moe-router-force-load-balancing`` routes on random scores, every expert its even
    share (the multinomial spread of the random choice, under 2 % at a micro-batch's
    thousands of tokens a rank, is left out): 1."""
    ep = np.asarray(ep, dtype=float)
    E, k = model.num_experts, model.moe_router_topk
    c = ROUTER_LOAD_CV[router_balance(model)]
    spread = 1.0 + c * np.sqrt(2.0 * ep * np.log(np.maximum(ep, 1.0)) / E)
    most = ep * np.minimum(k, E / ep) / k
    return np.where(np.asarray(forced, dtype=bool), 1.0, np.minimum(spread, most))


#: Keys per score row up to which megatron-core's fused scale-mask-softmax runs (the
#: ``local`` backend; megatron-core 0.16.1 fusions/fused_softmax.py ``is_kernel_available``:
#: ``16 < sk <= 4096``) and Transformer Engine's (``unfused``; transformer_engine/pytorch/
#: attention/dot_product_attention/softmax.py: ``16 < sk < 16384``).
SOFTMAX_MAX_KEYS = {"local": 4096, "unfused": 16383}


def softmax_path(c, num_attention_heads: int, s_q, s_k):
    """Per plan of ``c`` (a :class:`~configurator.core.plan_batch.PlanBatch`), the path of
    a score-storing backend's softmax over ``s_q × s_k`` scores per head: ``(fused,
    torch_fp32)`` boolean arrays, neither being PyTorch's softmax in the scores' 16 bits.
    The fused kernel runs where its shape rules hold (the files named at
    :data:`SOFTMAX_MAX_KEYS`): more than 16 and at most the backend's keys per row, a query
    length a multiple of 4, the micro-batch size times the heads per tensor-parallel rank
    (``rows``) a multiple of 4, and the kernel's rows per block (``get_batch_per_block``: 4,
    or 8 up to 128 keys) dividing ``rows`` for ``local`` (with keys a multiple of 4 and
    ``masked_softmax_fusion`` on, Megatron's ``--no-masked-softmax-fusion`` off), the query
    length for Transformer Engine's (with keys a multiple of 8 and, causal, as many queries
    as keys). Elsewhere
    PyTorch's masked fill and softmax run, in FP32 for ``local`` with
    ``attention_softmax_in_fp32`` and always for Transformer Engine's (its default
    ``softmax_in_fp32=True``). Megatron-LM before megatron-core (2021) took at most 2,048
    keys, and scaled and cast to FP32 by default (query-key layer scaling)."""
    local = c.attention_backend == "local"
    s_q, s_k = np.asarray(s_q), np.asarray(s_k)
    rows = np.asarray(c.mbs) * (num_attention_heads // np.asarray(c.tp))
    block = np.where(s_k <= 128, 8, 4)
    shape = ((16 < s_k) & (s_k <= SOFTMAX_MAX_KEYS["local" if local else "unfused"])
             & (s_q % 4 == 0) & (rows % 4 == 0))
    if local:
        fused = shape & (s_k % 4 == 0) & (rows % block == 0) & bool(c.masked_softmax_fusion)
    else:
        fused = shape & (s_k % 8 == 0) & (s_q % block == 0) & (s_q == s_k)
    return fused, ~fused & bool(c.attention_softmax_in_fp32 or not local)


def routed_load_share(c, model):
    """Routed token copies the busiest expert-parallel rank computes with plans ``c`` (or a
    plan) of MoE ``model``, over the balanced dropless count: :func:`expert_load_imbalance`
    ``I`` of the plans' ``ep`` and ``moe_router_force_load_balancing`` under dropless
    routing; ``min(I, f)`` with a capacity factor ``f`` whose excess tokens are dropped (no
    expert takes more than ``f`` times its even share, megatron-core 0.16.1 moe_utils.py
    ``apply_router_token_dropping``); ``f`` when every expert is padded to its capacity.
    With ``I`` = 1 this is :func:`capacity_share`."""
    imbalance = expert_load_imbalance(model, c.ep, c.moe_router_force_load_balancing)
    f = float(c.moe_expert_capacity_factor)
    if f <= 0:
        return imbalance
    if c.moe_pad_expert_input_to_capacity:
        return np.full_like(imbalance, f)
    return np.minimum(imbalance, f)


def optimizer_state_bytes(p) -> float:
    """Optimizer-state bytes per parameter (before the distributed optimizer shards it) of
    plan (or candidates) ``p``: Adam's FP32 master weight and two moments, 12
    (Rajbhandari et al. 2020, ZeRO §3); with the precision-aware optimizer the moments in
    ``exp_avg_dtype``/``exp_avg_sq_dtype`` and the master weight held by Transformer
    Engine's FusedAdam, which keeps only the 16 low bits of an FP32 master beside the BF16
    weight (``store_param_remainders``) or an FP16 one: 2, except for FP8 recipes other than
    delayed scaling with an FP32 master, where megatron-core keeps its own FP32 copy: 4
    (megatron/core/optimizer/optimizer_config.py
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``; distrib_optimizer.py)."""
    if not p.use_precision_aware_optimizer:
        return 12.0
    moments = DTYPE_BYTES[p.exp_avg_dtype] + DTYPE_BYTES[p.exp_avg_sq_dtype]
    own_copy = (p.main_params_dtype == "fp32" and is_fp8(p.precision)
                and (p.precision == "mxfp8" or p.fp8_recipe != "delayed"))
    return moments + (4.0 if own_copy else 2.0)


def tp_comm_overlapped(requested, tp, sequence_parallel, attention_backend: str):
    """Whether the plan's tensor-parallel collectives are overlapped with its GEMMs: only
    where requested, with tp > 1 and sequence parallelism (megatron/training/arguments.py
    ``validate_args``: "Tensor parallel communication/GEMM overlap can happen only when
    sequence parallelism is enabled") and Transformer Engine's layers, whose userbuffers
    run the overlap (not with ``--transformer-impl local``, which the ``local`` attention
    backend selects). Booleans or arrays."""
    return requested & (tp > 1) & sequence_parallel & (attention_backend != "local")


def tp_backward_allreduce_exposed(async_allreduce, tp, sequence_parallel):
    """Whether the backward's tensor-parallel all-reduces of the column-parallel layers'
    input gradients run exposed, after the weight-gradient GEMM rather than under it: only
    with tp > 1, without ``async_tensor_model_parallel_allreduce`` (Megatron-LM before
    NVIDIA/Megatron-LM cf7efd4, 2021-08-30) and without sequence parallelism, which overlaps
    its own reduce-scatter (Megatron turned the flag off with it). Booleans or arrays."""
    return ~np.asarray(async_allreduce, dtype=bool) & (np.asarray(tp) > 1) & ~np.asarray(
        sequence_parallel, dtype=bool)


def param_gather_overlap(requested, distributed_optimizer):
    """Whether the parameter all-gather is overlapped: only where it was requested and the
    plan has the distributed optimizer (Megatron's ``--overlap-param-gather`` needs
    ``--use-distributed-optimizer``). Broadcasts over numpy boolean arrays."""
    return requested & distributed_optimizer
