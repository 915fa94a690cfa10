"""Link model by message size: a robust α–β (latency–bandwidth) fit over a message sweep.

Model (Hockney, "The communication challenge for MPP: Intel Paragon and Meiko CS-2",
Parallel Computing 20(3), 1994; the α–β model used by NCCL/MPI cost analyses)::

    time(n) = α + n / β_alg          n bytes, time in seconds, α ≥ 0 latency (s),
    β = β_alg · bus_factor           β_alg algorithm bandwidth (bytes/s), β bus bandwidth

``bus_factor`` turns nccl-tests' algorithm bandwidth (``size / time``) into its bus bandwidth
(NVIDIA/nccl-tests doc/PERFORMANCE.md): 1 for sendrecv/broadcast/reduce, ``2(k−1)/k`` for
all_reduce, ``(k−1)/k`` for all_gather/reduce_scatter/alltoall over ``k`` ranks
(:func:`bus_factor`). The fitted β is therefore directly comparable with the ``busbw``
column of a log, and ``predict_time_s`` gives the time of one operation of ``n`` bytes.

Method. Residuals are relative, in log form, ``r_i = ln(t̂(n_i) / t_i)`` (≈ the relative
error for small errors, symmetric for a point 5× too slow or 5× too fast, and scale-free so a
16 GiB row does not outweigh a 32 MiB one). Steps:

1. consensus start (:func:`_consensus`, MSAC: Torr & Zisserman, CVIU 78, 2000): among the
   lines through every two points of different sizes (and through the origin and every
   point), the one that explains the most points within ``CONSENSUS_TOL`` (5 %). This start
   survives even a majority of bad timings, as in sweeps that collapse beyond 512 MiB;
2. a robust fit of those points: :func:`scipy.optimize.least_squares` with
   ``loss="soft_l1"``, ``f_scale = SOFT_L1_SCALE`` (5 %), parameters ``α ≥ 0`` and
   ``1/β_alg > 0``;
3. outliers: points with ``|r_i − median(r)| > OUTLIER_K · σ`` (3.5) where
   ``σ = max(1.4826 · MAD(r), SIGMA_FLOOR)`` over the kept points (scaled MAD: Rousseeuw &
   Croux, JASA 1993; the 2 % floor keeps the rounding of the log's ``time`` column, e.g.
   ``1.8e+07`` µs with two digits, from flagging anything on a clean sweep); every point,
   including those step 1 left out, is judged again;
4. a refit of the kept points (same loss), repeated from step 3 until the kept set no longer
   changes (at most ``MAX_ROUNDS`` times). At least two distinct sizes must remain; when they
   would not, the step is not taken.

Latency. α rests on the small end of the sweep: with 32 MiB and up it is about 1 % of the
shortest time, so it is well determined on a clean sweep (H100 pairs: 12–67 µs, standard error
a few µs) and meaningless on an erratic one. :attr:`LinkFit.latency_stderr_s` is its standard
error from the linearised fit, and :attr:`LinkFit.latency_resolved` says whether to use it
(α ≥ ``LATENCY_MIN_T`` standard errors and at most ``LATENCY_MAX_OUTLIER_SHARE`` of the points
left out).

Edge cases (never an exception for odd data; each adds a line to :attr:`LinkFit.notes`):

* non-finite, zero or negative times or sizes (or a size/time ratio beyond float range) are
  skipped;
* one size only: β = that size divided by its median time, α = None (not identifiable);
* a latency-bound sweep, where ``n_max / β_alg`` stays below ``LATENCY_BOUND_SHARE`` of α (or
  the fit pushes 1/β to its bound): β is not identifiable from the times; it is reported as
  the largest observed rate ``max(n_i / t_i)`` (a lower bound of the true β) and the fit is
  marked ``latency_bound``.

Errors: :class:`configurator.core.errors.InputError` when the two inputs differ in length or
hold no usable point, or ``bus_factor`` is not a positive finite number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from configurator.core.errors import InputError

__all__ = ["LinkFit", "fit_alpha_beta", "predict_time_s", "bus_factor", "SOFT_L1_SCALE",
           "OUTLIER_K", "SIGMA_FLOOR", "MAX_ROUNDS", "CONSENSUS_TOL", "MAX_ANCHORS",
           "LATENCY_BOUND_SHARE", "LATENCY_MIN_T", "LATENCY_MAX_OUTLIER_SHARE"]

#: Soft-L1 transition (residual scale) of the robust fit: 5 % relative error.
SOFT_L1_SCALE = 0.05
#: A point is an outlier beyond this many robust σ of the residuals.
OUTLIER_K = 3.5
#: Floor of the robust σ of the log residuals (2 %): rounding of the logs' time column.
SIGMA_FLOOR = 0.02
#: Outlier rejection / refit rounds at most.
MAX_ROUNDS = 5
#: Consensus step: candidate lines through at most this many anchor points (O(anchors²)).
MAX_ANCHORS = 48
#: Consensus step: a point within 5 % (log residual) of a candidate line supports it.
CONSENSUS_TOL = 0.05
#: A sweep whose bandwidth term at its largest size is below this share of α is latency-bound.
LATENCY_BOUND_SHARE = 0.1
#: α counts as resolved when it is at least this many standard errors above zero ...
LATENCY_MIN_T = 3.0
#: ... and at most this share of the sweep's points were left out as outliers.
LATENCY_MAX_OUTLIER_SHARE = 0.25
#: σ ≈ 1.4826 · MAD for normally distributed data (1 / Φ⁻¹(3/4); Rousseeuw & Croux 1993);
#: the audit's robust scale too (:mod:`topology.link_classes`).
MAD_TO_SIGMA = 1.4826

_BUS_FACTORS = {"sendrecv": lambda k: 1.0, "broadcast": lambda k: 1.0,
                "reduce": lambda k: 1.0, "all_reduce": lambda k: 2 * (k - 1) / k,
                "all_gather": lambda k: (k - 1) / k, "reduce_scatter": lambda k: (k - 1) / k,
                "alltoall": lambda k: (k - 1) / k}


@dataclass(frozen=True, kw_only=True)
class LinkFit:
    """Result of :func:`fit_alpha_beta`.

    ``latency_s`` α in seconds (≥ 0; None when one size only), ``bandwidth_Bps`` β in bytes/s
    (bus bandwidth: algorithm bandwidth × ``bus_factor``), ``samples`` points used in the final
    fit, ``outliers`` points excluded as outliers (skipped invalid points are neither),
    ``rel_rmse`` root-mean-square relative residual of the points used (dimensionless),
    ``sizes`` distinct message sizes used, ``max_message_bytes`` the largest of them,
    ``outlier_bytes`` the sizes (sorted, distinct) with an excluded point, ``bus_factor``
    as given, ``latency_bound`` True when β could not be identified (see the module
    docstring), ``latency_stderr_s`` the standard error of α (s; None with fewer than three
    points), ``notes`` one line per edge case met.
    """

    latency_s: float | None
    bandwidth_Bps: float
    samples: int
    outliers: int
    rel_rmse: float
    sizes: int
    max_message_bytes: int
    outlier_bytes: tuple[int, ...] = ()
    bus_factor: float = 1.0
    latency_bound: bool = False
    latency_stderr_s: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def latency_resolved(self) -> bool:
        """True when the sweep pins α down: α > 0, at least ``LATENCY_MIN_T`` standard errors
        above zero, and at most ``LATENCY_MAX_OUTLIER_SHARE`` of the points left out (with
        many outliers the kept sizes bend α to fit whatever line they share). Sweeps of large
        messages only (e.g. 32 MiB and up) leave α at the 1 % level of the shortest time, so
        it is resolved on clean sweeps and not on erratic ones."""
        if not self.latency_s or self.latency_stderr_s is None or self.latency_bound:
            return False
        total = self.samples + self.outliers
        return (self.latency_s >= LATENCY_MIN_T * self.latency_stderr_s
                and self.outliers <= LATENCY_MAX_OUTLIER_SHARE * total)


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests bus-bandwidth factor of collective ``op`` (``sendrecv``, ``all_reduce``,
    ``all_gather``, ``reduce_scatter``, ``alltoall``, ``broadcast``, ``reduce``; a ``_perf``
    suffix is ignored) over ``ranks`` ranks (doc/PERFORMANCE.md). Unknown ops, or fewer than
    two ranks, give 1.0 (busbw = algbw)."""
    f = _BUS_FACTORS.get(op.removesuffix("_perf"))
    if f is None or ranks < 2:
        return 1.0
    return f(ranks)


def predict_time_s(fit: LinkFit, message_bytes: float | Sequence[float] | np.ndarray):
    """Predicted time (s) of one operation of ``message_bytes`` bytes (a number, or an array of
    any shape: same shape back): ``α + n · bus_factor / β``; α None counts as 0."""
    alpha = fit.latency_s or 0.0
    n = np.asarray(message_bytes, dtype=float)
    t = alpha + n * fit.bus_factor / fit.bandwidth_Bps
    return float(t) if t.ndim == 0 else t


def _clean(message_bytes, time_s) -> tuple[np.ndarray, np.ndarray, int]:
    try:
        n = np.asarray(message_bytes, dtype=float).ravel()
        t = np.asarray(time_s, dtype=float).ravel()
    except (TypeError, ValueError):
        raise InputError("fit_alpha_beta", "inputs", "message sizes and times must be "
                                                     "numbers") from None
    if n.shape != t.shape:
        raise InputError("fit_alpha_beta", f"{n.size} sizes, {t.size} times",
                         "need one time per message size")
    with np.errstate(all="ignore"):
        ok = (np.isfinite(n) & np.isfinite(t) & (n > 0) & (t > 0)
              & np.isfinite(n / np.where(t > 0, t, 1.0)))
    return n[ok], t[ok], int(n.size - ok.sum())


def _solve(n: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Robust fit of ``t = a + n·g`` (a ≥ 0, g > 0) on log residuals; returns (a, g)."""
    from scipy.optimize import least_squares

    t_ref = float(np.median(t))
    n_ref = float(np.median(n))
    g0 = float(np.median(t / n))
    # Scaled unknowns (both O(1)): a = x0 · t_ref, g = x1 · t_ref / n_ref.
    x0 = np.array([0.0, g0 * n_ref / t_ref])
    lo = np.array([0.0, 1e-12 * x0[1]])

    def res(x):
        pred = x[0] * t_ref + n * x[1] * t_ref / n_ref
        return np.log(pred / t)

    try:
        with np.errstate(all="ignore"):
            sol = least_squares(res, x0, bounds=(lo, np.inf), loss="soft_l1",
                                f_scale=SOFT_L1_SCALE, x_scale="jac", method="trf")
        x = sol.x if np.all(np.isfinite(sol.x)) else x0
    except (ValueError, FloatingPointError, np.linalg.LinAlgError):
        x = x0                              # the median-rate line through the origin
    return float(x[0] * t_ref), float(x[1] * t_ref / n_ref)


def _residuals(n, t, a, g) -> np.ndarray:
    return np.log((a + n * g) / t)


def _alpha_stderr(n, t, a, g) -> float | None:
    """Standard error of α (s) from the linearised fit: ``s² (JᵀJ)⁻¹`` with ``J`` the
    Jacobian of the log residuals and ``s²`` their variance (m − 2 degrees of freedom)."""
    if n.size < 3:
        return None
    pred = a + n * g
    jac = np.column_stack([1 / pred, n / pred])
    r = np.log(pred / t)
    s2 = float(r @ r) / (n.size - 2)
    try:
        cov = np.linalg.inv(jac.T @ jac) * s2
    except np.linalg.LinAlgError:
        return None
    v = float(cov[0, 0])
    return math.sqrt(v) if math.isfinite(v) and v >= 0 else None


def _consensus(n: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Mask of the largest set of points one α–β line explains within ``CONSENSUS_TOL``.

    Candidate lines: through every two anchor points of different sizes (α clamped at 0), and
    through the origin and every anchor; the winner explains the most points within the
    tolerance, ties broken by the smaller truncated squared residual (MSAC: Torr & Zisserman,
    CVIU 2000). Anchors are all points, or for more than ``MAX_ANCHORS`` points that many
    spread evenly over the points sorted by size; exhaustive over them, so deterministic."""
    order = np.lexsort((t, n))
    if n.size > MAX_ANCHORS:
        order = order[np.linspace(0, n.size - 1, MAX_ANCHORS).round().astype(int)]
    an, at = n[order], t[order]
    i, j = np.triu_indices(an.size, k=1)
    dn = an[j] - an[i]
    ok = dn != 0
    i, j, dn = i[ok], j[ok], dn[ok]
    g = (at[j] - at[i]) / dn
    ok = g > 0
    g_pair = g[ok]
    a_pair = np.maximum(at[i][ok] - an[i][ok] * g_pair, 0.0)
    cand_a = np.concatenate([np.zeros(an.size), a_pair])
    cand_g = np.concatenate([at / an, g_pair])
    logt = np.log(t)
    best_key, best = None, None
    step = max(1, 4_000_000 // max(n.size, 1))
    for k in range(0, cand_a.size, step):
        ca, cg = cand_a[k:k + step, None], cand_g[k:k + step, None]
        r = np.abs(np.log(ca + cg * n[None, :]) - logt[None, :])
        inl = r <= CONSENSUS_TOL
        count = inl.sum(axis=1)
        cost = (np.minimum(r, CONSENSUS_TOL) ** 2).sum(axis=1)
        # most inliers first, then the smaller cost; lexsort sorts by its last key first
        idx = np.lexsort((cost, -count))[0]
        key = (int(count[idx]), -float(cost[idx]))
        if best_key is None or key > best_key:
            best_key, best = key, inl[idx].copy()
    return best


def fit_alpha_beta(message_bytes: Sequence[float] | np.ndarray,
                   time_s: Sequence[float] | np.ndarray, *, bus_factor: float = 1.0) -> LinkFit:
    """Robust α–β fit of one message sweep (method and edge cases: module docstring).

    Args: ``message_bytes`` shape (m,), bytes; ``time_s`` shape (m,), seconds per operation
    (repeated sizes allowed: e.g. nccl-tests out-of-place and in-place rows); ``bus_factor``
    busbw / algbw of the test (:func:`bus_factor`).
    Returns a :class:`LinkFit` (β as bus bandwidth, bytes/s; α seconds).
    Raises :class:`InputError` for inputs of different lengths, no point with a positive
    finite size and time, or a ``bus_factor`` that is not a positive finite number.
    """
    try:
        factor = float(bus_factor)
    except (TypeError, ValueError):
        factor = math.nan
    if isinstance(bus_factor, bool) or not (math.isfinite(factor) and factor > 0):
        raise InputError("bus_factor", bus_factor, "must be a positive finite number")
    n, t, skipped = _clean(message_bytes, time_s)
    notes = []
    if skipped:
        notes.append(f"skipped {skipped} point(s) with a non-positive or non-finite size or "
                     "time")
    if n.size == 0:
        raise InputError("fit_alpha_beta", "no points",
                         "needs at least one positive message size with a positive time")
    sizes = np.unique(n)
    if sizes.size == 1:
        notes.append(f"one message size only ({int(sizes[0])} B): bandwidth from it, latency "
                     "not identifiable")
        t_mid = float(np.median(t))
        beta = float(sizes[0]) / t_mid * factor
        r = np.log(t_mid / t)
        return LinkFit(latency_s=None, bandwidth_Bps=beta, samples=int(n.size), outliers=0,
                       rel_rmse=float(np.sqrt(np.mean(np.expm1(r) ** 2))), sizes=1,
                       max_message_bytes=int(sizes[0]), bus_factor=factor,
                       notes=tuple(notes))

    keep = _consensus(n, t)
    if np.unique(n[keep]).size < 2:
        keep = np.ones(n.size, dtype=bool)
    a, g = _solve(n[keep], t[keep])
    for _ in range(MAX_ROUNDS):
        r = _residuals(n, t, a, g)
        center = float(np.median(r[keep]))
        sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(r[keep] - center))), SIGMA_FLOOR)
        new = np.abs(r - center) <= OUTLIER_K * sigma
        if np.unique(n[new]).size < 2 or np.array_equal(new, keep):
            break
        keep = new
        a, g = _solve(n[keep], t[keep])

    nk, tk = n[keep], t[keep]
    r = _residuals(nk, tk, a, g)
    rel_rmse = float(np.sqrt(np.mean(np.expm1(r) ** 2)))
    n_max = float(nk.max())
    latency_bound = not (g > 0 and math.isfinite(1 / g)) or n_max * g < LATENCY_BOUND_SHARE * a
    if latency_bound:
        beta_alg = float((nk / tk).max())
        notes.append(f"latency-bound sweep (up to {int(n_max)} B): bandwidth not identifiable, "
                     "reported as the largest observed rate (a lower bound)")
    else:
        beta_alg = 1.0 / g
    out_sizes = tuple(sorted({int(x) for x in n[~keep]}))
    a_err = _alpha_stderr(nk, tk, a, g)
    return LinkFit(latency_s=a, bandwidth_Bps=beta_alg * factor, samples=int(keep.sum()),
                   outliers=int((~keep).sum()), rel_rmse=rel_rmse,
                   sizes=int(np.unique(nk).size), max_message_bytes=int(n_max),
                   outlier_bytes=out_sizes, bus_factor=factor, latency_bound=latency_bound,
                   latency_stderr_s=a_err, notes=tuple(notes))
