"""The probe's schedule (circle method), step plan and result → Topology conversion (no torch)."""

from itertools import combinations

import pytest

from topology.probe_plan import (INTER_LINK_CLASS, INTRA_LINK_CLASS, Step, build_topology,
                                 circle_rounds, describe_transfer, missing_for, plan_steps)


@pytest.mark.parametrize("n", range(2, 18))
def test_circle_every_pair_once_in_disjoint_rounds(n):
    rounds = circle_rounds(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [p for r in rounds for p in r]
    assert sorted(seen) == list(combinations(range(n), 2))  # every pair exactly once
    for r in rounds:
        members = [x for p in r for x in p]
        assert len(members) == len(set(members))            # disjoint within a round
        assert len(r) == n // 2                               # all busy but the bye
        assert all(a < b for a, b in r)


@pytest.mark.parametrize("n", [3, 5, 7, 9])
def test_circle_odd_gives_each_node_one_bye(n):
    idle = [set(range(n)) - {x for p in r for x in p} for r in circle_rounds(n)]
    assert all(len(s) == 1 for s in idle)
    assert sorted(x for s in idle for x in s) == list(range(n))


def test_circle_small_and_bad():
    assert circle_rounds(0) == [] and circle_rounds(1) == []
    assert circle_rounds(2) == [[(0, 1)]]
    with pytest.raises(ValueError):
        circle_rounds(-1)


def _participants(step):
    return [r for t in step.transfers for r in t] + [r for g in step.groups for r in g]


@pytest.mark.parametrize("nodes,G,nccl", [(4, 1, False), (3, 2, False), (2, 4, True),
                                           (5, 3, True), (1, 4, True), (1, 1, False)])
def test_plan_steps_cover_everything_without_sharing_a_rank(nodes, G, nccl):
    steps = plan_steps(nodes, G, intra_p2p=nccl)
    for s in steps:
        ranks = _participants(s)
        assert len(ranks) == len(set(ranks)), s.name          # one role per rank and step
        assert all(0 <= r < nodes * G for r in ranks)
    by_kind = {}
    for s in steps:
        by_kind.setdefault(s.kind, []).extend(s.transfers)
    # host level: local rank 0 of every ordered node pair, once
    host = sorted((s // G, d // G) for s, d in by_kind.get("host", []))
    assert host == sorted((a, b) for a in range(nodes) for b in range(nodes) if a != b)
    assert all(s % G == 0 and d % G == 0 for s, d in by_kind.get("host", []))
    # rails: rail i of every ordered node pair, once, only with G > 1
    rail = sorted((s // G, d // G, s % G) for s, d in by_kind.get("rail", []))
    want = sorted((a, b, i) for a in range(nodes) for b in range(nodes) if a != b
                  for i in range(G)) if G > 1 else []
    assert rail == want
    assert all(s % G == d % G for s, d in by_kind.get("rail", []))
    # intra: every ordered local pair on every node, NCCL only
    intra = sorted((s // G, s % G, d % G) for s, d in by_kind.get("intra", []))
    want = sorted((h, i, j) for h in range(nodes) for i in range(G) for j in range(G)
                  if i != j) if nccl else []
    assert intra == want
    assert all(s // G == d // G for s, d in by_kind.get("intra", []))
    ar = [s for s in steps if s.kind == "all_reduce"]
    assert len(ar) == (1 if G > 1 else 0)
    if ar:
        assert ar[0].groups == tuple(tuple(range(h * G, h * G + G)) for h in range(nodes))


def test_host_rounds_measure_both_directions_in_consecutive_steps():
    steps = [s for s in plan_steps(4, 1, False) if s.kind == "host"]
    assert len(steps) == 2 * 3
    for fwd, bwd in zip(steps[::2], steps[1::2]):
        assert sorted(fwd.transfers) == sorted((d, s) for s, d in bwd.transfers)
        assert len(fwd.transfers) == 2                         # 2 disjoint pairs at once


def test_step_roles_and_reporters():
    s = Step("x", "host", ((0, 2), (3, 1)))
    assert s.role(0) == ("send", 2) and s.role(2) == ("recv", 0)
    assert s.role(1) == ("recv", 3) and s.role(4) is None
    assert s.reporters() == (2, 1)
    g = Step("ar", "all_reduce", groups=((0, 1), (2, 3)))
    assert g.role(3) == ("group", (2, 3)) and g.reporters() == (0, 2)


def test_build_topology_records():
    hosts, G = ["a", "b"], 2
    steps = plan_steps(2, G, intra_p2p=True)
    results = {}
    for k, s in enumerate(steps):
        for src, dst in s.transfers:
            results[(k, dst)] = {"samples_Bps": [3e9, 1e9, 2e9], "latency_s": 5e-6}
        for grp in s.groups:
            results[(k, grp[0])] = {"busbw_samples_Bps": [4e9, 6e9, 5e9]}
    # one transfer without a result is left out (its caller lists it as missing)
    first_host = next(k for k, s in enumerate(steps) if s.kind == "host")
    del results[(first_host, steps[first_host].transfers[0][1])]
    topo = build_topology(hosts=hosts, gpus_per_node=G, steps=steps, results=results,
                          backend="nccl", message_bytes=32_000_000, timestamp="t")
    assert topo.hosts == ("a", "b") and topo.gpus_per_host == 2
    intra = [l for l in topo.links if l.src == l.dst]
    assert len(intra) == 2 * 2 and all(l.link_class == INTRA_LINK_CLASS for l in intra)
    host = [l for l in topo.links if l.src != l.dst and l.src_gpu is None]
    assert len(host) == 1                                       # 2 directions, 1 lost
    assert host[0].gpus_per_host == 1 and host[0].rails_used == 1
    rail = [l for l in topo.links if l.src != l.dst and l.src_gpu is not None]
    assert {(l.src, l.dst, l.src_gpu, l.dst_gpu) for l in rail} == {
        ("a", "b", 0, 0), ("a", "b", 1, 1), ("b", "a", 0, 0), ("b", "a", 1, 1)}
    assert all(l.gpus_per_host == 2 and l.link_class == INTER_LINK_CLASS for l in rail)
    for l in topo.links:
        assert l.bandwidth_Bps == 2e9                           # median of the samples
        assert l.samples_Bps == (3e9, 1e9, 2e9) and l.latency_s == 5e-6
        assert l.method == "probe nccl send/recv" and l.message_bytes == 32_000_000
    assert [(c.hosts, c.busbw_Bps, c.gpus_per_host) for c in topo.collectives] == [
        (("a",), 5e9, 2), (("b",), 5e9, 2)]


def test_missing_and_description():
    hosts, G = ["a", "b", "c"], 2
    step = [s for s in plan_steps(3, G, False) if s.kind == "rail"][0]
    s0, d0 = step.transfers[0]
    assert describe_transfer(step, s0, d0, hosts, G) == \
        f"{hosts[s0 // G]}/gpu{s0 % G} -> {hosts[d0 // G]}/gpu{d0 % G}"
    host_step = [s for s in plan_steps(3, G, False) if s.kind == "host"][0]
    hs, hd = host_step.transfers[0]
    assert describe_transfer(host_step, hs, hd, hosts, G) == f"{hosts[hs // 2]} -> {hosts[hd // 2]}"
    done = {d for _, d in step.transfers[1:]}                   # all but the first reported
    miss = missing_for(step, done, hosts, G, "why")
    assert [(m.src, m.dst, m.reason) for m in miss] == [(hosts[s0 // G], hosts[d0 // G], "why")]
    ar = Step("ar", "all_reduce", groups=((0, 1), (2, 3)))
    assert [(m.src, m.dst) for m in missing_for(ar, {0}, hosts, G, "r")] == [("b", "b")]
