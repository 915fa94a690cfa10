"""Plot of the search: predicted iteration time against peak memory of every feasible plan."""

from __future__ import annotations

import numpy as np

from configurator.core.plan_values import RECOMPUTE
from configurator.core.units import GiB


#: Fewest labels a log axis shows (:func:`log_axis_labels`).
MIN_LOG_LABELS = 4


def log_axis_labels(axis) -> None:
    """Label a log axis (plain numbers, not ``10^x``) at 1, 2 and 5 times each power of ten;
    where that gives fewer than :data:`MIN_LOG_LABELS` labels in view, at every integer
    multiple; where even that does (a range within a factor of two or so), at evenly spaced
    round numbers. matplotlib's default labels only the powers of ten: two labels or fewer
    on a range within a decade or two. Call once the data are plotted (the view is read)."""
    import math

    from matplotlib.ticker import (LogLocator, MaxNLocator, NullFormatter, NullLocator,
                                   StrMethodFormatter)

    lo, hi = sorted(axis.get_view_interval())

    def shown(subs):
        if not (lo > 0 and math.isfinite(hi)):
            return MIN_LOG_LABELS
        return sum(lo <= s * 10.0 ** k <= hi for k in range(math.floor(math.log10(lo)),
                                                            math.ceil(math.log10(hi)) + 1)
                   for s in subs)

    locator = next((LogLocator(base=10, subs=subs) for subs in
                    ((1.0, 2.0, 5.0), tuple(float(s) for s in range(1, 10)))
                    if shown(subs) >= MIN_LOG_LABELS),
                   MaxNLocator(nbins=MIN_LOG_LABELS + 2, steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_locator(locator)
    axis.set_major_formatter(StrMethodFormatter("{x:g}"))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def plot_search(path: str, **kw) -> None:
    """Write :func:`search_figure` (same keywords) as a PNG to ``path``."""
    fig = search_figure(**kw)
    import matplotlib.pyplot as plt

    fig.savefig(path)
    plt.close(fig)


def search_figure(*, peak_memory_bytes: np.ndarray, iteration_time_s: np.ndarray,
                  recompute: np.ndarray, capacity_bytes: float, title: str):
    """Scatter (peak memory GiB, iteration time s, log axis labelled by
    :func:`log_axis_labels`) coloured by recompute; the best plan and the memory capacity
    are marked; the legend under the axes (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120, layout="constrained")
    for code, name in reversed(list(enumerate(RECOMPUTE))):
        sel = recompute == code
        if sel.any():
            ax.scatter(peak_memory_bytes[sel] / GiB, iteration_time_s[sel], s=6, alpha=0.5,
                       label=f"recompute {name}")
    best = int(np.argmin(iteration_time_s))
    ax.scatter([peak_memory_bytes[best] / GiB], [iteration_time_s[best]], marker="*", s=200,
               color="black", label="best plan", zorder=3)
    ax.axvline(capacity_bytes / GiB, color="red", linestyle="--", label="GPU memory")
    ax.set_xlabel("peak memory of the worst pipeline stage (GiB)")
    ax.set_ylabel("predicted iteration time (s)")
    ax.set_yscale("log")
    log_axis_labels(ax.yaxis)
    ax.set_title(title, fontsize=10, parse_math=False)   # model names may hold "$"
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="outside lower center",
               ncol=6, frameon=False)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def scaling_png(rows: list[dict], *, title: str) -> bytes:
    """PNG of :func:`scaling_figure`."""
    import io

    fig = scaling_figure(rows, title=title)
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def scaling_figure(rows: list[dict], *, title: str):
    """A node-count sweep (rows of ``run_scaling``): tokens/s (left axis, thousands
    separated) and tokens/s per GPU (right axis) against nodes, every count priced a tick;
    counts without a plan are left out; the legend under the axes, clear of the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    ok = [r for r in rows if r.get("tokens_per_s")]
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=110, layout="constrained")
    nodes = [r["nodes"] for r in ok]
    ax.plot(nodes, [r["tokens_per_s"] for r in ok], "o-", color="tab:blue",
            label="tokens/s (all GPUs)")
    ax.set_xlabel("nodes")
    ax.set_ylabel("tokens/s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(nodes, [r["tokens_per_s_per_gpu"] for r in ok], "s--", color="tab:orange",
             label="tokens/s per GPU")
    ax2.set_ylabel("tokens/s per GPU", color="tab:orange")
    if ok:
        best = max(ok, key=lambda r: r["tokens_per_s"])
        ax.scatter([best["nodes"]], [best["tokens_per_s"]], marker="*", s=250, color="black",
                   zorder=3, label="highest tokens/s")
    ax.set_title(title, fontsize=10, parse_math=False)
    ax.grid(True, alpha=0.3)
    if nodes:
        ax.set_xticks(nodes)
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax2.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    handles = ax.get_legend_handles_labels()
    handles2 = ax2.get_legend_handles_labels()
    fig.legend(handles[0] + handles2[0], handles[1] + handles2[1], fontsize=9,
               loc="outside lower center", ncol=3, frameon=False)
    return fig


def training_scaling_png(rows: list[dict], *, title: str) -> bytes:
    """PNG of a priced node-count sweep (``--train-tokens``): days to train (left axis) and
    cost, or GPU-hours without a price (right axis, thousands separated), against nodes;
    counts without a plan are left out; the legend under the axes, clear of the data."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    ok = [r for r in rows if r.get("training")]
    priced = bool(ok) and all(r["training"]["cost"] is not None for r in ok)
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=110, layout="constrained")
    nodes = [r["nodes"] for r in ok]
    ax.plot(nodes, [r["training"]["days"] for r in ok], "o-", color="tab:blue",
            label="days to train")
    ax.set_xlabel("nodes")
    ax.set_ylabel("days to train", color="tab:blue")
    ax2 = ax.twinx()
    what = "cost" if priced else "gpu_hours"
    ax2.plot(nodes, [r["training"][what] for r in ok], "s--", color="tab:red",
             label="cost" if priced else "GPU-hours")
    ax2.set_ylabel("cost" if priced else "GPU-hours", color="tab:red")
    ax2.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_title(title, fontsize=10, parse_math=False)
    ax.grid(True, alpha=0.3)
    handles = ax.get_legend_handles_labels()
    handles2 = ax2.get_legend_handles_labels()
    fig.legend(handles[0] + handles2[0], handles[1] + handles2[1], fontsize=9,
               loc="outside lower center", ncol=2, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
