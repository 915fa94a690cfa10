"""Error bars on predicted times, ties and the default pick (configurator.search.intervals),
and the host-bound regime of small-model, high-tp, micro-batch-1 plans."""

from __future__ import annotations

import dataclasses

import pytest

import configurator.search.intervals as iv
from configurator.core.model_presets import load_model, make_model
from configurator.core.plan import ParallelPlan
from configurator.cost.host_ops import optimizer_host_s
from configurator.report.table import format_table
from configurator.search.evaluate import evaluate_plan
from configurator.search.rank import search
from topology.cluster_files import load_cluster


def test_regime_rules_in_order():
    assert iv.regime_of(True, True, 0.9) == "moe"
    assert iv.regime_of(False, True, 0.9) == "host-bound"
    assert iv.regime_of(False, False, iv.COMM_HEAVY_SHARE) == "comm-heavy"
    assert iv.regime_of(False, False, iv.COMM_HEAVY_SHARE - 1e-6) == "gemm-bound"


def test_shipped_figures_are_consistent_and_name_their_command():
    bars = iv.error_bars()
    assert bars["command"] == "python -m bench.accuracy.error_bars --write"
    assert set(bars["regimes"]) == set(iv.REGIMES)
    assert sum(r["runs"] for r in bars["regimes"].values()) == bars["all"]["runs"] > 50
    for row in [*bars["regimes"].values(), bars["all"]]:
        if row["runs"]:
            assert row["lo"] <= row["median"] <= row["hi"]


def test_interval_divides_by_one_plus_the_residual(monkeypatch):
    monkeypatch.setattr(iv, "residual_range", lambda regime: (-0.2, 0.1))
    lo, hi = iv.interval_s(1.0, "gemm-bound")
    # predicted 10 % too slow at worst: measured 1/1.1; 20 % too fast: measured 1/0.8
    assert lo == pytest.approx(1 / 1.1) and hi == pytest.approx(1 / 0.8)


def test_small_regime_falls_back_to_every_run(monkeypatch):
    monkeypatch.setattr(iv, "error_bars", lambda: {
        "regimes": {"host-bound": {"runs": iv.MIN_RUNS - 1, "lo": -0.9, "hi": 0.9}},
        "all": {"runs": 100, "lo": -0.1, "hi": 0.05}})
    assert iv.residual_range("host-bound") == (-0.1, 0.05)
    assert iv.residual_range("moe") == (-0.1, 0.05)


def test_worst_regret():
    assert iv.worst_regret_s([(1.0, 2.0), (1.5, 1.8)]) == pytest.approx([0.5, 0.8])
    assert iv.worst_regret_s([(1.0, 2.0)]) == [0.0]


def _evals():
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100-80gb", 1)
    return model, cluster, search(model, cluster, 64, top_k=6)


def test_search_attaches_intervals_and_marks_ties():
    model, cluster, res = _evals()
    best = min(res.plans, key=lambda e: e.iteration_time_s)
    lo, hi = best.iteration_time_interval_s
    assert lo < best.iteration_time_s < hi
    for e in res.plans:
        a, b = e.iteration_time_interval_s
        assert a < e.iteration_time_s < b and e.regime in iv.REGIMES
        assert e.tie == (e.iteration_time_s <= hi) or not any(p.tie for p in res.plans)
        d = e.to_dict()
        assert d["iteration_time_interval_s"] == [a, b] and d["regime"] == e.regime
    assert "+/-%" in "\n".join(format_table(res.plans).splitlines()[:2])
    if sum(e.tie for e in res.plans) > 1:
        assert res.pick_note and "ties" in res.pick_note
    assert res.to_dict()["pick_note"] == res.pick_note


def test_pick_is_the_tie_with_the_smallest_worst_case_regret(monkeypatch):
    """Two plans 2 % apart: the faster one's regime predicts up to 30 % too fast, the slower
    one's within 5 %: the slower one loses less wherever the truth falls, and is picked,
    with one line saying so; with one regime for both the fastest stays first."""
    model, cluster, res = _evals()
    a, b = res.plans[0], res.plans[1]
    b = dataclasses.replace(b, iteration_time_s=a.iteration_time_s * 1.02)
    ranges = {"moe": (-0.30, 0.02), "gemm-bound": (-0.05, 0.02)}
    monkeypatch.setattr(iv, "residual_range", lambda regime: ranges[regime])
    monkeypatch.setattr(iv, "regimes", lambda model, cluster, evals, profile=None:
                        ["moe", "gemm-bound"])
    ranked, note = iv.rank_with_intervals(model, cluster, [a, b])
    assert ranked[0].plan == b.plan and ranked[0].tie and ranked[1].tie
    assert note.startswith("picked a plan") and "\n" not in note
    monkeypatch.setattr(iv, "regimes", lambda model, cluster, evals, profile=None:
                        ["gemm-bound", "gemm-bound"])
    ranked, note = iv.rank_with_intervals(model, cluster, [a, b])
    assert ranked[0].plan == a.plan and "rank 1 is also the least exposed" in note


def _gpt_h1024():
    # a 24-layer, hidden 1,024 GPT on one DGX A100 at global batch 8, fp16, full recompute
    return make_model(name="gpt-h1024-l24", num_layers=24, hidden_size=1024,
                      num_attention_heads=16, vocab_size=51200, seq_length=1024)


@pytest.mark.parametrize("tp, pp, dp, mbs, host_bound", [
    (2, 1, 4, 1, True), (8, 1, 1, 1, True), (1, 1, 8, 1, True), (1, 1, 8, 8, False)])
def test_small_high_tp_mbs1_plans_are_slower_than_their_gpu_work(tp, pp, dp, mbs,
                                                                 host_bound):
    """The host's issue time per layer (host_ops.host_layer_s) floors a layer whose kernels
    are short: such plans come out slower than the same plan with a host that costs nothing
    (their GEMMs, other kernels and communication alone), and are classed host-bound."""
    model = _gpt_h1024()
    cluster = load_cluster("dgx-a100-80gb", 1)
    plan = ParallelPlan(tp=tp, pp=pp, dp=dp, micro_batch_size=mbs,
                        global_batch_size=8 if mbs == 1 else dp * mbs, recompute="full",
                        precision="fp16")
    gpu = cluster.gpu
    free_host = cluster.with_gpu(dataclasses.replace(
        gpu, efficiency=dataclasses.replace(gpu.efficiency, host_op_s=0.0)))
    e = evaluate_plan(model, cluster, plan)
    gpu_only = evaluate_plan(model, free_host, plan).iteration_time_s
    regime = iv.regimes(model, cluster, [e])[0]
    if host_bound:
        assert e.iteration_time_s > 1.05 * gpu_only
        assert regime == "host-bound"
    else:
        # only the optimizer step's per-tensor operations (292 tensors) remain
        optimizer_host = optimizer_host_s(292, gpu)
        assert e.iteration_time_s - optimizer_host == pytest.approx(gpu_only, rel=1e-3)
        assert regime != "host-bound"


def test_calibrated_parameters_intervals_widen_the_error_bars():
    """A calibration's 95 % intervals travel with the calibrated cluster and widen each plan's
    interval by the closed-form time at either end of every parameter, in quadrature; without
    intervals (or uncalibrated) the interval is the regime's alone."""
    from configurator.core.plan_batch import PlanBatch
    from configurator.cost.iteration import iteration_time
    from topology.calibration import Calibration

    model = load_model("llama3-8b")
    base = load_cluster("dgx-h100-80gb", nodes=1)
    plan = ParallelPlan(tp=2, pp=1, dp=4, micro_batch_size=1, global_batch_size=32)
    values = {"gemm": 0.7, "inter_node_efficiency": 0.8}
    intervals = {"gemm": (0.6, 0.8), "inter_node_efficiency": (0.7, 0.9)}
    gpu = base.gpu.name
    bare = Calibration(values={gpu: {"bf16": values}})
    cal = Calibration(values={gpu: {"bf16": values}}, intervals={gpu: {"bf16": intervals}})
    assert bare.apply_cluster(base, "bf16").calibration_intervals == {}
    cl = cal.apply_cluster(base, "bf16")
    assert cl.calibration_intervals == intervals
    assert cl.subset([0]).calibration_intervals == intervals
    e = evaluate_plan(model, cl, plan)
    [plain] = iv.with_intervals(model, bare.apply_cluster(base, "bf16"), [e])
    [wide] = iv.with_intervals(model, cl, [e])
    assert plain.iteration_time_interval_s == iv.interval_s(e.iteration_time_s, plain.regime)

    def closed(gemm):
        c = Calibration(values={gpu: {"bf16": {**values, "gemm": gemm}}}).apply_cluster(
            base, "bf16")
        return float(iteration_time(model, c, PlanBatch.from_plan(plan))["iteration_time_s"][0])

    t0, slow, fast = closed(0.7), closed(0.6), closed(0.8)
    assert fast < t0 < slow
    # one node: the network efficiency moves nothing, so GEMM's ends alone set the spread
    lo, hi = plain.iteration_time_interval_s
    assert wide.iteration_time_interval_s == pytest.approx(
        (lo * (1 - (1 - fast / t0)), hi * (1 + (slow / t0 - 1))), rel=1e-12)
