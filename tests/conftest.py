import os
import subprocess
import sys
from pathlib import Path

import pytest

from configurator.data import EXAMPLES, data_path

#: The real 17-node H100 nccl-tests logs that ship with the tool (with their LICENSE,
#: summary.csv and failures.txt; the logs in ``logs/``).
REAL_CLUSTER = data_path(EXAMPLES, "h100-17node-nccl-tests")


def run_cli(*args, cwd=None, timeout=120):
    """Run ``python -m configurator ARGS``; returns the CompletedProcess (text)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "configurator", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
