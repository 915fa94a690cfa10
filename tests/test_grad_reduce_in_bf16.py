"""The plan field ``grad_reduce_in_bf16`` (Megatron ``--grad-reduce-in-bf16``): the main
gradients in BF16, 2 bytes per parameter in memory and in the data-parallel reduction
(megatron/training/arguments.py: ``accumulate_allreduce_grads_in_fp32 = False``), as every
Megatron-Bridge performance recipe sets it (``grad_reduce_in_fp32=False``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from configurator.core.megatron_log import runs_from_megatron_log
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.plan_terms import main_grad_bytes
from configurator.cost.groundtruth import bridge_runs
from configurator.search.evaluate import evaluate_plan
from memory_model.estimate import estimate_memory
from tests.conftest import run_cli
from tests.test_megatron_log import DENSE
from topology.cluster_files import load_cluster
from configurator.core.plan_batch import PlanBatch

LLAMA8 = MODEL_PRESETS["llama3-8b"]
PLAN = ParallelPlan(tp=1, pp=1, dp=16, micro_batch_size=1, global_batch_size=16,
                    precision="bf16", distributed_optimizer=True, overlap_grad_reduce=False,
                    overlap_param_gather=False)


def test_main_grad_bytes_follow_megatron():
    assert [main_grad_bytes(p, False) for p in ("bf16", "fp8", "mxfp8", "fp16")] == [4, 4, 4, 2]
    assert [main_grad_bytes(p, True) for p in ("bf16", "fp8", "mxfp8", "fp16")] == [2, 2, 2, 2]


@pytest.mark.parametrize("precision", ["bf16", "fp8", "fp16"])
def test_gradients_and_their_reduction_halve(precision):
    """Gradient memory halves exactly (bf16, fp8; fp16's are 16-bit already); so do the bytes
    of the gradient reduction (without the distributed optimizer an all-reduce, with it a
    reduce-scatter, whose time shrinks by half as much), the parameter all-gather does not
    change."""
    plan = dataclasses.replace(PLAN, precision=precision)
    bf16_grads = dataclasses.replace(plan, grad_reduce_in_bf16=True)
    cl = load_cluster("dgx-h100-80gb", nodes=2)
    mem = [estimate_memory(LLAMA8, PlanBatch.from_plan(p))[0] for p in (plan, bf16_grads)]
    ratio = 1.0 if precision == "fp16" else 0.5
    assert mem[1].gradients_bytes == pytest.approx(ratio * mem[0].gradients_bytes)
    assert mem[1].parameters_bytes == mem[0].parameters_bytes
    with_gather = [evaluate_plan(LLAMA8, cl, p).time_breakdown_s["dp_comm"]
                   for p in (plan, bf16_grads)]
    no_do = [evaluate_plan(LLAMA8, cl, dataclasses.replace(p, distributed_optimizer=False))
             .time_breakdown_s["dp_comm"] for p in (plan, bf16_grads)]
    # the all-reduce alone: bytes halve, its per-step latencies (one set per bucket) do not
    assert no_do[1] > ratio * no_do[0] or ratio == 1.0
    assert no_do[1] < no_do[0] or ratio == 1.0
    # latencies cancel in the differences: the reduce-scatter saves half of what the
    # all-reduce does, and nothing else moves
    assert with_gather[0] - with_gather[1] == pytest.approx((no_do[0] - no_do[1]) / 2,
                                                            rel=1e-6, abs=1e-12)
    if precision != "fp16":
        assert with_gather[1] < with_gather[0]


def test_cli_flag_memory_and_launch(tmp_path):
    """``estimate --grad-reduce-in-bf16`` reports it and 2 bytes of gradient per parameter;
    ``search`` carries it into the header and the launch script's Megatron flags."""
    argv = ("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "1",
            "--gbs", "8", "--tp", "1", "--pp", "1", "--mbs", "1", "--json")
    off, on = (json.loads(run_cli(*argv, *extra).stdout)
               for extra in ((), ("--grad-reduce-in-bf16",)))
    assert on["config"]["grad_reduce_in_bf16"] is True
    assert off["config"]["grad_reduce_in_bf16"] is False
    g = [d["memory_per_stage"][0]["gradients_bytes"] for d in (off, on)]
    assert g[1] == pytest.approx(g[0] / 2)
    out = tmp_path / "out"
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                  "1", "--gbs", "8", "--top", "1", "--grad-reduce-in-bf16", "--out", str(out))
    assert "grad_reduce_in_bf16" in res.stdout
    assert "--grad-reduce-in-bf16" in (out / "launch_torchrun.sh").read_text()


def test_megatron_log_reads_it():
    text = DENSE.read_text()
    line = "grad_reduce_in_bf16 ............................. False"
    assert line in text
    on = text.replace(line, line.replace("False", "True"))
    for body, want in ((text, False), (on, True)):
        (run,) = runs_from_megatron_log(body, cluster="dgx-h100-80gb")
        assert run.plan.grad_reduce_in_bf16 is want


def test_bridge_rows_reduce_in_bf16():
    runs, _ = bridge_runs()
    assert runs and all(r.plan.grad_reduce_in_bf16 for r in runs)
