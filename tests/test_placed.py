"""The two pricings of a plan agree: the closed form (:func:`configurator.cost.iteration.
iteration_time`, every plan of a column store at once, every stage as slow as the slowest,
every group as slow as its slowest hop) and the simulated schedule on placed ranks
(:class:`configurator.cost.placed.PlacedPlan` under Megatron's sequential mapping, the exact
1F1B or interleaved order of :mod:`configurator.cost.schedule_sim`).

Plans are drawn (seeded) from what the search enumerates
(:func:`configurator.search.space.enumerate_plans`: plans Megatron accepts, each checked
again with :func:`configurator.core.rules.check_plan`), up to :data:`PER_CLASS` of each class
(dense or MoE, 1F1B or interleaved, even or uneven layer split, cp = 1 or > 1) of each model,
with whatever recompute (none, selective with the default or other modules, full), micro
batch size, expert split and optimizer the draw brings, on a uniform preset cluster and on a
measured topology whose links are all equal (priced link by link, as any measured cluster).
``python -m tests.test_placed [SEED [PER_CLASS]]`` prints every class's plan count, gap range
and the plans at its ends.

Measured over the default draw (300 plans on each uniform cluster, 110 on slow links) and
two larger ones (``python -m tests.test_placed 20261129 60`` and ``... 7 60``: 1800 plans on
each uniform cluster, 660 on slow links); the preset and the equal measured links give the
same gaps:

* one pipeline stage (pp = 1): no schedule to approximate, so the two read the same terms
  and give the same iteration time up to the order of a sum (worst 3e-15; bound
  :data:`EXACT_REL`): a term defined twice and changed in one copy shows here first;
* even splits: the schedule never slower (worst +2e-15) and at most 1 % faster (worst
  0.79 %: the interleaved schedule hides part of the lighter end stage's extra work that
  the closed form runs ``pp`` times);
* uneven splits (first/last stage layers, an accounted embedding or loss, a pipeline
  layout): the closed form is never faster than the schedule by more than 1 % (worst
  +0.46 %) but up to 10.6 % slower (DeepSeek-V3 1F1B at one microbatch), on purpose:
  it charges the largest stage's exposed gradient reduction after the whole pipeline
  drains, where the schedule runs each stage's after that stage's own last backward (a
  middle stage holding more layers than the first reduces while the first still runs
  backwards), and its bubble and send terms assume chunks as long as the pacing one
  (1F1B's flow-shop sum, interleaving's ``(pp-1)/vp``), where the schedule's shorter end
  chunks shorten the fill and drain.
  Bound: :data:`UNEVEN_REL`.
* a measured topology with slow links: the closed form prices every group at its slowest
  hop and the schedule each group at its own links, so on even splits the schedule is
  never slower (worst +0.00 %) and is faster by up to 21 % where the slow links miss the
  replica that sets the pace (60 % on uneven MoE splits). On uneven splits the schedule
  may also be slower, by up to 1.87 % (DeepSeek-V3, pp 16 with 4 and 1 layers on the end
  stages): two terms of the closed form take the even split's stages, and slow links make
  them matter: its
  gradient-reduction windows are the pacing stage's layers' (the largest stage, with
  fewer layers, hides less under its own), and its 1F1B middle-stage send term subtracts
  the heavier end stage's extra (the logits) where the pacing end is the first stage (the
  embedding): a middle stage behind a slow link, two sends per microbatch, outpaces it.
  Bound: :data:`UNEVEN_SLOW_REL`.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from configurator.core.layers import layout_code
from configurator.core.model_presets import load_model
from configurator.core.rules import check_plan
from configurator.cost.iteration import iteration_time
from configurator.cost.placed import PlacedPlan
from configurator.search.space import enumerate_plans
from topology.cluster_files import load_cluster
from topology.topofile import LinkMeasurement, Topology, apply_topology
from configurator.core.plan_batch import PlanBatch

#: The two give the same iteration time within this fraction where nothing is approximated
#: (one pipeline stage), and the schedule is no slower than the closed form by more on even
#: splits: only a sum's order apart.
EXACT_REL = 1e-9
#: On even splits the schedule is at most this fraction faster than the closed form; on
#: uneven splits (and on slow links, even splits) no slower beyond it.
AGREE_REL = 0.01
#: How much slower than the schedule the closed form may price an uneven split (measured
#: worst 10.6 %: see the module docstring).
UNEVEN_REL = 0.12
#: How much slower than the closed form the schedule may price an uneven split on slow
#: links (measured worst 1.87 %: see the module docstring).
UNEVEN_SLOW_REL = 0.03
#: Plans drawn per class and configuration (a class with fewer plans: all of them).
PER_CLASS = 10
SEED = 20261129

#: (model, cluster preset, nodes, global batch size, search options): dense and MoE models,
#: layer counts every pipeline splits evenly (llama3-8b's 32, qwen3-30b-a3b's 48,
#: mixtral-8x7b's 32) and counts most split unevenly (llama3.1-405b's 126, deepseek-v3's 61:
#: accounted embedding and loss, first/last stage layers, pipeline layouts), selective
#: recompute of the default and of other modules.
CONFIGS = (("llama3-8b", "dgx-h100-80gb", 4, 64, {}),
           ("llama3-8b", "dgx-a100-80gb", 2, 32, {"recompute_modules": "mlp"}),
           ("llama3.1-405b", "dgx-h100-80gb", 16, 128, {}),
           ("qwen3-30b-a3b", "dgx-h100-80gb", 4, 64, {}),
           ("mixtral-8x7b", "dgx-a100-80gb", 4, 64, {"recompute_modules": "moe"}),
           ("deepseek-v3", "dgx-h100-80gb", 16, 128, {}))
#: (model, hosts, global batch size, :func:`measured_cluster` seed and arguments) of the
#: measured topologies with slow links.
SLOW_LINKS = (("llama3-8b", 4, 64, 11, dict(slow_links=0.3)),
              ("qwen3-30b-a3b", 4, 64, 12, dict(slow_links=0.3, gpu_spread=0.2)),
              ("llama3.1-405b", 8, 64, 13, dict(slow_links=0.2, slow_hosts=2)),
              ("deepseek-v3", 16, 128, 14, dict(slow_links=0.2)))


def equal_links_cluster(preset: str, nodes: int):
    """``nodes`` hosts of ``preset`` with every ordered host pair measured at the same rate
    and latency (the preset's attained per-rail rate and its network latency): a measured
    topology, priced link by link, that is as uniform as the preset."""
    base = load_cluster(preset, nodes)
    spec = base.spec
    hosts = tuple(f"h{i:03d}" for i in range(nodes))
    rate = spec["inter_bandwidth_Bps"] * spec["inter_efficiency"]
    links = tuple(LinkMeasurement(src=a, dst=b, src_gpu=None, dst_gpu=None,
                                  bandwidth_Bps=rate, latency_s=spec["inter_latency_s"],
                                  link_class="network", message_bytes=1 << 30,
                                  method="nccl-tests sendrecv_perf", timestamp=None,
                                  gpus_per_host=1, rails_used=1)
                  for a in hosts for b in hosts if a != b)
    cl = apply_topology(base, Topology(hosts=hosts, gpus_per_host=base.gpus_per_node,
                                       links=links))
    assert not cl.placement_invariant     # priced link by link, not by shape
    return cl


def plan_class(plan, model) -> tuple[str, str, str, str]:
    """``(dense|moe, 1f1b|interleaved, even|uneven, cp1|cp>1)`` of a plan."""
    uneven = bool(plan.decoder_first_pipeline_num_layers
                  or plan.decoder_last_pipeline_num_layers
                  or plan.account_for_embedding_in_pipeline_split
                  or plan.account_for_loss_in_pipeline_split
                  or plan.pipeline_model_parallel_layout)
    return ("moe" if model.is_moe else "dense", "interleaved" if plan.vp > 1 else "1f1b",
            "uneven" if uneven else "even", "cp>1" if plan.cp > 1 else "cp1")


def sampled_plans(model, world: int, global_batch_size: int, seed: int,
                  per_class: int = PER_CLASS, options=None):
    """Up to ``per_class`` plans of each class of :func:`plan_class` (the model fixes dense
    or MoE) that the search enumerates with search ``options``, drawn with ``seed``
    (:class:`~configurator.core.plan_batch.PlanBatch`)."""
    c = enumerate_plans(model, world, global_batch_size, **(options or {}))
    uneven = ((c.first > 0) | (c.last > 0) | c.acct_emb | c.acct_loss
              | (c.layout != layout_code("")))
    key = ((c.vp > 1).astype(int) * 4 + uneven.astype(int) * 2 + (c.cp > 1).astype(int))
    rng = np.random.default_rng(seed)
    picked = []
    for k in np.unique(key):
        at = np.flatnonzero(key == k)
        picked.append(rng.choice(at, size=min(per_class, at.size), replace=False))
    idx = np.sort(np.concatenate(picked))
    return c.take(idx)


def gaps(model, cl, c) -> list[tuple[float, object]]:
    """``(simulated / closed - 1, plan)`` of every plan of ``c`` on cluster ``cl``."""
    world = cl.num_gpus
    closed = iteration_time(model, cl, c)["iteration_time_s"]
    out = []
    for i in range(len(c)):
        plan = c.plan(i)
        check_plan(model, plan, plan.world_size)
        assert plan.world_size == world
        priced = PlacedPlan(model, cl, PlanBatch.from_plan(plan))
        sim = priced.time(*priced.default_placement()).iteration_time_s
        out.append((sim / float(closed[i]) - 1, plan))
    return out


@functools.lru_cache(maxsize=None)
def agreement(config: tuple, measured: bool, seed: int = SEED,
              per_class: int = PER_CLASS) -> tuple:
    """``(model, ((gap, plan), ...))`` of the plans drawn for ``config`` (a :data:`CONFIGS`
    entry, options as a tuple of items) on its preset cluster or (``measured``) the equal
    links of :func:`equal_links_cluster`."""
    name, preset, nodes, gbs, options = config
    model = load_model(name)
    cl = equal_links_cluster(preset, nodes) if measured else load_cluster(preset, nodes)
    c = sampled_plans(model, cl.num_gpus, gbs, seed, per_class, dict(options))
    return model, tuple(gaps(model, cl, c))


def _key(config) -> tuple:
    return (*config[:4], tuple(sorted(config[4].items())))


def _describe(gap: float, plan) -> str:
    return (f"{gap:+.4f} at tp {plan.tp} pp {plan.pp} cp {plan.cp} vp {plan.vp} dp {plan.dp} "
            f"ep {plan.ep} etp {plan.etp} mbs {plan.micro_batch_size} "
            f"m {plan.num_microbatches} recompute {plan.recompute} "
            f"first/last {plan.decoder_first_pipeline_num_layers}/"
            f"{plan.decoder_last_pipeline_num_layers} accounted "
            f"{plan.account_for_embedding_in_pipeline_split}/"
            f"{plan.account_for_loss_in_pipeline_split} "
            f"layout {plan.pipeline_model_parallel_layout!r}")


def test_every_layer_term_is_in_the_table_both_pricings_read():
    """:func:`layer_type_times` gives exactly the :data:`LAYER_TERMS` keys, dense and MoE,
    and the backward pass's figures both pricings' :func:`backward_overlap_s` reads: a
    per-layer term missing from the table would reach neither pricing's sums."""
    from configurator.cost.communication import comm_figures, expert_comm_figures
    from configurator.cost.compute import layer_costs
    from configurator.cost.iteration import BACKWARD_PASS_KEYS, LAYER_TERMS, layer_type_times

    for name, preset, nodes, gbs, _ in (CONFIGS[0], CONFIGS[3]):
        model, cl = load_model(name), load_cluster(preset, nodes)
        c = sampled_plans(model, cl.num_gpus, gbs, SEED, per_class=1)
        comm = dict(comm_figures(cl, c), **expert_comm_figures(cl, c))
        types = layer_type_times(model, c, layer_costs(model, c, cl.gpu), comm)
        assert set(types) == {"dense", "moe"}
        for kind in types.values():
            assert set(kind) == set(LAYER_TERMS) | set(BACKWARD_PASS_KEYS)


@pytest.mark.parametrize("measured", [False, True], ids=["preset", "equal-measured-links"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_closed_form_agrees_with_the_simulated_schedule(config, measured):
    """One stage: the same time (:data:`EXACT_REL`). Even splits: the schedule never slower
    (:data:`EXACT_REL`), never faster beyond :data:`AGREE_REL`. Uneven splits: the schedule
    never slower beyond :data:`AGREE_REL`, never faster beyond :data:`UNEVEN_REL` (the
    module docstring gives the causes)."""
    model, drawn = agreement(_key(config), measured)
    assert len(drawn) >= 30 and any(p.pp == 1 for _, p in drawn)
    bad = []
    for gap, plan in drawn:
        if plan.pp == 1:
            lo, hi = -EXACT_REL, EXACT_REL
        elif plan_class(plan, model)[2] == "even":
            lo, hi = -AGREE_REL, EXACT_REL
        else:
            lo, hi = -UNEVEN_REL, AGREE_REL
        if not lo <= gap <= hi:
            bad.append(_describe(gap, plan))
    assert not bad, f"{len(bad)} of {len(drawn)} plans apart:\n" + "\n".join(bad)


def test_the_draw_covers_every_class_and_variant():
    """The plans drawn hold every class of :func:`plan_class`, every recompute kind and
    selective recompute of several module sets, both optimizers, every way of splitting
    layers unevenly, expert parallelism and expert tensor parallelism."""
    plans = [(p, m) for cfg in CONFIGS
             for m, drawn in [agreement(_key(cfg), False)] for _, p in drawn]
    assert len(plans) >= 300
    classes = {plan_class(p, m) for p, m in plans}
    assert len(classes) == 16, sorted(classes)
    assert {p.recompute for p, _ in plans} == {"none", "selective", "full"}
    assert len({p.recompute_modules for p, _ in plans if p.recompute == "selective"}) >= 3
    assert {p.distributed_optimizer for p, _ in plans} == {False, True}
    assert any(p.decoder_first_pipeline_num_layers for p, _ in plans)
    assert any(p.account_for_embedding_in_pipeline_split for p, _ in plans)
    assert any(p.pipeline_model_parallel_layout for p, _ in plans)
    assert any(p.ep > 1 for p, _ in plans) and any(p.etp > 1 for p, _ in plans)


def test_equal_measured_links_price_as_the_preset():
    """The measured topology whose links are all the preset's prices every drawn plan as the
    preset does (within 0.1 %): the comparison above runs on a uniform cluster, only through
    the link-by-link code."""
    config = _key(CONFIGS[0])
    _, preset = agreement(config, False)
    _, measured = agreement(config, True)
    for (g0, p0), (g1, p1) in zip(preset, measured):
        assert p0 == p1
        assert g1 == pytest.approx(g0, abs=1e-3)


@pytest.mark.parametrize("case", SLOW_LINKS, ids=lambda c: c[0])
def test_simulated_schedule_is_no_slower_than_the_closed_form_on_slow_links(case):
    """On a measured topology with slow links the closed form prices every group at its
    slowest hop and every stage at the slowest stage's pace (:func:`iteration_time`'s
    docstring), the schedule each replica's groups at their own links: the schedule is
    never slower beyond :data:`AGREE_REL` on even splits, :data:`UNEVEN_SLOW_REL` on uneven
    ones (the module docstring says why), and the slow links do matter (some plan is
    faster by more than that)."""
    from tests.support.placement_cases import measured_cluster

    name, hosts, gbs, seed, kw = case
    model = load_model(name)
    cl = measured_cluster(hosts, 8, seed=seed, **kw)
    drawn = gaps(model, cl, sampled_plans(model, cl.num_gpus, gbs, SEED, PER_CLASS // 2))
    assert len(drawn) >= 15
    bad = [_describe(g, p) for g, p in drawn
           if g > (AGREE_REL if plan_class(p, model)[2] == "even" else UNEVEN_SLOW_REL)]
    assert not bad, "\n".join(bad)
    assert min(g for g, _ in drawn) < -AGREE_REL


def _report(seed: int = SEED, per_class: int = PER_CLASS) -> None:
    """Print every class's plan count and gap range, per cluster kind."""
    from tests.support.placement_cases import measured_cluster

    kinds = {}
    for measured in (False, True):
        kind = "equal measured links" if measured else "uniform preset"
        for cfg in CONFIGS:
            model, drawn = agreement(_key(cfg), measured, seed, per_class)
            for g, p in drawn:
                kinds.setdefault(kind, {}).setdefault(plan_class(p, model), []).append((g, p))
    for name, hosts, gbs, s, kw in SLOW_LINKS:
        model = load_model(name)
        cl = measured_cluster(hosts, 8, seed=s, **kw)
        for g, p in gaps(model, cl, sampled_plans(model, cl.num_gpus, gbs, seed,
                                                  per_class // 2)):
            kinds.setdefault("slow measured links", {}).setdefault(
                plan_class(p, model), []).append((g, p))
    for kind, classes in kinds.items():
        print(f"{kind}: {sum(len(v) for v in classes.values())} plans "
              "(gap = simulated / closed - 1)")
        for cls, v in sorted(classes.items()):
            lo, hi = min(v, key=lambda x: x[0]), max(v, key=lambda x: x[0])
            print(f"  {'/'.join(cls):30s} {len(v):4d} plans, gap {lo[0]:+.4f} .. {hi[0]:+.4f}")
            print(f"      lowest  {_describe(*lo)}")
            print(f"      highest {_describe(*hi)}")


if __name__ == "__main__":
    import sys

    _report(*(int(a) for a in sys.argv[1:3]))
