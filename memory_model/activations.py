"""Activation bytes stored for backward, per transformer layer and per pipeline stage.

Per layer and microbatch, 16-bit activations, following Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198, §4.1
and Table 2), with ``s`` the sequence held by one rank (``seq_length / cp``), ``b`` the
micro-batch size, ``h`` hidden, ``a`` heads, ``g`` query groups, ``f`` FFN size, ``t`` tp:

* replicated over tp (÷t with sequence parallelism): inputs of the two norms (2sbh each), of
  QKV and fc1 (2sbh each), two dropout masks (sbh each, only when ``hidden_dropout > 0``);
  Table 2's ``10·sbh``.
* split over tp: Q (2sbh), K and V (2sbh·g/a each with flash/fused attention, which handle
  GQA natively; 2sbh each with megatron-core's local DotProductAttention, which
  ``repeat_interleave``-s K and V to ``a`` heads before the batched GEMMs), the core-attention
  output (2sbh), fc1 output (2sbf, 4sbf with SwiGLU) and fc2 input (2sbf); Table 2's
  ``24·sbh/t`` for ``f = 4h``, ``g = a``.
* attention scores (score-storing backends, no selective recompute): softmax output
  ``2·a·s²·b``, plus dropout mask ``a·s²·b`` and dropout output ``2·a·s²·b`` when
  ``attention_dropout > 0`` (Table 2's ``5as²b``), ÷t. Flash-style kernels keep only the
  fp32 log-sum-exp, ``4·a·s·b/t``.
* selective recompute drops the score terms (and the expanded K, V); full recompute keeps
  the layer input only (``2sbh``, ÷t with sequence parallelism) and re-materialises one
  layer's activations during its backward.

Stage extras: the first stage keeps the embedding-dropout mask (sbh, ÷t with SP) per
microbatch in flight; the last stage keeps the final-norm input and output-layer input
(2sbh each, ÷t with SP) and the fp32 logits ``4·s·b·V/t`` of one microbatch (Korthikanti
§4.2.2: ``4sbh/t·(1 + V/h)``).

Microbatches in flight on pipeline rank ``r`` (Narayanan et al. SC'21 §2.2; Megatron-LM
megatron/core/pipeline_parallel/schedules.py warm-up counts): 1F1B ``min(pp - r, m)``;
interleaved ``min(m·vp, 2(pp-r-1) + (vp-1)·pp + 1)`` model chunks of ``L/(pp·vp)`` layers.
"""

from __future__ import annotations

import numpy as np

from configurator.model import ModelSpec
from memory_model.params import padded_vocab_size

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}


def layer_activation_bytes(model: ModelSpec, *, mbs, seq, tp, sp, recompute,
                           stores_scores: bool, bytes_per_value: int = 2):
    """Activation bytes one layer stores for one microbatch *without* full recompute.

    ``seq`` is the sequence per rank (``seq_length / cp``); ``recompute`` is the code array
    (0 none, 1 selective; 2 full is treated as 0 here: it is the working set while a layer
    is recomputed). Broadcasts over numpy arrays.
    """
    h, a, g, f = (model.hidden_size, model.num_attention_heads, model.num_query_groups,
                  model.ffn_hidden_size)
    s, b = np.asarray(seq, dtype=float), np.asarray(mbs, dtype=float)
    tp = np.asarray(tp, dtype=float)
    sbh = s * b * h
    rep_div = np.where(sp, tp, 1.0)
    masks = 2 * (model.hidden_dropout > 0)
    replicated = sbh * (8 + masks) / rep_div
    selective = np.asarray(recompute) == 1
    kv_each = np.where(stores_scores & ~selective, 1.0, g / a)
    mlp = 2 * s * b * f * ((2 if model.swiglu else 1) + 1)
    sharded = (2 * sbh * (2 + 2 * kv_each) + mlp) / tp
    if stores_scores:
        per_score = 2 + 3 * (model.attention_dropout > 0)
        scores = np.where(selective, 0.0, per_score * a * s * s * b / tp)
    else:
        scores = 4 * a * s * b / tp  # fp32 log-sum-exp kept by flash attention
    return (replicated + sharded + scores) * (bytes_per_value / 2)


def inflight_layers(num_layers: int, *, pp, vp, num_microbatches, stage):
    """Layer-microbatches whose activations rank ``stage`` holds at its peak (count)."""
    pp, vp, m, r = (np.asarray(x) for x in (pp, vp, num_microbatches, stage))
    plain = np.minimum(pp - r, m) * (num_layers / pp)
    chunks = np.minimum(m * vp, 2 * (pp - r - 1) + (vp - 1) * pp + 1)
    interleaved = chunks * (num_layers / (pp * vp))
    return np.where(vp > 1, interleaved, plain)


def stage_activation_bytes(model: ModelSpec, *, mbs, seq, tp, pp, vp, sp, recompute,
                           num_microbatches, stage, stores_scores: bool):
    """Peak activation bytes on one GPU of pipeline ``stage`` (arrays broadcast)."""
    s, b, tp = (np.asarray(x, dtype=float) for x in (seq, mbs, tp))
    pp, stage = np.asarray(pp), np.asarray(stage)
    rc = np.asarray(recompute)
    h = model.hidden_size
    sbh = s * b * h
    rep_div = np.where(sp, tp, 1.0)
    n = inflight_layers(model.num_layers, pp=pp, vp=vp, num_microbatches=num_microbatches,
                        stage=stage)
    per_layer = layer_activation_bytes(model, mbs=b, seq=s, tp=tp, sp=sp, recompute=rc,
                                       stores_scores=stores_scores)
    full = n * 2 * sbh / rep_div + per_layer  # checkpoints + one layer re-materialised
    act = np.where(rc == 2, full, n * per_layer)
    mb_first = np.minimum(pp - stage, num_microbatches)
    emb_mask = (model.hidden_dropout > 0) * sbh / rep_div * mb_first
    act = act + np.where(stage == 0, emb_mask, 0.0)
    v_pad = padded_vocab_size(model.vocab_size, tp)
    last = 4 * sbh / rep_div + 4 * s * b * v_pad / tp
    return act + np.where(stage == pp - 1, last, 0.0)
