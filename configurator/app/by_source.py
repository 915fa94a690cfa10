"""``configurator validate --by-source``: how well the model predicts a source it was not
fitted to.

Runs belong to datasets (:attr:`configurator.core.runs.MeasuredRun.dataset`: a paper's
table, one release's page, one team's runs). Three figures per dataset:

* **presets**: the shipped GPU figures, as ``validate`` prices;
* **in sample**: the in-training factors (:data:`topology.gpus.IN_TRAINING`: what a
  training step attains of its GEMM, attention and host figures measured alone, one factor
  per kind for every GPU) fitted on every dataset together, from the values before any run
  (:func:`configurator.app.calibrate_jobs.fit_factors`);
* **held out**: the same fit on every *other* dataset, then this one predicted: the error
  on a source the model has not seen (leave one source out).

The gap between in-sample and held-out error is what a constant fitted to the visible
tables hides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from configurator.app.calibrate_jobs import factor_calibration, fit_factors
from configurator.app.validate_jobs import GroupStats, check_run, group_stats
from configurator.core.errors import InputError
from configurator.core.runs import MeasuredRun

#: Dataset of a run that names none.
UNNAMED = "unnamed"


@dataclass(frozen=True, kw_only=True)
class SourceRow:
    """One dataset: runs with a time, and the agreement with the presets, fitted on every
    dataset (in sample) and fitted on the others (held out)."""

    dataset: str
    runs: int
    presets: GroupStats | None
    in_sample: GroupStats | None
    held_out: GroupStats | None

    def to_dict(self) -> dict:
        return {"dataset": self.dataset, "runs": self.runs,
                **{k: None if g is None else g.to_dict()
                   for k, g in (("presets", self.presets), ("in_sample", self.in_sample),
                                ("held_out", self.held_out))}}


@dataclass(frozen=True, kw_only=True)
class BySourceReport:
    """Per dataset (:class:`SourceRow`), then every run together; ``in_sample_factors``:
    the factors fitted on every dataset; ``held_out_factors``: those each held-out fit used
    (dataset → kind → factor)."""

    rows: list[SourceRow]
    overall: SourceRow
    in_sample_factors: dict = field(default_factory=dict)
    held_out_factors: dict = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"datasets": [r.to_dict() for r in self.rows], "overall": self.overall.to_dict(),
                "in_sample_factors": self.in_sample_factors,
                "held_out_factors": self.held_out_factors, "skipped": list(self.skipped)}


def dataset_of(run: MeasuredRun) -> str:
    return run.dataset or UNNAMED


def validate_by_source(runs: list[MeasuredRun], skipped=(), progress=None) -> BySourceReport:
    """Leave one dataset out in turn (module docstring). ``progress``: optional callable
    called with no argument after each pricing of the runs in a fit (a progress bar's
    update). Raises :class:`InputError` with fewer than two datasets."""
    names = list(dict.fromkeys(dataset_of(r) for r in runs))
    if len(names) < 2:
        raise InputError("runs", names, "--by-source needs runs of at least two datasets "
                                        "(run files, or a dataset column)")
    presets = [check_run(r) for r in runs]
    everything = fit_factors(runs, progress)
    in_sample = [check_run(r, factor_calibration(everything)) for r in runs]
    held: list = [None] * len(runs)
    values = {}
    for name in names:
        values[name] = fit_factors([r for r in runs if dataset_of(r) != name], progress)
        cal = factor_calibration(values[name])
        for i, r in enumerate(runs):
            if dataset_of(r) == name:
                held[i] = check_run(r, cal)

    def row(name, picked) -> SourceRow:
        sets = [[c for c, r in zip(checks, runs) if picked(r)]
                for checks in (presets, in_sample, held)]
        timed = sum(1 for c in sets[0] if c.error is not None)
        return SourceRow(dataset=name, runs=timed,
                         **{k: group_stats(name, s) for k, s in
                            zip(("presets", "in_sample", "held_out"), sets)})

    rows = [row(n, lambda r, n=n: dataset_of(r) == n) for n in names]
    return BySourceReport(rows=rows, overall=row("all", lambda r: True),
                          in_sample_factors=everything, held_out_factors=values,
                          skipped=list(skipped))
