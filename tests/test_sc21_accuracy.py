"""Predicted iteration time vs every published row of SC'21 Table 1 (within 10 %)."""

import pytest

from configurator.search.evaluate import evaluate_plan
from configurator.cost.groundtruth import sc21_rows
from topology.cluster_files import load_cluster

ROWS = sc21_rows()


def test_all_ten_rows_present():
    assert len(ROWS) == 10


@pytest.mark.parametrize("row", ROWS, ids=[r.model.name for r in ROWS])
def test_iteration_time_within_10_percent(row):
    cluster = load_cluster("dgx-a100-80gb", nodes=row.num_gpus // 8)
    e = evaluate_plan(row.model, cluster, row.plan)
    published = row.published_iteration_time_s
    assert abs(e.iteration_time_s / published - 1) <= 0.10, (e.iteration_time_s, published)
    assert e.fits, "NVIDIA ran this configuration on 80 GB GPUs; it must fit"
