"""The tool as a user installs it: a wheel built from this checkout, installed into a fresh
virtual environment and run from a directory outside the checkout; then every shell block of
the README and of the measuring guide (docs/measure.md), in order, in one temporary directory
each, with that installation's ``configurator``.

The fresh environment reuses this one's third-party packages (numpy, networkx, ...) through a
``.pth`` line, so only the wheel is installed; this checkout's editable install is not seen
there (a directory named in a ``.pth`` file is added to ``sys.path`` without running its own
``.pth`` files). Building the wheel needs setuptools from the package index (build
isolation), falling back to this environment's setuptools.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MEASURE_GUIDE = ROOT / "docs" / "measure.md"
#: A block preceded by ``<!-- readme-test: skip (why) -->`` (``doc-test`` in docs/) is not
#: run; one preceded by ``<!-- readme-test: output of command 1 -->`` is README command 1's
#: printed output.
MARKER = re.compile(r"<!-- (?:readme|doc)-test: (?P<what>[^>]*?) -->\s*$")
BLOCK = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S | re.M)


def readme_blocks(path: Path = README) -> list[tuple[str, str, str]]:
    """``(language, body, marker)`` of every fenced block of the README (or the Markdown
    file ``path``), in order."""
    text = path.read_text(encoding="utf-8")
    out = []
    for m in BLOCK.finditer(text):
        before = text[:m.start()].rstrip("\n").splitlines()
        mark = MARKER.search(before[-1]) if before else None
        out.append((m.group("lang"), m.group("body"), mark.group("what") if mark else ""))
    return out


def _run(argv, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop("timeout", 600),
                         **kw)
    assert res.returncode == 0, f"{argv}: {res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    return res


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(bin directory, environment)`` of a fresh venv holding only the wheel of this
    checkout (plus a path to this environment's third-party packages)."""
    tmp = tmp_path_factory.mktemp("installed")
    wheels = tmp / "wheels"
    # build from a copy: building in place would leave build/ and *.egg-info in the checkout
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".ci-venv", "venv", ".venv", "build", "dist", "*.egg-info", "__pycache__",
        ".pytest_cache", ".hypothesis", "out", "fuzz-failures"))
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels),
             str(src)]
    res = subprocess.run(build, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:      # no package index: this environment's setuptools
        _run(build + ["--no-build-isolation"])
    wheel = next(wheels.glob("configurator-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / "python"
    site = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                ).stdout.strip()
    Path(site, "borrowed-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)])
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    return bindir, env


def test_the_wheel_runs_from_outside_the_checkout(installed, tmp_path):
    bindir, env = installed
    where = _run([str(bindir / "python"), "-c", "import configurator, configurator.data as d; "
                  "print(configurator.__file__); print(d.data_path())"], cwd=tmp_path,
                 env=env).stdout.split()
    assert all(str(ROOT) not in w and str(bindir.parent) in w for w in where), where
    cli = str(bindir / "configurator")
    # the published runs ship in the wheel: validate and calibrate need no file
    out = _run([cli, "validate"], cwd=tmp_path, env=env).stdout
    here = _run([sys.executable, "-m", "configurator", "validate"], cwd=ROOT).stdout
    every = re.compile(r"^all\s+\d+\s.*$", re.M)       # the same runs as from the checkout
    assert every.search(out) and every.search(out).group() == every.search(here).group(), out
    _run([cli, "calibrate", "-o", "c.yaml"], cwd=tmp_path, env=env)
    assert "gpus:" in (tmp_path / "c.yaml").read_text()
    # the shipped logs: examples -> import -> audit
    _run([cli, "examples", "--out", "ex"], cwd=tmp_path, env=env)
    assert (tmp_path / "ex" / "h100-17node-nccl-tests" / "LICENSE").is_file()
    _run([cli, "topology", "import", "ex/h100-17node-nccl-tests", "-o", "topo.json"],
         cwd=tmp_path, env=env)
    audit = _run([cli, "audit", "--topology", "topo.json"], cwd=tmp_path, env=env).stdout
    assert "Leave out (drain) or repair the NIC of: cnode2-003." in audit


def _run_shell_blocks(path: Path, env: dict, cwd: Path) -> int:
    """Run the ``bash`` blocks of ``path`` not marked ``skip``, in order, in ``cwd``, each
    with ``bash -e -o pipefail``; returns how many ran. A skipped block must say why."""
    ran = 0
    for lang, body, mark in readme_blocks(path):
        if lang != "bash":
            continue
        if mark.startswith("skip"):
            assert re.match(r"skip \(.+\)$", mark), f"a skipped block says why: {mark!r}"
            continue
        res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=cwd,
                             env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, (f"{path.name} block failed:\n{body}\n{res.stdout}\n"
                                     f"{res.stderr}")
        ran += 1
    return ran


def test_every_readme_shell_block_runs(installed, tmp_path):
    """The README's shell blocks, in order, in one directory, as a user pastes them: each
    with ``bash -e -o pipefail``; those marked ``skip`` say why (the two README commands,
    which .ci/run runs, and what needs GPUs)."""
    _, env = installed
    assert _run_shell_blocks(README, env, tmp_path) >= 6


def test_every_measure_guide_command_runs(installed, tmp_path):
    """docs/measure.md's shell blocks that need no GPU, cluster or network, in order, in one
    directory, from the installed wheel (the examples, the worked path measure -> audit ->
    plan -> launch files, validate on the shipped training log, the SLURM script's syntax);
    those marked ``skip`` say why. The guide is linked from the README."""
    _, env = installed
    assert "docs/measure.md" in README.read_text(encoding="utf-8")
    assert _run_shell_blocks(MEASURE_GUIDE, env, tmp_path) >= 7
    assert (tmp_path / "job" / "bridge_overrides.yaml").is_file()
    assert (tmp_path / "measure_pairs.sbatch").is_file()


def test_readme_shows_command_1_as_it_prints(tmp_path):
    """The README's output of command 1 is what command 1 prints (the search's own time
    aside)."""
    blocks = readme_blocks()
    command = next(b for lang, b, mark in blocks if "command 1" in mark and lang == "bash")
    shown = next(b for lang, b, mark in blocks if mark == "output of command 1")
    argv = command.split("&&", 1)[1].split()
    assert argv[0] == "configurator"
    res = _run([sys.executable, "-m", "configurator", *argv[1:]], cwd=tmp_path)
    def strip(text):
        return re.sub(r"\d+\.\d+ s$", "T s", text.strip(), count=1, flags=re.M)
    assert strip(res.stdout) == strip(shown)


def test_readme_is_a_guide_and_the_reference_is_in_docs():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 260
    for doc in ("cli.md", "formats.md", "model.md", "accuracy.md"):
        assert (ROOT / "docs" / doc).is_file() and f"docs/{doc}" in text
    # the two README commands are what .ci/run runs
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [b.strip() for lang, b, mark in readme_blocks() if "README command" in mark]
    assert len(commands) == 2 and all(c in ci for c in commands)


def test_nothing_refers_outside_the_project():
    """No code, doc, bench or test names a folder beside the checkout."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    res = subprocess.run([git, "grep", "-n", "-I", "-F", "-e", "../" + "shared", "--", "."],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.stdout == "", res.stdout
