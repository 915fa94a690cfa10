"""The generated torchrun script enforces a plan's placement, under real torchrun on CPU.

Two stand-in "nodes" on this machine (each a torchrun started by the script, its
``hostname`` a stand-in printing that node's name), 2 "GPUs" each, a stand-in
``pretrain_gpt.py`` that joins a gloo process group (env:// from torchrun's variables) and
reports, per global rank, the host it ran on (asked of ``hostname``, as the script did), the
GPU index it would use (``CUDA_VISIBLE_DEVICES`` at its local rank), the GPU numbering and
the Megatron flags it got. Every rank must sit where plan.json says: global
rank ``r`` on ``hosts[r // G]``, GPU ``gpu_order[r // G][r % G]``.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from configurator.core import jsonout
from configurator.core.document import placement_record, plan_document
from configurator.core.model import make_model
from configurator.core.rules import plan_for_world
from tests.conftest import run_cli

STAND_IN = r'''
import json, os, subprocess, sys
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
assert rank == int(os.environ["RANK"])
devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
host = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
record = {"rank": rank, "local_rank": local, "world": dist.get_world_size(), "host": host,
          "started_as": os.environ["STAND_IN_HOST"], "node_rank": int(os.environ["GROUP_RANK"]),
          "gpu": int(devices.split(",")[local]) if devices else None,
          "order": os.environ.get("CUDA_DEVICE_ORDER"), "argv": sys.argv[1:]}
dist.barrier()
with open(os.path.join(os.environ["REPORT_DIR"], f"rank{rank}.json"), "w") as fh:
    json.dump(record, fh)
dist.destroy_process_group()
'''

MODEL = make_model(name="tiny", num_layers=4, hidden_size=256, num_attention_heads=4,
                   num_query_groups=4, ffn_hidden_size=1024, vocab_size=1024, seq_length=128)


def _torchrun() -> str:
    path = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable),
                                                    "torchrun")
    if not os.path.exists(path):
        if os.environ.get("CI"):
            pytest.fail("torchrun not found (install torch)")
        pytest.skip("torchrun not found (install torch)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plan_json(tmp: Path, hosts, gpu_order, excluded=()) -> Path:
    plan = plan_for_world(dict(tp=1, pp=2, cp=1, vp=1, micro_batch_size=1,
                               global_batch_size=4, recompute="none", precision="bf16",
                               attention_backend="auto"), 4)
    doc = plan_document(model=MODEL, cluster={"name": "cpu", "gpu": "h100-80gb",
                                              "gpus_per_node": 2, "nodes": 2, "num_gpus": 4},
                        plan=plan, estimate={"iteration_time_s": 1.0,
                                             "model_tflops_per_gpu": 1.0, "mfu": 0.1,
                                             "peak_memory_bytes": 1.0},
                        placement=placement_record(hosts, gpu_order, excluded, "optimized"))
    path = tmp / "plan.json"
    path.write_text(jsonout.dumps(doc, indent=2))
    return path


def _stand_in_node(tmp: Path, name: str) -> Path:
    """A bin directory whose ``hostname`` prints ``name``."""
    d = tmp / f"bin-{name}"
    d.mkdir()
    h = d / "hostname"
    h.write_text(f"#!/bin/sh\necho {name}\n")
    h.chmod(0o755)
    return d


def test_torchrun_script_puts_every_rank_where_the_plan_says(tmp_path):
    torchrun = _torchrun()
    hosts, order = ["hostB", "hostA"], [[1, 0], [0, 1]]       # node_rank 0 on hostB
    plan = _plan_json(tmp_path, hosts, order, excluded=["hostC"])
    out = tmp_path / "scripts"
    res = run_cli("launch", "--plan", plan, "--out", out)
    assert res.returncode == 0, res.stderr
    assert "placement: optimized, 2 hosts, excluded hostC" in res.stdout
    sbatch = (out / "launch_slurm.sbatch").read_text()
    assert "#SBATCH --nodelist=hostB,hostA" in sbatch and "#SBATCH --exclude=hostC" in sbatch
    megatron = tmp_path / "megatron"
    megatron.mkdir()
    (megatron / "pretrain_gpt.py").write_text(STAND_IN)
    reports = tmp_path / "reports"
    reports.mkdir()
    port = _free_port()
    procs = []
    for name in ("hostA", "hostB"):              # started in the opposite order on purpose
        env = dict(os.environ, MEGATRON_LM_DIR=str(megatron), REPORT_DIR=str(reports),
                   STAND_IN_HOST=name, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PATH=os.pathsep.join([str(_stand_in_node(tmp_path, name)),
                                         os.path.dirname(torchrun),
                                         os.path.dirname(sys.executable),
                                         os.environ.get("PATH", "")]),
                   OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
        env.pop("NODE_RANK", None)
        procs.append(subprocess.Popen(["bash", str(out / "launch_torchrun.sh")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-3000:]
    # each node's log names the job's hosts in node_rank order and their GPU order (what
    # validate --topology prices the log on); the sbatch script prints the same lines
    assert all("configurator: hosts hostB hostA\n" in log for log in logs)
    assert all("configurator: gpu_order 1,0 0,1\n" in log for log in logs)
    assert 'echo "configurator: hosts hostB hostA"' in sbatch
    assert 'echo "configurator: gpu_order 1,0 0,1"' in sbatch
    got = {r["rank"]: r for r in (json.loads(f.read_text()) for f in reports.iterdir())}
    assert sorted(got) == [0, 1, 2, 3]
    for rank, r in got.items():
        node, local = divmod(rank, 2)
        assert (r["host"], r["gpu"]) == (hosts[node], order[node][local]), r
        assert (r["started_as"], r["node_rank"], r["local_rank"]) == (r["host"], node, local)
        assert r["order"] == "PCI_BUS_ID" and r["world"] == 4
        argv = r["argv"]
        assert argv[argv.index("--pipeline-model-parallel-size") + 1] == "2"
        assert argv[argv.index("--tensor-model-parallel-size") + 1] == "1"


def test_script_refuses_an_unknown_host_and_a_missing_master_addr(tmp_path):
    plan = _plan_json(tmp_path, ["hostB", "hostA"], [[0, 1], [0, 1]])
    out = tmp_path / "scripts"
    assert run_cli("launch", "--plan", plan, "--out", out).returncode == 0
    megatron = tmp_path / "megatron"
    megatron.mkdir()
    (megatron / "pretrain_gpt.py").write_text("raise SystemExit('must not run')\n")
    env = dict(os.environ, MEGATRON_LM_DIR=str(megatron),
               PATH=os.pathsep.join([str(_stand_in_node(tmp_path, "elsewhere")),
                                     os.environ.get("PATH", "")]))
    env.pop("NODE_RANK", None)
    res = subprocess.run(["bash", str(out / "launch_torchrun.sh")], env=env, text=True,
                         capture_output=True, timeout=60)
    assert res.returncode == 2 and "host elsewhere is not in the placement" in res.stderr

    # a host the placement left out is refused by name
    excl = tmp_path / "excl"
    excl.mkdir()
    plan_x = _plan_json(excl, ["hostB", "hostA"], [[0, 1], [0, 1]], excluded=["hostC"])
    assert run_cli("launch", "--plan", plan_x, "--out", excl / "s").returncode == 0
    env_c = dict(env, PATH=os.pathsep.join([str(_stand_in_node(excl, "hostC.lab")),
                                           os.environ.get("PATH", "")]))
    res = subprocess.run(["bash", str(excl / "s" / "launch_torchrun.sh")], env=env_c,
                         text=True, capture_output=True, timeout=60)
    assert res.returncode == 2 and "hostC.lab is excluded by the placement" in res.stderr

    # a 2-node plan without a placement: MASTER_ADDR must name node_rank 0, not localhost
    no_place = tmp_path / "noplace"
    doc = json.loads(plan.read_text())
    del doc["placement"]
    (tmp_path / "plain.json").write_text(json.dumps(doc))
    assert run_cli("launch", "--plan", tmp_path / "plain.json", "--out",
                   no_place).returncode == 0
    for addr, says in ((None, "it is not set"), ("", "it is not set"),
                       ("localhost", "not localhost (this machine only)"),
                       ("LocalHost.localdomain", "not LocalHost.localdomain"),
                       ("127.0.0.1", "not 127.0.0.1"), ("127.1.2.3", "not 127.1.2.3"),
                       ("::1", "not ::1")):
        env2 = dict(env, NODE_RANK="1")
        env2.pop("MASTER_ADDR", None)
        if addr is not None:
            env2["MASTER_ADDR"] = addr
        res = subprocess.run(["bash", str(no_place / "launch_torchrun.sh")], env=env2,
                             text=True, capture_output=True, timeout=60)
        assert res.returncode == 2 and "a 2-node run needs MASTER_ADDR" in res.stderr, \
            res.stderr
        assert says in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_launch_nodes_must_match_the_plan(tmp_path):
    plan = _plan_json(tmp_path, ["hostB", "hostA"], [[0, 1], [0, 1]])
    res = run_cli("launch", "--plan", plan, "--out", tmp_path / "o", "--nodes", "4")
    assert res.returncode == 2
    assert "made for 2 nodes" in res.stderr and "search --nodes 4" in res.stderr
    assert run_cli("launch", "--plan", plan, "--out", tmp_path / "o2", "--nodes",
                   "2").returncode == 0
