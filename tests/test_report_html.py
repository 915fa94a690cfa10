"""The reports' figures and plots: the Gantt chart states the iteration time the ranked table
prints (one number, not the schedule's makespan without the optimizer step), no legend
overlaps an axis label, a log axis within a decade or two carries enough labels, and the
plan report's findings come grouped by cause (each kind's cause and action once, priced
findings first, an unpriced reason said once)."""

from __future__ import annotations

import re

import matplotlib
import numpy as np
import pytest

from configurator.core.model_presets import MODEL_PRESETS
from configurator.cost.schedule_sim import simulate
from configurator.report.gantt import gantt_figure
from configurator.report.plot import scaling_figure, search_figure
from configurator.report.table import format_table
from configurator.search.rank import search
from topology.cluster_files import load_cluster

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def best():
    res = search(MODEL_PRESETS["llama3-8b"], load_cluster("dgx-h100-80gb", nodes=2), 128,
                 top_k=3)
    return res


def _iter_cell(table: str) -> str:
    """The ``iter (s)`` cell of the first row of a wide table."""
    lines = table.splitlines()
    col = re.split(r"\s{2,}", lines[0].strip()).index("iter (s)")
    return lines[2].split()[col]


def test_the_gantt_states_the_iteration_time_the_table_prints(best):
    e = best.plans[0]
    timed = e.schedule
    assert timed.optimizer_s > 0          # the makespan alone is short of the iteration
    shown = _iter_cell(format_table(best.plans, wide=True))
    fig = gantt_figure(timed.recorded(), iteration_time_s=e.iteration_time_s,
                       optimizer_s=timed.optimizer_s)
    assert f"(iteration {shown} s)" in fig.axes[0].get_title()
    # the simulation's own figures give the same number: makespan + optimizer step
    fig = gantt_figure(timed.recorded(), optimizer_s=timed.optimizer_s)
    assert f"(iteration {shown} s)" in fig.axes[0].get_title()
    matplotlib.pyplot.close("all")


def test_search_out_draws_the_gantt_with_the_table_figure(best, monkeypatch):
    """``search --out``'s report and ``plan``'s: the chart that goes into them is titled
    with the table's iteration time."""
    import configurator.report.gantt as gantt
    from configurator.app.outputs import search_files

    titles = []
    real = gantt.gantt_figure

    def spy(*args, **kw):
        fig = real(*args, **kw)
        titles.append(fig.axes[0].get_title())
        return fig

    monkeypatch.setattr(gantt, "gantt_figure", spy)
    cluster = load_cluster("dgx-h100-80gb", nodes=2)
    search_files(MODEL_PRESETS["llama3-8b"], cluster, best, "header",
                 names=("report.html",))
    (title,) = titles
    assert f"(iteration {_iter_cell(format_table(best.plans, wide=True))} s)" in title


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _no_label_under_a_legend(fig):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends
    labels = [t for ax in fig.axes for t in (ax.xaxis.label, ax.yaxis.label, ax.title)
              if t.get_text()]
    ticks = [t for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()
             if t.get_text() and t.get_visible()]
    for leg in legends:
        box = leg.get_window_extent(r)
        for t in labels + ticks:
            assert not _overlap(box, t.get_window_extent(r)), t.get_text()
        for ax in fig.axes:                    # outside the plotting area: no data hidden
            assert not _overlap(box, ax.get_window_extent(r))


@pytest.mark.parametrize("pp,vp,m", [(1, 1, 4), (2, 1, 4), (4, 2, 8), (17, 1, 34)])
def test_the_gantt_legend_overlaps_no_label(pp, vp, m):
    f, b = np.full((pp, vp), 1.0 / vp), np.full((pp, vp), 2.0 / vp)
    res = simulate(f, b, 0.01, 0.01, m, tail_s=0.2, record=True)
    _no_label_under_a_legend(gantt_figure(res, optimizer_s=0.1))
    matplotlib.pyplot.close("all")


def _visible_tick_labels(ax, axis="y") -> list[str]:
    ax.figure.canvas.draw()
    lo, hi = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    ticks = ax.get_yticklabels() if axis == "y" else ax.get_xticklabels()
    return [t.get_text() for t in ticks if t.get_text() and lo <= t.get_position()[
        1 if axis == "y" else 0] <= hi]


@pytest.mark.parametrize("lo,hi", [(1.9, 3.5), (5.5, 24.0), (0.3, 40.0)])
def test_the_search_plot_labels_its_log_axis_and_keeps_the_legend_clear(lo, hi):
    """Iteration times within a decade or two (1.9 to 3.5 s; 5.5 to 24 s, where the powers
    of ten alone gave two labels) get four labels or more, plain numbers."""
    times = np.geomspace(lo, hi, 200)
    fig = search_figure(peak_memory_bytes=np.linspace(20, 70, 200) * 2**30,
                        iteration_time_s=times, recompute=np.arange(200) % 3,
                        capacity_bytes=80 * 2**30, title="t")
    labels = _visible_tick_labels(fig.axes[0])
    assert len(labels) >= 4, labels
    assert all(re.fullmatch(r"[0-9.]+", t) for t in labels), labels
    _no_label_under_a_legend(fig)
    matplotlib.pyplot.close("all")


def test_the_scaling_plot_keeps_its_legend_off_the_data():
    rows = [{"nodes": n, "tokens_per_s": 9000.0 * n, "tokens_per_s_per_gpu": 1100.0 - n}
            for n in (1, 2, 4, 8, 16, 17)]
    fig = scaling_figure(rows, title="t")
    _no_label_under_a_legend(fig)
    assert "17" in _visible_tick_labels(fig.axes[0], "x")
    assert any("," in t for t in _visible_tick_labels(fig.axes[0]))   # 140,000
    matplotlib.pyplot.close("all")
