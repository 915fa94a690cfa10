"""``configurator plan``: from measured links to the launch scripts in one command: import
the measurements, audit them, search with the ranks placed on the measured links (with and
without the hosts the audit flags), price the findings for the chosen plan
(:mod:`configurator.app.audit_costs`) and write the scripts, the plan files and the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from configurator.app.audit_costs import (VARIANT_EVALUATIONS, FindingCost, GroupCrossing,
                                          PricedPlan, audit_document, costs_by_finding,
                                          island_crossings, measured_search_request,
                                          price_findings, price_in_days)
from configurator.app.plan_jobs import SearchLimits
from configurator.core.errors import InputError

if TYPE_CHECKING:
    from configurator.app.plan_jobs import SearchRequest
    from configurator.app.training_jobs import TrainingRequest
    from configurator.core.model import ModelSpec
    from configurator.search.evaluate import Evaluation
    from configurator.search.rank import SearchResult
    from configurator.search.space import SearchSpace
    from topology.audit import AuditReport
    from topology.cluster import Cluster
    from topology.topofile import Topology

#: Plans the scaling curve's search re-ranks with the simulated schedule, per node count.
SCALING_RERANK = 4
#: Resolution of the heatmap in ``plan``'s report (the audit's own report: 110).
HEATMAP_DPI = 80


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
    #: time, cost and energy to train (``--train-tokens`` and its options), or None
    training: TrainingRequest | None = None
    #: the search's limits (:class:`~configurator.app.plan_jobs.SearchLimits`,
    #: :func:`configurator.cli.plan_commands.search_limits`; default: none)
    limits: SearchLimits = field(default_factory=SearchLimits)


@dataclass(frozen=True, kw_only=True)
class PlanOutcome:
    """What ``plan`` decided and wrote: the audit, the chosen search result and whether the
    flagged hosts were left out (with both times), the findings' costs, the files."""

    #: the audit of the measured links (:func:`~configurator.app.inputs.audit_of`)
    report: AuditReport
    #: the measured topology (imported from the logs, or read from the topology file)
    topology: Topology
    #: the search the plan was chosen from (on every host, or without the flagged ones,
    #: whichever is faster); ``chosen.plans[0]`` is the plan written, placed
    chosen: SearchResult
    #: the hosts left out as flagged by the audit (empty: every host was offered)
    excluded: tuple[str, ...]
    #: the best placed iteration time of the other choice (seconds; None when not searched
    #: or nothing fits)
    alternative_iteration_time_s: float | None
    #: what each finding costs the chosen plan
    #: (:func:`~configurator.app.audit_costs.price_findings`)
    costs: list[FindingCost]
    #: how many of the chosen placement's groups cross the audit's islands, per dimension
    crossings: list[GroupCrossing]
    #: the names of the files written into ``PlanRequest.out``
    written: list[str]
    #: the lines ``plan`` prints (:func:`plan_summary`)
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
    from configurator.core.progress import Stages

    with Stages("plan", PLAN_STAGES) as stage:
        return _run_plan(req, stage)


#: The stages of ``plan`` its progress bar names.
PLAN_STAGES = ("import", "audit", "search", "search without the flagged hosts",
               "price the findings", "scaling curve and report")


def _run_plan(req: PlanRequest, stage) -> PlanOutcome:
    import os

    from configurator.app.inputs import (audit_of, check_measured_gpu, cluster_ref_for,
                                         load_measured_topology, resolve)
    from configurator.app.outputs import LAUNCH_FILES, check_out
    from configurator.app.plan_jobs import search_document, search_on_fewer_hosts
    from configurator.core import validate as v
    from configurator.core.errors import NoFeasiblePlanError
    from topology.cluster_files import load_cluster

    if bool(req.logs) == bool(req.topology):
        raise InputError("logs", list(req.logs) or req.topology,
                         "give exactly one of --logs PATH... or --topology FILE")
    if not req.out:
        raise InputError("out", req.out, "required: the directory the scripts and the report "
                                         "go to")
    from configurator.app.training_jobs import (objective_note, price_evaluation,
                                                rank_plans, training_inputs, training_line)

    v.int_in_range("gbs", req.global_batch_size)
    v.int_in_range("top", req.top)
    names = list(dict.fromkeys([*LAUNCH_FILES, *PLAN_FILES]
                               + (["topology.json"] if req.logs else [])))
    check_out(req.out, names, req.force)
    stage("import")
    if req.logs:
        from topology.importers import import_paths
        from topology.topofile_io import save_topology

        topo = import_paths(req.logs)
        cluster_ref = cluster_ref_for(topo, req.cluster)
        check_measured_gpu(topo, load_cluster(cluster_ref, len(topo.hosts)),
                           " ".join(req.logs) if len(req.logs) < 4 else "the logs")
        os.makedirs(req.out, exist_ok=True)
        topo_path = os.path.join(req.out, "topology.json")
        save_topology(topo, topo_path, force=req.force)
    else:
        topo, topo_path = load_measured_topology(req.topology), req.topology
        cluster_ref = cluster_ref_for(topo, req.cluster)
    stage("audit")
    report = audit_of(topo_path)
    sreq = measured_search_request(
        model=req.model, cluster_ref=cluster_ref, topology=topo_path,
        global_batch_size=req.global_batch_size, nodes=req.nodes, seq_length=req.seq_length,
        options=req.options, top=req.top, seed=req.seed,
        placement_evaluations=req.placement_evaluations, limits=req.limits)
    job = resolve(sreq.inputs, precision=sreq.precision)  # no profile
    model, cluster = job.model, job.cluster
    train = training_inputs(req.training, job.training)
    space = sreq.limits.space(model)
    drain = tuple(h for h in report.drain_hosts if h in cluster.hosts)
    res = used = None
    stage("search")
    fewer: dict[bool, str] = {}     # exclude_flagged -> why fewer hosts than offered

    def search_hosts(top: int, exclude_flagged: bool):
        found, why = search_on_fewer_hosts(sreq, model, cluster, space, top,
                                           exclude_flagged=exclude_flagged, nodes=req.nodes)
        if why:
            fewer[exclude_flagged] = why
        return found

    try:
        res, used = search_hosts(req.top, False)
    except (InputError, NoFeasiblePlanError):
        if not drain:
            raise
    excluded, alternative, known = (), None, {}
    stage("search without the flagged hosts")
    if drain and (req.nodes is None or req.nodes <= cluster.num_nodes - len(drain)):
        try:
            res_x, used_x = search_hosts(1, True)
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
    if train is not None:
        import dataclasses

        res = dataclasses.replace(res, plans=rank_plans(
            [price_evaluation(model, used, e, train, req.global_batch_size)
             for e in res.plans], req.training.objective, req.training.deadline_days))
    best = res.plans[0]
    base = load_cluster(cluster_ref, cluster.num_nodes)
    stage("price the findings")
    costs = price_findings(model, base, topo, report, best,
                           pool=list(range(cluster.num_nodes)), seed=req.seed,
                           evaluations=VARIANT_EVALUATIONS, search_space=space,
                           options=dict(sreq.search_kwargs), known=known)
    if train is not None:
        costs = price_in_days(costs, model, cluster, best.plan, train)
    pl = best.placement
    crossings = island_crossings(best.plan, pl.hosts, cluster.gpus_per_node, report.islands)
    first = [h for h in cluster.hosts if h not in excluded][:pl.nodes]
    default_crossings = island_crossings(best.plan, first, cluster.gpus_per_node,
                                         report.islands)
    summary = plan_summary(model, cluster, req, best, report, excluded, alternative, costs,
                           crossings, default_crossings, fewer=fewer.get(bool(excluded)))
    if train is not None:
        summary.insert(1, objective_note(train, req.training) + "; " + training_line(best))
    header = summary[0]
    doc = search_document(model, used, res)
    stage("scaling curve and report")
    written = _write_plan(req, model, cluster, used, res, header, doc, report, costs, summary,
                          crossings, default_crossings, topo, space, sreq, excluded)
    return PlanOutcome(report=report, topology=topo, chosen=res, excluded=excluded,
                       alternative_iteration_time_s=alternative, costs=costs,
                       crossings=crossings, written=written, summary=summary)


def plan_warnings(report: AuditReport) -> list[str]:
    """What the user must know before trusting the plan (shown after its first line, in the
    report's summary and as ``warnings`` in ``--json``): thin coverage of the audit."""
    return [w for w in (report.coverage_warning,) if w]


def plan_summary(model: ModelSpec, cluster: Cluster, req: PlanRequest, best: Evaluation,
                 report: AuditReport, excluded: tuple[str, ...], alternative: float | None,
                 costs: list[FindingCost], crossings: list[GroupCrossing],
                 default_crossings: list[GroupCrossing], fewer: str = "") -> list[str]:
    """The lines ``plan`` prints (and the report's headline, as they are): the chosen plan
    and its time, the audit in one line, the hosts left out and why (flagged by the audit,
    or ``fewer``: no legal layout on all of them), the placement against Megatron's order,
    the islands the placement keeps groups in, and what the findings cost
    (:func:`price_line`)."""
    from configurator.app.plan_jobs import seq_note

    p = best.plan
    nodes = best.placement.nodes
    lines = [f"{model.name} on {nodes} of {cluster.num_nodes} measured hosts "
             f"({cluster.gpus_per_node} x {cluster.gpu.name} each){seq_note(model)}, gbs "
             f"{p.global_batch_size}: tp {p.tp} pp {p.pp} dp {p.dp} cp {p.cp} vp {p.vp} mbs "
             f"{p.micro_batch_size} recompute {p.recompute}, {best.iteration_time_s:.3f} s "
             f"per iteration, {best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"]
    isl = "; ".join("{" + ", ".join(i) + "}" for i in report.islands)
    lines.append(report.audit_line + (f"; islands {isl}" if isl else ""))
    lines.extend(f"warning: {w}" for w in plan_warnings(report))
    if excluded:
        lines.append(f"left out {', '.join(excluded)} (flagged by the audit): "
                     f"{best.iteration_time_s:.3f} s"
                     + (f" vs {alternative:.3f} s with every host" if alternative else ""))
    elif alternative is not None:
        lines.append(f"kept every host: {best.iteration_time_s:.3f} s vs {alternative:.3f} s "
                     f"without the flagged ones")
    if fewer:
        unused = [h for h in best.placement.excluded_hosts if h not in excluded]
        lines.append(f"left out {', '.join(unused)}: {fewer}")
    pl = best.placement
    if pl.default_iteration_time_s:
        gain = 100 * (best.iteration_time_s / pl.default_iteration_time_s - 1)
        lines.append(f"placement: {best.iteration_time_s:.3f} s vs "
                     f"{pl.default_iteration_time_s:.3f} s in Megatron's order on the first "
                     f"hosts ({gain:+.1f} %)")
    if report.islands and crossings:
        lines.append("groups crossing islands (this placement / Megatron's order): " + ", ".join(
            f"{c.dim} {c.crossing}/{d.crossing} of {c.groups}"
            for c, d in zip(crossings, default_crossings)))
    if costs:
        lines.append(price_line(costs))
    return lines


def price_line(costs: list[FindingCost]) -> str:
    """What the findings cost the plan in one line: the repairs and exclusions that change
    its time (savings first, the three largest of each sign), how many change nothing (and
    the reason most of them give), how many are not priced and why."""
    from configurator.report.network_html import ZERO_PERCENT

    def pct(c):
        return f"{c.delta_percent:+.1f} %" + c.days_words()

    def reason(cs):
        notes = [c.note for c in cs if c.note]
        if not notes:
            return ""
        top = max(set(notes), key=notes.count)
        k = notes.count(top)
        return f" ({k} of them: {top})" if k < len(cs) else f" ({top})"

    priced = [c for c in costs if c.delta_percent is not None]
    saves = sorted((c for c in priced if c.delta_percent <= -ZERO_PERCENT),
                   key=lambda c: c.delta_percent)
    loses = sorted((c for c in priced if c.delta_percent >= ZERO_PERCENT),
                   key=lambda c: -c.delta_percent)
    same = [c for c in priced if abs(c.delta_percent) < ZERO_PERCENT]
    unpriced = [c for c in costs if c.delta_percent is None]
    parts = []
    if saves:
        parts.append("; ".join(f"{c.what} {pct(c)}" for c in saves[:3])
                     + (f" and {len(saves) - 3} more that save time" if len(saves) > 3
                        else ""))
    else:
        parts.append("no repair or exclusion makes it faster")
    parts += [f"{c.what} {pct(c)}" + (f" ({c.note})" if c.note else "") for c in loses[:3]]
    if len(loses) > 3:
        parts.append(f"{len(loses) - 3} more that cost time")
    if same:
        parts.append(f"{len(same)} change nothing{reason(same)}")
    if unpriced:
        parts.append(f"{len(unpriced)} not priced{reason(unpriced)}")
    return "what the findings cost this plan: " + "; ".join(parts)


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
    made = search_files(model, used, res, header, document=doc,
                        names=(*LAUNCH_FILES, "plan.json", "plans.json", "table.txt"))
    files = dict(made.files)
    by = costs_by_finding(costs)
    priced = PricedPlan(description=summary[0], evaluation=best, costs=costs)
    files["audit.json"] = (jsonout.dumps(audit_document(report, priced), indent=2).encode(),
                           FILE_MODE)
    steps = start_instructions(req.out, nodes=best.placement.nodes, placed=True,
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
                                    list(pl.hosts), report.islands, best.plan,
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


def scaling_rows(model: ModelSpec, cluster: Cluster, gbs: int, space: SearchSpace,
                 sreq: SearchRequest, pool_hosts: list[str]) -> tuple[list[dict], str]:
    """The best plan per node count of :func:`scaling_counts` on the healthiest hosts of
    ``pool_hosts`` (the closed form with the simulated schedule of the best, on their
    measured links, Megatron's order: no placement search), as ``run_scaling`` rows; and a
    sentence saying so."""
    from configurator.core.errors import NoFeasiblePlanError
    from configurator.search.placement_search import host_health_order
    from configurator.search.rank import search

    index = {h: i for i, h in enumerate(cluster.hosts)}
    order = host_health_order(cluster, [index[h] for h in pool_hosts])
    rows = []
    for n in scaling_counts(len(pool_hosts)):
        row = {"nodes": n}
        try:
            res = search(model, cluster.subset(sorted(order[:n])), gbs, top_k=1, space=space,
                         max_memory_fraction=sreq.max_memory_fraction,
                         rerank=SCALING_RERANK, **sreq.search_kwargs)
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
