"""Command-line interface: ``configurator <command>`` (also ``python -m configurator``).

Parsing and printing only: :mod:`configurator.cli.commands` is the one table of commands;
each command turns its arguments into a request and calls one library function
(:mod:`configurator.app`), then prints what it returns. Only this layer prints.

Exit codes: 0 ok; 2 bad input (one line naming the flag or field, the value and the rule;
also a bare ``configurator``, which prints the usage and the commands); 3 no feasible plan;
1 an internal error (a bug; one line, ``CONFIGURATOR_DEBUG=1`` shows the traceback).
May import every layer below it.
"""

from __future__ import annotations

import argparse
import os
import sys

from configurator.cli.commands import (COMMANDS, EXIT_BUG, EXIT_INFEASIBLE, EXIT_INPUT,
                                       EXIT_OK, Parser, add_commands)
from configurator.core.allocator import tune_allocator
from configurator.core.errors import InputError, NoFeasiblePlanError, echo, one_line
from configurator.core.progress import set_quiet
from configurator.core.plan import PLAN_FIELDS
from configurator.core.version import TOOL_NAME, tool_version

#: What ``configurator --help`` (and a bare ``configurator``) opens with.
EXAMPLES = ("configurator search --model llama3-70b --cluster dgx-h100-80gb --nodes 16 "
            "--gbs 512 --out plan/",
            "configurator examples --out ex && configurator topology import "
            "ex/h100-17node-nccl-tests -o topo.json",
            "configurator validate")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=TOOL_NAME, examples=EXAMPLES,
                    description="Find the fastest Megatron-LM parallel configuration that fits "
                                "in memory, write its launch script, and audit cluster links.",
                    epilog="Run 'configurator COMMAND --help' for a command's examples and "
                           "options.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {tool_version()}")
    sub = parser.add_subparsers(dest="command", parser_class=Parser, metavar="COMMAND",
                                title="commands")
    add_commands(sub, COMMANDS)
    return parser


def flag_names(parser: argparse.ArgumentParser | None) -> dict[str, str]:
    """Field name -> the flag of ``parser`` that gives it: each option's destination
    (``nnodes`` -> ``--nnodes``; a positional argument's metavar, ``plan_a`` -> ``PLAN_A``)
    and the plan fields whose option has a short name (``global_batch_size`` -> ``--gbs``,
    ``micro_batch_size`` -> ``--mbs``)."""
    if parser is None:
        return {}
    names = {a.dest: max(a.option_strings, key=len) if a.option_strings else
             (a.metavar if isinstance(a.metavar, str) else a.dest.upper())
             for a in parser._actions if a.dest != "help"}
    for f in PLAN_FIELDS:
        if f.alias in names and f.name not in names:
            names[f.name] = names[f.alias]
    return names


def error_text(err: InputError, parser: argparse.ArgumentParser | None) -> str:
    """``err`` as one line, naming the command's flag where the field is one of its options
    (``--nodes=18: ...`` rather than ``nodes=18: ...``); a field of a file keeps its name
    (``model.num_query_group=2: ...``). Several fields (``nnodes, nproc_per_node``) are
    each named."""
    flags = flag_names(parser)
    parts = [p.strip() for p in str(err.field).split(",")]
    if not all(p in flags for p in parts):
        return str(err)
    named = ", ".join(flags[p] for p in parts)
    if err.value is None:
        return one_line(f"{named}: {err.rule}")
    return one_line(f"{named}={echo(err.value, repr_=True)}: {err.rule}")


def main(argv: list[str] | None = None) -> int:
    tune_allocator()   # arrays reuse freed heap instead of faulting in fresh pages
    # Paths from argv may hold undecodable bytes (surrogates): print them escaped, not fail.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:     # a bare ``configurator``
        parser.print_help()
        print("configurator: error: a COMMAND is required (the commands are listed above; "
              "configurator COMMAND --help for one)", file=sys.stderr)
        return EXIT_INPUT
    set_quiet(getattr(args, "quiet", False))
    try:
        return int(args.func(args) or 0)
    except InputError as err:
        print(f"configurator: error: {error_text(err, getattr(args, 'command_parser', None))}",
              file=sys.stderr)
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
