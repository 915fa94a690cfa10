"""The plan field ``megatron_fsdp`` (Megatron ``--use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads_params``): weights, main gradients and optimizer
state sharded over dp·cp, each unit's weights gathered before its forward and backward and
its gradients reduce-scattered after every micro-batch (megatron-fsdp-user-guide.md,
core_v0.16.1); a unit's expert weights travel in the same hooks over the expert-data-parallel
group and overlap the same passes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from configurator.core.model_presets import load_model
from configurator.core.plan_batch import PlanBatch
from configurator.core.errors import InputError
from configurator.core.plan import ParallelPlan
from configurator.core.rules import check_plan
from configurator.cost.groundtruth import bridge_runs
from configurator.cost.iteration import dp_exposed_s, iteration_time
from configurator.cost.placed import PlacedPlan
from launchers.megatron_flags import flag_argv, megatron_flags
from memory_model.estimate import estimate_memory
from memory_model.params import dense_layer_parameters, embedding_parameters
from tests.conftest import run_cli
from tests.megatron_argv import LLAMA8
from tests.test_megatron_log import DENSE_TEXT, one, with_args
from topology.cluster_files import load_cluster
from topology.collectives import all_gather_time_s

PLAN = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=32,
                    precision="bf16", distributed_optimizer=True)
FSDP = dataclasses.replace(PLAN, megatron_fsdp=True)


def test_weights_and_gradients_are_sharded_with_two_units_live():
    """BF16 weights (2 bytes) and FP32 main gradients (4): each parameter's share over the
    8 ranks plus two of the largest unit (Llama-3 8B: the embedding) whole; the optimizer
    state and the activations do not move."""
    (dense,), (fsdp,) = (estimate_memory(LLAMA8, PlanBatch.from_plan(p)) for p in (PLAN, FSDP))
    params = dense.parameters_bytes / 2.0
    unit = max(dense_layer_parameters(LLAMA8), embedding_parameters(LLAMA8))
    assert unit == embedding_parameters(LLAMA8)
    # two units whole: the one computing and the one prefetched (--fsdp-double-buffer's two
    # persistent buffers, megatron-fsdp-user-guide.md)
    assert fsdp.parameters_bytes == pytest.approx(2.0 * (params / 8 + 2 * unit))
    assert fsdp.gradients_bytes == pytest.approx(4.0 * (params / 8 + 2 * unit))
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


#: Qwen3-30B-A3B on 16 ranks with ep 8: Megatron FSDP shards the experts over the
#: expert-data-parallel group tp·cp·dp/(ep·etp) = 2, the rest over dp·cp = 16.
MOE_FSDP = ParallelPlan(tp=1, pp=1, dp=16, ep=8, micro_batch_size=1, global_batch_size=64,
                        precision="bf16", distributed_optimizer=True, megatron_fsdp=True,
                        recompute="full")


def test_a_unit_gathers_and_reduces_its_experts_with_its_other_weights():
    """megatron_fsdp.py (core_v0.16.1) gathers every parameter of an FSDP unit (a
    TransformerLayer, experts included) in ``_pre_forward_param_unshard`` and
    ``_pre_backward_param_unshard`` on the one all-gather pipeline, and reduce-scatters each
    gradient in ``_process_post_backward_gradients`` on every backward
    (``grad_reduce_every_bprop`` for ``optim_grads_params``; ``no_sync`` does not stop it);
    the expert buckets only use the expert-data-parallel group. So per micro-batch two
    gathers and one reduction of both shares, hidden together under the passes' windows."""
    c = PlanBatch.from_plan(MOE_FSDP)
    m = MOE_FSDP.num_microbatches
    assert m == 4
    ne, ex = 3e8, 2e9
    bw, lat, ebw, elat = np.array([1e11]), np.array([1e-5]), np.array([4e10]), np.array([2e-5])
    ag_ne = all_gather_time_s(ne * 2.0, 16.0, bw, lat)[0]
    rs_ne = all_gather_time_s(ne * 4.0, 16.0, bw, lat)[0]
    ag_ex = all_gather_time_s(ex * 2.0, 2.0, ebw, elat)[0]
    rs_ex = all_gather_time_s(ex * 4.0, 2.0, ebw, elat)[0]
    kw = dict(expert=(ex, ebw, elat))
    bare = dp_exposed_s(c, ne, bw, lat, bwd_window_s=0.0, fwd_window_s=0.0, **kw)
    assert float(bare[0]) == pytest.approx(m * (2 * (ag_ne + ag_ex) + rs_ne + rs_ex))
    # windows longer than both shares' traffic hide all of it, the expert share included
    fwd, bwd = ag_ne + ag_ex + 1e-3, ag_ne + ag_ex + rs_ne + rs_ex + 1e-3
    assert float(dp_exposed_s(c, ne, bw, lat, bwd_window_s=bwd, fwd_window_s=fwd,
                              **kw)[0]) == 0.0
    # a forward window that hides only the non-expert gather leaves the expert one out
    part = dp_exposed_s(c, ne, bw, lat, bwd_window_s=bwd, fwd_window_s=ag_ne, **kw)
    assert float(part[0]) == pytest.approx(m * ag_ex)


def test_without_fsdp_the_expert_reduction_shares_the_dense_windows():
    """The distributed optimizer's expert gradients reduce, and its expert weights gather,
    under the same windows as the dense ones (megatron-core DDP's bucket groups): with no
    window the exposure is the two groups' traffic priced apart; with 1 s windows, wider
    than both groups' traffic together, only the last buckets of each stay exposed."""
    from configurator.cost.iteration import _dp_group_s

    c = PlanBatch.from_plan(dataclasses.replace(MOE_FSDP, megatron_fsdp=False))
    bw, lat, ebw, elat = np.array([1e11]), np.array([1e-5]), np.array([4e10]), np.array([2e-5])
    open_ = dp_exposed_s(c, 3e8, bw, lat, bwd_window_s=0.0, fwd_window_s=0.0,
                         expert=(2e9, ebw, elat))
    apart = (dp_exposed_s(c, 3e8, bw, lat, bwd_window_s=0.0, fwd_window_s=0.0)
             + dp_exposed_s(c, 2e9, ebw, elat, bwd_window_s=0.0, fwd_window_s=0.0, group=2.0))
    assert float(open_[0]) == pytest.approx(float(apart[0]))
    hidden = dp_exposed_s(c, 3e8, bw, lat, bwd_window_s=1.0, fwd_window_s=1.0,
                          expert=(2e9, ebw, elat))
    dense = _dp_group_s(c, 3e8, (c.dp * c.cp).astype(float), bw, lat)
    expert = _dp_group_s(c, 2e9, 2.0, ebw, elat)
    assert float(open_[0]) > 1.0 / 20 > float(hidden[0])
    assert float(hidden[0]) == pytest.approx(
        float(dense[2][0] + dense[3][0] + expert[2][0] + expert[3][0]))


def test_closed_form_and_placed_schedule_price_the_moe_units_alike():
    """Both pricing paths call the one definition: on the uniform preset cluster the
    simulated schedule's exposed data-parallel tail of a Megatron FSDP MoE plan equals the
    closed form's data-parallel term."""
    model, cl = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100-80gb", 2)
    closed = iteration_time(model, cl, PlanBatch.from_plan(MOE_FSDP))
    priced = PlacedPlan(model, cl, PlanBatch.from_plan(MOE_FSDP))
    placed = priced.time(*priced.default_placement(), record=True)
    tail = max(t["dp_exposed_s"] for t in placed.stage_times())
    assert tail == pytest.approx(float(closed["dp_comm"][0]), rel=1e-6)


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
    the 25.11 row recomputes 5 layers by blocks, no plan field, and is skipped); the other
    FSDP rows are the GB200/GB300 recipes of Llama-3 70B (tp 1) and 3.1 405B (tp 2, 25.09)
    that offload whole layers to the Grace CPU at pp 1: 40 of 80 on GB200, 20 on GB300, 95 of
    126."""
    runs, skipped = bridge_runs(newest_only=False)
    fsdp = [r for r in runs if r.plan.megatron_fsdp]
    assert [r.name for r in fsdp if not r.plan.cpu_offloading_num_layers] == [
        "bridge 25.09 llama3-8b dgx-h100-80gb fp8 8"]
    offloading = {(r.model.name, r.cluster, r.plan.tp, r.plan.pp, r.plan.cpu_offloading_num_layers)
                  for r in fsdp if r.plan.cpu_offloading_num_layers}
    assert offloading == {("llama3-70b", "gb200-nvl72", 1, 1, 40),
                          ("llama3-70b", "gb300-nvl72", 1, 1, 20),
                          ("llama3.1-405b", "gb200-nvl72", 2, 1, 95)}
    assert any("25.11 LLAMA3_8B DGX-H100" in s and "block" in s for s in skipped)
