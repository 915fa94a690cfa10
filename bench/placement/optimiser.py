"""Placement benchmark: the optimiser against exhaustive enumeration, against a Pipette-style
baseline, on the real 17-node H100 topology, and its wall time at 128 nodes.

Run: ``python -m bench.placement.optimiser [--quick] [--cases N]``. Prints markdown tables.
Figures:

1. *Enumerable cases*: ``--cases`` (60; 20 with ``--quick``) random heterogeneous clusters
   (5 hosts × 2 GPUs, plans on 4 of them); every placement priced (1,920 of them) vs
   :func:`search_placement` forced to search locally (400 evaluations): how often it finds
   the optimum, worst gap, time.
2. *Pipette's algorithm* (Yim et al., DATE'24: simulated annealing over server
   permutations against a communication-only objective), re-implemented here as a
   baseline: both placements priced by the simulator, and both wall times, on the same
   random 16- and 32-host topologies.
3. *Real 17-node H100 cluster* (the shipped logs, ``configurator examples``): llama3-70b
   and gpt3-175b on 16 of 17 hosts: optimised vs Megatron's default vs median of 100 random
   placements, and the host left out.
4. *128 hosts*: optimiser wall time per plan (budget 5 s) and its gain.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from bench.common import bench_parser, placement_plan, table_head
from configurator.core.model import make_model
from configurator.core.model_presets import load_model
from configurator.cost.placed import PlacedPlan
from configurator.search.placement_search import place_plan, search_placement
from configurator.search.rank import search
from tests.support.placement_cases import measured_cluster
from topology.cluster_files import load_cluster
from configurator.core.plan_batch import PlanBatch


def small_model():
    return make_model(name="bench-1b", num_layers=8, hidden_size=2048, num_attention_heads=16,
                      num_query_groups=16, ffn_hidden_size=8192, vocab_size=32000,
                      seq_length=2048)


def enumerable(n_cases: int):
    print("\n## 1. Enumerable cases: local search vs every placement\n")
    print(table_head(["case", "plan", "optimum (s)", "found (s)", "gap", "evaluations",
                      "time (s)"]))
    model = small_model()
    hits, gaps, times, ex_times = 0, [], [], []
    layouts = [dict(tp=1, pp=4, global_batch_size=16), dict(tp=2, pp=2, global_batch_size=16),
               dict(tp=1, pp=2, global_batch_size=32)]
    for k in range(n_cases):
        cl = measured_cluster(5, 2, seed=k, slow_links=0.2, slow_hosts=1, gpu_spread=0.15)
        p = placement_plan(layouts[k % len(layouts)], 8)
        priced = PlacedPlan(model, cl, PlanBatch.from_plan(p))
        t0 = time.perf_counter()
        ex = search_placement(priced.objective, num_hosts=5, num_nodes=4, gpus_per_node=2,
                              time_budget_s=600, objective_many=priced.times)
        ex_times.append(time.perf_counter() - t0)
        assert ex.exhaustive
        t0 = time.perf_counter()
        ls = search_placement(priced.objective, num_hosts=5, num_nodes=4, gpus_per_node=2,
                              exhaustive_limit=0, max_evaluations=400, time_budget_s=60,
                              seed=k, objective_many=priced.times)
        dt = time.perf_counter() - t0
        gap = ls.objective / ex.objective - 1
        hits += gap <= 1e-9
        gaps.append(gap)
        times.append(dt)
        if k < 5 or gap > 1e-9:
            print(f"| {k} | tp{p.tp} pp{p.pp} dp{p.dp} | {ex.objective:.4f} | "
                  f"{ls.objective:.4f} | {100 * gap:.2f} % | {ls.evaluations} | {dt:.2f} |")
    print(f"\nOptimum found in {hits}/{n_cases} cases; worst gap {100 * max(gaps):.2f} %; "
          f"median gap {100 * statistics.median(gaps):.3f} %; local-search time median "
          f"{statistics.median(times):.2f} s, max {max(times):.2f} s (exhaustive: "
          f"{ex.evaluations} placements, median {statistics.median(ex_times):.2f} s).")


def pipette_anneal(priced: PlacedPlan, num_hosts: int, *, iterations: int, seed: int):
    """Pipette's placement step, re-implemented: simulated annealing over server (host)
    permutations, GPU order fixed, minimising a communication-only cost: the slowest
    replica's pipeline sends (m microbatches × every boundary, both directions) plus the
    slowest stage's data-parallel reduction plus the slowest tensor-parallel stage's
    collectives (no compute, no schedule). Geometric cooling from 10 % of the start cost.
    Returns (node_hosts, wall_s)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    N, G = priced.num_nodes, priced.cluster.gpus_per_node
    ident = np.tile(np.arange(G), (N, 1))
    m = priced.num_microbatches
    L = priced.model.num_layers / priced.pp

    def comm_cost(perm):
        t = priced.terms(priced.rank_gpus(perm[:N], ident))
        p2p = (t["p2p_f"] + t["p2p_b"]).sum(axis=1).max() * m
        return float(p2p + t["tail"].max())

    perm = np.arange(num_hosts)
    cur = comm_cost(perm)
    best, best_perm = cur, perm.copy()
    temp = 0.1 * cur
    alpha = math.exp(math.log(1e-4) / iterations)
    for _ in range(iterations):
        i, j = rng.choice(num_hosts, 2, replace=False)
        cand = perm.copy()
        cand[i], cand[j] = cand[j], cand[i]
        c = comm_cost(cand)
        if c < cur or rng.random() < math.exp(-(c - cur) / max(temp, 1e-30)):
            perm, cur = cand, c
            if c < best:
                best, best_perm = c, cand.copy()
        temp *= alpha
    del L
    return best_perm[:N], time.perf_counter() - t0


def versus_pipette(quick: bool):
    print("\n## 2. Against Pipette's simulated annealing (communication-only objective)\n")
    print(table_head(["hosts", "model", "plan", "default (s)", "Pipette SA (s)", "ours (s)",
                      "Pipette wall (s)", "ours wall (s)"]))
    cases = [(16, 17, "llama3-8b", dict(tp=2, pp=4, global_batch_size=256)),
             (16, 17, "llama3-70b", dict(tp=8, pp=4, global_batch_size=256)),
             (32, 33, "gpt3-175b", dict(tp=8, pp=8, global_batch_size=512))]
    for n, hosts, name, fields in cases[: 2 if quick else 3]:
        for seed in range(2 if quick else 3):
            cl = measured_cluster(hosts, 8, seed=100 + seed, slow_links=0.1, slow_hosts=1)
            model = load_model(name)
            p = placement_plan(fields, n * 8)
            priced = PlacedPlan(model, cl, PlanBatch.from_plan(p))
            ident = np.tile(np.arange(8), (n, 1))
            default = priced.objective(np.arange(n), ident)
            sa_hosts, sa_wall = pipette_anneal(priced, hosts, iterations=2000 if quick
                                               else 5000, seed=seed)
            sa = priced.objective(sa_hosts, ident)
            t0 = time.perf_counter()
            ours, _ = place_plan(model, cl, p, time_budget_s=5.0, seed=seed,
                                 random_samples=0)
            wall = time.perf_counter() - t0
            print(f"| {n} of {hosts} | {name} | tp{p.tp} pp{p.pp} dp{p.dp} | {default:.3f} | "
                  f"{sa:.3f} | {ours.iteration_time_s:.3f} | {sa_wall:.1f} | {wall:.1f} |")


def real_cluster():
    print("\n## 3. Real 17-node H100 cluster, 16 of 17 hosts\n")
    from topology.importers import import_paths
    from topology.topofile import apply_topology

    from configurator.data import EXAMPLES, data_path

    topo = import_paths([data_path(EXAMPLES, "h100-17node-nccl-tests")])
    full = apply_topology(load_cluster("dgx-h100-80gb", len(topo.hosts)), topo)
    print(table_head(["model", "best plan", "optimised (s)", "default (s)", "random median (s)",
                      "gain vs default", "host left out", "optimiser wall (s)"]))
    cases = [("llama3-70b", 512, None), ("llama3-70b", 512, dict(tp=8, pp=8)),
             ("gpt3-175b", 1536, None), ("gpt3-175b", 1536, dict(tp=8, pp=16))]
    for name, gbs, fixed in cases:
        model = load_model(name)
        if fixed is None:     # the search's best plan on the 16 healthiest hosts
            p = search(model, full.subset(range(16)), gbs, top_k=1).plans[0].plan
        else:
            p = placement_plan(dict(fixed, global_batch_size=gbs, recompute="full"), 128)
        t0 = time.perf_counter()
        out, _ = place_plan(model, full, p, time_budget_s=5.0)
        wall = time.perf_counter() - t0
        gain = 100 * (out.iteration_time_s / out.default_iteration_time_s - 1)
        print(f"| {name} | tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} vp{p.vp} mbs"
              f"{p.micro_batch_size} | {out.iteration_time_s:.3f} | "
              f"{out.default_iteration_time_s:.3f} | {out.random_median_iteration_time_s:.3f} "
              f"| {gain:+.1f} % | {', '.join(out.excluded_hosts)} | {wall:.1f} |")


def at_128_nodes():
    print("\n## 4. 128 hosts (1,024 GPUs), budget 5 s per plan\n")
    print(table_head(["model", "plan", "default (s)", "random median (s)", "optimised (s)",
                      "evaluations", "optimiser wall (s)", "with 20 random placements (s)"]))
    cl = measured_cluster(130, 8, seed=7, slow_links=0.05, slow_hosts=2)
    for name, fields in (("gpt3-175b", dict(tp=8, pp=8, global_batch_size=1536)),
                         ("llama3-70b", dict(tp=8, pp=4, global_batch_size=1024))):
        model = load_model(name)
        p = placement_plan(fields, 1024)
        t0 = time.perf_counter()
        out, _ = place_plan(model, cl, p, time_budget_s=5.0, random_samples=20)
        wall = time.perf_counter() - t0
        print(f"| {name} | tp{p.tp} pp{p.pp} dp{p.dp} | {out.default_iteration_time_s:.3f} | "
              f"{out.random_median_iteration_time_s:.3f} | {out.iteration_time_s:.3f} | "
              f"{out.evaluations} | {out.wall_time_s:.1f} | {wall:.1f} |")


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer cases")
    ap.add_argument("--cases", type=int,
                    help="enumerable cases of section 1 (default 60; 20 with --quick)")
    args = ap.parse_args(argv)
    enumerable(args.cases or (20 if args.quick else 60))
    versus_pipette(args.quick)
    real_cluster()
    at_128_nodes()


if __name__ == "__main__":
    main()
