"""``configurator calibrate``: fit a GPU's efficiencies to measured runs; and the fit of the
presets' in-training factors on the published runs (:func:`fit_factors`, what
``configurator validate --by-source`` runs with each source left out).

Runs are grouped by GPU type and plan precision; each group gets its own fit of a few
:data:`topology.calibration.FIT_PARAMETERS` (default: the precision's GEMM efficiency,
the fused-attention efficiency and the host time per operation) by nonlinear least squares
on the log ratio of predicted to measured iteration time (:func:`scipy.optimize.least_squares`,
parameters in log space, fractions bounded by 1).

A fit is refused where the runs cannot determine it: fewer runs than parameters + 1, a
parameter the runs' predicted times do not depend on (a relative sensitivity below
:data:`MIN_SENSITIVITY`), or parameters whose effects the runs cannot tell apart (the
Jacobian's condition number above :data:`MAX_CONDITION`). Without ``params`` the
undetermined parameters are left out of the group's fit and named in its note; with
``params`` they are an error.

Leave-one-out error: each run's residual with itself left out, by the hat-matrix formula of
least squares ``e_i / (1 - h_ii)`` at the fitted point (exact for a linear model, first
order here). Without ``params`` it also selects the model: every subset of the determined
parameters is fitted and the one with the lowest leave-one-out error kept (ties: more
parameters), and none at all when no subset predicts the runs left out better than the
preset values do.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from configurator.app.validate_jobs import priced_run
from configurator.core.errors import InputError
from configurator.core.limits import MIN_EFFICIENCY
from configurator.core.runs import MeasuredRun
from configurator.cost.measured import measured_iteration_time_s
from configurator.search.evaluate import evaluate_plan
from topology.calibration import (FIT_PARAMETERS, FRACTIONS, Calibration, gemm_parameter,
                                  parameter_value, with_parameters)

#: Smallest |d log T / d log x| over a group's runs for a parameter to count as determined.
MIN_SENSITIVITY = 0.02
#: Largest condition number of the (column-normalised) Jacobian of a fit.
MAX_CONDITION = 30.0
#: Upper bound of the host time per operation (µs).
MAX_HOST_OP_US = 1000.0


def default_parameters(precision: str) -> tuple[str, ...]:
    return (gemm_parameter(precision), "flash_attention", "host_op_us")


@dataclass(frozen=True, kw_only=True)
class GroupFit:
    """One GPU type and precision: the runs, the fitted values, MAPE (fractions) before and
    after, the leave-one-out MAPE, and notes (parameters left out and why)."""

    gpu: str
    precision: str
    runs: int
    parameters: dict
    before: dict
    mape_before: float
    mape_after: float
    loo_mape: float | None
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True, kw_only=True)
class _Prepared:
    run: MeasuredRun
    model: object
    cluster: object
    measured_s: float


def _predict(p: _Prepared, gpu) -> float:
    return evaluate_plan(p.model, p.cluster.with_gpu(gpu), p.run.plan,
                         measured=True).iteration_time_s


def _residuals(prepared, base_gpu, names, logx, source):
    gpu = with_parameters(base_gpu, dict(zip(names, np.exp(logx))), source)
    return np.array([math.log(_predict(p, gpu) / p.measured_s) for p in prepared])


def _jacobian(prepared, base_gpu, names, logx, source, step=0.05):
    r0 = _residuals(prepared, base_gpu, names, logx, source)
    cols = []
    for j in range(len(names)):
        x = np.array(logx, dtype=float)
        x[j] -= step            # fractions are bounded by 1: step down
        cols.append((r0 - _residuals(prepared, base_gpu, names, x, source)) / step)
    return r0, np.stack(cols, axis=1) if cols else np.zeros((len(prepared), 0))


def _determined(J, names) -> tuple[list[str], list[str]]:
    """Names kept and notes on those dropped: insensitive ones first, then the one most
    aligned with the others until the condition number is acceptable."""
    keep = list(range(len(names)))
    notes = []
    for j in list(keep):
        if np.max(np.abs(J[:, j])) < MIN_SENSITIVITY:
            keep.remove(j)
            notes.append(f"{names[j]}: the runs' times do not depend on it "
                         f"(|d log T / d log x| < {MIN_SENSITIVITY})")
    while len(keep) > 1:
        A = J[:, keep] / np.linalg.norm(J[:, keep], axis=0)
        sv = np.linalg.svd(A, compute_uv=False)
        if sv[-1] > 0 and sv[0] / sv[-1] <= MAX_CONDITION:
            break
        # drop the parameter best explained by the others
        worst = max(keep, key=lambda j: _explained(J, keep, j))
        keep.remove(worst)
        notes.append(f"{names[worst]}: not separable from "
                     f"{', '.join(names[k] for k in keep)} on these runs")
    return [names[j] for j in keep], notes


def _explained(J, keep, j) -> float:
    others = [k for k in keep if k != j]
    A = J[:, others]
    coef, *_ = np.linalg.lstsq(A, J[:, j], rcond=None)
    resid = J[:, j] - A @ coef
    return 1.0 - float(resid @ resid) / max(float(J[:, j] @ J[:, j]), 1e-300)


def fit_group(prepared: list[_Prepared], base_gpu, precision: str,
              params: tuple[str, ...] | None, source: str) -> GroupFit:
    """Fit one group (see the module docstring). Raises :class:`InputError` when the runs
    cannot determine an explicitly requested parameter."""
    explicit = params is not None
    names = list(params or default_parameters(precision))
    for n in names:
        if n not in FIT_PARAMETERS:
            raise InputError("params", n, "unknown; fit one of " + ", ".join(FIT_PARAMETERS))
    names = [n for n in names if n == "host_op_us" or getattr(base_gpu.efficiency, n) is not None]
    before = {n: parameter_value(base_gpu, n) for n in names}
    x0 = np.log(np.array([before[n] for n in names], dtype=float))
    r0, J = _jacobian(prepared, base_gpu, names, x0, source)
    kept, notes = _determined(J, names)
    if explicit and kept != names:
        raise InputError("params", ",".join(names), "not determined by these "
                         f"{len(prepared)} runs: " + "; ".join(notes))
    if len(prepared) < len(kept) + 1:
        msg = (f"{len(prepared)} runs of {base_gpu.name} {precision} determine at most "
               f"{max(len(prepared) - 1, 0)} parameters; {len(kept)} asked "
               f"({', '.join(kept)})")
        if explicit:
            raise InputError("runs", len(prepared), msg)
        while len(kept) >= len(prepared) and kept:
            dropped = kept.pop()
            notes.append(f"{dropped}: left out ({msg})")
    mape_before = float(np.mean(np.abs(np.exp(r0) - 1)))

    def unfitted() -> GroupFit:          # the preset values stay
        return GroupFit(gpu=base_gpu.name, precision=precision, runs=len(prepared),
                        parameters={}, before=before, mape_before=mape_before,
                        mape_after=mape_before, loo_mape=None, notes=notes)
    if not kept:
        return unfitted()
    fits = [_fit(prepared, base_gpu, names, before, x0, sub, source)
            for sub in ([kept] if explicit else _subsets(kept))]
    # without explicit parameters: the subset that best predicts the runs left out
    best = min(fits, key=lambda f: (f[2] is None, f[2] if f[2] is not None else 0.0,
                                    -len(f[0])))
    if not explicit:
        for n in kept:
            if n not in best[0]:
                notes.append(f"{n}: left out (the leave-one-out error is lower without it)")
        if best[2] is not None and best[2] >= mape_before:
            notes.append(f"no fit predicts the runs left out better than the preset values "
                         f"(leave-one-out {100 * best[2]:.1f} % vs {100 * mape_before:.1f} %)")
            return unfitted()
    values, r, loo, fit_notes = best
    return GroupFit(gpu=base_gpu.name, precision=precision, runs=len(prepared),
                    parameters={k: round(float(v), 6) for k, v in values.items()},
                    before={k: round(float(v), 6) for k, v in before.items()},
                    mape_before=mape_before, mape_after=float(np.mean(np.abs(np.exp(r) - 1))),
                    loo_mape=loo, notes=notes + fit_notes)


def _subsets(names: list[str]) -> list[list[str]]:
    """Every non-empty subset of ``names``, largest first."""
    return [list(c) for k in range(len(names), 0, -1)
            for c in itertools.combinations(names, k)]


def _fit(prepared, base_gpu, names, before, x0, kept, source):
    """Least-squares fit of ``kept`` (the others at ``before``): ``(values, log residuals,
    leave-one-out MAPE or None, notes)``; the leave-one-out error from the hat matrix of the
    linearised fit (``r_i / (1 - h_ii)``)."""
    from scipy.optimize import least_squares

    idx = [names.index(n) for n in kept]
    lo = np.array([math.log(MIN_EFFICIENCY if n in FRACTIONS else 1e-3) for n in kept])
    hi = np.array([0.0 if n in FRACTIONS else math.log(MAX_HOST_OP_US) for n in kept])
    start = np.clip(x0[idx], lo + 1e-9, hi - 1e-9)
    fixed = {n: before[n] for n in names if n not in kept}

    def resid(x):
        gpu = with_parameters(base_gpu, fixed, source) if fixed else base_gpu
        return _residuals(prepared, gpu, kept, x, source)

    sol = least_squares(resid, start, bounds=(lo, hi), diff_step=0.02, x_scale=1.0,
                        max_nfev=60)
    values = dict(zip(kept, np.exp(sol.x)))
    r = sol.fun
    Jf = sol.jac
    loo, notes = None, []
    try:
        H = Jf @ np.linalg.pinv(Jf.T @ Jf) @ Jf.T
        h = np.clip(np.diag(H), 0.0, 0.999)
        loo = float(np.mean(np.abs(np.exp(r / (1 - h)) - 1)))
    except np.linalg.LinAlgError:
        notes.append("leave-one-out error not computable (singular Jacobian)")
    return values, r, loo, notes


def prepared_runs(runs: list[MeasuredRun]) -> list[_Prepared]:
    """The runs with a measured time, priced as ``validate`` prices them
    (:func:`configurator.app.validate_jobs.priced_run`), each with its measured time. Raises
    :class:`InputError` naming a run Megatron would reject or that names an unknown preset,
    and when no run has a time."""
    out = []
    for run in runs:
        if not run.has_time:
            continue
        try:
            model, cluster, run = priced_run(run)
        except InputError as exc:
            raise InputError(f"run {run.name}", exc.value, str(exc)) from None
        out.append(_Prepared(run=run, model=model, cluster=cluster,
                             measured_s=measured_iteration_time_s(model, run)))
    if not out:
        raise InputError("runs", len(runs), "no run with a measured iteration time")
    return out


def calibrate_runs(runs: list[MeasuredRun], params: tuple[str, ...] | None = None,
                   progress=None, source: str = "calibrate"
                   ) -> tuple[Calibration, list[GroupFit]]:
    """Fit every (GPU type, precision) group of ``runs`` from the GPUs' own figures; returns
    the calibration (the fitted values only) and the per-group fits. Runs without a measured
    time are ignored; a run Megatron would reject or that names an unknown preset is an
    error naming it (:func:`prepared_runs`)."""
    groups: dict = {}
    for p in prepared_runs(runs):
        key = (p.cluster.gpu.name, p.run.plan.precision)
        groups.setdefault(key, (p.cluster.gpu, []))[1].append(p)
    fits = []
    items = list(groups.items())
    for (gname, prec), (gpu, prepared) in (progress(items) if progress else items):
        fits.append(fit_group(prepared, gpu, prec, params, source))
    values: dict = {}
    for f in fits:
        if f.parameters:
            values.setdefault(f.gpu, {})[f.precision] = dict(f.parameters)
    if not values:
        raise InputError("runs", len(runs), "no parameter is determined by these runs: "
                         + "; ".join(n for f in fits for n in f.notes))
    cal = Calibration(values=values, fit={"source": source,
                                          "groups": [f.to_dict() for f in fits]})
    return cal, fits


#: The kinds of run-fitted figure (:data:`topology.gpus.IN_TRAINING`), in fit order.
FACTOR_KINDS = ("gemm", "attention", "host")
#: Bounds of an in-training factor (a fraction capped at 1 after it applies; the host's up
#: to 20 times its prior).
FACTOR_BOUNDS = {"gemm": (0.05, 2.0), "attention": (0.05, 2.0), "host": (0.05, 20.0)}


def factor_calibration(factors) -> Calibration:
    """Every preset GPU's run-fitted efficiencies (:data:`topology.gpus.RUN_FITTED`, and the
    host time per operation) at ``factors`` (kind → factor, as
    :data:`topology.gpus.IN_TRAINING`), for every precision. All factors 1: the values
    before any run, where a fit that must not see the published runs starts."""
    from configurator.core.plan_values import PRECISION
    from topology.gpus import GPU_PRESETS, RUN_FITTED, run_fitted

    values = {}
    for g in GPU_PRESETS:
        vals = {k: run_fitted(g, k, factors) for k in RUN_FITTED.get(g, {})}
        vals["host_op_us"] = run_fitted(g, "host_op_us", factors)
        values[g] = {p: dict(vals) for p in PRECISION}
    return Calibration(values=values, fit={"source": "topology.gpus priors x factors "
                                                     + str(dict(factors))})


def fit_factors(runs: list[MeasuredRun], progress=None) -> dict:
    """The in-training factors (:data:`topology.gpus.IN_TRAINING`) that best predict
    ``runs`` (every GPU type together), by nonlinear least squares on the log ratio of
    predicted to measured time from the values before any run (factors 1; a factor the
    runs' times do not depend on, |d log T / d log f| below :data:`MIN_SENSITIVITY` on every
    run, stays 1). Returns kind → factor. ``progress``: called with no argument after each
    pricing of the runs. Raises :class:`InputError` for a run that cannot be priced."""
    from scipy.optimize import least_squares

    prepared = prepared_runs(runs)

    # every dataset weighs the same, however many rows it has
    counts: dict = {}
    for p in prepared:
        counts[p.run.dataset] = counts.get(p.run.dataset, 0) + 1
    weight = np.array([1.0 / math.sqrt(counts[p.run.dataset]) for p in prepared])

    def resid(kinds, x):
        factors = {k: 1.0 for k in FACTOR_KINDS} | dict(zip(kinds, np.exp(x)))
        cal = factor_calibration(factors)
        if progress:
            progress()
        return weight * np.array([math.log(_predict(p, cal.apply(p.cluster.gpu,
                                                                   p.run.plan.precision))
                                           / p.measured_s) for p in prepared])

    step = 0.05
    r0 = resid(FACTOR_KINDS, np.zeros(len(FACTOR_KINDS)))
    kinds = []
    for j, k in enumerate(FACTOR_KINDS):
        x = np.zeros(len(FACTOR_KINDS))
        x[j] = -step
        if np.max(np.abs((r0 - resid(FACTOR_KINDS, x)) / step)) >= MIN_SENSITIVITY:
            kinds.append(k)
    if not kinds:
        return {k: 1.0 for k in FACTOR_KINDS}
    lo = np.log([FACTOR_BOUNDS[k][0] for k in kinds])
    hi = np.log([FACTOR_BOUNDS[k][1] for k in kinds])
    sol = least_squares(lambda x: resid(kinds, x), np.zeros(len(kinds)), bounds=(lo, hi),
                        diff_step=0.02, xtol=1e-3, ftol=1e-4, max_nfev=40)
    return {k: 1.0 for k in FACTOR_KINDS} | {k: round(float(v), 4)
                                              for k, v in zip(kinds, np.exp(sol.x))}
