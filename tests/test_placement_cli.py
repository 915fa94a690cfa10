"""The placement through the CLI: node choice on a measured topology, placement objects in
``search --json``, ``estimate --placement``, ``--nodes-range`` and ``explain``."""

import json

import pytest

from tests.conftest import run_cli

H100 = "dgx-h100-80gb"


@pytest.fixture(scope="module")
def topo(tmp_path_factory):
    from tests.conftest import REAL_CLUSTER

    out = tmp_path_factory.mktemp("topo") / "topo.json"
    res = run_cli("topology", "import", REAL_CLUSTER, "-o", out)
    assert res.returncode == 0, res.stderr
    return out


def test_nodes_beyond_the_topology_is_an_error(topo):
    res = run_cli("search", "--model", "llama3-8b", "--cluster", H100, "--gbs", "256",
                  "--topology", topo, "--nodes", "18")
    assert res.returncode == 2
    assert "nodes" in res.stderr and "17 hosts" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_search_json_places_every_plan(topo):
    res = run_cli("search", "--model", "llama3-8b", "--cluster", H100, "--gbs", "256",
                  "--topology", topo, "--nodes", "16", "--top", "3", "--json",
                  "--placement-time-s", "0.3", timeout=300)
    assert res.returncode == 0, res.stderr
    plans = json.loads(res.stdout)["plans"]
    assert len(plans) == 3
    times = [p["iteration_time_s"] for p in plans]
    assert times == sorted(times)
    for p in plans:
        pl = p["placement"]
        assert {"hosts", "gpu_order", "excluded_hosts", "iteration_time_s",
                "default_iteration_time_s", "random_median_iteration_time_s"} <= set(pl)
        assert len(pl["hosts"]) == len(set(pl["hosts"])) == 16
        assert len(pl["excluded_hosts"]) == 1
        assert all(sorted(o) == list(range(8)) for o in pl["gpu_order"])
        assert pl["iteration_time_s"] <= pl["default_iteration_time_s"]
        assert p["iteration_time_s"] == pytest.approx(pl["iteration_time_s"])
        assert sum(p["time_breakdown_s"].values()) == pytest.approx(p["iteration_time_s"])


def test_estimate_placement_default_optimized_and_file(topo, tmp_path):
    args = ["estimate", "--model", "llama3-8b", "--cluster", H100, "--gbs", "128", "--tp",
            "2", "--pp", "4", "--mbs", "1", "--topology", topo, "--nodes", "16", "--json"]
    default = run_cli(*args, timeout=300)
    opt = run_cli(*args, "--placement", "optimized", "--placement-time-s", "0.5",
                  timeout=300)
    assert default.returncode == 0 and opt.returncode == 0, default.stderr + opt.stderr
    d, o = json.loads(default.stdout), json.loads(opt.stdout)
    assert d["placement"]["method"] == "default"
    assert d["placement"]["hosts"] == [f"cnode2-{i:03d}" for i in range(1, 17)]
    assert o["placement"]["method"] == "optimized"
    assert o["iteration_time_s"] <= d["iteration_time_s"]
    # the optimised placement, saved and given back as a file, prices the same
    path = tmp_path / "placement.json"
    path.write_text(json.dumps({"hosts": o["placement"]["hosts"],
                                "gpu_order": o["placement"]["gpu_order"]}))
    f = run_cli(*args, "--placement", path, timeout=300)
    assert f.returncode == 0, f.stderr
    assert json.loads(f.stdout)["iteration_time_s"] == pytest.approx(o["iteration_time_s"])


def test_placement_needs_a_topology():
    res = run_cli("estimate", "--model", "llama3-8b", "--cluster", H100, "--nodes", "2",
                  "--gbs", "16", "--tp", "8", "--pp", "1", "--mbs", "1", "--placement",
                  "optimized")
    assert res.returncode == 2 and "needs --topology" in res.stderr


def test_nodes_range_reports_best_plan_per_count(tmp_path):
    res = run_cli("search", "--model", "llama3-8b", "--cluster", H100, "--gbs", "64",
                  "--nodes-range", "1:4", "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["scaling"]
    assert [r["nodes"] for r in rows] == [1, 2, 3, 4]
    # 24 GPUs: 32 layers on 3 pipeline ranks need an uneven or embedding/loss-aware split
    p3 = rows[2]["plan"]
    assert p3["tp"] * p3["pp"] * p3["dp"] * p3["cp"] == 24
    if 32 % p3["pp"]:
        assert p3["first"] or p3["last"] or p3["acct_emb"] or p3["acct_loss"]
    for r in rows:
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_s_per_gpu"] * r["num_gpus"])
    out = tmp_path / "scale"
    res = run_cli("search", "--model", "llama3-8b", "--cluster", H100, "--gbs", "64",
                  "--nodes-range", "1:2", "--out", out)
    assert res.returncode == 0, res.stderr
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = run_cli("search", "--model", "llama3-8b", "--cluster", H100, "--gbs", "64",
                  "--nodes-range", "4:1")
    assert bad.returncode == 2 and "--nodes-range" in bad.stderr


def test_explain_two_plans(tmp_path):
    docs = []
    for name, extra in (("a", []), ("b", ["--recompute", "full"])):
        out = tmp_path / name
        res = run_cli("search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb",
                      "--nodes", "64", "--gbs", "512", "--out", out, *extra)
        assert res.returncode == 0, res.stderr
        docs.append(out / "plan.json")
    res = run_cli("explain", *docs, "--json")
    assert res.returncode == 0, res.stderr
    ex = json.loads(res.stdout)
    rows = {r["name"]: r for r in ex["rows"]}
    a, b = (json.loads(p.read_text())["estimate"] for p in docs)
    assert rows["iteration_time_s"]["delta"] == pytest.approx(
        b["iteration_time_s"] - a["iteration_time_s"])
    assert rows["recompute"]["b"] > 0 and rows["recompute"]["a"] == 0
    assert any(c["field"] == "recompute" for c in ex["field_changes"])
    # per stage: the simulated time of each stage, parts summing to the iteration
    pps = [json.loads(p.read_text())["plan"]["pp"] for p in docs]
    for s in range(max(pps)):
        row = rows[f"stage {s} busy_s"]
        assert row["kind"] == "time per stage"
        for est, pp, got in ((a, pps[0], row["a"]), (b, pps[1], row["b"])):
            if s >= pp:
                assert got is None
                continue
            t = est["time_per_stage"][s]
            assert got == t["busy_s"] == pytest.approx(t["forward_s"] + t["backward_s"])
            assert t["busy_s"] + t["dp_exposed_s"] + t["idle_s"] <= est["iteration_time_s"]
            assert t["busy_s"] > 0.5 * est["iteration_time_s"]
    text = run_cli("explain", *docs)
    assert text.returncode == 0 and "B - A" in text.stdout
    missing = run_cli("explain", docs[0], tmp_path / "nope.json")
    assert missing.returncode == 2
