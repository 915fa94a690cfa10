"""``configurator calibrate`` on half the published runs of each (GPU, precision) group with
at least four runs (every other run), ``validate`` on the other half: test MAPE with the
preset efficiencies and with the calibration, and what was fitted.

Run: ``python bench/calibrate_halves.py`` (≈ 6 s).
"""

from __future__ import annotations

from collections import defaultdict

from configurator.app.calibrate_jobs import calibrate_runs
from configurator.app.validate_jobs import run_cluster, validate_runs
from configurator.core.errors import InputError
from configurator.cost.groundtruth import published_runs


def main() -> None:
    runs, _ = published_runs()
    by = defaultdict(list)
    for r in runs:
        by[(run_cluster(r).gpu.name, r.plan.precision)].append(r)
    print("| GPU | precision | train / test rows | test MAPE before | after | fitted |")
    print("|---|---|---|---|---|---|")
    for (gpu, precision), group in by.items():
        if len(group) < 4:
            continue
        train, test = group[0::2], group[1::2]
        before = validate_runs(test).overall.mape
        head = f"| {gpu} | {precision} | {len(train)} / {len(test)} | {100 * before:.1f} % "
        try:
            cal, fits = calibrate_runs(train)
        except InputError as exc:      # nothing determined: the presets stay
            print(head + f"| {100 * before:.1f} % | nothing: {str(exc).split('; ')[-1]} |")
            continue
        after = validate_runs(test, cal).overall.mape
        fitted = ", ".join(f"{k} {v:.3g}" for f in fits for k, v in f.parameters.items())
        print(head + f"| {100 * after:.1f} % | {fitted} |")


if __name__ == "__main__":
    main()
