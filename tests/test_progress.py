"""Progress bars (``configurator.core.progress``): drawn on stderr only when it is a terminal,
never with ``--quiet``, never on stdout; one helper behind every long command."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from configurator.core import progress as pg

ROOT = Path(__file__).resolve().parents[1]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def terminal(monkeypatch):
    """A function putting a terminal in place of stderr (called in the test itself: pytest
    sets its own stderr between a fixture and the test)."""
    def use():
        err = _Terminal()
        monkeypatch.setattr(sys, "stderr", err)
        return err
    yield use
    pg.set_quiet(False)


def test_a_bar_is_drawn_on_a_terminal_only(terminal, monkeypatch):
    term = terminal()
    assert list(pg.progress(range(3), desc="pricing", unit="run")) == [0, 1, 2]
    assert "pricing" in term.getvalue() and "run" in term.getvalue()
    pipe = io.StringIO()                          # not a terminal: nothing
    monkeypatch.setattr(sys, "stderr", pipe)
    assert list(pg.progress(range(3), desc="pricing")) == [0, 1, 2]
    assert pipe.getvalue() == ""


def test_quiet_silences_every_bar(terminal):
    term = terminal()
    pg.set_quiet(True)
    assert list(pg.progress(range(3), desc="pricing")) == [0, 1, 2]
    with pg.Stages("plan", ("import", "search")) as stage:
        stage("import")
        stage("search")
    assert list(pg.progress(range(2), desc="forced", shown=True)) == [0, 1]
    assert term.getvalue() == ""


def test_stages_name_the_stage_running(terminal):
    term = terminal()
    with pg.Stages("plan", ("import", "search")) as stage:
        stage("import")
        stage("search")
        assert "search" in term.getvalue() and "1/2" in term.getvalue()


def _run_with_stderr_on_a_terminal(*args, tmp_path):
    """``python -m configurator ARGS`` with stderr on a pseudo-terminal and stdout on a
    pipe: (exit code, stdout, what reached the terminal)."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()       # a terminal 120 columns wide (tqdm sizes its bar)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    proc = subprocess.Popen([sys.executable, "-m", "configurator", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            cwd=tmp_path, env=env)
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read().decode()
    proc.wait(timeout=300)
    os.close(master)
    return proc.returncode, out, seen.decode(errors="replace")


@pytest.fixture(scope="module")
def few_runs(tmp_path_factory):
    """The first runs of the examples' run file (a run file validate prices in seconds)."""
    from configurator.app.examples import runs_file

    text, _ = runs_file()
    lines = text.decode().splitlines()
    path = tmp_path_factory.mktemp("runs") / "runs.csv"
    path.write_text("\n".join(lines[:2 + 6]) + "\n")      # comment, header, 6 runs
    return path


def test_validate_shows_progress_on_a_terminal_and_not_with_quiet(few_runs, tmp_path):
    code, out, term = _run_with_stderr_on_a_terminal("validate", few_runs, tmp_path=tmp_path)
    assert code == 0 and "validate" in term and "run" in term
    assert "\r" not in out and "validate:" not in out          # stdout stays clean
    code, quiet_out, term = _run_with_stderr_on_a_terminal("validate", few_runs, "--quiet",
                                                           tmp_path=tmp_path)
    assert code == 0 and term == "" and quiet_out == out


def test_no_progress_when_stderr_is_not_a_terminal(few_runs, tmp_path):
    res = subprocess.run([sys.executable, "-m", "configurator", "validate", str(few_runs)],
                         capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert res.returncode == 0 and res.stderr == ""


def test_every_long_command_uses_the_one_helper():
    """No module draws its own bar: tqdm is imported by the helper only."""
    hits = []
    for pkg in ("configurator", "topology", "launchers", "memory_model"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if path.name != "progress.py" and ("import tqdm" in text
                                               or "from tqdm" in text):
                hits.append(str(path.relative_to(ROOT)))
    assert hits == []


def test_calibrate_counts_the_runs_of_the_group_it_fits(terminal):
    from configurator.cli.validate_commands import _groups_progress

    term = terminal()
    items = [(("h100-80gb", "bf16"), (None, [1, 2, 3])), (("a100-80gb", "fp16"), (None, [4]))]
    assert list(_groups_progress(items)) == items
    text = term.getvalue()
    assert "0/4" in text and "h100-80gb bf16" in text and "3/4" in text
    assert "a100-80gb fp16" in text
