"""``configurator calibrate`` on runs made by a known cluster: does it recover the cluster from 5
runs, one per tp, and pick the fastest plans after?

The runs are every legal plan of GPT models of hidden 1,024 and 2,048 with 12 and 24 layers
(sequence 1,024, vocabulary 51,200, FP16, full recompute, the plan's other fields at their
defaults) on 1, 2, 4 and 8 GPUs of one DGX A100 at global batches 8 to 128, each micro batch
size that divides the batch. Their "measured" times are the model's own at a host time per
operation and an NVLink efficiency other than the preset's (``--host-op-us``,
``--intra-node-efficiency``), times a seeded log-normal noise (``--noise``, 2 %): what a
cluster whose CPUs and NCCL differ from the preset's would measure, if the model's mechanisms
are right. Each draw calibrates on one run per tp (1, 2, 4, 8) and one more, then prices every
run with the calibration. Printed: the presets against the made runs, then per draw what
``calibrate`` fitted, the MAPE of the runs left out and the time lost by running the plan the
model ranks first in each job (model, GPUs, global batch; jobs of 3 or more plans) instead of
the fastest made one: the mean over jobs and the worst.

This checks ``calibrate``'s side of the issue's five-run protocol (identifiability, the fit,
the ranking after it) on runs whose mechanisms the model has by construction; it says nothing
of how far the model's mechanisms are from a real cluster's.

``--truth-topology FILE`` makes the runs on another node than the preset's: the links of a
topology file (``configurator topology import`` of ``nvidia-smi topo -m``, e.g. of
``tests/data/nvidia-smi-topo_a100-pcie-nvlink-pairs.txt``, GPUs over PCIe beyond NVLink pairs),
a run on ``n`` GPUs on its first ``n``. ``calibrate`` and the pricing after it take the same
file when ``--topology`` is given too (``calibrate --topology``), else the DGX A100 preset:
the user who describes the node against the one who does not.

Run: ``python -m bench.accuracy.calibrate_synthetic [--draws 8] [--host-op-us 26]
[--intra-node-efficiency 0.4] [--truth-topology FILE [--topology]]`` (about 1 minute).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict

import numpy as np

from bench.accuracy.grid_drift import grid, model_fields, plan_fields
from bench.common import bench_parser, table_head
from configurator.app.calibrate_jobs import calibrate_runs
from configurator.app.validate_jobs import on_topology, run_cluster, validate_runs
from configurator.core.errors import InputError
from configurator.core.model import make_model
from configurator.core.plan import ParallelPlan
from configurator.core.runs import MeasuredRun
from configurator.search.evaluate import evaluate_plan
from topology.calibration import Calibration
from topology.topofile_io import load_topology


def grid_plans():
    """``(model, GPUs, plan)`` of every legal plan of the grid
    (:func:`bench.accuracy.grid_drift.grid`)."""
    models = {}
    for r in grid():
        key = (r["hidden"], r["layers"])
        if key not in models:
            models[key] = make_model(**model_fields(*key))
        yield models[key], r["gpus"], ParallelPlan(**plan_fields(r))


def made_runs(truth: Calibration, noise: float, seed: int,
              topology=None) -> list[MeasuredRun]:
    """The grid's runs with the times ``truth`` gives them (on ``topology``'s links if
    given), times ``exp(N(0, noise))``."""
    rng = np.random.default_rng(seed)
    runs = []
    for i, (model, n, plan) in enumerate(grid_plans()):
        run = MeasuredRun(name=f"{model.name} {n} GPUs gbs {plan.global_batch_size} tp "
                               f"{plan.tp} pp {plan.pp} mbs {plan.micro_batch_size}",
                          group=None, source="made", model=model, cluster="dgx-a100-80gb",
                          num_gpus=n, seq_length=1024, plan=plan)
        cluster = truth.apply_cluster(run_cluster(run), "fp16")
        if topology is not None:   # nominal links at the made efficiency, as calibrate's
            cluster = on_topology(cluster, topology, n < 8)
        t = evaluate_plan(model, cluster, plan, measured=True).iteration_time_s
        runs.append(dataclasses.replace(run, iteration_time_s=t * math.exp(
            rng.normal(0.0, noise))))
    return runs


def regret(runs, predicted) -> tuple[float, float]:
    """Mean and worst, over jobs (model, GPUs, global batch) of 3 or more plans, of the
    made time of the plan ``predicted`` ranks first over the job's fastest made time, less 1."""
    jobs = defaultdict(list)
    for r, p in zip(runs, predicted):
        jobs[(r.model.name, r.num_gpus, r.plan.global_batch_size)].append(
            (p, r.iteration_time_s))
    lost = [min(rows)[1] / min(t for _, t in rows) - 1.0
            for rows in jobs.values() if len(rows) >= 3]
    return statistics.mean(lost), max(lost)


def draws(runs, n: int, seed: int):
    """``n`` seeded picks of one run per tp (1, 2, 4, 8) and one more (indices)."""
    by_tp = defaultdict(list)
    for i, r in enumerate(runs):
        by_tp[r.plan.tp].append(i)
    for d in range(n):
        rng = np.random.default_rng(seed + d)
        pick = [int(rng.choice(by_tp[tp])) for tp in sorted(by_tp)]
        rest = [i for i in range(len(runs)) if i not in pick]
        yield pick + [int(rng.choice(rest))]


def add_made_options(ap, *, intra_node_efficiency: float) -> None:
    """The made cluster's options: ``--host-op-us`` (26), ``--intra-node-efficiency``
    (``intra_node_efficiency``) and ``--noise`` (0.02)."""
    ap.add_argument("--host-op-us", type=float, default=26.0,
                    help="the made cluster's host time per operation (default 26 us)")
    ap.add_argument("--intra-node-efficiency", type=float, default=intra_node_efficiency,
                    help=f"the made cluster's NVLink efficiency (default "
                         f"{intra_node_efficiency:g})")
    ap.add_argument("--noise", type=float, default=0.02,
                    help="standard deviation of the made times' log noise (default 0.02)")


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--draws", type=int, default=8, help="seeded draws (default 8)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws and noise (0)")
    add_made_options(ap, intra_node_efficiency=0.4)
    ap.add_argument("--truth-topology", metavar="FILE",
                    help="make the runs on this topology file's links (default: the preset)")
    ap.add_argument("--topology", action="store_true",
                    help="calibrate and price on --truth-topology's links too")
    args = ap.parse_args(argv)
    if args.topology and not args.truth_topology:
        ap.error("--topology needs --truth-topology FILE")
    made = {"host_op_us": args.host_op_us,
            "intra_node_efficiency": args.intra_node_efficiency}
    truth = load_topology(args.truth_topology) if args.truth_topology else None
    topo = truth if args.topology else None
    runs = made_runs(Calibration(values={"a100-80gb": {"fp16": made}}), args.noise, args.seed,
                     truth)
    if truth is not None:
        made["links"] = args.truth_topology
    presets = validate_runs(runs, topology=topo)
    mean0, worst0 = regret(runs, [c.predicted_iteration_time_s for c in presets.checks])
    print(f"{len(runs)} runs made with {made}; presets against them: MAPE "
          f"{100 * presets.overall.mape:.1f} %, mean signed {100 * presets.overall.mean_error:+.1f}"
          f" %, time lost to the pick: mean {100 * mean0:.1f} %, worst {100 * worst0:.1f} %")
    by_tp = defaultdict(list)
    for r, c in zip(runs, presets.checks):
        by_tp[r.plan.tp].append(c.error)
    print("presets' mean signed error by tp: " + ", ".join(
        f"tp {tp} {100 * statistics.mean(e):+.1f} %" for tp, e in sorted(by_tp.items())) + "\n")
    print(table_head(["draw", "fitted", "rest MAPE", "lost: mean", "lost: worst"]))
    rest, means, worsts, refused = [], [], [], 0
    for d, pick in enumerate(draws(runs, args.draws, args.seed + 100)):
        train = [runs[i] for i in pick]
        try:
            cal, fits = calibrate_runs(train, topology=topo)
        except InputError:
            refused += 1
            print(f"| {d} | refused | - | - | - |")
            continue
        report = validate_runs(runs, cal if cal.values else None, topology=topo)
        chosen = set(pick)
        left = [c for i, c in enumerate(report.checks) if i not in chosen]
        mape = statistics.mean(abs(c.error) for c in left)
        mean, worst = regret(runs, [c.predicted_iteration_time_s for c in report.checks])
        rest.append(mape), means.append(mean), worsts.append(worst)
        fitted = ", ".join(f"{k} {v:.3g}" for f in fits for k, v in f.parameters.items())
        print(f"| {d} | {fitted or 'every preset kept'} | {100 * mape:.1f} % | "
              f"{100 * mean:.1f} % | {100 * worst:.1f} % |")
    if rest:
        print(f"\nrefused {refused} of {args.draws}; median rest MAPE "
              f"{100 * statistics.median(rest):.1f} %, median mean time lost "
              f"{100 * statistics.median(means):.1f} %, worst job {100 * max(worsts):.1f} %")


if __name__ == "__main__":
    main()
