"""The in-training factors' fit (configurator.app.calibrate_jobs.fit_factors) on runs priced by
a stand-in model whose truth is known: a run takes ``max(work / GEMM efficiency, operations ×
host time per operation)``, so a factor's identifiability turns on whether the runs cross the
host-bound point inside the factor's range, not at its prior."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from configurator.app import calibrate_jobs as cj
from topology.gpus import GPU_PRESETS, HOST_OP_PRIOR, RUN_FITTED

GPU = GPU_PRESETS["a100-80gb"]
GEMM_PRIOR = RUN_FITTED["a100-80gb"]["gemm"].value
HOST_PRIOR_S = HOST_OP_PRIOR.value * 1e-6


def _stand_in(monkeypatch, runs):
    """fit_factors over ``runs`` (``(work, ops, measured_s)``), priced by the stand-in."""
    prepared = [SimpleNamespace(run=SimpleNamespace(dataset=f"d{i % 2}",
                                                    plan=SimpleNamespace(precision="fp16")),
                                cluster=SimpleNamespace(gpu=GPU), measured_s=t, work=w, ops=n)
                for i, (w, n, t) in enumerate(runs)]
    monkeypatch.setattr(cj, "prepared_runs", lambda _runs: prepared)
    monkeypatch.setattr(cj, "_predict", lambda p, gpu: max(
        p.work / gpu.efficiency.gemm, p.ops * gpu.efficiency.host_op_s))
    return cj.fit_factors(runs)


def _truth(gemm_factor, host_factor):
    return lambda w, n: max(w / (GEMM_PRIOR * gemm_factor), n * HOST_PRIOR_S * host_factor)


def test_a_host_time_above_the_prior_is_found_though_no_run_is_host_bound_at_the_prior(
        monkeypatch):
    """Every run is GPU-bound at the prior and host-bound at the truth (twice the prior): a
    small step down from the prior moves no run's time, the factor's whole range does."""
    truth = _truth(0.9, 2.0)
    # operations whose host time at the prior is c times the work's GEMM time at the prior
    shapes = [(w, c * w / (GEMM_PRIOR * HOST_PRIOR_S))
              for w, c in ((1.0, 0.75), (2.0, 0.85), (1.0, 0.1), (3.0, 0.2))]
    for w, n in shapes[:2]:     # GPU-bound at the prior, host-bound at the truth
        assert n * HOST_PRIOR_S < w / GEMM_PRIOR < n * HOST_PRIOR_S * 2.0 * 0.9
    out = _stand_in(monkeypatch, [(w, n, truth(w, n)) for w, n in shapes])
    assert out["host"] == pytest.approx(2.0, rel=0.03)
    assert out["gemm"] == pytest.approx(0.9, rel=0.03)
    assert out["attention"] == 1.0      # nothing here depends on attention


def test_a_factor_the_runs_push_to_a_bound_stays_at_its_prior(monkeypatch):
    """Runs that would need less host time than the factor's lower bound allows (host-bound
    even there, measured at their GPU time): the fit leaves the factor at the bound, which
    does not determine it, so it stays 1 and the GEMM factor is fitted without it."""
    lo = cj.FACTOR_BOUNDS["host"][0]
    truth = _truth(0.9, 0.0)
    shapes = [(1.0, 3.0 / (lo * GEMM_PRIOR * HOST_PRIOR_S)),
              (2.0, 2.0 / (lo * GEMM_PRIOR * HOST_PRIOR_S)),
              (1.0, 0.1 / (GEMM_PRIOR * HOST_PRIOR_S)), (3.0, 0.2 / (GEMM_PRIOR * HOST_PRIOR_S))]
    out = _stand_in(monkeypatch, [(w, n, truth(w, n)) for w, n in shapes])
    assert out["host"] == 1.0
    assert 0.05 < out["gemm"] <= 2.0


def test_runs_no_factor_moves_leave_every_factor_at_its_prior(monkeypatch):
    """Times that no factor's range moves by MIN_RANGE_EFFECT: nothing is fitted."""
    monkeypatch.setattr(cj, "prepared_runs", lambda _runs: [SimpleNamespace(
        run=SimpleNamespace(dataset="d", plan=SimpleNamespace(precision="fp16")),
        cluster=SimpleNamespace(gpu=GPU), measured_s=1.0)] * 3)
    monkeypatch.setattr(cj, "_predict", lambda p, gpu: 1.2)
    assert cj.fit_factors([]) == {k: 1.0 for k in cj.FACTOR_KINDS}
