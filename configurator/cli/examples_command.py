"""``configurator examples``: list the example inputs that ship with the tool, or copy them
into a directory (``--out``) to try every command on them."""

from __future__ import annotations

import shlex

from configurator.app.examples import EXAMPLE_FILES, write_examples
from configurator.cli.options import add_force, add_json, add_out, option_groups
from configurator.core import jsonout


def add_examples_arguments(p) -> None:
    g = option_groups(p)["output"]
    add_out(g, "copy the examples into this directory (created if needed); refused if one "
               "of them exists there without --force", metavar="DIR")
    add_force(g, "examples already in --out")
    add_json(g, "the list")


def run_examples(args) -> int:
    written = write_examples(args.out, args.force) if args.out else []
    if args.json:
        print(jsonout.dumps({"out": args.out, "written": written,
                             "examples": [e.__dict__ for e in EXAMPLE_FILES]}, indent=2))
        return 0
    width = max(len(e.name) for e in EXAMPLE_FILES)
    print("Examples that ship with configurator:" if not args.out
          else f"wrote {len(written)} examples into {args.out}/:")
    for e in EXAMPLE_FILES:
        print(f"  {e.name:<{width}}  {e.what}")
    if not args.out:
        print("copy them with: configurator examples --out DIR")
        return 0
    print(f"try them (in {shlex.quote(args.out)}/):")
    for e in EXAMPLE_FILES:
        print(f"  {e.try_it}")
    return 0
