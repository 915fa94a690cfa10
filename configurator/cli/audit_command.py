"""``configurator audit``: the network's structure (islands, slow hosts, slow pairs and
directions, links slower at large messages) and its symptoms (slow and asymmetric links,
bimodal classes, unmeasured pairs); with ``--model`` (and ``--gbs`` or ``--plan``), what each
finding costs that job.

Input is a topology file (``--topology topo.json``) or nccl-tests logs / directories of them.
Exit 0 whenever the report was made (problems found are the report, not an error); 2 on bad
input.
"""

from __future__ import annotations

import sys

from configurator.app.topology_jobs import audit_cluster
from configurator.cli.options import (add_force, add_json, add_out, add_training_options,
                                      integer,
                                      option_groups)
from configurator.core import jsonout
from configurator.core.plan import PLAN_FIELD
from configurator.core.units import GB

MAX_WARNINGS_SHOWN = 5
MAX_PAIRS_SHOWN = 12
#: Findings of one kind the text lists before counting the rest.
MAX_FINDINGS_SHOWN = 8


def add_audit_arguments(p) -> None:
    p.add_argument("paths", nargs="*", metavar="LOG_OR_DIR",
                   help="nccl-tests log files or directories of them (instead of --topology)")
    groups = option_groups(p)
    g = groups["model and cluster"]
    g.add_argument("--model", help="price each finding for a job of this model (a preset, a "
                                   "YAML/JSON file, a Hugging Face config.json or model id "
                                   "owner/name)")
    g.add_argument("--gbs", type=integer, help="with --model: the global batch size of its plan")
    g.add_argument("--cluster", metavar="PRESET_OR_FILE",
                   help="with --model: the cluster preset or file (default: the one whose GPU "
                        "the measurements name)")
    g.add_argument("--nodes", type=integer,
                   help="with --model: hosts the plan uses (default all; the placement picks "
                        "which)")
    g.add_argument("--seq-length", type=integer, help="with --model: its sequence length")
    g.add_argument("--plan", metavar="FILE",
                   help="with --model: price the findings for this saved plan (plan.json) "
                        "instead of the search's best")
    f = PLAN_FIELD["precision"]
    groups["precision and kernels"].add_argument(
        f.cli_flag, dest="precision", choices=f.choices, default=None,
        help="with --model: the search's precision (default bf16)")
    groups["topology and placement"].add_argument(
        "--topology", metavar="FILE", help="measured topology (YAML or JSON)")
    groups["topology and placement"].add_argument(
        "--seed", type=integer, default=0, help="seed of the placement search (default 0)")
    add_training_options(groups["time to train"])
    g = groups["output"]
    add_out(g, "write index.html (heatmap embedded), heatmap.png and audit.json here",
            metavar="DIR")
    add_json(g, "the report")
    add_force(g, "the report files in a non-empty --out directory")


def run_audit(args) -> int:
    from configurator.app.audit_costs import CostRequest, audit_document, cost_lines
    from configurator.cli.plan_commands import training_request
    from configurator.core.errors import InputError

    costs = None
    if args.model:
        options = {"precision": args.precision} if args.precision else {}
        costs = CostRequest(model=args.model, global_batch_size=args.gbs,
                            cluster=args.cluster, nodes=args.nodes,
                            seq_length=args.seq_length, plan=args.plan, options=options,
                            seed=args.seed, training=training_request(args))
    else:
        given = [k for k in ("gbs", "cluster", "nodes", "seq_length", "plan", "precision",
                             "train_tokens") if getattr(args, k) is not None]
        if given:
            raise InputError(given[0], getattr(args, given[0]), "prices the findings for a "
                             "job: needs --model")
    out = audit_cluster(topology=args.topology, paths=args.paths, out=args.out,
                        force=args.force, costs=costs)
    if args.json:
        print(jsonout.dumps(audit_document(out.report, out.priced), indent=2))
    else:
        print(format_text(out.report, cost_lines(out.priced),
                          out.priced.description if out.priced else ""))
    if out.html_path is not None:
        print(f"wrote {out.html_path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _ep(host, gpu):
    return host if gpu is None else f"{host}/gpu{gpu}"


def format_findings(report, costs: dict | None = None, priced_for: str = "") -> list[str]:
    """The structure and the findings, each with its evidence, usual cause and action (and
    its cost, when ``costs`` maps finding indices to lines): at most
    :data:`MAX_FINDINGS_SHOWN` of a kind, the rest counted."""
    from topology.structure import FINDING_KINDS, count_findings

    out = []
    islands = report.islands
    out.append("Structure: " + (f"{len(islands)} islands: " + "; ".join(
        "{" + ", ".join(i) + "}" for i in islands) if islands else "no islands"))
    found = report.findings
    none = ("none" if not report.unaudited_hosts
            else f"none among the audited hosts; {len(report.unaudited_hosts)} not audited")
    out.append(f"Findings ({count_findings(found) or none})"
               + (f", priced for {priced_for}" if priced_for and found else "") + ":")
    for kind in FINDING_KINDS:
        mine = [(i, f) for i, f in enumerate(found) if f.kind == kind]
        for i, f in mine[:MAX_FINDINGS_SHOWN]:
            direction = f" ({f.direction})" if f.kind == "slow_host" else ""
            out.append(f"  [{f.kind}] {f.subject}{direction}: {100 * f.ratio:.0f} % of the "
                       f"healthy rate")
            out += [f"      seen in {e}" for e in f.evidence[:3]]
            if len(f.evidence) > 3:
                out.append(f"      and in {len(f.evidence) - 3} more classes")
            out.append(f"      usual cause: {f.cause}")
            out.append(f"      action: {f.action}")
            out += [f"      cost: {c}" for c in (costs or {}).get(i, [])]
        if len(mine) > MAX_FINDINGS_SHOWN:
            out.append(f"  ... and {len(mine) - MAX_FINDINGS_SHOWN} more [{kind}] findings "
                       f"(--json lists them)")
    return out


def format_text(report, costs: dict | None = None, priced_for: str = "") -> str:
    """Readable summary: the structure and findings first (with their costs when priced),
    then the symptoms (baselines, flagged nodes and links, bimodal classes, missing pairs),
    and the recommendation."""
    out = [f"Audit of {len(report.hosts)} hosts, {report.links_measured} measured links."]
    if report.coverage_warning:
        out.append(f"Warning: {report.coverage_warning}")
    out += format_findings(report, costs, priced_for)
    out.append("Class baselines (median / scaled MAD, GB/s):")
    for b in report.baselines:
        out.append(f"  {b.label}: {b.median_Bps / GB:.2f} / {b.scaled_mad_Bps / GB:.3f} "
                   f"over {b.links} links")
    out.append(f"Flagged nodes ({len(report.flagged_nodes)}):")
    for n in report.flagged_nodes:
        out.append(f"  {n.host}: {n.reason}")
    out.append(f"Flagged links ({len(report.flagged_links)}):")
    for f in report.flagged_links:
        arrow = "<->" if f.both_directions else "->"
        out.append(f"  [{f.kind}] {_ep(f.src, f.src_gpu)}{arrow}{_ep(f.dst, f.dst_gpu)} "
                   f"{f.measured_Bps / GB:.2f} GB/s, expected {f.expected_Bps / GB:.2f} "
                   f"(ratio {f.ratio:.2f}) in [{f.link_class}]")
    bimodal = report.bimodal_classes
    out.append(f"Bimodal classes ({len(bimodal)}):")
    for b in bimodal:
        shown = ", ".join(f"{x}<->{y}" for x, y in b.slow_pairs[:MAX_PAIRS_SHOWN])
        more = len(b.slow_pairs) - MAX_PAIRS_SHOWN
        out.append(f"  [{b.label}] slow mode {b.slow_count} at {b.slow_median_Bps / GB:.2f} "
                   f"GB/s, fast mode {b.fast_count} at {b.fast_median_Bps / GB:.2f} GB/s "
                   f"(ratio {b.ratio:.2f}, separation {b.separation:.1f})"
                   + (f"; mostly slow hosts: {', '.join(b.slow_hosts)}" if b.slow_hosts
                      else ""))
        out.append(f"    slow pairs ({len(b.slow_pairs)}): {shown}"
                   + (f" and {more} more (see --json)" if more > 0 else ""))
    by_class: dict[str, list[str]] = {}
    failures = []
    for m in report.missing_links:
        if m.link_class is None:
            failures.append(f"  {m.src}<->{m.dst}: {m.reason}")
        else:
            by_class.setdefault(m.link_class, []).append(f"{m.src}<->{m.dst}")
    out.append(f"Unmeasured host pairs ({sum(map(len, by_class.values()))}):")
    for label, pairs in by_class.items():
        out.append(f"  [{label}] {len(pairs)}: " + ", ".join(pairs))
    out.append(f"Failed or absent measurements recorded in the inputs ({len(failures)}):")
    out.extend(failures)
    shown = report.warnings[:MAX_WARNINGS_SHOWN]
    for w in shown:
        out.append(f"Warning: {w}")
    if len(report.warnings) > len(shown):
        out.append(f"... and {len(report.warnings) - len(shown)} more warnings (see --json)")
    out.append("Recommendation: " + report.recommendation)
    return "\n".join(out)
