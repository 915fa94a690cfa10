"""``configurator trial``, then ``calibrate`` on its runs, on a node the model knows: does the
loop pick the fastest plan, on the preset's links and on the node's own (``--topology``)?

The jobs: the GPTs of ``calibrate_synthetic``'s grid (hidden 1,024 and 2,048, 12 and 24
layers, sequence 1,024, vocabulary 51,200, FP16) on the 8 GPUs of one node at global batches
8 to 128. The node: a topology file's links (default: the A100 server of NVLink-bridged pairs
that otherwise talk over PCIe, ``tests/data/nvidia-smi-topo_a100-pcie-nvlink-pairs.txt``)
with a host time per operation other than the DGX A100 preset's (``--host-op-us`` 26; the
preset's 20.8) and its links at ``--intra-node-efficiency`` (0.77; the preset's 0.767). Per job,
four picks, each the first plan of a ranking of the plans the search keeps (every legal plan
that fits, with the mechanisms of its regime), priced in closed form:

* **presets**: on the DGX A100 preset;
* **trial + calibrate**: ``trial``'s runs (default 5) made by the node (the exact schedule,
  times a seeded log-normal noise, ``--noise`` 2 %), ``calibrate`` on them, the ranking
  priced with that calibration on the preset's links: the user who does not describe the
  node;
* **topology presets**: the ranking on the node's links (``search --topology``);
* **topology trial + calibrate**: ``trial --topology`` and ``calibrate --topology``, the
  ranking priced with both.

A pick's loss: the node's closed-form time of the plan picked over the fastest of either
ranking, less 1. A ``calibrate`` that refuses keeps the presets (the row says so).

Run: ``python -m bench.accuracy.trial_synthetic [--topology-file FILE] [--runs 5]
[--seed 0]`` (about 20 seconds).
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

import numpy as np
import yaml

from bench.accuracy.calibrate_synthetic import add_made_options
from bench.accuracy.grid_drift import model_fields
from bench.common import bench_parser, table_head
from configurator.app.calibrate_jobs import calibrate_runs
from configurator.app.inputs import JobInputs
from configurator.app.trial_jobs import TrialRequest, pool_times, run_trial, trial_job
from configurator.app.validate_jobs import on_topology
from configurator.core.errors import InputError
from configurator.core.model import make_model
from configurator.core.plan_values import RECOMPUTE
from configurator.core.runs import MeasuredRun
from configurator.search.evaluate import evaluate_plan
from configurator.search.rank import search
from configurator.search.space import SearchSpace
from memory_model.estimate import DEFAULT_MAX_MEMORY_FRACTION
from topology.calibration import Calibration
from topology.importers import import_paths
from topology.topofile_io import save_topology

PAIRS = (Path(__file__).resolve().parents[2] / "tests" / "data"
         / "nvidia-smi-topo_a100-pcie-nvlink-pairs.txt")
CLUSTER = "dgx-a100-80gb"
PRECISION = "fp16"
#: (hidden, layers) of the jobs' models and their global batches, on one node of 8 GPUs.
MODELS = ((1024, 12), (1024, 24), (2048, 12), (2048, 24))
BATCHES = (8, 16, 32, 64, 128)


def ranking(model, cluster, gbs: int):
    """The plans the search keeps for the job (its ranking, with its regime's options)."""
    return search(model, cluster, gbs, top_k=1, space=SearchSpace(recompute=RECOMPUTE),
                  keep_ranking=True, max_memory_fraction=DEFAULT_MAX_MEMORY_FRACTION,
                  precision=PRECISION).ranked


def made(model, truth_cluster, outcome, rng, noise: float) -> list[MeasuredRun]:
    """The trial's runs as the node runs them: its exact-schedule time, times
    ``exp(N(0, noise))``."""
    return [MeasuredRun(name=f"trial{r.index}", group=None, source="made", model=model,
                        cluster=CLUSTER, num_gpus=r.plan.world_size, seq_length=None,
                        plan=r.plan,
                        iteration_time_s=evaluate_plan(model, truth_cluster, r.plan,
                                                       measured=True).iteration_time_s
                        * math.exp(rng.normal(0.0, noise)))
            for r in outcome.runs]


def calibrated(runs, topology) -> tuple[Calibration | None, str]:
    """``calibrate`` on ``runs`` (on ``topology``'s links if given): the calibration (None
    where it fits nothing or refuses) and what it fitted."""
    try:
        cal, fits = calibrate_runs(runs, topology=topology)
    except InputError:
        return None, "refused"
    fitted = ", ".join(f"{k} {v:.3g}" for f in fits for k, v in f.parameters.items())
    return (cal if cal.values else None), fitted or "presets kept"


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--topology-file", metavar="FILE", default=str(PAIRS),
                    help="the node: nvidia-smi topo -m output or a topology file (default: "
                         "the A100 server of NVLink pairs over PCIe)")
    add_made_options(ap, intra_node_efficiency=0.77)
    ap.add_argument("--runs", type=int, default=5, help="runs per trial (default 5)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the noise (default 0)")
    args = ap.parse_args(argv)
    topo = import_paths([args.topology_file])
    truth = Calibration(values={"a100-80gb": {PRECISION: {
        "host_op_us": args.host_op_us, "intra_node_efficiency": args.intra_node_efficiency}}})
    rng = np.random.default_rng(args.seed)
    print(f"the node: {args.topology_file}, host {args.host_op_us:g} us per operation, "
          f"NVLink efficiency {args.intra_node_efficiency:g}; {args.runs} runs per trial, "
          f"{100 * args.noise:g} % noise\n")
    cols = ["job", "presets", "trial + calibrate", "fitted", "topology presets",
            "topology trial + calibrate", "fitted on the links"]
    print(table_head(cols, ["---"] + ["---:"] * 2 + ["---"] + ["---:"] * 2 + ["---"]))
    losses: dict[str, list[float]] = {c: [] for c in cols[1:] if "fitted" not in c}
    with tempfile.TemporaryDirectory() as tmp:
        topo_path = str(Path(tmp) / "node.json")
        save_topology(topo, topo_path)
        for hidden, layers in MODELS:
            fields = model_fields(hidden, layers)
            model = make_model(**fields)
            path = Path(tmp) / f"{fields['name']}.yaml"
            path.write_text(yaml.safe_dump({k: v for k, v in fields.items() if k != "name"}))
            users = []          # (tag, the trial's inputs, its cluster): without, with links
            for tag, topology in (("", None), ("topology ", topo_path)):
                inputs = JobInputs(model=str(path), cluster=CLUSTER, nodes=1,
                                   topology=topology)
                users.append((tag, inputs, trial_job(inputs)[1]))
            truth_cluster = on_topology(truth.apply_cluster(users[0][2], PRECISION), topo,
                                        part=False)
            for gbs in BATCHES:
                fitted = []
                pools, truths = {}, []
                for tag, inputs, cluster in users:
                    pool = ranking(model, cluster, gbs)
                    t_truth = pool_times(model, truth_cluster, pool, (), {})
                    outcome = run_trial(TrialRequest(inputs=inputs, global_batch_size=gbs,
                                                     options={"precision": PRECISION},
                                                     runs=args.runs))
                    cal, what = calibrated(made(model, truth_cluster, outcome, rng,
                                                args.noise), topo if inputs.topology else None)
                    fitted.append(what)
                    priced = cluster if cal is None else cal.apply_cluster(cluster, PRECISION)
                    pools[tag] = (t_truth,
                                  pool_times(model, cluster, pool, (), {}),
                                  pool_times(model, priced, pool, (), {}))
                    truths.append(t_truth.min())
                best = min(truths)
                row = []
                for tag in ("", "topology "):
                    t_truth, t_pre, t_cal = pools[tag]
                    for name, t in ((f"{tag}presets", t_pre), (f"{tag}trial + calibrate",
                                                                t_cal)):
                        loss = t_truth[int(np.argmin(t))] / best - 1.0
                        losses[name].append(loss)
                        row.append(f"{100 * loss:.1f} %")
                print(f"| {fields['name']} gbs {gbs} | {row[0]} | {row[1]} | {fitted[0]} | "
                      f"{row[2]} | {row[3]} | {fitted[1]} |")
    print("\ntime lost to the pick over " + f"{len(losses['presets'])} jobs: " + "; ".join(
        f"{name} mean {100 * statistics.mean(v):.1f} %, worst {100 * max(v):.1f} %"
        for name, v in losses.items()))


if __name__ == "__main__":
    main()
