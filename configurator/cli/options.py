"""Options several commands share, spelt one way everywhere: the ``--help`` groups, the output
options (``-o/--out``, ``--force``, ``--json``) and the model and cluster options."""

from __future__ import annotations

import argparse

#: The option groups of ``--help``, in the order they are shown: what the job is for, the
#: plan's fields, precision, the search (or the fit, or the measurement), measured links,
#: and what is written.
GROUPS = ("model and cluster", "plan", "precision and kernels", "search", "fit",
          "measurement", "topology and placement", "output")


def integer(text: str) -> int:
    """argparse ``type`` of an integer option: ``128``, or scientific notation with an
    integral value (``2e3``, ``1.28e2``; :func:`configurator.core.validate.integer_text`)."""
    from configurator.core.validate import integer_text

    num = integer_text(text)
    if num is None:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer (128 or 1.28e2)")
    return num


def option_groups(p: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """One argument group of ``p`` per name of :data:`GROUPS`, in that order; ``--help``
    lists those that hold an option (argparse leaves an empty group out)."""
    return {name: p.add_argument_group(name) for name in GROUPS}


def add_out(group, help: str, *, metavar: str = "FILE", required: bool = False,
            default: str | None = None) -> None:
    """``-o/--out``: where a command writes (a file or a directory, as ``help`` says)."""
    group.add_argument("-o", "--out", metavar=metavar, required=required, default=default,
                       help=help)


def add_force(group, what: str = "existing output files") -> None:
    group.add_argument("--force", action="store_true",
                       help=f"overwrite {what} (never through a symbolic link)")


def add_json(group, what: str = "the result") -> None:
    group.add_argument("--json", action="store_true", help=f"print {what} as one JSON object")
