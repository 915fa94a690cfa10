"""What the audit's findings cost a job, and ``configurator plan``: from measured links to the
launch scripts in one command.

A finding's cost (:func:`price_findings`) is the change of one plan's predicted iteration
time, placed on the measured links, when the finding is repaired (its links brought to
their class's healthy level, :func:`topology.structure.repaired`) or when its host is left
out. Each variant is priced with the plan's own placement and with a short placement search
from there (seeded), the better of the two, so a repair never reads as a loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from configurator.core.errors import InputError
from topology.structure import count_findings

#: Placements searched per priced variant (a finding repaired, a host left out).
VARIANT_EVALUATIONS = 30
#: Random placements behind each placed plan's random median in ``plan`` (the search's
#: own default is 100; the report shows the optimised and Megatron's order).
PLAN_RANDOM_PLACEMENTS = 20
#: Plans the scaling curve's search re-ranks with the simulated schedule, per node count.
SCALING_RERANK = 4
#: Resolution of the heatmap in ``plan``'s report (the audit's own report: 110).
HEATMAP_DPI = 80


def cluster_ref_for(topo, given: str | None) -> str:
    """The cluster a measured topology runs on: ``given`` (a preset or a file), else the
    preset whose GPU the measurements name (nccl-tests' Rank lines,
    :attr:`topology.topofile.Topology.gpu_name`) and whose hosts hold the topology's GPUs
    per host. Raises :class:`InputError` (field ``cluster``) when neither says."""
    from topology.cluster import CLUSTER_PRESETS
    from topology.gpus import guess_gpu_preset

    if given:
        return given
    gpu = guess_gpu_preset(topo.gpu_name) if topo.gpu_name else None
    fits = [name for name, c in CLUSTER_PRESETS.items()
            if c["gpu"] == gpu and c["gpus_per_node"] == topo.gpus_per_host]
    if not fits:
        seen = (f"no cluster preset has {topo.gpu_name!r} GPUs, {topo.gpus_per_host} per "
                f"host, as the measurements name" if topo.gpu_name
                else "the measurements do not name their GPU")
        raise InputError("cluster", None, f"required: {seen}; name the cluster (a preset or "
                                          f"a YAML file)")
    return fits[0]


@dataclass(frozen=True, kw_only=True)
class FindingCost:
    """What one finding costs the plan: ``what`` was changed (``repairing cnode2-001<->
    cnode2-004``, ``leaving out cnode2-003``), the plan's iteration time on the measured links
    and with the change (seconds; None when not priced, ``note`` says why)."""

    finding: int
    what: str
    iteration_time_s: float
    changed_iteration_time_s: float | None
    note: str = ""

    @property
    def delta_s(self) -> float | None:
        return (None if self.changed_iteration_time_s is None
                else self.changed_iteration_time_s - self.iteration_time_s)

    @property
    def delta_percent(self) -> float | None:
        d = self.delta_s
        return None if d is None else 100 * d / self.iteration_time_s

    def describe(self) -> str:
        if self.delta_s is None:
            return f"{self.what}: not priced ({self.note})"
        return (f"{self.what}: {self.delta_percent:+.1f} % ({self.delta_s:+.3f} s per "
                f"iteration)" + (f"; {self.note}" if self.note else ""))

    def to_dict(self) -> dict:
        return {"what": self.what, "iteration_time_s": self.iteration_time_s,
                "changed_iteration_time_s": self.changed_iteration_time_s,
                "delta_s": self.delta_s, "delta_percent": self.delta_percent,
                "note": self.note}


def used_host_pairs(plan, node_hosts, gpus_per_node: int) -> set[tuple[int, int]] | None:
    """The directed host pairs (host indices, both ways) the placed plan's communication
    crosses: the hops of its tensor-, context- and data-parallel rings and its pipeline
    sends, in the rank grid :class:`configurator.cost.placed.PlacedPlan` prices
    (``[pp, dp, cp, tp]``, Megatron's order). None for a mixture of experts, whose
    all-to-all reaches every pair of its groups (then every finding is priced)."""
    if plan.ep > 1:
        return None
    G = gpus_per_node
    pp, dp, cp, tp = plan.pp, plan.dp, plan.cp, plan.tp
    ranks = np.arange(plan.world_size).reshape(pp, dp, cp, tp)
    hosts = np.asarray(node_hosts, dtype=np.int64)[ranks // G]
    rows = [hosts.reshape(-1, tp), hosts.transpose(0, 1, 3, 2).reshape(-1, cp),
            hosts.transpose(0, 3, 1, 2).reshape(-1, dp * cp)]
    pairs: set[tuple[int, int]] = set()
    for r in rows:
        if r.shape[1] > 1:
            a, b = r, np.roll(r, -1, axis=1)
            pairs.update(zip(a.ravel().tolist(), b.ravel().tolist()))
    if pp > 1:
        a, b = hosts, np.roll(hosts, -1, axis=0)       # stage s -> s+1 (and the wrap)
        pairs.update(zip(a.ravel().tolist(), b.ravel().tolist()))
    pairs |= {(b, a) for a, b in pairs}
    return {(a, b) for a, b in pairs if a != b}


def _what(f) -> str:
    if f.kind == "islands":
        return "repairing the cross-island links"
    if f.kind == "slow_host":
        return f"repairing {f.subject}'s links"
    return f"repairing {f.subject}"


def price_findings(model, base, topo, report, evaluation, *, pool: list[int],
                   seed: int = 0, evaluations: int = VARIANT_EVALUATIONS,
                   search_space=None, options=None, known=None) -> list[FindingCost]:
    """What each of ``report``'s findings costs the placed plan ``evaluation`` (its
    ``placement`` names hosts and GPU order on the measured cluster): for a finding with
    links to repair, the plan on the topology with them repaired; for a slow host, also the
    plan without it (placed on ``pool`` less the host, or, where the pool is then too small,
    the best plan the search finds on the hosts left). ``base`` is the cluster before the
    measurements (:func:`topology.topofile.apply_topology` builds each variant from it).
    ``known``: the best placed plan already found without some hosts (a tuple of host
    names → its :class:`~configurator.search.evaluate.Evaluation`), reused for a host left
    out. Returns the costs best first (largest saving first); findings nothing prices (a
    link that degrades at large messages: the plan is priced at the fitted rate already)
    carry a note."""
    from configurator.cost.placed import PlacedPlan
    from configurator.search.placement import place_plan
    from topology.structure import repaired
    from topology.topofile import apply_topology

    measured = apply_topology(base, topo)
    plan = evaluation.plan
    pl = evaluation.placement
    index = {h: i for i, h in enumerate(measured.hosts)}
    nh = np.array([index[h] for h in pl["hosts"]], dtype=np.int64)
    go = np.array(pl["gpu_order"], dtype=np.int64)
    t0 = float(PlacedPlan(model, measured, plan).times([(nh, go)])[0])
    used = used_host_pairs(plan, nh, measured.gpus_per_node)

    def placed_time(cluster, hosts_pool, search: bool = True):
        fixed = (float(PlacedPlan(model, cluster, plan).times([(nh, go)])[0])
                 if set(nh.tolist()) <= set(hosts_pool) else math.inf)
        if not search:
            return fixed
        try:
            out = place_plan(model, cluster, plan, pool=hosts_pool, seed=seed,
                             max_evaluations=evaluations, time_budget_s=5.0,
                             random_samples=0)
        except ValueError:
            return fixed
        return min(fixed, out.iteration_time_s)

    costs: list[FindingCost] = []
    for i, f in enumerate(report.findings):
        local = f.kind in ("slow_pair", "slow_direction")
        if f.repair and not set(f.classes) & report.structure.link_classes:
            costs.append(FindingCost(finding=i, what=_what(f), iteration_time_s=t0,
                                     changed_iteration_time_s=t0,
                                     note="seen in collective measurements only; transfers "
                                          "are priced on the measured links"))
        elif f.repair and local and used is not None and not any(
                (index[a], index[b]) in used for a, b in f.repair if a in index and b in index):
            costs.append(FindingCost(finding=i, what=_what(f), iteration_time_s=t0,
                                     changed_iteration_time_s=t0,
                                     note="no link of it carries this placement's traffic"))
        elif f.repair:
            # a pair or a direction: the plan's own placement; islands and hosts: and a
            # short placement search from there, which may route around less
            t = placed_time(apply_topology(base, repaired(topo, report.structure, f)), pool,
                            search=not local)
            costs.append(FindingCost(finding=i, what=_what(f), iteration_time_s=t0,
                                     changed_iteration_time_s=t))
        for host in f.leave_out:
            rest = [h for h in pool if measured.hosts[h] != host]
            if host not in pl["hosts"]:
                costs.append(FindingCost(finding=i, what=f"leaving out {host}",
                                         iteration_time_s=t0, changed_iteration_time_s=t0,
                                         note="the plan runs without it already"))
            elif len(rest) >= plan.world_size // measured.gpus_per_node:
                t = placed_time(measured, rest)
                costs.append(FindingCost(finding=i, what=f"leaving out {host}",
                                         iteration_time_s=t0, changed_iteration_time_s=t))
            elif (host,) in (known or {}):
                costs.append(_other_plan(i, f"leaving out {host}", t0, known[(host,)],
                                         len(rest)))
            else:
                costs.append(_without_host(model, measured, i, host, rest, t0, plan, seed,
                                           evaluations, search_space, options))
        if not f.repair and not f.leave_out:
            costs.append(FindingCost(finding=i, what=_what(f), iteration_time_s=t0,
                                     changed_iteration_time_s=None,
                                     note="the plan is priced at the link's fitted rate, "
                                          "its smaller messages' already"))
    return sorted(costs, key=lambda c: (c.delta_s is None, c.delta_s or 0.0))


def _without_host(model, measured, i, host, rest, t0, plan, seed, evaluations, space,
                  options) -> FindingCost:
    """The best plan on the hosts left when the plan needs every host of the pool."""
    from configurator.core.errors import NoFeasiblePlanError
    from configurator.search.placement import place_search_result
    from configurator.search.rank import search
    from configurator.search.space import SearchSpace

    what = f"leaving out {host}"
    if not rest:
        return FindingCost(finding=i, what=what, iteration_time_s=t0,
                           changed_iteration_time_s=None, note="no host would be left")
    try:
        res = search(model, measured.subset(rest), plan.global_batch_size, top_k=1,
                     space=space or SearchSpace(), **(options or {}))
        res = place_search_result(model, measured, res, pool=rest, seed=seed,
                                  max_evaluations=evaluations, time_budget_s=5.0)
    except (InputError, NoFeasiblePlanError) as err:
        return FindingCost(finding=i, what=what, iteration_time_s=t0,
                           changed_iteration_time_s=None,
                           note=f"no plan on the {len(rest)} hosts left: {err}")
    return _other_plan(i, what, t0, res.plans[0], len(rest))


def _other_plan(i, what, t0, best, hosts: int) -> FindingCost:
    p = best.plan
    return FindingCost(finding=i, what=what, iteration_time_s=t0,
                       changed_iteration_time_s=best.iteration_time_s,
                       note=f"another plan on {hosts} hosts: tp {p.tp} pp {p.pp} dp {p.dp} "
                            f"cp {p.cp} vp {p.vp} mbs {p.micro_batch_size}")


def costs_by_finding(costs: list[FindingCost]) -> dict[int, list[FindingCost]]:
    """The costs of each finding (by its index), best first."""
    out: dict[int, list[FindingCost]] = {}
    for c in costs:
        out.setdefault(c.finding, []).append(c)
    return out


def audit_document(report, priced: "PricedPlan | None") -> dict:
    """The audit's JSON (``audit --json``, ``audit.json``): the report's, and when it was
    priced for a plan (``priced``), ``priced_for`` (the plan in one line) and each finding's
    ``costs`` (best first; each with ``what``, ``iteration_time_s``,
    ``changed_iteration_time_s``, ``delta_s``, ``delta_percent`` and ``note``)."""
    doc = report.to_dict()
    if priced is not None:
        by = costs_by_finding(priced.costs)
        doc["priced_for"] = priced.description
        for i, f in enumerate(doc["findings"]):
            f["costs"] = [c.to_dict() for c in by.get(i, [])]
    return doc


def cost_lines(priced: "PricedPlan | None") -> dict[int, list[str]] | None:
    """Finding index → its costs in words (best first), or None when not priced."""
    if priced is None:
        return None
    return {i: [c.describe() for c in cs] for i, cs in costs_by_finding(priced.costs).items()}


@dataclass(frozen=True, kw_only=True)
class GroupCrossing:
    """How many of one dimension's groups span more than one island (``crossing``) out of
    ``groups``; for the pipeline, boundaries between consecutive stages."""

    dim: str
    groups: int
    crossing: int


def island_crossings(plan, hosts: list[str], gpus_per_node: int,
                     islands) -> list[GroupCrossing]:
    """For a plan whose node rank ``n`` runs on ``hosts[n]``: per parallel dimension (tp,
    cp, dp; Megatron's rank order, :func:`topology.placement.rank_groups`) the groups whose
    ranks sit on more than one island, and the pipeline boundaries (stage ``s`` to ``s+1``
    of any replica) that cross islands. Hosts in no island count as their own."""
    from topology.placement import group_stride, rank_groups

    island_of = {h: i for i, isl in enumerate(islands) for h in isl}
    world = plan.world_size
    where = [island_of.get(hosts[r // gpus_per_node], hosts[r // gpus_per_node])
             for r in range(world)]
    sizes = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
    out = []
    for dim in ("tp", "cp", "dp"):
        if sizes[dim] == 1:
            continue
        groups = list(rank_groups(group_stride(dim, sizes), sizes[dim], world))
        out.append(GroupCrossing(dim=dim, groups=len(groups),
                                 crossing=sum(len({where[r] for r in g}) > 1 for g in groups)))
    if plan.pp > 1:
        stride = group_stride("pp", sizes)
        pairs = [(r, r + stride) for r in range(world - stride)]
        bounds = {}
        for a, b in pairs:
            key = a // stride    # stage boundary s -> s+1
            bounds[key] = bounds.get(key, False) or where[a] != where[b]
        out.append(GroupCrossing(dim="pp boundaries", groups=plan.pp - 1,
                                 crossing=sum(bounds.get(s, False) for s in range(plan.pp - 1))))
    return out


@dataclass(frozen=True, kw_only=True)
class CostRequest:
    """What the audit prices its findings for: a model and global batch, the cluster (None:
    from the measurements' GPU), the hosts the plan uses (None: all), the plan (a saved
    plan document; None: the search's best, placed on the measured links) and the search's
    plan settings (``options``, as ``search``'s)."""

    model: str
    global_batch_size: int | None = None
    cluster: str | None = None
    nodes: int | None = None
    seq_length: int | None = None
    plan: str | None = None
    options: dict = field(default_factory=dict)
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class PricedPlan:
    """The plan the findings were priced for (one line, and its placed evaluation) and the
    costs, best first."""

    description: str
    evaluation: object
    costs: list[FindingCost]


def price_audit(topo_path: str, report, req: CostRequest) -> PricedPlan:
    """The cost of every finding of ``report`` (the audit of the topology file
    ``topo_path``) for the plan of ``req``: a saved plan document (placed as it says, or
    optimised on the measured links when it has no placement) or the search's best
    (placed). Raises :class:`InputError` or
    :class:`~configurator.core.errors.NoFeasiblePlanError`."""
    from configurator.app.inputs import JobInputs, resolve
    from configurator.app.plan_jobs import SearchRequest, ranked_search, search_space
    from configurator.core import validate as v
    from topology.cluster import load_cluster
    from topology.topofile_io import load_topology

    topo = load_topology(topo_path)
    cluster_ref = cluster_ref_for(topo, req.cluster)
    if req.plan:
        from configurator.core.document import read_plan_document
        from configurator.search.evaluate import evaluate_plan, with_placement
        from configurator.search.placement import place_plan, placement_on_cluster

        doc = read_plan_document(v.load_mapping_file("plan", req.plan))
        inputs = JobInputs(model=req.model, cluster=cluster_ref, topology=topo_path)
        model, cluster = resolve(inputs, precision=doc.plan.precision)
        model = doc.model
        if doc.nodes > cluster.num_nodes:
            raise InputError("plan", req.plan, f"the plan needs {doc.nodes} hosts; the "
                                               f"topology has {cluster.num_nodes}")
        if doc.placement is not None:
            nh, go = placement_on_cluster(doc.placement.to_dict(), cluster, doc.nodes)
            out = place_plan(model, cluster, doc.plan, method="file", node_hosts=nh,
                             gpu_order=go, random_samples=0)
        else:
            out = place_plan(model, cluster, doc.plan, seed=req.seed, random_samples=0,
                             max_evaluations=100)
        e = evaluate_plan(model, cluster, doc.plan, node_hosts=list(out.node_hosts),
                          gpu_order=out.gpu_order)
        peak = cluster.gpu.peak("fp16" if doc.plan.precision == "fp16" else "bf16")
        best = with_placement(model, e, out.to_dict(), out.iteration_time_s, peak,
                              out.time_per_stage)
        where = f"the plan of {req.plan}"
        space, options = None, None
    else:
        if req.global_batch_size is None:
            raise InputError("gbs", None, "required with --model (or give --plan FILE)")
        v.int_in_range("gbs", req.global_batch_size)
        sreq = SearchRequest(inputs=JobInputs(model=req.model, cluster=cluster_ref,
                                              nodes=req.nodes, seq_length=req.seq_length,
                                              topology=topo_path),
                             global_batch_size=req.global_batch_size, options=req.options,
                             top=1, seed=req.seed, random_placements=PLAN_RANDOM_PLACEMENTS)
        model, cluster = resolve(sreq.inputs, precision=sreq.precision)
        space, options = search_space(model, sreq), dict(sreq.options)
        res, _ = ranked_search(sreq, model, cluster, space, 1)
        best = res.plans[0]
        where = "the search's best plan"
    p = best.plan
    description = (f"{model.name}, {where}: tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp} vp "
                   f"{p.vp} mbs {p.micro_batch_size} gbs {p.global_batch_size} on "
                   f"{len(best.placement['hosts'])} hosts, {best.iteration_time_s:.3f} s per "
                   f"iteration placed on the measured links")
    costs = price_findings(model, load_cluster(cluster_ref, cluster.num_nodes), topo, report,
                           best, pool=list(range(cluster.num_nodes)), seed=req.seed,
                           search_space=space, options=options)
    return PricedPlan(description=description, evaluation=best, costs=costs)


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """``configurator plan``: the model and batch, the measurements (nccl-tests logs or a
    topology file, exactly one), the cluster (None: from the measurements' GPU), how many
    hosts the plan uses (None: the search's choice of all of them), where to write, and the
    search's settings (``top`` plans placed; ``options`` the plan settings every plan
    shares, as ``search``'s)."""

    model: str
    global_batch_size: int
    logs: tuple[str, ...] = ()
    topology: str | None = None
    cluster: str | None = None
    nodes: int | None = None
    seq_length: int | None = None
    out: str = ""
    force: bool = False
    top: int = 3
    options: dict = field(default_factory=dict)
    seed: int = 0
    placement_evaluations: int = 100


@dataclass(frozen=True, kw_only=True)
class PlanOutcome:
    """What ``plan`` decided and wrote: the audit, the chosen search result and whether the
    flagged hosts were left out (with both times), the findings' costs, the files."""

    report: object
    topology: object
    chosen: object                      # SearchOutcome-like: result, header
    excluded: tuple[str, ...]
    alternative_iteration_time_s: float | None
    costs: list[FindingCost]
    crossings: list[GroupCrossing]
    written: list[str]
    summary: list[str]


#: Files ``configurator plan`` writes (besides the launch scripts and, from logs,
#: ``topology.json``).
PLAN_FILES = ("plan.json", "plans.json", "table.txt", "audit.json", "report.html")


def run_plan(req: PlanRequest) -> PlanOutcome:
    """Import the measurements (or read the topology file), audit them, search with the
    ranks placed on the measured links (on every host, and without the hosts the audit
    flags when there are any: the faster is kept), price every finding for the chosen plan,
    and write the launch scripts, ``plan.json``, ``plans.json``, ``table.txt``,
    ``plans.png``, ``topology.json`` (when imported from logs), ``audit.json`` and
    ``report.html`` into ``req.out``. Raises :class:`InputError` or
    :class:`~configurator.core.errors.NoFeasiblePlanError`."""
    import os

    from configurator.app.inputs import JobInputs, audit_of, resolve
    from configurator.app.outputs import LAUNCH_FILES, check_out
    from configurator.app.plan_jobs import (SearchRequest, ranked_search, search_document,
                                            search_space)
    from configurator.core import validate as v
    from configurator.core.errors import NoFeasiblePlanError
    from topology.cluster import load_cluster

    if bool(req.logs) == bool(req.topology):
        raise InputError("logs", list(req.logs) or req.topology,
                         "give exactly one of --logs PATH... or --topology FILE")
    if not req.out:
        raise InputError("out", req.out, "required: the directory the scripts and the report "
                                         "go to")
    v.int_in_range("gbs", req.global_batch_size)
    v.int_in_range("top", req.top)
    names = list(dict.fromkeys([*LAUNCH_FILES, *PLAN_FILES]
                               + (["topology.json"] if req.logs else [])))
    check_out(req.out, names, req.force)
    if req.logs:
        from topology.importers import import_paths
        from topology.topofile_io import save_topology

        topo = import_paths(req.logs)
        cluster_ref = cluster_ref_for(topo, req.cluster)
        os.makedirs(req.out, exist_ok=True)
        topo_path = os.path.join(req.out, "topology.json")
        save_topology(topo, topo_path, force=req.force)
    else:
        from topology.topofile_io import load_topology

        topo, topo_path = load_topology(req.topology), req.topology
        cluster_ref = cluster_ref_for(topo, req.cluster)
    report = audit_of(topo_path)
    sreq = SearchRequest(inputs=JobInputs(model=req.model, cluster=cluster_ref, nodes=req.nodes,
                                          seq_length=req.seq_length, topology=topo_path),
                         global_batch_size=req.global_batch_size, options=req.options,
                         top=req.top, placement_evaluations=req.placement_evaluations,
                         seed=req.seed, random_placements=PLAN_RANDOM_PLACEMENTS)
    model, cluster = resolve(sreq.inputs, precision=sreq.precision)
    space = search_space(model, sreq)
    drain = tuple(h for h in report.drain_hosts if h in cluster.hosts)
    res = used = None
    try:
        res, used = ranked_search(sreq, model, cluster, space, req.top)
    except (InputError, NoFeasiblePlanError):
        if not drain:
            raise
    excluded, alternative, known = (), None, {}
    if drain and (req.nodes is None or req.nodes <= cluster.num_nodes - len(drain)):
        try:
            res_x, used_x = ranked_search(sreq, model, cluster, space, 1,
                                          exclude_flagged=True)
        except (InputError, NoFeasiblePlanError):
            if res is None:
                raise
            res_x = None
        if res_x is not None:
            known[drain] = res_x.plans[0]
        if res_x is not None and (res is None or res_x.plans[0].iteration_time_s
                                  < res.plans[0].iteration_time_s):
            alternative = None if res is None else res.plans[0].iteration_time_s
            res, used, excluded = res_x, used_x, drain
        elif res_x is not None:
            alternative = res_x.plans[0].iteration_time_s
    best = res.plans[0]
    base = load_cluster(cluster_ref, cluster.num_nodes)
    costs = price_findings(model, base, topo, report, best,
                           pool=list(range(cluster.num_nodes)), seed=req.seed,
                           evaluations=VARIANT_EVALUATIONS, search_space=space,
                           options=dict(sreq.options), known=known)
    pl = best.placement
    crossings = island_crossings(best.plan, pl["hosts"], cluster.gpus_per_node, report.islands)
    first = [h for h in cluster.hosts if h not in excluded][:len(pl["hosts"])]
    default_crossings = island_crossings(best.plan, first, cluster.gpus_per_node,
                                         report.islands)
    summary = plan_summary(model, cluster, req, best, report, excluded, alternative, costs,
                           crossings, default_crossings)
    header = summary[0]
    doc = search_document(model, used, res)
    written = _write_plan(req, model, cluster, used, res, header, doc, report, costs, summary,
                          crossings, default_crossings, topo, space, sreq, excluded)
    return PlanOutcome(report=report, topology=topo, chosen=res, excluded=excluded,
                       alternative_iteration_time_s=alternative, costs=costs,
                       crossings=crossings, written=written, summary=summary)


def plan_summary(model, cluster, req, best, report, excluded, alternative, costs,
                 crossings, default_crossings) -> list[str]:
    """The lines ``plan`` prints (and the report's summary): the chosen plan, the audit in
    one line, the hosts left out and why, the islands the placement keeps groups in, and
    the findings that cost most."""
    p = best.plan
    nodes = len(best.placement["hosts"])
    lines = [f"{model.name} on {nodes} of {cluster.num_nodes} measured hosts "
             f"({cluster.gpus_per_node} x {cluster.gpu.name} each), gbs "
             f"{p.global_batch_size}: tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp} vp {p.vp} mbs "
             f"{p.micro_batch_size} recompute {p.recompute}, {best.iteration_time_s:.3f} s "
             f"per iteration, {best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"]
    found = count_findings(report.findings) or "no finding"
    isl = "; ".join("{" + ", ".join(i) + "}" for i in report.islands)
    lines.append(f"audit: {found}" + (f"; islands {isl}" if isl else ""))
    if excluded:
        lines.append(f"left out {', '.join(excluded)} (flagged by the audit): "
                     f"{best.iteration_time_s:.3f} s"
                     + (f" vs {alternative:.3f} s with every host" if alternative else ""))
    elif alternative is not None:
        lines.append(f"kept every host: {best.iteration_time_s:.3f} s vs {alternative:.3f} s "
                     f"without the flagged ones")
    pl = best.placement
    if pl.get("default_iteration_time_s"):
        gain = 100 * (best.iteration_time_s / pl["default_iteration_time_s"] - 1)
        lines.append(f"placement: {best.iteration_time_s:.3f} s vs "
                     f"{pl['default_iteration_time_s']:.3f} s in Megatron's order on the first "
                     f"hosts ({gain:+.1f} %)")
    if report.islands and crossings:
        lines.append("groups crossing islands (this placement / Megatron's order): " + ", ".join(
            f"{c.dim} {c.crossing}/{d.crossing} of {c.groups}"
            for c, d in zip(crossings, default_crossings)))
    priced = [c for c in costs if c.delta_s is not None][:3]
    if priced:
        lines.append("what the findings cost this plan (best first): "
                     + "; ".join(f"{c.what} {c.delta_percent:+.1f} %" for c in priced))
    return lines


def _write_plan(req, model, cluster, used, res, header, doc, report, costs, summary,
                crossings, default_crossings, topo, space, sreq, excluded) -> list[str]:
    """Render every file of ``plan`` and write them into ``req.out``; returns the names."""
    from configurator.app.outputs import LAUNCH_FILES, search_files
    from configurator.core import jsonout
    from configurator.report.network_html import placement_png, render_network_html
    from configurator.report.table import format_table
    from launchers import FILE_MODE, start_instructions, write_files
    from topology.report_html import heatmap_png

    import os

    best = res.plans[0]
    made = search_files(model, used, res, header, placed_on=cluster, document=doc,
                        names=(*LAUNCH_FILES, "plan.json", "plans.json", "table.txt"))
    files = dict(made.files)
    by = costs_by_finding(costs)
    priced = PricedPlan(description=summary[0], evaluation=best, costs=costs)
    files["audit.json"] = (jsonout.dumps(audit_document(report, priced), indent=2).encode(),
                           FILE_MODE)
    steps = start_instructions(req.out, nodes=len(best.placement["hosts"]), placed=True,
                               data=False, plan_file=os.path.join(req.out, "plan.json"))
    rows, note = scaling_rows(model, cluster, req.global_batch_size, space, sreq,
                              [h for h in cluster.hosts if h not in excluded])
    from configurator.report.plot import scaling_png

    scaling = scaling_png(rows, title=f"{model.name}: best plan per node count") if any(
        r.get("tokens_per_s") for r in rows) else None
    pl = best.placement
    page = render_network_html(
        title=f"{model.name} on the measured cluster ({cluster.num_nodes} hosts)",
        summary=summary, next_steps=steps, report=report, costs=by,
        heatmap_png=heatmap_png(report, topo, dpi=HEATMAP_DPI),
        table=format_table(res.plans, wide=True),
        placement=made.placement, crossings=crossings, default_crossings=default_crossings,
        placement_png=placement_png(list(report.structure.host_order(cluster.hosts)),
                                    list(pl["hosts"]), report.islands, best.plan,
                                    cluster.gpus_per_node,
                                    title=f"tp {best.plan.tp} pp {best.plan.pp} dp "
                                          f"{best.plan.dp}: node rank, pipeline stages and "
                                          "data-parallel ranks per host"),
        gantt_png=made.gantt_png, scaling_png=scaling, scaling_note=note)
    files["report.html"] = (page.encode(), FILE_MODE)
    write_files(req.out, files, force=req.force)
    return sorted(files) + (["topology.json"] if req.logs else [])


#: Node counts the report's scaling curve prices (powers of two and the pool's size).
def scaling_counts(pool_size: int) -> list[int]:
    counts = {pool_size}
    n = 1
    while n < pool_size:
        counts.add(n)
        n *= 2
    return sorted(counts)


def scaling_rows(model, cluster, gbs: int, space, sreq, pool_hosts: list[str]
                 ) -> tuple[list[dict], str]:
    """The best plan per node count of :func:`scaling_counts` on the healthiest hosts of
    ``pool_hosts`` (the closed form with the simulated schedule of the best, on their
    measured links, Megatron's order: no placement search), as ``run_scaling`` rows; and a
    sentence saying so."""
    from configurator.core.errors import NoFeasiblePlanError
    from configurator.search.placement import host_health_order
    from configurator.search.rank import search

    index = {h: i for i, h in enumerate(cluster.hosts)}
    order = host_health_order(cluster, [index[h] for h in pool_hosts])
    rows = []
    for n in scaling_counts(len(pool_hosts)):
        row = {"nodes": n}
        try:
            res = search(model, cluster.subset(sorted(order[:n])), gbs, top_k=1, space=space,
                         max_memory_fraction=sreq.max_memory_fraction,
                         rerank=SCALING_RERANK, **sreq.options)
        except (InputError, NoFeasiblePlanError) as err:
            rows.append(dict(row, tokens_per_s=None, reason=str(err)))
            continue
        e = res.plans[0]
        rows.append(dict(row, num_gpus=e.plan.world_size, iteration_time_s=e.iteration_time_s,
                         tokens_per_s=e.tokens_per_s_per_gpu * e.plan.world_size,
                         tokens_per_s_per_gpu=e.tokens_per_s_per_gpu))
    note = ("Best plan per node count on the healthiest hosts (their measured links, "
            "Megatron's rank order), counts " + ", ".join(str(r["nodes"]) for r in rows)
            + "; a count with no plan that fits is left out.")
    return rows, note
