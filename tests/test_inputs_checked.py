"""A user's own inputs, taken as they come: a Hugging Face config planned at its stated
pretraining length, ``plan`` on any set of measured hosts, measurements checked before they
are trusted (each bad one: exit 2, one stderr line naming the file and the rule, nothing
written; with and without ``--cluster``/``--nodes``), and numbers written the usual way
(``1e-06``, ``2e12``) read as numbers."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from configurator.cli import main
from configurator.core.errors import InputError
from configurator.core.hf_import import pretraining_seq_length
from configurator.core.model_presets import MODEL_PRESETS, load_model
from configurator.data import EXAMPLES, data_path

HF = Path(__file__).parent / "data" / "hf_configs"
LOGS = data_path(EXAMPLES, "h100-17node-nccl-tests") / "logs"
#: meta-llama/Llama-3.1-8B config.json (model card; max_position_embeddings 131072, the
#: llama3 RoPE scaling of the 128k context)
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192,
                                             "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256}
SEARCH = ["--cluster", "dgx-h100-80gb", "--nodes", "2", "--gbs", "128"]


def cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as stop:      # argparse refusing an option
            code = stop.code
    return code, out.getvalue(), err.getvalue()


def refused(*args, needles=(), forbidden=()) -> str:
    """Run; assert exit 2 with exactly one stderr line holding every needle."""
    code, _, err = cli(*args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    for n in forbidden:
        assert n not in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def llama31(tmp_path):
    path = tmp_path / "llama31-8b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA31_8B))
    return path


# -- 1. sequence length of a Hugging Face config -------------------------------------------

def test_hf_config_is_planned_at_its_pretraining_length_and_says_why(llama31):
    code, out, err = cli("search", "--model", llama31, *SEARCH)
    assert code == 0, err
    first = out.splitlines()[0]
    assert "seq 8192 (pretraining length of Llama 3" in first
    assert "arXiv:2407.21783" in first and "max context 131072" in first
    assert "--seq-length to change" in first
    code, out, _ = cli("estimate", "--model", llama31, *SEARCH, "--tp", "2", "--pp", "1",
                       "--mbs", "1")
    assert code == 0 and "seq 8192 (pretraining length of Llama 3" in out.splitlines()[0]
    code, out, _ = cli("search", "--model", llama31, *SEARCH, "--json")
    model = json.loads(out)["model"]
    assert (model["seq_length"], model["max_position_embeddings"]) == (8192, 131072)
    assert "Llama 3 paper" in model["seq_length_source"]


def test_hf_config_at_8192_gives_the_llama3_8b_presets_answer(llama31):
    def plans(model, *extra):
        code, out, err = cli("search", "--model", model, *SEARCH, "--json", *extra)
        assert code == 0, err
        return json.loads(out)["plans"]

    preset = plans("llama3-8b")
    assert plans(llama31, "--seq-length", "8192") == preset
    assert plans(llama31) == preset          # the stated default is that length
    code, out, _ = cli("search", "--model", llama31, *SEARCH, "--seq-length", "8192")
    assert "seq 8192 (--seq-length; max context 131072)" in out.splitlines()[0]


def test_the_maximum_context_is_the_upper_bound_checked(llama31, tmp_path):
    refused("search", "--model", llama31, *SEARCH, "--seq-length", "131073",
            needles=("--seq-length=131073", "max_position_embeddings (131072"))
    code, out, _ = cli("search", "--model", llama31, *SEARCH, "--seq-length", "131072")
    assert code in (0, 3)          # allowed (it may not fit two nodes)
    m = tmp_path / "m.yaml"
    m.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 128\n"
                 "seq_length: 4096\nmax_position_embeddings: 2048\n")
    with pytest.raises(InputError, match="max_position_embeddings"):
        load_model(str(m))


@pytest.mark.parametrize("file,seq,word", [
    ("llama3-8b.json", 8192, "Llama 3"), ("llama3-70b.json", 8192, "Llama 3"),
    ("mixtral-8x7b.json", 32768, "Mixtral paper"), ("qwen3-30b-a3b.json", 4096, "Qwen3"),
    ("qwen2-57b-a14b.json", 4096, "Qwen2"), ("deepseek-v3.json", 4096, "DeepSeek-V3"),
    ("gpt-oss-120b.json", 4096, "no published pretraining length"),
    ("mistral-nemo-12b.json", 4096, "no published pretraining length")])
def test_each_family_has_its_cited_length(file, seq, word):
    model = load_model(str(HF / file))
    assert model.seq_length == seq and word in model.seq_length_source
    assert model.seq_length <= model.max_position_embeddings


def test_a_length_above_the_context_is_capped_at_the_context():
    llama2 = dict(LLAMA31_8B, vocab_size=32000, rope_theta=10000.0, rope_scaling=None,
                  max_position_embeddings=4096)
    assert pretraining_seq_length(llama2, 4096) == (
        4096, "pretraining length of Llama 2, Llama 2 paper, arXiv:2307.09288 §2.2")
    seq, why = pretraining_seq_length(dict(llama2, max_position_embeddings=2048), 2048)
    assert seq == 2048 and why.startswith("the config's maximum context, below the 4096")


def test_presets_and_megatron_files_keep_their_documents():
    d = MODEL_PRESETS["llama3-8b"].to_dict()
    assert "seq_length_source" not in d and "max_position_embeddings" not in d
    assert MODEL_PRESETS["llama3-8b"].seq_length_note == ""


# -- 2. plan on any measured host set ------------------------------------------------------

def star_logs(tmp_path, n_partners: int) -> Path:
    """nccl-tests logs of cnode2-001 with each of cnode2-002..: ``n_partners + 1`` hosts."""
    d = tmp_path / "logs"
    d.mkdir()
    for i in range(2, n_partners + 2):
        shutil.copy(LOGS / f"nccl_N2_G8_cnode2-001_cnode2-{i:03d}.log", d)
    return d


def test_plan_uses_the_most_measured_hosts_that_have_a_legal_layout(tmp_path):
    logs = star_logs(tmp_path, 12)          # 13 hosts, 104 GPUs: no layout for gbs 128
    code, out, err = cli("plan", "--model", "llama3-8b", "--gbs", "128", "--logs", logs,
                         "--out", tmp_path / "o", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"][0].startswith("llama3-8b on 12 of 13 measured hosts")
    assert doc["plan"]["tp"] * doc["plan"]["pp"] * doc["plan"]["dp"] * doc["plan"]["cp"] == 96
    left = [ln for ln in doc["summary"] if ln.startswith("left out ")]
    assert len(left) == 1 and "no legal layout of all 13 hosts (104 GPUs)" in left[0]
    assert "--nodes N" in left[0]


def test_search_on_a_measured_topology_does_the_same(tmp_path):
    topo = tmp_path / "t.json"
    assert cli("topology", "import", star_logs(tmp_path, 12), "-o", topo)[0] == 0
    code, out, err = cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb",
                         "--gbs", "128", "--topology", topo)
    assert code == 0, err
    assert out.startswith("llama3-8b on 12x8 h100-80gb (no legal layout of all 13 hosts")


def test_no_count_of_hosts_with_a_layout_names_gbs(monkeypatch):
    import configurator.app.plan_jobs as jobs

    def never(*a, **kw):
        raise InputError("global_batch_size", 128, "no legal plan: no layout")

    monkeypatch.setattr(jobs, "ranked_search", never)
    monkeypatch.setattr(jobs, "host_pool", lambda *a, **kw: (list(range(3)), 3, []))
    req = type("R", (), {"inputs": type("I", (), {"topology": "t.json"})(),
                         "global_batch_size": 128})()
    cluster = type("C", (), {"gpus_per_node": 8})()
    with pytest.raises(InputError, match=r"no legal plan on any 1\.\.3 of the measured hosts"
                                         r".*another --gbs gives one"):
        jobs.search_on_fewer_hosts(req, None, cluster, None, 1, nodes=None)
    with pytest.raises(InputError, match="no layout"):     # --nodes given: as it was
        jobs.search_on_fewer_hosts(req, None, cluster, None, 1, nodes=3)


def test_no_layout_error_names_the_flags_that_give_one():
    refused("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "13",
            "--gbs", "128", needles=("--gbs=128", "no legal plan", "--nodes"))


# -- 3. measurements checked before they are trusted ---------------------------------------

def truncated_log(tmp_path) -> Path:
    """A real log cut before its first data row (a run that hung during setup)."""
    text = (LOGS / "nccl_N2_G8_cnode2-001_cnode2-002.log").read_text().splitlines()
    cut = next(i for i, ln in enumerate(text) if ln.strip() and not ln.startswith("#"))
    path = tmp_path / "truncated.log"
    path.write_text("\n".join(text[:cut]) + "\n")
    return path


WITH_AND_WITHOUT = [[], ["--cluster", "dgx-h100-80gb", "--nodes", "2"]]


@pytest.mark.parametrize("extra", WITH_AND_WITHOUT, ids=["bare", "cluster-nodes"])
@pytest.mark.parametrize("kind", ["truncated", "section-only", "not-a-log"])
def test_files_that_measure_nothing_are_refused(tmp_path, kind, extra):
    if kind == "truncated":
        path = truncated_log(tmp_path)
        needles = ("truncated.log", "line 25", "no data rows", "no link or collective")
    elif kind == "section-only":
        path = tmp_path / "head.log"
        path.write_text("# nccl-tests version 2.17.6\n#\n")
        needles = ("head.log", "line 2", "no nccl-tests section found")
    else:
        path = tmp_path / "notes.log"
        path.write_text("the cluster was slow yesterday\nrerun tomorrow\n")
        needles = ("notes.log", "not an nccl-tests log")
    out = tmp_path / "o"
    line = refused("plan", "--model", "llama3-8b", "--gbs", "128", "--logs", path,
                   "--out", out, *extra, needles=needles,
                   forbidden=("--nodes=0", "--cluster: required"))
    assert not out.exists(), line
    refused("topology", "import", path, "-o", tmp_path / "t.json", needles=needles)
    assert not (tmp_path / "t.json").exists()


def test_a_set_with_some_empty_logs_is_kept(tmp_path):
    logs = star_logs(tmp_path, 4)
    shutil.copy(truncated_log(tmp_path), logs / "nccl_N2_G8_cnode2-001_cnode2-009.log")
    code, _, err = cli("topology", "import", logs, "-o", tmp_path / "t.json")
    assert code == 0, err            # the hung pair is a finding, not a broken input


@pytest.mark.parametrize("extra", [[], ["--nodes", "1"]], ids=["bare", "nodes"])
def test_a_topology_with_no_host_is_refused(tmp_path, extra):
    topo = tmp_path / "empty.yaml"
    topo.write_text("hosts: []\nlinks: []\n")
    refused("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gbs", "64",
            "--topology", topo, *extra, needles=("topology.hosts=[]", "at least one host"))
    out = tmp_path / "o"
    refused("plan", "--model", "llama3-8b", "--gbs", "64", "--topology", topo, "--out", out,
            "--cluster", "dgx-h100-80gb", *extra, needles=("at least one host",))
    assert not out.exists()


def test_a_log_given_as_a_topology_says_what_it_is(tmp_path):
    refused("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gbs", "64",
            "--topology", LOGS / "nccl_N2_G8_cnode2-001_cnode2-002.log",
            needles=("--topology=", "is nccl-tests output", "topology import"))


@pytest.mark.parametrize("extra", [[], ["--nodes", "2"]], ids=["bare", "nodes"])
def test_a_cluster_of_another_gpu_than_the_measured_one_is_refused(tmp_path, extra):
    logs = star_logs(tmp_path, 3)
    topo = tmp_path / "topo.json"
    assert cli("topology", "import", logs, "-o", topo)[0] == 0
    refused("search", "--model", "llama3-8b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
            "--topology", topo, *extra,
            needles=("--cluster='dgx-a100-80gb'", "a100-80gb", "NVIDIA H100 80GB HBM3",
                     "h100-80gb"))
    out = tmp_path / "o"
    refused("plan", "--model", "llama3-8b", "--gbs", "64", "--logs", logs, "--out", out,
            "--cluster", "dgx-a100-80gb", *extra, needles=("--cluster=", "h100-80gb"))
    assert not out.exists()
    assert cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gbs", "64",
               "--topology", topo, *extra)[0] == 0


def test_coverage_too_thin_to_audit_is_a_warning_never_no_finding(tmp_path):
    logs = star_logs(tmp_path, 1)           # two hosts, one pair
    code, out, err = cli("plan", "--model", "llama3-8b", "--gbs", "128", "--logs", logs,
                         "--out", tmp_path / "o")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1] == "audit: not audited (coverage too thin)"
    assert lines[2].startswith("warning: coverage too thin to audit 2 of 2 hosts")
    assert "no finding" not in out
    code, out, _ = cli("plan", "--model", "llama3-8b", "--gbs", "128", "--logs", logs,
                       "--out", tmp_path / "o", "--force", "--json")
    assert json.loads(out)["warnings"][0].startswith("coverage too thin")
    audit = json.loads((tmp_path / "o" / "audit.json").read_text())
    assert audit["unaudited_hosts"] == ["cnode2-001", "cnode2-002"]


def test_thin_coverage_names_the_hosts_with_too_few_partners():
    from topology.audit import thin_coverage
    from topology.importers import import_paths

    star = import_paths([LOGS / f"nccl_N2_G8_cnode2-001_cnode2-{i:03d}.log"
                         for i in range(2, 6)])
    assert thin_coverage(star, 3) == ("cnode2-002", "cnode2-003", "cnode2-004", "cnode2-005")
    full = import_paths([LOGS / f"nccl_N2_G8_cnode2-{a:03d}_cnode2-{b:03d}.log"
                         for a in range(1, 6) for b in range(a + 1, 6)])
    assert set(full.hosts) == {f"cnode2-{i:03d}" for i in range(1, 6)}
    assert thin_coverage(full, 3) == ()      # every host measured with its 4 partners


# -- numbers written the usual way ---------------------------------------------------------

def test_scientific_notation_is_a_number_in_yaml(tmp_path):
    m = tmp_path / "m.yaml"
    m.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 128\n"
                 "seq_length: 32\nnorm_epsilon: 1e-06\n")
    assert load_model(str(m)).norm_epsilon == 1e-6
    c = tmp_path / "c.yaml"
    c.write_text("gpu: h100-80gb\ngpus_per_node: 8\nnodes: 1\nintra_node_bandwidth_GBps: 4.5e2\n"
                 "inter_node_bandwidth_GBps: 25\nintra_node_latency_us: 3e0\n"
                 "inter_node_latency_us: 8\n")
    code, out, err = cli("search", "--model", m, "--cluster", c, "--gbs", "8", "--json")
    assert code == 0, err


def test_yaml_numbers_follow_yaml_1_2():
    from configurator.core.validate import load_yaml

    doc = load_yaml("a: 1e-06\nb: 2E12\nc: -3.5e+2\nd: .5\ne: '1e-06'\nf: 1e5x\ng: .\nh: 12\n")
    assert doc == {"a": 1e-06, "b": 2e12, "c": -350.0, "d": 0.5, "e": "1e-06", "f": "1e5x",
                   "g": ".", "h": 12}


def test_integers_on_the_command_line_and_in_csv_take_scientific_notation():
    from configurator.core.runs import run_from_mapping
    from configurator.core.validate import integer_text

    assert [integer_text(t) for t in ("128", "2e3", "1.28e2", "+5", "1.5", "1e-3", "x")] == [
        128, 2000, 128, 5, None, None, None]
    a = cli("search", "--model", "llama3-8b", *SEARCH[:4], "--gbs", "1.28e2", "--json")
    b = cli("search", "--model", "llama3-8b", *SEARCH, "--json")
    assert a[0] == 0 and json.loads(a[1])["plans"] == json.loads(b[1])["plans"]
    refused("search", "--model", "llama3-8b", *SEARCH[:4], "--gbs", "1.5",
            needles=("--gbs", "'1.5'", "must be an integer"))
    run = run_from_mapping({"model": "llama3-8b", "cluster": "dgx-h100-80gb",
                            "num_gpus": "1.6e1", "tp": "2", "pp": "1", "mbs": "1",
                            "gbs": "1.28e2", "precision": "bf16", "iteration_time_s": "7e0"})
    assert (run.num_gpus, run.plan.global_batch_size, run.plan.dp) == (16, 128, 8)


# -- what the fuzz bench found -------------------------------------------------------------

@pytest.mark.parametrize("value", [5e-324, 1e-320, 1e-4, 0.0, float("nan")])
def test_a_gpu_efficiency_below_the_physical_bound_is_one_line(tmp_path, value):
    c = tmp_path / "c.json"
    c.write_text(json.dumps({
        "name": "sub", "gpus_per_node": 8, "nodes": 1, "intra_node_bandwidth_GBps": 300,
        "inter_node_bandwidth_GBps": 25, "intra_node_latency_us": 3,
        "inter_node_latency_us": 8,
        "gpu": {"name": "my-gpu", "peak_tflops": {"bf16": 312}, "memory_GiB": 80,
                "hbm_bandwidth_GBps": 2039, "num_sms": 108,
                "efficiency": {"gemm": value, "hbm": 0.83, "flash_attention": 0.55}}}))
    refused("search", "--model", "gpt-1.7b", "--cluster", c, "--gbs", "64",
            needles=("gpu.efficiency.gemm=", "must be an efficiency in [0.001, 1]"))


def test_link_and_calibration_efficiencies_have_the_same_bound(tmp_path):
    from topology.calibration import calibration_from_dict
    from topology.cluster_files import cluster_from_config

    with pytest.raises(InputError, match="inter_node_efficiency=1e-05: must be an efficiency"):
        cluster_from_config({"gpu": "h100-80gb", "gpus_per_node": 8, "nodes": 1,
                             "intra_node_bandwidth_GBps": 300, "inter_node_bandwidth_GBps": 25,
                             "intra_node_latency_us": 3, "inter_node_latency_us": 8,
                             "inter_node_efficiency": 1e-5})
    with pytest.raises(InputError, match="gemm=5e-324: must be an efficiency"):
        calibration_from_dict({"format": "configurator-calibration/1",
                               "gpus": {"h100-80gb": {"bf16": {"gemm": 5e-324}}}})
