"""Time, cost and energy to train (configurator/cost/training_time.py): the published points,
the interval formulas, the exact expectation against a Monte-Carlo, and the properties."""

import dataclasses
import math

import pytest
from hypothesis import given, settings, strategies as st

from bench.accuracy.training_time import (BLOOM_CHECKPOINT_BYTES, bloom_size, kokolis_rows,
                                          llama3_estimate)
from configurator.core.model_presets import load_model
from configurator.core.rules import plan_for_world
from configurator.cost.training_time import (DAY_S, TrainingInputs, closed_form_holds,
                                             best_interval, checkpoint_bytes,
                                             daly_interval_s, estimate_training,
                                             ettr_closed_form, ettr_exact, ettr_monte_carlo,
                                             parse_tokens, young_interval_s)
from configurator.core.errors import InputError
from topology.gpus import GPU_PRESETS
from configurator.core.plan_batch import PlanBatch

H100 = GPU_PRESETS["h100-80gb"]


def test_kokolis_16k_examples_within_003():
    # 0.70 at 60 minutes, 0.93 at 5 minutes (Kokolis et al., HPCA 2025)
    rows = kokolis_rows()
    assert [r[0] for r in rows] == [60.0, 5.0]
    for minutes, paper, closed, exact in rows:
        assert abs(closed - paper) <= 0.03, (minutes, closed)
        assert abs(exact - paper) <= 0.03, (minutes, exact)


def test_llama3_405b_ettr_above_090():
    t = llama3_estimate()
    assert t.ettr > 0.90
    # 466 interruptions in 54 days at its rate: the process's own count over 54 days
    assert t.failure_rate_per_s * 54 * DAY_S == pytest.approx(466)
    assert 5e12 < t.checkpoint_bytes < 6.5e12     # 405B x 14 bytes
    assert t.save_stall_s == pytest.approx(t.checkpoint_bytes / 2e12, rel=0.01)


def test_the_default_failure_rate_is_llama3s():
    """With no rate given, a job of Llama 3's 2,048 nodes is interrupted as Llama 3 was:
    466 times in its 54-day snapshot (arXiv:2407.21783 §3.3.4, Table 5); the estimate
    turns a node-day rate into its job's rate as test_llama3_405b_ettr_above_090 checks."""
    rate = TrainingInputs(train_tokens=1.0).failure_rate_per_node_day
    assert rate * 54 * 2048 == pytest.approx(466)


def test_the_docs_defaults_table_states_the_defaults():
    """docs/training_time.md's "Defaults" table gives what a job with no training inputs is
    priced with: the failure rate, the restart's fixed part (the 5 minutes behind Kokolis et
    al.'s examples, which the bench prices with this same default), storage, the GPUs' draw
    and the PUE."""
    import re
    from pathlib import Path

    from bench.accuracy.training_time import KOKOLIS

    text = Path(__file__).resolve().parents[1].joinpath("docs", "training_time.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| ([^|]+?) \| ([^|]+?) \|", text,
                                                         re.M)}

    def number(cell):
        return float(re.findall(r"[\d,]+(?:\.\d+)?", cell)[-1].replace(",", ""))

    d = TrainingInputs(train_tokens=1.0)
    assert number(rows["failures per node-day"]) == pytest.approx(
        d.failure_rate_per_node_day, abs=5e-6)
    assert number(rows["restart, fixed part"]) == d.restart_overhead_s == KOKOLIS["restart_s"]
    assert number(rows["storage write / read, aggregate"]) * 1e9 == pytest.approx(
        d.aggregate_write_Bps) == d.aggregate_read_Bps
    assert number(rows["storage write / read, per node"]) * 1e9 == pytest.approx(
        d.node_write_Bps, rel=0.01)
    assert number(rows["GPU draw while training"]) == d.gpu_power_fraction
    assert number(rows["PUE"]) == d.pue


def test_bloom_checkpoint_within_10_percent():
    assert abs(bloom_size() / BLOOM_CHECKPOINT_BYTES - 1) <= 0.10


@pytest.mark.parametrize("save_s, mtbf_s, young, daly", [
    # Young sqrt(2 d M); Daly sqrt(2dM)[1 + sqrt(d/2M)/3 + d/(2M)/9] - d
    (60.0, 86400.0, 3219.9378875, 3180.0617),
    (10.0, 3600.0, 268.3281573, 261.7029),
    (300.0, 21600.0, 3600.0, 3402.7778),
])
def test_young_and_daly_equal_the_formulas(save_s, mtbf_s, young, daly):
    assert young_interval_s(save_s, mtbf_s) == pytest.approx(young, rel=1e-9)
    assert daly_interval_s(save_s, mtbf_s) == pytest.approx(daly, rel=1e-6)


def test_daly_beyond_twice_the_mtbf_is_the_mtbf():
    """Daly's Eq. 37 holds for δ < 2M; from δ = 2M on (the boundary included, where the
    series would give 8/9 of M) the interval is M."""
    assert daly_interval_s(500.0, 100.0) == 100.0
    assert daly_interval_s(200.0, 100.0) == 100.0
    assert daly_interval_s(199.999, 100.0) == pytest.approx(800.0 / 9.0, rel=1e-4)


@pytest.mark.parametrize("lam, u0, dt, w", [
    (2048 * 6.5e-3 / DAY_S, 300.0, 3600.0, 0.0),
    (2048 * 6.5e-3 / DAY_S, 300.0, 300.0, 10.0),
    (1 / 3600.0, 120.0, 1800.0, 60.0),
    (1 / 600.0, 300.0, 900.0, 30.0),          # far outside the closed form
])
def test_exact_expectation_matches_monte_carlo_within_1_percent(lam, u0, dt, w):
    mc = ettr_monte_carlo(lam, u0, dt, w, segments=200_000, seed=1)
    assert mc == pytest.approx(ettr_exact(lam, u0, dt, w), rel=0.01)


@settings(max_examples=60, deadline=None)
@given(lam_per_h=st.floats(0.001, 2.0), u0=st.floats(0.0, 1200.0),
       dt=st.floats(30.0, 7200.0), w=st.floats(0.0, 120.0))
def test_closed_form_matches_monte_carlo_where_it_holds(lam_per_h, u0, dt, w):
    lam = lam_per_h / 3600
    if not closed_form_holds(lam, u0, dt, w):
        return
    mc = ettr_monte_carlo(lam, u0, dt, w, segments=100_000, seed=3)
    assert ettr_closed_form(lam, u0, dt, w) == pytest.approx(mc, rel=0.01)


def test_monte_carlo_is_seeded():
    args = (1 / 3600.0, 120.0, 1800.0, 60.0)
    assert ettr_monte_carlo(*args, seed=5) == ettr_monte_carlo(*args, seed=5)


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(1, 4096), extra=st.integers(1, 4096),
       rate=st.floats(1e-4, 0.05), u0=st.floats(0.0, 3600.0), w=st.floats(0.0, 300.0),
       it=st.floats(0.5, 60.0))
def test_more_nodes_never_raise_ettr(nodes, extra, rate, u0, w, it):
    """Equal plan shape: the same stall, restart and iteration; only λ = N·r grows."""
    def best(n):
        lam = n * rate / DAY_S
        k = best_interval(lam, u0, w, it, max_iterations=10**7)
        return ettr_exact(lam, u0, k * it, w)
    assert best(nodes + extra) <= best(nodes) + 1e-12


def _plan():
    return plan_for_world(dict(tp=8, pp=9, micro_batch_size=1, global_batch_size=2048),
                          8 * 9 * 32)


def _batch():
    """:func:`_plan` as a batch of one (the single-plan form the models take)."""
    return PlanBatch.from_plan(_plan())


def test_zero_failure_rate_leaves_only_the_save_stalls():
    model = load_model("llama3.1-405b")
    t = estimate_training(model, _batch(), iteration_time_s=20.0, global_batch_size=2048,
                          gpus_per_node=8, gpu=H100,
                          inputs=TrainingInputs(train_tokens=1e12,
                                                failure_rate_per_node_day=0.0))
    assert t.save_stall_s > 0
    assert t.ettr == pytest.approx(1 - t.save_stall_s / (t.interval_s + t.save_stall_s))
    assert t.expected_interruptions == 0
    for interval in (1, 10, 500):
        assert ettr_exact(0.0, 300.0, interval, 7.0) == pytest.approx(1 - 7.0 / (interval + 7))


def test_infinite_storage_bandwidth_gives_no_stall():
    model = load_model("llama3.1-405b")
    inf = math.inf
    t = estimate_training(model, _batch(), iteration_time_s=20.0, global_batch_size=2048,
                          gpus_per_node=8, gpu=H100,
                          inputs=TrainingInputs(train_tokens=1e12, node_write_Bps=inf,
                                                aggregate_write_Bps=inf, node_read_Bps=inf,
                                                aggregate_read_Bps=inf))
    assert t.save_stall_s == 0 and t.load_s == 0 and t.persist_s == 0
    assert t.restart_s == TrainingInputs(train_tokens=1).restart_overhead_s


def test_async_save_stalls_for_the_host_copy_and_persists_within_the_interval():
    model = load_model("llama3.1-405b")
    base = TrainingInputs(train_tokens=1e12)
    kw = dict(iteration_time_s=20.0, global_batch_size=2048, gpus_per_node=8, gpu=H100)
    sync = estimate_training(model, _batch(), inputs=base, **kw)
    asy = estimate_training(model, _batch(), inputs=dataclasses.replace(base, async_save=True),
                            **kw)
    assert asy.save_stall_s == pytest.approx(sync.checkpoint_rank_bytes / H100.host_link_Bps)
    assert asy.persist_s == pytest.approx(sync.save_stall_s)
    assert asy.interval_s >= asy.persist_s
    assert asy.restart_s == pytest.approx(sync.restart_s + asy.persist_s)


def test_checkpoint_shards_add_up_and_shrink_with_dp():
    model = load_model("llama3.1-405b")
    a, b = (checkpoint_bytes(model, PlanBatch.from_plan(plan_for_world(
        dict(tp=8, pp=9, micro_batch_size=1, global_batch_size=2048), 8 * 9 * dp)), 8)
        for dp in (16, 32))
    assert a.total_bytes == pytest.approx(b.total_bytes)
    assert b.rank_bytes == pytest.approx(a.rank_bytes / 2)
    # each rank writes at most the largest shard: the sum is within the largest x ranks
    assert a.total_bytes <= a.rank_bytes * 8 * 9 * 16 * (1 + 1e-9)


def test_costs_follow_the_price_and_energy_the_power():
    model = load_model("llama3.1-405b")
    kw = dict(iteration_time_s=20.0, global_batch_size=2048, gpus_per_node=8, gpu=H100)
    t = estimate_training(model, _batch(), inputs=TrainingInputs(train_tokens=1e12,
                                                                gpu_hour_price=2.0), **kw)
    assert t.cost == pytest.approx(2.0 * t.gpu_hours)
    assert t.gpu_hours == pytest.approx(_plan().world_size * t.wall_time_s / 3600)
    nodes = _plan().world_size // 8
    # DGX H100: 10.2 kW a node at most, PUE 1.2
    assert t.power_W == pytest.approx(nodes * 10200.0 * 1.2)
    assert t.energy_MWh == pytest.approx(t.power_W * t.wall_time_s / 3.6e9)
    none = estimate_training(model, _batch(), inputs=TrainingInputs(train_tokens=1e12), **kw)
    assert none.cost is None


@pytest.mark.parametrize("text, tokens", [("15T", 15e12), ("2e12", 2e12), ("300B", 300e9),
                                          ("1_000", 1000.0), ("7.5t", 7.5e12),
                                          ("2P", 2e15), ("40K", 4e4), ("6M", 6e6),
                                          ("1G", 1e9)])
def test_parse_tokens(text, tokens):
    assert parse_tokens(text) == tokens


@pytest.mark.parametrize("text", ["abc", "", "-5T", "0", "T", "inf", "nan"])
def test_parse_tokens_refuses(text):
    with pytest.raises(InputError, match="train_tokens"):
        parse_tokens(text)


def test_monte_carlo_refuses_a_process_that_cannot_finish():
    with pytest.raises(ValueError, match="ettr_exact"):
        ettr_monte_carlo(1.0, 10.0, 30.0, 0.0)
    assert ettr_exact(1.0, 10.0, 30.0, 0.0) > 0


def test_the_interval_without_a_run_length_is_the_searched_optimum():
    """Without ``max_iterations`` the search runs over every whole number of iterations: the
    same optimum as with a run far longer than it, a whole number, near Young/Daly's
    sqrt(2·w/λ), and no neighbour is better."""
    lam, u0, w, it = 1 / 3600.0, 300.0, 60.0, 10.0
    k = best_interval(lam, u0, w, it)
    assert isinstance(k, int)
    assert k == best_interval(lam, u0, w, it, max_iterations=10**7)
    assert k * it == pytest.approx(math.sqrt(2 * w / lam), rel=0.15)
    assert all(ettr_exact(lam, u0, k * it, w) >= ettr_exact(lam, u0, j * it, w)
               for j in (k - 1, k + 1))


def test_a_node_writes_the_shards_of_the_gpus_it_holds():
    """The busiest node writes its GPUs' shards at the largest: every GPU of a node where the
    job fills nodes, the job's own GPUs where it is smaller than one (4 of 8, context-parallel
    ranks counted)."""
    model = load_model("llama3-8b")
    small = PlanBatch.from_plan(plan_for_world(
        dict(tp=2, pp=2, micro_batch_size=1, global_batch_size=8), 4))
    big = PlanBatch.from_plan(plan_for_world(
        dict(tp=2, pp=2, micro_batch_size=1, global_batch_size=8), 16))
    context = PlanBatch.from_plan(plan_for_world(
        dict(tp=2, pp=1, cp=2, micro_batch_size=1, global_batch_size=8), 4))
    for plans, gpus in ((small, 4), (big, 8), (context, 4)):
        size = checkpoint_bytes(model, plans, gpus_per_node=8)
        assert size.node_bytes == pytest.approx(gpus * size.rank_bytes, rel=1e-12)
