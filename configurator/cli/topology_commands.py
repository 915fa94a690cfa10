"""``configurator topology ...``: measured-topology files.

``configurator topology import PATH... -o/--out topo.json [--merge min|median|pNN]
[--force] [--json] [-v]`` imports nccl-tests logs, ``nvidia-smi topo -m`` output and topology files
(files or directories), merges them and writes one topology file (JSON for ``.json``, else
YAML). It refuses to overwrite ``-o`` without ``--force`` (exit 2). Prints one summary line
(``--json``: a JSON object); ``-v`` lists the warnings on stderr.

Sub-commands are listed in :data:`configurator.cli.commands.TOPOLOGY_COMMANDS`.
"""

from __future__ import annotations

import sys

from configurator.app.topology_jobs import import_topology
from configurator.cli.options import add_force, add_json, add_out, option_groups
from configurator.core import jsonout


def add_import_arguments(p) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    groups = option_groups(p)
    groups["topology and placement"].add_argument(
        "--merge", default="min", metavar="POLICY",
        help="combine duplicate links: min (default), median or pNN percentile (e.g. p10)")
    g = groups["output"]
    add_out(g, "topology file to write (.json → JSON, else YAML)", required=True)
    add_force(g, "an existing --out file")
    add_json(g, "the summary")
    g.add_argument("-v", "--verbose", action="store_true", help="list warnings on stderr")


def run_import(args) -> int:
    topo, s = import_topology(args.paths, args.out, policy=args.merge, force=args.force)
    if args.verbose:
        for w in topo.warnings:
            print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(jsonout.dumps(s, indent=2))
    else:
        print(f"wrote {args.out}: {s['hosts']} hosts, {s['links']} links "
              f"({s['measured_pairs']} host pairs), {s['collectives']} collectives, "
              f"{s['missing']} missing ({len(s['unmeasured_pairs'])} pairs unmeasured), "
              f"{s['warnings']} warnings" + ("" if args.verbose or not s["warnings"]
                                             else " (-v lists them)"))
    return 0
