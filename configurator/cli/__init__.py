"""Command-line interface: ``configurator <command>`` (also ``python -m configurator``).

Parsing and printing only: :mod:`configurator.cli.commands` is the one table of commands;
each command turns its arguments into a request and calls one library function
(:mod:`configurator.app`), then prints what it returns. Only this layer prints.

Exit codes: 0 ok; 2 bad input (one line naming field, value and rule); 3 no feasible plan;
1 an internal error (a bug; one line, ``CONFIGURATOR_DEBUG=1`` shows the traceback).
May import every layer below it.
"""

from __future__ import annotations

import argparse
import os
import sys

from configurator.cli.commands import (COMMANDS, EXIT_BUG, EXIT_INFEASIBLE, EXIT_INPUT,
                                       EXIT_OK, Parser, add_commands)
from configurator.core.errors import InputError, NoFeasiblePlanError, echo
from configurator.core.version import TOOL_NAME, tool_version


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=TOOL_NAME,
                    description="Find the fastest Megatron-LM parallel configuration that fits "
                                "in memory, write its launch script, and audit cluster links.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {tool_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser,
                                metavar="COMMAND")
    add_commands(sub, COMMANDS)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Paths from argv may hold undecodable bytes (surrogates): print them escaped, not fail.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
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
    except (MemoryError, RecursionError) as err:
        print(f"configurator: error: input too large or too deeply nested "
              f"({type(err).__name__})", file=sys.stderr)
        return EXIT_INPUT
    except Exception as err:  # noqa: BLE001 - last resort: one line, never a traceback
        if os.environ.get("CONFIGURATOR_DEBUG"):
            raise
        print(f"configurator: internal error: {type(err).__name__}: {echo(err)} (a bug: "
              f"please report it with the command line; CONFIGURATOR_DEBUG=1 shows the "
              f"traceback)", file=sys.stderr)
        return EXIT_BUG


def entry() -> None:
    sys.exit(main())
