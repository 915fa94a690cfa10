"""The command-line reference (``docs/cli.md``), made from the parsers themselves so it says
exactly what ``--help`` says: ``python -m configurator.cli.reference > docs/cli.md`` writes
it, and a test checks the file is current."""

from __future__ import annotations

import os
from contextlib import contextmanager

#: Help is rendered at this width, whatever the terminal.
WIDTH = 100

INTRO = """# Command-line reference

Every command's `--help`, as `configurator` prints it (at {width} columns). Each command opens
with examples; options are grouped (model and cluster, plan, precision and kernels, search,
topology and placement, output). Errors are one line naming the flag or field, the value and
the rule, with exit code 2 (3: no plan fits). The file formats the options read are in
[formats.md](formats.md).

Made by `python -m configurator.cli.reference > docs/cli.md`.
"""


@contextmanager
def _columns(width: int):
    """argparse sizes its help to ``$COLUMNS``: fix it while rendering."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _subparsers(parser):
    """``(name, parser)`` of each sub-command of ``parser``, in the table's order."""
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            return list(action.choices.items())
    return []


def reference() -> str:
    """The markdown of ``docs/cli.md``: the tool's help, then every command's (and every
    sub-command's) in the order of :data:`configurator.cli.commands.COMMANDS`."""
    from configurator.cli import build_parser

    with _columns(WIDTH):
        parser = build_parser()
        parts = [INTRO.format(width=WIDTH), "## configurator\n", "```text",
                 parser.format_help().rstrip(), "```", ""]
        stack = [(f"configurator {name}", sub) for name, sub in _subparsers(parser)]
        while stack:
            title, sub = stack.pop(0)
            parts += [f"## {title}\n", "```text", sub.format_help().rstrip(), "```", ""]
            stack[:0] = [(f"{title} {name}", s) for name, s in _subparsers(sub)]
    return "\n".join(parts + limits())


def limits() -> list[str]:
    """The ``Limits on input`` section: every documented range
    (:data:`configurator.core.limits.INT_RANGES` and ``FLOAT_RANGES``), one row each."""
    from configurator.core.limits import FLOAT_RANGES, INT_RANGES, MAX_FILE_BYTES

    rows = [f"| `{k}` | {lo:,}..{hi:,} |" for k, (lo, hi) in INT_RANGES.items()]
    rows += [f"| `{k}` | {lo:g}..{hi:g} |" for k, (lo, hi) in FLOAT_RANGES.items()]
    return ["## Limits on input\n",
            "Every integer and figure an option or a file gives is checked against its range "
            "(`configurator/core/limits.py`); a value outside it is refused with the range. "
            f"Input files are at most {MAX_FILE_BYTES >> 20} MiB.\n",
            "| input | accepted range |", "|---|---|", *rows, ""]


if __name__ == "__main__":
    print(reference(), end="")
