"""Behaviour pinned by golden outputs (``tests/golden.py``): search and estimate ``--json`` of
23 model/cluster/batch cases (presets, a custom YAML model and cluster, a Hugging Face config,
the measured 17-node topology with and without ``--exclude-flagged``) and the launch scripts
and plan estimates of 4 searches plus one ``launch --plan``; identical except the search's
wall-clock time."""

import json

import pytest

from tests import golden


@pytest.fixture(scope="module")
def produced():
    if not golden.has_real_logs():
        pytest.skip(f"real nccl-tests logs not found at {golden.REAL_LOGS}")
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
        assert got == json.loads(path.read_text()), f"{name} differs from {path}"
