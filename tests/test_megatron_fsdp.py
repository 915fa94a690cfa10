"""The plan field ``megatron_fsdp`` (Megatron ``--use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads_params``): weights, main gradients and optimizer
state sharded over dp·cp, each unit's weights gathered before its forward and backward and
its gradients reduce-scattered after every micro-batch (megatron-fsdp-user-guide.md,
core_v0.16.1)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.core.errors import InputError
from configurator.core.plan import ParallelPlan
from configurator.core.rules import check_plan
from configurator.cost.groundtruth import bridge_runs
from configurator.cost.iteration import dp_exposed_s
from launchers.megatron_flags import flag_argv, megatron_flags
from memory_model.estimate import FSDP_LIVE_UNITS, estimate_memory
from memory_model.params import dense_layer_parameters, embedding_parameters
from tests.conftest import run_cli
from tests.megatron_argv import LLAMA8
from tests.test_megatron_log import DENSE_TEXT, one, with_args
from topology.collectives import all_gather_time_s

PLAN = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=32,
                    precision="bf16", distributed_optimizer=True)
FSDP = dataclasses.replace(PLAN, megatron_fsdp=True)


def test_weights_and_gradients_are_sharded_with_two_units_live():
    """BF16 weights (2 bytes) and FP32 main gradients (4): each parameter's share over the
    8 ranks plus two of the largest unit (Llama-3 8B: the embedding) whole; the optimizer
    state and the activations do not move."""
    (dense,), (fsdp,) = estimate_memory(LLAMA8, PLAN), estimate_memory(LLAMA8, FSDP)
    params = dense.parameters_bytes / 2.0
    unit = max(dense_layer_parameters(LLAMA8), embedding_parameters(LLAMA8))
    assert unit == embedding_parameters(LLAMA8)
    assert fsdp.parameters_bytes == pytest.approx(2.0 * (params / 8 + FSDP_LIVE_UNITS * unit))
    assert fsdp.gradients_bytes == pytest.approx(4.0 * (params / 8 + FSDP_LIVE_UNITS * unit))
    assert fsdp.optimizer_bytes == dense.optimizer_bytes
    assert fsdp.activations_bytes == dense.activations_bytes


def test_it_needs_the_distributed_optimizer():
    with pytest.raises(InputError, match="megatron_fsdp"):
        check_plan(LLAMA8, dataclasses.replace(FSDP, distributed_optimizer=False), 8)


def test_every_microbatch_gathers_twice_and_reduces_once():
    """Without windows every micro-batch exposes two weight all-gathers (16-bit) and one
    gradient reduce-scatter (the main-gradient dtype); windows longer than the
    communication hide it all."""
    c = PlanBatch.from_plan(FSDP)
    params, bw, lat = 1e9, np.array([1e11]), np.array([1e-5])
    gather = all_gather_time_s(params * 2.0, 8.0, bw, lat)
    scatter = all_gather_time_s(params * 4.0, 8.0, bw, lat)
    m = FSDP.num_microbatches
    t = dp_exposed_s(c, params, bw, lat, bwd_window_s=0.0, fwd_window_s=0.0)
    assert float(t[0]) == pytest.approx(m * (2 * gather[0] + scatter[0]))
    hidden = dp_exposed_s(c, params, bw, lat, bwd_window_s=10.0, fwd_window_s=10.0)
    assert float(hidden[0]) == 0.0


def test_launch_flags_and_environment(tmp_path):
    argv = flag_argv(megatron_flags(LLAMA8, FSDP))
    for flag in ("--use-megatron-fsdp", "--no-gradient-accumulation-fusion",
                 "--use-distributed-optimizer"):
        assert flag in argv
    assert argv[argv.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"
    assert argv[argv.index("--ckpt-format") + 1] == "fsdp_dtensor"
    assert "--use-megatron-fsdp" not in flag_argv(megatron_flags(LLAMA8, PLAN))
    out = tmp_path / "out"
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                  "1", "--gbs", "32", "--top", "1", "--megatron-fsdp", "--out", str(out))
    assert "megatron_fsdp" in res.stdout, res.stderr
    for script in ("launch_torchrun.sh", "launch_slurm.sbatch"):
        text = (out / script).read_text()
        assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in text       # validate_args: not 1
        assert "CUDA_DEVICE_MAX_CONNECTIONS=1" not in text
        assert "--use-megatron-fsdp" in text


def test_megatron_log_reads_it():
    for value in (False, True):
        assert one(with_args(DENSE_TEXT, use_megatron_fsdp=value)).plan.megatron_fsdp is value


def test_bridge_fsdp_row_runs_it():
    """Megatron-Bridge's Llama-3 8B FP8 row on 8 H100 runs Megatron FSDP over its 8 GPUs (25.09;
    the 25.11 row recomputes 5 layers by blocks, no plan field, and is skipped)."""
    runs, skipped = bridge_runs(newest_only=False)
    fsdp = [r.name for r in runs if r.plan.megatron_fsdp]
    assert fsdp == ["bridge 25.09 llama3-8b dgx-h100-80gb fp8 8"]
    assert any("25.11 LLAMA3_8B DGX-H100" in s and "block" in s for s in skipped)
