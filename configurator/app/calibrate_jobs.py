"""``configurator calibrate``: fit a GPU's efficiencies (and the cluster's link efficiencies)
to measured runs; and the fit of the presets' in-training factors on the published runs
(:func:`fit_factors`, what ``configurator validate --by-source`` runs with each source left
out).

Runs are grouped by GPU type and plan precision; each group gets its own fit of a few
:data:`topology.calibration.FIT_PARAMETERS` (default :func:`default_parameters`: the
precision's GEMM efficiency, the fused-attention efficiency, the host time per operation and
the intra- and inter-node link efficiencies; the attained HBM fraction of the memory-bound
kernels only as in 3. below: :data:`RESCUE_PARAMETERS`), each within its physically plausible
range
(:data:`topology.calibration.PARAMETER_RANGES`: no efficiency above 1).

The fit: bounded nonlinear least squares (:func:`scipy.optimize.least_squares`) on the log
ratio of predicted to measured iteration time, every parameter mapped to ``u`` in [0, 1] over
the log of its range, started from the preset values and from :data:`EXTRA_STARTS` more
points (multi-start: the best end point is kept, and an end point almost as good elsewhere
widens the interval). The runs are priced in closed form
(:func:`configurator.cost.iteration.iteration_time`, every batch of runs that share a model
and cluster in one call) times each run's ratio of the exact schedule to the closed form,
taken at the start and again at the solution before a last polish; the figures reported are
the exact ones (:func:`configurator.search.evaluate.evaluate_plan`).

Identifiability is judged over each parameter's whole range, not a local step:

0. runs that the presets already predict as well as a measured time repeats (a χ² test of
   their residuals against :data:`NOISE_LOG`, :func:`presets_within_noise`) keep every
   preset, since a fit could only fit the noise (without explicit ``params``);
1. a parameter whose whole range moves no run's predicted time by :data:`MIN_RANGE_EFFECT`
   (log) or more is not determined by the runs;
2. the others are added one at a time, those the runs' times move most across their ranges
   first (forward selection), each fitted with those kept before. One is kept if the runs
   leave a degree of freedom for the noise (at most ``runs - 1`` parameters), tell its effect
   apart from the others' (the column-normalised Jacobian's condition number at the solution
   at most :data:`MAX_CONDITION`), pin it and the others to part of their ranges (no
   interval spans more than :data:`MAX_INTERVAL_SHARE` of its range, no value the runs
   push past a bound of it, :meth:`_Fitter.pushed_past_bound`) and, without explicit
   ``params``, predict the
   runs left out better than without it (the leave-one-out error below). The runs may
   bound a parameter without pinning it: fitted alone, every value from one end of its range
   to some value fits them alike, and its preset lies beyond (:func:`_profile_region`; a host
   faster than the preset's, below which every run left is GPU-bound). It is then set to the
   span's end nearest the preset, the least change the runs ask for, with the span as its
   interval, where that predicts the runs better than before and no parameter was refused
   for being pushed past a bound (its unexplained time would be taken) (runs made at 10 us per
   host operation and NVLink 0.9, ``calibrate_synthetic`` draw 0: every preset kept, 20 % too
   slow on the grid; 11 us now, 2.5 %). Without explicit
   ``params`` a parameter whose fit rests on one run (that run carries more than
   :data:`MAX_ONE_RUN_SHARE` of what the runs say about it) is not fitted, and neither is that
   run: the group is fitted again without it, and a note names it. Where the parameter then
   rests on another run alone, two runs carry it, each once the other is out: a cause they
   share, not one run's residual, so it is fitted on every run after all, with a note
   (runs of small GPTs on one DGX A100 made at a host time other than the preset's: the one
   host-bound run of a draw carries most of it, a second one the rest; leaving out both in
   turn kept every preset, ``bench/accuracy/calibrate_synthetic.py`` draw 4).
3. a parameter whose fit alone sits at a bound of its range is tried again with each next
   one that does too, and then (without ``params``) with each of :data:`RESCUE_PARAMETERS`,
   the two fitted together: two mechanisms the runs need together, each alone pushed out of
   its range to stand in for the other. The pair is kept if both land inside their ranges,
   separably, pinned, on more than one run each, and (without ``params``) predict the runs
   left out better. Megatron-LM without Transformer Engine or Apex on one H200
   (``bench/accuracy/trial_gpu.py``: eager element-wise kernels and the host time of mbs-1
   plans): alone, the GEMM efficiency sits at 0.38 and the host time at 60 µs, their
   bounds; the host time with the HBM fraction fits 54 µs and 0.42, and the plans left
   out come within 3 %. Where no pair holds, a rescue parameter is tried alone beside the
   parameters kept, in the pushed one's stead, under the same tests: on that machine's
   runs the trial now chooses (an mbs-1 selective plan among them) the host time alone fits
   57.5 µs inside its range while the GEMM efficiency is pushed below its own, so no pair
   forms; with the HBM fraction beside it the plans left out go from 27.5 % to 1.3 %.
4. (without ``params``) runs that a link efficiency pushed below its range moves by
   :data:`MIN_RANGE_EFFECT` or more are priced on the wrong links, which no other parameter
   may absorb: GPUs that talk over PCIe beyond NVLink-bridged pairs, priced as NVLink (a
   host time fitted with those runs came out 27.6-34.6 us where they were made with 26,
   ``bench/accuracy/calibrate_synthetic.py --truth-topology``). The group is fitted again
   without them, a note naming them and ``--topology`` (:data:`SLOWER_THAN_LINKS`). Where
   every run is such (five of Korthikanti et al.'s Table 5, tp 8 on DGX A100s' nominal
   NVLink, all ask for it), the links cannot be told from what they may stand in for: the
   fit stands, with a warning. So it does where the parameters fitted predict those runs
   within the noise (:func:`within_noise`): the link efficiency, fitted alone, went below its
   range in their stead (runs made at 45 us per host operation and NVLink 0.5, inside its
   range: NVLink alone asked for less than 0.3, and leaving its runs out left the host time
   on one run, so every preset was kept, 26 % too fast; ``calibrate_synthetic --host-op-us
   45 --intra-node-efficiency 0.5``, draw 3).

Each refusal names the kind of run that would determine the parameter
(:data:`DETERMINING_RUN`). Without ``params`` undetermined parameters stay at their preset
values and are named in the group's notes; with ``params`` they are an error.

Intervals: 95 % (±1.96 σ) from the Jacobian's covariance ``s² (JᵀJ)⁻¹`` in log space, ``s²``
the residual variance ``Σr² / (runs - parameters)`` floored at :data:`NOISE_LOG` ² (the
repeatability of a measured iteration time), joined with any other start's end point whose
cost is within :data:`NEAR_OPTIMAL` of the best, clipped to the range.

Leave-one-out error: each run's residual with itself left out, by the hat-matrix formula of
least squares ``e_i / (1 - h_ii)`` at the fitted point (exact for a linear model, first
order here); the first parameter must beat the preset values' error, each next one the
error of those kept before it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from configurator.app.validate_jobs import priced_run
from configurator.core.plan_batch import PlanBatch
from configurator.core.errors import InputError
from configurator.core.runs import MeasuredRun
from configurator.cost.communication import comm_figures, expert_comm_figures
from configurator.cost.iteration import iteration_time
from configurator.cost.measured import measured_iteration_time_s
from configurator.search.evaluate import evaluate_plan
from topology.calibration import (FIT_PARAMETERS, LINK_PARAMETERS, PARAMETER_RANGES,
                                  Calibration, gemm_parameter, parameter_value,
                                  with_link_parameters, with_parameters)

#: Smallest change of a run's log predicted time across a parameter's whole range
#: (:data:`topology.calibration.PARAMETER_RANGES`) for the runs to determine it: twice
#: :data:`NOISE_LOG`.
MIN_RANGE_EFFECT = 0.04
#: Repeatability of a measured iteration time (log): the floor of the residual noise the
#: intervals are scaled by (iteration times of a steady Megatron run vary by 1-2 %).
NOISE_LOG = 0.02
#: Confidence of the tests against :data:`NOISE_LOG` (:func:`within_noise`): whether the
#: presets already predict the runs as well as a measurement repeats
#: (:func:`presets_within_noise`) and whether repeats of one plan agree as closely
#: (:func:`replicate_note`).
NOISE_TEST_LEVEL = 0.95
#: Largest condition number of the (column-normalised) Jacobian of a fit.
MAX_CONDITION = 30.0
#: A parameter whose interval spans more than this share of its (log) range is not
#: determined.
MAX_INTERVAL_SHARE = 0.8
#: A value fitted within this share of its (log) range of either bound may not be determined
#: by the runs: they may ask for one outside its plausible range, where it would absorb what
#: the model misses (an NVLink efficiency of 0.3 standing in for unpriced time), or leave it
#: on a flat direction the solver stopped at. :func:`fit_group` refuses such a parameter
#: where the runs fit no worse past the bound (:meth:`_Fitter.pushed_past_bound`) and keeps
#: one whose optimum lies inside the range; :func:`fit_factors` keeps such a factor at 1.
BOUND_MARGIN_SHARE = 0.01
#: Largest share of what the runs say about a fitted parameter that one run may carry (its
#: squared sensitivity at the solution, ``J_ik² / Σ_i J_ik²``, the leverage of that run for
#: that parameter alone). Above it the value is that one run's residual refitted (a result
#: fitted per row): whatever the model misses in the run is read as the parameter, and the
#: first-order leave-one-out below cannot see it (the run's residual at the fit is near 0 and
#: the runs without it do not determine the parameter). GB200 FP8, calibrated on every other
#: published run: one Qwen3-30B-A3B run 19 % slower than predicted put 98 % of the host time's
#: weight on itself and fitted 27.7 µs per operation, against 8.8 µs preset, which took a
#: Qwen3-235B-A22B run left out from −20 % to +99 % (bench/accuracy/calibrate_halves.py).
#: :func:`fit_group` then fits the group without that run, so that no other parameter absorbs
#: its residual instead (two GB200 FP8 MoE runs, the host time refused, fitted an FP8 GEMM
#: efficiency of 0.33 that put the group's other runs at 35 %: bench/accuracy/calibrate_pairs.py).
MAX_ONE_RUN_SHARE = 0.9
#: Points over a parameter's range at which :func:`_profile_region` prices the runs.
PROFILE_POINTS = 21
#: Starts besides the presets, in ``u`` (every parameter at the same point of its range).
EXTRA_STARTS = (0.2, 0.8)
#: An end point whose cost is within this factor of the best one's counts as a solution too.
NEAR_OPTIMAL = 1.05
#: Function evaluations of the least squares from the presets, and from each other start.
MAX_NFEV = 10
MAX_NFEV_EXTRA = 4
#: Step in ``u`` of the forward-difference Jacobian.
U_STEP = 0.02

#: The kind of run that determines each parameter (named when the runs do not).
DETERMINING_RUN = {
    "gemm": "add a large-hidden run at mbs 2 or more with tp inside a node (GEMM-bound)",
    "gemm_fp8": "add a large-hidden FP8 run at mbs 2 or more with tp inside a node "
                "(GEMM-bound)",
    "gemm_mxfp8": "add a large-hidden MXFP8 run at mbs 2 or more with tp inside a node "
                  "(GEMM-bound)",
    "flash_attention": "add a long-sequence run (seq_length 8192 or more; attention-bound)",
    "hbm": "add a small-hidden, long-sequence run (memory-bound element-wise kernels)",
    "host_op_us": "add a small-model, mbs 1, high-tp run (host-bound)",
    "intra_node_efficiency": "add a run with tp 8 (or ep) inside a node and a small "
                             "hidden size (NVLink-bound)",
    "inter_node_efficiency": "add a run with dp or pp across nodes (network-bound)",
}


def default_parameters(precision: str) -> tuple[str, ...]:
    """What ``calibrate`` fits without ``params`` (each only where the runs determine it):
    the precision's GEMM efficiency, the fused-attention efficiency, the host time per
    operation and the intra- and inter-node link efficiencies."""
    return (gemm_parameter(precision), "flash_attention", "host_op_us") + LINK_PARAMETERS


def fittable(name: str, gpu, nominal_links: bool = True) -> bool:
    """Whether parameter ``name`` can be fitted for ``gpu``: the host time always, a link
    efficiency on nominal links (a measured topology already carries the links' own
    figures: ``nominal_links`` False), an efficiency the GPU has a figure for."""
    if name in LINK_PARAMETERS:
        return nominal_links
    return name == "host_op_us" or getattr(gpu.efficiency, name) is not None


#: Parameters ``calibrate`` fits without ``params`` only together with a default one that
#: sits at a bound of its range alone (see the module docstring, 3.). The attained HBM
#: fraction of the memory-bound kernels is a kernel measurement (STREAM-like copies; fused
#: Transformer Engine and Apex kernels), not something a handful of end-to-end runs on that
#: software refine: fitted among the defaults, five runs of Korthikanti et al.'s Table 5 (A100,
#: Megatron's fused kernels) took it to 0.38 beside the GEMM efficiency and the rest of the
#: table to 13.9 % (bench/accuracy/calibrate_five.py; 7.4 % without). Where a default
#: parameter alone is pushed out of its range, a slower element-wise path (eager kernels:
#: megatron-core's local layers without Transformer Engine or Apex) is the mechanism the
#: runs may be asking for instead.
RESCUE_PARAMETERS = ("hbm",)


@dataclass(frozen=True, kw_only=True)
class GroupFit:
    """One GPU type and precision: the runs, the fitted values and their intervals
    (``[low, high]``), the values before, MAPE (fractions) before and after, the
    leave-one-out MAPE, and notes (parameters left out and why). ``presets_confirmed``: the
    runs determine a parameter, but its fit predicts the runs left out no better than the
    preset values or rests on one run (:data:`MAX_ONE_RUN_SHARE`), so the presets stay."""

    gpu: str
    precision: str
    runs: int
    parameters: dict
    before: dict
    mape_before: float
    mape_after: float
    loo_mape: float | None
    intervals: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    presets_confirmed: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True, kw_only=True)
class _Prepared:
    run: MeasuredRun
    model: object
    cluster: object
    measured_s: float
    #: ``(name, measured seconds)`` of each run this observation stands for where several
    #: runs price the same plan (:func:`prepared_runs`); empty for a single run
    replicates: tuple = ()


def _job_key(p: _Prepared) -> tuple:
    """What two prepared runs must share to be priced as one job: the model (at its
    sequence length) and the cluster with its nodes, GPUs per node and NVLink domain (a
    run on part of one node has a host of its own GPU count,
    :func:`configurator.app.validate_jobs.run_cluster`) and its hosts and GPU order (on a
    topology, the run's own: their links differ)."""
    c = p.cluster
    return (repr(p.model), c.name, c.num_nodes, c.gpus_per_node, c.nvlink_domain_gpus,
            c.num_gpus, repr(c.spec), tuple(c.hosts), p.run.gpu_order)


def replicate_note(p: _Prepared) -> str:
    """What a merged observation (:attr:`_Prepared.replicates`) stands for: its runs, the
    time it takes and how far apart theirs are, and whether farther than a measured time
    repeats (:func:`within_noise` of their log deviations from their mean, one degree of
    freedom fewer than runs: two runs more than 5.7 % apart)."""
    names = [n for n, _ in p.replicates]
    times = [t for _, t in p.replicates]
    who = (f"run {names[0]} appears {len(names)} times" if len(set(names)) == 1 else
           "runs " + ", ".join(names[:-1]) + " and " + names[-1])
    apart = ("" if within_noise(np.log(times) - math.log(p.measured_s), len(times) - 1) else
             f", more than a measured time repeats ({100 * NOISE_LOG:g} %, χ² at "
             f"{100 * NOISE_TEST_LEVEL:g} %): a straggler, a setting that changed or a noisy "
             f"cluster, which their mean carries into the fit")
    return (f"{who} with the same plan: one observation at {p.measured_s:.4g} s, the "
            f"geometric mean of their times, which differ by "
            f"{100 * (max(times) / min(times) - 1):.1f} %{apart}; repeating a plan tells "
            f"its noise, not a parameter")


def _predict(p: _Prepared, gpu) -> float:
    return evaluate_plan(p.model, p.cluster.with_gpu(gpu), p.run.plan,
                         measured=True).iteration_time_s


class _Pricer:
    """Prices one group's runs at parameter values: exactly (:meth:`exact`) or in closed form
    times each run's exact-to-closed ratio (:meth:`fast`), the runs that share a model,
    cluster and shared plan fields in one vectorised call."""

    def __init__(self, prepared: list[_Prepared], base_gpu, source: str):
        self.prepared = prepared
        self.base_gpu = base_gpu
        self.source = source
        self.measured = np.array([p.measured_s for p in prepared])
        batches: dict = {}
        for i, p in enumerate(prepared):
            cand = PlanBatch.from_plan(p.run.plan)
            key = _job_key(p) + (repr(sorted(cand.shared.items())),)
            batches.setdefault(key, []).append(i)
        self.batches = [(prepared[ix[0]].model, prepared[ix[0]].cluster, np.array(ix),
                         PlanBatch.from_plans([prepared[i].run.plan for i in ix]))
                        for ix in batches.values()]
        self.ratio = np.ones(len(prepared))
        self.passes = 0
        self._comm: dict = {}

    def _cluster(self, cluster, values):
        return with_link_parameters(cluster.with_gpu(
            with_parameters(self.base_gpu, values, self.source)), values)

    def closed(self, values: dict) -> np.ndarray:
        out = np.empty(len(self.prepared))
        links = tuple(values.get(n) for n in LINK_PARAMETERS)
        for b, (model, cluster, ix, cand) in enumerate(self.batches):
            cl = self._cluster(cluster, values)
            # the link figures do not depend on the GPU's efficiencies: one per link values
            comm = self._comm.get((b, links))
            if comm is None:
                comm = comm_figures(cl, cand) | expert_comm_figures(cl, cand)
                if len(self._comm) > 4096:
                    self._comm.clear()
                self._comm[(b, links)] = comm
            out[ix] = iteration_time(model, cl, cand, comm=comm)["iteration_time_s"]
        self.passes += 1
        return out

    def exact(self, values: dict) -> np.ndarray:
        return np.array([evaluate_plan(p.model, self._cluster(p.cluster, values), p.run.plan,
                                       measured=True).iteration_time_s
                         for p in self.prepared])

    def rebase(self, values: dict) -> np.ndarray:
        """Exact times at ``values``; the ratios of exact to closed form taken there."""
        t = self.exact(values)
        self.ratio = t / self.closed(values)
        return t

    def fast(self, values: dict) -> np.ndarray:
        return self.closed(values) * self.ratio


def _log_range(name: str) -> tuple[float, float]:
    lo, hi, _ = PARAMETER_RANGES[name]
    return math.log(lo), math.log(hi)


def _values(names, u, fixed, clip: bool = True) -> dict:
    out = dict(fixed)
    for n, x in zip(names, u):
        lo, hi = _log_range(n)
        out[n] = math.exp(lo + float(np.clip(x, 0.0, 1.0) if clip else x) * (hi - lo))
    return out


def _to_u(name: str, value: float) -> float:
    lo, hi = _log_range(name)
    return float(np.clip((math.log(value) - lo) / (hi - lo), 0.0, 1.0))


def _bound_side(u: float) -> str | None:
    """``"lower"`` or ``"upper"`` where a value at ``u`` of its (log) range sits at that
    bound (within :data:`BOUND_MARGIN_SHARE`), else None."""
    if u <= BOUND_MARGIN_SHARE:
        return "lower"
    return "upper" if u >= 1.0 - BOUND_MARGIN_SHARE else None


def _range_name(n: str) -> str:
    lo, hi, _ = PARAMETER_RANGES[n]
    return f"{lo:g}-{hi:g} us" if n == "host_op_us" else f"{lo:g}-{hi:g}"


class _Fitter:
    """The bounded multi-start least squares of one group over ``names`` (others at
    ``fixed``)."""

    def __init__(self, pricer: _Pricer, fixed: dict):
        self.pricer = pricer
        self.fixed = fixed
        self.log_measured = np.log(pricer.measured)

    def resid(self, names, u) -> np.ndarray:
        return np.log(self.pricer.fast(_values(names, u, self.fixed))) - self.log_measured

    def jac(self, names, u, r0=None) -> np.ndarray:
        """d r / d u by forward differences (towards the interior at the upper bound)."""
        r0 = self.resid(names, u) if r0 is None else r0
        cols = []
        for j in range(len(names)):
            x = np.array(u, dtype=float)
            h = U_STEP if x[j] + U_STEP <= 1.0 else -U_STEP
            x[j] += h
            cols.append((self.resid(names, x) - r0) / h)
        return np.stack(cols, axis=1)

    def solve(self, names, u0, max_nfev=MAX_NFEV):
        from scipy.optimize import least_squares

        u0 = np.clip(np.asarray(u0, dtype=float), 1e-6, 1 - 1e-6)
        sol = least_squares(lambda u: self.resid(names, u), u0,
                            jac=lambda u: self.jac(names, u), bounds=(0.0, 1.0),
                            x_scale=1.0, max_nfev=max_nfev, xtol=1e-2, ftol=1e-3)
        return np.clip(sol.x, 0.0, 1.0), float(sol.fun @ sol.fun)

    def pushed_past_bound(self, names, u) -> list[str]:
        """The parameters of a fit at ``u`` that sit at a bound of their range (within
        :data:`BOUND_MARGIN_SHARE`) because the runs ask for a value beyond it: moved
        ``2·BOUND_MARGIN_SHARE`` of the range past that bound, the others held, the runs'
        sum of squared log residuals does not rise by :data:`NOISE_LOG` ² (one run's noise).
        A value within the margin at an optimum inside the range (the sum rises past the
        bound) is not pushed and stays. An efficiency is never tried above 1: at that bound
        it is always pushed."""
        cost = float(np.sum(self.resid(names, u) ** 2))
        out = []
        for j, n in enumerate(names):
            side = _bound_side(u[j])
            if side is None:
                continue
            beyond = -2 * BOUND_MARGIN_SHARE if side == "lower" else 1 + 2 * BOUND_MARGIN_SHARE
            if n != "host_op_us" and _values([n], [beyond], {}, clip=False)[n] > 1.0:
                out.append(n)
                continue
            x = np.array(u, dtype=float)
            x[j] = beyond
            r = np.log(self.pricer.fast(_values(names, x, self.fixed, clip=False)))
            if float(np.sum((r - self.log_measured) ** 2)) < cost + NOISE_LOG ** 2:
                out.append(n)
        return out

    def multistart(self, names, before):
        """``(best u, [every end point within NEAR_OPTIMAL of the best])``."""
        starts = [np.array([_to_u(n, before[n]) for n in names])]
        starts += [np.full(len(names), s) for s in EXTRA_STARTS]
        ends = [self.solve(names, s, MAX_NFEV if i == 0 else MAX_NFEV_EXTRA)
                for i, s in enumerate(starts)]
        best = min(ends, key=lambda e: e[1])
        near = [u for u, c in ends if c <= best[1] * NEAR_OPTIMAL + 1e-12]
        return best[0], near


def _intervals(names, u, near, r, J) -> tuple[dict, dict]:
    """``(interval in u per name, interval share of the range per name)``: ±1.96 σ from
    ``s² (JᵀJ)⁻¹``, joined with the other near-optimal end points, clipped to [0, 1]."""
    n, k = J.shape
    s2 = max(float(r @ r) / max(n - k, 1), NOISE_LOG ** 2)
    cov = s2 * np.linalg.pinv(J.T @ J)
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    out, share = {}, {}
    for j, name in enumerate(names):
        lo = min([u[j] - 1.96 * sd[j]] + [e[j] for e in near])
        hi = max([u[j] + 1.96 * sd[j]] + [e[j] for e in near])
        lo, hi = max(lo, 0.0), min(hi, 1.0)
        out[name] = (lo, hi)
        share[name] = hi - lo
    return out, share


def _profile_region(fitter: "_Fitter", names, u, j: int) -> tuple[float, float]:
    """``(lowest, highest)`` ``u`` of parameter ``names[j]`` at which the runs fit as well as
    at the best within the noise, the others held at ``u``: of :data:`PROFILE_POINTS` points
    evenly over its range and ``u[j]`` itself, those whose sum of squared log residuals
    exceeds the least by at most the :data:`NOISE_TEST_LEVEL` quantile of χ² with one degree
    of freedom times :data:`NOISE_LOG` ² (a profile-likelihood interval). Where the runs only
    bound a parameter (a host time below which every run is GPU-bound), it reaches the
    range's end on that side."""
    from scipy.stats import chi2

    points = np.unique(np.append(np.linspace(0.0, 1.0, PROFILE_POINTS), u[j]))
    costs = []
    for x in points:
        v = np.array(u, dtype=float)
        v[j] = x
        r = fitter.resid(names, v)
        costs.append(float(r @ r))
    costs = np.array(costs)
    ok = points[costs <= costs.min() + float(chi2.ppf(NOISE_TEST_LEVEL, 1)) * NOISE_LOG ** 2]
    return float(ok.min()), float(ok.max())


def _mape(r) -> float:
    """Mean absolute percentage error (a fraction) of runs whose log residuals (log
    predicted over measured time) are ``r``."""
    return float(np.mean(np.abs(np.exp(r) - 1)))


def _loo(J, r) -> float | None:
    """Leave-one-out MAPE by the hat matrix ``r_i / (1 - h_ii)`` (None if singular)."""
    try:
        H = J @ np.linalg.pinv(J.T @ J) @ J.T
    except np.linalg.LinAlgError:
        return None
    h = np.clip(np.diag(H), 0.0, 0.999)
    return _mape(r / (1 - h))


def _one_run_parameters(names: list[str], J) -> list[tuple[str, int, float]]:
    """``(parameter, run index, share)`` for each of ``names`` (the columns of ``J``, runs ×
    parameters) one run of which carries more than :data:`MAX_ONE_RUN_SHARE` of the squared
    sensitivity."""
    out = []
    for k, name in enumerate(names):
        w = np.asarray(J)[:, k] ** 2
        total = float(w.sum())
        if total > 0 and float(w.max()) / total > MAX_ONE_RUN_SHARE:
            i = int(np.argmax(w))
            out.append((name, i, float(w[i]) / total))
    return out


def _condition(J) -> float:
    norms = np.linalg.norm(J, axis=0)
    if np.any(norms == 0):
        return math.inf
    sv = np.linalg.svd(J / norms, compute_uv=False)
    return math.inf if sv[-1] <= 0 else float(sv[0] / sv[-1])


def within_noise(r, dof: int) -> bool:
    """Whether the log deviations ``r`` (times less what they should be) are what measuring
    again would leave: ``Σ r² / NOISE_LOG²`` at most the :data:`NOISE_TEST_LEVEL` quantile
    of χ² with ``dof`` degrees of freedom (independent normal errors of standard deviation
    :data:`NOISE_LOG`)."""
    from scipy.stats import chi2

    r = np.asarray(r, dtype=float)
    return float(r @ r) / NOISE_LOG ** 2 <= float(chi2.ppf(NOISE_TEST_LEVEL, dof))


def presets_within_noise(r) -> bool:
    """Whether the log residuals ``r`` of the runs at the presets are what measuring again
    would leave (:func:`within_noise`, one degree of freedom per run). Then a fit has only
    the noise to fit, and a
    parameter fitted to it moves every other run by what it absorbed: two NeMo B200 FP8
    runs predicted 1.3 and 4.0 % too fast at the presets fitted an FP8 GEMM efficiency of
    0.52 (0.55 preset) that took the three runs of their group left out from 4.7 to 5.5 %
    MAPE (with Blackwell's BF16 GEMMs at OpenXLA's figure the first is +0.2 %; its Llama-3 8B
    sibling, −2.6 %, and the second fit 0.51), and a weak lever on them lets a parameter
    travel far (fitted alone on those runs, the inter-node efficiency goes to 0.39 and puts
    a Mixtral run left out at +73 %;
    ``bench/accuracy/calibrate_pairs.py``, draw 6)."""
    return within_noise(r, len(r))


#: Runs :func:`presets_errors_note` names, the largest errors first.
ERRORS_NAMED = 6


def presets_errors_note(prepared: list[_Prepared], r) -> str:
    """A group's note where nothing was fitted: each run's error at the presets (predicted
    over measured time less 1, from the log residuals ``r``; the :data:`ERRORS_NAMED`
    largest), and where the runs are off beyond :data:`NOISE_LOG` both ways, that no one
    efficiency can close both: raising one shortens every run's predicted time, lowering it
    lengthens every one (what such runs ask for is a mechanism the model misses in some of
    them, or links other than the cluster's)."""
    r = np.asarray(r, dtype=float)
    order = np.argsort(-np.abs(r), kind="stable")
    shown = ", ".join(f"{prepared[i].run.name} {100 * math.expm1(r[i]):+.1f} %"
                      for i in order[:ERRORS_NAMED])
    more = f" and {len(r) - ERRORS_NAMED} more" if len(r) > ERRORS_NAMED else ""
    both = ("; some too slow and some too fast: one efficiency moves every run's time the "
            "same way, so none closes both"
            if r.max() > NOISE_LOG and r.min() < -NOISE_LOG else "")
    return (f"at the presets the predicted times are off by {shown}{more} (negative: faster "
            f"than measured){both}")


#: What to do when the runs ask for a link efficiency below its range
#: (:data:`topology.calibration.PARAMETER_RANGES`): the links are not the cluster's nominal
#: ones, and no run of the kind :data:`DETERMINING_RUN` names can fit them. A server whose
#: GPUs beyond NVLink-bridged pairs talk over PCIe (``nvidia-smi topo -m``: NV# within a
#: pair, NODE/SYS elsewhere) moves a ring's bytes at PCIe's 32 GB/s, a tenth of NVLink 3's
#: 300 GB/s per GPU; priced as NVLink, its tp 4 and 8 plans come out about twice too fast
#: (bench/accuracy/calibrate_synthetic.py ``--truth-topology``; the module docstring, 4.).
SLOWER_THAN_LINKS = {
    "intra_node_efficiency": (
        "the runs' transfers inside a node are slower than its NVLink attains: if the GPUs "
        "talk over PCIe beyond NVLink pairs (nvidia-smi topo -m), describe the node "
        "(configurator topology import of that output or of nccl-tests logs) and calibrate "
        "with --topology FILE"),
    "inter_node_efficiency": (
        "the runs' transfers between nodes are slower than the network attains: measure "
        "the links (nccl-tests logs through configurator topology import, or configurator "
        "probe) and calibrate with --topology FILE"),
}


def _refusal(name: str, why: str, side: str | None = None) -> str:
    """A refused parameter's note: why, then what would determine it (for a link efficiency
    the runs push below its range, :data:`SLOWER_THAN_LINKS`)."""
    advice = (SLOWER_THAN_LINKS[name] if side == "lower" and name in SLOWER_THAN_LINKS
              else DETERMINING_RUN.get(name, "add runs that depend on it"))
    return f"{name}: {why}; {advice}"


class _CarriedAgain(Exception):
    """A parameter rests on one run again once the run it rested on is left out: two runs
    carry it (:func:`fit_group`)."""

    def __init__(self, parameter: str):
        super().__init__(parameter)
        self.parameter = parameter


def fit_group(prepared: list[_Prepared], base_gpu, precision: str,
              params: tuple[str, ...] | None, source: str, *,
              _left_for: tuple[str, ...] = (), _shared: tuple[str, ...] = ()) -> GroupFit:
    """Fit one group (see the module docstring). Raises :class:`InputError` when the runs
    cannot determine an explicitly requested parameter (naming the kind of run that
    would). ``_left_for``: the parameters a run was left out for, on the way here (the one-run
    rule); ``_shared``: those found to rest on a second run once the first was left out, which
    two runs carry, so the rule no longer applies to them."""
    explicit = params is not None
    names = list(params or default_parameters(precision))
    for n in names:
        if n not in FIT_PARAMETERS:
            raise InputError("params", n, "unknown; fit one of " + ", ".join(FIT_PARAMETERS))
    nominal = all(p.cluster._measured is None for p in prepared)
    names = [n for n in names if fittable(n, base_gpu, nominal)]
    rescue = [] if explicit else [n for n in RESCUE_PARAMETERS
                                  if n not in names and fittable(n, base_gpu, nominal)]
    before = {n: parameter_value(base_gpu, n, prepared[0].cluster) for n in names}
    rescue_before = {n: parameter_value(base_gpu, n, prepared[0].cluster) for n in rescue}
    pricer = _Pricer(prepared, base_gpu, source)
    t0 = pricer.rebase({})
    r0 = np.log(t0 / pricer.measured)
    mape_before = _mape(r0)
    notes: list[str] = [replicate_note(p) for p in prepared if p.replicates]
    refused: list[str] = []
    below: list[str] = []   # link efficiencies the runs push below their range
    confirmed = False       # a parameter determined, but no better than its preset

    def unfitted() -> GroupFit:          # the preset values stay
        return GroupFit(gpu=base_gpu.name, precision=precision, runs=len(prepared),
                        parameters={}, before={k: round(float(v), 6) for k, v in before.items()},
                        mape_before=mape_before, mape_after=mape_before, loo_mape=None,
                        notes=notes, presets_confirmed=confirmed)

    # 1. the effect of each parameter's whole range on the runs' times
    effect, spread = {}, {}
    for n in names + rescue:
        lo, hi, _ = PARAMETER_RANGES[n]
        t_lo, t_hi = pricer.fast({n: lo}), pricer.fast({n: hi})
        spread[n] = np.abs(np.log(t_hi / t_lo))       # per run
        effect[n] = float(np.max(spread[n]))
    kept = []
    for n in names:
        if effect[n] < MIN_RANGE_EFFECT:
            refused.append(_refusal(n, f"the runs cannot determine it (its whole range "
                                       f"{_range_name(n)} moves no run's time by "
                                       f"{100 * MIN_RANGE_EFFECT:.0f} %)"))
        else:
            kept.append(n)
    if kept and not explicit and presets_within_noise(r0):
        confirmed = True
        notes += refused + [f"every preset kept: they predict these {len(prepared)} runs as "
                            f"well as a measured time repeats (MAPE {100 * mape_before:.1f} %, "
                            f"within the {100 * NOISE_LOG:g} % noise at "
                            f"{100 * NOISE_TEST_LEVEL:g} % confidence), so a fit would fit "
                            f"the noise"]
        return unfitted()
    # 2. forward selection, the parameters that move the runs most first: each one is kept
    # if the runs leave a degree of freedom for the noise, tell it apart from those kept,
    # pin it to part of its range and (without explicit parameters) predict the runs left
    # out better with it
    kept.sort(key=lambda n: -effect[n])
    limit = max(len(prepared) - 1, 0)
    fixed_before = {n: before[n] for n in names}
    selected: list[str] = []
    result = None
    loo_prev = mape_before
    at_bound_alone: dict[str, str] = {}   # refused at a bound when added alone: its refusal
    bounded: dict[str, tuple] = {}        # set to the edge of what the runs allow: (value, u)
    pushed: set[str] = set()              # refused where the runs push it past a bound
    # the exact-to-closed ratios of the last accepted fit (the presets' before any): each
    # attempt starts from them, not from where a refused attempt left the pricer
    accepted_ratio = pricer.ratio.copy()

    def attempt(trial: list[str]):
        pricer.ratio = accepted_ratio.copy()
        fitter = _Fitter(pricer, {k: v for k, v in fixed_before.items() if k not in trial})
        start = dict(before) | rescue_before | (
            {} if result is None else _values(result[0], result[1], {}))
        u, near = fitter.multistart(trial, start)
        pricer.rebase(_values(trial, u, fitter.fixed))
        u, _ = fitter.solve(trial, u, max_nfev=4)
        r = fitter.resid(trial, u)
        J = fitter.jac(trial, u, r)
        iv, share = _intervals(trial, u, near, r, J)
        return fitter, u, r, J, iv, share

    def take_pair(n: str) -> bool:
        """Fit ``n`` together with each parameter refused at a bound alone, in turn; keep the
        first pair that pins both inside their ranges, separably, on more than one run each,
        and predicts the runs left out better (two mechanisms the runs need together, such as
        the host time of mbs-1 runs and slow element-wise kernels, each alone pushed out of
        its range to stand in for the other): whether one was kept."""
        for d in at_bound_alone:
            if take(selected + [d, n]):
                refused.remove(at_bound_alone.pop(d))
                return True
        return False

    def take(trial: list[str]) -> bool:
        """Fit ``trial`` and keep it if it pins every parameter inside its range, separably,
        on more than one run each, and predicts the runs left out better: whether it was
        kept."""
        nonlocal result, selected, loo_prev, accepted_ratio
        if len(trial) > limit:
            return False
        fitter, u, r, J, iv, share = attempt(trial)
        loo = _loo(J, r)
        if (_condition(J) <= MAX_CONDITION and max(share.values()) <= MAX_INTERVAL_SHARE
                and not fitter.pushed_past_bound(trial, u)
                and not [o for o in _one_run_parameters(trial, J) if o[0] not in _shared]
                and (explicit or (loo is not None and loo < loo_prev))):
            result = (trial, u, fitter, r, J, iv, loo)
            selected, loo_prev = trial, (loo if loo is not None else loo_prev)
            accepted_ratio = pricer.ratio.copy()
            before.update({k: rescue_before[k] for k in trial if k not in before})
            return True
        return False

    for n in kept:
        if len(selected) >= limit:
            refused.append(_refusal(n, f"left out: {len(prepared)} runs of {base_gpu.name} "
                                       f"{precision} determine at most {limit} parameters "
                                       f"and the others move the runs more"))
            continue
        trial = selected + [n]
        fitter, u, r, J, iv, share = attempt(trial)
        if len(trial) > 1 and _condition(J) > MAX_CONDITION:
            refused.append(_refusal(n, "not separable from " + ", ".join(selected)
                                       + " on these runs"))
            continue
        wide = [k for k in trial if share[k] > MAX_INTERVAL_SHARE]
        side = _bound_side(u[trial.index(n)])
        if trial == [n] and wide == [n] and side is None and not pushed:
            # fitted alone, the runs may only bound it: where its preset lies beyond what they
            # allow, it is set to the nearest value they allow (the least change they ask for);
            # not once a parameter was pushed past a bound, whose unexplained time it would take
            a, b = _profile_region(fitter, trial, u, 0)
            u0 = _to_u(n, before[n])
            if (a <= 0.0 or b >= 1.0) and not a <= u0 <= b:   # one side open, preset beyond
                edge = b if u0 > b else a
                fixed_try = dict(fixed_before, **{n: _values([n], [edge], {})[n]})
                # nothing is selected yet, so the presets with the edge are the whole fit
                mape_edge = _mape(np.log(pricer.fast(fixed_try) / pricer.measured))
                if explicit or mape_edge < loo_prev:
                    bounded[n] = (fixed_try[n], (a, b))
                    fixed_before[n] = fixed_try[n]      # held there by every later fit
                    loo_prev = mape_edge
                    continue
        if wide:
            bound = ("" if side is None else f" (the fit sits at its {side} bound: the runs "
                                             f"ask for a value outside its plausible range)")
            what = (f"the runs leave it anywhere in {100 * share[n]:.0f} % of its range "
                    f"{_range_name(n)}{bound}" if n in wide else
                    f"with it the runs leave {', '.join(wide)} unpinned")
            refused.append(_refusal(n, what, side if n in wide else None))
            if n in wide and side is not None:
                pushed.add(n)
            if n in wide and side == "lower" and n in SLOWER_THAN_LINKS:
                below.append(n)
            continue
        at_bound = fitter.pushed_past_bound(trial, u)
        if at_bound:
            if at_bound == [n] and take_pair(n):    # n and one refused before, together
                continue
            what = (f"the fit sits at its {side} bound of {_range_name(n)}: the runs ask for "
                    f"a value outside its plausible range, where it would absorb what the "
                    f"model misses" if at_bound == [n] else
                    f"with it the fit puts {', '.join(at_bound)} at a bound of its range")
            refused.append(_refusal(n, what, side if at_bound == [n] else None))
            pushed.update(at_bound)
            if at_bound == [n] and side == "lower" and n in SLOWER_THAN_LINKS:
                below.append(n)
            if at_bound == [n]:
                at_bound_alone[n] = refused[-1]
            continue
        one_run = [] if explicit else [o for o in _one_run_parameters(trial, J)
                                       if o[0] not in _shared]
        if one_run and one_run[0][0] in _left_for:
            # with the run it rested on left out, it rests on another: two runs carry it
            raise _CarriedAgain(one_run[0][0])
        if one_run:
            # the model misses something in that run which the others do not share: fit the
            # group again without it (the note names it), so that no other parameter
            # absorbs its residual either
            k, i, share_i = one_run[0]
            name = prepared[i].run.name
            note = (f"run {name} left out: a parameter's fit rests on it alone ({k}: "
                    f"{100 * share_i:.0f} % of what "
                    f"the runs say about it), so its error is not a parameter's to absorb; "
                    + DETERMINING_RUN.get(k, "add runs that depend on it"))
            rest = prepared[:i] + prepared[i + 1:]
            if not rest:
                return dataclasses.replace(unfitted(), notes=notes + refused + [note],
                                           presets_confirmed=True)
            try:
                fit = fit_group(rest, base_gpu, precision, params, source,
                                _left_for=_left_for + (k,), _shared=_shared)
            except _CarriedAgain as again:
                if again.parameter != k:
                    raise
                # each of two runs carries k once the other is out: a cause they share,
                # not one run's residual; fitted on every run, the rule set aside for k
                fit = fit_group(prepared, base_gpu, precision, params, source,
                                _left_for=_left_for, _shared=_shared + (k,))
                return dataclasses.replace(fit, notes=[
                    f"{k}: fitted although one run carries most of what the runs say about "
                    f"it ({name}, {100 * share_i:.0f} %): left out, another run alone carries "
                    f"it, so two runs ask for it"] + fit.notes)
            return dataclasses.replace(fit, notes=[note] + fit.notes,
                                       presets_confirmed=not fit.parameters)
        loo = _loo(J, r)
        if not explicit and loo is not None and loo >= loo_prev:
            confirmed = True
            refused.append(f"{n}: left out (the runs left out are predicted no better with "
                           f"it: leave-one-out {100 * loo:.1f} % vs {100 * loo_prev:.1f} % "
                           + ("with the preset values)" if not selected else
                              f"with {', '.join(selected)})"))
            continue
        selected, loo_prev = trial, (loo if loo is not None else loo_prev)
        result = (list(trial), u, fitter, r, J, iv, loo)
        accepted_ratio = pricer.ratio.copy()
    for m in rescue:     # 3. a default parameter pushed out of its range, paired with m
        if effect[m] >= MIN_RANGE_EFFECT and at_bound_alone and not take_pair(m):
            # or m in its stead, beside those kept: the mechanism the runs asked the pushed
            # parameter to stand in for
            pushed_alone = ", ".join(at_bound_alone)
            if take(selected + [m]):
                notes.append(f"{m}: fitted in place of {pushed_alone}, which the runs push "
                             f"out of its range alone")
    if explicit and refused:
        raise InputError("params", ",".join(names), f"not determined by these "
                         f"{len(prepared)} runs: " + "; ".join(refused))
    notes += refused
    below = [n for n in dict.fromkeys(below) if n not in selected]  # a pair may fit one
    bound = [i for i in range(len(prepared))
             if below and max(spread[n][i] for n in below) >= MIN_RANGE_EFFECT]
    if bound and result is not None and within_noise(result[3][bound], len(bound)):
        # the parameters fitted predict those runs as well as a measurement repeats: the link
        # efficiency alone went below its range standing in for them, not for slower links
        bound = []
    if not explicit and bound and len(bound) < len(prepared):
        # 4. runs whose links are slower than the cluster's can be (a link efficiency they
        # push below its range moves them): what the model misses in them is the links,
        # which no other parameter may absorb; the group is fitted again on the rest
        who = ", ".join(prepared[i].run.name for i in bound)
        them, their = ("them", "their") if len(bound) > 1 else ("it", "its")
        note = (f"run{'s' if len(bound) > 1 else ''} {who} left out: "
                f"{' and '.join(below)} below its range moves {them}, so {their} error is "
                f"the links', not another parameter's to absorb; " + SLOWER_THAN_LINKS[below[0]])
        fit = fit_group([p for i, p in enumerate(prepared) if i not in bound], base_gpu,
                        precision, params, source, _left_for=_left_for, _shared=_shared)
        return dataclasses.replace(fit, notes=[note] + fit.notes,
                                   presets_confirmed=not fit.parameters)

    if result is None and not bounded:
        notes.append(presets_errors_note(prepared, r0))
        return unfitted()
    if result is None:
        result = ([], np.zeros(0), _Fitter(pricer, dict(fixed_before)), None, None, {}, None)
    kept, u, fitter, r, J, iv, loo = result
    values = _values(kept, u, {}) | {n: v for n, (v, _) in bounded.items()}
    t = pricer.rebase(_values(kept, u, fitter.fixed))
    r = np.log(t / pricer.measured)
    intervals = {n: [round(_values([n], [iv[n][0]], {})[n], 6),
                     round(_values([n], [iv[n][1]], {})[n], 6)] for n in kept}
    for n, (v, (a, b)) in bounded.items():
        lo, hi = (_values([n], [x], {})[n] for x in (a, b))
        intervals[n] = [round(lo, 6), round(hi, 6)]
        notes.append(f"{n}: set to {v:.3g}, of the values that fit the runs alike "
                     f"({lo:.3g}-{hi:.3g}: they bound it on one side only) the nearest to its "
                     f"preset {before[n]:.3g}, which they rule out")
        kept = kept + [n]
    params_out = {k: round(float(v), 6) for k, v in values.items()}
    for n in kept:        # rounding must not leave the value outside its interval
        intervals[n] = [min(intervals[n][0], params_out[n]), max(intervals[n][1], params_out[n])]
    if below:   # every run moves with the link: the links, or what it stands in for, or both
        notes.append(f"warning: {', '.join(kept)} fitted on runs that all ask for "
                     f"{' and '.join(below)} below its range: the fitted values may stand in "
                     f"for slower links than the cluster's; if so, describe the links and "
                     f"calibrate with --topology FILE (the note on {below[0]})")
    return GroupFit(gpu=base_gpu.name, precision=precision, runs=len(prepared),
                    parameters=params_out,
                    before={k: round(float(v), 6) for k, v in before.items()},
                    mape_before=mape_before, mape_after=_mape(r),
                    loo_mape=loo, intervals=intervals, notes=notes)


def prepared_runs(runs: list[MeasuredRun], topology=None) -> list[_Prepared]:
    """The runs with a measured time, priced as ``validate`` prices them
    (:func:`configurator.app.validate_jobs.priced_run`, on ``topology``'s links if given), each
    with its measured time. Runs that price the same plan (the same model at its sequence
    length, cluster and nodes, and every plan field) are one observation at the geometric mean
    of their times, which keeps their names and times (:attr:`_Prepared.replicates`,
    :func:`replicate_note`): repeating a plan measures its noise, not a parameter, and counted
    apart two copies of one run would determine what one cannot, each predicting the other when
    left out. Raises :class:`InputError` naming a run Megatron would reject or that names an
    unknown preset, and when no run has a time."""
    out = []
    for run in runs:
        if not run.has_time:
            continue
        try:
            model, cluster, run = priced_run(run, topology)
        except InputError as exc:
            raise InputError(f"run {run.name}", exc.value, str(exc)) from None
        out.append(_Prepared(run=run, model=model, cluster=cluster,
                             measured_s=measured_iteration_time_s(model, run)))
    if not out:
        raise InputError("runs", len(runs), "no run with a measured iteration time")
    same: dict = {}
    for p in out:
        same.setdefault(_job_key(p) + (repr(p.run.plan),), []).append(p)
    return [ps[0] if len(ps) == 1 else dataclasses.replace(
        ps[0], run=dataclasses.replace(ps[0].run, name=" + ".join(q.run.name for q in ps)),
        measured_s=math.exp(sum(math.log(q.measured_s) for q in ps) / len(ps)),
        replicates=tuple((q.run.name, q.measured_s) for q in ps)) for ps in same.values()]


def presets_kept(fits: list[GroupFit]) -> bool:
    """Whether nothing was fitted because what the runs determine predicts the runs left
    out no better than the preset values, or rests on one run
    (:attr:`GroupFit.presets_confirmed`): the runs confirm the presets as far as they go,
    rather than determine nothing."""
    return not any(f.parameters for f in fits) and any(f.presets_confirmed for f in fits)


def calibrate_runs(runs: list[MeasuredRun], params: tuple[str, ...] | None = None,
                   progress=None, source: str = "calibrate", topology=None
                   ) -> tuple[Calibration, list[GroupFit]]:
    """Fit every (GPU type, precision) group of ``runs`` from the GPUs' own figures, the runs
    priced on ``topology``'s links if given (a :class:`topology.topofile.Topology`,
    :func:`configurator.app.validate_jobs.run_cluster`; its links carry their own figures,
    so the link efficiencies are not fitted, :func:`fittable`); returns
    the calibration (the fitted values only) and the per-group fits. Runs without a measured
    time are ignored; a run Megatron would reject or that names an unknown preset is an
    error naming it (:func:`prepared_runs`). Where what the runs determine predicts the runs
    left out no better than the presets (:func:`presets_kept`) the calibration is empty:
    every preset stays, and the fits' notes say why. Raises :class:`InputError` when the
    runs determine no parameter at all, naming for each the kind of run that would."""
    groups: dict = {}
    for p in prepared_runs(runs, topology):
        key = (p.cluster.gpu.name, p.run.plan.precision)
        groups.setdefault(key, (p.cluster.gpu, []))[1].append(p)
    fits = []
    items = list(groups.items())
    for (gname, prec), (gpu, prepared) in (progress(items) if progress else items):
        fits.append(fit_group(prepared, gpu, prec, params, source))
    values: dict = {}
    intervals: dict = {}
    for f in fits:
        if f.parameters:
            values.setdefault(f.gpu, {})[f.precision] = dict(f.parameters)
            intervals.setdefault(f.gpu, {})[f.precision] = {k: tuple(iv) for k, iv
                                                            in f.intervals.items()}
    if not values and not presets_kept(fits):
        notes = [n for f in fits for n in f.notes]
        raise InputError("runs", len(runs), "no parameter is determined by these runs: "
                         + "; ".join(notes))
    cal = Calibration(values=values, intervals=intervals,
                      fit={"source": source, "groups": [f.to_dict() for f in fits]})
    return cal, fits


#: The kinds of run-fitted figure (:data:`topology.gpus.IN_TRAINING`), in fit order.
FACTOR_KINDS = ("gemm", "attention", "host")
#: Bounds of an in-training factor (a fraction capped at 1 after it applies; the host's up
#: to 20 times its prior).
FACTOR_BOUNDS = {"gemm": (0.05, 2.0), "attention": (0.05, 2.0), "host": (0.05, 20.0)}
#: Points of each factor's (log) range the fit prices before it starts (the bounds
#: included, with the prior besides): the factor's effect over its whole range, and the
#: start of its fit at the best of them (a least-squares step from a prior where the runs'
#: times are flat in it, such as a host time below every run's host-bound point, would not
#: move it).
FACTOR_GRID_POINTS = 7


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
    predicted to measured time, each factor started from the best of
    :data:`FACTOR_GRID_POINTS` points of its range (the values before any run are factors
    1). A factor whose whole range (:data:`FACTOR_BOUNDS`) moves no run's log time by
    :data:`MIN_RANGE_EFFECT` stays 1, the rule :func:`fit_group` applies to a parameter (a
    local step from the prior cannot see a regime the prior sits outside of: a host time per
    operation below every run's host-bound point); so does one the fit leaves at a bound
    (:data:`BOUND_MARGIN_SHARE`), the others fitted again without it. Returns kind → factor.
    ``progress``: called with no argument after each pricing of the runs. Raises
    :class:`InputError` for a run that cannot be priced."""
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

    kinds, start = [], {}
    for j, k in enumerate(FACTOR_KINDS):
        # the factor over its whole range, the others at their priors: its effect on the
        # runs' log times, and the best point of the grid (the fit's start for it)
        grid = np.append(np.linspace(*np.log(FACTOR_BOUNDS[k]), FACTOR_GRID_POINTS), 0.0)
        logs = []
        for g in grid:
            x = np.zeros(len(FACTOR_KINDS))
            x[j] = g
            logs.append(resid(FACTOR_KINDS, x))
        logs = np.array(logs)
        if np.max(np.ptp(logs / weight, axis=0)) >= MIN_RANGE_EFFECT:
            kinds.append(k)
            start[k] = grid[int(np.argmin(np.sum(logs ** 2, axis=1)))]
    fitted: dict = {}
    while kinds:
        lo = np.log([FACTOR_BOUNDS[k][0] for k in kinds])
        hi = np.log([FACTOR_BOUNDS[k][1] for k in kinds])
        x0 = np.clip([start[k] for k in kinds], lo + 2 * BOUND_MARGIN_SHARE * (hi - lo),
                     hi - 2 * BOUND_MARGIN_SHARE * (hi - lo))
        sol = least_squares(lambda x: resid(kinds, x), x0, bounds=(lo, hi),
                            diff_step=0.02, xtol=1e-3, ftol=1e-4, max_nfev=40)
        at_bound = [k for k, x, a, b in zip(kinds, sol.x, lo, hi)
                    if _bound_side((x - a) / (b - a)) is not None]
        if not at_bound:
            fitted = dict(zip(kinds, np.exp(sol.x)))
            break
        kinds = [k for k in kinds if k not in at_bound]
    return {k: 1.0 for k in FACTOR_KINDS} | {k: round(float(v), 4)
                                              for k, v in fitted.items()}
