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

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from configurator.core.model import make_model
from memory_model.params import (layer_parameter_tensors, stage_non_gemm_parameters,
                                 stage_parameter_split, stage_parameter_tensors,
                                 stage_parameters)


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


_MCORE_NAMES = textwrap.dedent('''
    """Print the named parameters of one megatron-core decoder layer per case (local spec,
    CPU, gloo world of one) as JSON: {case: [names]}."""
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
        out[name] = [n for n, _ in layer.named_parameters()]
    print(json.dumps(out))
''')


def test_parameter_tensor_counts_match_megatron_core_layers():
    """:data:`TENSOR_CASES`' names are what megatron-core's own layers hold: each case's
    layer is built from ``get_gpt_layer_local_spec`` on CPU (in a subprocess: it starts a
    process group) and its ``named_parameters()`` compared. Slow (megatron-core's import
    and layer construction, seconds): left out of the mutation bench's runs."""
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
