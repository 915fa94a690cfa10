"""Self-contained HTML report of a cluster audit: host×host bandwidth heatmaps (one panel per
inter-node link class, GB/s colour bar, unmeasured pairs hatched, flagged links outlined in
red, bimodal classes marked in the panel title), the flagged links/nodes, bimodal classes,
per-node statistics, baselines and the recommendation.

Legibility: tick labels are ``tick_font_pt(n)`` points (10 pt up to 32 hosts, 9 pt up to 64,
then 7 pt), titles and colour-bar labels 12 pt, and each heatmap cell is 2.6 tick-label
heights, so the figure grows with the host count instead of shrinking its text.

``write_audit_html`` writes ``index.html`` (the heatmap embedded as a base64 PNG),
``heatmap.png`` and ``audit.json`` into one directory.
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import statistics
import textwrap
from pathlib import Path

from configurator.core import jsonout
from configurator.core.errors import InputError
from configurator.core.units import GB
from topology.audit import AuditReport
from topology.link_classes import class_label, measurement_classes
from topology.topofile import Topology, host_sort_key

FILES = ("index.html", "heatmap.png", "audit.json")
#: Font sizes of the heatmap's titles and axis labels (points; set by hand for legibility).
TITLE_FONT_PT = 12
LABEL_FONT_PT = 11


def tick_font_pt(hosts: int) -> float:
    """Tick-label size (points) for a heatmap of ``hosts`` hosts: 10 up to 32, 9 up to 64,
    else 7."""
    return 10.0 if hosts <= 32 else 9.0 if hosts <= 64 else 7.0


def pair_matrices(topo: Topology, order: list[str] | None = None
                  ) -> dict[str, tuple[list[str], list[list[float]]]]:
    """Host×host matrices of inter-node bandwidth per class label, bytes/s, hosts in
    ``order`` (default: natural order of their names).

    ``m[i][j]`` is the median of the links ``hosts[i] → hosts[j]`` (over GPU indices); a pair
    measured in one direction only shows that value both ways (a 2-rank nccl-tests sendrecv is
    bidirectional); ``nan`` = not measured; the diagonal is ``nan``.
    """
    hosts = list(order) if order else sorted(topo.hosts, key=host_sort_key)
    index = {h: i for i, h in enumerate(hosts)}
    raw: dict[str, dict[tuple[int, int], list[float]]] = {}
    for key, recs in measurement_classes(topo).items():
        if key[0] != "inter-node":
            continue
        cells = raw.setdefault(class_label(key), {})
        for ((a, _), (b, _)), vals in recs.items():
            if a in index and b in index:
                cells.setdefault((index[a], index[b]), []).extend(vals)
    out = {}
    for label, cells in raw.items():
        n = len(hosts)
        m = [[math.nan] * n for _ in range(n)]
        for (i, j), v in cells.items():
            m[i][j] = statistics.median(v)
        for (i, j) in cells:
            if (j, i) not in cells:
                m[j][i] = m[i][j]
        out[label] = (hosts, m)
    return out


def heatmap_png(report: AuditReport, topo: Topology, dpi: int = 110) -> bytes:
    """Render the heatmap panels to PNG bytes (matplotlib, Agg backend) at ``dpi``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    islands = report.islands
    mats = pair_matrices(topo, report.structure.host_order(topo.hosts) if report.structure
                         else None)
    order = [b.label for b in report.baselines if b.label in mats]
    slow = {(f.link_class, f.src, f.dst) for f in report.flagged_links}
    bimodal = {b.label: b for b in report.bimodal_classes}
    n = max(1, len(order))
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    size = max(len(topo.hosts), 2)
    tick_pt = tick_font_pt(size)
    cell = max(0.6 if size <= 8 else 0.0, tick_pt * 2.6 / 72)       # inches per host
    longest = max((len(h) for h in topo.hosts), default=4)
    margin = longest * tick_pt * 0.62 / 72                          # rotated tick labels
    panel_w = size * cell + margin + 2.4
    panel_h = size * cell + margin + 1.9
    fig, axes = plt.subplots(rows, cols, squeeze=False, layout="constrained",
                             figsize=(cols * panel_w, rows * panel_h + 0.6))
    wrap = max(30, int(panel_w * 72 / (TITLE_FONT_PT * 0.6)))      # characters per line
    for ax in axes.flat[len(order):]:
        ax.axis("off")
    if not order:
        axes[0][0].text(0.5, 0.5, "no inter-node measurements", ha="center", va="center")
    for ax, label in zip(axes.flat, order):
        hosts, m = mats[label]
        arr = np.array(m, dtype=float) / GB
        # Colour scale from 0 so that ±1 % noise does not look like a fault.
        top = np.nanmax(arr) if np.isfinite(arr).any() else 1.0
        im = ax.imshow(np.ma.masked_invalid(arr), cmap="viridis", interpolation="nearest",
                       vmin=0.0, vmax=top)
        # one collection per kind of cell outline: far fewer artists to draw
        diag = [Rectangle((i - .5, i - .5), 1, 1) for i in range(len(hosts))]
        ax.add_collection(PatchCollection(diag, facecolor="#ffffff", edgecolor="#ffffff"))
        unmeasured = [Rectangle((j - .5, i - .5), 1, 1) for i in range(len(hosts))
                      for j in range(len(hosts)) if i != j and math.isnan(arr[i, j])]
        if unmeasured:
            ax.add_collection(PatchCollection(unmeasured, facecolor="#e6e6e6",
                                              edgecolor="#555555", hatch="xx", linewidth=0))
        idx = {h: i for i, h in enumerate(hosts)}
        boxes = {(i, j) for (lab, s, d) in slow
                 if lab == label and s in idx and d in idx and s != d
                 for (i, j) in ((idx[s], idx[d]), (idx[d], idx[s]))}
        if boxes:
            ax.add_collection(PatchCollection(
                [Rectangle((j - .5, i - .5), 1, 1) for i, j in sorted(boxes)],
                facecolor="none", edgecolor="red", linewidth=1.6))
        # island boundaries (hosts are ordered by island)
        edge = 0
        for isl in islands[:-1]:
            edge += len(isl)
            ax.axhline(edge - 0.5, color="white", linewidth=2.2)
            ax.axvline(edge - 0.5, color="white", linewidth=2.2)
        # host names and labels come from input files: never parse them as mathtext ($…$)
        ax.set_xticks(range(len(hosts)), hosts, rotation=90, fontsize=tick_pt,
                      parse_math=False)
        ax.set_yticks(range(len(hosts)), hosts, fontsize=tick_pt, parse_math=False)
        ax.set_xlabel("dst host", fontsize=LABEL_FONT_PT)
        ax.set_ylabel("src host", fontsize=LABEL_FONT_PT)
        title = label
        if label in bimodal:
            b = bimodal[label]
            title += (f" — bimodal: {b.slow_median_Bps / GB:.1f} / "
                      f"{b.fast_median_Bps / GB:.1f} GB/s")
        ax.set_title("\n".join(textwrap.wrap(title, wrap)), fontsize=TITLE_FONT_PT,
                     parse_math=False)
        cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
        cb.set_label("bandwidth (GB/s)", fontsize=LABEL_FONT_PT)
        cb.ax.tick_params(labelsize=tick_pt)
    sup = ("Inter-node bandwidth (hatched: not measured; red box: flagged"
           + ("; white lines: island boundaries, hosts ordered by island)" if islands
              else ")"))
    sup_wrap = max(30, int(cols * panel_w * 72 / ((TITLE_FONT_PT + 1) * 0.6)))
    fig.suptitle("\n".join(textwrap.wrap(sup, sup_wrap)), fontsize=TITLE_FONT_PT + 1)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def _table(headers: list[str], rows: list[list[object]]) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def findings_table(d: dict, costs: dict | None = None) -> str:
    """The findings of an audit's JSON ``d`` as an HTML table (kind, what, measured over
    healthy, evidence, usual cause, action; with ``costs``, finding index -> lines saying
    what it costs a plan)."""
    heads = ["#", "kind", "what", "measured / healthy", "evidence", "usual cause", "action"]
    if costs is not None:
        heads.append("cost for the plan")
    rows = []
    for i, f in enumerate(d["findings"]):
        row = [i + 1, f["kind"], f["subject"], f["ratio"], "; ".join(f["evidence"]),
               f["cause"], f["action"]]
        if costs is not None:
            row.append("; ".join(costs.get(i, [])) or "-")
        rows.append(row)
    return _table(heads, rows)


def render_html(report: AuditReport, png: bytes, costs: dict | None = None,
                priced_for: str = "") -> str:
    """The report page as one string; the PNG is embedded as a data: URI. ``costs``:
    finding index -> what it costs the plan ``priced_for`` describes (lines), or None."""
    d = report.to_dict()
    islands = d["islands"]
    rec = d["recommendation"]
    b64 = base64.b64encode(png).decode("ascii")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>Cluster audit</title><style>",
        "body{font-family:sans-serif;margin:1.5em;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}"
        "th,td{border:1px solid #bbb;padding:3px 8px;text-align:left}"
        "td:not(:last-child){white-space:nowrap}"
        "th{background:#eee}.rec{background:#fff4e5;border:1px solid #f0a040;padding:.8em}"
        "img{max-width:100%}",
        "</style></head><body>",
        "<h1>Cluster audit</h1>",
        f"<p>{len(d['hosts'])} hosts, {d['links_measured']} measured links, "
        f"{len(d['flagged_links'])} flagged links, {len(d['flagged_nodes'])} flagged nodes, "
        f"{len(d['bimodal_classes'])} bimodal classes, "
        f"{len(d['missing_links'])} missing measurements.</p>",
        "<h2>Recommendation</h2>",
        _recommendation(rec),
        "<h2>Structure and findings</h2>",
        "<p>" + (f"{len(islands)} islands: " + html.escape("; ".join(
            "{" + ", ".join(i) + "}" for i in islands)) if islands else "No islands")
        + ".</p>",
        (f"<p>Costs priced for {html.escape(priced_for)}.</p>" if priced_for else ""),
        findings_table(d, costs),
        "<h2>Bandwidth heatmap</h2>",
        f"<img alt='host by host bandwidth heatmap' src='data:image/png;base64,{b64}'>",
        "<h2>Flagged nodes</h2>",
        _table(["host", "slow partner fraction", "reason"],
               [[n["host"], n["slow_partner_fraction"], n["reason"]]
                for n in d["flagged_nodes"]]),
        "<h2>Flagged links</h2>",
        _table(["src", "dst", "kind", "measured GB/s", "expected GB/s", "ratio", "class",
                "reason"],
               [[_ep(f["src"], f["src_gpu"]), _ep(f["dst"], f["dst_gpu"]), f["kind"],
                 f["measured_GBps"], f["expected_GBps"], f["ratio"], f["class"], f["reason"]]
                for f in d["flagged_links"]]),
        "<h2>Bimodal classes</h2>",
        _table(["class", "members", "slow mode (count, median GB/s)",
                "fast mode (count, median GB/s)", "ratio", "separation", "mostly slow hosts",
                "slow pairs", "reason"],
               [[b["class"], b["members"], f"{b['slow_count']} at {b['slow_median_GBps']}",
                 f"{b['fast_count']} at {b['fast_median_GBps']}", b["ratio"], b["separation"],
                 ", ".join(b["slow_hosts"]) or "-",
                 ", ".join(f"{x} \u2194 {y}" for x, y in b["slow_pairs"]), b["reason"]]
                for b in d["bimodal_classes"]]),
        "<h2>Missing measurements</h2>",
        _table(["src", "dst", "class", "reason"],
               [[m["src"], m["dst"], m["class"] or "-", m["reason"]]
                for m in d["missing_links"]]),
        "<h2>Class baselines</h2>",
        _table(["class", "links", "median GB/s", "scaled MAD GB/s", "min GB/s", "max GB/s"],
               [[b["class"], b["links"], b["median_GBps"], b["scaled_mad_GBps"],
                 b["min_GBps"], b["max_GBps"]] for b in d["baselines"]]),
        "<h2>Per-node statistics</h2>",
        _table(["host", "class", "median GB/s", "links", "partners", "slow partners",
                "slow fraction"],
               [[s["host"], s["class"], s["median_GBps"], s["links"], s["partners"],
                 s["slow_partners"], s["slow_partner_fraction"]] for s in d["node_stats"]]),
    ]
    if d["warnings"]:
        parts += ["<h2>Warnings</h2><ul>"]
        parts += [f"<li>{html.escape(w)}</li>" for w in d["warnings"]]
        parts += ["</ul>"]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _recommendation(rec: dict) -> str:
    return f"<div class='rec'>{html.escape(rec['text'])}</div>"


def _ep(host: str, gpu) -> str:
    return host if gpu is None else f"{host}/gpu{gpu}"


def write_audit_html(report: AuditReport, topo: Topology, out_dir: str | os.PathLike,
                     force: bool = False, *, document: dict | None = None,
                     costs: dict | None = None, priced_for: str = "") -> Path:
    """Write ``index.html``, ``heatmap.png`` and ``audit.json`` (``document``, default the
    report's JSON) into ``out_dir``; ``costs`` and ``priced_for`` as :func:`render_html`.

    Returns the path of ``index.html``. Raises :class:`InputError` when ``out_dir`` is a
    file, or an existing non-empty directory and ``force`` is False (nothing is written then).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("--out", str(out), "is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InputError("--out", str(out), "directory exists and is not empty; "
                                            "use --force to overwrite its report files")
    try:
        out.mkdir(parents=True, exist_ok=True)
        png = heatmap_png(report, topo)
        (out / "heatmap.png").write_bytes(png)
        (out / "audit.json").write_text(jsonout.dumps(document or report.to_dict(), indent=2)
                                        + "\n", encoding="utf-8")
        page = out / "index.html"
        page.write_text(render_html(report, png, costs, priced_for), encoding="utf-8")
    except OSError as err:
        raise InputError("--out", str(out), f"cannot write ({err.strerror})") from None
    return page
