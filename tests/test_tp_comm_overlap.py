"""The plan field ``tp_comm_overlap`` (Megatron ``--tp-comm-overlap``): Transformer Engine's
userbuffers overlap each tensor-parallel all-gather and reduce-scatter with the GEMM of its
sublayer, by the method of TE's default configuration (transformer_engine/pytorch/module/
base.py ``initialize_ub``): ring exchange for the forward QKV/fc1 all-gather and the
projection/fc2 input-gradient all-gather (every SM left to the GEMM), pipelined or bulk with
16 SMs taken from the GEMM for the others."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.plan_terms import tp_comm_overlapped
from configurator.cost.compute import layer_costs
from configurator.cost.iteration import UB_COMM_SMS, tp_layer_s
from configurator.search.evaluate import evaluate_plan
from tests.conftest import run_cli
from tests.test_megatron_log import DENSE_TEXT, one, with_args
from topology.cluster_files import load_cluster

LLAMA70 = MODEL_PRESETS["llama3-70b"]
PLAN = ParallelPlan(tp=8, pp=1, dp=2, micro_batch_size=1, global_batch_size=8,
                    precision="bf16", sequence_parallel=True, distributed_optimizer=True)
ON = dataclasses.replace(PLAN, tp_comm_overlap=True)


def _tp(plan, tp_bw, recompute="none"):
    """``tp_layer_s`` of one Llama-3 70B layer on H100 at a given tp bandwidth (B/s)."""
    plan = dataclasses.replace(plan, recompute=recompute)
    c = PlanBatch.from_plan(plan)
    gpu = load_cluster("dgx-h100-80gb").gpu
    lc = layer_costs(LLAMA70, c, gpu)
    act = 2.0 * lc["tokens"] * LLAMA70.hidden_size
    f, b = tp_layer_s(lc, c, act, np.array([tp_bw]), np.array([0.0]), gpu.num_sms)
    return float(f[0]), float(b[0]), lc, gpu


def test_overlapped_only_where_megatron_and_te_run_it():
    assert tp_comm_overlapped(True, 8, True, "auto")
    assert not tp_comm_overlapped(True, 1, True, "auto")        # no tp collectives
    assert not tp_comm_overlapped(True, 8, False, "auto")       # validate_args asserts SP
    assert not tp_comm_overlapped(True, 8, True, "local")       # no TE layers
    assert not tp_comm_overlapped(False, 8, True, "auto")
    assert list(tp_comm_overlapped(True, np.array([1, 2, 4]), np.array([True, True, False]),
                                   "flash")) == [False, True, False]


def test_free_links_leave_only_the_sm_margin():
    """With instant collectives the overlap costs the GEMMs that lose 16 SMs: the forward
    projection and fc2 (pipelined reduce-scatter), twice the QKV and fc1 in backward (bulk
    all-gather under the input-gradient GEMM, bulk reduce-scatter under the weight-gradient
    one); without the overlap nothing is exposed."""
    f, b, lc, gpu = _tp(ON, 1e30)
    (qkv, proj), (fc1, fc2) = (tuple(float(g[0]) for g in pair) for pair in lc["tp_gemm_pairs"])
    k = UB_COMM_SMS / (gpu.num_sms - UB_COMM_SMS)
    assert f == pytest.approx(k * (proj + fc2), rel=1e-9)
    assert b == pytest.approx(2 * k * (qkv + fc1), rel=1e-9)
    f0, b0, _, _ = _tp(PLAN, 1e30)
    assert f0 == pytest.approx(0.0, abs=1e-12) and b0 == pytest.approx(0.0, abs=1e-12)


def test_slow_links_hide_exactly_the_gemms():
    """Where every collective outlasts its GEMM the overlap hides each GEMM once per
    collective: forward 2 all-reduce-equivalents minus the four forward GEMMs; backward
    three halves per sublayer minus projection/fc2 once and QKV/fc1 twice. A full
    recompute's re-run forward repeats the forward's exposure."""
    bw = 1e8                                    # 0.1 GB/s: collectives dwarf the GEMMs
    f0, _, lc, _ = _tp(PLAN, bw)
    t_coll = f0 / 2
    (qkv, proj), (fc1, fc2) = (tuple(float(g[0]) for g in pair) for pair in lc["tp_gemm_pairs"])
    f, b, _, _ = _tp(ON, bw)
    assert f == pytest.approx(2 * t_coll - (qkv + proj + fc1 + fc2), rel=1e-9)
    assert b == pytest.approx(3 * t_coll - (proj + fc2) - 2 * (qkv + fc1), rel=1e-9)
    fr, br, _, _ = _tp(ON, bw, recompute="full")
    assert fr == pytest.approx(f) and br == pytest.approx(b + f)


def test_estimate_cli_launch_and_the_iteration():
    """``estimate --tp-comm-overlap`` prices it (Llama-3 70B at tp 8 on H100: exposed tp
    time falls, nothing else of the layer moves) and the launch flags carry it."""
    argv = ("estimate", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--nodes",
            "2", "--gbs", "16", "--tp", "8", "--pp", "1", "--mbs", "1", "--json")
    off, on = (json.loads(run_cli(*argv, *extra).stdout)
               for extra in ((), ("--tp-comm-overlap",)))
    assert on["config"]["tp_comm_overlap"] is True and off["config"]["tp_comm_overlap"] is False
    t_off, t_on = off["time_breakdown_s"], on["time_breakdown_s"]
    assert t_on["tp_comm"] < t_off["tp_comm"]
    assert t_on["compute"] == pytest.approx(t_off["compute"])
    assert on["iteration_time_s"] < off["iteration_time_s"]
    cl = load_cluster("dgx-h100-80gb", nodes=2)
    no_sp = dataclasses.replace(ON, sequence_parallel=False)
    assert (evaluate_plan(LLAMA70, cl, no_sp).time_breakdown_s
            == evaluate_plan(LLAMA70, cl, dataclasses.replace(no_sp, tp_comm_overlap=False))
            .time_breakdown_s)


def test_search_carries_it_into_the_launch_script(tmp_path):
    out = tmp_path / "out"
    res = run_cli("search", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--nodes",
                  "4", "--gbs", "32", "--top", "1", "--tp-comm-overlap", "--out", str(out))
    assert "tp_comm_overlap" in res.stdout
    plan = json.loads((out / "plan.json").read_text())["plan"]
    assert plan["tp"] > 1 and plan["sequence_parallel"] and plan["tp_comm_overlap"]
    assert "--tp-comm-overlap" in (out / "launch_torchrun.sh").read_text()


def test_megatron_log_reads_it():
    for value in (False, True):
        assert one(with_args(DENSE_TEXT, tp_comm_overlap=value)).plan.tp_comm_overlap is value


def test_an_option_prefix_is_not_taken_for_it():
    """With prefix matching argparse would read ``--tp-comm`` as ``--tp-comm-overlap`` (and
    ``--to 3`` as ``--top 3``); options are matched whole, and the error names the options
    meant."""
    base = ("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gbs", "8")
    res = run_cli(*base, "--tp-comm")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "configurator search: error: unrecognized arguments: --tp-comm; did you mean "
        "'--tp-comm-overlap' or '--tp'?"]
    res = run_cli(*base, "--to", "3")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "configurator search: error: unrecognized arguments: --to 3; did you mean "
        "'--topology' or '--top'?"]
