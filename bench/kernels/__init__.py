"""Kernel benches (CUDA; ``--dry-run`` runs the code path on the CPU): kernels timed on the
local GPU against the analytic time model of :mod:`configurator.cost.compute`."""
