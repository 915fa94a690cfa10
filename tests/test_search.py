import itertools

import numpy as np
import pytest

from configurator.core.errors import InputError, NoFeasiblePlanError
from configurator.search.evaluate import evaluate_plan
from configurator.core.model import make_model
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.plan_values import RECOMPUTE
from configurator.core.rules import check_plan
from configurator.search.rank import search
from configurator.search.engine import peak_memory
from configurator.search.space import enumerate_plans
from configurator.cost.iteration import iteration_time
from topology.cluster_files import load_cluster

SMALL = make_model(name="small", num_layers=12, hidden_size=768, num_attention_heads=12,
                   num_query_groups=4, vocab_size=1024, seq_length=1024)


def _key(p: ParallelPlan):
    return (p.tp, p.pp, p.dp, p.cp, p.vp, p.micro_batch_size, p.recompute,
            p.sequence_parallel, p.distributed_optimizer)


def test_enumeration_equals_megatron_rules_brute_force():
    world, gbs = 16, 32
    cand = enumerate_plans(SMALL, world, gbs)
    plans = [cand.plan(i) for i in range(len(cand))]
    # pipeline layouts: only at a (pp, vp) no field-based split reaches (here pp 8, where
    # 12 layers split only as E|(tt|)*6L), each one Megatron accepts
    laid = [p for p in plans if p.pipeline_model_parallel_layout]
    assert {(p.pp, p.vp, p.pipeline_model_parallel_layout) for p in laid} == {
        (8, 1, "E|(tt|)*6L")}
    for p in laid:
        check_plan(SMALL, p, world)
    got = {_key(p) for p in plans if not p.pipeline_model_parallel_layout}
    assert len(got) == len(plans) - len(laid)  # no duplicates
    want = set()
    for tp, pp, cp, vp, mbs in itertools.product(range(1, 17), range(1, 13), range(1, 17),
                                                 range(1, 13), range(1, 33)):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        for rc, sp, do in itertools.product(RECOMPUTE, (False, True), (False, True)):
            if do and dp * cp == 1:
                continue  # same as the plain optimizer; enumerated once
            p = ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, micro_batch_size=mbs,
                             global_batch_size=gbs, recompute=rc, sequence_parallel=sp,
                             distributed_optimizer=do)
            try:
                check_plan(SMALL, p, world)
            except InputError:
                continue
            want.add(_key(p))
    assert got == want


def test_vectorised_time_and_memory_equal_single_plan_estimates():
    cluster = load_cluster("dgx-h100-80gb", nodes=2)
    cand = enumerate_plans(SMALL, 16, 64)
    times = iteration_time(SMALL, cluster, cand)["iteration_time_s"]
    mem = peak_memory(SMALL, cand, non_tn_fp8_gemm=cluster.gpu.non_tn_fp8_gemm)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(cand), 25, replace=False):
        e = evaluate_plan(SMALL, cluster, cand.plan(int(i)))
        assert e.closed_form_iteration_time_s == pytest.approx(times[i], rel=1e-9)
        # the simulated schedule the single-plan estimate reports: the closed form takes
        # every stage as slow as the slowest, so it is an upper bound (to 1 %); on this
        # small model (24 ms iterations) the end stages' extras weigh most
        assert 0.85 * times[i] <= e.iteration_time_s <= 1.01 * times[i]
        assert e.peak_memory_bytes == pytest.approx(mem[i], rel=1e-9)


def test_search_ranks_feasible_plans_by_time():
    model = MODEL_PRESETS["llama3-8b"]
    cluster = load_cluster("dgx-h100-80gb", nodes=2)
    res = search(model, cluster, 128, top_k=20)
    times = [p.iteration_time_s for p in res.plans]
    assert times == sorted(times)
    assert all(p.fits for p in res.plans)
    assert 0 < res.feasible <= res.candidates_evaluated
    # the best plan is at least as fast as a hand-written sensible plan
    hand = evaluate_plan(model, cluster, ParallelPlan(
        tp=2, pp=1, dp=8, micro_batch_size=1, global_batch_size=128, recompute="selective",
        sequence_parallel=True, distributed_optimizer=True))
    assert res.plans[0].iteration_time_s <= hand.iteration_time_s


def test_search_no_feasible_plan_reports_smallest_memory():
    with pytest.raises(NoFeasiblePlanError, match="smallest peak memory"):
        search(MODEL_PRESETS["llama3.1-405b"], load_cluster("dgx-a100-80gb", nodes=1), 8)


def test_search_with_no_legal_plan_is_input_error():
    with pytest.raises(InputError, match="global_batch_size"):
        # 64 GPUs, 7 sequences: dp must divide 7 and tp*pp = 64 cannot split 12 heads/layers
        # (pp 8 can, with the layout E|(tt|)*6L)
        search(SMALL, load_cluster("dgx-a100-80gb", nodes=8), 7, attention_backend="local")


def test_max_memory_fraction_keeps_headroom():
    model = MODEL_PRESETS["gpt3-175b"]
    cluster = load_cluster("dgx-a100-80gb", nodes=16)
    full = search(model, cluster, 256, top_k=1)
    tight = search(model, cluster, 256, top_k=1, max_memory_fraction=0.8)
    assert tight.feasible < full.feasible
    assert tight.plans[0].peak_memory_bytes <= 0.8 * cluster.gpu.memory_bytes
    assert tight.plans[0].iteration_time_s >= full.plans[0].iteration_time_s
