"""Gantt chart of a simulated pipeline schedule (:mod:`configurator.cost.schedule_sim`): one
row per pipeline rank, forward and backward chunks as bars, the critical path drawn through
them."""

from __future__ import annotations

import io

import numpy as np

from configurator.cost.schedule_sim import SimResult

#: Text size (pt) of every label, tick and legend entry.
FONT_PT = 10
#: Pixels a bar needs to carry its microbatch number.
_LABEL_MIN_PX = 20
#: Pixels a bar needs to get a white outline separating it from its neighbours.
_EDGE_MIN_PX = 4


def _shades(cmap, n: int) -> list:
    """``n`` colours of ``cmap`` from mid to dark (chunk 0 the lightest)."""
    if n == 1:
        return [cmap(0.6)]
    return [cmap(0.35 + 0.5 * c / (n - 1)) for c in range(n)]


#: Digits after the point of an iteration time in seconds, as the ranked table and the
#: summaries print it (``29.174``).
SECONDS_FORMAT = "{:.3f}"


def gantt_png(result: SimResult, replica: int = 0, *, title: str = "",
              iteration_time_s: float | None = None, optimizer_s: float = 0.0) -> bytes:
    """PNG bytes of :func:`gantt_figure` (same arguments)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = gantt_figure(result, replica, title=title, iteration_time_s=iteration_time_s,
                       optimizer_s=optimizer_s)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def gantt_figure(result: SimResult, replica: int = 0, *, title: str = "",
                 iteration_time_s: float | None = None, optimizer_s: float = 0.0):
    """The matplotlib figure of the schedule of replica ``replica`` of ``result``.

    Rows are pipeline ranks (rank 0 on top); forward bars blue, backward orange, darker for
    later model chunks; a black line runs through the ops of the critical path (jumping
    between ranks along the pipeline sends it waits for); each rank's
    tail (work after its last backward) is a grey hatched bar; the optimizer step
    (``optimizer_s``, after the slowest rank's tail) a green bar on every rank. The x axis
    is in ms when the iteration is under 1 s, else in s. The title gives the iteration time
    as the ranked table does (:data:`SECONDS_FORMAT`): ``iteration_time_s`` (the plan's
    figure: the schedule's makespan plus the optimizer step) or, without it, the makespan
    plus ``optimizer_s``. The legend sits under the axes, outside them (constrained layout:
    no label overlaps it). Fonts are :data:`FONT_PT` pt; the title is plain text.

    ``result`` must come from ``simulate(..., record=True)``; ValueError otherwise, or when
    ``replica`` is outside ``[0, D)``.
    """
    if result.start_s is None or result.end_s is None or result.critical_path is None:
        raise ValueError("gantt_png needs a result of simulate(..., record=True)")
    n_rep = result.start_s.shape[0]
    if not 0 <= replica < n_rep:
        raise ValueError(f"replica must be in [0, {n_rep}), got {replica}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    order = result.order
    pp, vp = order.pp, order.vp
    start = result.start_s[replica]
    end = result.end_s[replica]
    makespan = float(result.iteration_time_s[replica])
    total_s = (makespan + optimizer_s) if iteration_time_s is None else float(iteration_time_s)
    tail = (np.zeros(pp) if result.tail_s is None else result.tail_s[replica])
    scale, unit = (1e3, "ms") if total_s < 1.0 else (1.0, "s")
    on_path = np.zeros(order.n_ops, dtype=bool)
    on_path[result.critical_path[replica]] = True

    rc = {"text.usetex": False, "text.parse_math": False, "font.size": FONT_PT,
          "axes.titlesize": FONT_PT + 1, "axes.labelsize": FONT_PT,
          "xtick.labelsize": FONT_PT, "ytick.labelsize": FONT_PT,
          "legend.fontsize": FONT_PT}
    with matplotlib.rc_context(rc):
        width_in = 12.0
        fig, ax = plt.subplots(figsize=(width_in, 1.9 + 0.34 * max(pp, 2)), dpi=120,
                               layout="constrained")
        fwd_c = _shades(plt.get_cmap("Blues"), vp)
        bwd_c = _shades(plt.get_cmap("Oranges"), vp)
        is_f = order.kind == "F"
        height = 0.8
        drawn = makespan + (optimizer_s if not result.extrapolated_to else 0.0)
        px_per_unit = 0.85 * width_in * fig.dpi / max(drawn * scale, 1e-300)
        for r in range(pp):
            ops = order.rank_ops[r]
            x0 = start[ops] * scale
            w = (end[ops] - start[ops]) * scale
            face = [(fwd_c if is_f[i] else bwd_c)[order.chunk[i]] for i in ops]
            # a white gap between bars only where a bar is wide enough to keep its colour
            lw = np.where(w * px_per_unit >= _EDGE_MIN_PX, 0.5, 0.0)
            ax.broken_barh(list(zip(x0, w)), (r - height / 2, height), facecolors=face,
                           edgecolors="white", linewidths=lw, zorder=2)
            if tail[r] > 0:
                t0 = end[order.last_op[r]] * scale
                ax.broken_barh([(t0, tail[r] * scale)], (r - height / 2, height),
                               facecolors="0.85", edgecolors="0.4", hatch="//",
                               linewidths=0.5, zorder=2)
        if optimizer_s > 0 and not result.extrapolated_to:
            ax.broken_barh([(makespan * scale, optimizer_s * scale)], (-0.5, pp),
                           facecolors="#8fd18f", edgecolors="#2e7d32", linewidths=0.5,
                           zorder=2)
        # The critical path: a line through its ops, crossing between ranks where it
        # follows a pipeline send (legible however many microbatches there are).
        xs, ys = [], []
        for i in result.critical_path[replica]:
            xs += [start[i] * scale, end[i] * scale]
            ys += [order.rank[i], order.rank[i]]
        ax.plot(xs, ys, color="black", linewidth=1.6, zorder=4)
        # Microbatch numbers where a bar is wide enough to hold them.
        for i in range(order.n_ops):
            w = (end[i] - start[i]) * scale
            if w * px_per_unit >= _LABEL_MIN_PX:
                ax.text((start[i] + end[i]) / 2 * scale, order.rank[i], str(order.microbatch[i]),
                        ha="center", va="center", fontsize=FONT_PT, zorder=3,
                        color="black" if order.chunk[i] < (vp + 1) // 2 else "white")
        ax.set_ylim(pp - 0.5, -0.5)
        ax.set_yticks(range(pp))
        ax.set_yticklabels([f"rank {r}" for r in range(pp)])
        ax.set_xlim(0, drawn * scale * 1.01 if drawn > 0 else 1.0)
        ax.set_xlabel(f"time ({unit})")
        ax.set_ylabel("pipeline rank")
        head = title or (f"pipeline schedule: pp={pp}, vp={vp}, "
                         f"{order.num_microbatches} microbatches")
        it = SECONDS_FORMAT.format(total_s)
        if result.extrapolated_to:     # a long schedule: its first microbatches are drawn
            ax.set_title(f"{head} (first {order.num_microbatches} of "
                         f"{result.extrapolated_to} microbatches drawn; iteration {it} s)")
        else:
            ax.set_title(f"{head} (iteration {it} s)")
        ax.grid(True, axis="x", alpha=0.3, zorder=0)
        handles = []
        # every chunk's shade up to 4 chunks; beyond, the first and the last, the others
        # shaded between (a legend row per chunk would not fit the figure)
        shown = range(vp) if vp <= 4 else (0, vp - 1)
        for kind, colours in (("forward", fwd_c), ("backward", bwd_c)):
            for c in shown:
                suffix = f", chunk {c}" if vp > 1 else ""
                handles.append(Patch(facecolor=colours[c], label=f"{kind}{suffix}"))
        handles.append(Line2D([], [], color="black", linewidth=1.6, label="critical path"))
        if (tail > 0).any():
            handles.append(Patch(facecolor="0.85", edgecolor="0.4", hatch="//",
                                 label="tail (after last backward)"))
        if optimizer_s > 0 and not result.extrapolated_to:
            handles.append(Patch(facecolor="#8fd18f", edgecolor="#2e7d32",
                                 label="optimizer step"))
        fig.legend(handles=handles, loc="outside lower center",
                   ncol=min(len(handles), 5), frameon=False)
    return fig
