import json
import stat

import pytest

from tests.conftest import run_cli

ESTIMATE_KEYS = {"config", "iteration_time_s", "model_tflops_per_gpu", "mfu",
                 "tokens_per_s_per_gpu", "peak_memory_bytes", "memory_capacity_bytes", "fits",
                 "memory_per_stage", "time_breakdown_s"}


def test_estimate_json_contract():
    res = run_cli("estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes",
                  "128", "--tp", "8", "--pp", "8", "--vp", "2", "--mbs", "1", "--gbs", "1536",
                  "--recompute", "selective", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert ESTIMATE_KEYS <= set(d)
    c = d["config"]
    for k in ("tp", "pp", "dp", "cp", "vp", "mbs", "gbs", "num_microbatches", "recompute",
              "sequence_parallel", "distributed_optimizer", "precision"):
        assert k in c
    assert (c["dp"], c["num_microbatches"], c["vp"]) == (16, 96, 2)
    assert len(d["memory_per_stage"]) == 8
    assert set(d["memory_per_stage"][0]) >= {"stage", "parameters_bytes", "gradients_bytes",
                                              "optimizer_bytes", "activations_bytes",
                                              "other_bytes", "total_bytes"}
    assert set(d["time_breakdown_s"]) == {"compute", "recompute", "bubble", "tp_comm",
                                          "cp_comm", "ep_comm", "pp_comm", "dp_comm",
                                          "optimizer",
                                          "schedule_and_placement"}
    assert sum(d["time_breakdown_s"].values()) == pytest.approx(d["iteration_time_s"])
    assert d["fits"] is True


def test_estimate_plan_that_does_not_fit_still_estimates():
    res = run_cli("estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes",
                  "2", "--tp", "8", "--pp", "2", "--mbs", "1", "--gbs", "8", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["fits"] is False and d["peak_memory_bytes"] > d["memory_capacity_bytes"]


def test_search_json_out_and_launch(tmp_path):
    out = tmp_path / "out"
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                  "2", "--gbs", "128", "--top", "3", "--json", "--out", out)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert len(d["plans"]) == 3 and d["feasible"] <= d["candidates_evaluated"]
    assert d["search_time_s"] > 0
    assert ESTIMATE_KEYS <= set(d["plans"][0])
    for f in ("launch_torchrun.sh", "launch_slurm.sbatch", "plan.json", "plans.json",
              "table.txt", "plans.png"):
        assert (out / f).is_file(), f
    assert (out / "launch_torchrun.sh").stat().st_mode & stat.S_IXUSR
    assert (out / "plans.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    best = d["plans"][0]["config"]
    script = (out / "launch_torchrun.sh").read_text()
    assert f"--tensor-model-parallel-size {best['tp']}" in script
    # the same --out again refuses to overwrite
    again = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                    "2", "--gbs", "128", "--out", out)
    assert again.returncode == 2 and "--force" in again.stderr
    # launch re-creates the scripts from the saved plan
    res = run_cli("launch", "--plan", out / "plan.json", "--out", tmp_path / "again")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "again" / "launch_torchrun.sh").read_text() == script


def test_search_table_and_python_m_entry():
    res = run_cli("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes",
                  "4", "--gbs", "512", "--top", "5")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "plans evaluated" in lines[0]
    # one line on the ties and the pick, when plans tie within the best one's interval
    assert lines[1].startswith(("ties (* after the rank):", "picked a plan"))
    # one line naming the recipe mechanisms the search turned on in plan 1 (an A100 cluster:
    # Transformer Engine's cross entropy, the BF16 reduction, the precision-aware optimizer)
    assert lines[2] == ("mechanisms turned on in plan 1: te_cross_entropy, "
                        "grad_reduce_in_bf16, precision_aware_optimizer")
    # two header lines (the wider headers stacked), the rule, 5 plans, the next step
    assert lines[4].split()[:3] == ["rank", "tp", "pp"] and set(lines[5]) == {"-", " "}
    assert len(lines) == 6 + 5 + 1
    # the last line says how to get scripts and how to see one plan in detail
    assert lines[-1].startswith("next: --out DIR") and "configurator estimate" in lines[-1]


def test_search_takes_the_gradient_reduction_overlap_as_given(tmp_path):
    """``search --no-overlap-grad-reduce`` (a stack that reduces the gradients after the
    backward, as Megatron's local DDP did) prices every plan so: each carries it, its
    data-parallel time is the whole all-reduce (the same as ``estimate`` gives the plan with
    that flag), more than the overlapped search's last bucket, and the ``estimate`` command
    the table prints for plan 1 repeats the flag."""
    model = tmp_path / "m.yaml"
    model.write_text("num_layers: 24\nhidden_size: 1024\nnum_attention_heads: 16\n"
                     "vocab_size: 51200\nseq_length: 1024\n")
    argv = ("search", "--model", model, "--cluster", "dgx-a100-80gb", "--nodes", "1", "--gbs",
            "8", "--tp", "1", "--pp", "1", "--cp", "1", "--recompute", "full",
            "--no-distributed-optimizer", "--precision", "fp16", "--attention-backend", "local")
    docs = {}
    for flag in ("--overlap-grad-reduce", "--no-overlap-grad-reduce"):
        res = run_cli(*argv, flag, "--json")
        assert res.returncode == 0, res.stderr
        docs[flag] = json.loads(res.stdout)["plans"]
    on, off = docs["--overlap-grad-reduce"], docs["--no-overlap-grad-reduce"]
    assert {p["config"]["overlap_grad_reduce"] for p in on} == {True}
    assert {p["config"]["overlap_grad_reduce"] for p in off} == {False}
    best = off[0]["config"]
    same = next(p for p in on if all(p["config"][k] == best[k]
                                     for k in ("tp", "pp", "dp", "micro_batch_size")))
    assert off[0]["time_breakdown_s"]["dp_comm"] > 2 * same["time_breakdown_s"]["dp_comm"] > 0
    est = run_cli("estimate", *argv[1:9], "--mbs", best["micro_batch_size"], *argv[9:],
                  "--no-sequence-parallel", "--no-overlap-grad-reduce", "--json")
    assert est.returncode == 0, est.stderr
    assert json.loads(est.stdout)["time_breakdown_s"]["dp_comm"] == pytest.approx(
        off[0]["time_breakdown_s"]["dp_comm"], rel=1e-9)
    text = run_cli(*argv, "--no-overlap-grad-reduce")
    assert text.returncode == 0, text.stderr
    assert "--no-overlap-grad-reduce" in text.stdout.splitlines()[-1]


def test_a_job_on_part_of_a_node(tmp_path, capsys):
    """--gpus N: a job on 1, 2 or 4 GPUs of a DGX is one host of N GPUs on the node's links,
    the cluster validate prices a run on N GPUs on (one definition), and whole nodes
    otherwise; the scripts launch N processes."""
    from configurator.cli import main
    from configurator.core.runs import MeasuredRun
    from configurator.app.validate_jobs import run_cluster
    from configurator.core.plan import plan_from_dict
    from configurator.search.evaluate import evaluate_plan
    from configurator.core.model_presets import load_model

    job = ["--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "16", "--tp", "2",
           "--pp", "1", "--mbs", "2", "--json"]
    assert main(["estimate", *job, "--gpus", "4"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert four["config"]["dp"] == 2
    run = MeasuredRun(name="r", group=None, source="s", model="gpt-1.7b",
                      cluster="dgx-a100-80gb", num_gpus=4, seq_length=None,
                      plan=plan_from_dict(four["config"]), iteration_time_s=1.0)
    cluster = run_cluster(run)
    assert (cluster.num_nodes, cluster.gpus_per_node, cluster.num_gpus) == (1, 4, 4)
    e = evaluate_plan(load_model("gpt-1.7b"), cluster, run.plan)
    assert four["iteration_time_s"] == pytest.approx(e.iteration_time_s, rel=1e-9)
    # whole nodes: --gpus 16 is --nodes 2
    assert main(["estimate", *job, "--gpus", "16"]) == 0
    sixteen = json.loads(capsys.readouterr().out)
    assert main(["estimate", *job, "--nodes", "2"]) == 0
    assert sixteen == json.loads(capsys.readouterr().out)
    # the search's plans and scripts: 4 processes on one node
    out = tmp_path / "plan"
    assert main(["search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gpus", "4",
                 "--gbs", "16", "--top", "3", "--out", str(out)]) == 0
    capsys.readouterr()
    assert "--nproc-per-node 4" in (out / "launch_torchrun.sh").read_text()
    assert "#SBATCH --gpus-per-node=4" in (out / "launch_slurm.sbatch").read_text()
    plans = json.loads((out / "plans.json").read_text())["plans"]
    assert {p["config"]["tp"] * p["config"]["pp"] * p["config"]["dp"] * p["config"]["cp"]
            for p in plans} == {4}


@pytest.mark.parametrize("args, field, rule", [
    (["--gpus", "3"], "--gpus=3", "multiple or a divisor of the 8 GPUs per node"),
    (["--gpus", "12"], "--gpus=12", "multiple or a divisor of the 8 GPUs per node"),
    (["--gpus", "0"], "--gpus=0", "must be an integer in 1.."),
    (["--gpus", "2", "--nodes", "2"], "--nodes=2", "must be 1 with 2 GPUs"),
    (["--gpus", "16", "--nodes", "3"], "--nodes=3", "disagrees with 16 GPUs: 2 nodes of 8"),
    (["--gpus", "4", "--topology", "topo.json"], "--gpus=4", "not with --topology"),
    (["--gpus", "8", "--nodes-range", "1:2"], "--nodes-range='1:2'", "not both"),
])
def test_gpus_that_are_no_job_are_refused_in_one_line(capsys, args, field, rule):
    from configurator.cli import main

    assert main(["search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "16",
                 *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err and rule in err, err
