"""``configurator trial``: which short runs it chooses, and the files and next step it
writes."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from configurator.app.trial_jobs import (FORCED_BALANCE_NOTE, PROBE_MAX_SLOWDOWN, choose_runs,
                                         prior_log_sd, trial_plan)
from configurator.cli import main
from configurator.core.model_presets import load_model
from configurator.core.plan import ParallelPlan, plan_from_dict
from configurator.search.evaluate import evaluate_plan
from topology.cluster_files import load_cluster
from topology.calibration import PARAMETER_RANGES

NAMES = ("gemm", "flash_attention", "host_op_us", "inter_node_efficiency")


def test_prior_is_the_plausible_range_as_two_sigma():
    lo, hi, _ = PARAMETER_RANGES["host_op_us"]
    assert prior_log_sd("host_op_us") == pytest.approx(np.log(hi / lo) / 4, rel=1e-12)


def test_contenders_are_the_plans_within_the_uncertainty_of_their_difference():
    # plans 0-2 near the best but differing in how they depend on the network; plan 3 far
    # slower; plan 4 host-bound; plan 5 moved by GEMMs alone
    times = np.array([1.0, 1.03, 1.05, 3.0, 2.0, 2.5])
    S = np.array([[-0.8, -0.1, 0.0, -0.05],
                  [-0.6, -0.1, 0.0, -0.4],
                  [-0.7, -0.1, 0.0, -0.3],
                  [-0.8, -0.1, 0.0, -0.05],
                  [-0.1, 0.0, 0.9, 0.0],
                  [-1.0, 0.0, 0.0, 0.0]])
    sd = np.array([prior_log_sd(n) for n in NAMES])
    chosen, n_close, sd_after = choose_runs(times, S, sd, 5, NAMES)
    idx = [i for i, *_ in chosen]
    assert idx[0] == 0 and chosen[0][1] == "contender"
    # 0-2, and 4: host-bound, within the host time's wide prior; 3 (same sensitivities as
    # the best, 3 times slower) is not
    assert n_close == 4 and 3 not in idx[:2]
    assert [r for _, r, _ in chosen].count("contender") == 2
    assert len(set(idx)) == 5
    # the order of plans 0-2 depends on the network first: a probe pins it
    probes = {i: why for i, role, why in chosen if role == "probe"}
    assert any("inter_node_efficiency" in why for why in probes.values())
    assert sd_after[NAMES.index("inter_node_efficiency")] < sd[NAMES.index(
        "inter_node_efficiency")] / 3


def test_trial_cli_writes_scripts_and_the_next_step(tmp_path, capsys):
    out = tmp_path / "trial"
    args = ["trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
            "--gbs", "8", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "configurator calibrate" in text and "--calibration calib.yaml" in text
    assert "predicted best" in text
    for k in range(1, 6):
        assert (out / f"trial{k}" / "launch_torchrun.sh").exists()
        assert (out / f"trial{k}" / "launch_slurm.sbatch").exists()
    doc = json.loads((out / "trials.json").read_text())
    assert len(doc["runs"]) == 5 and doc["runs"][0]["role"] == "contender"
    assert main(args) == 2                            # nothing overwritten without --force
    assert "exists" in capsys.readouterr().err
    assert main(args + ["--force", "--runs", "0"]) == 2
    assert "runs" in capsys.readouterr().err


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_torchrun_step_names_the_node_whose_log_calibrate_reads(nodes, capsys):
    """Megatron prints its iteration lines from the last rank (training_log), so a job of
    several nodes run with torchrun keeps node_rank nodes − 1's output, every node started
    with its node_rank and node_rank 0's address; one node runs the script as it is."""
    assert main(["trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes",
                 str(nodes), "--gbs", "16"]) == 0
    step = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("next: run each"))
    tee = "bash trial/trialN/launch_torchrun.sh 2>&1 | tee trial/logs/trialN.log"
    if nodes == 1:
        assert f"(or on its node: {tee})" in step and "NODE_RANK" not in step
    else:
        assert ("on each of its 2 nodes, NODE_RANK 0..1: MASTER_ADDR=<node_rank 0's "
                "address> bash "
                "trial/trialN/launch_torchrun.sh NODE_RANK, with `2>&1 | tee "
                "trial/logs/trialN.log` on node_rank 1") in step
        assert "on one node" not in step and "its node:" not in step


def test_the_next_search_keeps_the_options_the_trial_was_given(capsys):
    """The re-ranking search the trial prints searches what the trial did: a job given
    --attention-backend local (no Transformer Engine on the machine) and a switched-off
    mechanism re-ranks with both, not with Transformer Engine's attention."""
    assert main(["trial", "--model", "gpt-1.7b", "--cluster", "dgx-h200-141gb", "--nodes",
                 "1", "--gbs", "8", "--attention-backend", "local",
                 "--no-grad-reduce-in-bf16"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    search = last[last.index("configurator search"):].split()
    assert search[search.index("--attention-backend") + 1] == "local"
    assert "--no-grad-reduce-in-bf16" in search and "--precision" not in search


def test_search_option_words_give_each_option_given():
    from configurator.core.plan import search_option_words

    assert search_option_words({"precision": "fp8", "attention_backend": None,
                                "fp8_param_gather": False, "tp_comm_overlap": True,
                                "moe_expert_capacity_factor": 1.25}) == [
        "--precision", "fp8", "--no-fp8-param-gather", "--tp-comm-overlap",
        "--moe-expert-capacity-factor", "1.25"]


def test_trial_chooses_among_the_plans_of_a_file(tmp_path, capsys):
    plan_dir = tmp_path / "plan"
    assert main(["search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes",
                 "1", "--gbs", "8", "--top", "6", "--out", str(plan_dir)]) == 0
    capsys.readouterr()
    plans = json.loads((plan_dir / "plans.json").read_text())["plans"]
    assert main(["trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
                 "--gbs", "8", "--plans", str(plan_dir / "plans.json"), "--runs", "3",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    given = [p["config"] for p in plans]
    assert doc["pool"] == 6 and len(doc["runs"]) == 3
    for r in doc["runs"]:
        assert {k: r["plan"][k] for k in ("tp", "pp", "dp", "micro_batch_size")} in [
            {k: g[k] for k in ("tp", "pp", "dp", "micro_batch_size")} for g in given]
    # a file that repeats its plans offers each once: the same runs, never one plan twice,
    # and a note
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"plans": plans + plans[:4]}))
    assert main(["trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
                 "--gbs", "8", "--plans", str(twice), "--runs", "3", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["pool"] == 6 and again["runs"] == doc["runs"]
    assert again["notes"] == [f"4 of the 10 plans of {twice} repeat an earlier one: each plan "
                              f"is a candidate once"]
    # a plan of another batch size is refused, naming the entry
    bad = tmp_path / "bad.json"
    plans[0]["config"]["global_batch_size"] = 16
    bad.write_text(json.dumps({"plans": plans}))
    assert main(["trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
                 "--gbs", "8", "--plans", str(bad)]) == 2
    assert "plans[0]" in capsys.readouterr().err


def test_search_with_calibration_says_how_the_ranking_changed(tmp_path, capsys):
    cal = tmp_path / "cal.yaml"
    cal.write_text("format: configurator-calibration/1\ngpus:\n  a100-80gb:\n    bf16:\n"
                   "      gemm: 0.5\n      intra_node_efficiency: 0.35\n")
    # the mechanisms the search would choose given as off (with them the best plan, tp 1
    # dp 8, is the same under this calibration)
    assert main(["search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes",
                 "1", "--gbs", "8", "--calibration", str(cal), "--json",
                 "--cross-entropy-fusion", "none", "--no-grad-reduce-in-bf16",
                 "--no-use-precision-aware-optimizer"]) == 0
    doc = json.loads(capsys.readouterr().out)
    change = doc["calibration_change"]
    assert change["uncalibrated_best_rank"] >= 1
    assert "calibration" in change["summary"]
    # slower NVLink favours less tp: the old best is no longer first
    assert change["uncalibrated_best_rank"] > 1


def test_probes_are_short_runs_too(monkeypatch):
    """The most informative plan is not taken as a probe where it runs more than
    PROBE_MAX_SLOWDOWN times the best plan's time; a shorter one pins the host instead."""
    import configurator.app.trial_jobs as trial_jobs

    times = np.array([1.0, 1.02, 40.0, 3.0, 2.0])
    # the two contenders differ most in how they depend on the host
    S = np.array([[-0.8, -0.1, 0.05, 0.0],
                  [-0.5, -0.1, 0.4, 0.0],
                  [-0.05, 0.0, 0.99, 0.0],     # all host, but 40 times the best
                  [-0.3, 0.0, 0.7, 0.0],       # mostly host, within the bound
                  [-1.0, 0.0, 0.0, 0.0]])
    sd = np.array([prior_log_sd(n) for n in NAMES])
    chosen, _, _ = choose_runs(times, S, sd, 3, NAMES)
    idx = [i for i, *_ in chosen]
    assert 2 not in idx and max(times[idx]) <= PROBE_MAX_SLOWDOWN * times.min()
    assert any(role == "probe" and "host_op_us" in why for _, role, why in chosen)
    # without the bound the slow plan is the host probe
    monkeypatch.setattr(trial_jobs, "PROBE_MAX_SLOWDOWN", np.inf)
    unbounded, _, _ = choose_runs(times, S, sd, 3, NAMES)
    assert [why for i, role, why in unbounded if i == 2 and role == "probe"]


def test_a_parameter_one_run_carries_gets_a_second_run():
    """``calibrate`` fits no parameter whose information one run carries (more than
    MAX_ONE_RUN_SHARE of it): where the contenders and the first host probe leave the host
    time on one run, the next probe is the plan left that moves most with it, not one more
    GEMM-bound plan. A parameter no plan informs (the network here) does not end the
    choice."""
    times = np.array([1.0, 1.6, 1.3, 1.2, 1.25, 1.15])
    S = np.array([[-0.40, 0.0, 0.02, 0.0],     # the best: GEMM-bound
                  [-0.25, 0.0, 0.43, 0.0],     # host-bound, a contender
                  [-0.42, 0.0, 0.02, 0.0],
                  [-0.40, 0.0, 0.02, 0.0],
                  [-0.34, 0.0, 0.10, 0.0],     # the second most host-bound
                  [-0.41, 0.0, 0.02, 0.0]])
    sd = np.array([prior_log_sd(n) for n in NAMES])
    chosen, _, _ = choose_runs(times, S, sd, 5, NAMES)
    idx = [i for i, *_ in chosen]
    assert 1 in idx and 4 in idx, chosen
    second = [why for i, role, why in chosen if i == 4]
    assert second and "second run for host_op_us" in second[0]
    # the most host-sensitive plan left, though at the presets it says little (0.10 against
    # 0.43): at the value the runs find, both may be host-bound
    host = np.abs(S[:, NAMES.index("host_op_us")])
    assert host[4] == max(host[i] for i in range(len(times)) if i != 1)
    assert len(chosen) == 5          # the uninformed network efficiency stopped nothing


def test_trial_plan_forces_the_balance_of_routed_moe_plans_only():
    moe, dense = load_model("qwen3-30b-a3b"), load_model("gpt-1.7b")
    plan = ParallelPlan(tp=1, pp=1, dp=8, ep=8, micro_batch_size=1, global_batch_size=64)
    forced = trial_plan(moe, plan)
    assert forced.moe_router_force_load_balancing and not plan.moe_router_force_load_balancing
    assert dataclasses.replace(forced, moe_router_force_load_balancing=False) == plan
    assert trial_plan(dense, ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1,
                                          global_batch_size=64)).moe_router_force_load_balancing \
        is False
    padded = dataclasses.replace(plan, moe_expert_capacity_factor=1.0,
                                 moe_pad_expert_input_to_capacity=True)
    assert trial_plan(moe, padded) == padded


def test_moe_trial_runs_with_forced_balance_and_says_why(tmp_path, capsys):
    out = tmp_path / "trial"
    assert main(["trial", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-80gb",
                 "--nodes", "2", "--gbs", "64", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["notes"][0] == FORCED_BALANCE_NOTE and len(doc["notes"]) == 2
    model = load_model("qwen3-30b-a3b")
    cluster = load_cluster("dgx-h100-80gb", 2)
    best = min(r["job_iteration_time_s"] for r in doc["runs"])
    for r in doc["runs"]:
        plan = plan_from_dict(r["plan"])
        assert plan.moe_router_force_load_balancing
        script = (out / f"trial{r['index']}" / "launch_torchrun.sh").read_text()
        assert "--moe-router-force-load-balancing" in script
        # the time shown is the forced run's, below the same plan routed by its scores
        assert r["predicted_iteration_time_s"] == pytest.approx(
            evaluate_plan(model, cluster, plan).iteration_time_s, rel=1e-9)
        routed = dataclasses.replace(plan, moe_router_force_load_balancing=False)
        routed_s = evaluate_plan(model, cluster, routed).iteration_time_s
        # the job's time, which the ranking and the percentages are about, is the routed one
        assert r["job_iteration_time_s"] == pytest.approx(routed_s, rel=1e-9)
        # equal where host-bound (to rounding: the two sum their terms in another order)
        assert routed_s >= r["predicted_iteration_time_s"] * (1 - 1e-12)
        if r["index"] == 1:
            assert routed_s > r["predicted_iteration_time_s"]
        # a probe is a short run: within PROBE_MAX_SLOWDOWN of the best as the runs show it
        assert r["job_iteration_time_s"] <= PROBE_MAX_SLOWDOWN * best
    # a dense job's runs are unchanged and carry no note
    assert main(["trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
                 "--gbs", "8", "--json"]) == 0
    dense = json.loads(capsys.readouterr().out)
    assert FORCED_BALANCE_NOTE not in dense["notes"]
    assert not any(r["plan"]["moe_router_force_load_balancing"] for r in dense["runs"])
    assert all(r["job_iteration_time_s"] == r["predicted_iteration_time_s"]
               for r in dense["runs"])


@pytest.mark.parametrize("job", [("qwen3-30b-a3b", "dgx-h100-80gb", 2, 64, {}),
                                 ("llama3-8b", "dgx-h100-80gb", 2, 64, {"precision": "fp8"})])
def test_the_contenders_are_the_plans_search_ranks(job):
    """The trial settles the ranking ``search`` prints: its predicted best is the search's
    fastest plan, recipe mechanisms and all (the fused MoE routing, the tensor-parallel
    overlap, the precision-aware optimizer), at the same time; the contenders stand in the
    order of the times shown, each percentage that of those times; the runs say which
    mechanisms they carry."""
    from configurator.app.inputs import JobInputs
    from configurator.app.trial_jobs import TrialRequest, run_trial
    from configurator.search.rank import search

    name, cluster_name, nodes, gbs, options = job
    model, cluster = load_model(name), load_cluster(cluster_name, nodes=nodes)
    out = run_trial(TrialRequest(inputs=JobInputs(model=name, cluster=cluster_name,
                                                  nodes=nodes),
                                 global_batch_size=gbs, options=options))
    res = search(model, cluster, gbs, top_k=10, **options)
    fastest = min(res.plans, key=lambda e: e.iteration_time_s)
    best = out.runs[0]
    assert best.role == "contender" and best.reason == "predicted best"
    assert best.job_iteration_time_s == pytest.approx(fastest.iteration_time_s, rel=1e-12)
    assert dataclasses.replace(best.plan, moe_router_force_load_balancing=False) == (
        fastest.plan)
    contenders = [r for r in out.runs if r.role == "contender"]
    assert [r.job_iteration_time_s for r in contenders] == sorted(
        r.job_iteration_time_s for r in contenders)
    for r in contenders[1:]:
        pct = 100 * (r.job_iteration_time_s / best.job_iteration_time_s - 1)
        assert r.reason.startswith(f"{pct:+.1f} % vs the best")
    on = res.mechanisms_of(fastest.plan)
    assert on and all(m in out.notes[-1] for m in on)


def test_an_option_given_to_the_trial_pins_it():
    """A mechanism switched off on the command line stays off in every run."""
    from configurator.app.inputs import JobInputs
    from configurator.app.trial_jobs import TrialRequest, run_trial

    for given in (None, False):
        out = run_trial(TrialRequest(
            inputs=JobInputs(model="llama3-8b", cluster="dgx-h100-80gb", nodes=2),
            global_batch_size=64, options={"grad_reduce_in_bf16": given}))
        assert {r.plan.grad_reduce_in_bf16 for r in out.runs} == {given is None}


def test_the_search_limits_hold_for_every_run_and_the_next_search(capsys):
    """A stack that runs only some plans (2021 Megatron: full recompute, no sequence
    parallelism, no distributed optimizer, gradients reduced after the backward, tp up to 4)
    is tried within those limits: every chosen run keeps them, and the re-ranking search the
    trial prints repeats them, so that it ranks the plans the runs were chosen among."""
    limits = ["--recompute", "full", "--tp", "1", "2", "4", "--no-sequence-parallel",
              "--no-distributed-optimizer", "--no-overlap-grad-reduce"]
    job = ["--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1", "--gbs", "16",
           "--precision", "fp16", "--attention-backend", "local"]
    assert main(["trial", *job, *limits, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["runs"]) == 5
    for r in doc["runs"]:
        p = r["plan"]
        assert (p["recompute"], p["sequence_parallel"], p["distributed_optimizer"],
                p["overlap_grad_reduce"]) == ("full", False, False, False), p
        assert p["tp"] in (1, 2, 4)
    # without the limits the same job's runs leave them (the test would pass vacuously
    # otherwise)
    assert main(["trial", *job, "--json"]) == 0
    free = json.loads(capsys.readouterr().out)["runs"]
    assert any(r["plan"]["recompute"] != "full" or r["plan"]["sequence_parallel"]
               or r["plan"]["tp"] == 8 for r in free)
    assert main(["trial", *job, *limits]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    search = last[last.index("configurator search"):].split()
    at = search.index("--tp")
    assert search[at + 1:at + 4] == ["1", "2", "4"]
    for word in ("--no-sequence-parallel", "--no-distributed-optimizer",
                 "--no-overlap-grad-reduce"):
        assert word in search
    assert search[search.index("--recompute") + 1] == "full"


def test_a_file_of_plans_takes_no_search_limits(tmp_path, capsys):
    """The plans of --plans are the candidates: limits beside them are refused in one line
    (exit 2) naming the file and the limits, not silently ignored."""
    f = tmp_path / "plans.yaml"
    f.write_text("plans:\n- {tp: 1, pp: 1, micro_batch_size: 1}\n")
    assert main(["trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
                 "--gbs", "8", "--plans", str(f), "--recompute", "full"]) == 2
    err = capsys.readouterr().err
    assert str(f) in err and "--recompute full" in err and len(err.strip().splitlines()) == 1


def test_a_trial_on_part_of_a_node(capsys):
    """trial --gpus 4: runs of 4 GPUs, and the next step's search on the same 4."""
    assert main(["trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gpus", "4",
                 "--gbs", "16", "--runs", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["plan"]["tp"] * r["plan"]["pp"] * r["plan"]["dp"] * r["plan"]["cp"]
            for r in doc["runs"]} == {4}
    assert main(["trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gpus", "4",
                 "--gbs", "16", "--runs", "3"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    search = last[last.index("configurator search"):].split()
    assert search[search.index("--gpus") + 1] == "4" and "--nodes" not in search


def test_the_limits_words_parse_back_to_the_same_limits():
    """The words a limit prints (what ``trial``'s next step repeats) are the options that
    give it back: parsed by ``search``'s own parser they make the same
    :class:`SearchLimits`, for the empty limits (no words, false) and for each kind of limit
    (recompute choices, an integer field's values, a switch off, an overlap off)."""
    from configurator.app.plan_jobs import SearchLimits
    from configurator.cli import build_parser
    from configurator.cli.plan_commands import search_limits

    job = ["search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "16"]
    none = SearchLimits()
    assert not none and none.words() == []
    assert search_limits(build_parser().parse_args(job)) == none
    for limits in (SearchLimits(recompute=("full",)),
                   SearchLimits(restrict={"tp": (1, 2), "micro_batch_size": (4,)}),
                   SearchLimits(restrict={"sequence_parallel": False}),
                   SearchLimits(ddp={"overlap_grad_reduce": False}),
                   SearchLimits(recompute=("none", "selective"), restrict={
                       "pp": (2,), "distributed_optimizer": False},
                       ddp={"overlap_grad_reduce": False})):
        assert limits and limits.words()
        assert search_limits(build_parser().parse_args(job + limits.words())) == limits
