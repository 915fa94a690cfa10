"""Heterogeneous clusters with measured links, for the placement tests and benches
(``python -m bench.placement.optimiser``, ``python -m bench.speed.simulator``).

Built like :func:`topology.topofile.apply_topology` builds a measured cluster: a DGX H100
preset whose host→host edges (per direction, per rail) carry measured rates, and optionally
direct GPU→GPU NVLink edges with their own rates.
"""

from __future__ import annotations

import numpy as np

from topology.cluster_files import load_cluster


def measured_cluster(hosts: int, gpus: int, seed: int, *, slow_links: float = 0.1,
                     slow_hosts: int = 1, gpu_spread: float = 0.0, preset: str = "dgx-h100-80gb"):
    """``hosts`` hosts of ``gpus`` GPUs; every ordered host pair measured: lognormal (σ 5 %)
    around the preset's attained per-rail rate, a fraction ``slow_links`` of the pairs (both
    directions independently) at 25–50 % of it, and ``slow_hosts`` random hosts at 40 % on
    every link. ``gpu_spread`` > 0: every ordered NVLink pair measured, lognormal with that
    σ around the attained NVLink rate. Deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    cl = load_cluster(preset, hosts)
    if gpus != cl.gpus_per_node:
        from topology.cluster import build_cluster

        cl = build_cluster(name=cl.name, gpu=cl.gpu, gpus_per_node=gpus,
                           hosts=[f"node{i:04d}" for i in range(hosts)], **cl.spec)
    g = cl.graph
    spec = cl.spec
    inter = spec["inter_bandwidth_Bps"] * spec["inter_efficiency"]
    intra = spec["intra_bandwidth_Bps"] * spec["intra_efficiency"]
    lat = spec["inter_latency_s"] / 2
    slow = set(rng.choice(hosts, size=min(slow_hosts, hosts), replace=False).tolist())
    for a in range(hosts):
        for b in range(hosts):
            if a == b:
                continue
            bw = inter * float(np.exp(rng.normal(0.0, 0.05)))
            if rng.random() < slow_links:
                bw *= float(rng.uniform(0.25, 0.5))
            if a in slow or b in slow:
                bw *= 0.4
            g.add_edge(cl.hosts[a], cl.hosts[b], bandwidth_Bps=min(bw, inter),
                       nominal_bandwidth_Bps=spec["inter_bandwidth_Bps"], latency_s=lat,
                       link_class="network", measured=True)
    if gpu_spread > 0:
        for h in cl.hosts:
            for i in range(gpus):
                for j in range(gpus):
                    if i != j:
                        g.add_edge(f"{h}/gpu{i}", f"{h}/gpu{j}",
                                   bandwidth_Bps=intra * float(np.exp(rng.normal(0, gpu_spread))),
                                   nominal_bandwidth_Bps=spec["intra_bandwidth_Bps"],
                                   latency_s=spec["intra_latency_s"], link_class="nvlink",
                                   measured=True)
    cl.invalidate()
    return cl


#: (model, cluster preset, nodes, tp) of the closed-form agreement grid.
AGREEMENT_MODELS = (("gpt3-175b", "dgx-a100-80gb", 64, 8), ("llama3-70b", "dgx-h100-80gb", 32, 4),
                    ("llama3-8b", "dgx-h100-80gb", 8, 1))


def assert_links_agree(cl, a: np.ndarray, b: np.ndarray) -> None:
    """The link table's vectorised lookup of the pairs ``a[i] → b[i]`` equals
    :meth:`Cluster.link` asked one pair at a time."""
    bw, lat = cl.link_table().links(a, b)
    ref = np.array([cl.link(int(x), int(y)) for x, y in zip(a, b)])
    np.testing.assert_array_equal(bw, ref[:, 0])
    np.testing.assert_allclose(lat, ref[:, 1], rtol=1e-12)


def closed_form_agreement(name: str, cluster: str, nodes: int, tp: int):
    """The simulated schedule (Megatron's order on the uniform preset cluster) against the
    closed form over pp ∈ {1, 2, 4, 8, 16}, vp ∈ {1, 2, 4} and m ∈ {1, 4, 16}·pp (every legal
    combination, full recompute): ``(worst relative gap, where, plans checked)``."""
    from configurator.core.plan_batch import PlanBatch
    from configurator.core.model_presets import load_model
    from configurator.core.rules import plan_for_world
    from configurator.cost.iteration import iteration_time
    from configurator.cost.placed import PlacedPlan

    model = load_model(name)
    cl = load_cluster(cluster, nodes)
    world = nodes * cl.gpus_per_node
    worst, at, checked = 0.0, "", 0
    for pp in (1, 2, 4, 8, 16):
        for vp in (1, 2, 4):
            if (vp > 1 and pp == 1) or model.num_layers % (pp * vp):
                continue
            dp = world // (tp * pp)
            for mult in (1, 4, 16):
                plan = plan_for_world(dict(tp=tp, pp=pp, cp=1, vp=vp, micro_batch_size=1,
                                           global_batch_size=mult * pp * dp, recompute="full",
                                           precision="bf16", attention_backend="auto"), world)
                closed = float(iteration_time(model, cl, PlanBatch.from_plan(plan))
                               ["iteration_time_s"][0])
                priced = PlacedPlan(model, cl, PlanBatch.from_plan(plan))
                gap = abs(priced.time(*priced.default_placement()).iteration_time_s / closed - 1)
                checked += 1
                if gap > worst:
                    worst, at = gap, f"pp {pp}, vp {vp}, m {mult * pp}"
    return worst, at, checked
