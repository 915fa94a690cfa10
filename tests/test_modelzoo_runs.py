"""The held-out Megatron MoE Model Zoo runs (``tests/data/modelzoo_qwen3.csv``, read by
``bench.accuracy.modelzoo``) stay readable and priceable: every row a valid run of the run-file
schema, with a citation, priced without an input problem, and none of them among the published
runs a fit sees."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from configurator.app.validate_jobs import validate_runs
from configurator.core.runs import load_runs
from configurator.cost.groundtruth import published_runs

PATH = Path(__file__).parent / "data" / "modelzoo_qwen3.csv"


def test_every_modelzoo_row_is_a_cited_run_the_model_prices():
    runs = load_runs(str(PATH))
    assert len(runs) == 17
    assert all("Megatron-MoE-ModelZoo" in r.source for r in runs)
    report = validate_runs(runs)
    assert [c.problem for c in report.checks] == [None] * len(runs)
    assert all(c.predicted_iteration_time_s > 0 and c.measured_iteration_time_s > 0
               for c in report.checks)
    # the long-context table's two routings are one plan apart only
    forced = {r.seq_length: r.plan for r in runs if r.name.endswith("forced")}
    dropless = {r.seq_length: r.plan for r in runs if r.name.endswith("dropless")}
    assert forced.keys() == dropless.keys() and len(forced) == 4
    for s, plan in forced.items():
        assert plan.moe_router_force_load_balancing
        assert dataclasses.replace(plan, moe_router_force_load_balancing=False) == dropless[s]


def test_the_modelzoo_runs_are_held_out_of_every_fit():
    dataset = load_runs(str(PATH))[0].dataset
    published, _ = published_runs()
    assert not any("ModelZoo" in (r.source or "") or r.dataset == dataset for r in published)
