"""The search scales: group figures of a uniform cluster come from the groups' shape, bit for
bit what walking every hop of every group gives; the graph is built only when asked for;
measured clusters and other placements still walk every hop (vectorised), with the same
numbers as :meth:`Cluster.ring_busbw` / :meth:`Cluster.link` group by group."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest

from configurator.core.model_presets import load_model
from configurator.core.units import GB, US
from configurator.search.rank import search
from topology.cluster import build_cluster
from topology.cluster_files import load_cluster
from topology.group_figures import uniform_group_shape
from topology.gpus import gpu_from_config
from topology.rank_order import Placement, rank_groups
from topology.topofile import LinkMeasurement, Topology, apply_topology

INF = float("inf")


# -- the slow reference: every group, every hop --------------------------------------------

def slow_group_busbw(cl, stride, size, world):
    res = (INF, 0.0)
    if size < 2:
        return res
    for g in rank_groups(stride, size, world):
        b, l = cl.ring_busbw([cl.placement.gpu_index(r) for r in g])
        res = (min(res[0], b), max(res[1], l))
    return res


def slow_p2p_worst(cl, stride, size, world):
    res = (INF, 0.0)
    if size < 2:
        return res
    for g in rank_groups(stride, size, world):
        g = [cl.placement.gpu_index(r) for r in g]
        for a, b in zip(g, g[1:]):
            for x, y in ((a, b), (b, a)):
                bw, l = cl.link(x, y)
                res = (min(res[0], bw), max(res[1], l))
    return res


def shapes(world):
    """Every (stride, size) whose blocks tile ``world``, sizes 1 … world."""
    divs = [d for d in range(1, world + 1) if world % d == 0]
    return [(stride, size) for block in divs for size in divs if block % size == 0
            for stride in [block // size]]


def cluster(gpn, nodes, intra_GBps=450.0, inter_GBps=50.0, intra_us=3.0, inter_us=6.0,
            eff=(370 / 450, 46.5 / 50)):
    gpu = gpu_from_config("h100-80gb")
    return build_cluster(name=f"t{gpn}x{nodes}", gpu=gpu, gpus_per_node=gpn,
                         hosts=[f"n{i}" for i in range(nodes)],
                         intra_bandwidth_Bps=intra_GBps * GB, inter_bandwidth_Bps=inter_GBps * GB,
                         intra_latency_s=intra_us * US, inter_latency_s=inter_us * US,
                         intra_efficiency=eff[0], inter_efficiency=eff[1])


# Link figures that make each hop kind the slowest somewhere: a DGX H100; NVLink slower than
# two rails; a slower NVLink latency than the network's; rail sums that round.
LINKS = [dict(),
         dict(intra_GBps=70.0, inter_GBps=33.3, eff=(0.77, 0.9399)),
         dict(intra_GBps=300.0, inter_GBps=25.0, intra_us=9.0, inter_us=2.0, eff=(0.7, 0.1)),
         dict(intra_GBps=1.0, inter_GBps=0.3, eff=(1 / 3, 0.7)),
         # k rails summed one by one differ from k × one rail here for k = 6, 7, 8
         dict(intra_GBps=1000.0, inter_GBps=33.3, eff=(0.9, 0.987654321))]
GRID = [(1, 1), (1, 2), (1, 6), (2, 1), (2, 3), (2, 8), (3, 4), (4, 1), (4, 2), (4, 6),
        (6, 2), (6, 4), (8, 1), (8, 2), (8, 3), (8, 6), (16, 3)]


@pytest.mark.parametrize("links", range(len(LINKS)))
@pytest.mark.parametrize("gpn,nodes", GRID)
def test_uniform_shortcut_is_bit_identical_to_walking_every_hop(gpn, nodes, links):
    """group_busbw and p2p_worst, shortcut (no graph built) and hop by hop (vectorised and
    group by group), for every shape tiling every world that divides the cluster: equal with
    ``==``, not approx. Includes groups straddling hosts (tp=6 on 8-GPU nodes, tp=4 on 6)."""
    fast, ref = cluster(gpn, nodes, **LINKS[links]), cluster(gpn, nodes, **LINKS[links])
    _ = ref.graph                                  # graph built: link() reads edges
    n = gpn * nodes
    for world in [w for w in range(1, n + 1) if n % w == 0]:
        for stride, size in shapes(world):
            want = slow_group_busbw(ref, stride, size, world)
            assert fast.group_busbw(stride, size, world) == want, (stride, size, world)
            assert ref.group_busbw(stride, size, world) == want  # uniform graph: shortcut too
            if size >= 2:
                hop = fast._hop_group_busbw(fast._group_gpus(stride, size, world))
                assert hop == want, (stride, size, world)
            want = slow_p2p_worst(ref, stride, size, world)
            assert fast.p2p_worst(stride, size, world) == want, (stride, size, world)
    assert not fast.graph_built and ref.is_uniform and not ref.has_measured_links


def test_straddling_groups_partial_worlds():
    """Worlds that are not the whole cluster, and tp=6 / tp=3 straddling 8-GPU hosts."""
    fast, ref = cluster(8, 6), cluster(8, 6)
    _ = ref.graph
    for stride, size, world in [(1, 6, 12), (1, 6, 24), (1, 3, 24), (3, 2, 24), (6, 4, 48),
                                (1, 12, 36), (2, 6, 36), (5, 3, 45), (7, 2, 42), (3, 5, 45)]:
        assert fast.group_busbw(stride, size, world) == slow_group_busbw(ref, stride, size, world)
        assert fast.p2p_worst(stride, size, world) == slow_p2p_worst(ref, stride, size, world)


def brute_shape(stride, size, world, gpn):
    intra = inter = False
    k = None
    for g in rank_groups(stride, size, world):
        counts: dict[int, int] = {}
        for r in g:
            counts[r // gpn] = counts.get(r // gpn, 0) + 1
        intra = intra or max(counts.values()) >= 2
        if len(counts) > 1:
            inter = True
            k = min(counts.values()) if k is None else min(k, min(counts.values()))
    return intra, inter, (k or 0)


def test_shape_features_against_counting_members():
    """uniform_group_shape against counting each group's members per host, on hosts up to
    128 GPUs and strides that do and do not divide the host size."""
    cases = 0
    for gpn in (1, 2, 3, 4, 5, 8, 12, 16, 128):
        for stride in sorted({1, 2, 3, 5, 7, 8, 12, gpn - 1, gpn, gpn + 1, 2 * gpn + 3} - {0}):
            for size in (2, 3, 4, 5, 9, 17, 40):
                block = stride * size
                for world in sorted({block, 2 * block, 3 * block, math.lcm(block, gpn),
                                     2 * math.lcm(block, gpn)}):
                    if world > 40_000:
                        continue
                    got = uniform_group_shape(stride, size, world, gpn)
                    assert got == brute_shape(stride, size, world, gpn), (stride, size, world,
                                                                         gpn)
                    cases += 1
    assert cases > 1000


# -- measured links and other placements walk every hop ------------------------------------

def _measured(gpn=4, nodes=6):
    base = cluster(gpn, nodes)
    hosts = tuple(base.hosts[:4])

    def lk(src, dst, GBps, **kw):
        rec = dict(src=src, dst=dst, src_gpu=None, dst_gpu=None, bandwidth_Bps=GBps * GB,
                   latency_s=None, link_class="network", message_bytes=1 << 25,
                   method="nccl-tests sendrecv_perf busbw", timestamp=None, gpus_per_host=1)
        rec.update(kw)
        return LinkMeasurement(**rec)

    links = (lk(hosts[0], hosts[1], 9.0), lk(hosts[1], hosts[0], 11.0),
             lk(hosts[2], hosts[3], 30.0, src_gpu=1, dst_gpu=1, latency_s=20 * US),
             lk(hosts[1], hosts[1], 120.0, src_gpu=0, dst_gpu=2, link_class="nvlink"))
    return apply_topology(base, Topology(hosts=hosts, gpus_per_host=gpn, links=links))


@dataclass(frozen=True)
class ReversedHosts(Placement):
    """Node rank k on the k-th host from the end (a non-default placement)."""

    nodes: int = 1

    def gpu_of_rank(self, rank):
        host, local = divmod(rank, self.gpus_per_node)
        return self.nodes - 1 - host, local


def test_measured_cluster_walks_every_hop_with_the_same_numbers():
    cl = _measured()
    assert cl.has_measured_links and not cl.is_uniform
    n = cl.num_gpus
    for stride, size in shapes(n):
        assert cl.group_busbw(stride, size, n) == slow_group_busbw(cl, stride, size, n)
        assert cl.p2p_worst(stride, size, n) == slow_p2p_worst(cl, stride, size, n)
    # the measured pairs set the pace where they are in a group
    assert cl.group_busbw(4, 6, 24)[0] < cl.group_busbw(1, 4, 24)[0]


@pytest.mark.parametrize("measured", [False, True])
def test_non_default_placement_never_takes_the_shortcut(measured):
    cl = _measured(4, 6) if measured else cluster(4, 6)
    cl.placement = ReversedHosts(4, nodes=6)
    assert not cl.placement.is_identity and Placement(4).is_identity
    cl.invalidate()
    n = cl.num_gpus
    for stride, size in shapes(n):
        assert cl.group_busbw(stride, size, n) == slow_group_busbw(cl, stride, size, n)
        assert cl.p2p_worst(stride, size, n) == slow_p2p_worst(cl, stride, size, n)


def test_uneven_placement_order_by_first_appearance():
    """A placement that interleaves hosts within a group: ring_busbw groups members host by
    host in order of first appearance; the vectorised walk must do the same."""

    @dataclass(frozen=True)
    class Interleave(Placement):
        def gpu_of_rank(self, rank):
            block, i = divmod(rank, 2 * self.gpus_per_node)
            return 2 * block + i % 2, i // 2

    cl = cluster(4, 6, intra_GBps=20.0, inter_GBps=9.0)
    cl.placement = Interleave(4)
    cl.invalidate()
    for stride, size in shapes(24):
        assert cl.group_busbw(stride, size, 24) == slow_group_busbw(cl, stride, size, 24)
        assert cl.p2p_worst(stride, size, 24) == slow_p2p_worst(cl, stride, size, 24)


def test_edited_graph_uniform_or_not():
    """Editing every network edge alike keeps the shortcut (its figures from the graph);
    editing one host's edges makes the cluster non-uniform: every hop is walked."""
    cl = cluster(8, 4)
    for _, _, d in cl.graph.edges(data=True):
        if d["link_class"] == "network":
            d["bandwidth_Bps"] /= 4
    cl.invalidate()
    assert cl.is_uniform
    for stride, size in shapes(32):
        assert cl.group_busbw(stride, size, 32) == slow_group_busbw(cl, stride, size, 32)
    cl.graph.edges["n2/nic3", "fabric"]["bandwidth_Bps"] = 1 * GB
    cl.graph.edges["n1/gpu5", "n1/nvswitch"]["latency_s"] = 40 * US
    cl.invalidate()
    assert not cl.is_uniform and not cl.has_measured_links
    for stride, size in shapes(32):
        assert cl.group_busbw(stride, size, 32) == slow_group_busbw(cl, stride, size, 32)
        assert cl.p2p_worst(stride, size, 32) == slow_p2p_worst(cl, stride, size, 32)


# -- the graph is lazy, its figures those of the spec ----------------------------------------

@pytest.mark.parametrize("gpn", [1, 2, 8])
def test_link_from_spec_equals_link_from_graph(gpn):
    lazy, built = cluster(gpn, 3), cluster(gpn, 3)
    _ = built.graph
    n = lazy.num_gpus
    for a in range(n):
        for b in range(n):
            assert lazy.link(a, b) == built.link(a, b)
    assert not lazy.graph_built
    with pytest.raises(IndexError):
        lazy.link(0, n)
    import numpy as np
    a, b = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)
    assert [tuple(x) for x in zip(*lazy.links(a, b))] == [built.link(int(x), int(y))
                                                         for x, y in zip(a, b)]


def test_graph_built_on_first_access_as_before():
    cl = load_cluster("dgx-h100-80gb", nodes=2)
    assert not cl.graph_built
    g = cl.graph
    assert cl.graph_built and g is cl.graph
    assert g.number_of_nodes() == 1 + 2 * (2 + 2 * 8) and g.number_of_edges() == 2 * 8 * 6
    e = g.edges["node0000/gpu3", "node0000/nvswitch"]
    assert e == dict(bandwidth_Bps=450 * GB * 370 / 450, nominal_bandwidth_Bps=450 * GB,
                     latency_s=3 * US / 2, link_class="nvlink", measured=False)
    assert g.nodes["node0001/nic5"] == dict(kind="nic", host="node0001", rail=5)
    # each edge owns its attribute dict (tests edit them one by one)
    g.edges["node0000/gpu0", "node0000/nic0"]["bandwidth_Bps"] = 1.0
    assert g.edges["node0000/gpu1", "node0000/nic1"]["bandwidth_Bps"] != 1.0


def test_search_at_the_cap_builds_no_graph_and_is_quick():
    """32,768 nodes × 8 GPUs (the cap on nodes): the search never builds the graph."""
    cl = load_cluster("dgx-h100-80gb", nodes=32_768)
    t0 = time.perf_counter()
    res = search(load_model("llama3.1-405b"), cl, 16_384, top_k=3)
    elapsed = time.perf_counter() - t0
    assert res.feasible > 0 and not cl.graph_built
    assert elapsed < 30  # ~0.3 s on a laptop-class core; generous for slow CI machines
