"""``configurator calibrate`` on 5 runs of each shipped source of published runs
(:func:`configurator.cost.groundtruth.published_runs`, what ``configurator validate`` prices),
``validate`` on the rest of that source: over seeded draws of the 5 (``--draws``, default 8),
the median and worst MAPE of the rest with the presets and after calibration, the draws
where ``calibrate`` refused (nothing determined), those where what the runs determined
predicted the runs left out no better than the presets (presets kept), and the largest
efficiency any draw fitted (never above 1).

Run: ``python -m bench.accuracy.calibrate_five [--draws 8] [--runs 5] [--seed 0]`` (a few
minutes on a 2-core machine).
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from bench.common import bench_parser, table_head
from configurator.app.calibrate_jobs import calibrate_runs
from configurator.app.validate_jobs import validate_runs
from configurator.core.errors import InputError
from configurator.cost.groundtruth import published_runs


def source_draws(runs, k: int, draws: int, seed: int):
    """``draws`` seeded choices of ``k`` runs (indices, sorted) out of ``len(runs)``."""
    rng = np.random.default_rng(seed)
    return [sorted(rng.choice(len(runs), size=k, replace=False).tolist())
            for _ in range(draws)]


def bench(draws: int, k: int, seed: int) -> list[dict]:
    runs, _ = published_runs()
    by = defaultdict(list)
    for r in runs:
        by[r.dataset].append(r)
    rows = []
    for source, group in by.items():
        if len(group) <= k:
            continue
        before, after, refused, kept, top, seconds = [], [], 0, 0, 0.0, []
        for pick in source_draws(group, k, draws, seed):
            train = [group[i] for i in pick]
            test = [r for i, r in enumerate(group) if i not in pick]
            mape_before = validate_runs(test).overall.mape
            t0 = time.perf_counter()
            try:
                cal, fits = calibrate_runs(train)
            except InputError:          # not determined at all
                refused += 1
                cal, fits = None, []
            if cal is not None and not cal.values:
                # determined, but no better than the presets on the runs left out
                kept += 1
                cal = None
            seconds.append(time.perf_counter() - t0)
            for f in fits:
                top = max([top] + [v for n, v in f.parameters.items() if n != "host_op_us"])
            before.append(mape_before)
            after.append(mape_before if cal is None else validate_runs(test, cal).overall.mape)
        rows.append(dict(source=source, runs=len(group), before=before, after=after,
                         refused=refused, kept=kept, top=top, seconds=float(np.median(seconds))))
    return rows


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--draws", type=int, default=8, help="seeded draws per source (default 8)")
    ap.add_argument("--runs", type=int, default=5, help="runs calibrated on (default 5)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    args = ap.parse_args(argv)
    rows = bench(args.draws, args.runs, args.seed)
    print(table_head(["source", "runs", "rest MAPE presets (median)", "calibrated: median",
                      "worst", "refused draws", "presets kept", "largest efficiency fitted",
                      "calibrate s (median)"]))
    for r in rows:
        top = f"{r['top']:.3f}" if r["top"] > 0 else "-"     # none fitted in any draw
        print(f"| {r['source']} | {r['runs']} | {100 * np.median(r['before']):.1f} % | "
              f"{100 * np.median(r['after']):.1f} % | {100 * max(r['after']):.1f} % | "
              f"{r['refused']} / {len(r['after'])} | {r['kept']} / {len(r['after'])} | "
              f"{top} | {r['seconds']:.1f} |")


if __name__ == "__main__":
    main()
