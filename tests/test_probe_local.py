"""The bandwidth probe on localhost with gloo: a full run of 2 "nodes" under torchrun, a node
that never joins, a link that hangs, a store that stops answering, node 0 killed mid-run, and
its argument errors (one line each) and `configurator probe`."""

import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from datetime import timedelta

import pytest

from topology.topofile_io import load_topology

dist = pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 120
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE", "CONFIGURATOR_PROBE_HOSTNAME")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)
    return env


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in new sessions)."""
    children: dict[int, list[int]] = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(p) -> None:
    """SIGKILL a still-running launcher and every process below it, then reap it."""
    if p.poll() is None:
        for pid in descendants(p.pid) + [p.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()


def run_all(specs, timeout_s=RUN_TIMEOUT_S):
    """Start every (argv, env) at once, wait for all; kill what is left. → [(rc, out, err)]."""
    procs = []
    try:
        for argv, env in specs:
            procs.append(subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        outs = [p.communicate(timeout=timeout_s) for p in procs]
        return [(p.returncode, *o) for p, o in zip(procs, outs)]
    finally:
        for p in procs:
            kill_tree(p)


def run_nodes(nodes: int, nproc: int, probe_args, entry=("-m", "topology.probe"), attempts=3,
              entries=None):
    """torchrun once per node on localhost (host names h0, h1, ...); retried on a port clash."""
    for _ in range(attempts):
        port = free_port()
        specs = []
        for r in range(nodes):
            e = entries[r] if entries else list(entry)
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
                    "--nproc-per-node", str(nproc), "--node-rank", str(r), "--master-addr",
                    "127.0.0.1", "--master-port", str(port), "--rdzv-conf", "timeout=60",
                    *e, *probe_args]
            specs.append((argv, base_env(CONFIGURATOR_PROBE_HOSTNAME=f"h{r}")))
        out = run_all(specs)
        if not any("address already in use" in err.lower() for _, _, err in out):
            return out
    return out


def probe_lines(err: str) -> list[str]:
    return [l for l in err.splitlines() if l.startswith("probe:")]


def test_two_nodes_two_ranks_each(tmp_path):
    out = tmp_path / "topo.json"
    res = run_nodes(2, 2, ["--out", str(out), "--size-mb", "2", "--iters", "3", "--warmup", "1",
                           "--timeout-s", "30", "--backend", "gloo"])
    assert [rc for rc, _, _ in res] == [0, 0], res
    assert "probe: wrote" in res[0][1]
    topo = load_topology(out)
    assert topo.hosts == ("h0", "h1") and topo.gpus_per_host == 2 and not topo.missing
    host = {(l.src, l.dst) for l in topo.links if l.src_gpu is None}
    assert host == {("h0", "h1"), ("h1", "h0")}
    rail = {(l.src, l.dst, l.src_gpu, l.dst_gpu) for l in topo.links if l.src_gpu is not None}
    assert rail == {(a, b, i, i) for a, b in host for i in (0, 1)}
    for l in topo.links:
        assert len(l.samples_Bps) == 3 and l.bandwidth_Bps > 0 and l.latency_s > 0
        assert l.message_bytes == 2_000_000 and l.method == "probe gloo send/recv"
        assert min(l.samples_Bps) <= l.bandwidth_Bps <= max(l.samples_Bps)
    assert sorted(c.hosts for c in topo.collectives) == [("h0",), ("h1",)]
    assert all(c.op == "all_reduce" and c.busbw_Bps > 0 for c in topo.collectives)
    assert any("gloo" in w for w in topo.warnings)  # no intra-node GPU links on gloo


def test_node_that_never_joins_is_named_and_file_kept(tmp_path):
    out = tmp_path / "partial.json"
    env = base_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   CONFIGURATOR_PROBE_HOSTNAME="alpha")
    [(rc, _, err)] = run_all([([sys.executable, "-m", "topology.probe", "--out", str(out),
                                "--timeout-s", "3", "--expected-hosts", "alpha,beta"], env)])
    assert rc == 1
    lines = probe_lines(err)
    assert len(lines) == 1 and "node_rank 1 (beta) did not join within 3 s" in lines[0]
    assert str(out) in lines[0]
    topo = load_topology(out)
    assert topo.hosts == ("alpha", "beta") and topo.links == ()
    assert [(m.src, m.dst, m.reason) for m in topo.missing] == [
        ("alpha", "beta", "did not join"), ("beta", "alpha", "did not join")]   # both ways


HANG = textwrap.dedent("""
    import sys, time
    from topology import probe, probe_ops
    probe_ops.Ops.send = lambda self, peer: time.sleep(3600)   # this node's sends hang
    sys.exit(probe.main())
""")


def test_hanging_link_is_named_and_measurements_kept(tmp_path):
    hang = tmp_path / "hang.py"
    hang.write_text(HANG)
    out = tmp_path / "partial.json"
    res = run_nodes(2, 1, ["--out", str(out), "--size-mb", "1", "--iters", "2", "--warmup", "1",
                           "--timeout-s", "3", "--backend", "gloo"],
                    entries=[["-m", "topology.probe"], [str(hang)]])
    assert all(rc != 0 for rc, _, _ in res), res
    lines = probe_lines(res[0][2])
    assert len(lines) == 1, res[0][2]
    assert lines[0].startswith("probe: error: inter-node host round 1/1 backward: h1 -> h0")
    assert "partial topology written" in lines[0]
    topo = load_topology(out)
    assert [(l.src, l.dst) for l in topo.links] == [("h0", "h1")]   # measured before the hang
    assert [(m.src, m.dst) for m in topo.missing] == [("h1", "h0")]
    assert any("stopped by rank 0" in l for l in probe_lines(res[1][2])), res[1][2][-3000:]


def test_existing_output_is_refused(tmp_path):
    out = tmp_path / "topo.json"
    out.write_text("keep me")
    env = base_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    [(rc, _, err)] = run_all([([sys.executable, "-m", "topology.probe", "--out", str(out)], env)])
    assert rc == 2 and "file exists" in err and out.read_text() == "keep me"


def test_argument_and_environment_errors(monkeypatch, capsys):
    from topology import probe

    for k in DIST_ENV:
        monkeypatch.delenv(k, raising=False)
    assert probe.main(["--out", "x.json"]) == 2
    assert "launch with torchrun" in capsys.readouterr().err
    assert probe.main(["--out", "x.json", "--size-mb", "0"]) == 2
    assert "size_mb=0.0" in capsys.readouterr().err
    assert probe.main(["--out", "x.json", "--warmup", "-1"]) == 2
    with pytest.raises(SystemExit) as exc:
        probe.main(["--out", "x.json", "--backend", "mpi"])
    assert exc.value.code == 2


def test_configurator_probe_prints_torchrun_line(monkeypatch, capsys):
    from configurator.cli import main

    for k in DIST_ENV:
        monkeypatch.delenv(k, raising=False)
    assert main(["probe", "--nnodes", "4", "--nproc-per-node", "8", "--master-addr", "n001",
                 "--out", "my topo.json", "--size-mb", "64", "--timeout-s", "90"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    words = shlex.split(line)
    assert words[:9] == ["torchrun", "--nnodes", "4", "--nproc-per-node", "8", "--node-rank",
                         "$NODE_RANK", "--master-addr", "n001"]
    assert "timeout=90" in words and words[words.index("-m") + 1] == "topology.probe"
    probe_args = words[words.index("topology.probe") + 1:]
    assert probe_args[:2] == ["--out", "my topo.json"]
    assert probe_args[probe_args.index("--size-mb") + 1] == "64"
    # the probe accepts exactly what is printed
    from topology.probe import parse_args
    assert parse_args(probe_args).message_bytes == 64_000_000

    assert main(["probe", "--nnodes", "2", "--nproc-per-node", "1", "--slurm"]) == 0
    slurm = shlex.split(capsys.readouterr().out.strip())
    assert slurm[:4] == ["srun", "--ntasks-per-node", "1", "bash"]
    assert '--node-rank "$SLURM_NODEID" --master-addr "$MASTER_ADDR"' in slurm[-1]
    assert main(["probe", "--nproc-per-node", "8"]) == 2
    assert "error: --nnodes: required" in capsys.readouterr().err
    assert main(["probe"]) == 2     # every missing flag at once, named as a flag
    assert "error: --nnodes, --nproc-per-node: required" in capsys.readouterr().err


def test_store_that_stops_answering_ends_every_rank(tmp_path):
    """Node 0's torchrun agent hosts the store; freeze it mid-run (SIGSTOP): store calls then
    block for ever, so only the probe's own deadman can end the ranks."""
    out = tmp_path / "partial.json"
    port = free_port()
    procs = []
    try:
        for r in range(2):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                    "--nproc-per-node", "1", "--node-rank", str(r), "--master-addr", "127.0.0.1",
                    "--master-port", str(port), "-m", "topology.probe", "--out", str(out),
                    "--size-mb", "1", "--iters", "100000", "--timeout-s", "3"]
            procs.append(subprocess.Popen(argv, env=base_env(CONFIGURATOR_PROBE_HOSTNAME=f"h{r}"),
                                          cwd=REPO, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        agent0 = procs[0]
        # wait until both ranks have joined (rank 0 has published the roster); the probe
        # itself would run for hours with these --iters
        store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60),
                              wait_for_workers=False)
        deadline = time.monotonic() + 60
        while not store.check(["configurator-probe/0/roster"]):
            assert time.monotonic() < deadline, "the probe ranks did not join"
            time.sleep(0.1)
        time.sleep(1.0)
        workers = [w for p in procs for w in descendants(p.pid)]
        assert len(workers) == 2
        os.kill(agent0.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        while any(psutil_alive(w) for w in workers) and time.monotonic() - t0 < 30:
            time.sleep(0.2)
        took = time.monotonic() - t0
        os.kill(agent0.pid, signal.SIGCONT)
        res = [(p.communicate(timeout=60), p.returncode) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
            kill_tree(p)
    assert took < 15, took                                     # ~3 s deadman + start-up slack
    assert all(rc != 0 for _, rc in res)
    lines = probe_lines(res[0][0][1])
    assert len(lines) == 1 and "has not answered for 3 s" in lines[0], res[0][0][1][-2000:]
    assert f"127.0.0.1:{port}" in lines[0]
    topo = load_topology(out)                                  # what was known is kept
    assert topo.hosts == ("h0", "h1") and {(m.src, m.dst) for m in topo.missing} == {
        ("h0", "h1"), ("h1", "h0")}


def psutil_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- node 0 killed mid-run -------------------------------------------------------------------

PR_SET_CHILD_SUBREAPER = 36


def _subreaper(on: bool) -> None:
    """Make this process adopt orphaned descendants (a killed agent's workers), so that their
    exit status can be read with waitpid."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0, ctypes.get_errno()


def _worker_logs(log_dir: Path) -> dict[int, str]:
    """stderr of every local rank that torchrun redirected under ``log_dir``."""
    return {int(p.parent.name): p.read_text()
            for p in sorted(log_dir.glob("*/attempt_*/*/stderr.log"))}


def _local_rank(pid: int) -> int:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        env = dict(v.split(b"=", 1) for v in fh.read().split(b"\0") if b"=" in v)
    return int(env[b"LOCAL_RANK"])


def _assert_every_measurement_accounted(topo, G: int) -> None:
    """Each measurement the plan expects is in the file, or its host pair is in ``missing``."""
    from topology.probe_plan import plan_steps

    hosts, miss = topo.hosts, {(m.src, m.dst) for m in topo.missing}
    links = {(l.src, l.dst, l.src_gpu, l.dst_gpu) for l in topo.links}
    colls = {c.hosts for c in topo.collectives}
    lacking = []
    for step in plan_steps(len(hosts), G, intra_p2p=False):
        for s, d in step.transfers:
            a, b = hosts[s // G], hosts[d // G]
            key = (a, b, None, None) if step.kind == "host" else (a, b, s % G, d % G)
            if key not in links and (a, b) not in miss:
                lacking.append((step.name, a, b))
        for g in step.groups:
            h = hosts[g[0] // G]
            if (h,) not in colls and (h, h) not in miss:
                lacking.append((step.name, h, h))
    assert lacking == [], (lacking, topo.missing)


@pytest.mark.parametrize("victim,sig", [("agent", signal.SIGKILL), ("agent", signal.SIGINT),
                                        ("agent", signal.SIGTERM), ("rank0", signal.SIGKILL)],
                         ids=["agent-SIGKILL", "agent-SIGINT", "agent-SIGTERM", "rank0-SIGKILL"])
def test_node0_killed_mid_run(tmp_path, victim, sig):
    """Kill node 0 (its torchrun agent, which hosts the store, or its rank-0 process, which
    coordinates and writes the file) once the first host-level direction is measured, while
    the backward one is under way: no process of the probe prints a traceback, each node's
    probe processes end with one line naming what happened and a non-zero status, and the
    partial file, where one is written, lists as missing every measurement it lacks."""
    hang = tmp_path / "hang.py"
    hang.write_text(HANG)                 # node 1's sends hang
    out = tmp_path / "partial.json"
    G, port, procs, logs = 2, free_port(), [], [tmp_path / "logs0", tmp_path / "logs1"]
    _subreaper(True)
    try:
        for r in range(2):
            argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                    "--nproc-per-node", str(G), "--node-rank", str(r), "--master-addr",
                    "127.0.0.1", "--master-port", str(port), "--log-dir", str(logs[r]),
                    "--redirects", "3", *(["-m", "topology.probe"] if r == 0 else [str(hang)]),
                    "--out", str(out), "--size-mb", "1", "--iters", "2", "--warmup", "1",
                    "--timeout-s", "30", "--backend", "gloo"]
            procs.append(subprocess.Popen(argv, env=base_env(CONFIGURATOR_PROBE_HOSTNAME=f"h{r}"),
                                          cwd=REPO, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))
        store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60),
                              wait_for_workers=False)
        deadline = time.monotonic() + 90
        while not store.check(["configurator-probe/0/done/1"]):   # all-reduce, h0 -> h1 done
            assert time.monotonic() < deadline, "the probe did not measure h0 -> h1"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
        del store
        workers = {r: descendants(p.pid) for r, p in enumerate(procs)}
        assert [len(w) for w in workers.values()] == [G, G], workers
        node0 = sorted(workers[0], key=_local_rank)
        os.kill(procs[0].pid if victim == "agent" else node0[0], sig)
        res = [(p.communicate(timeout=60), p.returncode) for p in procs]
        # the workers a killed agent leaves behind are ours now: their status
        orphans = {}
        if victim == "agent" and sig == signal.SIGKILL:
            for w in node0:
                t0 = time.monotonic()
                while time.monotonic() - t0 < 60:
                    pid, status = os.waitpid(w, os.WNOHANG)
                    if pid:
                        orphans[w] = os.waitstatus_to_exitcode(status)
                        break
                    time.sleep(0.1)
    finally:
        for p in procs:
            kill_tree(p)
        for w in [w for ws in locals().get("workers", {}).values() for w in ws]:
            try:
                os.kill(w, signal.SIGKILL)
                os.waitpid(w, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        _subreaper(False)
    assert all(rc != 0 for _, rc in res), res
    assert all(code == 1 for code in orphans.values()), orphans
    for r in range(2):
        got = _worker_logs(logs[r])
        assert sorted(got) == list(range(G)), (r, got)
        for local, text in got.items():
            lines = [l for l in text.splitlines() if l.strip()]
            assert not any(w in text for w in ("Traceback", "frame #", "Exception raised")), \
                (r, local, text[-3000:])
            if (r, local) == (0, 0) and victim == "rank0":
                assert lines == []                        # SIGKILLed: nothing to say
            elif local == 0:                              # one line per node, from local rank 0
                assert len(lines) == 1 and lines[0].startswith("probe: "), (r, text[-3000:])
            else:
                assert lines == [], (r, local, text[-3000:])
    line0 = _worker_logs(logs[0])[0].strip()
    line1 = _worker_logs(logs[1])[0].strip()
    if victim == "rank0":                                 # no one left to write a file
        assert not out.exists()
        assert "lost the coordination store" in line1, line1
        return
    topo = load_topology(out)
    if sig == signal.SIGKILL:
        assert line0.startswith(f"probe: error: lost the coordination store at 127.0.0.1:{port}")
        assert "lost the coordination store" in line1, line1
    else:
        name = signal.Signals(sig).name
        assert line0.startswith(f"probe: error: stopped by {name} on h0; partial topology "
                                f"written to {out}"), line0
        assert line1.startswith(f"probe: stopped by rank 0: stopped by {name} on h0"), line1
    assert "partial topology written" in line0 and f"{len(topo.missing)} missing" in line0
    assert [(l.src, l.dst, l.src_gpu) for l in topo.links] == [("h0", "h1", None)]
    assert sorted(c.hosts for c in topo.collectives) == [("h0",), ("h1",)]
    assert {(m.src, m.dst) for m in topo.missing} == {("h1", "h0"), ("h0", "h1")}
    _assert_every_measurement_accounted(topo, G)


@pytest.mark.parametrize("argv,env", [
    (["--out", "OUT"], {"CONFIGURATOR_PROBE_HOSTNAME": "node\nprobe: error: forged"}),
    (["--out", "OUT"], {"MASTER_ADDR": "127.0.0.1\nforged"}),
    (["--out", "OUT", "extra\nforged"], {}),
    (["--out", "OUT\nforged.json"], {}),
    (["--out", "OUT", "--expected-hosts", "h0,h\x1b[2Kforged"], {}),
])
def test_every_error_is_one_line(tmp_path, argv, env):
    """Values echoed in an error (or written to the file) never span lines."""
    full = base_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    full.update(env)
    argv = [a.replace("OUT", str(tmp_path / "t.json")) for a in argv]
    [(rc, out, err)] = run_all([([sys.executable, "-m", "topology.probe", *argv], full)])
    assert rc == 2, (rc, out, err)
    assert err.count("\n") == 1 and err.startswith("probe: error: ") and \
        err.strip().isprintable(), err
    assert not list(tmp_path.iterdir())
