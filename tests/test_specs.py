import json

import pytest

from configurator.core.errors import InputError
from configurator.core.model import swiglu_ffn_hidden_size
from configurator.core.model_presets import MODEL_PRESETS, load_model
from memory_model.params import total_parameters
from topology.cluster_files import CLUSTER_PRESETS, load_cluster


@pytest.mark.parametrize("name,billions", [
    ("gpt-1.7b", 1.7), ("gpt-3.6b", 3.6), ("gpt-7.5b", 7.5), ("gpt-18.4b", 18.4),
    ("gpt-39.1b", 39.1), ("gpt-76.1b", 76.1), ("gpt-145.6b", 145.6), ("gpt-310.1b", 310.1),
    ("gpt-529.6b", 529.6), ("gpt-1t", 1008.0), ("gpt3-175b", 174.6), ("llama2-7b", 6.74),
    ("llama2-13b", 13.02), ("llama2-70b", 68.98), ("llama3-8b", 8.03), ("llama3-70b", 70.55),
    ("llama3.1-405b", 405.85)])
def test_preset_parameter_counts_match_published_sizes(name, billions):
    # SC'21 Table 1 sizes (published to 0.1 B); Llama counts from the model cards (0.01 B).
    half_digit = 0.05 if name.startswith("gpt") else 0.005
    assert abs(total_parameters(MODEL_PRESETS[name]) / 1e9 - billions) <= half_digit + 1e-9


def test_swiglu_default_ffn_follows_megatron_rule():
    assert swiglu_ffn_hidden_size(4096) == int(8 * 4096 / 3 / 64) * 64 == 10880


def test_yaml_model_with_exact_keys(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("num_layers: 4\nhidden_size: 512\nnum_attention_heads: 8\n"
                 "num_query_groups: 2\nvocab_size: 1000\nseq_length: 256\nswiglu: true\n")
    m = load_model(str(f))
    assert (m.num_query_groups, m.ffn_hidden_size) == (2, swiglu_ffn_hidden_size(512))


def test_unknown_and_missing_model_keys(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("num_layers: 4\nhidden_size: 512\nnum_attention_heads: 8\nvocab_size: 10\n"
                 "seq_length: 8\nhiden: 3\n")
    with pytest.raises(InputError, match="model.hiden.*unknown key"):
        load_model(str(f))
    f.write_text("num_layers: 4\nhidden_size: 512\nvocab_size: 10\nseq_length: 8\n")
    with pytest.raises(InputError, match="num_attention_heads.*missing"):
        load_model(str(f))


def test_hf_llama_config(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
           "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 500000.0}
    d = tmp_path / "llama3-8b-local"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(d / "config.json"))
    ref = MODEL_PRESETS["llama3-8b"]
    for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
              "ffn_hidden_size", "vocab_size", "seq_length", "swiglu", "normalization",
              "untie_embeddings_and_output_weights", "add_bias_linear"):
        assert getattr(m, k) == getattr(ref, k), k


def test_hf_gpt2_config(tmp_path):
    cfg = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
           "n_positions": 1024, "vocab_size": 50257}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(tmp_path / "config.json"))
    assert (m.num_layers, m.ffn_hidden_size, m.normalization) == (12, 3072, "LayerNorm")
    assert total_parameters(m) == pytest.approx(124.4e6, rel=0.01)  # GPT-2 small, padded V


def test_cluster_presets_and_yaml(tmp_path):
    for name in CLUSTER_PRESETS:
        c = load_cluster(name, nodes=2)      # nodes count hosts (4-GPU trays on NVL72)
        assert c.num_gpus == 2 * CLUSTER_PRESETS[name]["gpus_per_node"]
    f = tmp_path / "c.yaml"
    f.write_text("gpu: {name: x, peak_tflops: {bf16: 100}, memory_GiB: 40, "
                 "hbm_bandwidth_GBps: 1000, num_sms: 64, "
                 "efficiency: {gemm: 0.7, hbm: 0.8, flash_attention: 0.5}}\n"
                 "gpus_per_node: 4\nnodes: 3\n"
                 "intra_node_bandwidth_GBps: 100\ninter_node_bandwidth_GBps: 10\n"
                 "intra_node_latency_us: 2\ninter_node_latency_us: 5\n")
    c = load_cluster(str(f))
    assert (c.num_gpus, c.gpu.memory_bytes) == (12, 40 * 2**30)
    assert (c.gpu.num_sms, c.gpu.efficiency.gemm, c.gpu.efficiency.gemm_fp8) == (64, 0.7, None)
    bw_intra, _ = c.link(0, 1)
    bw_inter, _ = c.link(0, 4)
    assert bw_intra > bw_inter == pytest.approx(10e9 * 0.94)
    with pytest.raises(InputError, match="precision.*fp8"):
        c.gpu.peak("fp8")


def _field_docstrings(cls) -> dict[str, str | None]:
    """Each annotated field of ``cls``'s class body and the string expression right below
    it (an attribute docstring), or None."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    out = {}
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            nxt = body[i + 1] if i + 1 < len(body) else None
            doc = (nxt.value.value if isinstance(nxt, ast.Expr)
                   and isinstance(nxt.value, ast.Constant)
                   and isinstance(nxt.value.value, str) else None)
            out[node.target.id] = doc
    return out


def test_every_model_field_has_its_own_docstring():
    """Every ModelSpec field is documented right below it, and says its Megatron argument
    (``--flag``) or ``TransformerConfig`` field, or that it is not a Megatron argument."""
    import dataclasses

    from configurator.core.model import MODEL_KEYS, ModelSpec

    docs = _field_docstrings(ModelSpec)
    assert list(docs) == [f.name for f in dataclasses.fields(ModelSpec)]
    assert set(docs) == set(MODEL_KEYS)
    missing = [k for k, d in docs.items() if not d or len(d.split()) < 8]
    assert not missing, f"fields without a docstring: {missing}"
    flat = {k: " ".join(d.split()) for k, d in docs.items()}
    silent = [k for k, d in flat.items() if "--" not in d and "TransformerConfig." not in d
              and "not a Megatron argument" not in d]
    assert not silent, f"fields that do not name their Megatron argument: {silent}"


def test_field_docstring_check_can_fail():
    """The parser above sees a field without a docstring."""
    from dataclasses import dataclass

    @dataclass
    class Two:
        a: int = 1
        """documented"""
        b: int = 2

    assert _field_docstrings(Two) == {"a": "documented", "b": None}
