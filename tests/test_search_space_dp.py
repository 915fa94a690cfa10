"""A restriction on dp (a field the layout decides) keeps only the layouts that give it."""

from configurator.core.model_presets import load_model
from configurator.search.space import SearchSpace, enumerate_plans


def test_dp_restriction_is_applied():
    model = load_model("gpt-1.7b")
    every = enumerate_plans(model, 16, 32)
    assert set(every.dp.tolist()) > {1, 2}
    for dps in ((1,), (2, 4)):
        c = enumerate_plans(model, 16, 32, space=SearchSpace(dp=dps))
        assert len(c) > 0 and set(c.dp.tolist()) <= set(dps)
        assert len(c) == int(sum((every.dp == d).sum() for d in dps))
