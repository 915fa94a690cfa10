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
                         tp: int = 1, causal: bool = True) -> float:
    """Model FLOPs of one iteration of ``global_batch_size`` sequences (FLOP): Megatron-LM
    core_v0.16.1 ``num_floating_point_operations`` (megatron/training/training.py)::

        F = 6·B·s·[ h·(c·f·N_dense + c·k·f_e·N_moe + c·f_sh·N_moe)
                    + (L + D)·A + D·(3h + 2h²) + h·V·(D + 1) ]

    ``c`` = 3 with SwiGLU else 2; ``N_moe``/``N_dense`` MoE and dense layers (the ``D``
    multi-token-prediction layers take the type of the last decoder layer); attention per
    token ``A = h·(q + 2·kv) + q·s + q·h`` with ``q = d·a``, ``kv = d·g`` (causal scores at
    half), or, with multi-latent attention, ``Q + r_kv·(h + a·(d_qk + d_v) + 1) + h·d_r +
    a·d_v·h + s·a·(d_qk + d_r)/2 + s·a·d_v/2`` with ``Q = h·a·(d_qk + d_r)`` (no
    ``q_lora_rank``) or ``r_q·(h + a·(d_qk + d_r) + 1)``. The router GEMM is not counted.
    Excludes recompute (model FLOPs, as MFU needs). ``causal=False`` counts the attention
    scores over all ``s²`` query-key pairs (the score terms doubled), as Megatron-LM did
    before 2025 and NeMo's ``flops_formulas`` do."""
    s = seq_length or model.seq_length
    sc = 1.0 if causal else 2.0
    h, L, a, g = (model.hidden_size, model.num_layers, model.num_attention_heads,
                  model.num_query_groups)
    c = 3 if model.swiglu else 2
    D = model.mtp_num_layers or 0
    pattern = model.moe_layer_pattern
    n_moe = sum(pattern) + D * pattern[-1]
    n_dense = L - sum(pattern) + D * (1 - pattern[-1])
    if model.multi_latent_attention:
        dqk, dr, dv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        rq, rkv = model.q_lora_rank, model.kv_lora_rank
        q_term = h * a * (dqk + dr) if not rq else rq * (h + a * (dqk + dr) + 1)
        attn = (q_term + rkv * (h + a * (dqk + dv) + 1) + h * dr + a * dv * h
                + sc * (s * a * (dqk + dr) / 2 + s * a * dv / 2))
    else:
        d = model.kv_channels
        q, kv = d * a, d * g
        attn = h * (q + 2 * kv) + sc * q * s + q * h
    mlp = c * model.ffn_hidden_size * n_dense
    if model.is_moe:
        mlp += (c * model.moe_router_topk * model.moe_ffn_hidden_size
                + c * (model.moe_shared_expert_intermediate_size or 0)) * n_moe
    v = float(padded_vocab_size(model.vocab_size, tp))
    return 6.0 * global_batch_size * s * (h * mlp + (L + D) * attn + D * (3 * h + 2 * h * h)
                                          + h * v * (D + 1))


def sc21_flops(model: ModelSpec, global_batch_size: int) -> float:
    """FLOPs per iteration as SC'21 Table 1 counts them (full recompute included; FLOP)."""
    s, h, L, V = model.seq_length, model.hidden_size, model.num_layers, model.vocab_size
    return 96.0 * global_batch_size * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
