"""The search's shortcuts give what the plain evaluation gives: a layer's terms computed once
per distinct row (:func:`configurator.core.rows.row_groups`), the weights-only lower bound
that spares activations of plans that cannot fit (``limit_bytes``), the memory model read
from a plan batch or one plan (:class:`memory_model.activations.LayerInputs`), and the closed
form of the shortlisted plans taken from the ranking's batch."""

from __future__ import annotations

import numpy as np
import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.core.model_presets import load_model
from configurator.core.rows import distinct_rows, row_groups
from configurator.search.evaluate import evaluate_plan
from configurator.search.rank import search
from configurator.core.layers import stage_class_arrays, stage_classes
from configurator.search.space import enumerate_plans, product_columns
from topology.cluster_files import load_cluster
from configurator.search.engine import GROUP_ROWS_ABOVE, peak_memory
from memory_model.activations import LayerInputs
from memory_model.estimate import estimate_memory


@pytest.mark.parametrize("seed", range(5))
def test_row_groups_gather_back_every_column(seed):
    rng = np.random.default_rng(seed)
    n = 5000
    cols = [rng.integers(1, 9, n), rng.integers(0, 2, n).astype(bool),
            rng.choice([1, 7, 1 << 30], n), 3, rng.integers(-5, 5, n),
            np.full(n, 4), rng.choice([100, 104, 109], n)]
    first, inverse = row_groups(*cols)
    assert inverse.shape == (n,)
    arrays = [np.broadcast_to(c, (n,)) for c in cols]
    rows = np.stack([a.astype(np.int64) for a in arrays], axis=1)
    assert len(first) == len(np.unique(rows, axis=0))       # one entry per distinct row
    for a in arrays:
        assert np.array_equal(a[first][inverse], a)


def test_row_groups_many_distinct_rows_fall_back_to_a_sort():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 1 << 40, 3000), rng.integers(0, 1 << 40, 3000)
    first, inverse = row_groups(a, b)
    assert np.array_equal(a[first][inverse], a) and np.array_equal(b[first][inverse], b)
    assert row_groups(1, 2) is None


def test_stage_class_arrays_are_each_plans_stage_classes():
    # even splits, embedding/loss-aware and uneven ones (126 layers), pipeline layouts
    # (DeepSeek-V3's 61 layers): every plan's row is what stage_classes gives its split
    for name, world, gbs in (("llama3.1-405b", 1024, 1024), ("deepseek-v3", 1024, 4096)):
        model = load_model(name)
        c = enumerate_plans(model, world, gbs)
        cls = stage_class_arrays(model, pp=c.pp, vp=c.vp, first=c.first, last=c.last,
                                 account_embedding=c.acct_emb, account_loss=c.acct_loss,
                                 layout=c.layout)
        checked = set()
        for i in np.random.default_rng(0).choice(len(c), 400, replace=False):
            p = c.plan(int(i))
            key = p.layer_split
            classes = stage_classes(model, *key)
            K = cls["stage"].shape[1]
            assert len(classes) <= K
            for k in range(K):
                stage, count, layers, moe = classes[k] if k < len(classes) else classes[0]
                assert (cls["stage"][i, k], cls["layers"][i, k], cls["moe_layers"][i, k]) \
                    == (stage, layers, moe)
                assert cls["count"][i, k] == (count if k < len(classes) else 0)
            checked.add(key)
        assert len(checked) > 3


@pytest.mark.parametrize("sizes", [(3,), (2, 1, 4), (1, 1), (5, 2, 3, 2), (4, 1, 1, 6)])
def test_product_columns_are_the_raveled_meshgrid(sizes):
    rng = np.random.default_rng(len(sizes))
    values = [rng.integers(0, 50, n) if i % 2 else rng.random(n) < 0.5
              for i, n in enumerate(sizes)]
    got = product_columns(values)
    want = [a.ravel() for a in np.meshgrid(*values, indexing="ij")]
    assert len(got) == len(want)
    for g, w, v in zip(got, want, values):
        assert g.dtype == v.dtype and np.array_equal(g, w)


def test_distinct_rows_in_first_appearance_order():
    rng = np.random.default_rng(2)
    base = rng.random((4, 7))
    a = base[rng.integers(0, 4, 50)]
    rows, inverse = distinct_rows(a)
    assert np.array_equal(rows[inverse], a)
    assert len(rows) == len(np.unique(a, axis=0))
    firsts = [int(np.flatnonzero((a == r).all(axis=1))[0]) for r in rows]
    assert firsts == sorted(firsts)                     # first appearance order


def _plain(model, cand):
    """Peak memory without grouping: small batches, under the grouping threshold."""
    step = GROUP_ROWS_ABOVE
    return np.concatenate([peak_memory(model, cand.take(np.arange(i, min(i + step,
                                                                        len(cand)))))
                           for i in range(0, len(cand), step)])


@pytest.mark.parametrize("name,world,gbs,options", [
    ("gpt3-175b", 256, 512, {}),
    ("mixtral-8x7b", 64, 256, {"precision": "fp8"}),
    ("llama3-70b", 128, 256, {"attention_backend": "local"}),
])
def test_grouped_and_bounded_memory_equal_the_plain_evaluation(name, world, gbs, options):
    model = load_model(name)
    cand = enumerate_plans(model, world, gbs, **options)
    assert len(cand) > 2 * GROUP_ROWS_ABOVE
    plain = _plain(model, cand)
    grouped = peak_memory(model, cand)
    assert np.array_equal(grouped, plain)                 # same floats, not just close
    limit = float(np.quantile(plain, 0.3))
    bounded = peak_memory(model, cand, limit_bytes=limit)
    fits = plain <= limit
    assert 0 < fits.sum() < len(cand)
    assert np.array_equal(bounded <= limit, fits)
    assert np.array_equal(bounded[fits], plain[fits])
    assert np.all(bounded[~fits] <= plain[~fits])          # a lower bound where skipped
    # every plan under the limit: the weights and state of the bound's pass are reused
    assert np.array_equal(peak_memory(model, cand, limit_bytes=float(plain.max())), plain)


def test_memory_of_a_plan_is_its_candidates_row():
    model = load_model("llama3-8b")
    cand = enumerate_plans(model, 16, 64)
    for i in (0, len(cand) // 2, len(cand) - 1):
        plan = cand.plan(i)
        stages = estimate_memory(model, PlanBatch.from_plan(plan))
        one = peak_memory(model, PlanBatch.from_plan(plan))
        assert max(s.total_bytes for s in stages) == pytest.approx(float(one[0]), rel=1e-12)
    x = LayerInputs.of_plans(model, cand.take(np.arange(3)))
    assert x.recompute.tolist() == cand.recompute_code[:3].tolist()
    assert x.tp.tolist() == cand.tp[:3].tolist()
    assert x.seq.tolist() == (model.seq_length / cand.cp[:3]).tolist()


def test_shortlisted_plans_keep_the_closed_form_they_were_ranked_with():
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb", nodes=32)
    res = search(model, cluster, 512)
    for e in res.plans:
        again = evaluate_plan(model, cluster, e.plan)
        assert e.time_breakdown_s == again.time_breakdown_s       # the same floats
        assert e.closed_form_iteration_time_s == again.closed_form_iteration_time_s
        assert e.iteration_time_s == again.iteration_time_s



def test_padded_vocabulary_table_gives_megatrons_padding():
    """The table lookup for many plans gives ``_vocab_size_with_padding``'s integers (a
    multiple of 128·tp, the least at or above the vocabulary) for every tp; a scalar, a
    float array and a tp beyond the table take the formula."""
    from memory_model.params import padded_vocab_size
    rng = np.random.default_rng(3)
    for vocab in (50257, 128256, 32000, 151936, 129280):
        tp = rng.choice([1, 2, 3, 4, 6, 8, 16, 64, 128], 1000)
        got = padded_vocab_size(vocab, tp)
        want = np.array([-(-vocab // (128 * t)) * 128 * t for t in tp.tolist()])
        assert got.dtype.kind == "i" and np.array_equal(got, want)
        assert ((got % (128 * tp) == 0) & (got >= vocab) & (got - 128 * tp < vocab)).all()
        assert padded_vocab_size(vocab, 3) == -(-vocab // 384) * 384
        big = np.full(100, 8192)
        assert np.array_equal(padded_vocab_size(vocab, big),
                              -(-vocab // (128 * big)) * 128 * big)
        assert np.array_equal(padded_vocab_size(vocab, tp.astype(float)), want)


def test_taking_candidates_by_mask_indices_or_slice_is_alike():
    cand = enumerate_plans(load_model("llama3-8b"), 16, 64)
    mask = np.zeros(len(cand), dtype=bool)
    mask[[2, 7, 11]] = True
    by_mask, by_index = cand.take(mask), cand.take(np.array([2, 7, 11]))
    by_slice = cand.take(slice(2, 12, 9))            # rows 2 and 11
    for k, col in cand.columns.items():
        assert np.array_equal(by_mask.columns[k], col[[2, 7, 11]])
        assert np.array_equal(by_index.columns[k], col[[2, 7, 11]])
        assert np.array_equal(by_slice.columns[k], col[[2, 11]])
    assert np.array_equal(by_mask.group, cand.group[[2, 7, 11]])


@pytest.mark.parametrize("distinct", [1, 2, 8, 40, 3000])
def test_wide_columns_are_labelled_as_numpy_unique_groups_them(distinct):
    """A column wider than the lookup table (pipeline layouts' 56-bit digests) is labelled by
    its low bits where they tell its values apart and by a sort otherwise (3,000 values in
    2¹⁶ bins collide): either way equal entries, and only those, share a label."""
    from configurator.core.rows import DENSE_RANGE, _codes

    rng = np.random.default_rng(distinct)
    values = rng.integers(DENSE_RANGE, 2**56, size=distinct)
    col = values[rng.integers(0, distinct, size=20000)]
    col[::3] = 0
    codes, count = _codes(col)
    uniq, inverse = np.unique(col, return_inverse=True)
    assert count == len(uniq) and codes.min() == 0 and codes.max() == count - 1
    # the same partition: a label maps to one value and a value to one label
    pairs = np.unique(np.stack([codes, inverse.ravel()]), axis=1)
    assert pairs.shape[1] == count
