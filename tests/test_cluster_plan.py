"""``configurator plan`` and the cost of the audit's findings: from measurements to the launch
scripts and one report, on a synthetic two-island cluster and on the shipped 17-node logs;
the report opened in headless Chromium."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from configurator.app.audit_costs import island_crossings, used_host_pairs
from configurator.app.inputs import cluster_ref_for
from configurator.core.plan import ParallelPlan
from configurator.report.network_html import SECTIONS
from tests.conftest import REAL_CLUSTER, run_cli
from tests.test_structure import topo, two_islands
from topology.topofile_io import save_topology

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def islands_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("isl") / "islands.json"
    save_topology(topo(factor=two_islands), path)
    return path


@pytest.fixture(scope="module")
def islands_plan(islands_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "job"
    # Megatron FSDP gathers and reduces every micro-batch, so where its groups sit matters
    # (the plain plan's interleaved chunks hide its data-parallel traffic on either order)
    res = run_cli("plan", "--model", "llama3-70b", "--gbs", "512", "--megatron-fsdp",
                  "--topology", islands_file, "--out", out, timeout=300)
    assert res.returncode == 0, res.stderr
    return out, res.stdout


def test_plan_writes_scripts_and_report_and_says_what_the_placement_did(islands_plan):
    out, stdout = islands_plan
    for name in ("launch_torchrun.sh", "launch_slurm.sbatch", "plan.json", "plans.json",
                 "audit.json", "report.html"):
        assert (out / name).is_file(), name
    lines = stdout.splitlines()
    assert "islands {h1, h3, h5, h7}; {h2, h4, h6, h8}" in lines[1]
    # the placement keeps the pipeline's boundaries inside the islands, where Megatron's order
    # on the first hosts puts more of them across, and no tp, cp or dp group across
    groups = next(ln for ln in lines if ln.startswith("groups crossing islands"))
    pp = re.search(r"pp boundaries (\d+)/(\d+) of (\d+)", groups)
    assert pp and int(pp.group(1)) < int(pp.group(2))
    assert re.search(r"dp 0/\d+ of", groups) and re.search(r"tp 0/\d+ of", groups)
    placed = next(ln for ln in lines if ln.startswith("placement: "))
    assert "Megatron's order" in placed
    assert "MEGATRON_LM_DIR=/path/to/Megatron-LM sbatch" in stdout
    doc = json.loads((out / "plan.json").read_text())
    assert doc["placement"]["method"] == "optimized"
    audit = json.loads((out / "audit.json").read_text())
    assert audit["islands"] == [["h1", "h3", "h5", "h7"], ["h2", "h4", "h6", "h8"]]
    (finding,) = audit["findings"]
    (cost,) = finding["costs"]
    assert cost["what"] == "repairing the cross-island links"
    assert cost["delta_s"] <= 0 and cost["iteration_time_s"] == pytest.approx(
        doc["estimate"]["iteration_time_s"], rel=1e-9)


def test_plan_report_holds_every_section(islands_plan):
    out, _ = islands_plan
    page = (out / "report.html").read_text()
    for key, title in SECTIONS:
        assert f"<h2 id='{key}'>{title}</h2>" in page
    assert page.count("src='data:image/png;base64,") == 4
    assert "repairing the cross-island links" in page


def test_plan_refuses_bad_input(islands_file, tmp_path):
    both = run_cli("plan", "--model", "llama3-8b", "--gbs", "64", "--topology", islands_file,
                   "--logs", REAL_CLUSTER, "--out", tmp_path / "a")
    assert both.returncode == 2 and "exactly one of --logs" in both.stderr
    neither = run_cli("plan", "--model", "llama3-8b", "--gbs", "64", "--out", tmp_path / "b")
    assert neither.returncode == 2 and "--logs" in neither.stderr
    bare = tmp_path / "bare.json"
    t = topo(factor=two_islands)
    save_topology(type(t)(hosts=t.hosts, gpus_per_host=8, links=t.links), bare)
    unknown = run_cli("plan", "--model", "llama3-8b", "--gbs", "64", "--topology", bare,
                      "--out", tmp_path / "c")
    assert unknown.returncode == 2
    assert "--cluster: required: the measurements do not name their GPU" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1


def test_the_gpu_the_logs_name_picks_the_cluster():
    assert cluster_ref_for(topo(), None) == "dgx-h100-80gb"
    assert cluster_ref_for(topo(), "dgx-h200-141gb") == "dgx-h200-141gb"


def test_used_host_pairs_and_island_crossings():
    plan = ParallelPlan(tp=8, pp=2, dp=2, micro_batch_size=1, global_batch_size=8)
    # node rank n on host n: stage 0 on hosts 0,1 (dp 0,1), stage 1 on hosts 2,3
    used = used_host_pairs(plan, [0, 1, 2, 3], 8)
    assert used == {(0, 1), (1, 0), (2, 3), (3, 2), (0, 2), (2, 0), (1, 3), (3, 1)}
    hosts = ["a", "b", "c", "d"]
    islands = (("a", "b"), ("c", "d"))
    cross = {c.dim: (c.crossing, c.groups) for c in island_crossings(plan, hosts, 8, islands)}
    assert cross == {"tp": (0, 4), "dp": (0, 16), "pp boundaries": (1, 1)}
    other = island_crossings(plan, ["a", "c", "b", "d"], 8, islands)
    assert {c.dim: c.crossing for c in other} == {"tp": 0, "dp": 16, "pp boundaries": 0}
    moe = ParallelPlan(tp=1, pp=1, dp=8, ep=8, micro_batch_size=1, global_batch_size=8)
    assert used_host_pairs(moe, [0], 8) is None


def test_audit_prices_a_bad_nic_for_the_search_best(tmp_path, capsys):
    from configurator.cli import main

    path = tmp_path / "nic.json"
    save_topology(topo(n=4, factor=lambda a, b: 0.2 if "h2" in (a, b) else 1.0), path)
    assert main(["audit", "--topology", str(path), "--model", "llama3-8b", "--gbs", "128",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["priced_for"].startswith("llama3-8b, the search's best plan")
    (f,) = d["findings"]
    assert f["kind"] == "slow_host" and f["hosts"] == ["h2"]
    whats = {c["what"]: c for c in f["costs"]}
    assert set(whats) == {"repairing h2's links", "leaving out h2"}
    assert whats["repairing h2's links"]["delta_s"] <= 0
    assert main(["audit", "--topology", str(path), "--gbs", "128"]) == 2
    assert "needs --model" in capsys.readouterr().err


@pytest.fixture(scope="module")
def real_plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "job"
    res = run_cli("plan", "--model", "llama3-70b", "--gbs", "512", "--logs", REAL_CLUSTER,
                  "--out", out, timeout=600)
    assert res.returncode == 0, res.stderr
    return out, res.stdout


def test_plan_on_the_shipped_logs_prices_every_finding(real_plan):
    out, stdout = real_plan
    assert (out / "topology.json").is_file()
    audit = json.loads((out / "audit.json").read_text())
    assert audit["findings"] and all(f["costs"] for f in audit["findings"])
    assert "cnode2-003" in audit["recommendation"]["drain_hosts"]
    # either the plan leaves cnode2-003 out or it says what keeping it gains
    assert re.search(r"^(left out cnode2-003|kept every host)", stdout, re.M)
    page = (out / "report.html").read_text()
    assert "leaving out cnode2-003" in page


#: Height (CSS px) of the report of the shipped 17-node logs (``plan --model llama3-70b --gbs
#: 512``) before it led with a headline and grouped its findings by cause, rendered as
#: below at 1400 px wide: its 61-row findings table alone took 6,855 px. The report must
#: stay within half of it.
OLD_REPORT_HEIGHT_PX = 13_058


@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium not installed "
                                                  "(apt-get install -y chromium)")
@pytest.mark.parametrize("which", ["islands_plan", "real_plan"])
def test_report_renders_in_headless_chromium(which, request, tmp_path):
    """Every section laid out and every image decoded and shown, as Chromium renders the
    page at 1400x900: a copy of the report gets a script that records them once the page
    has loaded, read back with --dump-dom. The headline (plan, time, what the audit changed
    and its price) is above the fold, and the 17-node report within half its old height."""
    out, _ = request.getfixturevalue(which)
    page = (out / "report.html").read_text()
    probe = ("<script>window.addEventListener('load',()=>{document.body.setAttribute("
             "'data-check',JSON.stringify({images:[...document.images].map(i=>[i.complete,"
             "i.naturalWidth,i.naturalHeight,i.getBoundingClientRect().width]),sections:[..."
             "document.querySelectorAll('h2[id]')].map(e=>[e.id,e.getBoundingClientRect()."
             "height]),height:document.documentElement.scrollHeight,headline:document."
             "querySelector('.head').getBoundingClientRect().bottom}));});</script>")
    copy = tmp_path / "check.html"
    copy.write_text(page.replace("</body>", probe + "</body>"))
    res = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-quic", "--no-first-run", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900",
                          "--virtual-time-budget=10000", "--dump-dom", copy.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120)
    m = re.search(r'data-check="([^"]*)"', res.stdout)
    assert m, res.stderr[-2000:]
    check = json.loads(m.group(1).replace("&quot;", '"'))
    assert [s[0] for s in check["sections"]] == [key for key, _ in SECTIONS]
    assert all(height > 0 for _, height in check["sections"])
    assert len(check["images"]) == 4
    for complete, w, h, shown in check["images"]:
        assert complete and w > 100 and h > 100 and shown > 100
    assert np.isfinite([s[1] for s in check["sections"]]).all()
    assert 0 < check["headline"] <= 900, check["headline"]
    if which == "real_plan":
        assert check["height"] <= OLD_REPORT_HEIGHT_PX / 2, check["height"]


def test_the_report_leads_with_the_terminal_lines_and_groups_findings_by_cause(real_plan):
    """The headline holds the lines ``plan`` printed, as printed (one source); the findings
    come one group per kind, each kind's cause once, priced groups before the unpriced,
    and a reason shared by many findings said once."""
    import html

    from topology.structure import CAUSES

    out, stdout = real_plan
    page = (out / "report.html").read_text()
    head = page[page.index("<h2 id='headline'>"):page.index("<h2 id='next-steps'>")]
    summary = stdout.split("\nwrote ")[0].splitlines()
    assert summary[0].endswith("tokens/s per GPU") and " s per iteration" in summary[0]
    for line in summary:
        assert html.escape(line) in head, line
    assert any(line.startswith("what the findings cost this plan: ") for line in summary)
    found = page[page.index("<h2 id='findings'>"):page.index("<h2 id='heatmap'>")]
    audit = json.loads((out / "audit.json").read_text())
    kinds = {f["kind"] for f in audit["findings"]}
    for kind in kinds:
        assert page.count(html.escape(CAUSES[kind])) == 1, kind
    assert found.count("<h3>") == len(kinds)
    assert found.count(html.escape("no link of it carries this placement's traffic")) == 1
    assert found.count(html.escape("the plan is priced at the link's fitted rate")) == 1
    priced = found.index("1 slow host")
    assert priced < found.index("34 links slower at large messages")
    assert "+2.8 %" in found[priced:found.index("<h3>", priced + 5)] or re.search(
        r"<b>\+\d+\.\d %</b> leaving out cnode2-003", found)


def test_plan_outcome_names_and_holds_its_real_types(islands_file, tmp_path):
    """``PlanOutcome`` is typed (no ``object`` field) and ``run_plan`` fills it with what its
    annotations say: the audit, the measured topology and the search it chose from."""
    import dataclasses
    import typing

    from configurator.app import cluster_plan_jobs as jobs
    from configurator.app.training_jobs import TrainingRequest
    from configurator.search.rank import SearchResult
    from topology.audit import AuditReport
    from topology.topofile import Topology

    ns = dict(vars(jobs), AuditReport=AuditReport, Topology=Topology,
              SearchResult=SearchResult, TrainingRequest=TrainingRequest)
    hints = typing.get_type_hints(jobs.PlanOutcome, globalns=ns)
    assert [f.name for f in dataclasses.fields(jobs.PlanOutcome)] == list(hints)
    assert object not in hints.values()
    assert (hints["report"], hints["topology"], hints["chosen"]) == (AuditReport, Topology,
                                                                     SearchResult)
    out = jobs.run_plan(jobs.PlanRequest(model="llama3-8b", global_batch_size=64,
                                         topology=str(islands_file), out=str(tmp_path / "p"),
                                         top=1, placement_evaluations=20))
    assert isinstance(out.report, AuditReport) and out.report.islands
    assert isinstance(out.topology, Topology) and len(out.topology.hosts) == 8
    assert isinstance(out.chosen, SearchResult) and out.chosen.plans[0].placement is not None
    assert "plan.json" in out.written


def test_plan_searches_within_the_limits_given(islands_file, tmp_path):
    """``plan`` takes ``search``'s limits: with ``--recompute full --no-sequence-parallel
    --tp 1 2 --no-overlap-grad-reduce`` every plan it ranks keeps them (without them, its best
    plan on the same links leaves at least one, so the limits are what holds them)."""
    from configurator.app import cluster_plan_jobs as jobs
    from configurator.app.plan_jobs import SearchLimits

    def best(limits):
        out = jobs.run_plan(jobs.PlanRequest(
            model="llama3-8b", global_batch_size=64, topology=str(islands_file),
            out=str(tmp_path / f"p{len(limits.words())}"), top=2, placement_evaluations=20,
            limits=limits))
        return [e.plan for e in out.chosen.plans]

    held = best(SearchLimits(recompute=("full",),
                             restrict={"sequence_parallel": False, "tp": (1, 2)},
                             ddp={"overlap_grad_reduce": False}))
    assert held and all((p.recompute, p.sequence_parallel, p.overlap_grad_reduce) ==
                        ("full", False, False) and p.tp in (1, 2) for p in held)
    free = best(SearchLimits())[0]
    assert (free.recompute, free.sequence_parallel, free.overlap_grad_reduce,
            free.tp in (1, 2)) != ("full", False, False, True)
