"""``configurator topology ...``: measured-topology files.

``configurator topology import PATH... -o topo.json [--merge min|median|pNN] [--force]
[--json] [-v]`` imports nccl-tests logs, ``nvidia-smi topo -m`` output and topology files
(files or directories), merges them and writes one topology file (JSON for ``.json``, else
YAML). It refuses to overwrite ``-o`` without ``--force`` (exit 2). Prints one summary line
(``--json``: a JSON object); ``-v`` lists the warnings on stderr.

Other modules add ``topology`` sub-commands with :func:`topology_command`, the same way
:func:`configurator.commands.command` adds top-level ones.
"""

from __future__ import annotations

import json
import os
import sys

from configurator.commands import command
from configurator.errors import InputError

TOPOLOGY_REGISTRY: list = []


def topology_command(fn):
    """Decorator adding ``register(subparsers)`` to the ``configurator topology`` group."""
    TOPOLOGY_REGISTRY.append(fn)
    return fn


@command
def register(sub):
    p = sub.add_parser("topology", help="import and inspect measured cluster topologies",
                       description="Measured topology files: import nccl-tests logs, "
                                   "nvidia-smi topo -m output and probe results.")
    tsub = p.add_subparsers(dest="topology_command", required=True, metavar="SUBCOMMAND",
                            parser_class=type(p))
    for reg in TOPOLOGY_REGISTRY:
        reg(tsub)


@topology_command
def register_import(tsub):
    p = tsub.add_parser(
        "import", help="import measurement files into one topology file",
        description="Import nccl-tests logs (sendrecv_perf pairs become per-direction links, "
                    "other tests collectives), 'nvidia-smi topo -m' output (nominal "
                    "intra-node links) and topology files; files or directories, format "
                    "detected per file. Duplicate links are merged with --merge.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="topology file to write (.json → JSON, else YAML)")
    p.add_argument("--merge", default="min", metavar="POLICY",
                   help="combine duplicate links: min (default), median or pNN percentile "
                        "(e.g. p10)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="list warnings on stderr")
    p.set_defaults(func=run_import)


def summary(topo, output: str | None = None) -> dict:
    """Counts describing ``topo`` (the ``--json`` summary)."""
    return {"output": output, "hosts": len(topo.hosts), "gpus_per_host": topo.gpus_per_host,
            "links": len(topo.links),
            "inter_node_links": sum(1 for l in topo.links if l.src != l.dst),
            "intra_node_links": sum(1 for l in topo.links if l.src == l.dst),
            "measured_pairs": len(topo.measured_pairs()),
            "collectives": len(topo.collectives), "missing": len(topo.missing),
            "unmeasured_pairs": [list(p) for p in topo.unmeasured_pairs()],
            "warnings": len(topo.warnings), "merge_policy": topo.merge_policy}


def run_import(args) -> int:
    from topology.importers import import_paths
    from topology.topofile import check_policy, save_topology

    check_policy(args.merge)
    if os.path.exists(args.output) and not args.force:
        raise InputError("output", args.output, "file exists; pass --force to overwrite")
    topo = import_paths(args.paths, policy=args.merge)
    save_topology(topo, args.output, force=args.force)
    s = summary(topo, args.output)
    if args.verbose:
        for w in topo.warnings:
            print(f"warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(f"wrote {args.output}: {s['hosts']} hosts, {s['links']} links "
              f"({s['measured_pairs']} host pairs), {s['collectives']} collectives, "
              f"{s['missing']} missing ({len(s['unmeasured_pairs'])} pairs unmeasured), "
              f"{s['warnings']} warnings" + ("" if args.verbose or not s["warnings"]
                                             else " (-v lists them)"))
    return 0
