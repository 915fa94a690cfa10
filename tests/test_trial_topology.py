"""``configurator trial --topology``: the short runs chosen on the hosts' measured links,
pinned to the hosts ``calibrate --topology`` prices their logs on (the topology's first N:
a Megatron log names no hosts), and the next step naming the topology."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from configurator.app.inputs import JobInputs
from configurator.app.trial_jobs import TrialRequest, run_trial
from configurator.app.validate_jobs import validate_runs
from configurator.cli import main
from configurator.core.errors import InputError
from configurator.core.model_presets import load_model
from configurator.core.runs import MeasuredRun
from topology.importers import import_paths

DATA = Path(__file__).parent / "data"
PAIRS = DATA / "nvidia-smi-topo_a100-pcie-nvlink-pairs.txt"


@pytest.fixture(scope="module")
def h17(tmp_path_factory):
    """The 17-node H100 cluster's nccl-tests logs as a topology file."""
    from tests.conftest import REAL_CLUSTER

    path = tmp_path_factory.mktemp("topo") / "h17.json"
    assert main(["topology", "import", str(REAL_CLUSTER / "logs"), "-o", str(path),
                 "-q"]) == 0
    return path


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """One A100 server of NVLink-bridged pairs over PCIe (``nvidia-smi topo -m``)."""
    path = tmp_path_factory.mktemp("topo") / "pairs.json"
    assert main(["topology", "import", str(PAIRS), "-o", str(path), "-q"]) == 0
    return path


def _as_runs(outcome, model: str, cluster: str) -> list[MeasuredRun]:
    """The trial's runs as run records whose time is the trial's prediction."""
    m = load_model(model)
    return [MeasuredRun(name=f"trial{r.index}", group=None, source="trial", model=m,
                        cluster=cluster, num_gpus=r.plan.world_size, seq_length=None,
                        plan=r.plan, iteration_time_s=r.predicted_iteration_time_s)
            for r in outcome.runs]


def test_trial_runs_are_priced_where_calibrate_prices_their_logs(h17, tmp_path, capsys):
    """Two of the 17 hosts: each run's predicted time is the price ``validate --topology``
    gives its log (the same hosts, the same links, to rounding), some run's differs from the
    nominal links' by more than 2 %, the scripts pin the two hosts in node_rank order, and
    the next step calibrates and searches on the topology; the link efficiencies are not
    among the parameters the runs settle (the links carry their own figures)."""
    out = tmp_path / "trial"
    req = TrialRequest(inputs=JobInputs(model="llama3-8b", cluster="dgx-h100-80gb", nodes=2,
                                        topology=str(h17)),
                       global_batch_size=64, out=str(out))
    res = run_trial(req)
    runs = _as_runs(res, "llama3-8b", "dgx-h100-80gb")
    on_links = [c.predicted_iteration_time_s for c in validate_runs(
        runs, topology=import_paths([str(h17)])).checks]
    nominal = [c.predicted_iteration_time_s for c in validate_runs(runs).checks]
    assert on_links == pytest.approx([r.predicted_iteration_time_s for r in res.runs],
                                     rel=1e-9)
    assert max(abs(a / b - 1) for a, b in zip(on_links, nominal)) > 0.02
    assert set(res.sd_before) == {"gemm", "flash_attention", "host_op_us"}
    assert res.to_dict()["hosts"] == ["cnode2-001", "cnode2-002"]
    assert json.loads((out / "trials.json").read_text())["hosts"] == ["cnode2-001",
                                                                      "cnode2-002"]
    for r in res.runs:
        sb = (out / f"trial{r.index}" / "launch_slurm.sbatch").read_text()
        tr = (out / f"trial{r.index}" / "launch_torchrun.sh").read_text()
        assert "#SBATCH --nodelist=cnode2-001,cnode2-002\n" in sb
        assert "cnode2-001|cnode2-001.*) NODE_RANK=0 ;;" in tr
        assert "cnode2-002|cnode2-002.*) NODE_RANK=1 ;;" in tr
    assert any("first 2 host(s) (cnode2-001, cnode2-002)" in n for n in res.notes)
    assert any(f"--exclude-flagged leaves out the hosts configurator audit --topology {h17} "
               "says to drain" in n for n in res.notes)
    calibrate, = [s for s in res.next_steps if s.startswith("configurator calibrate")]
    assert calibrate.count(f"--topology {h17}") == 2 and "--nodes 2" in calibrate
    assert "cnode2-001 cnode2-002 (the script finds its node_rank" in res.next_steps[0]


def test_exclude_flagged_pins_the_first_hosts_the_audit_does_not_flag(h17):
    """cnode2-003, the third host, is one the 17-node cluster's audit says to drain: with
    --exclude-flagged three nodes go on cnode2-001, -002 and -004, and each run's time is
    what validate --topology gives a log that names those hosts (the scripts print them)."""
    res = run_trial(TrialRequest(inputs=JobInputs(model="llama3-8b", cluster="dgx-h100-80gb",
                                                  nodes=3, topology=str(h17),
                                                  exclude_flagged=True),
                                 global_batch_size=48, runs=2))
    assert res.hosts == ("cnode2-001", "cnode2-002", "cnode2-004")
    assert any("first 3 hosts the audit does not flag (cnode2-001, cnode2-002, cnode2-004)"
               in n for n in res.notes)
    runs = [dataclasses.replace(r, hosts=res.hosts)
            for r in _as_runs(res, "llama3-8b", "dgx-h100-80gb")]
    on_links = [c.predicted_iteration_time_s for c in validate_runs(
        runs, topology=import_paths([str(h17)])).checks]
    assert on_links == pytest.approx([r.predicted_iteration_time_s for r in res.runs],
                                     rel=1e-9)
    assert "--exclude-flagged" in res.next_steps[1]


def test_on_a_node_of_pcie_pairs_no_contender_spans_pcie(pairs, tmp_path, capsys):
    """On the nominal DGX A100 a tp-8 plan is a contender of GPT 3.6B's 16-sequence job (GPT
    1.7B's had a tp-4 one while a GEMM's fixed time held its launch); on the node's own links
    (NVLink only within a pair) every contender keeps tp within a pair. The one host is named
    after its nvidia-smi file, no hostname: the by-hand command passes node_rank 0 and the
    torchrun script's master is localhost."""
    common = ["trial", "--model", "gpt-3.6b", "--cluster", "dgx-a100-80gb", "--gbs", "16",
              "--precision", "fp16", "--json", "-q"]
    assert main(common + ["--nodes", "1"]) == 0
    nominal = json.loads(capsys.readouterr().out)
    out = tmp_path / "t"
    assert main(common + ["--topology", str(pairs), "--out", str(out)]) == 0
    placed = json.loads(capsys.readouterr().out)

    def contender_tps(doc):
        return [r["plan"]["tp"] for r in doc["runs"] if r["role"] == "contender"]
    assert max(contender_tps(nominal)) >= 4 and nominal["hosts"] is None
    assert placed["hosts"] == ["a100-pcie-nvlink-pairs"]
    assert contender_tps(placed) and max(contender_tps(placed)) <= 2
    assert "or on a100-pcie-nvlink-pairs: bash " in placed["next_steps"][0]
    assert "launch_torchrun.sh 0 2>&1" in placed["next_steps"][0]
    tr = (out / "trial1" / "launch_torchrun.sh").read_text()
    assert "MASTER_ADDR=${MASTER_ADDR:-localhost}" in tr
    assert "a100-pcie-nvlink-pairs|a100-pcie-nvlink-pairs.*) NODE_RANK=0 ;;" in tr


def test_trial_topology_errors_name_the_field(h17, capsys):
    base = ["trial", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gbs", "64",
            "--topology", str(h17), "-q"]
    for extra, message in (
            (["--nodes", "20"], "--nodes=20: must be at most the 17 hosts of the topology"),
            (["--cluster", "dgx-a100-80gb"], "has a100-80gb GPUs but")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    with pytest.raises(InputError, match="calibration"):
        run_trial(TrialRequest(inputs=JobInputs(model="llama3-8b", cluster="dgx-h100-80gb",
                                                calibration="c.yaml"), global_batch_size=64))
