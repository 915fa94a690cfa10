"""The report page of a priced node-count sweep (``search --nodes-range … --train-tokens``):
the header, the plot of days and cost against nodes, and the table (everything escaped)."""

from __future__ import annotations

import base64
import html

from configurator.report.table import format_scaling


def training_scaling_html(header: str, rows: list[dict], png: bytes) -> str:
    """A self-contained HTML page: ``header`` lines, ``png`` (days and cost or GPU-hours
    against nodes, :func:`configurator.report.plot.training_scaling_png`) inline, and the
    sweep's table (:func:`format_scaling`)."""
    lines = "".join(f"<p>{html.escape(line)}</p>" for line in header.split("\n"))
    img = base64.b64encode(png).decode("ascii")
    table = html.escape(format_scaling(rows))
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>time to train"
            "</title></head><body><h1>Time, cost and energy to train</h1>" + lines
            + f"<img alt=\"days and cost against nodes\" src=\"data:image/png;base64,{img}\">"
            + f"<pre>{table}</pre></body></html>\n")
