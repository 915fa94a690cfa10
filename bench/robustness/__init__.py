"""Robustness benches: every input format fuzzed through the real CLI
(:mod:`tests.support.fuzzing`), failures grouped, shrunk and saved as reproducers."""
