"""Behaviour pinned by golden outputs (``tests/golden.py``): search and estimate ``--json`` of
23 model/cluster/batch cases (presets, a custom YAML model and cluster, a Hugging Face config,
the measured 17-node topology with and without ``--exclude-flagged``) and the launch scripts
and plan estimates of 4 searches plus one ``launch --plan``; identical except the search's
wall-clock time, floats compared to 1e-9 relative or 1e-9 absolute (a reordered sum or another
BLAS kernel moves the last bits, and a difference of two near-equal times such as
``schedule_and_placement`` keeps those bits' absolute size, not its relative one)."""

import json

import pytest

from tests import golden


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
    """Where ``a`` and ``b`` (parsed JSON) first differ, or None; floats equal to 1e-9
    relative or 1e-9 absolute count as equal."""
    if isinstance(a, float) and isinstance(b, float):
        return None if a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0) else \
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
