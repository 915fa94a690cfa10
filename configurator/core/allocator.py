"""The process's memory allocator set for array work: glibc malloc's mmap and trim thresholds.

A search allocates and frees thousands of numpy arrays of 0.1–30 MiB. glibc's malloc serves a
block above its mmap threshold (128 KiB at start, raised as such blocks are freed) with a
fresh mapping, and gives free heap above its trim threshold (twice the mmap threshold) back
to the system; the next array then faults its pages in again. Measured with
``getrusage(RUSAGE_SELF).ru_minflt`` around one ``search()`` of gpt3-175b on 1,024 A100
(``bench/speed/search_speed.py``): 28,400 minor page faults with glibc's defaults, 400 with
the thresholds below, and the search 0.21–0.22 s → 0.15–0.16 s (best of 5, four rounds on a
2-core machine); llama3.1-405b on 16,384 H100: 12,000 → 3,800 faults. Peak memory of the
16,384-host search is unchanged (244 → 246 MiB, ``bench/speed/measured_topology.py``).

The command line sets them when it starts (:func:`configurator.cli.main`); the library's own
functions do not touch the process they run in.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: glibc's ``mallopt`` parameter numbers (``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks smaller than this come from the heap, not a fresh mapping (glibc's ceiling for
#: this threshold on 64-bit systems).
MMAP_THRESHOLD_BYTES = 32 << 20
#: Free heap up to this size is kept for the next arrays instead of returned to the system.
TRIM_THRESHOLD_BYTES = 128 << 20
#: glibc's own variables for the same thresholds: where the user set one, theirs holds.
GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_allocator() -> bool:
    """Set glibc malloc's mmap threshold to :data:`MMAP_THRESHOLD_BYTES` and its trim
    threshold to :data:`TRIM_THRESHOLD_BYTES` for the rest of the process (glibc then stops
    adjusting them itself). Returns True when both were set; False, changing nothing, off
    Linux, where the C library has no ``mallopt`` or refuses the values (not glibc), or where
    one of :data:`GLIBC_VARIABLES` is set in the environment."""
    if not sys.platform.startswith("linux") or any(v in os.environ for v in GLIBC_VARIABLES):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
