"""The command line's malloc thresholds (configurator.core.allocator): arrays freed and
allocated again reuse the heap instead of faulting in fresh pages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from configurator.core.allocator import GLIBC_VARIABLES

#: Rounds of six 8 MiB arrays allocated, written and freed; prints whether the thresholds
#: were set and the minor page faults of the rounds after the first two.
_CHILD = """
import json, resource, sys
import numpy as np
from configurator.core.allocator import tune_allocator
tuned = tune_allocator() if sys.argv[1] == "tune" else False
def one_round():
    arrays = [np.ones(1 << 20) for _ in range(6)]
    del arrays
for _ in range(2):
    one_round()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    one_round()
print(json.dumps([tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0]))
"""


def _faults(mode: str, env=None) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True,
                         check=True, env=env).stdout
    tuned, faults = json.loads(out)
    return tuned, faults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_allocator_reuses_freed_arrays_instead_of_faulting_pages_in():
    clean = {k: v for k, v in os.environ.items() if k not in GLIBC_VARIABLES}
    tuned, with_tuning = _faults("tune", clean)
    if not tuned:
        pytest.skip("the C library refuses glibc's mallopt thresholds (not glibc)")
    _, default = _faults("default", clean)
    # glibc's defaults give much of the 48 MiB back after a round and fault it in again
    # (about 24,000 faults of 8 x 6 x 2,048 pages on 4 KiB pages)
    if default < 1_000:
        pytest.skip(f"glibc's defaults fault only {default} pages here (huge pages?)")
    assert with_tuning < default / 10


def test_the_users_own_glibc_setting_holds():
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="1048576")
    assert _faults("tune", env)[0] is False
