"""``bench.accuracy.calibrate_pairs``'s scatter of the presets' errors within a group."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from bench.accuracy import calibrate_pairs


def test_group_scatter_pools_the_deviations_about_each_groups_own_mean(monkeypatch):
    """Two groups: errors of +10 % and +10 % (all of it the group's bias, no scatter) and of
    ×e^0.1 and ×e^-0.1 (scatter 0.1 about a mean of 0); a group of one run has no degree of
    freedom and is skipped. Pooled: sqrt((0 + 2·0.1²) / (1 + 1))."""
    groups = {"biased": [(1.1, 1.0), (2.2, 2.0)],
              "spread": [(math.exp(0.1), 1.0), (math.exp(-0.1), 1.0)],
              "single": [(5.0, 1.0)]}
    monkeypatch.setattr(calibrate_pairs, "groups", lambda: groups)
    monkeypatch.setattr(calibrate_pairs, "validate_runs", lambda runs: SimpleNamespace(checks=[
        SimpleNamespace(predicted_iteration_time_s=p, measured_iteration_time_s=m)
        for p, m in runs]))
    sd, n, dof = calibrate_pairs.group_scatter()
    assert (n, dof) == (2, 2)
    assert sd == pytest.approx(math.sqrt(2 * 0.1 ** 2 / 2))
