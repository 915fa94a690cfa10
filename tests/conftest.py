import os
import subprocess
import sys
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def shared_dir():
    if not SHARED.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED}")
    return SHARED


def run_cli(*args, cwd=None, timeout=120):
    """Run ``python -m configurator ARGS``; returns the CompletedProcess (text)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "configurator", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
