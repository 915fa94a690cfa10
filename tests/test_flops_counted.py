"""Our FLOPs formula against FLOPs counted on real models' forward and backward.

:func:`configurator.cost.flops.megatron_model_flops` (Megatron-LM core_v0.16.1
``num_floating_point_operations``, megatron/training/training.py) is compared with
``torch.utils.flop_counter.FlopCounterMode`` (PyTorch, torch/utils/flop_counter.py) wrapped
around one forward, the language-model loss and ``loss.backward()`` of Hugging Face
``transformers`` models built on the CPU from small configs (random init, float32). The same
``config.json``-style dict builds the Hugging Face model and, through
:func:`configurator.core.hf_import.from_hf_config`, our :class:`ModelSpec`.

Both sides count a GEMM of an m×k by a k×n matrix as ``2·m·n·k`` FLOPs, and every weight
GEMM three times (forward, data gradient, weight gradient): FlopCounterMode sees the
``aten.mm``/``addmm``/``bmm`` calls autograd makes, Megatron writes ``3·2·…``. It counts
only matmuls, convolutions and attention kernels, so norms, softmax, activations, RoPE
rotations, bias adds and the loss are not counted, as Megatron's formula leaves them out.
What remains different, and corrected explicitly below (:func:`counted_megatron_equivalent`):

1. **Causal attention.** Eager attention (``attn_implementation="eager"``, so the score
   GEMMs are plain ``aten.bmm``) computes ``Q·Kᵀ`` and ``P·V`` over all ``s×s`` query-key
   pairs and masks afterwards: ``3·2·B·a·s²·(d_qk + d_v)`` FLOPs per layer. Megatron counts
   only the pairs a causal kernel computes, half of that (its ``q·s`` term, ``6·B·s·(a·d·s)``
   for ``d_qk = d_v = d``). So half the full-square score FLOPs are removed. The test checks
   first that the counted ``aten.bmm`` FLOPs are those score GEMMs: exactly with transformers
   5; transformers 4.x adds the RoPE table ``inv_freq ⊗ positions`` as a bmm of at most
   ``B·s·d_rope`` FLOPs (no backward; < 1e-5 of the total here), left in the count.
2. **Router.** Megatron omits the router GEMM ``x·W_rᵀ`` (``W_r``: E×h): ``2·T·h·E`` forward,
   twice that backward, ``6·T·h·E`` per MoE layer for ``T = B·s`` tokens; subtracted.
   Hugging Face's eager experts (``experts_implementation="eager"``) loop over the experts
   hit, each on its routed tokens: ``k·T`` token-expert pairs per layer, as Megatron counts.
3. **MLA latent norms.** Megatron's MLA term adds ``r_q + r_kv`` per token and layer (the
   ``+ 1`` of its ``q_lora_rank·(h + … + 1)`` and ``kv_lora_rank·(h + … + 1)``, the latent
   RMSNorms); FlopCounterMode does not count norms, so ``6·T·L·(r_q + r_kv)`` is added.
4. **Vocabulary padding.** Megatron counts the logits over the vocabulary padded to a
   multiple of ``128·tp``; Hugging Face over the real one. Every vocabulary here is a
   multiple of 128 and ``tp = 1``, so padding is a no-op (asserted).

The remaining difference must be under 1 % per architecture, and every case is shaped so
that dropping a term of the formula (the SwiGLU factor, the GQA groups, the causal half, the
top-k, the head dimension, the MLA RoPE part) moves it by more than 1 %
(:func:`test_every_term_matters_by_more_than_the_tolerance`).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from configurator.core.hf_import import from_hf_config
from configurator.core.model import ModelSpec
from configurator.cost.flops import megatron_model_flops
from memory_model.params import padded_vocab_size

BATCH, SEQ, VOCAB = 2, 256, 2048
TOLERANCE = 0.01
_TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5

_COMMON = dict(hidden_size=256, num_hidden_layers=2, vocab_size=VOCAB,
               max_position_embeddings=SEQ, hidden_act="silu", attention_dropout=0.0)

#: config.json-style dicts (``model_type`` picks the Hugging Face class and our importer).
CONFIGS: dict[str, dict] = {
    # GQA (8 query heads, 2 KV heads), SwiGLU, untied output layer
    "llama": dict(_COMMON, model_type="llama", num_attention_heads=8, num_key_value_heads=2,
                  intermediate_size=768, tie_word_embeddings=False),
    # q/k/v biases (not counted by either side), tied embeddings
    "qwen2": dict(_COMMON, model_type="qwen2", num_attention_heads=8, num_key_value_heads=4,
                  intermediate_size=768, tie_word_embeddings=True),
    # QK-norm, head_dim 64 ≠ hidden / heads = 32
    "qwen3": dict(_COMMON, model_type="qwen3", num_attention_heads=8, num_key_value_heads=2,
                  head_dim=64, intermediate_size=640, tie_word_embeddings=False),
    # MoE: 4 experts, top-2, every layer
    "mixtral": dict(_COMMON, model_type="mixtral", num_attention_heads=8,
                    num_key_value_heads=2, intermediate_size=384, num_local_experts=4,
                    num_experts_per_tok=2, tie_word_embeddings=False),
    # MoE: 8 experts of 128, top-2, layer 0 dense (mlp_only_layers), QK-norm, head_dim 32
    "qwen3_moe": dict(_COMMON, model_type="qwen3_moe", num_attention_heads=8,
                      num_key_value_heads=4, head_dim=32, intermediate_size=512,
                      moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
                      decoder_sparse_step=1, mlp_only_layers=[0], tie_word_embeddings=False),
    # non-gated GeLU MLP of 4h, learned positions, biases everywhere, tied embeddings
    "gpt2": dict(model_type="gpt2", n_embd=256, n_layer=2, n_head=4, n_positions=SEQ,
                 vocab_size=VOCAB, resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0,
                 bos_token_id=0, eos_token_id=0),
    # multi-latent attention (q and kv LoRA, decoupled RoPE, d_qk ≠ d_v), first layer dense,
    # then 8 routed experts top-2 plus one shared expert. Hugging Face builds no
    # multi-token-prediction module, so num_nextn_predict_layers is 0.
    "deepseek_v3": dict(_COMMON, model_type="deepseek_v3", num_attention_heads=4,
                        num_key_value_heads=4, intermediate_size=512,
                        moe_intermediate_size=128, n_routed_experts=8, n_shared_experts=1,
                        num_experts_per_tok=2, n_group=1, topk_group=1,
                        first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=64,
                        qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=64,
                        num_nextn_predict_layers=0, tie_word_embeddings=False),
}


def count_flops(cfg: dict) -> dict[str, int]:
    """FLOPs FlopCounterMode counts, per aten op, for forward + loss + backward of one batch
    of ``BATCH × SEQ`` random tokens through the Hugging Face model of ``cfg``."""
    kw = {k: val for k, val in cfg.items() if k != "model_type"}
    hf_cfg = transformers.AutoConfig.for_model(cfg["model_type"], **kw)
    torch.manual_seed(0)
    # transformers 5 may run experts as one grouped GEMM (torch._grouped_mm, which
    # FlopCounterMode does not count); "eager" loops over the experts, as 4.x always does.
    experts = {"experts_implementation": "eager"} if _TRANSFORMERS_5 else {}
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager",
                                                          **experts)
    model = model.to(torch.float32).train()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def full_score_flops(model: ModelSpec) -> float:
    """``Q·Kᵀ`` and ``P·V`` over all ``s×s`` pairs, forward and backward, every layer."""
    d_qk, d_v = model.attention_heads_dims
    return (3 * 2 * BATCH * model.num_attention_heads * SEQ * SEQ * (d_qk + d_v)
            * model.num_layers)


def rope_table_flops(model: ModelSpec) -> int:
    """Upper bound of the RoPE table GEMM ``inv_freq[d/2, 1] @ positions[1, s]`` per
    sequence (older transformers compute it as a bmm; FLOPs ``2·(d/2)·s``)."""
    if model.position_embedding_type != "rope":
        return 0
    d = model.qk_pos_emb_head_dim if model.multi_latent_attention else model.kv_channels
    return BATCH * SEQ * d


def counted_megatron_equivalent(model: ModelSpec, counted: dict[str, int]) -> float:
    """Counted FLOPs brought to what Megatron's formula counts (module docstring, 1–3)."""
    tokens = BATCH * SEQ
    total = float(sum(counted.values()))
    total -= full_score_flops(model) / 2                                          # 1.
    total -= 6 * tokens * model.hidden_size * (model.num_experts or 0) * model.num_moe_layers  # 2.
    if model.multi_latent_attention:                                              # 3.
        total += 6 * tokens * model.num_layers * ((model.q_lora_rank or 0)
                                                  + model.kv_lora_rank)
    return total


@pytest.fixture(scope="module")
def counted() -> dict[str, tuple[ModelSpec, dict[str, int]]]:
    return {name: (from_hf_config(cfg, name=name), count_flops(cfg))
            for name, cfg in CONFIGS.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_formula_matches_counted_flops(counted, name):
    model, ops = counted[name]
    assert padded_vocab_size(model.vocab_size, 1) == model.vocab_size == VOCAB
    # Only GEMMs were counted; the batched ones are the full-square score GEMMs (+ RoPE table)
    assert set(ops) <= {"aten.mm", "aten.addmm", "aten.bmm"}, ops
    assert 0 <= ops["aten.bmm"] - full_score_flops(model) <= rope_table_flops(model)
    expected = counted_megatron_equivalent(model, ops)
    formula = megatron_model_flops(model, BATCH, SEQ, tp=1)
    assert formula == pytest.approx(expected, rel=TOLERANCE), (
        f"{name}: formula {formula:.4e} vs counted {expected:.4e} "
        f"({formula / expected - 1:+.2%})")


def _perturbations(model: ModelSpec):
    """Formulas with one term wrong, each applicable to ``model``."""
    rep = dataclasses.replace
    yield "full (non-causal) scores", megatron_model_flops(model, BATCH, SEQ, causal=False)
    if model.swiglu:
        yield "no SwiGLU factor", megatron_model_flops(rep(model, swiglu=False), BATCH, SEQ)
    if model.num_query_groups != model.num_attention_heads:
        yield "GQA ignored", megatron_model_flops(
            rep(model, num_query_groups=model.num_attention_heads), BATCH, SEQ)
    if model.kv_channels * model.num_attention_heads != model.hidden_size \
            and not model.multi_latent_attention:
        yield "head dim h/a", megatron_model_flops(
            rep(model, kv_channels=model.hidden_size // model.num_attention_heads), BATCH, SEQ)
    if model.is_moe:
        yield "top-1", megatron_model_flops(rep(model, moe_router_topk=1), BATCH, SEQ)
    if 0 < model.num_moe_layers < model.num_layers:
        yield "all layers MoE", megatron_model_flops(rep(model, moe_layer_freq=1), BATCH, SEQ)
    if model.moe_shared_expert_intermediate_size:
        yield "no shared expert", megatron_model_flops(
            rep(model, moe_shared_expert_intermediate_size=None), BATCH, SEQ)
    if model.multi_latent_attention:
        yield "no MLA RoPE part", megatron_model_flops(rep(model, qk_pos_emb_head_dim=0),
                                                       BATCH, SEQ)
        yield "no q LoRA", megatron_model_flops(rep(model, q_lora_rank=None), BATCH, SEQ)
    yield "no logits", megatron_model_flops(model, BATCH, SEQ) - 6 * BATCH * SEQ * (
        model.hidden_size * model.vocab_size)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_term_matters_by_more_than_the_tolerance(counted, name):
    """The 1 % check above can fail: a formula missing any one term misses by more."""
    model, ops = counted[name]
    expected = counted_megatron_equivalent(model, ops)
    for what, wrong in _perturbations(model):
        assert abs(wrong / expected - 1) > 2 * TOLERANCE, (name, what, wrong / expected - 1)
