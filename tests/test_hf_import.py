"""Hugging Face configs of today's dense and MoE models (tests/data/hf_configs, provenance in
its MANIFEST.csv) against their model cards: total and active parameters, and the fields a
silent import used to drop."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from configurator.core.errors import InputError
from configurator.core.hf_import import from_hf_config
from configurator.core.model_presets import load_model
from launchers.megatron_flags import flag_argv, megatron_flags
from memory_model.params import active_parameters, embedding_parameters, total_parameters
from configurator.core.plan import ParallelPlan

HERE = Path(__file__).parent / "data" / "hf_configs"
MANIFEST = list(csv.DictReader(open(HERE / "MANIFEST.csv")))
#: Model cards round to 2–3 significant figures ("46.7B", "37B"): relative tolerance.
CARD_ROUNDING = {"deepseek-v3.json": 0.02, "llama3-70b.json": 0.002}
#: Parameters a card's total counts beside the language model the import prices: Llama 4
#: Scout's vision encoder, adapter and projector (its config's vision_config: 34 layers of
#: width 1408 and MLP 5632, patch and position embeddings, a 4096-wide adapter and the
#: projector to 5120), 871,932,416 (MANIFEST.csv).
NOT_IMPORTED = {"llama4-scout.json": 871_932_416}


@pytest.mark.parametrize("row", MANIFEST, ids=[r["file"] for r in MANIFEST])
def test_total_and_active_parameters_match_the_model_card(row):
    model = load_model(str(HERE / row["file"]))
    total, active = total_parameters(model), active_parameters(model)
    total += NOT_IMPORTED.get(row["file"], 0)
    if row["file"].startswith("gpt-oss"):
        # OpenAI's model card counts active parameters without the input embedding table
        active -= int(embedding_parameters(model, 1))
    tol = CARD_ROUNDING.get(row["file"], 0.01)
    assert total == pytest.approx(float(row["total_params_published"]), rel=tol)
    assert active == pytest.approx(float(row["active_params_published"]), rel=max(tol, 0.02))


def test_moe_configs_are_not_imported_as_dense():
    mixtral = load_model(str(HERE / "mixtral-8x7b.json"))
    assert (mixtral.num_experts, mixtral.moe_router_topk) == (8, 2)
    ds = load_model(str(HERE / "deepseek-v3.json"))
    assert ds.multi_latent_attention and ds.moe_layer_pattern[:4] == (0, 0, 0, 1)
    assert ds.num_moe_layers == 58 and ds.mtp_num_layers == 1
    assert ds.moe_shared_expert_intermediate_size == 2048
    qwen3 = load_model(str(HERE / "qwen3-30b-a3b.json"))
    assert qwen3.kv_channels == 128 and qwen3.qk_layernorm and qwen3.num_experts == 128
    oss = load_model(str(HERE / "gpt-oss-120b.json"))
    assert (oss.window_size, oss.window_attn_skip_freq, oss.num_window_layers) == (128, 2, 18)
    qwen2 = load_model(str(HERE / "qwen2-57b-a14b.json"))
    assert qwen2.add_qkv_bias and qwen2.moe_shared_expert_intermediate_size == 20480


def test_llama4_imports_its_language_model():
    """Llama 4's multimodal config: its text_config's language model, every other layer MoE
    in Maverick (interleave_moe_layer_step 2: layers 1, 3, …), every layer in Scout; one
    shared expert of intermediate_size beside the routed ones, dense layers of
    intermediate_size_mlp; chunked attention priced only within one chunk."""
    mav = load_model(str(HERE / "llama4-maverick.json"))
    assert mav.moe_layer_pattern[:4] == (0, 1, 0, 1) and mav.num_moe_layers == 24
    assert (mav.num_experts, mav.moe_router_topk, mav.moe_ffn_hidden_size,
            mav.moe_shared_expert_intermediate_size, mav.ffn_hidden_size) == (
        128, 1, 8192, 8192, 16384)
    scout = load_model(str(HERE / "llama4-scout.json"))
    assert scout.moe_layer_freq == 1 and scout.num_experts == 16
    assert scout.attention_chunk_size == 8192 and scout.kv_channels == 128
    assert scout.with_seq_length(8192).seq_length == 8192
    with pytest.raises(InputError, match="attention_chunk_size"):
        scout.with_seq_length(16384)
    # an explicit moe_layers list wins over the step; a layer outside the model is an error
    cfg = json.loads((HERE / "llama4-maverick.json").read_text())
    cfg["text_config"]["moe_layers"] = [0, 47]
    assert from_hf_config(cfg).moe_layer_pattern == (1,) + (0,) * 46 + (1,)
    cfg["text_config"]["moe_layers"] = [48]
    with pytest.raises(InputError, match="moe_layers"):
        from_hf_config(cfg)
    with pytest.raises(InputError, match="text_config"):
        from_hf_config({"model_type": "llama4"})


def test_head_dim_rope_base_and_epsilon_reach_the_flags():
    nemo = load_model(str(HERE / "mistral-nemo-12b.json"))
    assert nemo.kv_channels == 128 and total_parameters(nemo) == pytest.approx(12.25e9,
                                                                              rel=1e-3)
    llama = load_model(str(HERE / "llama3-8b.json"))
    argv = flag_argv(megatron_flags(nemo, ParallelPlan(tp=8, global_batch_size=8)))
    assert argv[argv.index("--kv-channels") + 1] == "128"
    assert argv[argv.index("--rotary-base") + 1] == str(nemo.rotary_base)
    argv = flag_argv(megatron_flags(llama, ParallelPlan(global_batch_size=8)))
    assert argv[argv.index("--rotary-base") + 1] == "500000"
    ds = load_model(str(HERE / "deepseek-v3.json"))
    argv = flag_argv(megatron_flags(ds, ParallelPlan(ep=8, global_batch_size=8)))
    assert argv[argv.index("--moe-layer-freq") + 1] == "([0]*3+[1]*58)"
    assert argv[argv.index("--norm-epsilon") + 1] == "1e-06"
    assert "--multi-latent-attention" in argv and "--q-lora-rank" in argv


@pytest.mark.parametrize("change,field", [
    ({"num_local_experts": 8, "num_experts_per_tok": 2}, "num_local_experts"),  # llama type
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"moe_every_other_layer": True}, "moe_every_other_layer"),
    ({"sliding_window": 512, "layer_types": ["full_attention"] * 31 + ["sliding_attention"]},
     "layer_types"),
])
def test_unsupported_fields_are_errors_never_dropped(change, field):
    cfg = json.loads((HERE / "llama3-8b.json").read_text())
    cfg.update(change)
    with pytest.raises(InputError, match=field):
        from_hf_config(cfg)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b",
                                  "deepseek-v3", "gpt-oss-120b", "llama4-scout",
                                  "llama4-maverick"])
def test_moe_presets_are_their_hf_configs(name):
    from configurator.core.model_presets import MODEL_PRESETS
    preset = MODEL_PRESETS[name]
    hf = load_model(str(HERE / f"{name}.json")).with_seq_length(preset.seq_length)
    assert hf == preset and hf.attention_chunk_size == preset.attention_chunk_size
