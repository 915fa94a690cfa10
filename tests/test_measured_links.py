"""A measured topology laid over a cluster without building its link graph
(:class:`topology.measured_links.MeasuredLinks`): every figure is the one the built graph
gives, and nothing grows with the square of the host count."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from configurator.core.model_presets import load_model
from configurator.core.units import GB, US
from configurator.cost.placed import PlacedPlan
from configurator.search import engine, rank
from configurator.search.placement_search import host_health_order
from topology.cluster_files import load_cluster
from topology.group_figures import host_ring_figures, ring_figures
from topology.link_table import _median_with_copies
from topology.topofile import LinkMeasurement, Topology, apply_topology
from configurator.core.plan_batch import PlanBatch


def _link(src, dst, bw_GBps, src_gpu=None, dst_gpu=None, **kw):
    base = dict(src=src, dst=dst, src_gpu=src_gpu, dst_gpu=dst_gpu, bandwidth_Bps=bw_GBps * GB,
                latency_s=kw.pop("latency_s", None), link_class="network",
                message_bytes=1 << 30, method="nccl-tests sendrecv_perf", timestamp=None,
                gpus_per_host=1, rails_used=1)
    base.update(kw)
    return LinkMeasurement(**base)


def ring_topology(n_hosts: int, seed: int, *, nic_pairs: int = 0, nvlink_pairs: int = 0,
                  extra_hosts: int = 0) -> Topology:
    """Host-level records between ring neighbours (both ways, random rates and latencies),
    ``nic_pairs`` rail-level records between random hosts, ``nvlink_pairs`` GPU pairs inside
    random hosts, and ``extra_hosts`` hosts with no record at all."""
    rng = np.random.default_rng(seed)
    hosts = tuple(f"h{i:03d}" for i in range(n_hosts + extra_hosts))
    links = []
    for i in range(n_hosts):
        for a, b in ((i, (i + 1) % n_hosts), ((i + 1) % n_hosts, i)):
            links.append(_link(hosts[a], hosts[b], float(rng.uniform(10, 48)),
                               latency_s=float(rng.uniform(5, 20)) * US))
    for _ in range(nic_pairs):
        a, b = rng.choice(n_hosts, 2, replace=False)
        k = int(rng.integers(8))
        links.append(_link(hosts[a], hosts[b], float(rng.uniform(5, 40)), k, k))
    for _ in range(nvlink_pairs):
        h = hosts[int(rng.integers(n_hosts))]
        i, j = rng.choice(8, 2, replace=False)
        links.append(_link(h, h, float(rng.uniform(100, 400)), int(i), int(j),
                           link_class="nvlink"))
    return Topology(hosts=hosts, gpus_per_host=8, links=tuple(links))


def sparse_and_built(topo: Topology, preset: str = "dgx-h100-80gb"):
    """The same measured cluster twice: kept sparse, and with its graph built."""
    base = load_cluster(preset, len(topo.hosts))
    sparse, built = apply_topology(base, topo), apply_topology(base, topo)
    _ = built.graph
    assert not sparse.graph_built and built.graph_built and built.measured_links is None
    return sparse, built


CASES = [dict(n_hosts=9, seed=1), dict(n_hosts=7, seed=2, nic_pairs=5, nvlink_pairs=6),
         dict(n_hosts=6, seed=3, extra_hosts=2)]


@pytest.mark.parametrize("case", CASES)
def test_every_link_as_the_built_graph_gives_it(case):
    sparse, built = sparse_and_built(ring_topology(**case))
    n = sparse.num_gpus
    a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    a, b = a.reshape(-1), b.reshape(-1)
    keep = a != b
    a, b = a[keep], b[keep]
    want = np.array([built.link(int(x), int(y)) for x, y in zip(a, b)])
    got = np.array([sparse.link(int(x), int(y)) for x, y in zip(a, b)])
    assert np.array_equal(got, want)
    for cl in (sparse, built):
        bw, lat = cl.link_table().links(a, b)
        assert np.array_equal(bw, want[:, 0]) and np.array_equal(lat, want[:, 1])
        bw, lat = cl.links(a, b)
        assert np.array_equal(bw, want[:, 0]) and np.array_equal(lat, want[:, 1])
    assert sparse.has_measured_links and not sparse.is_uniform
    assert np.array_equal(sparse.graph_facts().special, built.graph_facts().special)


def test_nvl72_domains_keep_their_switch_path():
    topo = ring_topology(36, seed=4)
    sparse, built = sparse_and_built(topo, "gb200-nvl72")
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, sparse.num_gpus, (2, 3000))
    for x, y in zip(a.tolist(), b.tolist()):
        if x != y:
            assert sparse.link(x, y) == built.link(x, y)


@pytest.mark.parametrize("case", CASES)
def test_group_figures_subset_and_health_order_as_the_built_graph(case):
    sparse, built = sparse_and_built(ring_topology(**case))
    n = sparse.num_gpus
    for stride, size in ((1, 8), (8, n // 8), (2, 4), (16, 2), (4, n // 16)):
        world = n // (stride * size) * stride * size
        if world and size > 1:
            assert sparse.group_busbw(stride, size, world) == built.group_busbw(stride, size,
                                                                                 world)
            assert np.array_equal(sparse.p2p_boundaries(stride, size, world),
                                  built.p2p_boundaries(stride, size, world))
    pool = list(range(sparse.num_nodes))
    assert host_health_order(sparse, pool) == host_health_order(built, pool)
    idx = [3, 0, 5, 1]
    s, b = sparse.subset(idx), built.subset(idx)
    assert not s.graph_built
    for x in range(s.num_gpus):
        for y in range(s.num_gpus):
            if x != y:
                assert s.link(x, y) == b.link(x, y)


def test_imputed_pairs_are_the_median_of_the_measured_ones():
    topo = ring_topology(6, seed=5)
    sparse, built = sparse_and_built(topo)
    per_rail = [l.bandwidth_Bps for l in topo.links]
    want = statistics.median(per_rail)
    assert sparse.link(0, 3 * 8)[0] == pytest.approx(want)      # hosts 0 and 3: no record
    assert built.graph.edges["h000", "h003"]["imputed"]
    m = sparse.measured_links
    assert len(m.edges) == len(topo.links)                       # no pair written out
    t = sparse.link_table()
    medians = t.host_bandwidth_medians(range(6))
    g = built.graph
    for h, name in enumerate(sparse.hosts):
        vals = [d["bandwidth_Bps"] for u, w, d in g.edges(data=True)
                if g.nodes[u].get("kind") == g.nodes[w].get("kind") == "host"
                and name in (u, w)]
        assert medians[h] == statistics.median(vals)


def test_median_with_copies_is_the_median_of_the_whole_list():
    rng = np.random.default_rng(6)
    for _ in range(200):
        vals = np.sort(rng.integers(0, 10, int(rng.integers(0, 7))).astype(float))
        v, k = float(rng.integers(0, 10)), int(rng.integers(0, 5))
        whole = list(vals) + [v] * k
        assert _median_with_copies(vals, v, k) == (statistics.median(whole) if whole
                                                   else None)


def test_host_ring_figures_are_ring_figures():
    sparse, _ = sparse_and_built(ring_topology(8, seed=7))
    t = sparse.link_table()
    assert t.host_level
    rng = np.random.default_rng(8)
    for n in (2, 4, 8, 16):
        rows = np.concatenate([np.arange(64).reshape(-1, n),            # inside hosts
                               np.arange(64).reshape(n, -1).T,         # rails repeat
                               np.stack([rng.permutation(64)[:n] for _ in range(20)])])
        want = ring_figures(rows, t.links, sparse.gpu_domains)
        got = host_ring_figures(rows, t.links, sparse.gpu_domains, t)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_host_level_only_where_links_depend_on_hosts_alone():
    assert not sparse_and_built(ring_topology(5, 9, nvlink_pairs=1))[0].link_table().host_level
    assert not sparse_and_built(ring_topology(5, 9, nic_pairs=1))[0].link_table().host_level
    assert sparse_and_built(ring_topology(5, 9))[0].link_table().host_level


def test_search_in_slices_and_replicas_in_slices_change_nothing(monkeypatch):
    model = load_model("llama3-8b")
    sparse, _ = sparse_and_built(ring_topology(8, seed=10))
    whole = rank.search(model, sparse, 512, keep_ranking=True)
    monkeypatch.setattr(engine, "CHUNK_CANDIDATES", 97)
    sliced = rank.search(model, sparse, 512, keep_ranking=True)
    assert np.array_equal(whole.ranked_time_s, sliced.ranked_time_s)
    assert [e.iteration_time_s for e in whole.plans] == [e.iteration_time_s
                                                         for e in sliced.plans]
    plan = whole.plans[0].plan
    priced = PlacedPlan(model, sparse, PlanBatch.from_plan(plan))
    rng = np.random.default_rng(11)
    placements = [(rng.permutation(8), np.array([rng.permutation(8) for _ in range(8)]))
                  for _ in range(5)]
    want = priced.times(placements)
    import configurator.cost.schedule_sim as schedule_sim
    monkeypatch.setattr(schedule_sim, "MAX_CELLS", 1)
    assert np.array_equal(priced.times(placements), want)
    assert not sparse.graph_built


def test_thousands_of_hosts_stay_sparse():
    """4,096 hosts measured ring-wise: 8,192 records and 16.8 M host pairs; the pairs are
    not written out and the search never builds the graph."""
    topo = ring_topology(4096, seed=12)
    cl = apply_topology(load_cluster("dgx-h100-80gb", 4096), topo)
    m = cl.measured_links
    assert len(m.edges) == 8192 and m.imputed is not None and m.imputed_hosts.all()
    res = rank.search(load_model("llama3-70b"), cl, 8192, top_k=3)
    assert res.plans and not cl.graph_built
