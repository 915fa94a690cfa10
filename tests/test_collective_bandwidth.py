"""Collectives are never faster than the links they cross.

For every group figure the cost model prices a sample of plans with (dense, MoE and
context-parallel plans on preset and measured clusters), the priced bandwidth must not exceed
what the group's cut through the topology carries, computed here from the groups' members
and the cluster's single links, independently of :mod:`topology.group_figures`:

* a ring collective (all-reduce, all-gather, reduce-scatter: tp, cp, dp·cp, etp, edp) inside
  one NVLink domain: the slowest member's NVLink rate (a GPU's NVLink port, per direction);
* one that leaves a domain: for every domain it spans, the sum of its members' NIC rates
  (each GPU has one NIC, and every group of the shape runs at once, so a group can use only
  its own members' NICs: its share of the domain's NICs); the least over the domains;
* a point-to-point send (pipeline neighbours, the context-parallel p2p ring): the sender's
  single link, NVLink or its NIC;
* an all-to-all (ep): the network share at most one NIC per GPU, the NVLink share at most one
  NVLink port.

A GPU's NIC rate is the fastest it attains to any GPU of another domain, its NVLink rate the
fastest to any GPU of its own (so the bound holds on measured links, where they differ).
"""

from __future__ import annotations

import numpy as np
import pytest

from configurator.core.model_presets import load_model
from configurator.core.rules import plan_for_world
from configurator.cost.communication import comm_figures, expert_comm_figures
from configurator.core.plan_batch import PlanBatch
from configurator.search.space import enumerate_plans
from topology.cluster_files import load_cluster
from tests.conftest import REAL_CLUSTER

#: Relative slack for float round-off only.
TOL = 1e-9


def _groups(stride: int, size: int, world: int) -> np.ndarray:
    """Ranks of every group of ``size`` ranks ``stride`` apart (Megatron's rank order)."""
    out = []
    for start in range(0, world, stride * size):
        for off in range(stride):
            out.append([start + off + stride * j for j in range(size)])
    return np.array(out, dtype=np.int64)


class Cut:
    """Per-GPU port rates of a cluster and the cut capacities of groups on it."""

    def __init__(self, cluster):
        self.cl = cluster
        n = cluster.num_gpus
        dom = np.asarray(cluster.gpu_domains)
        a, b = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        bw, _ = cluster.links(a.reshape(-1), b.reshape(-1))
        bw = bw.reshape(n, n)
        same = dom[:, None] == dom[None, :]
        np.fill_diagonal(same, False)
        other = dom[:, None] != dom[None, :]
        self.dom = dom
        self.nvlink = np.where(same, bw, 0.0).max(axis=1)     # per GPU, 0 if alone
        self.nic = np.where(other, bw, 0.0).max(axis=1)       # per GPU, 0 if one domain

    def gpus(self, ranks: np.ndarray) -> np.ndarray:
        return self.cl.placement.gpu_indices(ranks)

    def ring(self, stride: int, size: int, world: int) -> float:
        """Least cut capacity (B/s) over the ring groups of this shape."""
        if size < 2:
            return float("inf")
        cap = float("inf")
        for row in self.gpus(_groups(stride, size, world)):
            doms = self.dom[row]
            if (doms == doms[0]).all():
                cap = min(cap, float(self.nvlink[row].min()))
                continue
            for d in np.unique(doms):
                members = row[doms == d]
                cap = min(cap, float(self.nic[members].sum()))
                if len(members) > 1:
                    cap = min(cap, float(self.nvlink[members].min()))
        return cap

    def sends(self, stride: int, size: int, world: int, wrap: bool) -> float:
        """Least single-send capacity over neighbours ``r → r + stride`` of the groups (both
        ways; the wrap-around ``size-1 → 0`` when ``wrap``)."""
        if size < 2:
            return float("inf")
        rows = self.gpus(_groups(stride, size, world))
        src = rows if wrap else rows[:, :-1]
        dst = np.roll(rows, -1, axis=1) if wrap else rows[:, 1:]
        cap = float("inf")
        for x, y in ((src, dst), (dst, src)):
            x, y = x.reshape(-1), y.reshape(-1)
            same = self.dom[x] == self.dom[y]
            cap = min(cap, float(np.where(same, self.nvlink[x], self.nic[x]).min()))
        return cap


    def boundaries(self, stride: int, size: int, world: int) -> np.ndarray:
        """``[2, size]`` single-send capacities of each pipeline boundary ``s → s+1``
        (index ``size-1``: the wrap-around), forward and backward: the least over the
        boundary's pairs (they send at once)."""
        rows = self.gpus(_groups(stride, size, world))            # [groups, size]
        nxt = np.roll(rows, -1, axis=1)
        out = []
        for x, y in ((rows, nxt), (nxt, rows)):
            same = self.dom[x] == self.dom[y]
            out.append(np.where(same, self.nvlink[x], self.nic[x]).min(axis=0))
        return np.array(out)

    def pipeline(self, stride: int, size: int, world: int) -> dict[str, float]:
        """Caps of the pipeline figures (:func:`configurator.cost.communication.
        pipeline_figures`): the harmonic mean of the boundaries' capacities over the path
        (no wrap-around) and the ring, the least of the end boundaries."""
        if size < 2:
            return dict.fromkeys(("pp_path_bw", "pp_ring_bw", "pp_end_bw"), float("inf"))
        b = self.boundaries(stride, size, world)
        path, ring = b[:, :-1].reshape(-1), b.reshape(-1)
        return {"pp_path_bw": path.size / float(np.sum(1 / path)),
                "pp_ring_bw": ring.size / float(np.sum(1 / ring)),
                "pp_end_bw": float(b[:, [0, size - 2]].min())}


def _check_plans(cluster, c: PlanBatch, cut: Cut) -> int:
    """Asserts every priced figure of every plan of ``c`` is within its cut; returns the
    number of figures checked."""
    comm = dict(comm_figures(cluster, c), **expert_comm_figures(cluster, c))
    checked = 0
    for i in range(len(c)):
        tp, cp, dp, pp = (int(x[i]) for x in (c.tp, c.cp, c.dp, c.pp))
        ep, etp = int(c.ep[i]), int(c.etp[i])
        world = tp * cp * dp * pp
        caps = {"tp_bw": cut.ring(1, tp, world), "cp_bw": cut.ring(tp, cp, world),
                "dp_bw": cut.ring(tp, cp * dp, world),
                "cp_hop_bw": cut.sends(tp, cp, world, wrap=True),
                "pp_bw": cut.sends(tp * cp * dp, pp, world, wrap=False),
                **cut.pipeline(tp * cp * dp, pp, world),
                "etp_bw": cut.ring(1, etp, world),
                "edp_bw": cut.ring(etp * ep, world // (etp * ep * pp), world)}
        if ep > 1:
            caps["ep_inter_bw"] = float(cut.nic.max()) if cut.nic.max() > 0 else float("inf")
            caps["ep_intra_bw"] = float(cut.nvlink.max())
        for name, cap in caps.items():
            priced = float(comm[name][i])
            assert priced <= cap * (1 + TOL), (
                f"{cluster.name} plan {c.plan(i)}: {name} priced at {priced / 1e9:.1f} GB/s "
                f"above its cut's {cap / 1e9:.1f} GB/s")
            checked += 1
    return checked


def _sample(model_name: str, world: int, gbs: int, k: int, seed: int, seq: int | None = None,
            **options) -> PlanBatch:
    model = load_model(model_name)
    if seq:
        model = model.with_seq_length(seq)
    c = enumerate_plans(model, world, gbs, **options)
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(len(c), size=min(k, len(c)), replace=False))
    return c.take(idx)


def _measured_cluster():
    from topology.importers import import_paths
    from topology.topofile import apply_topology

    topo = import_paths([str(REAL_CLUSTER / "logs")])
    return apply_topology(load_cluster("dgx-h100-80gb", len(topo.hosts)), topo)


CASES = [  # (cluster preset, nodes, model, gbs, seq)
    ("dgx-a100-80gb", 8, "gpt3-175b", 64, None),
    ("dgx-h100-80gb", 4, "llama3-8b", 8, 131072),      # context parallel over hosts
    ("dgx-h800-80gb", 8, "mixtral-8x7b", 64, None),
    ("dgx-h100-80gb", 8, "qwen3-30b-a3b", 64, None),
    ("gb200-nvl72", 36, "llama3-70b", 72, None),         # two NVL72 racks
]


@pytest.mark.parametrize("preset, nodes, model, gbs, seq", CASES)
def test_preset_collectives_within_their_cut(preset, nodes, model, gbs, seq):
    cluster = load_cluster(preset, nodes)
    c = _sample(model, cluster.num_gpus, gbs, 40, seed=nodes, seq=seq)
    assert len(c) > 10
    assert _check_plans(cluster, c, Cut(cluster)) >= 10 * len(c)


def test_measured_collectives_within_their_cut():
    """The 17-node H100 cluster's measured links (nccl-tests logs that ship with the tool)."""
    cluster = _measured_cluster()
    cut = Cut(cluster)
    for model, gbs, seq in (("llama3-70b", 136, None), ("llama3-8b", 17, 131072),
                            ("qwen3-30b-a3b", 136, None)):
        c = _sample(model, cluster.num_gpus, gbs, 15, seed=17, seq=seq)
        assert len(c) > 5
        _check_plans(cluster, c, cut)


def test_context_parallel_ring_is_priced_at_one_link():
    """tp 4 × cp 4 on two DGX H100: each cp ring holds two GPUs of each host, so its ring
    collective runs two rails (2 × 46.5 GB/s), but its p2p K/V sends go one per GPU through
    that GPU's NIC: 46.5 GB/s. The p2p step is priced at the NIC's rate."""
    cluster = load_cluster("dgx-h100-80gb", 2)
    model = load_model("llama3-8b").with_seq_length(131072)
    plan = plan_for_world(dict(tp=4, cp=4, pp=1, micro_batch_size=1, global_batch_size=1,
                               sequence_parallel=True), cluster.num_gpus)
    c = PlanBatch.from_plan(plan)
    comm = comm_figures(cluster, c)
    nic = cluster.link(0, 8)[0]
    assert float(comm["cp_bw"][0]) == pytest.approx(2 * nic)
    assert float(comm["cp_hop_bw"][0]) == pytest.approx(nic)
    assert int(comm["cp_on_node"][0]) == 2
    _check_plans(cluster, c, Cut(cluster))
