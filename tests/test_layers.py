"""The layer contracts (``.importlinter``) hold, and no module imports itself in a cycle."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("configurator", "topology", "memory_model", "launchers")


def test_import_linter_contracts_kept():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(exe).exists():
        if os.environ.get("CI"):
            pytest.fail("lint-imports not found: CI installs import-linter with '.[test]'")
        pytest.skip("import-linter not installed (pip install -e '.[test]')")
    res = subprocess.run([exe, "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 kept, 0 broken" in res.stdout, res.stdout


def _module_graph() -> nx.DiGraph:
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    g = nx.DiGraph()
    for mod in graph.modules:
        g.add_node(mod)
        for dep in graph.find_modules_directly_imported_by(mod):
            g.add_edge(mod, dep)
    return g


def test_no_import_cycle_between_any_modules():
    """Stricter than import-linter's sibling check: also a package and its own modules
    (lazy imports inside functions count)."""
    cycles = list(nx.simple_cycles(_module_graph()))
    assert cycles == [], f"import cycles: {cycles[:5]}"


def test_core_imports_nothing_above_it():
    g = _module_graph()
    for mod in g:
        if mod.startswith("configurator.core"):
            bad = [d for d in g.successors(mod) if not d.startswith("configurator.core")]
            assert bad == [], f"{mod} imports {bad}"


def test_only_the_cli_prints():
    """``print(`` appears in the CLI layer only (and in the probe, a torchrun program)."""
    offenders = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(("configurator/cli/", "topology/probe")):
                continue
            if "print(" in path.read_text(encoding="utf-8"):
                offenders.append(rel)
    assert offenders == []


def test_commands_share_public_steps_only():
    """The steps the app package's docstring lists exist, are public and documented; and no
    module of the app or the CLI imports another module's private name (``plan`` composes
    the other commands through the same public functions they use)."""
    import ast
    import importlib
    import re

    import configurator.app as app

    listed = re.findall(r":func:`~(configurator\.app\.[a-z_]+)\.([a-z_]+)`", app.__doc__)
    assert len(listed) >= 20
    for mod, name in listed:
        fn = getattr(importlib.import_module(mod), name)
        assert callable(fn) and not name.startswith("_") and fn.__doc__, f"{mod}.{name}"
    private = []
    for pkg in ("app", "cli"):
        for path in sorted((ROOT / "configurator" / pkg).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.ImportFrom) and node.module
                        and node.module.startswith("configurator.")):
                    private += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                                if a.name.startswith("_")]
    assert not private, private
