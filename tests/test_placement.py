"""Placement: link tables, the placed schedule, the placement search and the CLI around it.

The figures asserted here come from the models themselves (closed form vs simulator on a
uniform cluster, exhaustive enumeration vs local search), never from fitted constants."""

import dataclasses

import numpy as np
import pytest

from configurator.core.model import make_model
from configurator.core.rules import plan_for_world
from configurator.cost.placed import PlacedPlan
from configurator.search.placement_search import (gpu_links_vary, host_health_order,
                                                  place_plan, placement_count,
                                                  placement_on_cluster, search_placement)
from tests.support.placement_cases import (AGREEMENT_MODELS, assert_links_agree,
                                            closed_form_agreement, measured_cluster)
from topology.cluster_files import load_cluster
from topology.group_figures import ring_figures
from topology.rank_order import MappedPlacement
from configurator.core.plan_batch import PlanBatch

TINY = make_model(name="tiny", num_layers=28, hidden_size=1024, num_attention_heads=8,
                  num_query_groups=8, ffn_hidden_size=4096, vocab_size=32000, seq_length=1024)


def _plan(world, **kw):
    base = dict(tp=1, pp=1, cp=1, vp=1, micro_batch_size=1, global_batch_size=64,
                recompute="none", precision="bf16", attention_backend="auto")
    base.update(kw)
    return plan_for_world(base, world)


def _batch(world, **kw):
    """:func:`_plan` as a batch of one (the single-plan form the models take)."""
    return PlanBatch.from_plan(_plan(world, **kw))


# -- link table ----------------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: load_cluster("dgx-a100-80gb", 3),
    lambda: measured_cluster(4, 4, seed=1, slow_links=0.3, gpu_spread=0.2),
    lambda: measured_cluster(5, 8, seed=2, slow_hosts=2),
])
def test_link_table_equals_cluster_link(make):
    cl = make()
    rng = np.random.default_rng(0)
    a = rng.integers(0, cl.num_gpus, 400)
    b = rng.integers(0, cl.num_gpus, 400)
    keep = a != b
    assert_links_agree(cl, a[keep], b[keep])


def test_ring_figures_rows_match_ring_busbw():
    cl = measured_cluster(4, 4, seed=3, slow_links=0.4, gpu_spread=0.2)
    rng = np.random.default_rng(1)
    rows = np.stack([rng.permutation(cl.num_gpus)[:6] for _ in range(50)])
    bw, lat = ring_figures(rows, cl.link_table().links, cl.gpus_per_node)
    for r in range(len(rows)):
        ref = cl.ring_busbw(rows[r].tolist())
        assert bw[r] == pytest.approx(ref[0], rel=1e-12)
        assert lat[r] == pytest.approx(ref[1], rel=1e-12)


def test_subset_keeps_measured_links():
    cl = measured_cluster(5, 2, seed=4, slow_links=0.5)
    sub = cl.subset([3, 1])
    assert sub.hosts == [cl.hosts[3], cl.hosts[1]]
    # GPU 0 of the subset is host 3's GPU 0; GPU 2 is host 1's GPU 0
    assert sub.link(0, 2) == cl.link(6, 2)


# -- the placed schedule ------------------------------------------------------------------

@pytest.mark.parametrize("name,cluster,nodes,tp", AGREEMENT_MODELS)
def test_simulated_schedule_agrees_with_closed_form_on_uniform_cluster(name, cluster, nodes,
                                                                        tp):
    """Over a grid of pp, vp and microbatch counts, the simulated iteration (every replica,
    every stage, every boundary) is within 1 % of the closed form; measured worst gaps
    (``python -m bench.speed.simulator``): 0.25 % (gpt3-175b), 0.29 % (llama3-70b), 0.66 %
    (llama3-8b at tp 1: 2 to 16 layers per stage, the logits as heavy as a layer, and
    pipeline boundaries inside a host for some stages and across hosts for others). The
    largest gaps are interleaved schedules, whose closed form runs the lighter end stage's
    extra (here the embedding's backward, 2.2 ms with its main-gradient accumulation) pp
    times where the simulated schedule hides ≈ 15 % of it."""
    worst, _, checked = closed_form_agreement(name, cluster, nodes, tp)
    assert checked >= 20
    assert worst <= 0.01


def test_placed_time_sees_a_slow_pipeline_link():
    """Slowing the one host pair a pipeline boundary crosses slows the plan; slowing a pair
    no group uses does not."""
    cl = measured_cluster(4, 2, seed=5, slow_links=0.0, slow_hosts=0)
    plan = _plan(8, pp=4)          # dp 2: stage s on host s (ranks 2s, 2s+1)
    priced = PlacedPlan(TINY, cl, PlanBatch.from_plan(plan))
    base = priced.time(*priced.default_placement()).iteration_time_s
    g = cl.graph
    # the last stage (with the loss) paces the pipeline: a middle boundary's sends have
    # slack, so the link is slowed well beyond it (at a 20th the plan slows by 0.4 %)
    for a, b in ((cl.hosts[1], cl.hosts[2]), (cl.hosts[2], cl.hosts[1])):
        g.edges[a, b]["bandwidth_Bps"] /= 100
    cl.invalidate()
    priced = PlacedPlan(TINY, cl, PlanBatch.from_plan(plan))
    slow = priced.time(*priced.default_placement()).iteration_time_s
    assert slow > base * 1.1
    # hosts 0 and 2 exchange nothing under this plan (not neighbours, dp inside hosts;
    # 0 and 3 would: the tied embedding's gradient)
    cl2 = measured_cluster(4, 2, seed=5, slow_links=0.0, slow_hosts=0)
    for a, b in ((cl2.hosts[0], cl2.hosts[2]), (cl2.hosts[2], cl2.hosts[0])):
        cl2.graph.edges[a, b]["bandwidth_Bps"] /= 20
    cl2.invalidate()
    p2 = PlacedPlan(TINY, cl2, PlanBatch.from_plan(plan))
    assert p2.time(*p2.default_placement()).iteration_time_s == pytest.approx(base)


def test_record_gives_critical_path_of_slowest_replica():
    cl = measured_cluster(4, 2, seed=6, slow_links=0.3)
    plan = _plan(8, pp=2, global_batch_size=16)
    priced = PlacedPlan(TINY, cl, PlanBatch.from_plan(plan))
    t = priced.time(*priced.default_placement(), record=True)
    assert t.sim.critical_path and t.sim.critical_path[0]
    assert t.iteration_time_s == pytest.approx(float(t.sim.iteration_time_s[0]) + t.optimizer_s)


def test_mapped_placement_identity_and_indices():
    p = MappedPlacement(2, node_hosts=(1, 0), gpu_order=((1, 0), (0, 1)))
    assert not p.is_identity
    np.testing.assert_array_equal(p.gpu_indices(np.arange(4)), [3, 2, 0, 1])
    assert MappedPlacement(2, node_hosts=(0, 1), gpu_order=((0, 1), (0, 1))).is_identity


# -- the placement search -----------------------------------------------------------------

def test_search_placement_exhaustive_finds_the_minimum_of_a_known_objective():
    target = np.array([2, 0, 3])

    def obj(nh, go):
        return float(np.sum(nh != target) + 0.1 * np.sum(go != np.arange(2)))

    assert placement_count(4, 3, 2, True) == 24 * 8
    res = search_placement(obj, num_hosts=4, num_nodes=3, gpus_per_node=2)
    assert res.exhaustive and res.objective == 0.0
    assert res.node_hosts == (2, 0, 3) and res.evaluations == 24 * 8


def test_local_search_reaches_exhaustive_optimum_on_small_heterogeneous_cases():
    """Random heterogeneous clusters small enough to enumerate (5 hosts of 2 GPUs, plans
    on 4): the local search (forced, 300 evaluations) finds the enumerated optimum in at
    least 5 of 6 cases and is never more than 2 % off (``python -m
    bench.placement.optimiser`` runs 60)."""
    hits, worst = 0, 0.0
    for k in range(6):
        cl = measured_cluster(5, 2, seed=10 + k, slow_links=0.2, gpu_spread=0.15)
        plan = _plan(8, pp=(4, 2)[k % 2], global_batch_size=16)
        priced = PlacedPlan(TINY, cl, PlanBatch.from_plan(plan))
        ex = search_placement(priced.objective, num_hosts=5, num_nodes=4, gpus_per_node=2)
        ls = search_placement(priced.objective, num_hosts=5, num_nodes=4, gpus_per_node=2,
                              exhaustive_limit=0, max_evaluations=300, time_budget_s=60,
                              seed=k)
        assert ex.exhaustive and not ls.exhaustive
        assert ls.objective >= ex.objective * (1 - 1e-12)
        gap = ls.objective / ex.objective - 1
        hits += gap <= 1e-9
        worst = max(worst, gap)
    assert hits >= 5 and worst <= 0.02


def test_local_search_draws_its_moves_when_there_are_too_many_to_list():
    """1,000 node ranks on 1,100 hosts: 0.5 M swaps, too many to list; the search draws
    its moves (no list of them is made), is the same for a seed and finds better
    placements of a known objective: the sum of |host - target| over node ranks."""
    import configurator.search.placement_search as ps

    M, N = 1100, 1000
    assert N * (N - 1) // 2 > ps.MOVES_LISTED
    target = np.random.default_rng(5).permutation(M)[:N]

    def obj(nh, go):
        return float(np.abs(nh - target).sum()) + 1.0

    kw = dict(num_hosts=M, num_nodes=N, gpus_per_node=8, move_gpus=True, seed=2,
              max_evaluations=400, time_budget_s=600)
    a = search_placement(obj, **kw)
    b = search_placement(obj, **kw)
    start = obj(np.arange(N), None)
    assert a.node_hosts == b.node_hosts and a.objective == b.objective
    assert a.evaluations == 400 and a.objective < start * 0.999
    assert len(set(a.node_hosts)) == N and max(a.node_hosts) < M


def test_search_is_deterministic_for_a_seed_and_never_worse_than_default():
    cl = measured_cluster(8, 2, seed=21, slow_links=0.2, slow_hosts=1)
    plan = _plan(14, pp=7, global_batch_size=28)    # 8!/1! placements: local search
    a, _ = place_plan(TINY, cl, plan, seed=3, time_budget_s=60, random_samples=10)
    b, _ = place_plan(TINY, cl, plan, seed=3, time_budget_s=60, random_samples=10)
    assert (a.hosts, a.gpu_order, a.iteration_time_s) == (b.hosts, b.gpu_order,
                                                          b.iteration_time_s)
    assert a.iteration_time_s <= a.default_iteration_time_s
    assert len(a.hosts) == 7 and len(a.excluded_hosts) == 1 and not a.exhaustive
    assert set(a.hosts) | set(a.excluded_hosts) == set(cl.hosts)


def test_optimizer_leaves_the_slow_host_idle():
    """One host at 10 % on every link, 9 hosts for 8 nodes: the optimised placement does
    not use it, and beats Megatron's order on the first 8 hosts (which includes it)."""
    cl = measured_cluster(9, 4, seed=22, slow_links=0.0, slow_hosts=0)
    slow = cl.hosts[2]
    for u, w, d in cl.graph.edges(data=True):
        if slow in (u, w):
            d["bandwidth_Bps"] *= 0.1
    cl.invalidate()
    assert host_health_order(cl, range(9))[-1] == 2
    plan = _plan(32, tp=4, pp=2, global_batch_size=64)
    out, _ = place_plan(TINY, cl, plan, time_budget_s=60, random_samples=0)
    assert out.excluded_hosts == (slow,)
    assert out.iteration_time_s < out.default_iteration_time_s


def test_gpu_order_only_searched_where_gpu_links_differ():
    assert not gpu_links_vary(measured_cluster(3, 4, seed=1))
    assert gpu_links_vary(measured_cluster(3, 4, seed=1, gpu_spread=0.2))


def test_placement_on_cluster_validates_names_and_permutations():
    from configurator.core.errors import InputError

    cl = measured_cluster(3, 2, seed=1)
    hosts, order = placement_on_cluster({"hosts": [cl.hosts[2], cl.hosts[0]],
                                   "gpu_order": [[1, 0], [0, 1]]}, cl, 2)
    assert hosts == [2, 0] and order == [[1, 0], [0, 1]]
    for bad, field in (({"hosts": ["nope", cl.hosts[0]]}, "placement.hosts[0]"),
                       ({"hosts": [cl.hosts[0]] * 2}, "placement.hosts[1]"),
                       ({"hosts": cl.hosts[:2], "gpu_order": [[0, 0], [0, 1]]},
                        "placement.gpu_order[0]")):
        with pytest.raises(InputError) as err:
            placement_on_cluster(bad, cl, 2)
        assert err.value.field == field


def test_batched_pricing_gives_the_same_floats_as_one_at_a_time():
    """PlacedPlan.times (every replica of every placement in one simulation, walked level
    by level) equals PlacedPlan.time placement by placement, bit for bit, for 1F1B and
    interleaved plans with GPU orders that matter."""
    cl = measured_cluster(5, 2, seed=31, slow_links=0.3, gpu_spread=0.2)
    rng = np.random.default_rng(5)
    for fields in (dict(pp=4, global_batch_size=16), dict(pp=2, vp=2, global_batch_size=16),
                   dict(tp=2, pp=2, global_batch_size=8)):
        priced = PlacedPlan(TINY, cl, _batch(8, **fields))
        draws = [(rng.permutation(5)[:4], np.array([rng.permutation(2) for _ in range(4)]))
                 for _ in range(12)]
        one = [priced.time(nh, go).iteration_time_s for nh, go in draws]
        assert priced.times(draws).tolist() == one
        assert len(set(one)) > 3          # the draws do differ


def test_batched_search_takes_the_same_path_as_one_at_a_time():
    """With objective_many, each neighbourhood is priced in growing batches but the first
    improving move in the same seeded order is taken: same placement, same value."""
    cl = measured_cluster(8, 2, seed=23, slow_links=0.3, slow_hosts=1, gpu_spread=0.1)
    priced = PlacedPlan(TINY, cl, _batch(14, pp=7, global_batch_size=28))
    kw = dict(num_hosts=8, num_nodes=7, gpus_per_node=2, exhaustive_limit=0,
              max_evaluations=100_000, time_budget_s=600, seed=4, patience=5)
    one = search_placement(priced.objective, **kw)
    many = search_placement(priced.objective, objective_many=priced.times, **kw)
    assert (many.node_hosts, many.gpu_order, many.objective) == (one.node_hosts,
                                                                  one.gpu_order, one.objective)
    assert many.evaluations >= one.evaluations


def test_pricing_ahead_changes_the_calls_not_the_search(monkeypatch):
    """A listed scan prices its first SCAN_AHEAD moves in one batch: the same placement,
    value and evaluation count as the doubling batches alone, in fewer batches; the
    placements priced ahead but never reached are not counted."""
    import configurator.search.placement_search as ps

    cl = measured_cluster(8, 2, seed=23, slow_links=0.3, slow_hosts=1, gpu_spread=0.1)
    priced = PlacedPlan(TINY, cl, _batch(14, pp=7, global_batch_size=28))
    kw = dict(num_hosts=8, num_nodes=7, gpus_per_node=2, exhaustive_limit=0,
              max_evaluations=100_000, time_budget_s=600, seed=4, patience=5)
    runs = {}
    for ahead in (0, 8):
        calls, priced_n = [], []

        def many(cands):
            calls.append(len(cands))
            priced_n.append(len(cands))
            return priced.times(cands)

        monkeypatch.setattr(ps, "SCAN_AHEAD", ahead)
        runs[ahead] = (search_placement(priced.objective, objective_many=many, **kw),
                       len(calls), sum(priced_n))
    (plain, plain_calls, plain_priced), (ahead, ahead_calls, ahead_priced) = runs[0], runs[8]
    assert (ahead.node_hosts, ahead.gpu_order, ahead.objective, ahead.evaluations) == (
        plain.node_hosts, plain.gpu_order, plain.objective, plain.evaluations)
    assert ahead_calls < plain_calls
    assert ahead_priced > ahead.evaluations          # priced ahead, never reached: uncounted


def test_pipeline_boundaries_inside_and_across_hosts():
    """tp·cp·dp = 2 ranks per stage on 8-GPU hosts: 4 stages per host, so boundaries 3, 7, …
    cross hosts and the rest stay on NVLink; the closed form's path figure is the harmonic
    mean of those hops, its end figure the first/last boundary's (both inside a host)."""
    from configurator.cost.communication import pipeline_figures

    cl = load_cluster("dgx-h100-80gb", 2)
    fb, fl, bb, bl = cl.p2p_boundaries(2, 8, 16)
    (nv, nv_lat), (ib, ib_lat) = cl.link(0, 1), cl.link(0, 8)
    assert ib < nv
    want = np.where(np.arange(8) % 4 == 3, ib, nv)        # boundary 7 is the wrap 7 → 0
    np.testing.assert_array_equal(fb, want)
    np.testing.assert_array_equal(bb, want)
    path_bw, path_lat, ring_bw, _, end_bw, end_lat = pipeline_figures(cl, 2, 8, 16)
    assert path_bw == pytest.approx(14 / (12 / nv + 2 / ib))
    assert path_lat == pytest.approx((12 * nv_lat + 2 * ib_lat) / 14)
    assert ring_bw == pytest.approx(16 / (12 / nv + 4 / ib))
    assert (end_bw, end_lat) == (nv, nv_lat)
    # measured links (one stage per host): a slow host pair slows its own boundary, in its
    # own direction only
    mc = measured_cluster(4, 2, seed=3, slow_links=0.0, slow_hosts=0)
    mc.graph.edges[mc.hosts[1], mc.hosts[2]]["bandwidth_Bps"] *= 0.1
    mc.invalidate()
    fb, _, bb, _ = mc.p2p_boundaries(2, 4, 8)
    assert fb.argmin() == 1 and fb[1] < 0.2 * np.delete(fb, 1).min()
    assert bb.min() > 0.5 * np.delete(fb, 1).min()


def test_stage_times_add_up_to_the_iteration():
    """Per stage of the pacing replica: forward + backward + exposed reduction + idle is the
    iteration before the optimizer step; busy time is what the simulator counts (m times
    the stage's chunks). With a host that costs nothing the last stage, carrying the logits
    and loss, idles least; with the preset's host these small layers wait for it, and the
    backward of the logits and loss runs in the GPU's idle time of the last stage's
    backward (:func:`configurator.cost.iteration.backward_overlap_s`) while their forward
    adds what it adds without a host."""
    cl = measured_cluster(4, 2, seed=8, slow_links=0.2)
    free = cl.with_gpu(dataclasses.replace(
        cl.gpu, efficiency=dataclasses.replace(cl.gpu.efficiency, host_op_s=0.0)))
    plan = _plan(8, pp=4, global_batch_size=16)
    busy = {}
    for name, cluster in (("preset", cl), ("free", free)):
        t = PlacedPlan(TINY, cluster, PlanBatch.from_plan(plan)).time(
            np.arange(4), np.tile(np.arange(2), (4, 1)), record=True)
        rows = t.stage_times()
        assert [r["stage"] for r in rows] == [0, 1, 2, 3]
        for r in rows:
            assert r["forward_s"] + r["backward_s"] + r["dp_exposed_s"] + r["idle_s"] == \
                pytest.approx(t.iteration_time_s - t.optimizer_s)
        np.testing.assert_allclose([r["busy_s"] for r in rows], t.sim.busy_s[0])
        busy[name] = {k: [r[k] for r in rows] for k in ("forward_s", "backward_s")}
        if name == "free":
            assert min(rows, key=lambda r: r["idle_s"])["stage"] == 3

    def extra(name, key):     # the last stage's over the most of the others'
        return busy[name][key][3] - max(busy[name][key][:3])
    assert extra("free", "backward_s") > 0.1 * busy["free"]["backward_s"][3]
    assert extra("preset", "backward_s") <= 0.005 * busy["preset"]["backward_s"][3]
    assert extra("preset", "forward_s") == pytest.approx(extra("free", "forward_s"), rel=0.05)


@pytest.mark.parametrize("gpn,fields", [
    (8, dict(tp=2, pp=4, cp=2, global_batch_size=32)),
    (8, dict(tp=1, pp=4, vp=7, global_batch_size=48)),
    # groups straddle hosts; 28 layers on 3 ranks: an uneven split (9, 10, 9)
    (6, dict(tp=4, pp=3, cp=1, global_batch_size=24, decoder_first_pipeline_num_layers=9,
             decoder_last_pipeline_num_layers=9)),
    (6, dict(tp=1, pp=4, cp=4, global_batch_size=12)),
    (8, dict(tp=8, pp=2, global_batch_size=16))])
def test_uniform_cluster_shortcut_equals_walking_every_group(gpn, fields):
    """On a uniform cluster PlacedPlan prices each group once per position within a host;
    the result equals walking every group and every send, bit for bit, for Megatron's order
    and for any node permutation (which a uniform cluster cannot tell apart)."""
    from topology.cluster import build_cluster

    base = load_cluster("dgx-h100-80gb", 1)
    world = 48
    cl = build_cluster(name="u", gpu=base.gpu, gpus_per_node=gpn,
                       hosts=[f"h{i}" for i in range(world // gpn)], **base.spec)
    assert cl.is_uniform
    plan = _plan(world, **fields)
    fast = PlacedPlan(TINY, cl, PlanBatch.from_plan(plan))
    slow = PlacedPlan(TINY, cl, PlanBatch.from_plan(plan))
    slow.uniform = False
    N = world // gpn
    rng = np.random.default_rng(0)
    for nh, go in [fast.default_placement(),
                   (rng.permutation(N), np.array([rng.permutation(gpn) for _ in range(N)]))]:
        assert fast.time(nh, go).iteration_time_s == slow.time(nh, go).iteration_time_s
        assert fast.time(nh, go).iteration_time_s == slow.time(*slow.default_placement()) \
            .iteration_time_s
