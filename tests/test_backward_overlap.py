"""A microbatch's backward as one stretch of host and GPU work
(:func:`configurator.cost.iteration.backward_overlap_s`): the closed form against a brute-force
two-machine flow shop (the host issuing each pass's operations in order, the GPU running each
as soon as it is issued and the previous one is done), and what it saves where every pass is
bound the same way (what it changes on the small A100 plans: ``tests/test_host_local.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from configurator.core.plan import ParallelPlan
from configurator.core.plan_batch import PlanBatch
from configurator.cost.host_ops import HOST_BACKWARD_FACTOR
from configurator.cost.iteration import LAYER_TERMS, backward_overlap_s, host_bound

PLAN = ParallelPlan(tp=1, pp=1, dp=1, micro_batch_size=1, global_batch_size=1,
                    recompute="full", precision="bf16")


def flow_shop_s(passes, ops_per_pass: int = 400) -> float:
    """Makespan (s) of ``passes`` ``[(host_s, gpu_s), ...]`` run in order, each cut into
    ``ops_per_pass`` equal operations: the host issues them one after another, the GPU runs
    an operation once it is issued and the one before it has finished."""
    host_end = gpu_end = 0.0
    for h, g in passes:
        for _ in range(ops_per_pass):
            host_end += h / ops_per_pass
            gpu_end = max(gpu_end, host_end) + g / ops_per_pass
    return max(gpu_end, host_end)


def _layer(host_fwd_s, gpu_bwd_s, gpu_rc_s, checkpoint_b_s, plan=PLAN):
    """:func:`host_bound` of one layer whose forward costs the GPU nothing: its backward's
    GPU seconds (the backward proper; the re-run forward's) and the host's."""
    c = PlanBatch.from_plan(plan)
    zero = np.zeros(1)
    t = {k: zero for k in LAYER_TERMS}
    t = dict(t, bwd=np.array([gpu_bwd_s]), recompute=np.array([gpu_rc_s]))
    return host_bound(c, t, np.array([host_fwd_s]), checkpoint=(0.0, checkpoint_b_s))


def test_the_logits_hidden_never_exceed_their_own_seconds():
    """The logits' backward that the layers' makespan hides is at most its own seconds and
    never negative, to the last bit: where it hides whole, ``L + layers − layers`` may round
    above ``L``, and the chunk left with ``L`` less it went negative (a search on a fuzzed
    model, the last chunk holding only the loss, failed the schedule's non-negative check)."""
    rng = np.random.default_rng(7)
    for _ in range(2000):
        host, gpu_b, gpu_rc = rng.uniform(1e-4, 1e-2, 3)
        layers = rng.integers(1, 40)
        logits = rng.uniform(1e-6, 1e-3)
        lay = _layer(host, gpu_b, gpu_rc, 0.0)
        types = {"dense": lay, "moe": lay}
        hidden = backward_overlap_s(types, np.array([float(layers)]), np.array([0.0]),
                                    np.array([logits]))[2]
        assert 0.0 <= float(hidden[0]) <= logits


@pytest.mark.parametrize("seed", range(12))
def test_the_closed_form_is_the_flow_shops_makespan(seed):
    """Random layers (host-bound, GPU-bound or mixed passes), 1-12 of them, with and without
    the logits first: the backward's time, its passes' own times less what the stretch
    saves, equals the flow shop's makespan over the same passes."""
    rng = np.random.default_rng(seed)
    host, g_b, g_rc, ck = rng.uniform(0.2e-3, 2e-3, size=4)
    ck *= 0.1
    n = int(rng.integers(1, 13))
    logits = float(rng.choice([0.0, rng.uniform(0.5e-3, 10e-3)]))
    layer = _layer(host, g_b, g_rc, ck)
    types = {"dense": layer, "moe": layer}
    compute, recompute, hidden = backward_overlap_s(types, np.array([n]), np.array([0]),
                                                    logits)
    saved = float((compute + recompute + hidden)[0])
    h_rc, h_b = host + ck, HOST_BACKWARD_FACTOR * host
    each = max(h_rc, g_rc) + max(h_b, g_b)
    priced = logits + n * each - saved
    passes = [(0.0, logits)] + [(h_rc, g_rc), (h_b, g_b)] * n
    assert priced == pytest.approx(flow_shop_s(passes), rel=2e-3)
    assert 0.0 <= saved <= n * float(layer["hb_wait"][0]) + 1e-15
    assert 0.0 <= float(hidden[0]) <= logits


def test_one_bound_throughout_saves_only_the_logits():
    """Every pass host-bound: the logits run in the GPU's idle time, nothing else moves;
    every pass GPU-bound: nothing is saved."""
    host_bound_layer = _layer(1e-3, 0.1e-3, 0.1e-3, 0.0)
    types = {"dense": host_bound_layer, "moe": host_bound_layer}
    waits = 6 * float(host_bound_layer["hb_wait"][0])
    for logits in (0.0, 1e-3, 1.0):
        compute, recompute, hidden = backward_overlap_s(types, np.array([6]), np.array([0]),
                                                        logits)
        assert float(compute[0]) == float(recompute[0]) == 0.0
        assert float(hidden[0]) == pytest.approx(min(logits, waits))
    gpu_bound = _layer(0.1e-3, 2e-3, 2e-3, 0.0)
    types = {"dense": gpu_bound, "moe": gpu_bound}
    assert float(sum(backward_overlap_s(types, np.array([6]), np.array([0]), 1e-3))[0]) == 0.0


def test_the_saving_leaves_the_recompute_and_the_backward_their_own_waits():
    """A host-bound re-run forward beside a GPU-bound backward: what is saved comes off the
    recompute term (the only waits), never more than its waits."""
    layer = _layer(1e-3, 2e-3, 0.5e-3, 0.0)
    types = {"dense": layer, "moe": layer}
    compute, recompute = backward_overlap_s(types, np.array([6]), np.array([0]))
    assert float(compute[0]) == 0.0
    assert 0.0 < float(recompute[0]) <= 6 * float(layer["hb_wait_rc"][0])


def test_the_gradient_reduction_hides_under_the_backward_as_it_runs(monkeypatch):
    """The window the gradient reduction hides under is the last microbatch's backward as it
    runs, the stretch's length: the layers' backward, recompute and tensor-parallel terms less
    what :func:`backward_overlap_s` saves on them, in the closed form and in the placed
    schedule alike. The plan (24 layers of hidden 1,024 at mbs 4 on A100s, full recompute,
    dp 4 with the reduction overlapped) saves a good share of its backward that way."""
    import configurator.cost.iteration as it
    import configurator.cost.placed as placed
    from configurator.core.model_presets import make_model
    from configurator.cost.communication import comm_figures, expert_comm_figures
    from configurator.cost.compute import layer_costs
    from configurator.search.evaluate import evaluate_plan
    from topology.cluster_files import load_cluster

    model = make_model(name="gpt-h1024-l24", num_layers=24, hidden_size=1024,
                       num_attention_heads=16, vocab_size=51200, seq_length=1024)
    plan = ParallelPlan(tp=2, pp=1, dp=4, micro_batch_size=4, global_batch_size=32,
                        recompute="full", precision="fp16", attention_backend="local",
                        sequence_parallel=False, distributed_optimizer=False,
                        overlap_grad_reduce=True, overlap_param_gather=False)
    cluster = load_cluster("dgx-a100-80gb", 1)
    c = PlanBatch.from_plan(plan)
    comm = dict(comm_figures(cluster, c), **expert_comm_figures(cluster, c))
    types = it.layer_type_times(model, c, layer_costs(model, c, cluster.gpu, None), comm)
    t = it.layers_terms_s(types, 24, 0)
    saved = float(np.ravel(sum(backward_overlap_s(types, 24, 0)))[0])
    passes = float(np.ravel(t["bwd"] + t["recompute"] + t["tp_f"] + t["tp_b"])[0])
    assert saved > 0.05 * passes
    seen = []
    for module in (it, placed):
        real = module.dp_exposed_s

        def spy(*args, _real=real, **kw):
            seen.append(np.ravel(kw["bwd_window_s"]).astype(float))
            return _real(*args, **kw)
        monkeypatch.setattr(module, "dp_exposed_s", spy)
    it.iteration_time(model, cluster, c)
    evaluate_plan(model, cluster, plan)
    assert len(seen) >= 2
    for window in seen:
        np.testing.assert_allclose(window, passes - saved, rtol=1e-9)
