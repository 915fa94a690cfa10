"""Command-line interface: ``configurator <command>`` (also ``python -m configurator``).

Exit codes: 0 ok; 2 bad input (one line naming field, value and rule); 3 no feasible plan.
Only this layer reads files and prints; the core takes and returns dataclasses.
"""

from __future__ import annotations

import argparse
import sys

from configurator.errors import InputError, NoFeasiblePlanError

EXIT_OK, EXIT_INPUT, EXIT_INFEASIBLE = 0, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on usage errors already; keep its message to one line."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from configurator import commands

    parser = _Parser(prog="configurator",
                     description="Find the fastest Megatron-LM parallel configuration that fits "
                                 "in memory, write its launch script, and audit cluster links.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                metavar="COMMAND")
    for register in commands.REGISTRY:
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as err:
        print(f"configurator: error: {err}", file=sys.stderr)
        return EXIT_INPUT
    except NoFeasiblePlanError as err:
        print(f"configurator: no feasible plan: {err}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except KeyboardInterrupt:
        print("configurator: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


def entry() -> None:
    sys.exit(main())
