"""bench.accuracy.factor_sources's groups: every published source once, then Megatron-Bridge's
rows split by model kind, then every row but Bridge's MoE rows."""

from __future__ import annotations

from bench.accuracy.factor_sources import groups
from configurator.app.validate_jobs import run_model
from configurator.cost.groundtruth import published_runs


def test_the_groups_split_bridge_by_model_kind():
    runs, _ = published_runs()
    got = dict(groups(runs))
    datasets = {r.dataset for r in runs}
    assert datasets <= got.keys()
    assert sum(len(got[d]) for d in datasets) == len(runs)
    dense = got["Megatron-Bridge, dense models"]
    moe = got["Megatron-Bridge, MoE models"]
    assert dense and moe
    assert all(not run_model(r).is_moe for r in dense)
    assert all(run_model(r).is_moe for r in moe)
    assert {id(r) for r in dense} | {id(r) for r in moe} == {
        id(r) for r in got["Megatron-Bridge"]}
    rest = got["every source but Megatron-Bridge's MoE rows"]
    assert len(rest) == len(runs) - len(moe)
    assert not {id(r) for r in rest} & {id(r) for r in moe}
