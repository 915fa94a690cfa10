"""Error bars on predicted iteration times, and the pick among plans they cannot tell apart.

Every plan's predicted time carries an interval: the time divided by ``1 + r`` for ``r``
between the 10th and 90th percentiles of the model's *relative residuals*
(``predicted / measured - 1``) on published runs of the plan's *regime*, each run predicted
with the in-training factors fitted on the *other* sources (leave one source out, as
``configurator validate --by-source``'s "held out" column). The percentiles ship as data
(``configurator/data/error_bars/loso_residuals.json``), made by
``python -m bench.accuracy.error_bars --write``; a regime with fewer than
:data:`MIN_RUNS` runs takes every run's percentiles.

On a calibrated cluster the interval also spans the calibrated parameters' own intervals
(:func:`parameter_spread`): each parameter is moved to either end of its 95 % interval, the
plan priced again in closed form, and the relative changes, taken as independent, are added
in quadrature and widen the interval on their side: ``(lo·(1 − down), hi·(1 + up))``.

Regimes (:func:`regime_of`), the first that applies:

* ``moe``: a mixture-of-experts model (routing, all-to-alls and grouped GEMMs: the least
  certain terms);
* ``host-bound``: the host takes at least as long to issue a layer's forward as the GPU
  takes to run its kernels (``host_ops.host_layer_s`` against the layer's forward compute,
  :func:`configurator.cost.compute.layer_costs`): small layers, high tp, micro-batch 1;
* ``comm-heavy``: tensor, context, expert, pipeline and data-parallel communication are at
  least :data:`COMM_HEAVY_SHARE` of the predicted time (``time_breakdown_s``);
* ``gemm-bound``: everything else.

Ties and the pick (:func:`rank_with_intervals`): plans whose predicted time lies inside the
fastest plan's interval are ties. Among them the default pick is the plan with the smallest
worst-case regret over the intervals, ``max_j (hi_i - lo_j)`` over the other ties ``j``: the
plan whose time, wherever the uncertain terms fall within their ranges, loses least to
another tie. With intervals of one relative width this is the fastest estimate; it differs
when a slightly slower plan's regime is better known.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np

from configurator.core.plan_batch import PlanBatch
from configurator.core.model import ModelSpec
from configurator.cost.compute import layer_costs
from configurator.cost.iteration import iteration_time
from configurator.data import data_path
from topology.calibration import with_link_parameters, with_parameters

#: The shipped percentiles (:mod:`bench.accuracy.error_bars` writes them).
ERROR_BARS_FILE = ("error_bars", "loso_residuals.json")
#: Fewest runs a regime's own percentiles need; below, every run's are used.
MIN_RUNS = 5
#: Share of the predicted time in communication from which a plan is ``comm-heavy``.
COMM_HEAVY_SHARE = 0.2
#: Breakdown terms counted as communication.
COMM_KEYS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
REGIMES = ("moe", "host-bound", "comm-heavy", "gemm-bound")


@functools.lru_cache(maxsize=1)
def error_bars() -> dict:
    """The shipped residual percentiles: ``{"regimes": {name: {"runs", "lo", "hi"}},
    "all": {...}, "quantiles": [q_lo, q_hi], "command": ...}``."""
    with open(data_path(*ERROR_BARS_FILE), encoding="utf-8") as fh:
        return json.load(fh)


def residual_range(regime: str) -> tuple[float, float]:
    """``(r_lo, r_hi)``: the regime's residual percentiles (every run's below
    :data:`MIN_RUNS`)."""
    bars = error_bars()
    row = bars["regimes"].get(regime)
    if row is None or row["runs"] < MIN_RUNS:
        row = bars["all"]
    return float(row["lo"]), float(row["hi"])


def interval_s(time_s: float, regime: str) -> tuple[float, float]:
    """``(lo, hi)`` seconds a plan predicted at ``time_s`` measures within: the measured
    time is ``time_s / (1 + r)`` for a residual ``r`` in :func:`residual_range`."""
    r_lo, r_hi = residual_range(regime)
    return time_s / (1.0 + r_hi), time_s / (1.0 + r_lo)


def comm_share(e) -> float:
    """Communication's share of an evaluation's predicted time (:data:`COMM_KEYS`)."""
    return sum(float(e.time_breakdown_s.get(k, 0.0)) for k in COMM_KEYS) / e.iteration_time_s


def regime_of(is_moe: bool, host_bound: bool, share: float) -> str:
    """The regime (module docstring), the first rule that applies."""
    if is_moe:
        return "moe"
    if host_bound:
        return "host-bound"
    if share >= COMM_HEAVY_SHARE:
        return "comm-heavy"
    return "gemm-bound"


def regimes(model: ModelSpec, cluster, evals: list, profile=None) -> list[str]:
    """The regime of every evaluation (one :func:`layer_costs` pass over their plans)."""
    if not evals:
        return []
    lc = layer_costs(model, PlanBatch.from_plans([e.plan for e in evals]), cluster.gpu,
                     profile)
    n = len(evals)
    host = np.broadcast_to(np.asarray(lc["host"], dtype=float), (n,))
    fwd = np.broadcast_to(np.asarray(lc["fwd"], dtype=float), (n,))
    return [regime_of(model.is_moe, bool(host[i] >= fwd[i]), comm_share(e))
            for i, e in enumerate(evals)]


def parameter_spread(model: ModelSpec, cluster, evals: list,
                     profile=None) -> tuple[np.ndarray, np.ndarray]:
    """``(down, up)``: per evaluation, the relative fall and rise of its closed-form time
    (:func:`configurator.cost.iteration.iteration_time`) when each calibrated parameter of
    ``cluster`` (``cluster.calibration_intervals``: name -> ``(low, high)``) moves to either
    end of its interval, the others held, added in quadrature over the parameters (shape
    ``(len(evals),)`` each; zeros on an uncalibrated cluster)."""
    n = len(evals)
    ivs = getattr(cluster, "calibration_intervals", None) or {}
    if not ivs or not n:
        return np.zeros(n), np.zeros(n)
    plans = PlanBatch.from_plans([e.plan for e in evals])

    def price(cl):
        return np.asarray(iteration_time(model, cl, plans, profile=profile)["iteration_time_s"],
                          dtype=float)

    t0 = price(cluster)
    down2, up2 = np.zeros(n), np.zeros(n)
    for name, ends in sorted(ivs.items()):
        rel = []
        for value in ends:
            values = {name: float(value)}
            cl = with_link_parameters(cluster, values).with_gpu(
                with_parameters(cluster.gpu, values, cluster.gpu.efficiency.source))
            rel.append(price(cl) / t0 - 1.0)
        rel = np.stack(rel)
        up2 += np.maximum(rel.max(axis=0), 0.0) ** 2
        down2 += np.maximum(-rel.min(axis=0), 0.0) ** 2
    return np.sqrt(down2), np.sqrt(up2)


def with_intervals(model: ModelSpec, cluster, evals: list, profile=None) -> list:
    """``evals`` with ``regime`` and ``iteration_time_interval_s`` set: the regime's
    residual interval (:func:`interval_s`), widened by the calibrated parameters' spread
    (:func:`parameter_spread`) on a calibrated cluster."""
    down, up = parameter_spread(model, cluster, evals, profile)
    out = []
    for i, (e, r) in enumerate(zip(evals, regimes(model, cluster, evals, profile))):
        lo, hi = interval_s(e.iteration_time_s, r)
        out.append(dataclasses.replace(e, regime=r, iteration_time_interval_s=(
            lo * max(0.0, 1.0 - float(down[i])), hi * (1.0 + float(up[i])))))
    return out


def worst_regret_s(intervals: list[tuple[float, float]]) -> list[float]:
    """Each plan's worst-case regret over the others' intervals: ``max_j (hi_i - lo_j)``
    over ``j != i`` (0 for a plan alone)."""
    out = []
    for i, (_lo, hi) in enumerate(intervals):
        others = [lo for j, (lo, _hi) in enumerate(intervals) if j != i]
        out.append(max(0.0, hi - min(others)) if others else 0.0)
    return out


def rank_with_intervals(model: ModelSpec, cluster, evals: list,
                        profile=None) -> tuple[list, str | None]:
    """``evals`` (fastest first) with their intervals, ties marked and the default pick
    first (module docstring), and a one-line note on the pick when plans tie (else None)."""
    evals = with_intervals(model, cluster, evals, profile)
    if len(evals) < 2:
        return evals, None
    best = evals[0]
    hi_best = best.iteration_time_interval_s[1]
    ties = [i for i, e in enumerate(evals) if e.iteration_time_s <= hi_best]
    if len(ties) < 2:
        return evals, None
    regret = worst_regret_s([evals[i].iteration_time_interval_s for i in ties])
    k = min(range(len(ties)), key=lambda j: (regret[j], j))
    pick = ties[k]
    evals = [dataclasses.replace(e, tie=i in ties) for i, e in enumerate(evals)]
    lo, hi = best.iteration_time_interval_s
    if pick == 0:
        note = (f"ties (* after the rank): {len(ties)} of the {len(evals)} plans shown lie within the best "
                f"plan's interval {lo:.3f}-{hi:.3f} s; rank 1 is also the least exposed to "
                f"the model's uncertainty (worst-case regret {regret[0]:.3f} s)")
        return evals, note
    chosen = evals[pick]
    note = (f"picked a plan {chosen.iteration_time_s - best.iteration_time_s:.3f} s slower "
            f"than the fastest estimate ({chosen.regime} against {best.regime}): "
            f"{len(ties)} of the {len(evals)} plans shown (* after the rank) lie within the best plan's interval "
            f"{lo:.3f}-{hi:.3f} s and it has the smallest worst-case regret "
            f"({regret[k]:.3f} s against {regret[0]:.3f} s)")
    return [chosen] + [e for i, e in enumerate(evals) if i != pick], note
