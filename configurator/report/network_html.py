"""The report of ``configurator plan`` (``report.html``): one self-contained page that leads
with what matters: a headline (the plan and its time, the audit in one line, what the audit
changed: hosts left out or kept, the placement against Megatron's order, and what the
findings cost the plan: the lines ``plan`` prints, one source for both), how to start the
job, then the audit (recommendation, islands), the findings grouped by cause (each kind's
cause and action once, its hosts and links under the cost they share for this plan, priced
ones first, the evidence folded away), the bandwidth heatmap with hosts ordered by island,
the chosen plan (ranked table, placement drawn on the islands and which parallel groups
cross them), the Gantt chart of its simulated schedule and the scaling curve. Images are
embedded PNGs (data: URIs); every section is an ``<h2>`` with an ``id``."""

from __future__ import annotations

import base64
import html
import io

from configurator.core.document import PlacementRecord

#: The page's sections, in order: (id, title).
SECTIONS = (("headline", "Headline"), ("next-steps", "How to start the job"),
            ("audit", "Audit of the measured links"), ("findings", "Findings by cause"),
            ("heatmap", "Bandwidth heatmap"), ("plan", "Chosen plan"),
            ("placement", "Placement on the islands"), ("schedule", "Simulated schedule"),
            ("scaling", "Scaling"))
#: A finding's cost under this fraction of the iteration (in per cent) reads as "+0.0 %":
#: the precision the costs are printed at.
ZERO_PERCENT = 0.05

_CSS = ("body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1400px}"
        "table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}"
        "th,td{border:1px solid #bbb;padding:3px 8px;text-align:left;vertical-align:top}"
        "th{background:#eee}pre{font-size:13px;background:#f6f6f6;padding:.6em;"
        "overflow-x:auto;margin:.4em 0}img{max-width:100%}h2{margin:1em 0 .4em}"
        "h3{font-size:16px;margin:1em 0 .3em}p{margin:.4em 0}"
        ".rec{background:#fff4e5;border:1px solid #f0a040;padding:.6em .8em}"
        ".head{background:#eef5ff;border:1px solid #6a9ad8;padding:.6em 1em;font-size:15px}"
        ".head p{margin:.25em 0}.head .plan{font-size:18px;font-weight:bold}"
        ".why{color:#444;font-size:14px}.subj{font-size:13px;color:#333;margin:.2em 0 .5em 1.2em}"
        "details{margin:.3em 0 .6em}summary{cursor:pointer;color:#2256a3}")


def _esc(x) -> str:
    return html.escape(str(x))


def _table(headers, rows) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(png: bytes, alt: str) -> str:
    return (f"<img alt='{_esc(alt)}' src='data:image/png;base64,"
            f"{base64.b64encode(png).decode('ascii')}'>")


def _percent(c) -> str:
    """A finding cost's change as printed: ``+2.8 %``, ``+0.0 %`` under
    :data:`ZERO_PERCENT`, ``not priced``."""
    if c.delta_percent is None:
        return "not priced"
    return "+0.0 %" if abs(c.delta_percent) < ZERO_PERCENT else f"{c.delta_percent:+.1f} %"


def findings_html(findings, costs: dict) -> str:
    """The findings grouped by kind (:data:`topology.structure.FINDING_KINDS`): per kind
    its count, usual cause and action once, then its subjects (hosts, links) listed under
    the cost they share for this plan (priced changes first, largest first; the unpriced
    last, their reason said once), and each finding's evidence folded away. Kinds whose
    findings change the plan's time come first. ``costs``: finding index → its
    :class:`~configurator.app.audit_costs.FindingCost` list."""
    from topology.structure import CAUSES, FINDING_KINDS, KIND_NAMES, kind_action

    if not findings:
        return "<p>No finding: every measured link runs at its class's healthy level.</p>"
    groups = []
    for kind in FINDING_KINDS:
        members = [(i, f) for i, f in enumerate(findings) if f.kind == kind]
        if not members:
            continue
        buckets: dict[tuple, list] = {}
        for i, f in members:
            for c in costs.get(i) or [None]:
                if c is None:           # a finding nothing priced for this plan
                    buckets.setdefault(("repairing", "not priced", ""), []).append((f, c))
                    continue
                verb = "leaving out" if c.what.startswith("leaving out") else "repairing"
                buckets.setdefault((verb, _percent(c), c.note), []).append((f, c))
        deltas = [abs(c.delta_percent) for i, _ in members for c in costs.get(i, [])
                  if c.delta_percent is not None]
        weight = (0 if deltas and max(deltas) >= ZERO_PERCENT else 1 if deltas else 2,
                  -max(deltas, default=0.0))
        groups.append((weight, kind, members, buckets))
    parts = []
    for _, kind, members, buckets in sorted(groups, key=lambda g: g[0]):
        n = len(members)
        action = members[0][1].action if n == 1 else kind_action(kind)
        one = (f": {members[0][1].subject}" if kind != "islands" else "") + (
            f" (measured / expected {members[0][1].ratio:.2f})") if n == 1 else ""
        parts.append(f"<h3>{n} {_esc(KIND_NAMES[kind][n != 1])}{_esc(one)}</h3>"
                     f"<p class='why'><b>Usual cause:</b> {_esc(CAUSES[kind])}. "
                     f"<b>Action:</b> {_esc(action)}.</p>")

        def order(item):
            (verb, pct, note), rows = item
            d = None if rows[0][1] is None else rows[0][1].delta_percent
            return (d is None, -abs(d or 0.0), verb)

        for (verb, pct, note), rows in sorted(buckets.items(), key=order):
            if len(rows) == 1:
                f, c = rows[0]
                what = f"{verb} {f.subject}" if c is None else c.what
                parts.append(f"<p><b>{_esc(pct)}</b> {_esc(what)}"
                             + (f" ({_esc(note)})" if note else "")
                             + (f" (measured / expected {f.ratio:.2f})" if n > 1 else "")
                             + "</p>")
                continue
            lead = (f"each, {verb} any of these {len(rows)}" if pct != "not priced"
                    else f"({verb} these {len(rows)})")
            parts.append(f"<p><b>{_esc(pct)}</b> {lead}"
                         + (f": {_esc(note)}" if note else "") + "</p>"
                         "<p class='subj'>" + ", ".join(
                             f"{_esc(f.subject)} ({f.ratio:.2f})" for f, _ in
                             sorted(rows, key=lambda r: r[0].ratio)) + "</p>")
        if n > 1 or kind != "islands":
            parts.append(f"<details><summary>evidence of the {n} "
                         f"{_esc(KIND_NAMES[kind][n != 1])} (per measurement class)"
                         f"</summary>"
                         + _table(["what", "measured / expected", "evidence"],
                                  [[f.subject, f"{f.ratio:.3f}", "; ".join(f.evidence)]
                                   for _, f in members]) + "</details>")
        else:
            parts.append("<p class='subj'>" + _esc("; ".join(members[0][1].evidence))
                         + "</p>")
    parts.append("<p class='why'>Each cost: the plan's predicted iteration time with the "
                 "finding repaired (its links at their class's healthy rate) or its host left "
                 "out, against the time on the measured links (negative: faster). In "
                 "brackets after a host or link: its measured bandwidth over the expected one "
                 "(its class's healthy rate; for a link slower at large messages, its largest "
                 "messages' rate over its fitted rate).</p>")
    return "\n".join(parts)


def placement_png(hosts: list[str], node_hosts: list[str], islands, plan,
                  gpus_per_node: int, *, title: str = "") -> bytes:
    """PNG of a placement on the islands: one column per island (hosts in no island in a
    last column), one box per host showing its node rank, the pipeline stages and
    data-parallel ranks it runs (Megatron's rank order tp-cp-ep-dp-pp), coloured by its
    first pipeline stage; idle hosts grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    columns = [list(isl) for isl in islands]
    rest = [h for h in hosts if not any(h in c for c in columns)]
    if rest or not columns:
        columns.append(rest)
    names = [f"island {i + 1}" for i in range(len(islands))] + (
        ["other hosts" if islands else "hosts"] if len(columns) > len(islands) else [])
    rank_of = {h: n for n, h in enumerate(node_hosts)}
    per_stage = plan.world_size // plan.pp
    per_dp = plan.tp * plan.cp
    cmap = plt.get_cmap("tab20" if plan.pp > 10 else "tab10")
    rows = max(len(c) for c in columns)
    fig, ax = plt.subplots(figsize=(4.0 * len(columns) + 0.5, 0.42 * rows + 1.1), dpi=110)
    for x, (col, name) in enumerate(zip(columns, names)):
        ax.text(x, -0.9, name, ha="center", va="center", fontsize=11, weight="bold")
        ax.add_patch(FancyBboxPatch((x - 0.47, -0.55), 0.94, len(col) + 0.1,
                                    boxstyle="round,pad=0.02", facecolor="#f4f4f4",
                                    edgecolor="#888888"))
        for y, h in enumerate(col):
            n = rank_of.get(h)
            if n is None:
                color, text = "#cccccc", f"{h}: idle"
            else:
                ranks = range(n * gpus_per_node, (n + 1) * gpus_per_node)
                stages = sorted({r // per_stage for r in ranks})
                dps = sorted({(r // per_dp) % plan.dp for r in ranks})
                color = cmap(stages[0] % cmap.N)
                text = (f"{h}: node {n}, stage {_span(stages)}, dp {_span(dps)}")
            ax.add_patch(FancyBboxPatch((x - 0.43, y - 0.38), 0.86, 0.76,
                                        boxstyle="round,pad=0.01", facecolor=color,
                                        edgecolor="#333333", alpha=0.85))
            ax.text(x, y, text, ha="center", va="center", fontsize=8.5, parse_math=False)
    ax.set_xlim(-0.55, len(columns) - 0.45)
    ax.set_ylim(rows + 0.1, -1.3)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11, parse_math=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _span(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def render_network_html(*, title: str, summary: list[str], next_steps: list[str], report,
                        costs: dict, heatmap_png: bytes, table: str,
                        placement: PlacementRecord | None,
                        crossings: list, default_crossings: list, placement_png: bytes,
                        gantt_png: bytes, scaling_png: bytes | None,
                        scaling_note: str = "") -> str:
    """The page as one string (see the module docstring). ``summary``: the lines ``plan``
    prints (the headline shows them as they are: one source for the terminal and the
    page; the first is the plan and its time); ``report``: the
    :class:`topology.audit.AuditReport`; ``costs``: finding index → its
    :class:`configurator.app.audit_costs.FindingCost` list; ``crossings`` /
    ``default_crossings``: :class:`~configurator.app.audit_costs.GroupCrossing` lists of
    the chosen placement and of Megatron's order on the first hosts."""
    d = report.to_dict()
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{_esc(title)}</h1>"]

    def section(key):
        return f"<h2 id='{key}'>{_esc(dict(SECTIONS)[key])}</h2>"

    lead, *rest = summary or [""]
    parts += [section("headline"), "<div class='head'>",
              f"<p class='plan'>{_esc(lead)}</p>",
              *(f"<p>{_esc(s)}</p>" for s in rest), "</div>"]
    parts += [section("next-steps"), f"<pre>{_esc(chr(10).join(next_steps))}</pre>"]
    islands = d["islands"]
    parts += [section("audit"),
              f"<p>{len(d['hosts'])} hosts, {d['links_measured']} measured links; "
              + (f"{len(islands)} islands: "
                 + "; ".join("{" + ", ".join(i) + "}" for i in islands) if islands
                 else "no islands") + ".</p>",
              f"<div class='rec'>{_esc(d['recommendation']['text'])}</div>"]
    parts += [section("findings"), findings_html(report.findings, costs)]
    parts += [section("heatmap"),
              "<p>Hosts ordered by island; hatched: not measured; red box: a flagged link."
              "</p>", _img(heatmap_png, "host by host bandwidth heatmap")]
    parts += [section("plan"), f"<pre>{_esc(table)}</pre>"]
    if placement is not None:
        parts.append("<details><summary>node rank, host and GPU order of each node (the "
                     "launch scripts enforce them)</summary>"
                     + _table(["node rank", "host", "GPU of local rank 0, 1, …"],
                              [[n, h, " ".join(map(str, o))] for n, (h, o) in
                               enumerate(zip(placement.hosts, placement.gpu_order))])
                     + "</details>")
    parts += [section("placement"),
              "<p>Which groups of ranks span more than one island, with this placement and "
              "with Megatron's order on the first hosts:</p>",
              _table(["groups", "of them crossing islands (this placement)",
                      "crossing islands (Megatron's order)"],
                     [[f"{c.dim} ({c.groups})", c.crossing, dc.crossing]
                      for c, dc in zip(crossings, default_crossings)]),
              _img(placement_png, "placement of the plan's ranks on the islands")]
    parts += [section("schedule"),
              "<p>One row per pipeline rank of the slowest data-parallel replica; the black "
              "line: the critical path; the iteration time is the table's.</p>",
              _img(gantt_png, "Gantt chart of the schedule")]
    parts += [section("scaling"), f"<p>{_esc(scaling_note)}</p>"]
    if scaling_png:
        parts.append(_img(scaling_png, "tokens per second against nodes"))
    parts.append("</body></html>\n")
    return "\n".join(parts)
