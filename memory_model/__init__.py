"""Analytic per-pipeline-stage memory model for Megatron-LM training.

Parameters, gradients and optimizer state (mixed-precision Adam, optionally sharded by the
distributed optimizer), activations (Korthikanti et al. 2022, generalised to GQA, SwiGLU,
context parallelism and flash attention) for the microbatches in flight under 1F1B and
interleaved schedules, plus an allowance for CUDA context, NCCL buffers and fragmentation.
All functions broadcast over numpy arrays of plan fields so the search evaluates millions of
plans at once; :func:`estimate_memory` is the per-plan view.

May import ``configurator.core`` only (microbatches in flight come from its schedule seam).
"""

from memory_model.estimate import MemoryBreakdown, estimate_memory, memory_arrays
from memory_model.params import (dense_layer_parameters, padded_vocab_size, stage_parameters,
                                 total_parameters)

__all__ = ["MemoryBreakdown", "estimate_memory", "memory_arrays", "dense_layer_parameters",
           "padded_vocab_size", "stage_parameters", "total_parameters"]
