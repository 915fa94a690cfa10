"""Human-readable rendering of evaluations (the ranked table).

The ranked table is rendered with ``rich`` to plain text (no ANSI escapes, ASCII only), so
the same text goes to the terminal and to ``table.txt``. Its plan columns come from
:data:`configurator.core.plan.PLAN_FIELDS` (every field with a ``column``, in schema
order); the metric columns follow, with their units in the headers. A column is never
left out to make room: the default table stacks a header on two lines where it is wider
than the column's cells (``tok/s`` over ``/GPU``); ``wide=True`` keeps every header on one
line. Under its header's rule each column has its own run of dashes.
"""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from configurator.core.plan import (OPTIONAL_PLAN_KEYS, PLAN_FIELDS, PlanField,
                                    describe_plan)
from configurator.core.plan_values import is_fp8
from configurator.core.units import GiB
from configurator.search.evaluate import SCHEDULE_KEY, Evaluation

#: Longest line of the estimate text and of the wrapped free text.
NARROW_WIDTH = 100
#: Console width used to measure and render the wide table (nothing wraps below it).
_UNLIMITED = 100_000

#: Header row underlined by an ASCII rule, one run of dashes per column; no outer edges
#: or column rules.
_BOX = box.Box("    \n"
               "    \n"
               " -  \n"
               "    \n"
               "    \n"
               "    \n"
               "    \n"
               "    \n", ascii=True)


@dataclass(frozen=True)
class Column:
    """One table column: header, cell text of (rank, evaluation), alignment."""

    header: str
    cell: Callable[[int, Evaluation], str]
    justify: str = "right"


def _plan_value(f: PlanField, value: Any) -> str:
    if f.type is bool:
        return "yes" if value else "no"
    return str(value)


def _plan_column(f: PlanField) -> Column:
    return Column(f.column, lambda rank, e: _plan_value(f, getattr(e.plan, f.name)),
                  "right" if f.type is int else "left")


RANK = Column("rank", lambda rank, e: f"{rank}*" if e.tie else str(rank))
ITER = Column("iter (s)", lambda rank, e: f"{e.iteration_time_s:.3f}")


def _interval_cell(rank: int, e: Evaluation) -> str:
    """The measured time's range around the estimate, in percent (``-lo/+hi``;
    :mod:`configurator.search.intervals`)."""
    if e.iteration_time_interval_s is None:
        return ""
    lo, hi = e.iteration_time_interval_s
    t = e.iteration_time_s
    return f"-{100 * (1 - lo / t):.0f}/+{100 * (hi / t - 1):.0f}"


#: The interval around ``iter (s)``; a plan inside the best plan's interval (a tie) has
#: ``*`` after its rank.
INTERVAL = Column("+/-%", _interval_cell)
TFLOPS = Column("TFLOP/s/GPU", lambda rank, e: f"{e.model_tflops_per_gpu:.1f}")
#: MFU against the 16-bit (BF16/FP16) dense peak; FP8 plans add :data:`MFU_FP8`, against
#: the peak of their own precision.
MFU = Column("MFU bf16 (%)", lambda rank, e: f"{100 * e.mfu:.1f}")
MFU_FP8 = Column("MFU fp8 (%)", lambda rank, e: "" if e.mfu_precision_peak is None
                 else f"{100 * e.mfu_precision_peak:.1f}")
TOKENS = Column("tok/s/GPU", lambda rank, e: f"{e.tokens_per_s_per_gpu:.0f}")
PEAK = Column("peak (GiB)", lambda rank, e: f"{e.peak_memory_bytes / GiB:.1f}")

#: Time-to-train columns (``--train-tokens``), shown only when the plans carry the figures
#: and never dropped from the narrow table: days, GPU-hours, cost (with a price), ETTR and
#: the checkpoint interval in iterations and minutes.
DAYS = Column("days", lambda rank, e: f"{e.training.days:.1f}")
GPU_HOURS = Column("GPU-h", lambda rank, e: f"{e.training.gpu_hours:,.0f}")
COST = Column("cost", lambda rank, e: "" if e.training.cost is None
              else f"{e.training.cost:,.0f}")
ETTR = Column("ETTR", lambda rank, e: f"{e.training.ettr:.3f}")
CKPT_INTERVAL = Column("ckpt every (it / min)", lambda rank, e: (
    f"{e.training.interval_iterations} / {e.training.interval_s / 60:.1f}"))
TRAINING_COLUMNS: tuple[Column, ...] = (DAYS, GPU_HOURS, COST, ETTR, CKPT_INTERVAL)

#: Plan columns, from the schema.
PLAN_COLUMNS: tuple[Column, ...] = tuple(_plan_column(f) for f in PLAN_FIELDS
                                         if f.column is not None)
METRIC_COLUMNS: tuple[Column, ...] = (ITER, INTERVAL, TFLOPS, MFU, MFU_FP8, TOKENS, PEAK)
#: Every column of the wide table, in order.
COLUMNS: tuple[Column, ...] = (RANK, *PLAN_COLUMNS, *METRIC_COLUMNS)


def _console(width: int) -> Console:
    """A plain-text console: no colour or styles, ASCII, writes nothing (we render)."""
    return Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False,
                   legacy_windows=False, no_color=True, emoji=False, highlight=False,
                   soft_wrap=False)


def _new_table() -> Table:
    return Table(box=_BOX, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                 header_style="", highlight=False)


def _render(table: Table, width: int) -> list[str]:
    console = _console(width)
    lines = console.render_lines(table, console.options, pad=False)
    return ["".join(seg.text for seg in line).rstrip() for line in lines]


def plain_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Lines of a right-aligned plain-text table in the ranked table's look (header
    underlined, no edges), as wide as its cells need."""
    t = _new_table()
    for hd in headers:
        t.add_column(hd, justify="right", no_wrap=True)
    for r in rows:
        t.add_row(*r)
    return _render(t, max(_width(t), 1))


def stacked_header(header: str, width: int) -> str:
    """``header`` on two lines when that makes it narrower and no narrower than ``width``
    (the column's widest cell): broken at a space (dropped), before a ``/`` (not one of a
    rate's ``/s``) or after a ``-``, where the longer line is shortest:
    ``"tok/s/GPU"`` → ``"tok/s\\n/GPU"``."""
    best, best_len = header, len(header)
    for i, ch in enumerate(header):
        if ch == " ":
            top, bottom = header[:i], header[i + 1:]
        elif ch == "/" and i > 0 and not header.startswith("/s", i):   # not in "X/s"
            top, bottom = header[:i], header[i:]
        elif ch == "-" and i + 1 < len(header):
            top, bottom = header[:i + 1], header[i + 1:]
        else:
            continue
        longest = max(len(top), len(bottom), width)
        if top and bottom and longest < best_len:
            best, best_len = f"{top}\n{bottom}", longest
    return best


def _table(columns: list[Column], evals: list[Evaluation], stack: bool = False) -> Table:
    t = _new_table()
    rows = [[c.cell(i + 1, e) for c in columns] for i, e in enumerate(evals)]
    for j, c in enumerate(columns):
        cells = max((len(r[j]) for r in rows), default=0)
        t.add_column(stacked_header(c.header, cells) if stack else c.header,
                     justify=c.justify, no_wrap=True, vertical="bottom")
    for r in rows:
        t.add_row(*r)
    return t


def _width(table: Table) -> int:
    console = _console(_UNLIMITED)
    return Measurement.get(console, console.options, table).maximum


#: Plan columns shown only when some plan departs from the field's default (expert
#: parallelism, custom layer splits): a dense model's table does not carry them.
WHEN_USED = {f.column: f for f in PLAN_FIELDS if f.column is not None
             and f.name in OPTIONAL_PLAN_KEYS}


def select_columns(evals: list[Evaluation]) -> list[Column]:
    """The columns shown: every column of :data:`COLUMNS`, the :data:`WHEN_USED` ones only
    where some plan departs from the field's default and ``MFU fp8 (%)`` only where some
    plan runs in FP8 (columns that would be empty or all defaults, never to make room)."""
    columns = [c for c in COLUMNS if c.header not in WHEN_USED or any(
        getattr(e.plan, WHEN_USED[c.header].name) != WHEN_USED[c.header].default
        for e in evals)]
    if not any(is_fp8(e.plan.precision) for e in evals):
        columns = [c for c in columns if c is not MFU_FP8]
    if evals and all(e.training is not None for e in evals):
        columns += [c for c in TRAINING_COLUMNS
                    if c is not COST or any(e.training.cost is not None for e in evals)]
    return columns


def format_table(evals: list[Evaluation], wide: bool = False) -> str:
    """The ranked table as plain text: the header (two lines where a header is stacked,
    :func:`stacked_header`; one line with ``wide``), a rule with one run of dashes per
    column, one row per evaluation. Every column of :func:`select_columns` is shown."""
    table = _table(select_columns(evals), evals, stack=not wide)
    return "\n".join(_render(table, max(_width(table), 1)))


def _wrap(line: str) -> list[str]:
    """Wrap a long free-text line at spaces (continuations indented); text unchanged."""
    return textwrap.wrap(line, NARROW_WIDTH, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False) or [line]


def format_estimate(e: Evaluation) -> str:
    p = e.plan
    out = ["plan: " + " ".join(describe_plan(p)),
           f"iteration time: {e.iteration_time_s:.3f} s   model TFLOP/s per GPU: "
           f"{e.model_tflops_per_gpu:.1f}   MFU: {100 * e.mfu:.1f} % of the BF16 peak"
           + (f", {100 * e.mfu_precision_peak:.1f} % of the {p.precision.upper()} peak"
              if is_fp8(p.precision) and e.mfu_precision_peak is not None else "")
           + "   tokens/s per GPU: "
           f"{e.tokens_per_s_per_gpu:.0f}",
           *([f"interval: {e.iteration_time_interval_s[0]:.3f}-"
              f"{e.iteration_time_interval_s[1]:.3f} s (regime {e.regime}: the 10th-90th "
              f"percentile residuals of published runs of that regime, each source left "
              f"out of the fit)"] if e.iteration_time_interval_s is not None else []),
           "time breakdown (s): " + ", ".join(f"{k} {v:.3f}" for k, v in
                                              e.time_breakdown_s.items()),
           f"peak memory: {e.peak_memory_bytes / GiB:.2f} GiB of "
           f"{e.memory_capacity_bytes / GiB:.2f} GiB -> "
           + ("fits" if e.fits else "DOES NOT FIT"),
           "memory per stage (GiB): stage params grads optimizer activations other total"]
    out = [w for line in out for w in _wrap(line)]
    shown = e.memory_per_stage if len(e.memory_per_stage) <= 8 else (
        e.memory_per_stage[:4] + e.memory_per_stage[-2:])
    for m in shown:
        out.append(f"  {m.stage:4d} {m.parameters_bytes / GiB:7.2f} {m.gradients_bytes / GiB:6.2f}"
                   f" {m.optimizer_bytes / GiB:9.2f} {m.activations_bytes / GiB:11.2f}"
                   f" {m.other_bytes / GiB:6.2f} {m.total_bytes / GiB:6.2f}")
    if e.time_per_stage:
        out.append("time per stage (s, simulated, pacing replica): stage forward backward "
                   "dp_exposed idle")
        times = e.time_per_stage if len(e.time_per_stage) <= 8 else (
            e.time_per_stage[:4] + e.time_per_stage[-2:])
        for t in times:
            out.append(f"  {t['stage']:4d} {t['forward_s']:7.3f} {t['backward_s']:8.3f}"
                       f" {t['dp_exposed_s']:10.3f} {t['idle_s']:6.3f}")
    return "\n".join(out)


def format_scaling(rows: list[dict]) -> str:
    """The node-count sweep as a table (one row per count; a count without a plan says
    why); priced rows (``--train-tokens``) add days, GPU-hours, cost, ETTR and goodput per
    GPU."""
    priced = any(r.get("training") for r in rows)
    cost = any(r.get("training") and r["training"]["cost"] is not None for r in rows)
    head = (f"{'nodes':>5}  {'GPUs':>5}  {'tp':>3} {'pp':>3} {'dp':>4} {'cp':>3} {'vp':>3} "
            f"{'mbs':>3}  {'iter (s)':>9}  {'tokens/s':>10}  {'tok/s/GPU':>9}  ")
    if priced:
        head += (f"{'days':>7}  {'GPU-h':>12}  " + (f"{'cost':>13}  " if cost else "")
                 + f"{'ETTR':>5}  {'ckpt (min)':>10}  {'goodput/GPU':>11}  ")
    head += "idle hosts"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.get("plan") is None:
            lines.extend(textwrap.wrap(f"no plan: {r.get('reason', '')}", width=NARROW_WIDTH,
                                       initial_indent=f"{r['nodes']:>5}  ",
                                       subsequent_indent=" " * 16))
            continue
        p = r["plan"]
        idle = ", ".join(r.get("excluded_hosts") or []) or "-"
        line = (f"{r['nodes']:>5}  {r['num_gpus']:>5}  {p['tp']:>3} {p['pp']:>3} "
                f"{p['dp']:>4} {p['cp']:>3} {p['vp']:>3} {p['mbs']:>3}  "
                f"{r['iteration_time_s']:>9.3f}  {r['tokens_per_s']:>10.0f}  "
                f"{r['tokens_per_s_per_gpu']:>9.0f}  ")
        if priced:
            t = r["training"]
            line += (f"{t['days']:>7.1f}  {t['gpu_hours']:>12,.0f}  "
                     + (f"{t['cost']:>13,.0f}  " if cost else "")
                     + f"{t['ettr']:>5.3f}  {t['interval_s'] / 60:>10.1f}  "
                     f"{t['goodput_tokens_per_s_per_gpu']:>11.0f}  ")
        lines.append(line + idle)
    return "\n".join(lines)


def _explain_name(kind: str, name: str) -> str:
    """A compared figure's name as shown: memory without its ``_bytes`` (the header says
    GiB), ``mfu`` as a per cent."""
    if kind == "memory" and name.endswith("_bytes"):
        return name[:-len("_bytes")]
    return "mfu (%)" if name == "mfu" else name


def format_explanation(ex) -> str:
    """:class:`configurator.app.explain.Explanation` as text: the headline, the plans, the
    fields that differ, then time (s), throughput and memory (GiB) side by side with B − A,
    and what a correction term in the time breakdown is."""
    def scale(kind, name, x):
        return x / GiB if kind == "memory" else 100 * x if name == "mfu" else x

    def val(kind, name, x):
        if x is None:
            return "-"
        x = scale(kind, name, x)
        return f"{x:.2f}" if kind == "memory" else f"{x:.3g}" if kind == "throughput" \
            else f"{x:.3f}"

    lead, _, terms = ex.headline.partition("; ")
    lines = [*_wrap(lead[0].upper() + lead[1:] + ("" if terms else ".")),
             *(_wrap(terms[0].upper() + terms[1:] + ".") if terms else []), "",
             f"A: {ex.plan_a}   ({ex.source_a})", f"B: {ex.plan_b}   ({ex.source_b})"]
    if ex.field_changes:
        lines += _wrap("fields that differ: " + ", ".join(f"{f} {a} -> {b}"
                                                          for f, a, b in ex.field_changes))
    unit = {"time": "s", "time per stage": "s", "throughput": "", "memory": "GiB"}
    kind = None
    for r in ex.rows:
        if r.kind != kind:
            kind = r.kind
            lines += ["", f"{kind + (f' ({unit[kind]})' if unit[kind] else ''):<34}"
                          f"{'A':>12}{'B':>12}{'B - A':>12}"]
        d = r.delta
        dtxt = "-" if d is None else (f"{d / GiB:+.2f}" if kind == "memory" else
                                      f"{scale(kind, r.name, d):+.3g}" if kind == "throughput"
                                      else f"{d:+.3f}")
        lines.append(f"  {_explain_name(kind, r.name):<32}{val(kind, r.name, r.a):>12}"
                     f"{val(kind, r.name, r.b):>12}{dtxt:>12}")
    if SCHEDULE_KEY in ex.terms:
        lines += ["", *_wrap(f"{SCHEDULE_KEY}: {ex.terms[SCHEDULE_KEY]}.")]
    return "\n".join(lines)
