"""Registry of CLI sub-commands. Each entry is ``register(subparsers)``; the registered
sub-parser sets ``func(args) -> exit code`` via ``set_defaults``."""

from __future__ import annotations

REGISTRY: list = []


def command(fn):
    """Decorator adding a ``register(subparsers)`` function to :data:`REGISTRY`."""
    REGISTRY.append(fn)
    return fn


# Modules that register commands on import.
from configurator import cli_plan  # noqa: E402,F401
from topology import cli_audit  # noqa: E402,F401
from topology import cli_topology  # noqa: E402,F401
from topology import cli_probe  # noqa: E402,F401
