"""Speed of the schedule simulator and of one placed-plan evaluation (the placement
search's objective).

Run: ``python -m bench.speed.simulator [--repeats 5]``; prints a markdown table (best of
``--repeats`` repeats of a timed loop), then the simulator's targets (pp 8, m 64: vp 1 one replica
≤ 2 ms, 16 replicas ≤ 6 ms; vp 4 one replica ≤ 6 ms) with the record=True time and the
cold compile time of the schedule order; last, the simulated schedule against the closed form
on uniform clusters over a grid of pp, vp and microbatch counts (worst gap per model)."""

from __future__ import annotations

import time

import numpy as np

from bench.common import bench_parser, placement_plan, table_head
from configurator.core.model_presets import load_model
from configurator.cost.placed import PlacedPlan
from configurator.cost.schedule_sim import clear_cache, schedule_order, simulate
from tests.support.placement_cases import measured_cluster
from configurator.core.plan_batch import PlanBatch


def best_of(fn, n: int, repeats: int) -> float:
    """Seconds per call of ``fn``: the best of ``repeats`` loops of ``n`` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return min(times)


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed loops per figure, the best kept (default 5)")
    repeats = ap.parse_args(argv).repeats
    print(table_head(["case", "ops", "replicas", "time per call (ms)"]))
    rng = np.random.default_rng(0)
    for pp, vp, m, d in ((8, 1, 64, 1), (8, 1, 64, 16), (8, 4, 64, 1), (16, 2, 128, 64)):
        f, b = rng.uniform(1, 2, (d, pp, vp)), rng.uniform(2, 4, (d, pp, vp))
        pf, pb = rng.uniform(0, .1, (d, pp)), rng.uniform(0, .1, (d, pp))
        schedule_order(pp, vp, m)
        t = best_of(lambda: (clear_cache(), simulate(f, b, pf, pb, m)), 20, repeats)
        print(f"| simulate pp {pp}, vp {vp}, m {m} | {2 * pp * vp * m:,} | {d} | "
              f"{t * 1e3:.2f} |")
    cl = measured_cluster(128, 8, seed=1, slow_links=0.05)
    for name, fields in (("gpt3-175b", dict(tp=8, pp=8, global_batch_size=1536)),
                         ("llama3-70b", dict(tp=8, pp=4, vp=2, global_batch_size=1024))):
        plan = placement_plan(dict(fields, recompute="full"), 1024)
        priced = PlacedPlan(load_model(name), cl, PlanBatch.from_plan(plan))
        nh, go = priced.default_placement()
        t = best_of(lambda: priced.objective(nh, go), 10, repeats)
        print(f"| placed {name} tp{plan.tp} pp{plan.pp} vp{plan.vp} dp{plan.dp}, 128 measured "
              f"hosts | {2 * plan.pp * plan.vp * plan.num_microbatches:,} | {plan.dp} | "
              f"{t * 1e3:.2f} |")
        draws = [(rng.permutation(128), go) for _ in range(64)]
        t = best_of(lambda: priced.times(draws), 1, repeats) / len(draws)
        print(f"| the same, 64 placements priced in one batch (per placement) | "
              f"{2 * plan.pp * plan.vp * plan.num_microbatches:,} | {64 * plan.dp} | "
              f"{t * 1e3:.2f} |")
    print()
    print(table_head(["target case", "replicas", "limit (ms)", "simulate (ms)",
                      "record=True (ms)", "compile order, cold (ms)"]))
    for pp, vp, m, d, limit in ((8, 1, 64, 1, 2.0), (8, 1, 64, 16, 6.0), (8, 4, 64, 1, 6.0)):
        f, b = rng.uniform(1, 2, (d, pp, vp)), rng.uniform(2, 4, (d, pp, vp))
        pf, pb = rng.uniform(0, .1, (d, pp)), rng.uniform(0, .1, (d, pp))
        schedule_order.cache_clear()
        t0 = time.perf_counter()
        schedule_order(pp, vp, m)
        t_compile = time.perf_counter() - t0
        t = best_of(lambda: (clear_cache(), simulate(f, b, pf, pb, m)), 20, repeats)
        t_rec = best_of(lambda: simulate(f, b, pf, pb, m, record=True), 5, repeats)
        verdict = "ok" if t * 1e3 <= limit else "OVER"
        print(f"| pp {pp}, vp {vp}, m {m} | {d} | {limit:g} | {t * 1e3:.2f} ({verdict}) | "
              f"{t_rec * 1e3:.2f} | {t_compile * 1e3:.1f} |")

    agreement()


def agreement() -> None:
    """Simulated schedule (default placement, uniform cluster) vs the closed form over pp,
    vp and microbatch counts: the worst relative gap per model
    (:func:`tests.support.placement_cases.closed_form_agreement`)."""
    from tests.support.placement_cases import AGREEMENT_MODELS, closed_form_agreement

    print()
    print(table_head(["model", "cluster", "plans (pp × vp × m)", "worst gap", "at"]))
    for name, cluster, nodes, tp in AGREEMENT_MODELS:
        worst, at, n = closed_form_agreement(name, cluster, nodes, tp)
        print(f"| {name} | {nodes} × {cluster} | {n} | {100 * worst:.2f} % | {at} |")


if __name__ == "__main__":
    main()
