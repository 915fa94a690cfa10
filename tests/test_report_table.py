"""The ranked table (``configurator.report.table``): columns from the plan schema, units in
the headers, plain text; every column always (never one left out to make room): by
default with headers stacked on two lines, within 100 characters for the usual plans; with
wide on one line."""

import dataclasses
import re

import pytest

from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import PLAN_FIELDS
from configurator.core.units import GiB
from configurator.report.table import WHEN_USED, format_estimate, format_table, stacked_header
from configurator.search.rank import search
from tests.conftest import run_cli
from topology.cluster_files import load_cluster

LIMIT = 100
#: Plan columns of a dense model's even-split plans (the expert and layer-split columns show
#: only when some plan uses them: test_expert_and_split_columns_appear_when_used).
PLAN_HEADERS = [f.column for f in PLAN_FIELDS if f.column is not None
                and f.column not in WHEN_USED]
METRIC_HEADERS = ["iter (s)", "+/-%", "TFLOP/s/GPU", "MFU bf16 (%)", "tok/s/GPU", "peak (GiB)"]
ANSI = re.compile(r"\x1b|\x9b")


@pytest.fixture(scope="module")
def evals():
    res = search(MODEL_PRESETS["gpt-1.7b"], load_cluster("dgx-a100-80gb", nodes=4), 512,
                 top_k=10)
    assert len(res.plans) == 10
    return res.plans


def parse(text):
    """(headers, rows as {header: cell}) of a rendered table: the header lines (a stacked
    header's lines joined: ``tok/s`` over ``/GPU`` is ``tok/s/GPU``, ``MFU`` over
    ``bf16 (%)`` is ``MFU bf16 (%)``), the rule (a run of dashes per column), the rows."""
    lines = text.splitlines()
    k = next(i for i, line in enumerate(lines) if line and set(line) <= {"-", " "})
    spans = [m.span() for m in re.finditer(r"-+", lines[k])]
    headers = []
    for a, b in spans:
        parts = [line[a:b].strip() for line in lines[:k] if line[a:b].strip()]
        head = parts[0] if parts else ""
        for p in parts[1:]:     # broken at a space, before a "/" or after a "-"
            head += p if head.endswith("-") or p.startswith("/") else " " + p
        headers.append(head)
    rows = []
    for line in lines[k + 1:]:
        cells = line.split()
        assert len(cells) == len(headers), (headers, line)
        rows.append(dict(zip(headers, cells)))
    return headers, rows


def check_rows(headers, rows, evals):
    assert [r["rank"] for r in rows] == [f"{i}*" if e.tie else str(i)
                                         for i, e in enumerate(evals, 1)]
    for r, e in zip(rows, evals):
        p = e.plan
        lo, hi = e.iteration_time_interval_s
        t = e.iteration_time_s
        assert r["+/-%"] == f"-{100 * (1 - lo / t):.0f}/+{100 * (hi / t - 1):.0f}"
        assert int(r["tp"]) == p.tp and int(r["pp"]) == p.pp
        assert int(r["dp"]) == p.dp and int(r["mbs"]) == p.micro_batch_size
        assert r["recompute"] == p.recompute
        assert r["iter (s)"] == f"{e.iteration_time_s:.3f}"
        assert float(r["iter (s)"]) == pytest.approx(e.iteration_time_s, abs=5e-4)
        assert r["MFU bf16 (%)"] == f"{100 * e.mfu:.1f}"
        assert r["peak (GiB)"] == f"{e.peak_memory_bytes / GiB:.1f}"
        if "TFLOP/s/GPU" in headers:
            assert r["TFLOP/s/GPU"] == f"{e.model_tflops_per_gpu:.1f}"
        if "tok/s/GPU" in headers:
            assert r["tok/s/GPU"] == f"{e.tokens_per_s_per_gpu:.0f}"
        for f in PLAN_FIELDS:
            if f.column in headers and f.type is bool:
                assert r[f.column] == ("yes" if getattr(p, f.name) else "no")


def test_default_table_fits_100_columns_with_every_column(evals):
    text = format_table(evals)
    lines = text.splitlines()
    assert len(lines) == 3 + len(evals)             # two header lines, the rule, the rows
    assert max(map(len, lines)) <= LIMIT
    assert not ANSI.search(text) and text.isascii()
    assert all(line == line.rstrip() for line in lines)
    headers, rows = parse(text)
    # schema order, then metrics in order: every one of them
    assert headers == ["rank"] + PLAN_HEADERS + METRIC_HEADERS
    check_rows(headers, rows, evals)


def test_wide_table_has_every_column_on_one_line(evals):
    text = format_table(evals, wide=True)
    assert not ANSI.search(text) and text.isascii()
    lines = text.splitlines()
    assert len(lines) == 2 + len(evals)
    headers, rows = parse(text)
    assert headers == ["rank"] + PLAN_HEADERS + METRIC_HEADERS
    check_rows(headers, rows, evals)
    assert max(map(len, lines)) > max(map(len, format_table(evals).splitlines()))


@pytest.mark.parametrize("header, width, stacked", [
    ("tok/s/GPU", 5, "tok/s\n/GPU"), ("TFLOP/s/GPU", 5, "TFLOP/s\n/GPU"),
    ("dist-opt", 3, "dist-\nopt"), ("iter (s)", 6, "iter\n(s)"),
    ("recompute", 9, "recompute"), ("tp", 1, "tp"), ("peak (GiB)", 10, "peak (GiB)")])
def test_stacked_header(header, width, stacked):
    assert stacked_header(header, width) == stacked


def test_numbers_right_aligned(evals):
    text = format_table(evals, wide=True)
    lines = text.splitlines()
    header = lines[0]
    for h in ["rank", "tp", "pp", "mbs"] + METRIC_HEADERS:
        end = header.index(h) + len(h)
        for line in lines[2:]:
            # the cell ends where its header ends, with a space or the line end after it
            assert line[end - 1] != " " and (end == len(line) or line[end] == " "), (h, line)


def test_big_numbers_widen_the_table_and_drop_nothing(evals):
    big = [dataclasses.replace(e, iteration_time_s=123456.789, tokens_per_s_per_gpu=9.87e8,
                               model_tflops_per_gpu=12345.6, peak_memory_bytes=1e15)
           for e in evals] * 20
    text = format_table(big)
    headers, rows = parse(text)
    assert headers == ["rank"] + PLAN_HEADERS + METRIC_HEADERS
    check_rows(headers, rows, big)
    wide = format_table(big, wide=True)
    assert parse(wide)[0] == ["rank"] + PLAN_HEADERS + METRIC_HEADERS
    assert all(len(line.split()) == len(parse(wide)[0]) for line in wide.splitlines()[2:])


def test_empty_table_is_header_only():
    headers, rows = parse(format_table([]))
    assert headers[0] == "rank" and not rows


def test_estimate_lines_fit(evals):
    text = format_estimate(evals[0])
    assert max(map(len, text.splitlines())) <= LIMIT
    flat = " ".join(text.split())
    p = evals[0].plan
    assert f"tp={p.tp} pp={p.pp}" in flat and f"attention_backend={p.attention_backend}" in flat
    assert f"iteration time: {evals[0].iteration_time_s:.3f} s" in flat


def _table_lines(stdout):
    """The ranked table of a search's text output: from its header to the line before the
    closing ``next:`` line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("rank"))
    while start and lines[start - 1].startswith(" "):      # a stacked header's top line
        start -= 1
    end = next((i for i, line in enumerate(lines) if line.startswith("next:")), len(lines))
    return lines[start:end]


def test_cli_search_table_width_and_wide():
    args = ("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "4",
            "--gbs", "512")
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    assert not ANSI.search(res.stdout)
    table = _table_lines(res.stdout)
    assert len(table) == 3 + 10
    assert max(map(len, table)) <= LIMIT
    headers, _ = parse("\n".join(table))
    assert headers == ["rank"] + PLAN_HEADERS + METRIC_HEADERS

    wide = run_cli(*args, "--wide")
    assert wide.returncode == 0, wide.stderr
    assert not ANSI.search(wide.stdout)
    wide_table = _table_lines(wide.stdout)
    wide_headers, _ = parse("\n".join(wide_table))
    assert wide_headers == ["rank"] + PLAN_HEADERS + METRIC_HEADERS
    assert max(map(len, wide_table)) > max(map(len, table))
    # same plans in the same order
    assert [line.split()[:4] for line in wide_table[2:]] == \
        [line.split()[:4] for line in table[3:]]


def test_cli_table_txt_is_the_wide_table(tmp_path):
    out = tmp_path / "out"
    res = run_cli("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes",
                  "4", "--gbs", "512", "--top", "3", "--out", out)
    assert res.returncode == 0, res.stderr
    text = (out / "table.txt").read_text()
    assert not ANSI.search(text)
    headers, rows = parse("\n".join(_table_lines(text)))
    assert headers == ["rank"] + PLAN_HEADERS + METRIC_HEADERS and len(rows) == 3


def test_expert_and_split_columns_appear_when_used():
    res = search(MODEL_PRESETS["llama3.1-405b"], load_cluster("dgx-h100-80gb", nodes=128),
                 1536, top_k=5)
    headers, _ = parse(format_table(res.plans, wide=True))
    used = {h for h, f in WHEN_USED.items() if any(
        getattr(e.plan, f.name) != f.default for e in res.plans)}
    assert used and used <= set(headers)
    assert "ep" not in headers          # a dense model


def test_no_column_is_dropped_to_make_room(evals):
    """Two plans that differ only in the distributed optimizer: the table shows dist-opt
    and keeps tok/s/GPU (and every other column of the wide table)."""
    a = evals[0]
    b = dataclasses.replace(a, plan=dataclasses.replace(
        a.plan, distributed_optimizer=not a.plan.distributed_optimizer))
    wide, _ = parse(format_table([a, b], wide=True))
    headers, rows = parse(format_table([a, b]))
    assert "dist-opt" in headers and "tok/s/GPU" in headers
    assert headers == wide
    check_rows(headers, rows, [a, b])
