"""Self-contained HTML report of a search's best plan (``report.html`` of ``search --out``):
the header, the ranked table, the plan's placement (node rank → host, GPU order, idle hosts,
what it gains over Megatron's order and over random placements) and a Gantt chart of its
simulated schedule with the critical path highlighted (:mod:`configurator.report.gantt`)."""

from __future__ import annotations

import base64
import html

from configurator.core.document import PlacementRecord


def _table(headers: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_plan_html(*, title: str, header: str, table: str,
                     placement: PlacementRecord | None, gantt_png: bytes) -> str:
    """The page as one string; the Gantt PNG is embedded as a data: URI. ``table``: the
    ranked table as text; ``placement``: the best plan's placement record or None."""
    b64 = base64.b64encode(gantt_png).decode("ascii")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>",
        "body{font-family:sans-serif;margin:1.5em;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}"
        "th,td{border:1px solid #bbb;padding:3px 8px;text-align:left}th{background:#eee}"
        "pre{font-size:13px;background:#f6f6f6;padding:.6em;overflow-x:auto}"
        "img{max-width:100%}",
        "</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<pre>{html.escape(header)}</pre>",
        "<h2>Simulated schedule of the best plan</h2>",
        "<p>One row per pipeline rank of the slowest data-parallel replica; forward and "
        "backward chunks; the black line: the critical path; after the last backward: the exposed "
        "data-parallel reduction.</p>",
        f"<img alt='Gantt chart of the simulated pipeline schedule' "
        f"src='data:image/png;base64,{b64}'>",
        "<h2>Ranked plans</h2>",
        f"<pre>{html.escape(table)}</pre>",
    ]
    if placement is not None:
        p = placement
        parts += [
            "<h2>Placement</h2>",
            _table(["method", "iteration time (s)", "Megatron's order on the first hosts (s)",
                    "random median (s)", "idle hosts"],
                   [[p.method, _num(p.iteration_time_s), _num(p.default_iteration_time_s),
                     _num(p.random_median_iteration_time_s),
                     ", ".join(p.excluded_hosts) or "none"]]),
            _table(["node rank", "host", "GPU of local rank 0, 1, …"],
                   [[i, h, " ".join(map(str, o))]
                    for i, (h, o) in enumerate(zip(p.hosts, p.gpu_order))]),
        ]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _num(x) -> str:
    return "-" if x is None else f"{x:.3f}"
