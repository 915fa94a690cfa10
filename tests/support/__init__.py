"""Helpers shared by the tests and the benches (``python -m bench...`` from the repository
root imports them as ``tests.support``): :mod:`.fuzzing` (the CLI fuzzer) and
:mod:`.placement_cases` (heterogeneous measured clusters for placement)."""
