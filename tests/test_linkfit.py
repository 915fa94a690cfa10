"""α–β link model (topology.linkfit): exact recovery, robustness to outliers, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from configurator.core.errors import InputError
from topology.linkfit import (SIGMA_FLOOR, LinkFit, bus_factor, fit_alpha_beta,
                              predict_time_s)

MiB, GiB = 1 << 20, 1 << 30
SIZES = [32 * MiB * 2 ** i for i in range(10)]           # 32 MiB .. 16 GiB, nccl-tests -f 2


def _sweep(alpha_s, beta_Bps, sizes=SIZES, repeat=2):
    n = np.repeat(np.asarray(sizes, dtype=float), repeat)
    return n, alpha_s + n / beta_Bps


@pytest.mark.parametrize("alpha_s, beta_Bps", [(40e-6, 13.5e9), (5e-6, 370e9), (0.0, 25e9),
                                               (2e-3, 1e9)])
def test_noiseless_sweep_is_recovered_exactly(alpha_s, beta_Bps):
    n, t = _sweep(alpha_s, beta_Bps)
    fit = fit_alpha_beta(n, t)
    assert fit.bandwidth_Bps == pytest.approx(beta_Bps, rel=1e-6)
    assert fit.latency_s == pytest.approx(alpha_s, abs=1e-9)
    assert (fit.samples, fit.outliers, fit.sizes) == (20, 0, 10)
    assert fit.rel_rmse < 1e-6 and fit.max_message_bytes == 16 * GiB
    assert not fit.latency_bound and not fit.notes
    assert predict_time_s(fit, 1 * GiB) == pytest.approx(alpha_s + GiB / beta_Bps, rel=1e-6)


def test_small_message_sweep_recovers_latency():
    # nccl-tests -b 8 -e 128M -f 2: latency dominates the small end, bandwidth the large one.
    sizes = [8 * 2 ** i for i in range(25)]
    n, t = _sweep(25e-6, 20e9, sizes)
    fit = fit_alpha_beta(n, t)
    assert fit.latency_s == pytest.approx(25e-6, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(20e9, rel=1e-6)
    assert fit.latency_resolved and fit.outliers == 0


def test_bus_factor_scales_beta_and_prediction():
    # all_reduce over 16 ranks: busbw = algbw * 2 * 15 / 16.
    k = bus_factor("all_reduce_perf", 16)
    assert k == pytest.approx(2 * 15 / 16)
    n, t = _sweep(30e-6, 100e9)
    fit = fit_alpha_beta(n, t, bus_factor=k)
    assert fit.bandwidth_Bps == pytest.approx(100e9 * k, rel=1e-6)
    assert predict_time_s(fit, n) == pytest.approx(t, rel=1e-6)
    assert bus_factor("sendrecv", 2) == 1.0 and bus_factor("alltoall", 2) == 0.5
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("hypercube", 8) == 1.0 and bus_factor("all_reduce", 1) == 1.0


def test_outlier_at_largest_size_is_left_out():
    # One bad timing at 16 GiB (0.97 GB/s where the sweep says 6.6): β of the rest.
    n, t = _sweep(50e-6, 6.6e9)
    t[-1] = n[-1] / 0.97e9
    fit = fit_alpha_beta(n, t)
    assert fit.bandwidth_Bps == pytest.approx(6.6e9, rel=0.02)
    assert fit.outliers == 1 and fit.outlier_bytes == (16 * GiB,)
    assert fit.max_message_bytes == 16 * GiB          # the in-place 16 GiB point is kept


def test_collapsing_tail_is_left_out():
    # The real-log pattern: a plateau up to 512 MiB, then the rate halves at every size.
    rng = np.random.default_rng(1)
    n, t = _sweep(40e-6, 7.0e9)
    t *= 1 + 0.01 * rng.standard_normal(t.size)
    for i, size in enumerate(n):
        if size >= 1 * GiB:
            t[i] *= 1.5 * 2 ** math.log2(size / GiB)
    fit = fit_alpha_beta(n, t)
    assert fit.bandwidth_Bps == pytest.approx(7.0e9, rel=0.02)
    assert fit.outlier_bytes == tuple(s for s in SIZES if s >= GiB)
    assert fit.max_message_bytes == 512 * MiB
    assert not fit.latency_resolved                    # half the sweep gone: α not trusted


@pytest.mark.parametrize("seed", range(20))
def test_noisy_clean_sweep_keeps_every_point(seed):
    rng = np.random.default_rng(seed)
    n, t = _sweep(40e-6, 13.5e9)
    t *= 1 + 0.003 * rng.standard_normal(t.size)
    fit = fit_alpha_beta(n, t)
    assert fit.outliers == 0
    assert fit.bandwidth_Bps == pytest.approx(13.5e9, rel=0.01)
    assert fit.latency_resolved
    assert abs(fit.latency_s - 40e-6) < 4 * fit.latency_stderr_s


def test_rounded_times_are_not_outliers():
    # nccl-tests prints large times with two digits (1.8e+07 µs): up to 2.8 % rounding.
    n, t = _sweep(40e-6, 0.97e9)
    t_us = np.array([float(f"{x * 1e6:.2g}") if x > 1 else x * 1e6 for x in t])
    fit = fit_alpha_beta(n, t_us * 1e-6)
    assert fit.outliers == 0 and SIGMA_FLOOR >= 0.02
    assert fit.bandwidth_Bps == pytest.approx(0.97e9, rel=0.03)


def test_one_size_only():
    fit = fit_alpha_beta([1 * GiB, 1 * GiB], [0.1, 0.1 * 1.02])
    assert fit.latency_s is None and fit.sizes == 1 and fit.samples == 2
    assert fit.bandwidth_Bps == pytest.approx(GiB / 0.101, rel=1e-9)
    assert any("one message size" in x for x in fit.notes)
    assert not fit.latency_resolved
    assert predict_time_s(fit, GiB) == pytest.approx(0.101, rel=1e-9)


def test_latency_bound_sweep():
    # 8 B .. 1 KiB at 10 µs: the time hardly moves, β is not identifiable.
    sizes = [8 * 2 ** i for i in range(8)]
    n, t = _sweep(10e-6, 20e9, sizes)
    fit = fit_alpha_beta(n, t)
    assert fit.latency_bound and any("latency-bound" in x for x in fit.notes)
    assert fit.latency_s == pytest.approx(10e-6, rel=1e-3)
    # the largest observed rate: a finite lower bound of β
    assert fit.bandwidth_Bps == pytest.approx(float(np.max(n / t)), rel=1e-9)
    assert math.isfinite(fit.bandwidth_Bps) and fit.bandwidth_Bps > 0
    flat = fit_alpha_beta(sizes, [10e-6] * len(sizes))   # constant times: slope 0
    assert flat.latency_bound and flat.bandwidth_Bps > 0


def test_invalid_points_are_skipped_not_raised():
    n, t = _sweep(40e-6, 13.5e9)
    n = np.append(n, [64 * MiB, 64 * MiB, 0, 64 * MiB])
    t = np.append(t, [-1.0, 0.0, 1e-3, float("nan")])
    fit = fit_alpha_beta(n, t)
    assert fit.samples == 20 and fit.outliers == 0
    assert fit.bandwidth_Bps == pytest.approx(13.5e9, rel=1e-6)
    assert any("skipped 4 point" in x for x in fit.notes)


def test_bad_input_raises_input_error():
    with pytest.raises(InputError, match="one time per message size"):
        fit_alpha_beta([1, 2, 3], [1.0, 2.0])
    with pytest.raises(InputError, match="at least one positive"):
        fit_alpha_beta([1, 2], [-1.0, 0.0])
    with pytest.raises(InputError, match="at least one positive"):
        fit_alpha_beta([], [])
    with pytest.raises(InputError, match="bus_factor"):
        fit_alpha_beta([1, 2], [1.0, 2.0], bus_factor=0.0)
    with pytest.raises(InputError, match="numbers"):
        fit_alpha_beta(["a"], [1.0])


def test_linkfit_fields_and_units():
    n, t = _sweep(40e-6, 13.5e9)
    fit = fit_alpha_beta(n, t)
    assert isinstance(fit, LinkFit)
    assert fit.latency_stderr_s is not None and fit.latency_stderr_s < 1e-6
    assert fit.bus_factor == 1.0 and fit.outlier_bytes == ()
    arr = predict_time_s(fit, np.array([[MiB, GiB]]))
    assert arr.shape == (1, 2) and arr[0, 1] > arr[0, 0] > 40e-6


def test_many_points_stay_fast():
    import time
    rng = np.random.default_rng(0)
    n = rng.integers(MiB, 16 * GiB, size=20_000).astype(float)
    t = 20e-6 + n / 13e9 * (1 + 0.005 * rng.standard_normal(n.size))
    start = time.perf_counter()
    fit = fit_alpha_beta(n, t)
    assert time.perf_counter() - start < 10
    assert fit.bandwidth_Bps == pytest.approx(13e9, rel=0.01)
