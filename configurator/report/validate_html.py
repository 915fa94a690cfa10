"""HTML report of ``configurator validate``: per-group agreement and a predicted-vs-measured
scatter plot (log-log, the ±10 % band drawn), then every run."""

from __future__ import annotations

import base64
import html
import io


def scatter_png(checks, title: str) -> bytes:
    """PNG: measured (x) against predicted (y) iteration time per run, one colour per group,
    the identity line and a ±10 % band (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6), dpi=120)
    timed = [c for c in checks if c.error is not None]
    groups = list(dict.fromkeys(c.group for c in timed))
    for g in groups:
        xs = [c.measured_iteration_time_s for c in timed if c.group == g]
        ys = [c.predicted_iteration_time_s for c in timed if c.group == g]
        ax.scatter(xs, ys, s=18, alpha=0.75, label=g)
    if timed:
        lo = min(min(c.measured_iteration_time_s, c.predicted_iteration_time_s) for c in timed)
        hi = max(max(c.measured_iteration_time_s, c.predicted_iteration_time_s) for c in timed)
        line = [lo / 1.2, hi * 1.2]
        ax.plot(line, line, color="black", linewidth=1, label="predicted = measured")
        ax.fill_between(line, [x * 0.9 for x in line], [x * 1.1 for x in line], color="grey",
                        alpha=0.2, label="±10 %")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("predicted iteration time (s)")
    ax.set_title(title, fontsize=10, parse_math=False)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:+.1f} %"


def _row(cells) -> str:
    return "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def render_validation_html(report, title: str) -> str:
    """The whole page (the plot embedded as a data URI); every text is escaped."""
    png = base64.b64encode(scatter_png(report.checks, title)).decode("ascii")
    stats = [report.overall] if report.overall else []
    group_rows = "".join(_row([
        g.group, g.rows, f"{100 * g.mape:.1f} %", f"{100 * g.worst_error:+.1f} %", g.worst_name,
        "" if g.spearman is None else f"{g.spearman:.3f}",
        "" if g.memory_mape is None else f"{100 * g.memory_mape:.1f} % ({g.memory_rows})"])
        for g in list(report.groups) + stats)
    run_rows = "".join(_row([
        c.run.name, c.group, c.run.num_gpus,
        "/".join(str(getattr(c.run.plan, k)) for k in ("tp", "pp", "cp", "vp", "ep")),
        c.run.plan.micro_batch_size, c.run.plan.global_batch_size, c.run.plan.precision,
        "" if c.measured_iteration_time_s is None else f"{c.measured_iteration_time_s:.3f}",
        "" if c.predicted_iteration_time_s is None else f"{c.predicted_iteration_time_s:.3f}",
        _pct(c.error),
        "" if c.predicted_peak_memory_bytes is None
        else f"{c.predicted_peak_memory_bytes / 2**30:.1f}",
        "" if c.fits is None else ("yes" if c.fits else "no"), c.problem or ""])
        for c in report.checks)
    skipped = "".join(f"<li>{html.escape(s)}</li>" for s in report.skipped)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;font-size:90%}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Error = predicted / measured iteration time - 1. MAPE: mean absolute percentage error;
Spearman's rho: rank correlation of predicted and measured times within the group.</p>
<table><tr><th>group</th><th>runs</th><th>MAPE</th><th>worst error</th><th>worst run</th>
<th>Spearman rho</th><th>memory MAPE (runs)</th></tr>{group_rows}</table>
<h2>Predicted against measured</h2>
<img alt="predicted vs measured iteration time" src="data:image/png;base64,{png}">
<h2>Runs</h2>
<table><tr><th>run</th><th>group</th><th>GPUs</th><th>tp/pp/cp/vp/ep</th><th>mbs</th>
<th>gbs</th><th>precision</th><th>measured s</th><th>predicted s</th><th>error</th>
<th>predicted peak GiB</th><th>fits</th><th>problem</th></tr>{run_rows}</table>
{"<h2>Skipped</h2><ul>" + skipped + "</ul>" if skipped else ""}
</body></html>
"""
