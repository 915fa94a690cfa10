"""Benchmarks, run from the repository root as ``python -m bench.<group>.<name>`` (each takes
``--help``; bench/README.md lists them with their last figures): :mod:`.accuracy`
(predictions against published runs and choices), :mod:`.kernels` (CUDA kernels against the
analytic time model), :mod:`.speed` (search, CLI and simulator wall time),
:mod:`.placement` (the placement optimiser against exhaustive search and a baseline),
:mod:`.robustness` (the CLI fuzzer); :mod:`.common` holds what they share."""
