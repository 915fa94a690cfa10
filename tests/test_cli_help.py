"""The CLI as a newcomer meets it: help that opens with examples and groups its options, one
spelling per option, "did you mean" for misspelt names and keys, errors that name the flag,
a bare ``configurator``, the examples that ship, and outputs that say what to do next
(``search``'s closing line, ``--out``'s start instructions, ``estimate --out`` then
``explain``, a stated default node count, an audit with nothing measured)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest

from configurator.cli import build_parser, main
from configurator.cli.commands import COMMANDS
from configurator.cli.options import GROUPS
from configurator.cli.reference import _subparsers, reference
from configurator.core.model_presets import MODEL_PRESETS, load_model
from configurator.core.validate import close_matches, did_you_mean, preset_name
from configurator.report.table import format_table
from configurator.search.rank import search
from tests.conftest import run_cli
from topology.cluster_files import CLUSTER_PRESETS, load_cluster

H100 = "dgx-h100-80gb"
ROOT = Path(__file__).resolve().parents[1]


def _every_parser():
    stack = [("configurator", build_parser())]
    while stack:
        name, p = stack.pop(0)
        yield name, p
        stack += [(f"{name} {n}", s) for n, s in _subparsers(p)]


# -- help -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,parser", list(_every_parser()), ids=lambda x: str(x)[:30])
def test_every_help_starts_with_examples_of_itself(name, parser):
    text = parser.format_help()
    lines = text.splitlines()
    assert lines[0] == "Examples:"
    examples = []
    for line in lines[1:]:
        if not line.strip():
            break
        examples.append(line.strip())
    assert 1 <= len(examples) <= 3
    # each example runs this command (the tool's own help: any command)
    assert all(e.startswith(name) for e in examples), examples
    # options come in the named groups, in their order; the integer-ranges footer is gone
    shown = [g for g in GROUPS if re.search(rf"^{g}:$", text, re.M)]
    assert [text.index(f"\n{g}:\n") for g in shown] == sorted(
        text.index(f"\n{g}:\n") for g in shown)
    assert "num_attention_heads 1..16,384" not in text and "%%" not in text


def test_search_and_estimate_help_group_their_options():
    for name in ("search", "estimate"):
        text = dict(_every_parser())[f"configurator {name}"].format_help()
        for group in ("model and cluster", "plan", "precision and kernels",
                      "topology and placement", "output"):
            assert f"\n{group}:\n" in text, (name, group)
        # --precision is a precision option, --tp a plan option, --out an output one
        sections = re.split(r"\n(?=[a-z ]+:\n)", text)
        where = {opt: next(s.split(":")[0] for s in sections if f"  {opt}" in s)
                 for opt in ("--precision", "--model", "--json", "--topology")}
        assert where == {"--precision": "precision and kernels", "--model": "model and cluster",
                         "--json": "output", "--topology": "topology and placement"}


def test_one_spelling_of_the_output_option():
    """Every command that writes a file takes ``-o`` and ``--out`` (never ``--output`` or
    ``--html``); ``--json`` and ``--force`` mean the same everywhere."""
    writers = 0
    for name, p in _every_parser():
        opts = {s for a in p._actions for s in a.option_strings}
        assert not opts & {"--output", "--html"}, name
        if "--out" in opts:
            writers += 1
            assert "-o" in opts, name
    assert writers >= 9


def test_docs_cli_reference_is_current():
    """docs/cli.md is the help of every command as the parsers print it (regenerate with
    ``python -m configurator.cli.reference > docs/cli.md``)."""
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == reference()


def test_bare_configurator_prints_usage_and_the_commands(capsys):
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert "usage: configurator" in out
    # every exit 2 says why on one stderr line
    assert err.count("\n") == 1 and err.startswith("configurator: error: a COMMAND")
    for cmd in COMMANDS:
        assert f"    {cmd.name}" in out


# -- did you mean ---------------------------------------------------------------------------

def test_close_matches_rank_prefixes_then_similar_names():
    assert close_matches("dgx-h100", CLUSTER_PRESETS)[0] == "dgx-h100-80gb"
    assert close_matches("lama3-70b", MODEL_PRESETS)[0] == "llama3-70b"
    assert close_matches("num_query_group", ["num_query_groups", "num_layers"]) == [
        "num_query_groups"]
    assert did_you_mean("zzzz", MODEL_PRESETS) == ""
    assert did_you_mean(3, MODEL_PRESETS) == ""
    assert preset_name("LLAMA3-70B", MODEL_PRESETS) == "llama3-70b"
    assert preset_name("llama3-70b ", MODEL_PRESETS) == "llama3-70b"
    assert preset_name("llama3", MODEL_PRESETS) is None


def test_preset_names_are_case_insensitive():
    assert load_model("llama3-70B") is MODEL_PRESETS["llama3-70b"]
    assert load_cluster("DGX-H100-80GB").name == "dgx-h100-80gb"
    res = run_cli("estimate", "--model", "llama3-70B", "--cluster", "DGX-H100-80gb", "--nodes",
                  "8", "--gbs", "64", "--tp", "8", "--pp", "4", "--mbs", "1", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["config"]["tp"] == 8


@pytest.mark.parametrize("args,needle", [
    (("--model", "lama3-70b", "--cluster", H100), "--model='lama3-70b': not a preset name nor "
                                                  "an existing file; did you mean 'llama3-70b'"),
    (("--model", "llama3-70b", "--cluster", "dgx-h100"), "--cluster='dgx-h100': not a preset "
                                                         "name nor an existing file; did you "
                                                         "mean 'dgx-h100-80gb'"),
])
def test_misspelt_presets_get_a_suggestion(args, needle):
    res = run_cli("estimate", *args, "--gbs", "64", "--tp", "8", "--pp", "1", "--mbs", "1")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert needle in res.stderr, res.stderr


def test_misspelt_keys_and_gpu_get_a_suggestion(tmp_path):
    model = tmp_path / "m.yaml"
    model.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 128\n"
                     "seq_length: 128\nnum_query_group: 2\n")
    res = run_cli("estimate", "--model", model, "--cluster", H100, "--gbs", "8", "--tp", "1",
                  "--pp", "1", "--mbs", "1")
    assert res.returncode == 2
    assert "model.num_query_group=2: unknown key; did you mean 'num_query_groups'?" \
        in res.stderr
    assert "allowed keys" not in res.stderr          # the suggestion, not 36 keys
    cluster = tmp_path / "c.yaml"
    cluster.write_text("gpu: h100\ngpus_per_node: 8\nnodes: 1\nintra_node_bandwidth_GBps: 450\n"
                       "inter_node_bandwidth_GBps: 50\nintra_node_latency_us: 3\n"
                       "inter_node_latency_us: 6\n")
    res = run_cli("estimate", "--model", "llama3-8b", "--cluster", cluster, "--gbs", "8",
                  "--tp", "1", "--pp", "1", "--mbs", "1")
    assert res.returncode == 2 and "did you mean 'h100-80gb'" in res.stderr, res.stderr
    # with no close name, the known keys are listed
    model.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 128\n"
                     "seq_length: 128\nzzz: 2\n")
    res = run_cli("estimate", "--model", model, "--cluster", H100, "--gbs", "8", "--tp", "1",
                  "--pp", "1", "--mbs", "1")
    assert "unknown key; allowed keys: " in res.stderr and "num_query_groups" in res.stderr


def test_misspelt_command_option_and_choice_get_a_suggestion():
    res = run_cli("serach")
    assert res.returncode == 2 and "did you mean 'search'?" in res.stderr
    res = run_cli("search", "--model", "llama3-8b", "--cluster", H100, "--gbs", "8",
                  "--seq-lenght", "4096")
    assert res.returncode == 2 and "did you mean '--seq-length'?" in res.stderr
    res = run_cli("search", "--model", "llama3-8b", "--cluster", H100, "--gbs", "8",
                  "--precision", "bf61")
    assert res.returncode == 2 and "did you mean 'bf16'?" in res.stderr


# -- errors name the flag -------------------------------------------------------------------

def test_errors_name_the_flag_and_every_missing_one(capsys):
    assert main(["probe"]) == 2
    assert "error: --nnodes, --nproc-per-node: required" in capsys.readouterr().err
    assert main(["search", "--model", "llama3-8b", "--cluster", H100, "--gbs", "8",
                 "--nodes", "0"]) == 2
    assert "error: --nodes=0: must be an integer" in capsys.readouterr().err
    assert main(["estimate", "--model", "llama3-8b", "--cluster", H100, "--gbs", "3",
                 "--tp", "1", "--pp", "1", "--mbs", "2", "--nodes", "1"]) == 2
    assert "error: --gbs=3:" in capsys.readouterr().err      # global_batch_size's flag
    with pytest.raises(SystemExit) as exc:                      # argparse: all at once
        main(["search"])
    assert exc.value.code == 2
    assert "--model, --cluster, --gbs" in capsys.readouterr().err
    # a field of a file keeps its name
    assert main(["explain", "nowhere.json", "nowhere.json"]) == 2
    assert "PLAN_A='nowhere.json'" in capsys.readouterr().err


# -- examples -------------------------------------------------------------------------------

def test_examples_list_copy_and_never_overwrite(tmp_path):
    from configurator.core.runs import load_runs
    from configurator.cost.groundtruth import published_runs

    res = run_cli("examples")
    assert res.returncode == 0 and "configurator examples --out DIR" in res.stdout
    assert run_cli("examples", "--out", tmp_path / "ex").returncode == 0
    ex = tmp_path / "ex"
    logs = ex / "h100-17node-nccl-tests"
    assert (logs / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "xxrjun/nccl-tests-cluster" in (logs / "README.md").read_text()
    assert len(list((logs / "logs").glob("nccl_N2_G*_cnode2-*.log"))) == 408
    # the files written from the tool's definitions read back as those definitions
    assert load_model(str(ex / "model-llama3-8b.yaml")) == MODEL_PRESETS["llama3-8b"]
    cl = load_cluster(str(ex / "cluster-dgx-h100.yaml"))
    assert (cl.num_nodes, cl.gpus_per_node, cl.gpu.name) == (4, 8, "h100-80gb")
    shipped, _ = published_runs()
    mine = load_runs(str(ex / "published-runs.csv"))
    assert [r.plan for r in mine] == [r.plan for r in shipped]
    assert all(r.source for r in mine)
    assert [r.name for r in mine] == [r.name for r in shipped]
    # once more: refused without --force, one line
    res = run_cli("examples", "--out", ex)
    assert res.returncode == 2 and "--force" in res.stderr
    assert run_cli("examples", "--out", ex, "--force").returncode == 0


# -- outputs --------------------------------------------------------------------------------

def test_search_ends_with_the_next_step_and_its_estimate_reproduces_plan_1():
    args = ("search", "--model", "llama3-8b", "--cluster", H100, "--nodes", "2", "--gbs", "128",
            "--precision", "fp8", "--top", "3")
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("next: --out DIR writes plan 1's launch scripts")
    command = shlex.split(last.split("plan 1 in detail: ", 1)[1])
    assert command[:2] == ["configurator", "estimate"] and "--precision" in command
    best = json.loads(run_cli(*args, "--json").stdout)["plans"][0]
    est = run_cli(*command[1:], "--json")
    assert est.returncode == 0, est.stderr
    est = json.loads(est.stdout)
    assert est["config"] == best["config"]
    assert est["iteration_time_s"] == pytest.approx(best["iteration_time_s"], rel=1e-9)


def test_search_out_says_how_to_start_the_job(tmp_path):
    out = tmp_path / "plan"
    res = run_cli("search", "--model", "llama3-8b", "--cluster", H100, "--nodes", "2", "--gbs",
                  "128", "--out", out)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert f"MEGATRON_LM_DIR=/path/to/Megatron-LM sbatch {out}/launch_slurm.sbatch" in text
    assert "NODE_RANK 0..1" in text and "MASTER_ADDR=" in text
    assert "--mock-data for 100 iterations" in text and "--data-path PREFIX" in text
    assert f"configurator explain {out}/plans.json:1 {out}/plans.json:2" in text
    # the search JSON (plans.json) names its model and cluster: an entry is a plan
    doc = json.loads((out / "plans.json").read_text())
    assert doc["model"]["name"] == "llama3-8b" and doc["cluster"]["nodes"] == 2


def test_estimate_out_then_explain_and_launch(tmp_path):
    mine = tmp_path / "mine.json"
    res = run_cli("estimate", "--model", "llama3-8b", "--cluster", H100, "--nodes", "2", "--gbs",
                  "128", "--tp", "2", "--pp", "1", "--mbs", "1", "--out", mine)
    assert res.returncode == 0, res.stderr
    assert f"configurator explain {mine} OTHER.json" in res.stdout
    doc = json.loads(mine.read_text())
    assert doc["plan"]["tp"] == 2 and doc["estimate"]["config"]["tp"] == 2
    again = run_cli("estimate", "--model", "llama3-8b", "--cluster", H100, "--nodes", "2",
                    "--gbs", "128", "--tp", "2", "--pp", "1", "--mbs", "1", "--out", mine)
    assert again.returncode == 2 and "--force" in again.stderr          # never overwritten
    out = tmp_path / "plan"
    assert run_cli("search", "--model", "llama3-8b", "--cluster", H100, "--nodes", "2", "--gbs",
                   "128", "--out", out).returncode == 0
    ex = run_cli("explain", mine, f"{out}/plans.json:1")
    assert ex.returncode == 0, ex.stderr
    lines = ex.stdout.splitlines()
    best = json.loads((out / "plans.json").read_text())["plans"][0]["iteration_time_s"]
    mine_s = doc["estimate"]["iteration_time_s"]
    fast, slow = ("B", "A") if best < mine_s else ("A", "B")
    assert re.match(rf"{fast} is \d+\.\d % faster than {slow}: ", lines[0]), lines[0]
    assert lines[1].startswith("Most of the difference (B - A): ")
    assert "memory (GiB)" in ex.stdout and "  peak_memory " in ex.stdout
    assert "peak_memory_bytes" not in ex.stdout
    assert "schedule_and_placement: a correction, not a cost" in ex.stdout
    js = json.loads(run_cli("explain", mine, f"{out}/plans.json:1", "--json").stdout)
    assert js["headline"].startswith(f"{fast} is ") and "schedule_and_placement" in js["terms"]
    # an entry of plans.json is a plan document launch reads too
    assert run_cli("launch", "--plan", mine, "--out", tmp_path / "run").returncode == 0
    for bad, words in ((f"{out}/plans.json", "name one as"),
                       (f"{out}/plans.json:99", "holds plans 1.."),
                       (f"{mine}:1", "is a plan document, not a plans.json")):
        res = run_cli("explain", bad, mine)
        assert res.returncode == 2 and words in res.stderr, res.stderr


def test_a_defaulted_node_count_is_stated():
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--gbs", "64",
                  "--top", "1")
    assert res.returncode == 0, res.stderr
    assert "(16 nodes: the cluster's default; --nodes N to change)" in res.stdout.splitlines()[0]
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--gbs", "64",
                  "--nodes", "2", "--top", "1")
    assert "cluster's default" not in res.stdout
    # and said again when no plan fits on the defaulted count
    res = run_cli("search", "--model", "gpt-1t", "--cluster", "dgx-h100-80gb", "--gbs", "128")
    assert res.returncode == 3 and "the cluster's default" in res.stderr, res.stderr


def test_the_table_tells_two_plans_apart():
    """Plans that differ only in the distributed optimizer read apart: the column is always
    there (tests/test_report_table.py: no column is left out to make room)."""
    res = search(MODEL_PRESETS["gpt-1.7b"], load_cluster("dgx-a100-80gb", nodes=4), 512,
                 top_k=2)
    a = res.plans[0]
    b = dataclasses.replace(a, plan=dataclasses.replace(a.plan, distributed_optimizer=not
                                                        a.plan.distributed_optimizer))
    told = format_table([a, b]).splitlines()
    assert "dist-" in told[0] and "opt" in told[1]
    assert told[3] != told[4] and {told[3].split()[9], told[4].split()[9]} == {"yes", "no"}
    assert max(map(len, told)) <= 100


def test_an_audit_with_nothing_measured_says_measure_first(tmp_path):
    topo = tmp_path / "t.yaml"
    topo.write_text("format: configurator-topology\nversion: 1\nhosts: [a, b]\n"
                    "gpus_per_host: 8\nlinks: []\n")
    res = run_cli("audit", "--topology", topo)
    assert res.returncode == 0, res.stderr
    assert "0 measured links" in res.stdout
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("Recommendation: Measure first") and "No action" not in last


def test_the_examples_run_file_validates_as_the_published_runs(tmp_path):
    """``validate published-runs.csv`` (as ``examples`` writes it) prices every row, and
    each one as plain ``validate`` does: models that are no preset (``gpt-22b``) or a
    preset changed (DeepSeek-V3 without its MTP layer) come as model files beside it."""
    from configurator.app.validate_jobs import load_run_files, validate_runs
    from configurator.cost.groundtruth import published_runs

    assert run_cli("examples", "--out", tmp_path / "ex").returncode == 0
    mine, _ = load_run_files([str(tmp_path / "ex" / "published-runs.csv")])
    shipped, _ = published_runs()
    got, want = validate_runs(mine), validate_runs(shipped)
    assert [c.problem for c in got.checks if c.problem] == []
    assert len(got.checks) == len(want.checks) == len(shipped)
    for a, b in zip(got.checks, want.checks):
        assert a.run.name == b.run.name
        assert a.predicted_iteration_time_s == pytest.approx(b.predicted_iteration_time_s,
                                                             rel=1e-12), a.run.name
        assert a.predicted_peak_memory_bytes == b.predicted_peak_memory_bytes
        assert a.measured_iteration_time_s == pytest.approx(b.measured_iteration_time_s,
                                                            rel=1e-12)
    assert got.overall.mape == pytest.approx(want.overall.mape, rel=1e-12)
