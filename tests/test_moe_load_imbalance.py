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
from configurator.core.plan_terms import (PER_BATCH_BALANCING, ROUTER_LOAD_CV,
                                          capacity_share, expert_load_imbalance,
                                          routed_load_share, router_balance)
from configurator.cost.compute import layer_costs
from configurator.cost.gemm import GEMM_FIXED_S
from configurator.search.evaluate import evaluate_plan
from launchers.megatron_flags import flag_argv, megatron_flags
from memory_model.estimate import estimate_memory
from topology.cluster_files import load_cluster

QWEN235 = MODEL_PRESETS["qwen3-235b-a22b"]
DSV3 = MODEL_PRESETS["deepseek-v3"]

#: Qwen3's router (global-batch balancing): the spread the Model Zoo's twins measure.
C = ROUTER_LOAD_CV["global"]


def _router(E, k=2, balancing="aux_loss", bias=False):
    return SimpleNamespace(num_experts=E, moe_router_topk=k, moe_router_enable_expert_bias=bias,
                           moe_router_load_balancing_type=balancing)


def test_the_spreads_are_what_the_twin_runs_measure():
    """Each :data:`ROUTER_LOAD_CV` is the median of the spreads its forced and dropless
    twins imply (``bench.accuracy.modelzoo.twins``): the Model Zoo's Mixtral 8x22B pair for
    routers that even every batch, its four Qwen3-235B long-context pairs for those balanced
    over the global batch. A change of the model that moves the experts' part of those runs
    shows here."""
    from bench.accuracy.modelzoo import MIXTRAL, RUNS, twin_pairs, twins
    from configurator.core.runs import load_runs

    runs = load_runs(str(RUNS)) + load_runs(str(MIXTRAL))
    assert len(twin_pairs(runs)) == 5
    medians = twins(runs)
    assert medians.keys() == ROUTER_LOAD_CV.keys()
    for balance, c in medians.items():
        assert ROUTER_LOAD_CV[balance] == pytest.approx(c, abs=0.02), balance
    # a router that evens every batch spreads it far more evenly than one that does not
    assert ROUTER_LOAD_CV["per_batch"] < 0.1 < 1 < ROUTER_LOAD_CV["global"]


@pytest.mark.parametrize("balancing, bias, want", [
    ("aux_loss", False, "per_batch"), ("seq_aux_loss", False, "per_batch"),
    ("sinkhorn", False, "per_batch"), ("global_aux_loss", False, "global"),
    ("none", False, "global"),
    # the expert bias evens every step's batch, whatever loss is beside it (DeepSeek-V3)
    ("seq_aux_loss", True, "per_batch"), ("none", True, "per_batch")])
def test_router_balance_by_megatrons_balancing_type(balancing, bias, want):
    assert router_balance(_router(8, balancing=balancing, bias=bias)) == want
    assert set(PER_BATCH_BALANCING) < set(
        ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"))


def test_presets_name_how_their_routers_were_balanced():
    got = {n: router_balance(m) for n, m in MODEL_PRESETS.items() if m.is_moe}
    assert got == {"qwen3-30b-a3b": "global", "qwen3-235b-a22b": "global",
                   "deepseek-v3": "per_batch", "gpt-oss-120b": "global",
                   "mixtral-8x7b": "per_batch", "llama4-scout": "per_batch",
                   "llama4-maverick": "per_batch", "mixtral-8x22b": "per_batch",
                   "grok-1": "per_batch"}


CS = ROUTER_LOAD_CV["per_batch"]
#: 256 experts top-8 over 64 ranks, balanced over the global batch: I = 1 + 1.40·sqrt(2 ln 64
#: / 2), 3.02.
I64 = 1 + C * math.sqrt(2 * 64 * math.log(64) / 256)
ROUTER = _router(256, 8, "none")


@pytest.mark.parametrize("E, k, ep, balancing, want", [
    # Qwen3-235B over 8 ranks (16 experts a rank): 1 + c·sqrt(2·8·ln 8/128), 1.71
    (128, 8, 8, "global_aux_loss", 1 + C * math.sqrt(2 * 8 * math.log(8) / 128)),
    # DeepSeek-V3's 256 experts over 64 ranks without its bias: 1 + c·sqrt(2·64·ln 64/256)
    (256, 8, 64, "none", 1 + C * math.sqrt(2 * 64 * math.log(64) / 256)),
    (128, 8, 32, "global_aux_loss", 1 + C * math.sqrt(2 * 32 * math.log(32) / 128)),
    # Mixtral's 8 experts, one a rank, each micro-batch evened: 1.075
    (8, 2, 8, "aux_loss", 1 + CS * math.sqrt(2 * math.log(8))),
    (8, 2, 2, "aux_loss", 1 + CS * math.sqrt(2 * 2 * math.log(2) / 8)),
    # at most every token once on each of a rank's experts: 16 experts top-8 over 16 ranks
    # would give 1 + c·sqrt(2 ln 16) = 4.3; a rank receives at most 16·1/8 = 2 times the mean
    (16, 8, 16, "global_aux_loss", 2.0),
    (4, 1, 4, "global_aux_loss", 1 + C * math.sqrt(2 * math.log(4))),   # 3.33, under 4
    # one rank holds every expert: nothing to wait for
    (256, 8, 1, "none", 1.0), (8, 2, 1, "aux_loss", 1.0)])
def test_imbalance_exact(E, k, ep, balancing, want):
    router = _router(E, k, balancing)
    assert float(expert_load_imbalance(router, ep)) == pytest.approx(want, rel=1e-12)
    assert float(expert_load_imbalance(router, ep, forced=True)) == 1.0


def test_imbalance_grows_with_ep_and_shrinks_with_experts_a_rank():
    eps = np.array([1, 2, 4, 8, 16, 32, 64])
    for router in (DSV3, ROUTER):
        got = expert_load_imbalance(router, eps)
        assert np.all(np.diff(got) > 0) and got[0] == 1.0
    # DeepSeek-V3's expert bias evens every step's batch: its busiest of 64 ranks 1.05
    assert float(expert_load_imbalance(DSV3, 64)) == pytest.approx(
        1 + CS * math.sqrt(2 * 64 * math.log(64) / 256), rel=1e-12)
    # the same ep over more experts (more of them a rank) is more even
    assert (expert_load_imbalance(_router(256, 8, "none"), 32)
            < expert_load_imbalance(_router(128, 8, "none"), 32)
            < expert_load_imbalance(_router(64, 8, "none"), 32))
    # vectorised over plans, forced per plan
    both = expert_load_imbalance(ROUTER, np.array([64, 64]), np.array([False, True]))
    assert both.tolist() == [pytest.approx(I64, rel=1e-12), 1.0]


def _plan(ep, forced=False, f=0.0, pad=False):
    return SimpleNamespace(ep=ep, moe_router_force_load_balancing=forced,
                           moe_expert_capacity_factor=f, moe_pad_expert_input_to_capacity=pad)




def test_capacity_factor_caps_the_busiest_rank():
    assert float(routed_load_share(_plan(64), ROUTER)) == pytest.approx(I64)
    assert float(routed_load_share(_plan(64, f=1.1), ROUTER)) == pytest.approx(1.1)  # dropped
    assert float(routed_load_share(_plan(64, f=4.0), ROUTER)) == pytest.approx(I64)  # fits
    assert float(routed_load_share(_plan(64, f=0.5), ROUTER)) == pytest.approx(0.5)
    # padding to capacity pays the capacity, however even the routing
    assert float(routed_load_share(_plan(64, f=1.1, pad=True), ROUTER)) == pytest.approx(1.1)
    assert float(routed_load_share(_plan(64, f=4.0, pad=True), ROUTER)) == pytest.approx(4.0)
    assert float(routed_load_share(_plan(64, True, f=1.5, pad=True), ROUTER)) == 1.5


@pytest.mark.parametrize("f, pad", [(0.0, False), (0.5, False), (1.0, False), (1.5, False),
                                    (1.0, True), (1.5, True)])
def test_forced_balance_is_the_capacity_share(f, pad):
    for ep in (1, 8, 64):
        assert float(routed_load_share(_plan(ep, True, f, pad), ROUTER)) == capacity_share(
            _plan(ep, True, f, pad))
    # ep 1: no rank to wait for, forced or not
    assert float(routed_load_share(_plan(1, False, f, pad), ROUTER)) == capacity_share(
        _plan(1, False, f, pad))


#: Qwen3-235B-A22B on 256 H100, ep 32 (128 experts: 4 a rank), BF16, dropless.
PLAN = ParallelPlan(tp=1, pp=2, dp=128, ep=32, micro_batch_size=1,
                    global_batch_size=2048, distributed_optimizer=True)
FORCED = dataclasses.replace(PLAN, moe_router_force_load_balancing=True)


def test_trained_routing_slows_the_expert_gemms_by_the_factor():
    gpu = load_cluster("dgx-h100-80gb", nodes=32).gpu
    I = 1 + C * math.sqrt(2 * 32 * math.log(32) / 128)     # Qwen3's router, 4 experts a rank
    free = layer_costs(QWEN235, PlanBatch.from_plan(PLAN), gpu)
    forced = layer_costs(QWEN235, PlanBatch.from_plan(FORCED), gpu)
    assert float(free["tokens_routed"][0] / forced["tokens_routed"][0]) == pytest.approx(
        I, rel=1e-12)
    # the experts' GEMMs (compute-bound at these shapes: linear in their rows) and their
    # activation pass, less the fixed time of each of the two grouped GEMMs' members (4 local
    # experts), scale by I; the router and the shared work do not
    fixed = 2 * (QWEN235.num_experts // PLAN.ep) * GEMM_FIXED_S
    e_free = float(free["moe_experts_fwd"][0]) - fixed
    e_forced = float(forced["moe_experts_fwd"][0]) - fixed
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


def test_estimate_says_what_the_routing_puts_on_the_busiest_rank():
    """``configurator estimate``'s title names the busiest expert rank's share and the
    router's balancing for an MoE plan whose ranks the routing leaves uneven, and says
    nothing where forced balance, padding or ep 1 leave them even."""
    from configurator.app.plan_jobs import routing_note

    plan = ParallelPlan(tp=1, pp=1, dp=16, ep=8, micro_batch_size=1, global_batch_size=256)
    note = routing_note(QWEN235, plan)
    want = 1 + C * math.sqrt(2 * 8 * math.log(8) / 128)
    assert f"takes {want:.2f}x the even share" in note and "global_aux_loss" in note
    assert "balances the global batch only" in note
    dropped = routing_note(QWEN235, dataclasses.replace(plan, moe_expert_capacity_factor=1.25))
    assert "takes 1.25x" in dropped and "capacity factor 1.25" in dropped
    assert "expert bias" in routing_note(DSV3, plan) and "evens every batch" in routing_note(
        DSV3, plan)
    for even in (dataclasses.replace(plan, moe_router_force_load_balancing=True),
                 dataclasses.replace(plan, moe_expert_capacity_factor=1.0,
                                     moe_pad_expert_input_to_capacity=True),
                 dataclasses.replace(plan, ep=1)):
        assert routing_note(QWEN235, even) == ""
    assert routing_note(MODEL_PRESETS["llama3-8b"], dataclasses.replace(plan, ep=1)) == ""


def test_search_says_what_the_routing_puts_on_plan_1s_busiest_rank():
    """The search's header names plan 1's routing share where it routes dropless across
    expert ranks (why a dropless Qwen3 search keeps ep small), and not under forced
    balance."""
    from configurator.app.inputs import JobInputs
    from configurator.app.plan_jobs import SearchRequest, run_search, routing_note

    def header(**options):
        out = run_search(SearchRequest(
            inputs=JobInputs(model="qwen3-30b-a3b", cluster="dgx-h100-80gb", nodes=2),
            global_batch_size=64, top=1, options=options))
        return out.header, out.result.plans[0].plan

    text, best = header()
    line = next(ln for ln in text.splitlines() if ln.startswith("plan 1 routing:"))
    assert best.ep > 1 and line == "plan 1" + routing_note(
        MODEL_PRESETS["qwen3-30b-a3b"], best)[1:]
    assert "balances the global batch only" in line
    text, _ = header(moe_router_force_load_balancing=True)
    assert "routing:" not in text
