"""A measured run's iteration time from what was measured (:mod:`configurator.core.runs`).

* ``iteration_time_s`` as given;
* ``tokens_per_s_per_gpu``: ``T = gbs·s / (tokens/s/GPU · GPUs)``;
* ``tflops_per_gpu``: ``T = F / (TFLOP/s · 10¹² · GPUs)`` with ``F`` counted the run's way
  (``flops_formula``): :func:`configurator.cost.flops.megatron_model_flops` (``megatron``;
  ``megatron-full-attention`` counts the attention scores over all ``s²`` pairs) or
  :func:`configurator.cost.flops.sc21_flops` (``sc21``).
"""

from __future__ import annotations

from configurator.core.model import ModelSpec
from configurator.core.runs import MeasuredRun
from configurator.cost.flops import megatron_model_flops, sc21_flops


def counted_flops(model: ModelSpec, run: MeasuredRun) -> float:
    """FLOPs of one iteration of ``run`` as its ``flops_formula`` counts them (FLOP)."""
    gbs = run.plan.global_batch_size
    if run.flops_formula == "sc21":
        return sc21_flops(model, gbs)
    full = run.flops_formula == "megatron-full-attention"
    return megatron_model_flops(model, gbs, tp=run.plan.tp, causal=not full)


def measured_iteration_time_s(model: ModelSpec, run: MeasuredRun) -> float | None:
    """Seconds per iteration the run measured (``model``: the run's model at its sequence
    length), from the first of its time measurements present; None without one."""
    n = run.num_gpus
    if run.iteration_time_s is not None:
        return run.iteration_time_s
    if run.tokens_per_s_per_gpu is not None:
        return run.plan.global_batch_size * model.seq_length / (run.tokens_per_s_per_gpu * n)
    if run.tflops_per_gpu is not None:
        return counted_flops(model, run) / (run.tflops_per_gpu * 1e12 * n)
    return None
