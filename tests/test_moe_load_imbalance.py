"""Dropless MoE routing's load imbalance: the busiest expert-parallel rank's routed tokens over
the mean (:func:`configurator.core.plan_terms.expert_load_imbalance`), 1 under Megatron's
``--moe-router-force-load-balancing`` and capped by a capacity factor
(:func:`configurator.core.plan_terms.routed_load_share`), and what it costs a plan: the
expert GEMMs, the all-to-all and the busiest rank's activations."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.plan_batch import PlanBatch
from configurator.core.plan_terms import (AUX_LOSS_MAX_VIOLATION, EXPERT_LOAD_CV,
                                          capacity_share, expert_load_imbalance,
                                          routed_load_share)
from configurator.cost.compute import layer_costs
from configurator.cost.gemm import GEMM_FIXED_S
from configurator.search.evaluate import evaluate_plan
from launchers.megatron_flags import flag_argv, megatron_flags
from memory_model.estimate import estimate_memory
from topology.cluster_files import load_cluster

QWEN235 = MODEL_PRESETS["qwen3-235b-a22b"]
DSV3 = MODEL_PRESETS["deepseek-v3"]

#: ``c = 0.52 / sqrt(2 ln 64)``: the spread of one expert's load behind Wang et al.'s MaxVio.
C = 0.52 / math.sqrt(2 * math.log(64))


def test_spread_is_the_cited_violation_over_64_experts():
    assert AUX_LOSS_MAX_VIOLATION == 0.52
    assert EXPERT_LOAD_CV == pytest.approx(C, rel=1e-15)
    assert EXPERT_LOAD_CV == pytest.approx(0.18030177, rel=1e-7)


@pytest.mark.parametrize("E, ep, want", [
    # DeepSeek-V3, 256 experts over 64 ranks: 1 + c·sqrt(2·64·ln 64/256) = 1 + 0.52/2
    (256, 64, 1.26),
    # one expert a rank: the measured violation itself
    (64, 64, 1.52),
    (256, 32, 1 + C * math.sqrt(2 * 32 * math.log(32) / 256)),      # 1.1678
    (128, 32, 1 + C * math.sqrt(2 * 32 * math.log(32) / 128)),      # 1.2373
    (128, 8, 1 + C * math.sqrt(2 * 8 * math.log(8) / 128)),         # 1.0919
    (8, 8, 1 + C * math.sqrt(2 * math.log(8))),                     # 1.3677
    (8, 2, 1 + C * math.sqrt(2 * 2 * math.log(2) / 8)),             # 1.1061
    # one rank holds every expert: nothing to wait for
    (256, 1, 1.0), (8, 1, 1.0)])
def test_imbalance_exact(E, ep, want):
    assert float(expert_load_imbalance(E, ep)) == pytest.approx(want, rel=1e-12)
    assert float(expert_load_imbalance(E, ep, forced=True)) == 1.0


def test_imbalance_grows_with_ep_and_shrinks_with_experts_a_rank():
    eps = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256])
    got = expert_load_imbalance(256, eps)
    assert np.all(np.diff(got) > 0) and got[0] == 1.0
    # the same ep over more experts (more of them a rank) is more even
    assert expert_load_imbalance(256, 32) < expert_load_imbalance(128, 32) < (
        expert_load_imbalance(64, 32))
    # vectorised over plans, forced per plan
    both = expert_load_imbalance(256, np.array([64, 64]), np.array([False, True]))
    assert both.tolist() == [1.26, 1.0]


def _plan(ep, forced=False, f=0.0, pad=False):
    return SimpleNamespace(ep=ep, moe_router_force_load_balancing=forced,
                           moe_expert_capacity_factor=f, moe_pad_expert_input_to_capacity=pad)


def test_capacity_factor_caps_the_busiest_rank():
    # 256 experts over 64 ranks: I = 1.26
    assert float(routed_load_share(_plan(64), 256)) == pytest.approx(1.26)
    assert float(routed_load_share(_plan(64, f=1.1), 256)) == pytest.approx(1.1)   # dropped
    assert float(routed_load_share(_plan(64, f=1.5), 256)) == pytest.approx(1.26)  # fits
    assert float(routed_load_share(_plan(64, f=0.5), 256)) == pytest.approx(0.5)
    # padding to capacity pays the capacity, however even the routing
    assert float(routed_load_share(_plan(64, f=1.1, pad=True), 256)) == pytest.approx(1.1)
    assert float(routed_load_share(_plan(64, f=1.5, pad=True), 256)) == pytest.approx(1.5)
    assert float(routed_load_share(_plan(64, True, f=1.5, pad=True), 256)) == 1.5


@pytest.mark.parametrize("f, pad", [(0.0, False), (0.5, False), (1.0, False), (1.5, False),
                                    (1.0, True), (1.5, True)])
def test_forced_balance_is_the_capacity_share(f, pad):
    for ep in (1, 8, 64):
        assert float(routed_load_share(_plan(ep, True, f, pad), 256)) == capacity_share(
            _plan(ep, True, f, pad))
    # ep 1: no rank to wait for, forced or not
    assert float(routed_load_share(_plan(1, False, f, pad), 256)) == capacity_share(
        _plan(1, False, f, pad))


#: Qwen3-235B-A22B on 256 H100, ep 32 (128 experts: 4 a rank), BF16, dropless.
PLAN = ParallelPlan(tp=1, pp=2, dp=128, ep=32, micro_batch_size=1,
                    global_batch_size=2048, distributed_optimizer=True)
FORCED = dataclasses.replace(PLAN, moe_router_force_load_balancing=True)


def test_trained_routing_slows_the_expert_gemms_by_the_factor():
    gpu = load_cluster("dgx-h100-80gb", nodes=32).gpu
    I = 1 + C * math.sqrt(2 * 32 * math.log(32) / 128)
    free = layer_costs(QWEN235, PlanBatch.from_plan(PLAN), gpu)
    forced = layer_costs(QWEN235, PlanBatch.from_plan(FORCED), gpu)
    assert float(free["tokens_routed"][0] / forced["tokens_routed"][0]) == pytest.approx(
        I, rel=1e-12)
    # the experts' GEMMs (compute-bound at these shapes: linear in their rows) and their
    # activation pass, less the two GEMMs' fixed launch time, scale by I; the router and the
    # shared work do not
    e_free = float(free["moe_experts_fwd"][0]) - 2 * GEMM_FIXED_S
    e_forced = float(forced["moe_experts_fwd"][0]) - 2 * GEMM_FIXED_S
    assert e_free / e_forced == pytest.approx(I, rel=1e-9)
    # the layer gains that and the permutations' bytes, less than I times the whole layer
    # (attention, router, launches stay)
    extra = float(free["moe_fwd"][0] - forced["moe_fwd"][0])
    assert (I - 1) * e_forced < extra < (I - 1) * float(forced["moe_fwd"][0])


def test_trained_routing_slows_the_plan_and_fills_the_busiest_rank():
    cl = load_cluster("dgx-h100-80gb", nodes=32)
    free, forced = evaluate_plan(QWEN235, cl, PLAN), evaluate_plan(QWEN235, cl, FORCED)
    assert free.iteration_time_s > forced.iteration_time_s
    assert free.time_breakdown_s["ep_comm"] > forced.time_breakdown_s["ep_comm"]
    assert free.time_breakdown_s["compute"] > forced.time_breakdown_s["compute"]

    def peak(p):
        return max(m.total_bytes for m in estimate_memory(QWEN235, PlanBatch.from_plan(p)))
    assert peak(PLAN) > peak(FORCED)


def test_launch_flag_only_when_set_and_moe():
    def argv(model, plan):
        return flag_argv(megatron_flags(model, plan))
    assert "--moe-router-force-load-balancing" in argv(QWEN235, FORCED)
    assert "--moe-router-force-load-balancing" not in argv(QWEN235, PLAN)
    dense = MODEL_PRESETS["llama3-8b"]
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8,
                        moe_router_force_load_balancing=True)
    assert "--moe-router-force-load-balancing" not in argv(dense, plan)


def test_bridge_benchmark_rows_carry_forced_balance():
    """Megatron-Bridge's MoE performance recipes set ``moe_router_force_load_balancing``
    (e.g. scripts/performance/configs/qwen/qwen3_llm_pretrain.py: "required for token
    dropless"): every dropless MoE row of theirs carries it; the token-dropping 25.09 rows
    (capacity 1, padded) do not, and need not."""
    from configurator.cost.groundtruth import bridge_rows
    rows, _ = bridge_rows()
    moe = [r for r in rows if r.model.is_moe]
    assert moe
    for r in moe:
        dropless = r.plan.moe_expert_capacity_factor == 0
        assert r.plan.moe_router_force_load_balancing == dropless, r.source
