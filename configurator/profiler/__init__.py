"""The layer profiler: one decoder layer re-implemented in plain torch ops and timed on the
local device (:mod:`~configurator.profiler.layer`), and the timing it shares with the kernel
benchmarks under ``bench/`` (:mod:`~configurator.profiler.timing`). ``configurator profile``
(:mod:`configurator.app.profile_jobs`) runs it and writes the times as a layer profile
(:mod:`configurator.core.profile`).

torch is imported only inside functions, never on the tool's import path. May import
``configurator.core``, ``memory_model`` and ``topology``.
"""
