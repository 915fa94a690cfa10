"""Bad input: exit code 2 and one line naming field, value and rule; never a traceback."""

import json

import pytest

from tests.conftest import run_cli

BASE = ["estimate", "--cluster", "dgx-a100-80gb", "--nodes", "2", "--gbs", "64", "--mbs", "1"]


def check_error(res, *needles, code=2):
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_model_preset():
    check_error(run_cli(*BASE, "--model", "gpt-9000", "--tp", "1", "--pp", "1"),
                "model", "gpt-9000", "preset")


def test_unknown_cluster_preset():
    check_error(run_cli("search", "--model", "gpt-1.7b", "--cluster", "dgx-z", "--gbs", "8"),
                "cluster", "dgx-z")


def test_unknown_yaml_key(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nvocab_size: 128\n"
                 "seq_length: 32\nlayers: 3\n")
    check_error(run_cli(*BASE, "--model", f, "--tp", "1", "--pp", "1"), "layers", "unknown key")


def test_missing_yaml_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("gpu: a100-80gb\ngpus_per_node: 8\nnodes: 2\n")
    check_error(run_cli("search", "--model", "gpt-1.7b", "--cluster", f, "--gbs", "8"),
                "intra_node_bandwidth_GBps", "missing")


def test_tp_not_dividing_heads():
    check_error(run_cli(*BASE, "--model", "gpt-1.7b", "--tp", "16", "--pp", "1"),
                "tp=16", "num_attention_heads (24)")


def test_gpus_not_divisible():
    check_error(run_cli(*BASE, "--model", "gpt-1.7b", "--tp", "3", "--pp", "1"),
                "tp(3) * pp(1) * cp(1) = 3 does not divide 16 GPUs")


def test_search_restrictions_no_plan_meets_names_them():
    """A restriction no legal plan meets is named, not blamed on the batch; one a plan meets
    is kept by every plan shown."""
    search = ["search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "2",
              "--gbs", "64"]
    check_error(run_cli(*search, "--tp", "16"), "--tp=16", "has tp 16", "widen")
    check_error(run_cli(*search, "--tp", "8", "--pp", "2", "--dp", "2"), "--tp=8",
                "has tp 8, pp 2, dp 2")
    check_error(run_cli(*search, "--dp", "0"), "--dp=0", "1..")
    res = run_cli(*search, "--tp", "2", "4", "--mbs", "2", "--no-sequence-parallel",
                  "--top", "50", "--json")
    assert res.returncode == 0, res.stderr
    plans = [p["config"] for p in json.loads(res.stdout)["plans"]]
    assert {(c["tp"], c["mbs"], c["sequence_parallel"]) for c in plans} == {
        (2, 2, False), (4, 2, False)}


def test_gbs_not_divisible():
    check_error(run_cli("estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                        "--nodes", "2", "--tp", "1", "--pp", "1", "--mbs", "4", "--gbs", "65"),
                "--gbs=65", "divisible")


@pytest.mark.parametrize("flag,value", [("--nodes", "0"), ("--gbs", "-8"), ("--mbs", "0"),
                                        ("--tp", "-1"), ("--nodes", "1000000"),
                                        ("--gbs", str(2**63)), ("--mbs", "99999999999")])
def test_out_of_range_integers(flag, value):
    args = {"--nodes": "2", "--gbs": "64", "--mbs": "1", "--tp": "1"}
    args[flag] = value
    res = run_cli("estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--pp", "1",
                  *[x for kv in args.items() for x in kv])
    check_error(res, flag.lstrip("-").replace("-", "_") if flag != "--mbs" else "mbs",
                "must be an integer in 1..")


def test_malformed_yaml_and_json(tmp_path):
    y = tmp_path / "bad.yaml"
    y.write_text("num_layers: [1, 2\nhidden: {")
    check_error(run_cli(*BASE, "--model", y, "--tp", "1", "--pp", "1"), "malformed")
    j = tmp_path / "bad.json"
    j.write_text('{"num_layers": 2,,}')
    check_error(run_cli("search", "--model", "gpt-1.7b", "--cluster", j, "--gbs", "8"),
                "malformed")


def test_non_integer_argument():
    check_error(run_cli(*BASE, "--model", "gpt-1.7b", "--tp", "two", "--pp", "1"), "--tp")


def test_fp8_on_a100_is_bad_input():
    check_error(run_cli(*BASE, "--model", "gpt-1.7b", "--tp", "1", "--pp", "1",
                        "--precision", "fp8"), "precision", "fp8")


def test_no_feasible_plan_exit_3():
    res = run_cli("search", "--model", "gpt-1t", "--cluster", "dgx-a100-80gb", "--nodes", "1",
                  "--gbs", "8")
    check_error(res, "smallest peak memory", "GiB > capacity", code=3)


def test_internal_error_is_one_line_and_debug_shows_it(monkeypatch, capsys):
    import configurator.cli.plan_commands as pc
    from configurator.cli import main

    def boom(req):
        raise KeyError("a\nb")

    monkeypatch.setattr(pc, "estimate_job", boom)
    argv = ["estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
            "--gbs", "8", "--tp", "1", "--pp", "1", "--mbs", "1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: KeyError" in err, err
    monkeypatch.setenv("CONFIGURATOR_DEBUG", "1")
    with pytest.raises(KeyError):
        main(argv)


def test_yaml_alias_bomb_is_refused_fast(tmp_path):
    f = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, "
              f"*a{i-1}, *a{i-1}, *a{i-1}]" for i in range(1, 9)]
    f.write_text("\n".join(lines) + "\n")
    check_error(run_cli("search", "--model", f, "--cluster", "dgx-a100-80gb", "--gbs", "8",
                        timeout=20), "aliases", "not allowed")


def test_non_string_keys_and_long_values(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("1: 2\nnum_layers: 2\n")
    check_error(run_cli(*BASE, "--model", f, "--tp", "1", "--pp", "1"), "keys must be strings")
    g = tmp_path / "n.yaml"
    g.write_text("name: " + "x" * 5000 + "\nnum_layers: 2\nhidden_size: 64\n"
                 "num_attention_heads: 4\nvocab_size: 128\nseq_length: 32\n")
    res = run_cli(*BASE, "--model", g, "--tp", "1", "--pp", "1")
    check_error(res, "name=")
    assert len(res.stderr) < 400, res.stderr


def test_undecodable_out_path_is_printed_escaped(tmp_path):
    import os
    import subprocess
    import sys

    src = tmp_path / "s"
    assert run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "1",
                   "--gbs", "16", "--out", src).returncode == 0
    out = os.fsencode(tmp_path) + b"/x\xff"
    res = subprocess.run([sys.executable, "-m", "configurator", "launch", "--plan",
                          os.fsencode(src / "plan.json"), "--out", out],
                         capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert b"Traceback" not in res.stderr and b"\\udcff" in res.stdout
