"""Behaviour pinned by golden outputs (``tests/golden.py``): search and estimate ``--json`` of
25 model/cluster/batch cases (presets, a custom YAML model and cluster, a Hugging Face config,
the measured 17-node topology with and without ``--exclude-flagged``) and the launch scripts
and plan estimates of 4 searches plus one ``launch --plan``; identical except the search's
wall-clock time; floats compared to :data:`REL_TOL` (below, with its reason), integers,
flags, strings, plan choices and the scripts' text exactly."""

import json

import pytest

from tests import golden

#: Floats match within this fraction of the larger of the two (and of 1, so a figure near
#: zero, such as the difference of two near-equal times ``schedule_and_placement``, is
#: held to 1e-6 absolute). Why not tighter: numpy's sums and BLAS kernels add in an order
#: set by the CPU's SIMD width, and a figure derived by cancellation (an exposed
#: communication time, a difference of times) carries that reordering's error at ~1e-9
#: relative: another machine gave ``estimate_topology``'s
#: ``.time_per_stage[3].dp_exposed_s`` 2.3e-9 relative off the recording. 1e-6 leaves three
#: orders of magnitude for that, while any change to the model moves a figure by far more
#: (a microsecond of a one-second iteration); what the search chooses (integers, flags,
#: names) is compared exactly, so a reordered sum cannot pass for another plan.
REL_TOL = 1e-6


@pytest.fixture(scope="module")
def produced():
    return golden.produce()


def test_case_count(produced):
    assert len(golden.SEARCH_CASES) + len(golden.ESTIMATE_CASES) >= 20
    recorded = sorted(p.name for p in golden.GOLDEN_DIR.iterdir())
    assert recorded == sorted(golden.golden_path(n).name for n in produced)


@pytest.mark.parametrize("name", [*golden.SEARCH_CASES, *golden.ESTIMATE_CASES,
                                  *(f"{c}/{f}" for c in golden.SCRIPT_CASES
                                    for f in ("launch_torchrun.sh", "launch_slurm.sbatch",
                                              "plan.json:estimate")),
                                  "launch_from_plan/launch_torchrun.sh",
                                  "launch_from_plan/launch_slurm.sbatch"])
def test_golden_output(produced, name):
    path = golden.golden_path(name)
    got = produced[name]
    if isinstance(got, str):
        assert got == path.read_text(), f"{name} differs from {path}"
    else:
        diff = _first_difference(got, json.loads(path.read_text()))
        assert diff is None, f"{name} differs from {path} at {diff}"


def _first_difference(a, b, where="") -> str | None:
    """Where ``a`` and ``b`` (parsed JSON) first differ, or None; floats within
    :data:`REL_TOL` of ``max(|a|, |b|, 1)`` count as equal, everything else (types
    included: ``4`` is not ``4.0``) must be equal."""
    if isinstance(a, float) and isinstance(b, float):
        return None if a == b or abs(a - b) <= REL_TOL * max(abs(a), abs(b), 1.0) else \
            f"{where}: {a!r} != {b!r}"
    if type(a) is not type(b):
        return f"{where}: {a!r} != {b!r}"
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(a.keys() ^ b.keys())}"
        return next((d for k in a if (d := _first_difference(a[k], b[k], f"{where}.{k}"))),
                    None)
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: length {len(a)} != {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b))
                     if (d := _first_difference(x, y, f"{where}[{i}]"))), None)
    return None if a == b else f"{where}: {a!r} != {b!r}"


def test_the_comparison_allows_a_reordered_sum_and_nothing_else():
    """Floats within :data:`REL_TOL` match (a reordered sum: the figure another machine's
    SIMD width gave, 2.3e-9 relative off the recording); a float off by more, an integer, a
    string, a flag, a plan field or a key that changed does not."""
    issue = {"time_per_stage": [{"stage": 3, "dp_exposed_s": 0.6616825040451203}]}
    recorded = {"time_per_stage": [{"stage": 3, "dp_exposed_s": 0.6616825025070744}]}
    assert _first_difference(issue, recorded) is None
    base = {"plans": [{"config": {"tp": 8, "pp": 4, "recompute": "none",
                                  "sequence_parallel": True},
                       "iteration_time_s": 17.43, "peak_memory_bytes": 7.2e10}],
            "feasible": 39272}
    near = json.loads(json.dumps(base))
    near["plans"][0]["iteration_time_s"] *= 1 + 1e-8
    near["plans"][0]["peak_memory_bytes"] *= 1 - 1e-8
    assert _first_difference(near, base) is None

    def changed(path, value):
        doc = json.loads(json.dumps(base))
        *keys, last = path
        obj = doc
        for k in keys:
            obj = obj[k]
        obj[last] = value
        return _first_difference(doc, base)

    assert changed(("plans", 0, "iteration_time_s"), 17.43 * (1 + 1e-5))
    assert changed(("feasible",), 39273)
    assert changed(("plans", 0, "config", "tp"), 4)
    assert changed(("plans", 0, "config", "recompute"), "selective")
    assert changed(("plans", 0, "config", "sequence_parallel"), False)
    assert changed(("plans", 0, "config", "pp"), 4.0)          # an int is not a float
    assert _first_difference({**base, "extra": 1}, base)
