"""The error bars' data: leave-one-source-out relative residuals of the published runs, by
regime (:mod:`configurator.search.intervals`).

For each source (dataset) of the published runs that ship with the tool, the in-training
factors are fitted on every *other* source (as ``configurator validate --by-source``'s "held
out" column), then each of its runs is priced with them; its residual
``predicted / measured - 1`` goes to the run's regime (``moe``, ``host-bound``,
``comm-heavy``, ``gemm-bound``). Prints per regime the runs, the 10th and 90th percentile
residuals and the median; ``--write`` stores them in
``configurator/data/error_bars/loso_residuals.json``, which the search's intervals read.
About 5 minutes on a 2-core machine.

Run: ``python -m bench.accuracy.error_bars [--write]``.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from bench.common import bench_parser, table_head
from configurator.app.by_source import dataset_of
from configurator.app.calibrate_jobs import factor_calibration, fit_factors
from configurator.app.validate_jobs import load_run_files, priced_run
from configurator.core.errors import InputError
from configurator.cost.measured import measured_iteration_time_s
from configurator.data import data_path
from configurator.search.evaluate import evaluate_plan
from configurator.search.intervals import ERROR_BARS_FILE, MIN_RUNS, REGIMES, regimes

QUANTILES = (0.10, 0.90)
COMMAND = "python -m bench.accuracy.error_bars --write"


def held_out_residuals(runs) -> list[tuple[str, str, str, float]]:
    """``(dataset, run name, regime, residual)`` of every timed run, each priced with the
    factors fitted on the other datasets."""
    out = []
    names = list(dict.fromkeys(dataset_of(r) for r in runs))
    for name in names:
        cal = factor_calibration(fit_factors([r for r in runs if dataset_of(r) != name]))
        for run in runs:
            if dataset_of(run) != name:
                continue
            try:
                model, cluster, run = priced_run(run)
                cluster = cluster.with_gpu(cal.apply(cluster.gpu, run.plan.precision))
                ev = evaluate_plan(model, cluster, run.plan, measured=True)
            except InputError:
                continue
            measured = measured_iteration_time_s(model, run)
            if measured is None:
                continue
            regime = regimes(model, cluster, [ev])[0]
            out.append((name, run.name, regime, ev.iteration_time_s / measured - 1.0))
    return out


def summary(residuals) -> dict:
    """Per regime and over all runs: runs, percentiles (``lo``, ``hi``) and median."""
    def row(values):
        v = np.asarray(values, dtype=float)
        if v.size == 0:
            return {"runs": 0, "lo": None, "hi": None, "median": None}
        lo, hi = np.quantile(v, QUANTILES)
        return {"runs": int(v.size), "lo": round(float(lo), 4), "hi": round(float(hi), 4),
                "median": round(float(np.median(v)), 4)}

    return {"command": COMMAND, "quantiles": list(QUANTILES), "min_runs": MIN_RUNS,
            "residual": "predicted / measured - 1, each source's runs priced with the "
                        "in-training factors fitted on the other sources",
            "regimes": {g: row([r for _, _, reg, r in residuals if reg == g])
                        for g in REGIMES},
            "all": row([r for *_, r in residuals])}


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--write", action="store_true",
                    help="store the figures in configurator/data/error_bars/")
    args = ap.parse_args(argv)
    runs, _skipped = load_run_files([])
    res = held_out_residuals(runs)
    s = summary(res)
    print(table_head(["regime", "runs", "p10 residual", "median", "p90 residual"]))
    for name, row in [*s["regimes"].items(), ("all", s["all"])]:
        cells = ["-" if row[k] is None else f"{100 * row[k]:+.1f} %"
                 for k in ("lo", "median", "hi")]
        print(f"| {name} | {row['runs']} | " + " | ".join(cells) + " |")
    if args.write:
        path = data_path(*ERROR_BARS_FILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(s, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
