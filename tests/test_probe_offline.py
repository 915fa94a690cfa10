"""The probe's parts that need no torch: rank 0's coordinator when the store goes away (with a
fake store), ``configurator probe`` and ``python -m topology.probe`` where torch is missing,
and one-line messages."""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from topology import probe_coord as pc
from topology import probe_plan as pp
from topology.topofile_io import load_topology

REPO = Path(__file__).resolve().parents[1]
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE", "CONFIGURATOR_PROBE_HOSTNAME")


# -- rank 0's coordinator when node 0's store goes away -----------------------------------------

class FakeStore:
    """A store in memory that fails like a TCPStore whose host died from the first check of a
    key starting with ``lose_at`` on."""

    def __init__(self, keys: dict, lose_at: str | None = None):
        self.keys, self.lose_at, self.lost = keys, lose_at, False

    def _alive(self):
        if self.lost:
            raise ConnectionResetError("Connection reset by peer\n[../gloo/x.cc:12] more")

    def check(self, keys):
        if self.lose_at and any(k.startswith(self.lose_at) for k in keys):
            self.lost = True
        self._alive()
        return all(k in self.keys for k in keys)

    def get(self, key):
        self._alive()
        return self.keys[key].encode() if isinstance(self.keys[key], str) else self.keys[key]

    def set(self, key, value):
        self._alive()
        self.keys[key] = value


class Ended(Exception):
    pass


@pytest.fixture
def ends(monkeypatch):
    """probe_coord.end without os._exit: prints, calls before_exit, raises Ended; the codes."""
    calls = []

    def fake_end(code, line=None, before_exit=None):
        if line:
            pc.say(line)
        if before_exit is not None:
            try:
                before_exit()
            except Exception:  # noqa: BLE001 - as the real one
                pass
        calls.append(code)
        raise Ended(code)

    def no_exit(code):
        raise Ended(code)

    monkeypatch.setattr(pc, "end", fake_end, raising=False)
    monkeypatch.setattr(os, "_exit", no_exit)   # in case anything still calls it
    monkeypatch.setattr(pc, "POLL_S", 0.001)
    monkeypatch.setattr(pc, "DEADMAN", SimpleNamespace(beat=lambda: None, stopped=False))
    return calls


def _coordinator(tmp_path, store, nodes=2, G=2):
    e = dict(world_size=nodes * G, master_addr="10.0.0.1", master_port=29500)
    args = SimpleNamespace(timeout_s=30.0, expected_hosts=[], out=str(tmp_path / "t.json"),
                           message_bytes=4_000_000)
    steps = pp.plan_steps(nodes, G, intra_p2p=False)
    guard = getattr(pc, "Guarded", lambda s: s)   # (before the fix: the raw store)
    return pc.Coordinator(e, args, steps, "gloo", G, guard(store)), steps


def _joined(nodes, G, measured_steps=()):
    """Store keys: every rank joined and set up, and the steps ``measured_steps`` reported."""
    keys = {f"join/{r}": json.dumps({"host": f"h{r // G}"}) for r in range(nodes * G)}
    keys.update({f"init/{r}": json.dumps({"ok": 1}) for r in range(nodes * G)})
    steps = pp.plan_steps(nodes, G, intra_p2p=False)
    for k in measured_steps:
        for s, d in steps[k].transfers:
            keys[f"res/{k}/{d}"] = json.dumps({"samples_Bps": [1e9, 2e9], "latency_s": 1e-5})
            keys[f"res/{k}/{s}"] = json.dumps({"sent": True})
        for g in steps[k].groups:
            keys[f"res/{k}/{g[0]}"] = json.dumps({"busbw_samples_Bps": [3e9]})
            keys.update({f"res/{k}/{r}": json.dumps({"done": 1}) for r in g[1:]})
    return keys


def test_store_lost_mid_run_lists_every_unmeasured_step_and_ends_in_one_line(
        tmp_path, ends, capsys):
    """The store (node 0's torchrun agent) dies while step 2 is awaited: the partial file
    keeps steps 0-1 and lists as missing everything else; one line; no exception escapes
    (telling the other ranks through the dead store must not raise)."""
    coord, steps = _coordinator(tmp_path, FakeStore(_joined(2, 2, (0, 1)), lose_at="res/2/"))
    assert [s.kind for s in steps] == ["all_reduce", "host", "host", "rail", "rail"]
    with pytest.raises(Ended):
        coord.run()
    assert ends == [1]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("probe: error: lost the coordination store at 10.0.0.1:29500: "
                          "Connection reset by peer more; partial topology written to "), err
    topo = load_topology(tmp_path / "t.json")
    assert [(l.src, l.dst) for l in topo.links] == [("h0", "h1")]     # step 1: host forward
    assert len(topo.collectives) == 2                                  # step 0: all-reduce
    # steps 2-4: host backward h1 -> h0, rails both ways
    assert [(m.src, m.dst) for m in topo.missing] == [("h1", "h0"), ("h0", "h1")]
    assert all(m.reason.startswith("not measured: probe stopped (lost the coordination store")
               for m in topo.missing)
    assert f"({len(topo.links)} links, {len(topo.missing)} missing)" in err


def test_failure_before_any_result_lists_everything(tmp_path, ends, capsys):
    coord, steps = _coordinator(tmp_path, FakeStore(_joined(2, 2), lose_at="res/0/"))
    with pytest.raises(Ended):
        coord.run()
    topo = load_topology(tmp_path / "t.json")
    assert topo.links == () and topo.collectives == ()
    assert [(m.src, m.dst) for m in topo.missing] == [("h0", "h0"), ("h1", "h1"), ("h0", "h1"),
                                                      ("h1", "h0")]


def test_stop_request_fails_with_its_reason_and_tells_the_ranks(tmp_path, ends, capsys):
    """A signal's reason (Coordinator.stop, from another thread) while step 1 is awaited."""
    store = FakeStore(_joined(2, 1, (0,)))
    coord, steps = _coordinator(tmp_path, store, G=1)
    check = store.check

    def check_then_stop(keys):
        if any(k.startswith("res/1/") for k in keys):
            coord.stop("stopped by SIGTERM on h0\nsecond line")
        return check(keys)

    store.check = check_then_stop
    with pytest.raises(Ended):
        coord.run()
    err = capsys.readouterr().err
    assert err.startswith("probe: error: stopped by SIGTERM on h0 second line; partial "), err
    assert err.count("\n") == 1
    assert store.keys["abort"] == err.strip()[len("probe: error: "):]
    topo = load_topology(tmp_path / "t.json")
    assert [(l.src, l.dst) for l in topo.links] == [("h0", "h1")]
    assert [(m.src, m.dst, m.reason) for m in topo.missing] == [
        ("h1", "h0", "not measured: probe stopped (stopped by SIGTERM on h0 second line)")]


def test_stop_key_from_another_rank(tmp_path, ends, capsys):
    keys = _joined(2, 1, (0,))
    keys["stop"] = "stopped by SIGINT on h1"
    coord, _ = _coordinator(tmp_path, FakeStore(keys), G=1)
    with pytest.raises(Ended):
        coord.run()
    assert capsys.readouterr().err.startswith("probe: error: stopped by SIGINT on h1; partial")


def test_unwritable_partial_file_is_still_one_line(tmp_path, ends, capsys):
    coord, _ = _coordinator(tmp_path, FakeStore(_joined(2, 1), lose_at="res/0/"), G=1)
    coord.args.out = str(tmp_path / "no such dir" / "t.json")
    with pytest.raises(Ended):
        coord.run()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "partial topology not written" in err, err


# -- torch missing --------------------------------------------------------------------------

NO_TORCH = "import sys; sys.modules['torch'] = None\n"   # `import torch` then fails


def _python(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    full.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=120)


def _one_error_line(res, prefix: str) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
    line = res.stderr.strip()
    assert line.startswith(prefix) and "torch" in line, line
    assert "pip install 'configurator[probe]'" in line and "pip install torch" in line, line
    return line


TORCHRUN_ENV = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")


def test_configurator_probe_under_torchrun_without_torch(tmp_path):
    code = NO_TORCH + textwrap.dedent("""
        from configurator.cli import main
        sys.exit(main(["probe", "--out", "t.json"]))
    """)
    line = _one_error_line(_python(code, tmp_path, **TORCHRUN_ENV), "configurator: error: ")
    assert "not installed" in line
    # the other local ranks stay quiet: one line per node
    res = _python(code, tmp_path, **{**TORCHRUN_ENV, "RANK": "1", "LOCAL_RANK": "1",
                                     "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    assert res.returncode == 2 and res.stderr == "", res.stderr


def test_python_m_topology_probe_without_torch(tmp_path):
    code = NO_TORCH + textwrap.dedent("""
        import runpy
        sys.argv = ["probe", "--out", "t.json"]
        runpy.run_module("topology.probe", run_name="__main__", alter_sys=True)
    """)
    _one_error_line(_python(code, tmp_path, **TORCHRUN_ENV), "probe: error: ")


def test_broken_torch_install_is_one_line_too(tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise OSError('libcudart.so.12: cannot open shared object file:\\nNo such file')\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(fake.parent)!r})
        from configurator.cli import main
        sys.exit(main(["probe", "--out", "t.json"]))
    """)
    line = _one_error_line(_python(code, tmp_path, **TORCHRUN_ENV), "configurator: error: ")
    assert "cannot be imported (OSError: libcudart.so.12" in line


def test_printing_the_command_never_imports_torch(tmp_path):
    code = textwrap.dedent("""
        import sys
        from configurator.cli import main
        rc = main(["probe", "--nnodes", "2", "--nproc-per-node", "8"])
        assert rc == 0, rc
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
    """)
    res = _python(code, tmp_path)
    assert res.returncode == 0, res.stderr
    res = _python(NO_TORCH + code.replace('assert "torch" not in sys.modules',
                                          'assert sys.modules["torch"] is None'), tmp_path)
    assert res.returncode == 0 and "torchrun --nnodes 2" in res.stdout, res.stderr


# -- one line -------------------------------------------------------------------------------

def test_probe_prints_only_through_say():
    """Every line the probe prints goes through probe_coord.say (which makes it one line)."""
    offenders = []
    for path in sorted((REPO / "topology").glob("probe*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    inside = [f.name for f in ast.walk(tree)
                              if isinstance(f, ast.FunctionDef) and
                              f.lineno <= node.lineno <= f.end_lineno]
                    if inside != ["say"]:
                        offenders.append(f"{path.name}:{node.lineno}")
                if isinstance(node, ast.Attribute) and node.attr == "write" and \
                        getattr(node.value, "attr", None) in ("stderr", "stdout"):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert sorted(set(offenders)) == [], offenders


def test_one_line_helpers(capsys):
    err = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed"
                       "\nby peer \x1b[31m[::1]:1234\u2028next\r\n")
    text = pc.one_line(err)
    assert text == "Connection closed by peer [31m[::1]:1234 next", text
    assert pc.one_line(RuntimeError("\n\n")) == "RuntimeError"
    pc.say("a\nb\x00c\u2029d")
    assert capsys.readouterr().err == "a b c d\n"
    assert "\n" not in pp.torch_needed(ImportError("x\ny"))
