"""Exact values of the memory model's formulas and of the placed pricing, the schedule
simulator and the time-to-train model, each derived here by hand from its source (the
tensors and parameters megatron-core 0.16.1's layers hold, the module docstrings' cited
equations), on small inputs chosen so that each term matters (tp > 1 with sequence
parallelism, multi-latent attention with ``q_lora_rank``, MTP with pp 2, MoE with ep and
etp > 1, biases, dropout). ``bench.quality.mutation`` runs this file against every mutant of
``memory_model`` and of ``configurator/cost/{placed,schedule_sim,training_time}.py``: a
wrong operator, constant or dropped term changes a figure below.

The file stays fast (it runs once per mutant); the one check that builds megatron-core's own
layers (:func:`test_parameter_tensor_counts_match_megatron_core_layers`) runs in a
subprocess and is left out of the mutants' runs."""

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from configurator.core.errors import InputError
from configurator.core.model import make_model
from configurator.core.plan import ParallelPlan
from configurator.core.plan_batch import PlanBatch
from configurator.core.plan_terms import moe_recompute_whole
from configurator.core.plan_values import (RECOMPUTE_CORE_ATTN, RECOMPUTE_FULL,
                                           RECOMPUTE_LAYERNORM, RECOMPUTE_MLP, RECOMPUTE_MOE,
                                           RECOMPUTE_MOE_ACT, RECOMPUTE_SHARED_EXPERTS)
from configurator.core.units import GB, US
from configurator.cost import placed as placed_module
from configurator.cost.iteration import iteration_time
from configurator.cost.placed import PlacedPlan, PlacedTime
from configurator.cost import schedule_sim
from configurator.cost.schedule_sim import schedule_order, simulate
from configurator.cost.training_time import (CheckpointSize, TrainingEstimate, TrainingInputs,
                                             best_interval, checkpoint_bytes,
                                             closed_form_holds, estimate_training,
                                             ettr_exact, ettr_monte_carlo, format_tokens,
                                             merged_inputs, objective_key,
                                             training_settings)
from memory_model.activations import (LayerInputs, StagePosition, layer_activation_bytes,
                                      layer_terms, moe_mlp_activation_delta,
                                      moe_mlp_kept_bytes, offloaded_layer_bytes,
                                      recompute_module_bytes, recompute_working_bytes,
                                      stage_activation_phases)
from memory_model.estimate import cp_gather_bytes, estimate_memory
from memory_model.params import (dense_layer_parameters, layer_parameter_tensors,
                                 moe_layer_parameters, mtp_parameters, padded_vocab_size,
                                 stage_non_gemm_parameters, stage_parameter_split,
                                 stage_parameter_tensors, stage_parameters)
from topology.cluster_files import load_cluster
from topology.collectives import p2p_time_s
from topology.topofile import LinkMeasurement, Topology, apply_topology


def v_pad(vocab, tp):
    """Megatron's padded vocabulary: a multiple of 128·tp (``_vocab_size_with_padding``)."""
    return -(-vocab // (128 * tp)) * 128 * tp


# ---------------------------------------------------------------- parameter tensors

#: Small models of each layer kind, by name: (make_model arguments, the named parameters of
#: one decoder layer in megatron-core 0.16.1's local spec, ``get_gpt_layer_local_spec``,
#: as ``TransformerLayer.named_parameters()`` lists them).
_BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
             vocab_size=300, seq_length=32, swiglu=True, add_bias_linear=False)
_MLA = dict(multi_latent_attention=True, kv_lora_rank=16, qk_head_dim=8,
            qk_pos_emb_head_dim=4, v_head_dim=8)
_MOE = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32)
TENSOR_CASES = {
    "gqa-layernorm": (dict(), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_qkv.weight", "pre_mlp_layernorm.weight",
        "pre_mlp_layernorm.bias", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"]),
    "gqa-bias": (dict(add_bias_linear=True), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_proj.bias", "self_attention.linear_qkv.weight",
        "self_attention.linear_qkv.bias", "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
        "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight",
        "mlp.linear_fc2.bias"]),
    "gqa-qkv-bias": (dict(add_qkv_bias=True), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
        "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias", "mlp.linear_fc1.weight",
        "mlp.linear_fc2.weight"]),
    "gqa-qk-layernorm": (dict(qk_layernorm=True), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_qkv.weight", "self_attention.q_layernorm.weight",
        "self_attention.q_layernorm.bias", "self_attention.k_layernorm.weight",
        "self_attention.k_layernorm.bias", "pre_mlp_layernorm.weight",
        "pre_mlp_layernorm.bias", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"]),
    "gqa-rmsnorm-qk-bias": (dict(normalization="RMSNorm", qk_layernorm=True,
                                 add_bias_linear=True), [
        "input_layernorm.weight", "self_attention.linear_proj.weight",
        "self_attention.linear_proj.bias", "self_attention.linear_qkv.weight",
        "self_attention.linear_qkv.bias", "self_attention.q_layernorm.weight",
        "self_attention.k_layernorm.weight", "pre_mlp_layernorm.weight",
        "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight",
        "mlp.linear_fc2.bias"]),
    "mla": (dict(_MLA), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_q_proj.weight", "self_attention.linear_kv_down_proj.weight",
        "self_attention.linear_kv_up_proj.weight", "pre_mlp_layernorm.weight",
        "pre_mlp_layernorm.bias", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"]),
    "mla-q-lora": (dict(_MLA, q_lora_rank=32), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_up_proj.weight",
        "self_attention.linear_kv_down_proj.weight", "self_attention.linear_kv_up_proj.weight",
        "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias", "mlp.linear_fc1.weight",
        "mlp.linear_fc2.weight"]),
    "mla-qk-layernorm": (dict(_MLA, qk_layernorm=True), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_q_proj.weight", "self_attention.linear_kv_down_proj.weight",
        "self_attention.linear_kv_up_proj.weight", "self_attention.kv_layernorm.weight",
        "self_attention.kv_layernorm.bias", "pre_mlp_layernorm.weight",
        "pre_mlp_layernorm.bias", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"]),
    "mla-q-lora-qk-layernorm-bias": (dict(_MLA, q_lora_rank=32, qk_layernorm=True,
                                          add_bias_linear=True), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_proj.bias", "self_attention.linear_q_down_proj.weight",
        "self_attention.linear_q_up_proj.weight", "self_attention.linear_kv_down_proj.weight",
        "self_attention.linear_kv_up_proj.weight", "self_attention.q_layernorm.weight",
        "self_attention.q_layernorm.bias", "self_attention.kv_layernorm.weight",
        "self_attention.kv_layernorm.bias", "pre_mlp_layernorm.weight",
        "pre_mlp_layernorm.bias", "mlp.linear_fc1.weight", "mlp.linear_fc1.bias",
        "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"]),
    "mla-q-lora-qk-rmsnorm": (dict(_MLA, q_lora_rank=32, qk_layernorm=True,
                                   normalization="RMSNorm"), [
        "input_layernorm.weight", "self_attention.linear_proj.weight",
        "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_up_proj.weight",
        "self_attention.linear_kv_down_proj.weight", "self_attention.linear_kv_up_proj.weight",
        "self_attention.q_layernorm.weight", "self_attention.kv_layernorm.weight",
        "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"]),
    "moe": (dict(_MOE), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_qkv.weight", "pre_mlp_layernorm.weight",
        "pre_mlp_layernorm.bias", "mlp.router.weight"] + [
        f"mlp.experts.local_experts.{i}.linear_fc{j}.weight" for i in range(4)
        for j in (1, 2)]),
    "moe-bias": (dict(_MOE, add_bias_linear=True), [
        "input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
        "self_attention.linear_proj.bias", "self_attention.linear_qkv.weight",
        "self_attention.linear_qkv.bias", "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
        "mlp.router.weight", "mlp.router.bias"] + [
        f"mlp.experts.local_experts.{i}.linear_fc{j}.{w}" for i in range(4) for j in (1, 2)
        for w in ("weight", "bias")]),
    "moe-shared-rmsnorm": (dict(_MOE, moe_shared_expert_intermediate_size=32,
                                normalization="RMSNorm"), [
        "input_layernorm.weight", "self_attention.linear_proj.weight",
        "self_attention.linear_qkv.weight", "pre_mlp_layernorm.weight", "mlp.router.weight"] + [
        f"mlp.experts.local_experts.{i}.linear_fc{j}.weight" for i in range(4)
        for j in (1, 2)] + ["mlp.shared_experts.linear_fc1.weight",
                            "mlp.shared_experts.linear_fc2.weight"]),
}


def _layer_model(name):
    return make_model(**(_BASE | TENSOR_CASES[name][0]))


@pytest.mark.parametrize("name", sorted(TENSOR_CASES))
def test_layer_parameter_tensors_count_megatron_core_layers(name):
    """One layer's tensors (ep = 1) are the names megatron-core's layer holds; an MoE
    layer's local experts, two each (fc1, fc2; their biases with ``add_bias_linear``),
    divide over ep."""
    model = _layer_model(name)
    names = TENSOR_CASES[name][1]
    dense, moe = layer_parameter_tensors(model)
    if model.is_moe:
        assert moe == len(names)
        per_expert = 2 * (1 + model.add_bias_linear)
        _, moe_ep2 = layer_parameter_tensors(model, ep=2)
        assert moe_ep2 == len(names) - 2 * per_expert          # 2 of 4 experts left
        # the dense layer of the same model: the MLP instead of router and experts
        mlp = [n for n in names if not n.startswith("mlp.")]
        assert dense == len(mlp) + per_expert
    else:
        assert dense == moe == len(names)


def test_layer_parameter_counts_by_hand():
    """One layer's parameters (h 64, a = g = 4 heads of d 16, SwiGLU f 128, LayerNorm's
    weight and bias 2h), term by term from the named tensors above (megatron-core's
    layer holds these elements: the slow test below checks it)."""
    h, d, f = 64, 16, 128
    attn = 2 * h + h * 12 * d + 4 * d * h                   # input norm, QKV, proj
    mlp = h * 2 * f + f * h
    qk_norms = 2 * (2 * d)                                  # q and k LayerNorm over d
    assert float(dense_layer_parameters(_layer_model("gqa-qk-layernorm"))) == (
        attn + qk_norms + 2 * h + mlp)
    biases = 12 * d + h + 2 * f + h                         # QKV, proj, fc1, fc2
    assert float(dense_layer_parameters(_layer_model("gqa-bias"))) == (
        attn + 2 * h + mlp + biases)
    # MLA: q down h→32, q up 32→4·(8+4), kv down h→16+4, kv up 16→4·(8+8), proj 4·8→h
    # and its bias, q and kv LayerNorms over the latents
    mla = (2 * h + h * 32 + 32 * 4 * 12 + h * 20 + 16 * 4 * 16 + 4 * 8 * h + h
           + 2 * 32 + 2 * 16)
    assert float(dense_layer_parameters(_layer_model("mla-q-lora-qk-layernorm-bias"))) == (
        mla + 2 * h + mlp + 2 * f + h)
    # MoE with biases: router E·h + E, four experts h→2·32, 32→h with biases
    ne, ex = moe_layer_parameters(_layer_model("moe-bias"))
    assert float(ne) == attn + 12 * d + h + 2 * h + 4 * h + 4
    assert float(ex) == 4 * (h * 64 + 64 + 32 * h + h)

def test_stage_parameter_tensors_add_embedding_and_output_layer():
    """Per stage: its layers' tensors; the word and learned position embeddings on the first
    stage; the final norm (weight and bias with LayerNorm) and the output layer (untied, or
    the tied copy with pp > 1) on the last."""
    dense = len(TENSOR_CASES["gqa-bias"][1])        # 12 tensors a layer
    model = make_model(**(_BASE | dict(add_bias_linear=True,
                                       position_embedding_type="learned_absolute")))
    got = stage_parameter_tensors(model, 2, np.arange(2), layers=np.array([3, 1]),
                                  moe_layers=np.array([0, 0]))
    # tied embeddings with pp 2: the last stage keeps a copy of the word embedding
    assert np.asarray(got).tolist() == [3 * dense + 2, 1 * dense + 2 + 1]
    one = stage_parameter_tensors(model, 1, 0, layers=2, moe_layers=0)
    assert float(one) == 2 * dense + 2 + 2                  # tied, pp 1: no output copy
    moe = make_model(**(_BASE | _MOE | dict(normalization="RMSNorm", moe_layer_freq=[0, 1],
                                           position_embedding_type="rope",
                                           untie_embeddings_and_output_weights=True)))
    n_moe = len(TENSOR_CASES["moe"][1]) - 2                 # RMSNorm: two norm biases fewer
    n_dense = 8 - 2
    got = stage_parameter_tensors(moe, 1, 0, layers=2, moe_layers=1, ep=2)
    assert float(got) == n_dense + (n_moe - 4) + 1 + (1 + 1)   # rope: no position table


def test_tied_embeddings_keep_one_copy_per_pipeline_end():
    """Tied input and output embeddings: with pp 1 the one word embedding serves both (the
    stage holds the final norm beside it, no output layer); with pp 2 the last stage keeps
    a copy of it (Megatron's tied copy). Untied: the output layer, as large."""
    model = make_model(**(GQA_DROP | dict(untie_embeddings_and_output_weights=False)))
    h, a, g, d, f, tp = 256, 8, 2, 32, 512, 2
    layer = h + (h * (a + 2 * g) * d + a * d * h) / tp + h + 3 * h * f / tp
    emb = v_pad(1000, tp) * h / tp
    one = stage_parameters(model, tp, 1, 0, layers=4, moe_layers=0)
    assert float(one) == pytest.approx(4 * layer + emb + h, rel=1e-12)
    two = stage_parameters(model, tp, 2, np.arange(2), layers=np.array([2, 2]),
                           moe_layers=np.array([0, 0]))
    assert np.asarray(two) == pytest.approx([2 * layer + emb, 2 * layer + h + emb], rel=1e-12)
    # outside the GEMMs: the embedding first, the final norm and the output layer last (an
    # untied model without MTP keeps no other copy of the embedding there)
    untied = make_model(**GQA_DROP)
    got = stage_non_gemm_parameters(untied, tp, 2, np.arange(2))
    assert np.asarray(got) == pytest.approx([emb, h + emb], rel=1e-12)

def test_padded_vocabulary_of_many_plans_whatever_the_dtype():
    """Padded to a multiple of 128·tp for every tp of a column of plans: an integer column
    (looked up in a table) and a float one (divided) give the same sizes."""
    tp = np.tile([1, 2, 3, 8], 25)
    want = [v_pad(50000, t) for t in tp.tolist()]
    assert np.asarray(padded_vocab_size(50000, tp)).tolist() == want
    assert np.asarray(padded_vocab_size(50000, tp.astype(float))).tolist() == want

# ---------------------------------------------------------------- parameters per stage

#: MoE model with an MTP module: LayerNorm with biases everywhere, GQA, RoPE (MTP needs it).
MOE_MTP = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
               ffn_hidden_size=96, vocab_size=300, seq_length=32, swiglu=False,
               normalization="LayerNorm", add_bias_linear=True,
               position_embedding_type="rope",
               untie_embeddings_and_output_weights=True, num_experts=4, moe_router_topk=2,
               moe_ffn_hidden_size=48, moe_layer_freq=[0, 1], mtp_num_layers=1)


def _moe_mtp_parts(tp, ep, etp):
    """Hand count of :data:`MOE_MTP` per rank: (attention + two norms, dense MLP, router,
    one expert) (megatron/core/models/gpt/gpt_layer_specs.py local spec): LayerNorm 2h; QKV
    h→(a+2g)d with bias split over tp; proj a·d→h split, its bias replicated; MLP h→f, f→h
    (fc1 bias split, fc2 bias replicated); router E×h plus bias E."""
    h, a, g, d, f, fe, E = 64, 4, 2, 16, 96, 48, 4
    attn = 2 * h + (h * (a + 2 * g) * d + (a + 2 * g) * d + a * d * h) / tp + h + 2 * h
    mlp = (h * f + f * h + f) / tp + h
    router = E * h + E
    expert = (h * fe + fe * h + fe) / etp + h
    return attn, mlp, router, expert


@pytest.mark.parametrize("pp", [1, 2])
def test_moe_mtp_stage_parameters_with_biases(pp):
    """Stage totals of a dense+MoE model with one MTP module: the last stage holds the MTP
    module (enorm, hnorm, final norm, the 2h→h projection split over tp, one MoE layer) and,
    with pp > 1, a copy of the word embedding for it; with pp 1 the embedding is the first
    stage's own."""
    tp, ep, etp = 2, 2, 2
    model = make_model(**MOE_MTP)
    attn, mlp, router, expert = _moe_mtp_parts(tp, ep, etp)
    h, V = 64, v_pad(300, tp)
    emb = V * h / tp
    out = 2 * h + V * h / tp
    dense_layer, moe_ne, moe_ex = attn + mlp, attn + router, 4 / ep * expert
    mtp_ne = 3 * 2 * h + 2 * h * h / tp + moe_ne
    split = dict(layers=np.array([2] if pp == 1 else [1, 1]),
                 moe_layers=np.array([1] if pp == 1 else [0, 1]), ep=ep, etp=etp)
    ne, ex = stage_parameter_split(model, tp, pp, np.arange(pp), **split)
    ne, ex = np.broadcast_to(ne, (pp,)), np.broadcast_to(ex, (pp,))
    total = stage_parameters(model, tp, pp, np.arange(pp), **split)
    non_gemm = stage_non_gemm_parameters(model, tp, pp, np.arange(pp))
    if pp == 1:
        want_ne = [dense_layer + moe_ne + emb + out + mtp_ne]
        want_ex = [2 * moe_ex]
        want_non_gemm = [emb + out]
    else:
        want_ne = [dense_layer + emb, moe_ne + out + mtp_ne + emb]   # word emb copy
        want_ex = [0.0, 2 * moe_ex]
        want_non_gemm = [emb, out + emb]
    assert ne == pytest.approx(want_ne, rel=1e-12)
    assert ex == pytest.approx(want_ex, rel=1e-12)
    assert np.broadcast_to(total, (pp,)) == pytest.approx(
        np.add(want_ne, want_ex), rel=1e-12)
    assert np.broadcast_to(non_gemm, (pp,)) == pytest.approx(want_non_gemm, rel=1e-12)



# ---------------------------------------------------------------- activations per layer

#: Dense GQA model with dropout (so the bias-dropout-add masks and the attention dropout
#: count): RMSNorm, SwiGLU, RoPE; a·d = h.
GQA_DROP = dict(num_layers=4, hidden_size=256, num_attention_heads=8, num_query_groups=2,
                kv_channels=32, ffn_hidden_size=512, vocab_size=1000, seq_length=512,
                swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
                untie_embeddings_and_output_weights=True, add_bias_linear=False,
                hidden_dropout=0.1, attention_dropout=0.1)
S, B, TP = 64, 2, 2          # sequence per rank, micro-batch, tp (sequence parallel)
X = S * B                    # tokens of a microbatch


def _gqa_sizes():
    """Per-rank bytes of Q (2X·a·d/t), one of K/V (2X·d·max(g, t)/t) and the QKV output
    M = Q + 2·K (attention.py ``get_query_key_value_tensors``)."""
    h, d, g = 256, 32, 2
    q = 2 * X * h / TP
    kv = 2 * X * d * max(g, TP) / TP
    return q, kv, q + 2 * kv


def test_local_attention_layer_keeps_gqa_q_k_v_and_the_scores():
    """megatron-core's local ``DotProductAttention`` with GQA (module docstring; Korthikanti
    et al. 2022 Table 2 with sequence parallelism): norm inputs 2·2Xh, QKV and fc1 inputs
    2·2Xh, two 1-byte dropout masks, all ÷t; Q and the repeat-interleaved K and V 3·2Xh/t;
    softmax output, dropout mask and output 5·a·s·X/t; proj input 2Xh/t; SwiGLU's input 4Xf
    and fc2's input 2Xf, ÷t."""
    model = make_model(**GQA_DROP)
    h, a, f = 256, 8, 512
    xh = X * h
    want = (xh * (4 + 4 + 2) / TP + 3 * 2 * xh / TP + 5 * a * S * X / TP + 2 * xh / TP
            + 6 * X * f / TP)
    got = layer_activation_bytes(model, mbs=B, seq=S, tp=TP, sp=True, recompute=0,
                                 stores_scores=True)
    assert float(got) == pytest.approx(want, rel=1e-12)
    # without sequence parallelism the replicated terms are whole on every rank
    got = layer_activation_bytes(model, mbs=B, seq=S, tp=TP, sp=False, recompute=0,
                                 stores_scores=True)
    assert float(got) == pytest.approx(want + xh * 10 / TP, rel=1e-12)
    # MHA with RoPE: M (q + 2 kv, all a heads) plus RoPE's new Q and K
    mha = make_model(**(GQA_DROP | dict(num_query_groups=8)))
    want_mha = want - 3 * 2 * xh / TP + (6 + 4) * xh / TP
    got = layer_activation_bytes(mha, mbs=B, seq=S, tp=TP, sp=True, recompute=0,
                                 stores_scores=True)
    assert float(got) == pytest.approx(want_mha, rel=1e-12)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_flash_attention_layer_with_and_without_selective_recompute(precision):
    """A flash-style kernel keeps M and the fp32 log-sum-exp 4·a·X/t; selective recompute
    keeps the handed Q, K, V instead (M, RoPE/GQA's new Q, RoPE's new K). FP8: QKV, fc1 and
    fc2 inputs one byte a value; proj keeps its quantised input and the kernel its 16-bit
    output unless core attention is recomputed."""
    model = make_model(**GQA_DROP)
    h, a, f = 256, 8, 512
    xh = X * h
    q8 = 1.0 if precision == "fp8" else 2.0
    q, kv, qkv = _gqa_sizes()
    base = xh * (4 + 2 * q8 + 2) / TP + X * f * (4 + q8) / TP
    proj = 2 * xh / TP if q8 == 2 else (q8 + 2) * xh / TP
    none = layer_activation_bytes(model, mbs=B, seq=S, tp=TP, sp=True, recompute=0,
                                  stores_scores=False, precision=precision)
    assert float(none) == pytest.approx(base + qkv + 4 * a * X / TP + proj, rel=1e-12)
    sel = layer_activation_bytes(model, mbs=B, seq=S, tp=TP, sp=True,
                                 recompute=RECOMPUTE_CORE_ATTN, stores_scores=False,
                                 precision=precision)
    proj_sel = 2 * xh / TP if q8 == 2 else q8 * xh / TP
    assert float(sel) == pytest.approx(base + qkv + q + kv + proj_sel, rel=1e-12)



def test_layer_inputs_of_a_plan():
    """A plan's layer inputs: the sequence a rank holds is seq_length / cp; the rest as the
    plan sets it (recompute modules as their bits, a local backend keeps the scores, a
    padded capacity factor of 1.5 computes 1.5 copies)."""
    model = make_model(**MOE)
    plan = ParallelPlan(tp=2, pp=1, dp=2, cp=2, ep=2, etp=1, micro_batch_size=2,
                        global_batch_size=8, sequence_parallel=True, recompute="selective",
                        recompute_modules="core_attn,moe_act", attention_backend="local",
                        precision="fp8", moe_expert_capacity_factor=1.5,
                        moe_pad_expert_input_to_capacity=True,
                        overlap_moe_expert_parallel_comm=True, offload_modules="attn_proj")
    x = LayerInputs.of_plans(model, PlanBatch.from_plan(plan))
    assert np.asarray(x.seq).tolist() == [128.0]
    assert np.asarray(x.mbs).tolist() == [2] and np.asarray(x.tp).tolist() == [2]
    assert np.asarray(x.etp).tolist() == [1] and bool(np.asarray(x.sp)[0])
    assert np.asarray(x.recompute).tolist() == [RECOMPUTE_CORE_ATTN | RECOMPUTE_MOE_ACT]
    assert x.precision == "fp8" and x.stores_scores and x.capacity == 1.5
    assert x.offload_modules == "attn_proj"
    # the all-to-all overlap carried, under which the moe recompute module does not apply
    assert not np.asarray(moe_recompute_whole(RECOMPUTE_MOE, x.a2a_overlap)).any()

def test_recompute_working_set_of_one_layer():
    """While a layer is recomputed: full, the whole layer less its input (the checkpoint
    2Xh/t with sequence parallelism); selective with the local backend, the scores again and
    GQA's expanded K and V (2·Q); with a flash kernel, contiguous Q, K, V (M), its output
    2Xh/t and the log-sum-exp."""
    model = make_model(**GQA_DROP)
    h, a, f = 256, 8, 512
    xh = X * h
    q, kv, qkv = _gqa_sizes()
    layer = (xh * 10 / TP + 6 * xh / TP + 5 * a * S * X / TP + 2 * xh / TP + 6 * X * f / TP)
    args = dict(mbs=B, seq=S, tp=TP, sp=True)
    got = recompute_working_bytes(model, **args, recompute=np.array(
        [RECOMPUTE_FULL, RECOMPUTE_CORE_ATTN, 0]), stores_scores=True)
    assert np.asarray(got) == pytest.approx(
        [layer - 2 * xh / TP, 5 * a * S * X / TP + 2 * q, 0.0], rel=1e-12)
    got = recompute_working_bytes(model, **args, recompute=RECOMPUTE_CORE_ATTN,
                                  stores_scores=False)
    assert float(got) == pytest.approx(qkv + 2 * xh / TP + 4 * a * X / TP, rel=1e-12)


#: MoE model: SwiGLU experts and a shared expert, E = 8, top-2, RMSNorm, RoPE.
MOE = dict(num_layers=4, hidden_size=128, num_attention_heads=4, ffn_hidden_size=256,
           vocab_size=1000, seq_length=256, swiglu=True, normalization="RMSNorm",
           position_embedding_type="rope", untie_embeddings_and_output_weights=True,
           add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, num_experts=8,
           moe_router_topk=2, moe_ffn_hidden_size=64, moe_shared_expert_intermediate_size=96)


def _moe_kept(etp, q8=2.0, capacity=1.0):
    """What an MoE layer's MLP keeps per rank (moe_mlp_activation_delta's docstring): X = s·b/t
    tokens routed, R = k·X·etp·capacity copies on the rank's experts; the permuted input
    q8·R·h, SwiGLU's input 4R·fe/etp, fc2's input q8·R·fe/etp, per-copy probabilities 2R;
    router: fp32 scores 4XE, routing map XE and probabilities 2XE, two int64 index arrays
    16Xk, fp32 top-k probabilities 4Xk; the shared expert as a dense MLP, (4 + q8)·s·b·fs/t."""
    h, E, k, fe, fs = 128, 8, 2, 64, 96
    x = S * B / TP
    R = k * x * etp * capacity
    routed = q8 * R * h + (4 + q8) * R * fe / etp + 2 * R + (4 + 1 + 2) * x * E + (16 + 4) * x * k
    return routed + (4 + q8) * S * B * fs / TP


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_moe_mlp_kept_bytes_routed_and_shared(precision):
    model = make_model(**MOE)
    q8 = 1.0 if precision == "fp8" else 2.0
    got = moe_mlp_kept_bytes(model, mbs=B, seq=S, tp=TP, etp=2, precision=precision,
                             capacity=1.5)
    assert float(got) == pytest.approx(_moe_kept(2, q8, 1.5), rel=1e-12)
    # beyond a dense layer's MLP (4 + q8)·X·f/t
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True, etp=2, precision=precision, capacity=1.5)
    delta = moe_mlp_activation_delta(model, x)
    assert float(delta) == pytest.approx(
        _moe_kept(2, q8, 1.5) - (4 + q8) * X * 256 / TP, rel=1e-12)


def test_recompute_modules_drop_their_moe_tensors():
    """Bytes the recompute modules drop from an MoE layer (recompute_module_bytes'
    docstring): ``layernorm`` the pre-MLP norm output q·X·h (X = s·b/t); ``moe_act`` the
    routed experts' fc2 input, 2·R·fe/etp (SwiGLU's input stays, the checkpoint's);
    ``shared_experts`` the shared expert's MLP terms 6·s·b·fs/t; ``moe`` everything the MoE
    MLP keeps; ``mlp`` gives the dense MLP's terms back (an MoE layer does not drop them)."""
    model = make_model(**MOE)
    h, k, fe, fs, f = 128, 2, 64, 96, 256
    etp = 2
    x_tok = S * B / TP
    R = k * x_tok * etp
    dense_mlp = 2 * X * h / TP + 6 * X * f / TP
    cases = {RECOMPUTE_LAYERNORM: 2 * x_tok * h, RECOMPUTE_MOE_ACT: 2 * R * fe / etp,
             RECOMPUTE_SHARED_EXPERTS: 6 * S * B * fs / TP, RECOMPUTE_MOE: _moe_kept(etp),
             RECOMPUTE_MLP: -dense_mlp,
             RECOMPUTE_MOE_ACT | RECOMPUTE_SHARED_EXPERTS: 2 * R * fe / etp + 6 * S * B * fs / TP}
    for code, want in cases.items():
        x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True, etp=etp, recompute=code)
        every, moe = recompute_module_bytes(model, x)
        assert float(moe) == pytest.approx(want, rel=1e-12), code
        assert float(every) == pytest.approx(dense_mlp if code == RECOMPUTE_MLP else 0.0,
                                             rel=1e-12), code
    # a capacity factor scales the routed copies R (drop-and-pad at 1.5: R·1.5) and with
    # them the moe_act bytes
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True, etp=etp, recompute=RECOMPUTE_MOE_ACT,
                    capacity=1.5)
    assert float(recompute_module_bytes(model, x)[1]) == pytest.approx(
        2 * (1.5 * R) * fe / etp, rel=1e-12)
    # under the expert all-to-all overlap the moe module does not apply
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True, etp=etp, recompute=RECOMPUTE_MOE,
                    a2a_overlap=True)
    assert float(recompute_module_bytes(model, x)[1]) == 0.0


def test_offloaded_modules_of_an_moe_layer():
    """Fine-grained offloading (offloaded_layer_bytes' docstring): qkv_linear the norm's
    16-bit input and QKV's input (Xh/t each ×2 bytes with SP), attn_proj 2Xh/t, core_attn M
    and the log-sum-exp; mlp_norm 2Xh/t, expert_fc1 2Rh, moe_act 4R·fe/etp."""
    model = make_model(**MOE)
    h, a, k, fe, d = 128, 4, 2, 64, 32
    etp = 2
    R = k * S * B / TP * etp
    q = 2 * X * h / TP
    qkv = 3 * q
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True, etp=etp,
                    offload_modules="qkv_linear,attn_proj,core_attn,mlp_norm,expert_fc1,moe_act")
    every, moe = offloaded_layer_bytes(model, x)
    assert float(every) == pytest.approx(
        4 * X * h / TP + 2 * X * h / TP + qkv + 4 * a * X / TP, rel=1e-12)
    assert float(moe) == pytest.approx(2 * X * h / TP + 2 * R * h + 4 * R * fe / etp,
                                       rel=1e-12)
    assert d * a == h


# ---------------------------------------------------------------- a stage's two peaks

#: Per-layer terms (bytes) given to stage_activation_phases directly: each distinct, so that
#: every combination below is a sum of named terms.
TERMS = dict(layer=100.0, moe_delta=40.0, ckpt=10.0, emb_mask=3.0, last=1000.0,
             layer_left=30.0, working=50.0, every=7.0, moe=11.0, off_every=20.0, off_moe=8.0)


@pytest.mark.parametrize("case", ["full", "selective-offload-overlap", "modules", "none",
                                  "full-dense", "modules-dense", "modules-offload"])
def test_stage_activation_phases_combine_the_layer_terms(case):
    """A pipeline rank of pp 2 with 2 layers (1 MoE: share 1/2) and 4 microbatches (1F1B:
    min(pp − r, m) in flight, 2·2 = 4 layer-microbatches on rank 0). Forward end: n kept
    layer-microbatches (the checkpoint under full recompute) less the offloaded ones but
    the last, the embedding masks of the microbatches in flight on rank 0, the output-layer
    terms on the last rank. Recompute peak: n − 1 kept, the recomputed layer's left terms
    and working set (plus the MoE delta under full recompute), masks, less what waits on
    the host. Module peak: n − 1 kept, one whole layer, the modules' re-materialised
    bytes."""
    model = make_model(**MOE)
    per_layer = 100 + 40 / 2 * (case not in ("full-dense", "modules-dense"))
    rank_moe = 0 if case.endswith("-dense") else 1
    code, stage, offload, overlap = {
        "full": (RECOMPUTE_FULL, 0, "", False),
        "full-dense": (RECOMPUTE_FULL, 0, "", False),
        "selective-offload-overlap": (RECOMPUTE_CORE_ATTN, 1, "core_attn", True),
        "modules": (RECOMPUTE_LAYERNORM | RECOMPUTE_MOE_ACT, 0, "", False),
        "modules-dense": (RECOMPUTE_LAYERNORM | RECOMPUTE_MOE_ACT, 0, "", False),
        "modules-offload": (RECOMPUTE_LAYERNORM | RECOMPUTE_MOE_ACT, 0, "core_attn", False),
        "none": (0, 1, "", False)}[case]
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True, recompute=code, a2a_overlap=overlap,
                    offload_modules=offload)
    at = StagePosition(pp=2, stage=stage, num_microbatches=4, rank_layers=2,
                       rank_moe_layers=rank_moe)
    fwd, rec = stage_activation_phases(model, x, at, dict(TERMS))
    if case in ("full", "full-dense"):           # n = 4, kept = ckpt, masks of 2 microbatches
        assert float(fwd) == pytest.approx(4 * 10 + 2 * 3)
        working = 50 + (40 if rank_moe else 0)
        assert float(rec) == pytest.approx(3 * 10 + 30 + working + 2 * 3)
    elif case == "selective-offload-overlap":    # rank 1: 1·2 + 1 (overlap's pair) = 3
        on_host = 2 * (20 + 8 / 2)
        assert float(fwd) == pytest.approx(3 * per_layer - on_host + 1000)
        assert float(rec) == pytest.approx(2 * per_layer + 30 + 50 - on_host)
    elif case in ("modules", "modules-dense"):   # a dense rank: no MoE module bytes
        assert float(fwd) == pytest.approx(4 * per_layer + 2 * 3)
        moe = 11 if rank_moe else 0
        assert float(rec) == pytest.approx(3 * per_layer + per_layer + 7 + moe + 2 * 3)
    elif case == "modules-offload":              # n − 1 = 3 layer-microbatches on the host
        on_host = 3 * (20 + 8 / 2)
        assert float(fwd) == pytest.approx(4 * per_layer - on_host + 2 * 3)
        assert float(rec) == pytest.approx(3 * per_layer + per_layer + 7 + 11 + 2 * 3
                                           - on_host)
    else:
        assert float(fwd) == pytest.approx(2 * per_layer + 1000)
        assert float(rec) == 0.0


def test_stage_activation_phases_interleaved_overlap_and_a_one_layer_rank():
    """Interleaved (vp 2) rank 1 of pp 2, 4 microbatches: min(m·vp, 2(pp − r − 1) +
    (vp − 1)·pp + 1) = 3 chunks of 2/2 layers, plus the layer the expert all-to-all
    overlap's pair adds (one layer, here a whole chunk): n = 4. A rank of one MoE layer
    keeps the whole MoE delta per layer (share 1/1)."""
    model = make_model(**MOE)
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True, recompute=RECOMPUTE_CORE_ATTN,
                    a2a_overlap=True)
    at = StagePosition(pp=2, vp=2, stage=1, num_microbatches=4, rank_layers=2,
                       rank_moe_layers=1)
    fwd, rec = stage_activation_phases(model, x, at, dict(TERMS))
    assert (float(fwd), float(rec)) == pytest.approx((4 * 120 + 1000, 3 * 120 + 30 + 50))
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True)
    at = StagePosition(pp=2, stage=0, num_microbatches=4, rank_layers=1, rank_moe_layers=1)
    fwd, rec = stage_activation_phases(model, x, at, dict(TERMS))
    assert (float(fwd), float(rec)) == pytest.approx((2 * 140 + 2 * 3, 0.0))

@pytest.mark.parametrize("pp, vp, stage, rank_layers, chunks", [
    (1, 1, 0, 8, 1),      # no pipelining: one microbatch's 8 layers
    (2, 2, 0, 8, 4),      # interleaved: min(m·vp, 2(pp − r − 1) + (vp − 1)·pp + 1) = 4
])
def test_the_all_to_all_overlap_adds_one_layer_not_a_microbatch(pp, vp, stage, rank_layers,
                                                                chunks):
    """Megatron's combined 1F1B pairs the forward of layer j of one microbatch with the
    backward of layer L − 1 − j of another and releases the backward layer's state after
    each pair (model_chunk_schedule_plan.py ``TransformerModelChunkSchedulePlan.run``), so
    the overlap holds one layer more than the plain schedule's peak, not a second
    microbatch (or model chunk) of layers: without pipelining L + 1 layers, not 2L."""
    model = make_model(**MOE)
    plain = LayerInputs(seq=S, mbs=B, tp=TP, sp=True)
    at = StagePosition(pp=pp, vp=vp, stage=stage, num_microbatches=2, rank_layers=rank_layers,
                       rank_moe_layers=rank_layers)
    t = dict(TERMS, last=0.0, emb_mask=0.0)
    per_layer = 100.0 + 40.0
    base, _ = stage_activation_phases(model, plain, at, t)
    over, _ = stage_activation_phases(model, plain.replace(a2a_overlap=True), at, t)
    assert float(base) == pytest.approx(chunks * rank_layers / vp * per_layer)
    assert float(over) - float(base) == pytest.approx(per_layer)


def test_the_all_to_all_overlap_adds_a_chunks_mean_layers_where_under_one():
    """The overlap's extra layer is one of a model chunk's layers: where a rank's chunks
    hold fewer than one layer each on average (a pipeline layout's empty or embedding-only
    chunks: here 2 layers over vp 4 chunks), it adds that mean, half a layer, not a whole
    one (``min(rank_layers / vp, 1)``)."""
    model = make_model(**MOE)
    plain = LayerInputs(seq=S, mbs=B, tp=TP, sp=True)
    at = StagePosition(pp=2, vp=4, stage=0, num_microbatches=4, rank_layers=2,
                       rank_moe_layers=2)
    t = dict(TERMS, last=0.0, emb_mask=0.0)
    base, _ = stage_activation_phases(model, plain, at, t)
    over, _ = stage_activation_phases(model, plain.replace(a2a_overlap=True), at, t)
    assert float(over) - float(base) == pytest.approx(0.5 * (100.0 + 40.0))


def test_a_rank_without_its_layer_counts_holds_an_even_split():
    """StagePosition without ``rank_layers`` and ``rank_moe_layers`` is the even split of
    the model's decoder and MoE layers over pp (its docstring): the same phases as those
    counts given, L/pp and L_moe/pp (the MoE share of the rank's layers priced with them)."""
    model = make_model(**MOE)
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True)
    t = dict(TERMS)
    for pp, stage in ((2, 0), (2, 1), (4, 2)):
        even = StagePosition(pp=pp, stage=stage, num_microbatches=8)
        given = StagePosition(pp=pp, stage=stage, num_microbatches=8,
                              rank_layers=model.num_layers / pp,
                              rank_moe_layers=model.num_moe_layers / pp)
        assert [float(v) for v in stage_activation_phases(model, x, even, t)] == pytest.approx(
            [float(v) for v in stage_activation_phases(model, x, given, t)])


def test_layer_terms_of_the_first_and_last_stage_and_the_recomputed_layer():
    """layer_terms (activations module docstring, "Stage extras"): the embedding-dropout
    mask Xh/t with SP; the last stage's final-norm and output-layer inputs 2·2Xh/t and the
    fp32 cross-entropy softmax 4·X·V/t; the checkpoint 2Xh/t; what a selectively recomputed
    layer keeps of itself: norm input 2Xh/t, QKV input 2Xh/t and the handed Q, K, V."""
    model = make_model(**GQA_DROP)
    h = 256
    xh = X * h
    q, kv, qkv = _gqa_sizes()
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True, recompute=RECOMPUTE_CORE_ATTN)
    t = layer_terms(model, x)
    assert float(t["emb_mask"]) == pytest.approx(xh / TP)
    assert float(t["last"]) == pytest.approx(4 * xh / TP + 4 * X * v_pad(1000, TP) / TP)
    assert float(t["ckpt"]) == pytest.approx(2 * xh / TP)
    assert float(t["layer_left"]) == pytest.approx(4 * xh / TP + qkv + q + kv)
    full = layer_terms(model, x.replace(recompute=RECOMPUTE_FULL))
    assert float(full["layer_left"]) == pytest.approx(2 * xh / TP)



# ---------------------------------------------------------------- a plan on placed ranks

#: Small dense model for the placed pricing: h = 256, 8 layers, sequence 512.
PLACED_MODEL = dict(num_layers=8, hidden_size=256, num_attention_heads=8, ffn_hidden_size=512,
                    vocab_size=1000, seq_length=512, swiglu=True, normalization="RMSNorm",
                    position_embedding_type="rope", untie_embeddings_and_output_weights=True,
                    add_bias_linear=False)


def _host_link(src, dst, bw_GBps, lat_us, **kw):
    return LinkMeasurement(src=src, dst=dst, src_gpu=None, dst_gpu=None,
                           bandwidth_Bps=bw_GBps * GB, latency_s=lat_us * US,
                           link_class="network", message_bytes=1 << 30,
                           method="nccl-tests sendrecv_perf", timestamp=None, gpus_per_host=1,
                           rails_used=1, **kw)


def _placed_case(kind):
    """(cluster, plan): ``uniform``: the preset's two 8-GPU hosts, tp 2 · dp 2 · pp 4, so
    stages 0→1 and 2→3 send inside a host, 1→2 and 3→0 between hosts; ``measured``: four
    hosts measured host to host, each direction of each ring neighbour at its own rate, tp 8
    · pp 4 (one stage a host); ``measured-gpu``: the same plus one GPU pair's NVLink
    measured inside host 1 (the link table is then no longer host-level)."""
    if kind == "uniform":
        return load_cluster("dgx-h100-80gb", 2), dict(tp=2, dp=2, pp=4)
    hosts = ("h0", "h1", "h2", "h3")
    links = [_host_link(hosts[i], hosts[(i + 1) % 4], 10.0 * (i + 1), 5.0 + i)
             for i in range(4)]
    links += [_host_link(hosts[(i + 1) % 4], hosts[i], 7.0 * (i + 1), 9.0 - i)
              for i in range(4)]
    if kind == "measured-gpu":
        links.append(LinkMeasurement(src="h1", dst="h1", src_gpu=2, dst_gpu=5,
                                     bandwidth_Bps=150 * GB, latency_s=None,
                                     link_class="nvlink", message_bytes=1 << 30,
                                     method="nccl-tests sendrecv_perf", timestamp=None,
                                     gpus_per_host=1, rails_used=1))
    topo = Topology(hosts=hosts, gpus_per_host=8, links=tuple(links))
    return apply_topology(load_cluster("dgx-h100-80gb", 4), topo), dict(tp=8, dp=1, pp=4)


def _placed_plan(kind, vp=1, mbs=1):
    cluster, par = _placed_case(kind)
    plan = ParallelPlan(**par, vp=vp, micro_batch_size=mbs, global_batch_size=8 * par["dp"],
                        recompute="none", sequence_parallel=True, distributed_optimizer=True,
                        overlap_grad_reduce=False, overlap_param_gather=False)
    placed = PlacedPlan(make_model(**PLACED_MODEL), cluster, PlanBatch.from_plan(plan))
    return placed, cluster, par


def test_placed_ranks_run_on_the_gpus_their_placement_names():
    """Megatron's sequential mapping puts global rank r (tp fastest, then cp, dp, pp) on GPU
    r; a placement that reverses the node ranks' hosts and each node's GPU order puts local
    rank k of node rank n on GPU G−1−k of host N−1−n."""
    placed, cluster, par = _placed_plan("uniform")       # tp 2 · dp 2 · pp 4 on 2 hosts
    G, N = cluster.gpus_per_node, placed.num_nodes
    ranks = np.arange(par["tp"] * par["dp"] * par["pp"]).reshape(par["pp"], par["dp"], 1,
                                                                  par["tp"])
    hosts, order = placed.default_placement()
    assert N > 1 and np.array_equal(placed.rank_gpus(hosts, order), ranks)
    node, local = np.divmod(ranks, G)
    assert np.array_equal(placed.rank_gpus(hosts[::-1], order[:, ::-1]),
                          (N - 1 - node) * G + (G - 1 - local))


@pytest.mark.parametrize("kind", ["uniform", "measured", "measured-gpu"])
def test_placed_pipeline_sends_use_their_own_links(kind):
    """Each replica's send s → s+1 (index s; the wrap pp−1 → 0 included) moves a
    microbatch's activations, T·h 16-bit values ÷ tp (sequence parallel), over its tp·cp
    pairs at once: the least bandwidth and the most latency of those pairs' links, looked
    up here pair by pair in the cluster's link table; backward sends go the other way."""
    placed, cluster, par = _placed_plan(kind)
    tp, dp, pp = par["tp"], par["dp"], par["pp"]
    gpus = placed.rank_gpus(*placed.default_placement())       # [pp, dp, cp, tp]
    t = placed.terms(gpus)
    table = cluster.link_table()
    size = 2.0 * 512 * 256 / tp
    want_f, want_b = np.zeros((dp, pp)), np.zeros((dp, pp))
    for d in range(dp):
        for st in range(pp):
            a, b = gpus[st, d].reshape(-1), gpus[(st + 1) % pp, d].reshape(-1)
            bw, lat = table.links(a, b)
            want_f[d, st] = p2p_time_s(size, np.min(bw), np.max(lat))
            bw, lat = table.links(b, a)
            want_b[d, st] = p2p_time_s(size, np.min(bw), np.max(lat))
    assert t["p2p_f"] == pytest.approx(want_f, rel=1e-12)
    assert t["p2p_b"] == pytest.approx(want_b, rel=1e-12)
    # the boundaries differ (inside a host or not; each measured pair at its own rate)
    assert len(set(want_f[0].round(12))) > 1


def test_placed_1f1b_senders_are_busy_for_their_sends():
    """1F1B (vp 1): Megatron batches each send with the next receive and waits, so a send
    adds to its sender's chunk (forward sends to ranks 0..pp−2, backward sends to ranks
    1..pp−1) and no send is left to overlap; the iteration is that schedule's makespan
    plus the optimizer step."""
    placed, _, par = _placed_plan("uniform")
    pp = par["pp"]
    gpus = placed.rank_gpus(*placed.default_placement())
    t = placed.terms(gpus)
    timed = placed.time(*placed.default_placement())
    fwd, bwd = t["fwd"].copy(), t["bwd"].copy()
    fwd[:, :pp - 1, 0] += t["p2p_f"][:, :pp - 1]
    bwd[:, 1:, 0] += t["p2p_b"][:, :pp - 1]
    assert np.array_equal(timed.stage_fwd_s, fwd) and np.array_equal(timed.stage_bwd_s, bwd)
    assert not timed.p2p_fwd_s.any() and not timed.p2p_bwd_s.any()
    sim = simulate(fwd, bwd, 0.0, 0.0, placed.num_microbatches, tail_s=t["tail"])
    assert timed.iteration_time_s == pytest.approx(
        float(sim.iteration_time_s.max()) + t["opt"], rel=1e-12)

def test_placed_times_in_slices_are_each_placements_time(monkeypatch):
    """:meth:`PlacedPlan.times` prices placements in slices of BATCH_GPUS ranks: with slices
    of two placements, five placements on the measured hosts give each one's own
    :meth:`PlacedPlan.time`."""
    placed, _, _ = _placed_plan("measured")
    rng = np.random.default_rng(3)
    placements = [(rng.permutation(4), np.array([rng.permutation(8) for _ in range(4)]))
                  for _ in range(5)]
    want = [placed.time(*p).iteration_time_s for p in placements]
    assert len(set(want)) > 1
    monkeypatch.setattr(placed_module, "BATCH_GPUS", 2 * 32)
    assert placed.times(placements).tolist() == pytest.approx(want, rel=1e-12)


def test_placed_time_records_the_pacing_replicas_schedule():
    """``record=True`` keeps the pacing replica's simulated schedule: its makespan plus the
    optimizer step is the iteration; a time priced without it simulates it again from the
    kept chunk and send times, with the same critical path."""
    placed, _, _ = _placed_plan("uniform", vp=2)
    timed = placed.time(*placed.default_placement(), record=True)
    assert timed.sim is not None and timed.sim.critical_path
    assert float(np.max(timed.sim.iteration_time_s)) + timed.optimizer_s == pytest.approx(
        timed.iteration_time_s, rel=1e-12)
    plain = placed.time(*placed.default_placement())
    assert plain.sim is None
    again = plain.recorded()
    assert again.critical_path == timed.sim.critical_path
    assert np.array_equal(again.iteration_time_s, timed.sim.iteration_time_s)



# ---------------------------------------------------------------- schedule simulator

@pytest.mark.parametrize("shape", [(3,), (0, 2), (2, 0)])
def test_simulate_refuses_forward_times_of_a_bad_shape(shape):
    """``fwd_s`` must be ``[pp, vp]`` or ``[D, pp, vp]`` with no empty axis: ValueError
    naming it."""
    with pytest.raises(ValueError, match="fwd_s must have shape"):
        simulate(np.ones(shape), np.ones(shape), 0.0, 0.0, 4)



def test_recorded_schedules_are_recorded_every_time():
    """A schedule simulated again with the same inputs (the rank-finish cache's case) still
    records every op when asked, whether or not it was simulated before without; the
    compiled order's arrays are read-only (it is cached and shared)."""
    fwd, bwd = np.array([[1.0], [2.0]]), np.array([[2.0], [3.0]])
    plain = simulate(fwd, bwd, 0.5, 0.25, 4)
    for _ in range(2):
        rec = simulate(fwd, bwd, 0.5, 0.25, 4, record=True)
        assert rec.start_s is not None and rec.critical_path
        assert np.array_equal(rec.iteration_time_s, plain.iteration_time_s)
    order = schedule_order(2, 1, 4)
    assert not order.rank.flags.writeable
    with pytest.raises(ValueError):
        order.rank[0] = 1
    # nor can a field be re-bound: every later plan of that shape reads the same order
    with pytest.raises(dataclasses.FrozenInstanceError):
        order.rank = np.zeros_like(order.rank)
    assert schedule_order(2, 1, 4) is order


def test_schedule_of_max_ops_is_simulated_op_by_op(monkeypatch):
    """A schedule of exactly MAX_OPS ops (pp 32, 2,048 microbatches: 2·32·2,048) is still
    simulated op by op, not extrapolated; replicas walked in slices (MAX_CELLS) are recorded
    all the same when asked; compiled orders hash and compare by identity (cached)."""
    assert 2 * 32 * 2048 == schedule_sim.MAX_OPS
    res = simulate(np.ones((32, 1)), np.full((32, 1), 2.0), 0.125, 0.125, 2048)
    assert res.extrapolated_to is None
    monkeypatch.setattr(schedule_sim, "MAX_CELLS", 64)
    fwd = np.array([[[1.0], [2.0]], [[1.5], [1.0]], [[1.0], [1.0]]])        # D = 3
    rec = simulate(fwd, 2 * fwd, 0.5, 0.25, 8, record=True)
    assert rec.start_s.shape == (3, 32) and len(rec.critical_path) == 3
    order = schedule_order(2, 1, 8)
    assert {order: 1}[schedule_order(2, 1, 8)] == 1 and order != schedule_order(2, 1, 4)


def test_schedule_levels_are_a_topological_order():
    """The compiled order (ScheduleOrder's docstring): pp 2 with one microbatch has four
    levels, one op each (rank 0's forward, rank 1's forward and backward, rank 0's
    backward), one rank's 64 ops sixty-four; in a deeper interleaved schedule every level
    holds ops and every op comes after its same-rank and data predecessors' levels.
    Uniform 1F1B stages (f 1, b 2, no send time) take (m + pp − 1)·(f + b)."""
    small = schedule_order(2, 1, 1)
    assert small.n_levels == 4 and small.level_bounds.tolist() == [0, 1, 2, 3, 4]
    chain = schedule_order(1, 1, 32)         # one rank: 64 ops one after the other
    assert chain.level_bounds.tolist() == list(range(65))
    order = schedule_order(4, 2, 8)
    bounds = order.level_bounds
    assert order.n_levels == len(bounds) - 1 and np.all(np.diff(bounds) > 0)
    level = np.repeat(np.arange(order.n_levels), np.diff(bounds))
    for pred in (order.rank_pred, order.data_pred):
        has = pred >= 0
        assert np.all(level[pred[has]] < level[has])
    res = simulate(np.ones((4, 1)), np.full((4, 1), 2.0), 0.0, 0.0, 8)
    assert res.iteration_time_s.tolist() == [(8 + 4 - 1) * 3.0]

# ---------------------------------------------------------------- time to train

def test_moe_checkpoint_spreads_expert_state_over_the_expert_data_parallel_group():
    """torch_dist checkpoint (training_time module docstring): 2 + 12 bytes a parameter; a
    rank writes its non-expert state over dp·cp = 4 replicas and its expert state over the
    expert-data-parallel group tp·cp·dp/(ep·etp) = 2; every rank's shards add up to the
    model-parallel ranks' state (non-expert × tp, expert × ep·etp); the busiest node writes
    G shards. Parameter counts as :func:`_moe_mtp_parts` (pp 1: both layers, the MTP module,
    the embedding and the output layer)."""
    tp, ep, etp, dp = 2, 2, 2, 4
    model = make_model(**MOE_MTP)
    plan = ParallelPlan(tp=tp, pp=1, dp=dp, ep=ep, etp=etp, micro_batch_size=1,
                        global_batch_size=8, recompute="none", sequence_parallel=True,
                        distributed_optimizer=True)
    attn, mlp, router, expert = _moe_mtp_parts(tp, ep, etp)
    h, V = 64, v_pad(300, tp)
    moe_ne = attn + router
    ne = (attn + mlp) + moe_ne + V * h / tp + (2 * h + V * h / tp) + (
        3 * 2 * h + 2 * h * h / tp + moe_ne)
    ex = 2 * 4 / ep * expert
    size = checkpoint_bytes(model, PlanBatch.from_plan(plan), gpus_per_node=8)
    rank = (ne / 4 + ex / 2) * 14
    assert size.rank_bytes == pytest.approx(rank, rel=1e-12)
    assert size.node_bytes == pytest.approx(8 * rank, rel=1e-12)
    assert size.total_bytes == pytest.approx((ne * tp + ex * ep * etp) * 14, rel=1e-12)


def test_closed_form_holds_up_to_its_limits():
    """λ·(Δt + u₀) up to 0.08 and λ·w up to 0.005, both bounds included (0.08·(0.25 + 0.75)
    and 0.08·0.0625 are the limits exactly in binary floating point)."""
    assert closed_form_holds(0.08, 0.25, 0.75, 0.0625)
    assert not closed_form_holds(0.08, 0.25, 0.76, 0.0)
    assert not closed_form_holds(0.08, 0.25, 0.5, 0.07)


def test_a_job_that_never_finishes_a_segment_takes_forever():
    """Failures so frequent that λ·(Δt + w) > 700: the exact ETTR is 0 and the wall time,
    days and energy infinite (not a division by zero)."""
    model = make_model(**PLACED_MODEL)
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8,
                        recompute="none")
    gpu = load_cluster("dgx-h100-80gb", 1).gpu
    t = estimate_training(model, PlanBatch.from_plan(plan), iteration_time_s=10.0,
                          global_batch_size=8,
                          gpus_per_node=8, gpu=gpu, interval_iterations=1000,
                          inputs=TrainingInputs(train_tokens=1e9,
                                                failure_rate_per_node_day=1e6))
    assert t.ettr == 0.0
    assert math.isinf(t.wall_time_s) and math.isinf(t.days) and math.isinf(t.energy_J)


def test_time_to_train_of_one_node_by_hand():
    """estimate_training (training_time module docstring) on one DGX H100 node, every figure
    by hand: the dense model's 5,771,520 parameters (8 layers of 2h + 4h² + 3hf, the
    embedding V_pad·h, the final norm and output layer h + V_pad·h) at 14 bytes, spread
    over dp = 8; a synchronous save and the load at the node's 1 GB/s; failures at 0.5 a
    node-day; ETTR = Δt / ((1/λ + u₀)·(e^{λ(Δt+w)} − 1)) (Daly 2006, Eq. 13); Kokolis et
    al.'s closed form beside it; Young's √(2wM) and Daly's Eq. 37 intervals; power (8 GPUs
    at 0.8 of 700 W and the DGX's 4.6 kW beyond them) × PUE 1.2."""
    model = make_model(**PLACED_MODEL)
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8,
                        recompute="none", distributed_optimizer=True)
    gpu = load_cluster("dgx-h100-80gb", 1).gpu
    assert (gpu.name, gpu.rated_power_W) == ("h100-80gb", 700.0)
    inputs = TrainingInputs(train_tokens=4096 * 10_000, failure_rate_per_node_day=0.5,
                            restart_overhead_s=300.0, node_write_Bps=1e9,
                            aggregate_write_Bps=2e12, node_read_Bps=0.5e9,
                            aggregate_read_Bps=2e12, gpu_hour_price=2.0,
                            gpu_power_fraction=0.8, pue=1.2)
    one = PlanBatch.from_plan(plan)
    t = estimate_training(model, one, iteration_time_s=2.0, global_batch_size=8,
                          gpus_per_node=8, gpu=gpu, inputs=inputs, interval_iterations=500)
    h, f, V = 256, 512, 1024
    params = 8 * (2 * h + 4 * h * h + 3 * h * f) + V * h + (h + V * h)
    assert params == 5_771_520
    total = 14.0 * params
    assert (t.checkpoint_bytes, t.checkpoint_rank_bytes) == pytest.approx((total, total / 8))
    w, load = total / 1e9, total / 0.5e9
    u0 = 300.0 + load
    lam = 0.5 / 86400.0
    dt = 500 * 2.0
    ettr = dt / ((1 / lam + u0) * (math.exp(lam * (dt + w)) - 1))
    wall = 10_000 * 2.0 / ettr
    assert t.iterations == 10_000 and t.interval_s == dt and t.interval_iterations == 500
    assert (t.save_stall_s, t.persist_s, t.load_s, t.restart_s) == pytest.approx(
        (w, 0.0, load, u0), rel=1e-12)
    assert t.failure_rate_per_s == pytest.approx(lam, rel=1e-12)
    assert t.ettr == pytest.approx(ettr, rel=1e-9)
    assert t.ettr_closed_form == pytest.approx(
        (1 - lam * (u0 + dt / 2)) / (1 + w / dt), rel=1e-12)
    assert t.closed_form_holds
    assert t.wall_time_s == pytest.approx(wall, rel=1e-9)
    assert t.days == pytest.approx(wall / 86400, rel=1e-9)
    assert t.expected_interruptions == pytest.approx(lam * wall, rel=1e-9)
    assert t.goodput_tokens_per_s == pytest.approx(4096e4 / wall, rel=1e-9)
    assert t.goodput_tokens_per_s_per_gpu == pytest.approx(4096e4 / wall / 8, rel=1e-9)
    mtbf = 1 / lam
    assert t.young_interval_s == pytest.approx(math.sqrt(2 * w * mtbf), rel=1e-12)
    x = w / (2 * mtbf)
    assert t.daly_interval_s == pytest.approx(
        math.sqrt(2 * w * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - w, rel=1e-12)
    assert t.gpu_hours == pytest.approx(8 * wall / 3600, rel=1e-9)
    assert t.cost == pytest.approx(2.0 * 8 * wall / 3600, rel=1e-9)
    power = (8 * 700 * 0.8 + 4600.0) * 1.2
    assert (t.power_W, t.node_overhead_W) == pytest.approx((power, 4600.0), rel=1e-12)
    assert t.energy_J == pytest.approx(power * wall, rel=1e-9)
    assert t.energy_MWh == pytest.approx(power * wall / 3.6e9, rel=1e-9)
    assert not t.async_save and t.tokens == 4096e4
    # asynchronous: the stall is the rank's shard over the GPU→host link, the write persists
    a = estimate_training(model, one, iteration_time_s=2.0, global_batch_size=8,
                          gpus_per_node=8, gpu=gpu, interval_iterations=500,
                          inputs=dataclasses.replace(inputs, async_save=True))
    assert (a.save_stall_s, a.persist_s, a.restart_s) == pytest.approx(
        (total / 8 / 64e9, w, u0 + w), rel=1e-12)
    # the objectives: days, cost (GPU-hours without a price), energy
    assert objective_key("time-to-train", t) == t.wall_time_s
    assert objective_key("cost", t) == t.cost
    assert objective_key("cost", dataclasses.replace(t, cost=None)) == t.gpu_hours
    assert objective_key("energy", t) == t.energy_J
    with pytest.raises(InputError):
        objective_key("iteration", t)
    assert training_settings({"storage_write_GBps_per_node": 2.0, "pue": 1.3,
                              "storage_read_GBps_aggregate": 100.0}) == {
        "node_write_Bps": 2e9, "pue": 1.3, "aggregate_read_Bps": 1e11}


@pytest.mark.parametrize("cls", [TrainingInputs, CheckpointSize, TrainingEstimate])
def test_training_records_are_frozen_and_keyword_only(cls):
    """The time-to-train records are read-only values built by keyword."""
    fields = dataclasses.fields(cls)
    values = {f.name: 1.0 for f in fields}
    record = cls(**values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, fields[0].name, 2.0)
    with pytest.raises(TypeError):
        cls(*values.values())



# ---------------------------------------------------------------- more edges

def test_mtp_module_of_a_dense_model():
    """A dense model's MTP module (multi_token_prediction.py): enorm, hnorm and the final
    norm (3h, RMSNorm), the 2h→h projection split over tp, one dense layer (the last
    decoder layer's type); no expert parameters."""
    model = make_model(**(GQA_DROP | dict(mtp_num_layers=2)))
    h, a, g, d, f, tp = 256, 8, 2, 32, 512, 2
    layer = h + (h * (a + 2 * g) * d + a * d * h) / tp + h + (h * 2 * f + f * h) / tp
    ne, ex = mtp_parameters(model, tp=tp)
    assert float(ne) == pytest.approx(2 * (3 * h + 2 * h * h / tp + layer), rel=1e-12)
    assert float(ex) == 0.0


def test_cp_all_gather_keeps_the_whole_sequences_k_and_v_in_backward():
    """cp_comm_type all_gather (Transformer Engine ``AttnFuncWithCPAndKVAllGather``): the
    gathered K and V of the whole sequence and their gradients, 16-bit, g/t heads of d + d,
    beyond the local shard ((cp − 1)/cp of them); p2p keeps none; cp = 1 none."""
    model = make_model(**GQA_DROP)
    mbs, tp, g, d, seq = 2, 2, 2, 32, 512
    full = 2 * mbs * seq * g / tp * (d + d)
    got = cp_gather_bytes(model, tp=tp, cp=np.array([1, 2, 4]), mbs=mbs,
                          cp_comm_type="all_gather")
    assert np.asarray(got) == pytest.approx([0.0, 2 * full / 2, 2 * full * 3 / 4], rel=1e-12)
    assert not np.asarray(cp_gather_bytes(model, tp=tp, cp=4, mbs=mbs,
                                          cp_comm_type="p2p")).any()
    # the estimate adds it to the allowance beyond the activations' fragmentation
    plans = [ParallelPlan(tp=tp, cp=4, pp=1, dp=1, micro_batch_size=mbs, global_batch_size=8,
                          sequence_parallel=True, recompute="none", cp_comm_type=kind)
             for kind in ("all_gather", "p2p")]
    gathered, p2p = (estimate_memory(model, PlanBatch.from_plan(p))[0] for p in plans)
    assert gathered.other_bytes - p2p.other_bytes == pytest.approx(2 * full * 3 / 4,
                                                                   rel=1e-9)
    assert gathered.total_bytes == pytest.approx(
        gathered.parameters_bytes + gathered.gradients_bytes + gathered.optimizer_bytes
        + gathered.activations_bytes + gathered.other_bytes, rel=1e-12)
    assert gathered.to_dict()["other_bytes"] == gathered.other_bytes


def test_offloaded_mla_input_norm():
    """With multi-latent attention the input norm runs apart from the down projections:
    attn_norm offloads its 16-bit input, 2Xh/t with SP."""
    model = make_model(**(_BASE | _MLA | dict(q_lora_rank=32)))
    x = LayerInputs(seq=S, mbs=B, tp=TP, sp=True, offload_modules="attn_norm")
    every, moe = offloaded_layer_bytes(model, x)
    assert float(every) == pytest.approx(2 * X * 64 / TP, rel=1e-12)
    assert float(moe) == 0.0


def test_placed_stage_times_of_the_pacing_replica():
    """Per stage of the pacing replica (index 1 here), per iteration: m microbatches through
    its chunks forward and backward, their sum busy, the exposed reduction, and idle the
    rest of the iteration before the optimizer step (never below 0). The record is frozen."""
    fwd = np.array([[[9.0, 9.0], [9.0, 9.0]], [[1.0, 0.5], [2.0, 1.0]]])     # [dp, pp, vp]
    bwd = 2 * fwd
    timed = PlacedTime(iteration_time_s=40.0, stage_fwd_s=fwd, stage_bwd_s=bwd,
                       p2p_fwd_s=np.zeros((2, 2)), p2p_bwd_s=np.zeros((2, 2)),
                       dp_tail_s=np.array([0.5, 1.0]), optimizer_s=2.0, critical_replica=1,
                       sim=None, num_microbatches=4)
    got = timed.stage_times()
    assert got == [
        {"stage": 0, "forward_s": 6.0, "backward_s": 12.0, "busy_s": 18.0,
         "dp_exposed_s": 0.5, "idle_s": 38.0 - 18.0 - 0.5},
        {"stage": 1, "forward_s": 12.0, "backward_s": 24.0, "busy_s": 36.0,
         "dp_exposed_s": 1.0, "idle_s": 1.0}]
    late = dataclasses.replace(timed, iteration_time_s=30.0)
    assert late.stage_times()[1]["idle_s"] == 0.0
    # a value: replaced as above, never changed in place (the search's placed results and
    # their reports share it)
    with pytest.raises(dataclasses.FrozenInstanceError):
        timed.iteration_time_s = 30.0

def test_placed_moe_plan_on_one_stage_is_the_closed_forms():
    """With one pipeline stage there is no schedule to approximate: the placed pricing and
    the closed form (:func:`configurator.cost.iteration.iteration_time`) read the same
    terms and agree to 1e-9 (tests/test_placed.py's bound), here for an MoE model of dense
    and MoE layers whose gradient reduction between two hosts overlaps the backward of its
    layers (the windows count each kind of layer)."""
    model = make_model(num_layers=16, hidden_size=4096, num_attention_heads=8,
                       ffn_hidden_size=16384, vocab_size=1000, seq_length=64, swiglu=True,
                       normalization="RMSNorm", position_embedding_type="rope",
                       untie_embeddings_and_output_weights=True, add_bias_linear=False,
                       num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=4096,
                       moe_layer_freq=[0, 1] * 8)
    cluster = load_cluster("dgx-h100-80gb", 2)
    plan = ParallelPlan(tp=1, pp=1, dp=16, ep=4, micro_batch_size=1, global_batch_size=32,
                        recompute="none", distributed_optimizer=True,
                        overlap_grad_reduce=True, overlap_param_gather=True)
    placed = PlacedPlan(model, cluster, PlanBatch.from_plan(plan))
    closed = iteration_time(model, cluster, PlanBatch.from_plan(plan))["iteration_time_s"]
    assert placed.time(*placed.default_placement()).iteration_time_s == pytest.approx(
        float(closed[0]), rel=1e-9)

@pytest.mark.parametrize("kind", ["p2p", "a2a", "all_gather"])
def test_placed_context_ring_across_hosts_on_one_stage_is_the_closed_forms(kind):
    """cp = 16 over two hosts, one stage: the ring's sends (p2p: its slowest single send,
    between the hosts), its members per NVLink domain (a2a) and its ring figures
    (all_gather) priced on the placed ranks give the closed form's iteration to 1e-9."""
    model = make_model(**(PLACED_MODEL | dict(hidden_size=1024, ffn_hidden_size=4096,
                                              seq_length=8192)))
    cluster = load_cluster("dgx-h100-80gb", 2)
    plan = ParallelPlan(tp=1, cp=16, dp=1, pp=1, micro_batch_size=1, global_batch_size=4,
                        recompute="none", cp_comm_type=kind)
    placed = PlacedPlan(model, cluster, PlanBatch.from_plan(plan))
    closed = iteration_time(model, cluster, PlanBatch.from_plan(plan))["iteration_time_s"]
    assert placed.time(*placed.default_placement()).iteration_time_s == pytest.approx(
        float(closed[0]), rel=1e-9)

def test_placed_plan_edges():
    """A plan that does not fill whole hosts is refused; no placement prices to no time;
    placements on a uniform cluster price alike, one figure each; the objective is the
    iteration time; a recorded time's schedule is its own."""
    cluster, _ = _placed_case("uniform")
    model = make_model(**PLACED_MODEL)
    with pytest.raises(ValueError, match="whole hosts"):
        PlacedPlan(model, cluster, PlanBatch.of(tp=2, pp=2, dp=1, micro_batch_size=1,
                                                global_batch_size=8, recompute="none"))
    placed, _, _ = _placed_plan("uniform")
    assert placed.times([]).shape == (0,)
    default = placed.default_placement()
    # on a uniform cluster every placement prices as Megatron's order, each its own time
    swapped = (default[0][::-1].copy(), default[1][:, ::-1].copy())
    assert placed.times([default, swapped, default]).tolist() == [
        placed.time(*default).iteration_time_s] * 3
    many = placed.terms_many(np.stack([placed.rank_gpus(*p) for p in (default, swapped)]))
    assert many["fwd"].shape[0] == many["p2p_f"].shape[0] == many["tail"].shape[0] == 2
    assert many["opt"] == placed.time(*default).optimizer_s
    assert placed.objective(*default) == placed.time(*default).iteration_time_s
    timed = placed.time(*default, record=True)
    assert timed.recorded() is timed.sim


def test_placed_1f1b_sends_busy_their_senders():
    """Without interleaving Megatron batches each send with the next receive and waits for
    both (``overlap_p2p_comm`` is off without it): the placed schedule adds a stage's
    forward send to its own forward (every stage but the last) and its backward send to its
    own backward (every stage but the first) and keeps no separate send time; interleaved
    (vp 2) the sends stay apart, as measured."""
    cluster = load_cluster("dgx-h100-80gb", 4)
    pp = 4
    for vp in (1, 2):
        plan = ParallelPlan(tp=2, dp=4, pp=pp, vp=vp, micro_batch_size=1, global_batch_size=16,
                            recompute="none", sequence_parallel=True,
                            distributed_optimizer=True)
        placed = PlacedPlan(make_model(**PLACED_MODEL), cluster, PlanBatch.from_plan(plan))
        default = placed.default_placement()
        raw = placed.terms(placed.rank_gpus(*default))
        timed = placed.time(*default)
        assert (raw["p2p_f"][:, :pp - 1] > 0).all() and (raw["p2p_b"][:, :pp - 1] > 0).all()
        want_f, want_b = raw["fwd"].copy(), raw["bwd"].copy()
        if vp == 1:
            want_f[:, :pp - 1, 0] += raw["p2p_f"][:, :pp - 1]
            want_b[:, 1:, 0] += raw["p2p_b"][:, :pp - 1]
        assert np.array_equal(timed.stage_fwd_s, want_f) and np.array_equal(
            timed.stage_bwd_s, want_b), vp
        sends = (timed.p2p_fwd_s, timed.p2p_bwd_s)
        assert all(np.array_equal(got, np.zeros_like(got) if vp == 1 else raw[k])
                   for got, k in zip(sends, ("p2p_f", "p2p_b"))), vp


def test_placed_residue_path_gives_each_row_its_own_figures():
    """On a uniform cluster every group and send is priced once per place within a host
    (the residue path); pricing each row on its own (the path of a non-uniform cluster)
    gives the same stage, send and tail times, context parallelism's rings included."""
    cluster = load_cluster("dgx-h100-80gb", 4)
    for par in (dict(tp=2, cp=2, dp=2, pp=4), dict(tp=1, cp=4, dp=2, pp=4)):
        plan = ParallelPlan(**par, vp=2, micro_batch_size=1, global_batch_size=8 * par["dp"],
                            recompute="none", sequence_parallel=par["tp"] > 1,
                            distributed_optimizer=True)
        placed = PlacedPlan(make_model(**PLACED_MODEL), cluster, PlanBatch.from_plan(plan))
        gpus = placed.rank_gpus(*placed.default_placement())
        fast = placed.terms(gpus)
        placed.uniform = False
        slow = placed.terms(gpus)
        for k in ("fwd", "bwd", "p2p_f", "p2p_b", "tail"):
            assert np.array_equal(fast[k], slow[k]), k


def test_simulate_refuses_a_fractional_microbatch_count():
    with pytest.raises(ValueError, match="num_microbatches must be an integer"):
        simulate(np.ones((2, 1)), np.ones((2, 1)), 0.0, 0.0, 2.5)


def test_save_interval_edges_and_token_formats():
    """Without failures the whole run between saves; with a free save one iteration (at
    least the async persist's); a failure-free Monte-Carlo is Δt/(Δt + w); tokens format
    with the largest suffix keeping the number ≥ 1; overrides of None keep the base."""
    assert best_interval(0.0, 300.0, 60.0, 2.0, max_iterations=5000) == 5000
    assert best_interval(1e-5, 300.0, 0.0, 2.0, min_interval_s=7.0) == 4
    # a persist of exactly 3 iterations: 2.1 / 0.7 is 3.0000000000000004 in floats, and
    # the third iteration's end already meets it (not a fourth)
    assert best_interval(1e-5, 300.0, 0.0, 0.7, min_interval_s=2.1) == 3
    k = best_interval(1e-4, 300.0, 60.0, 2.0, max_iterations=10**6)
    brute = max(range(1, 20001), key=lambda i: ettr_exact(1e-4, 300.0, 2.0 * i, 60.0))
    assert k == brute
    # failures so rare (λ = 1e-20/s) that the exact ETTR only grows over the whole run,
    # in steps below a float's resolution near 1 (a search that stops early misses it)
    assert best_interval(1e-20, 300.0, 1e-5, 10.0, max_iterations=100_000) == 100_000
    # failures every 250 s on average and a run of 10⁷ iterations: past about 58,000
    # iterations a segment never completes (λ(Δt + w) > 700, ETTR exactly 0); the search
    # still finds the optimum, where a brute force over the first 5,000 intervals does
    ettr = [ettr_exact(0.004, 300.0, 3.0 * i, 250.0) for i in range(1, 5001)]
    assert best_interval(0.004, 300.0, 250.0, 3.0, max_iterations=10**7) == (
        1 + int(np.argmax(ettr)))
    assert ettr_monte_carlo(0.0, 300.0, 90.0, 10.0) == 0.9
    # λ(Δt + w) = 700 exactly is still priced (e^700 is finite): Δt / ((1/λ)(e^700 − 1))
    assert ettr_exact(7.0, 0.0, 99.0, 1.0) == pytest.approx(
        99.0 / ((1 / 7.0) * (math.exp(700.0) - 1.0)), rel=1e-12, abs=0.0)
    with pytest.raises(ValueError, match="almost never completes"):   # λ(Δt + w) = 21 > 20
        ettr_monte_carlo(1.0, 0.0, 20.5, 0.5)
    assert [format_tokens(t) for t in (2e15, 15e12, 3e11, 4.5e6, 1234.0, 999.0)] == [
        "2P", "15T", "300B", "4.5M", "1.23K", "999"]
    assert merged_inputs({"pue": 1.2, "restart_overhead_s": 300.0},
                         {"pue": None, "restart_overhead_s": 60.0, "async_save": True}) == {
        "pue": 1.2, "restart_overhead_s": 60.0, "async_save": True}


_MCORE_NAMES = textwrap.dedent('''
    """Print the named parameters of one megatron-core decoder layer per case (local spec,
    CPU, gloo world of one) as JSON: {case: {name: elements}}."""
    import json, os, socket, sys
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import (MLATransformerConfig,
                                                              TransformerConfig)
    torch.cuda.current_device = lambda: "cpu"    # MLA's rotary embedding asks for it
    multi_latent_attention.HAVE_TE = False       # no Transformer Engine linear to look for
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    out = {}
    for name, kw in json.loads(sys.argv[1]).items():
        mla = kw.pop("multi_latent_attention", False)
        experts = kw.pop("num_experts", None)
        cfg = dict(num_layers=1, hidden_size=kw.pop("hidden_size"),
                   num_attention_heads=kw.pop("num_attention_heads"),
                   ffn_hidden_size=kw.pop("ffn_hidden_size"),
                   add_bias_linear=kw.pop("add_bias_linear"),
                   add_qkv_bias=kw.pop("add_qkv_bias", False),
                   normalization=kw.pop("normalization", "LayerNorm"),
                   qk_layernorm=kw.pop("qk_layernorm", False), gated_linear_unit=kw.pop("swiglu"),
                   activation_func=F.silu, use_cpu_initialization=True)
        if experts:
            cfg.update(num_moe_experts=experts, moe_router_topk=kw.pop("moe_router_topk"),
                       moe_ffn_hidden_size=kw.pop("moe_ffn_hidden_size"),
                       moe_shared_expert_intermediate_size=kw.pop(
                           "moe_shared_expert_intermediate_size", None),
                       moe_grouped_gemm=False)
        if mla:   # without q_lora_rank the query projection is not low-rank
            cfg.update(q_lora_rank=kw.pop("q_lora_rank", None),
                       **{k: kw.pop(k) for k in ("kv_lora_rank", "qk_head_dim",
                                                 "qk_pos_emb_head_dim", "v_head_dim")})
        config = (MLATransformerConfig if mla else TransformerConfig)(**cfg)
        spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False,
                                        qk_layernorm=config.qk_layernorm,
                                        multi_latent_attention=mla,
                                        normalization=config.normalization)
        if mla:   # the local DotProductAttention takes no k_channels; it holds no parameter
            spec.submodules.self_attention.submodules.core_attention = IdentityOp
        layer = build_module(spec, config=config, layer_number=1)
        out[name] = {n: p.numel() for n, p in layer.named_parameters()}
    print(json.dumps(out))
''')


def test_parameter_tensor_counts_match_megatron_core_layers():
    """:data:`TENSOR_CASES`' names are what megatron-core's own layers hold, and the layer's
    parameter count (:func:`memory_model.params.dense_layer_parameters`, or the MoE layer's
    two parts) its elements: each case's layer is built from ``get_gpt_layer_local_spec``
    on CPU (in a subprocess: it starts a process group) and its ``named_parameters()``
    compared. Slow (megatron-core's import and layer construction, seconds): left out of
    the mutation bench's runs."""
    pytest.importorskip("megatron.core")
    keep = ("hidden_size", "num_attention_heads", "ffn_hidden_size", "add_bias_linear",
            "add_qkv_bias", "normalization", "qk_layernorm", "swiglu",
            "multi_latent_attention", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
            "moe_shared_expert_intermediate_size", "q_lora_rank", "kv_lora_rank",
            "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
    cases = {name: {k: v for k, v in (_BASE | kw).items() if k in keep}
             for name, (kw, _) in TENSOR_CASES.items()}
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    run = subprocess.run([sys.executable, "-c", _MCORE_NAMES, json.dumps(cases)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for name, (_, names) in TENSOR_CASES.items():
        assert sorted(got[name]) == sorted(names), name
        model = _layer_model(name)
        count = (sum(moe_layer_parameters(model)) if model.is_moe
                 else dense_layer_parameters(model))
        assert float(count) == sum(got[name].values()), name


def test_layer_inputs_default_to_one_plain_rank():
    """A layer's inputs default to Megatron's defaults for what is not given: micro-batch 1,
    tp and etp 1, no sequence parallelism, no recompute, bf16, the balanced dropless count,
    no all-to-all overlap, a flash-style kernel, nothing offloaded. Without sequence
    parallelism a tp-2 rank keeps its norms' and QKV/fc1 inputs whole (10·s·b·h bytes for a
    bias-dropout GPT layer's replicated part), so the default is the unsplit figure."""
    model = make_model(num_layers=2, hidden_size=256, num_attention_heads=8,
                       vocab_size=1024, seq_length=128)
    x = LayerInputs(seq=128)
    assert (x.mbs, x.tp, x.sp, x.etp, x.recompute, x.precision, x.capacity, x.a2a_overlap,
            x.stores_scores, x.offload_modules) == (1, 1, False, 1, 0, "bf16", 1.0, False,
                                                   False, "")
    kw = dict(mbs=1, seq=128, tp=2, recompute=0, stores_scores=False)
    plain = layer_activation_bytes(model, sp=False, **kw)
    split = layer_activation_bytes(model, sp=True, **kw)
    # the replicated part, whole on each rank without sp, halved with it
    assert float(plain - split) == pytest.approx(10 * 128 * 256 / 2, rel=1e-12)


@pytest.mark.parametrize("offloaded", [0, 1, 5])
def test_cpu_offloaded_layers_leave_all_but_one_on_the_host(offloaded):
    """CPU offloading of whole layers (stage_activation_phases): at the end of the forward the
    first N layers' activations are in host memory but the last one's, whose copy may still
    run: the GPU holds N − 1 layers fewer, each what a layer keeps (pp 1, no recompute)."""
    from memory_model.activations import layer_terms, stage_activation_phases

    model = make_model(name="m", num_layers=8, hidden_size=256, num_attention_heads=8,
                       num_query_groups=2, vocab_size=1000, seq_length=512)
    c = PlanBatch.from_plan(ParallelPlan(tp=2, pp=1, dp=2, micro_batch_size=2,
                                         global_batch_size=8, sequence_parallel=True,
                                         distributed_optimizer=True,
                                         cpu_offloading_num_layers=offloaded))
    x = LayerInputs.of_plans(model, c)
    at = StagePosition(pp=1, stage=0, num_microbatches=2, offloaded_layers=offloaded)
    fwd, rec = stage_activation_phases(model, x, at)
    base, _ = stage_activation_phases(model, x, dataclasses.replace(at, offloaded_layers=0))
    per_layer = float(np.ravel(layer_terms(model, x)["layer"])[0])
    assert float(np.ravel(base - fwd)[0]) == pytest.approx(max(offloaded - 1, 0) * per_layer,
                                                           rel=1e-12)
    assert float(np.ravel(rec)[0]) == 0.0
    # the estimate reads the plan's field
    from memory_model.estimate import activation_memory
    assert float(np.ravel(activation_memory(model, c, 0))[0]) == pytest.approx(
        float(np.ravel(fwd)[0]), rel=1e-12)
