"""Derived quantities of plan fields, vectorised over candidates.

Each function takes the fields of one plan or the search's candidate columns
(:class:`~configurator.core.plan_batch.PlanBatch`; numpy arrays broadcast) and gives what
the cost and memory models use: the recompute code, whether an overlap or an FP8 weight
gather takes effect, the bytes of a main gradient and of optimizer state per parameter, the
share of routed tokens an expert computes. The values named (:data:`RECOMPUTE_CODES`,
:data:`DTYPE_BYTES`, ...) are those of :mod:`configurator.core.plan_values`. Sources:
Megatron-LM core_v0.16.1, as each function's docstring says.
"""

from __future__ import annotations

import numpy as np

from configurator.core.errors import InputError
from configurator.core.plan_values import (DTYPE_BYTES, RECOMPUTE_CODES, RECOMPUTE_CORE_ATTN,
                                           RECOMPUTE_MODULE_BITS, is_fp8,
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


def param_gather_overlap(requested, distributed_optimizer):
    """Whether the parameter all-gather is overlapped: only where it was requested and the
    plan has the distributed optimizer (Megatron's ``--overlap-param-gather`` needs
    ``--use-distributed-optimizer``). Broadcasts over numpy boolean arrays."""
    return requested & distributed_optimizer
