"""The ``topology import`` and ``audit`` jobs: one library function each."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from configurator.core.errors import InputError


def topology_summary(topo, output: str | None = None) -> dict:
    """Counts describing ``topo`` (the ``topology import --json`` summary)."""
    return {"output": output, "hosts": len(topo.hosts), "gpus_per_host": topo.gpus_per_host,
            "links": len(topo.links),
            "inter_node_links": sum(1 for l in topo.links if l.src != l.dst),
            "intra_node_links": sum(1 for l in topo.links if l.src == l.dst),
            "measured_pairs": len(topo.measured_pairs()),
            "collectives": len(topo.collectives), "missing": len(topo.missing),
            "unmeasured_pairs": [list(p) for p in topo.unmeasured_pairs()],
            "warnings": len(topo.warnings), "merge_policy": topo.merge_policy}


def import_topology(paths: Sequence[str], output: str, *, policy: str = "min",
                    force: bool = False):
    """Import measurement files into one topology file at ``output`` (refused if it exists
    and ``force`` is false). Returns ``(topology, summary dict)``."""
    from topology.importers import import_paths
    from topology.topofile import check_policy
    from topology.topofile_io import save_topology

    check_policy(policy)
    if os.path.exists(output) and not force:
        raise InputError("out", output, "file exists; pass --force to overwrite")
    topo = import_paths(paths, policy=policy)
    save_topology(topo, output, force=force)
    return topo, topology_summary(topo, output)


@dataclass(frozen=True, kw_only=True)
class AuditOutcome:
    """The audit, the topology it read, the report's path (with ``out``) and, when a model
    was given, the plan its findings were priced for and their costs
    (:class:`configurator.app.audit_costs.PricedPlan`)."""

    report: object          # topology.audit.AuditReport
    topology: object        # topology.topofile.Topology
    html_path: str | None
    priced: object = None


def audit_cluster(*, topology: str | None, paths: Sequence[str], out: str | None = None,
                  force: bool = False, costs=None) -> AuditOutcome:
    """Audit a topology file or nccl-tests logs (exactly one of them); with ``costs`` (a
    :class:`configurator.app.audit_costs.CostRequest`) price each finding for a plan of
    that model; with ``out`` write the HTML report, heatmap and JSON there."""
    import tempfile

    if bool(topology) == bool(paths):
        raise InputError("input", topology or " ".join(paths) or None,
                         "give exactly one of --topology FILE or nccl-tests LOG_OR_DIR paths")
    with tempfile.TemporaryDirectory() as tmp:
        if topology:
            path = topology
        else:       # the logs as a topology file the search reads (this process only)
            from topology.importers import import_paths
            from topology.topofile_io import save_topology

            path = os.path.join(tmp, "topology.json")
            save_topology(import_paths(paths), path)
        from configurator.app.inputs import audit_of
        from topology.topofile_io import load_topology

        topo, report = load_topology(path), audit_of(path)
        priced = None
        if costs is not None:
            from configurator.app.audit_costs import price_audit

            priced = price_audit(path, report, costs)
    page = None
    if out:
        from configurator.app.audit_costs import audit_document, cost_lines
        from topology.report_html import write_audit_html

        page = write_audit_html(report, topo, out, force=force,
                                document=audit_document(report, priced),
                                costs=cost_lines(priced),
                                priced_for=priced.description if priced else "")
    return AuditOutcome(report=report, topology=topo, html_path=page, priced=priced)
