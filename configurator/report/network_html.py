"""The report of ``configurator plan`` (``report.html``): one self-contained page holding the
audit (recommendation, the network's structure, every finding with its evidence, cause and
what it costs the chosen plan, the bandwidth heatmap with hosts ordered by island), the
chosen plan (ranked table, placement drawn on the islands and which parallel groups cross
them), the Gantt chart of its simulated schedule, the scaling curve and how to start the
job. Images are embedded PNGs (data: URIs); every section is an ``<h2>`` with an ``id``."""

from __future__ import annotations

import base64
import html
import io

from configurator.core.document import PlacementRecord

#: The page's sections, in order: (id, title).
SECTIONS = (("summary", "Summary"), ("next-steps", "How to start the job"),
            ("audit", "Audit of the measured links"), ("findings", "Findings and their cost"),
            ("heatmap", "Bandwidth heatmap"), ("plan", "Chosen plan"),
            ("placement", "Placement on the islands"), ("schedule", "Simulated schedule"),
            ("scaling", "Scaling"))


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
    fig, ax = plt.subplots(figsize=(4.0 * len(columns) + 0.5, 0.62 * rows + 1.3), dpi=110)
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
    """The page as one string (see the module docstring). ``report``: the
    :class:`topology.audit.AuditReport`; ``costs``: finding index → its
    :class:`configurator.app.audit_costs.FindingCost` list; ``crossings`` /
    ``default_crossings``: :class:`~configurator.app.audit_costs.GroupCrossing` lists of
    the chosen placement and of Megatron's order on the first hosts."""
    css = ("body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1400px}"
           "table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}"
           "th,td{border:1px solid #bbb;padding:3px 8px;text-align:left;vertical-align:top}"
           "th{background:#eee}pre{font-size:13px;background:#f6f6f6;padding:.6em;"
           "overflow-x:auto}img{max-width:100%}.rec{background:#fff4e5;border:1px solid "
           "#f0a040;padding:.8em}")
    d = report.to_dict()
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>{_esc(title)}</title><style>{css}</style></head><body>",
             f"<h1>{_esc(title)}</h1>"]

    def section(key):
        return f"<h2 id='{key}'>{_esc(dict(SECTIONS)[key])}</h2>"

    parts += [section("summary"), "<ul>" + "".join(f"<li>{_esc(s)}</li>" for s in summary)
              + "</ul>"]
    parts += [section("next-steps"), f"<pre>{_esc(chr(10).join(next_steps))}</pre>"]
    islands = d["islands"]
    parts += [section("audit"),
              f"<p>{len(d['hosts'])} hosts, {d['links_measured']} measured links; "
              + (f"{len(islands)} islands: "
                 + "; ".join("{" + ", ".join(i) + "}" for i in islands) if islands
                 else "no islands") + ".</p>",
              f"<div class='rec'>{_esc(d['recommendation']['text'])}</div>"]
    rows = []
    for i, f in enumerate(d["findings"]):
        cost = "; ".join(c.describe() for c in costs.get(i, [])) or "-"
        rows.append([i + 1, f["kind"], f["subject"], f["ratio"], "; ".join(f["evidence"]),
                     f["cause"], f["action"], cost])
    parts += [section("findings"),
              "<p>What each finding costs the chosen plan: its predicted iteration time with "
              "the finding repaired (its links at their class's healthy rate) or its host "
              "left out, against the time on the measured links (negative: faster).</p>",
              _table(["#", "kind", "what", "measured / healthy", "evidence", "usual cause",
                      "action", "cost for this plan"], rows)]
    parts += [section("heatmap"),
              "<p>Hosts ordered by island; hatched: not measured; red box: a flagged link."
              "</p>", _img(heatmap_png, "host by host bandwidth heatmap")]
    parts += [section("plan"), f"<pre>{_esc(table)}</pre>"]
    if placement is not None:
        parts.append(_table(["node rank", "host", "GPU of local rank 0, 1, …"],
                            [[n, h, " ".join(map(str, o))] for n, (h, o) in
                             enumerate(zip(placement.hosts, placement.gpu_order))]))
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
              "line: the critical path.</p>", _img(gantt_png, "Gantt chart of the schedule")]
    parts += [section("scaling"), f"<p>{_esc(scaling_note)}</p>"]
    if scaling_png:
        parts.append(_img(scaling_png, "tokens per second against nodes"))
    parts.append("</body></html>\n")
    return "\n".join(parts)
