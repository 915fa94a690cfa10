"""What the audit's findings cost a job (``configurator audit --model``, and ``configurator
plan``'s report): each finding priced for one plan placed on the measured links.

A finding's cost (:func:`price_findings`) is the change of one plan's predicted iteration
time, placed on the measured links, when the finding is repaired (its links brought to
their class's healthy level, :func:`topology.structure.repaired`) or when its host is left
out. Each variant is priced with the plan's own placement and with a short placement search
from there (seeded), the better of the two, so a repair never reads as a loss. Also how
many of a placed plan's groups cross the audit's islands (:func:`island_crossings`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from configurator.core.errors import InputError
from configurator.core.plan_values import mfu_peak_precision
from configurator.core.plan_batch import PlanBatch

if TYPE_CHECKING:
    from configurator.app.plan_jobs import SearchLimits, SearchRequest
    from configurator.app.training_jobs import TrainingRequest
    from configurator.search.evaluate import Evaluation

#: Placements searched per priced variant (a finding repaired, a host left out).
VARIANT_EVALUATIONS = 30
#: Random placements behind each placed plan's random median in the searches of ``plan`` and
#: of the audit's pricing (the search's own default is 100; the report shows the optimised
#: and Megatron's order).
PLAN_RANDOM_PLACEMENTS = 20


def measured_search_request(*, model: str, cluster_ref: str, topology: str,
                            global_batch_size: int, nodes: int | None,
                            seq_length: int | None, options: Mapping[str, Any], top: int,
                            seed: int, placement_evaluations: int | None = None,
                            limits: SearchLimits | None = None) -> SearchRequest:
    """The search ``plan`` and the audit's pricing (:func:`price_audit`) run on the measured
    topology file ``topology``: ``search``'s request for the model, the cluster
    ``cluster_ref`` (:func:`~configurator.app.inputs.cluster_ref_for`), its hosts and the
    shared plan settings ``options``, each placed plan's random median behind
    :data:`PLAN_RANDOM_PLACEMENTS` placements. ``placement_evaluations``: placements priced
    per plan (None: the search's default); ``limits``: the search's limits
    (:class:`~configurator.app.plan_jobs.SearchLimits`; None: none).
    Raises :class:`InputError` for bad ``options``."""
    from configurator.app.inputs import JobInputs
    from configurator.app.plan_jobs import SearchRequest

    return SearchRequest(inputs=JobInputs(model=model, cluster=cluster_ref, nodes=nodes,
                                          seq_length=seq_length, topology=topology),
                         global_batch_size=global_batch_size, options=options, top=top,
                         seed=seed, random_placements=PLAN_RANDOM_PLACEMENTS,
                         **({} if limits is None else {"limits": limits}),
                         **({} if placement_evaluations is None
                            else {"placement_evaluations": placement_evaluations}))


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
    #: the plan of the change when it is another plan (a host left out of a plan that
    #: needed every host), else None: the priced plan's own
    changed_plan: object = None
    #: the change in days to train, GPU-hours and cost (``--train-tokens``:
    #: :func:`price_in_days`), or None
    delta_days: float | None = None
    delta_gpu_hours: float | None = None
    delta_cost: float | None = None

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
                f"iteration" + self.days_words() + ")" + (f"; {self.note}" if self.note else ""))

    def days_words(self) -> str:
        """``, +1.2 days, +3,456 GPU-hours[, cost +…]`` when priced in days, else empty."""
        if self.delta_days is None:
            return ""
        return (f", {self.delta_days:+.2f} days, {self.delta_gpu_hours:+,.0f} GPU-hours"
                + ("" if self.delta_cost is None else f", cost {self.delta_cost:+,.0f}"))

    def to_dict(self) -> dict:
        return {"what": self.what, "iteration_time_s": self.iteration_time_s,
                "changed_iteration_time_s": self.changed_iteration_time_s,
                "delta_s": self.delta_s, "delta_percent": self.delta_percent,
                "note": self.note,
                **({} if self.delta_days is None else {
                    "delta_days": self.delta_days, "delta_gpu_hours": self.delta_gpu_hours,
                    "delta_cost": self.delta_cost})}


def price_in_days(costs: list[FindingCost], model, cluster, plan, inputs) -> list[FindingCost]:
    """``costs`` with the change in days to train, GPU-hours and cost
    (:func:`configurator.cost.training_time.estimate_training` of ``plan`` at each
    iteration time, or of the other plan a host left out needs, on ``cluster``'s GPU),
    for the tokens of ``inputs`` (:class:`~configurator.cost.training_time.TrainingInputs`).
    Costs without a changed time stay as they are."""
    import dataclasses

    from configurator.cost.training_time import estimate_training

    def train(p, t):
        return estimate_training(model, PlanBatch.from_plan(p), iteration_time_s=t,
                                 global_batch_size=p.global_batch_size,
                                 gpus_per_node=cluster.gpus_per_node, gpu=cluster.gpu,
                                 inputs=inputs)

    out = []
    for c in costs:
        if c.changed_iteration_time_s is None:
            out.append(c)
            continue
        a = train(plan, c.iteration_time_s)
        b = train(c.changed_plan or plan, c.changed_iteration_time_s)
        out.append(dataclasses.replace(
            c, delta_days=b.days - a.days, delta_gpu_hours=b.gpu_hours - a.gpu_hours,
            delta_cost=None if a.cost is None else b.cost - a.cost))
    return out


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
    from configurator.search.placement_search import place_plan
    from topology.structure import repaired
    from topology.topofile import apply_topology

    measured = apply_topology(base, topo)
    plan = evaluation.plan
    pl = evaluation.placement
    index = {h: i for i, h in enumerate(measured.hosts)}
    nh = np.array([index[h] for h in pl.hosts], dtype=np.int64)
    go = np.array(pl.gpu_order, dtype=np.int64)
    t0 = float(PlacedPlan(model, measured, PlanBatch.from_plan(plan)).times([(nh, go)])[0])
    used = used_host_pairs(plan, nh, measured.gpus_per_node)

    def placed_time(cluster, hosts_pool, search: bool = True):
        fixed = (float(PlacedPlan(model, cluster, PlanBatch.from_plan(plan)).times([(nh, go)])[0])
                 if set(nh.tolist()) <= set(hosts_pool) else math.inf)
        if not search:
            return fixed
        try:
            placed, _ = place_plan(model, cluster, plan, pool=hosts_pool, seed=seed,
                                   max_evaluations=evaluations, time_budget_s=5.0,
                                   random_samples=0)
        except ValueError:
            return fixed
        return min(fixed, placed.iteration_time_s)

    from configurator.core.progress import progress

    costs: list[FindingCost] = []
    for i, f in progress(list(enumerate(report.findings)), desc="pricing findings",
                         unit="finding"):
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
            if host not in pl.hosts:
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
    from configurator.search.placement_search import place_search_result
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
                       changed_iteration_time_s=best.iteration_time_s, changed_plan=p,
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
    cp, dp; Megatron's rank order, :func:`topology.rank_order.rank_groups`) the groups whose
    ranks sit on more than one island, and the pipeline boundaries (stage ``s`` to ``s+1``
    of any replica) that cross islands. Hosts in no island count as their own."""
    from topology.rank_order import group_stride, rank_groups

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
    #: time to train (:class:`configurator.app.training_jobs.TrainingRequest`): each cost
    #: also in days, GPU-hours and cost; or None
    training: TrainingRequest | None = None


@dataclass(frozen=True, kw_only=True)
class PricedPlan:
    """The plan the findings were priced for (one line, and its placed evaluation) and the
    costs, best first."""

    description: str
    evaluation: Evaluation
    costs: list[FindingCost]


def price_audit(topo_path: str, report, req: CostRequest) -> PricedPlan:
    """The cost of every finding of ``report`` (the audit of the topology file
    ``topo_path``) for the plan of ``req``: a saved plan document (placed as it says, or
    optimised on the measured links when it has no placement) or the search's best
    (placed). Raises :class:`InputError` or
    :class:`~configurator.core.errors.NoFeasiblePlanError`."""
    from configurator.app.inputs import JobInputs, cluster_ref_for, resolve
    from configurator.app.plan_jobs import ranked_search
    from configurator.core import validate as v
    from topology.cluster_files import load_cluster
    from topology.topofile_io import load_topology

    topo = load_topology(topo_path)
    cluster_ref = cluster_ref_for(topo, req.cluster)
    if req.plan:
        from configurator.core.document import read_plan_document
        from configurator.search.evaluate import evaluate_plan, with_placement
        from configurator.search.placement_search import place_plan, placement_on_cluster

        doc = read_plan_document(v.load_mapping_file("plan", req.plan))
        inputs = JobInputs(model=req.model, cluster=cluster_ref, topology=topo_path)
        job = resolve(inputs, precision=doc.plan.precision)  # no profile
        model, cluster = doc.model, job.cluster
        if doc.nodes > cluster.num_nodes:
            raise InputError("plan", req.plan, f"the plan needs {doc.nodes} hosts; the "
                                               f"topology has {cluster.num_nodes}")
        if doc.placement is not None:
            nh, go = placement_on_cluster(doc.placement, cluster, doc.nodes)
            placed = place_plan(model, cluster, doc.plan, method="file", node_hosts=nh,
                                gpu_order=go, random_samples=0)
        else:
            placed = place_plan(model, cluster, doc.plan, seed=req.seed, random_samples=0,
                                max_evaluations=100)
        e = evaluate_plan(model, cluster, doc.plan, placed=placed)
        peak = cluster.gpu.peak(mfu_peak_precision(doc.plan.precision))
        best = with_placement(model, e, *placed, peak)
        where = f"the plan of {req.plan}"
        space, options = None, None
    else:
        if req.global_batch_size is None:
            raise InputError("gbs", None, "required with --model (or give --plan FILE)")
        v.int_in_range("gbs", req.global_batch_size)
        sreq = measured_search_request(
            model=req.model, cluster_ref=cluster_ref, topology=topo_path,
            global_batch_size=req.global_batch_size, nodes=req.nodes,
            seq_length=req.seq_length, options=req.options, top=1, seed=req.seed)
        job = resolve(sreq.inputs, precision=sreq.precision)  # no profile
        model, cluster = job.model, job.cluster
        space, options = sreq.limits.space(model), dict(sreq.search_kwargs)
        res, _ = ranked_search(sreq, model, cluster, space, 1)
        best = res.plans[0]
        where = "the search's best plan"
    p = best.plan
    description = (f"{model.name}, {where}: tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp} vp "
                   f"{p.vp} mbs {p.micro_batch_size} gbs {p.global_batch_size} on "
                   f"{best.placement.nodes} hosts, {best.iteration_time_s:.3f} s per "
                   f"iteration placed on the measured links")
    from configurator.app.training_jobs import training_inputs

    train = training_inputs(req.training, job.training)
    costs = price_findings(model, load_cluster(cluster_ref, cluster.num_nodes), topo, report,
                           best, pool=list(range(cluster.num_nodes)), seed=req.seed,
                           search_space=space, options=options)
    if train is not None:
        costs = price_in_days(costs, model, cluster, best.plan, train)
    return PricedPlan(description=description, evaluation=best, costs=costs)
