"""``configurator calibrate`` on 2 runs of one source × GPU × precision group of the shipped
published runs (:func:`configurator.cost.groundtruth.published_runs`), ``validate`` on the
rest of that group: over seeded draws (``--draws``, default 20; a group with at least 3 runs
drawn at random, then 2 of its runs), the draws ``calibrate`` refused (it exits 2: the runs
determine nothing), those that kept every preset (what the runs determine predicts the runs
left out no better), the rest's MAPE before and after and what was fitted.

``--scatter`` prints instead how far the presets' errors scatter within a group
(:func:`group_scatter`).

Run: ``python -m bench.accuracy.calibrate_pairs [--draws 20] [--seed 0] [--scatter]`` (about a
minute on a 2-core machine).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from bench.common import bench_parser, table_head
from configurator.app.calibrate_jobs import calibrate_runs
from configurator.app.validate_jobs import run_cluster, validate_runs
from configurator.core.errors import InputError
from configurator.cost.groundtruth import published_runs


def groups() -> dict:
    """The shipped published runs by ``(source, GPU, precision)``."""
    runs, _ = published_runs()
    out = defaultdict(list)
    for r in runs:
        out[(r.dataset, run_cluster(r).gpu.name, r.plan.precision)].append(r)
    return out


def group_scatter() -> tuple[float, int, int]:
    """``(pooled standard deviation, groups, degrees of freedom)`` of the presets' log errors
    (log predicted over measured time) about their group's mean, over the groups of
    :func:`groups` with at least 2 runs: how far the model's error varies from plan to plan
    where one set of parameter values holds, which no fitted parameter of the group
    removes."""
    squares, dof, n = 0.0, 0, 0
    for runs in groups().values():
        if len(runs) < 2:
            continue
        r = np.log([c.predicted_iteration_time_s / c.measured_iteration_time_s
                    for c in validate_runs(runs).checks])
        squares += float(np.sum((r - r.mean()) ** 2))
        dof += len(r) - 1
        n += 1
    return float(np.sqrt(squares / dof)), n, dof


def draws(n_draws: int, seed: int) -> list[tuple[tuple, list, list]]:
    """``(group key, the 2 runs, the rest)`` for ``n_draws`` seeded draws."""
    by = groups()
    keys = [k for k, g in by.items() if len(g) >= 3]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_draws):
        key = keys[rng.integers(len(keys))]
        group = by[key]
        pick = set(rng.choice(len(group), size=2, replace=False).tolist())
        out.append((key, [r for i, r in enumerate(group) if i in pick],
                    [r for i, r in enumerate(group) if i not in pick]))
    return out


class PairDraws:
    """Tally of ``calibrate`` on some runs then ``validate`` on others, draw by draw."""

    def __init__(self):
        self.draws = self.refused = self.kept = self.within = 0

    def run(self, train, test) -> tuple[str, str, str]:
        """``calibrate`` on ``train``, ``validate`` on ``test``: the test runs' MAPE with the
        presets and after calibration (``-`` where refused, exit 2: the runs determine
        nothing; the presets' where every preset was kept: an empty calibration), and what
        was fitted, as table cells."""
        self.draws += 1
        before = validate_runs(test).overall.mape
        try:
            cal, fits = calibrate_runs(train)
        except InputError:
            self.refused += 1
            after, fitted = None, "refused: nothing determined"
        else:
            if not cal.values:
                self.kept += 1
                after, fitted = before, "every preset kept"
            else:
                after = validate_runs(test, cal).overall.mape
                fitted = ", ".join(f"{k} {v:.3g}" for f in fits
                                   for k, v in f.parameters.items())
        self.within += after is not None and after <= 0.10
        return (f"{100 * before:.1f} %", "-" if after is None else f"{100 * after:.1f} %",
                fitted)

    def summary(self) -> str:
        return (f"refused {self.refused} of {self.draws}; presets kept {self.kept}; rest within "
                f"10 % after calibration: {self.within} of {self.draws - self.refused}")


def draws_parser(doc: str):
    """The bench's parser with ``--draws`` (20) and ``--seed`` (0) of the pair draws."""
    ap = bench_parser(doc)
    ap.add_argument("--draws", type=int, default=20, help="seeded draws (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    return ap


def main(argv=None) -> None:
    ap = draws_parser(__doc__)
    ap.add_argument("--scatter", action="store_true",
                    help="print only the presets' scatter within a group (group_scatter)")
    args = ap.parse_args(argv)
    if args.scatter:
        sd, n, dof = group_scatter()
        print(f"the presets' log errors about their group's mean: pooled standard deviation "
              f"{100 * sd:.1f} % ({n} groups, {dof} degrees of freedom)")
        return
    print(table_head(["draw", "source", "GPU", "precision", "rest", "rest MAPE presets",
                      "after", "fitted"]))
    tally = PairDraws()
    for d, ((source, gpu, precision), train, test) in enumerate(draws(args.draws, args.seed)):
        before, after, fitted = tally.run(train, test)
        print(f"| {d} | {source} | {gpu} | {precision} | {len(test)} | {before} | {after} | "
              f"{fitted} |")
    print("\n" + tally.summary())


if __name__ == "__main__":
    main()
