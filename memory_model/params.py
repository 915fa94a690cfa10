"""Parameter counts per GPU, per pipeline stage (Megatron-LM GPT layer layout).

Layer layout (megatron/core/models/gpt/gpt_layer_specs.py, local and TE specs):
input norm; QKV ColumnParallelLinear ``h → (a + 2g)·d``; output RowParallelLinear
``a·d → h``; pre-MLP norm; fc1 ``h → f`` (``2f`` with SwiGLU); fc2 ``f → h``.
Column-parallel weights and biases are split over tp; row-parallel biases and norms are
replicated. LayerNorm has weight and bias (2h), RMSNorm a weight (h).
Embedding: ``V_pad·h/tp`` (VocabParallelEmbedding) plus ``s·h`` learned positions on the first
stage; the last stage holds the final norm and the output layer ``V_pad·h/tp`` (untied), or,
when tied and pp > 1, a copy of the word embedding (Megatron keeps one on the last stage).
Shared REFERENCE §3 gives the attention ``2h²(1+g/n)`` and MLP ``2·h·ffn`` terms.
"""

from __future__ import annotations

import numpy as np

from configurator.core.model import ModelSpec

#: Megatron's ``--make-vocab-size-divisible-by`` default.
VOCAB_DIVISIBLE_BY = 128


def padded_vocab_size(vocab_size: int, tp):
    """Vocabulary padded to a multiple of ``128·tp`` (megatron/training/tokenizer
    ``_vocab_size_with_padding``). Broadcasts over ``tp``."""
    mult = VOCAB_DIVISIBLE_BY * np.asarray(tp)
    return -(-vocab_size // mult) * mult


def _norm_params(model: ModelSpec) -> int:
    return (2 if model.normalization == "LayerNorm" else 1) * model.hidden_size


def layer_parameters(model: ModelSpec, tp=1):
    """Parameters of one transformer layer held by one tensor-parallel rank (count)."""
    h, a, g, f, d = (model.hidden_size, model.num_attention_heads, model.num_query_groups,
                     model.ffn_hidden_size, model.kv_channels)
    tp = np.asarray(tp, dtype=float)
    fc1_out = f * (2 if model.swiglu else 1)
    qkv_out = (a + 2 * g) * d
    sharded = h * qkv_out + a * d * h + h * fc1_out + f * h
    replicated = 2 * _norm_params(model)
    if model.add_bias_linear:
        sharded = sharded + qkv_out + fc1_out
        replicated = replicated + 2 * h
    return sharded / tp + replicated


def embedding_parameters(model: ModelSpec, tp=1):
    """Word (and learned position) embedding parameters on one tp rank of the first stage."""
    pos = model.seq_length * model.hidden_size if (
        model.position_embedding_type == "learned_absolute") else 0
    return padded_vocab_size(model.vocab_size, tp) * model.hidden_size / np.asarray(tp) + pos


def output_parameters(model: ModelSpec, tp=1, pp=1):
    """Final norm plus output-layer weights on one tp rank of the last stage."""
    out = padded_vocab_size(model.vocab_size, tp) * model.hidden_size / np.asarray(tp)
    has_out = model.untie_embeddings_and_output_weights | (np.asarray(pp) > 1)
    return _norm_params(model) + np.where(has_out, out, 0.0)


def stage_parameters(model: ModelSpec, tp, pp, stage):
    """Parameters held by one GPU of pipeline ``stage`` (0-based; arrays broadcast).

    With the interleaved schedule a rank holds ``vp`` chunks but the same ``L/pp`` layers;
    the embedding sits on rank 0 and the output layer on rank ``pp-1`` either way.
    """
    tp, pp, stage = (np.asarray(x) for x in (tp, pp, stage))
    n = layer_parameters(model, tp) * (model.num_layers / pp)
    n = n + np.where(stage == 0, embedding_parameters(model, tp), 0.0)
    return n + np.where(stage == pp - 1, output_parameters(model, tp, pp), 0.0)


def total_parameters(model: ModelSpec) -> int:
    """All parameters of the model (no padding beyond 128, tied embeddings counted once)."""
    n = (layer_parameters(model, 1) * model.num_layers + embedding_parameters(model, 1)
         + output_parameters(model, 1, 1))
    return int(round(float(n)))
