"""``configurator audit``: report slow/asymmetric links, slow nodes, bimodal classes and
unmeasured pairs.

Input is a topology file (``--topology topo.json``) or nccl-tests logs / directories of them.
Exit 0 whenever the report was made (problems found are the report, not an error); 2 on bad
input.
"""

from __future__ import annotations

import sys

from configurator.app.topology_jobs import audit_cluster
from configurator.cli.options import add_force, add_json, add_out, option_groups
from configurator.core import jsonout
from configurator.core.units import GB

MAX_WARNINGS_SHOWN = 5
MAX_PAIRS_SHOWN = 12


def add_audit_arguments(p) -> None:
    p.add_argument("paths", nargs="*", metavar="LOG_OR_DIR",
                   help="nccl-tests log files or directories of them (instead of --topology)")
    groups = option_groups(p)
    groups["topology and placement"].add_argument(
        "--topology", metavar="FILE", help="measured topology (YAML or JSON)")
    g = groups["output"]
    add_out(g, "write index.html (heatmap embedded), heatmap.png and audit.json here",
            metavar="DIR")
    add_json(g, "the report")
    add_force(g, "the report files in a non-empty --out directory")


def run_audit(args) -> int:
    out = audit_cluster(topology=args.topology, paths=args.paths, out=args.out,
                        force=args.force)
    if args.json:
        print(jsonout.dumps(out.report.to_dict(), indent=2))
    else:
        print(format_text(out.report))
    if out.html_path is not None:
        print(f"wrote {out.html_path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _ep(host, gpu):
    return host if gpu is None else f"{host}/gpu{gpu}"


def format_text(report) -> str:
    """Readable summary: baselines, flagged nodes and links, bimodal classes, missing pairs,
    recommendation."""
    out = [f"Audit of {len(report.hosts)} hosts, {report.links_measured} measured links."]
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
