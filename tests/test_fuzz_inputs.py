"""Quick fuzzing profile: a fixed corpus of known hostile inputs (tests/support/fuzzing
``regression_cases``) and derandomized Hypothesis examples for every input format (model,
cluster, HF config, topology file, nccl-tests log, nvidia-smi topo -m, plan.json, argv, run
file, calibration file), fed
through the real CLI in worker subprocesses. Every call must end with exit 0/2/3 (2 and 3
with exactly one stderr line), no traceback, hang (> 10 s) or memory blow-up (> 2 GiB), and
strict JSON.

Reproducible: Hypothesis derandomized, no example database, no deadline (the 10 s hang limit
is the runner's). The full report with grouped, shrunk reproducers is
``python -m bench.robustness.fuzz --examples 300``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.support.fuzzing import TARGETS, Runner, case_strategy, regression_cases, shrink

#: Examples per target (about 540 calls, plus ~80 corpus inputs: ~60 s on 2 cores).
QUICK_EXAMPLES = {"model": 65, "cluster": 60, "hf_config": 60, "topofile": 60, "nccl": 60,
                  "nvsmi": 55, "plan": 60, "argv": 60, "runs": 30, "calibration": 30}
REGRESSION = regression_cases()
#: Share of calls that write --out files (plots, HTML): kept low, they cost ~0.3 s each.
QUICK_OUT_PERCENT = 8


@pytest.fixture(scope="module")
def runner():
    with Runner() as r:
        yield r


@pytest.mark.parametrize("target", TARGETS)
def test_known_hostile_inputs(runner, target):
    """Every corpus input of ``target`` ends cleanly; all failures listed at once."""
    failed = [o for o in map(runner.run, REGRESSION[target]) if o.failures]
    if failed:
        pytest.fail(f"{len(failed)} of {len(REGRESSION[target])} {target} corpus inputs "
                    "failed:\n" + "\n".join(o.report() for o in failed), pytrace=False)


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target(runner, target):
    @settings(max_examples=QUICK_EXAMPLES[target], derandomize=True, database=None,
              deadline=None, phases=[Phase.explicit, Phase.generate], print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(case=case_strategy(target, out_p=QUICK_OUT_PERCENT))
    def check(case):
        outcome = runner.run(case)
        if outcome.failures:
            small = shrink(runner, outcome, max_runs=60, max_seconds=15)
            pytest.fail(f"{target}: {len(outcome.failures)} failure(s); shrunk reproducer "
                        f"(run in a directory holding its files):\n{small.report()}",
                        pytrace=False)

    check()
    runner.close_target(target)
