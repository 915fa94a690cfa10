"""Floating-point operations per iteration (what published TFLOP/s figures count).

* :func:`megatron_model_flops`: Megatron-LM ``num_floating_point_operations``
  (megatron/training/training.py, 2025+; causal attention counted at half, GQA, SwiGLU):
  ``12·B·s·L·h²·[(1 + g/a + s/(2h))·(a·d/h) + f·(3/2 if SwiGLU)/h + V/(2·L·h)]``.
  Excludes recompute (model FLOPs, as MFU needs).
* :func:`sc21_flops`: Narayanan et al. SC'21 §5.1 (counts the recompute forward):
  ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))``.
"""

from __future__ import annotations

from configurator.core.model import ModelSpec
from memory_model.params import padded_vocab_size


def megatron_model_flops(model: ModelSpec, global_batch_size: int, seq_length: int | None = None,
                         tp: int = 1) -> float:
    """Model FLOPs of one iteration of ``global_batch_size`` sequences (FLOP)."""
    s = seq_length or model.seq_length
    h, L, a, g = model.hidden_size, model.num_layers, model.num_attention_heads, model.num_query_groups
    q_ratio = model.kv_channels * a / h
    gated = 1.5 if model.swiglu else 1.0
    v = float(padded_vocab_size(model.vocab_size, tp))
    return (12.0 * global_batch_size * s * L * h * h
            * ((1 + g / a + s / (2 * h)) * q_ratio + model.ffn_hidden_size * gated / h
               + v / (2 * L * h)))


def sc21_flops(model: ModelSpec, global_batch_size: int) -> float:
    """FLOPs per iteration as SC'21 Table 1 counts them (full recompute included; FLOP)."""
    s, h, L, V = model.seq_length, model.hidden_size, model.num_layers, model.vocab_size
    return 96.0 * global_batch_size * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
