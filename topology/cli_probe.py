"""``configurator probe``: the torchrun command line that runs the bandwidth probe.

Outside torchrun it prints the command to run on every node (node_rank from ``$NODE_RANK``,
or from ``$SLURM_NODEID`` inside ``srun bash -c '...'`` with ``--slurm``, so that it expands
on each node). Started by torchrun itself (``torchrun ... --no-python configurator probe
--out ...``: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` set) it runs the probe,
:mod:`topology.probe` (torch is imported only then).
"""

from __future__ import annotations

import math
import os
import shlex

from configurator import validate as v
from configurator.commands import command
from configurator.errors import InputError
from topology.probe_plan import add_probe_options, check_probe_options

UNDER_TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@command
def register(sub) -> None:
    p = sub.add_parser(
        "probe", help="print the torchrun command that measures links (or run it under torchrun)",
        description="Print the torchrun command that runs the bandwidth probe on every node "
                    "(node_rank from $NODE_RANK, or $SLURM_NODEID with --slurm). Started by "
                    "torchrun itself (torchrun ... --no-python configurator probe --out FILE) "
                    "it runs the probe, python -m topology.probe.")
    p.add_argument("--nnodes", type=int, help="number of nodes (required to print)")
    p.add_argument("--nproc-per-node", type=int, help="GPUs (ranks) per node (required to print)")
    p.add_argument("--master-addr", default="$MASTER_ADDR", help="host of node_rank 0")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--slurm", action="store_true",
                   help="wrap in srun, node_rank from $SLURM_NODEID")
    add_probe_options(p.add_argument_group(
        "probe options (passed to python -m topology.probe)"), out_required=False)
    p.set_defaults(func=run_probe)


def probe_argv(args) -> list[str]:
    """The arguments of ``python -m topology.probe`` for the parsed ``args``."""
    out = ["--out", args.out, "--size-mb", f"{args.size_mb:g}", "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--timeout-s", f"{args.timeout_s:g}",
           "--backend", args.backend]
    if args.expected_hosts:
        out += ["--expected-hosts", args.expected_hosts]
    return out + (["--force"] if args.force else [])


def torchrun_command(args) -> str:
    """The shell command for every node. torchrun's static rendezvous waits ``timeout_s`` for
    all nodes (``--rdzv-conf timeout``) before any probe process starts."""
    for field in ("nnodes", "nproc_per_node"):
        if getattr(args, field) is None:
            raise InputError(field, None, "required to print the torchrun command")
        v.positive_int(field, getattr(args, field))
    v.positive_int("master_port", args.master_port)
    check_probe_options(args)
    rank = "$SLURM_NODEID" if args.slurm else "$NODE_RANK"
    addr = args.master_addr if args.master_addr.startswith("$") else shlex.quote(args.master_addr)
    words = ["torchrun", "--nnodes", str(args.nnodes), "--nproc-per-node",
             str(args.nproc_per_node), "--node-rank", rank, "--master-addr", addr,
             "--master-port", str(args.master_port), "--rdzv-conf",
             f"timeout={math.ceil(args.timeout_s)}", "-m", "topology.probe"]
    words += [shlex.quote(w) for w in probe_argv(args)]
    line = " ".join(words)
    if args.slurm:  # quoted: $SLURM_NODEID expands on each node, not where srun runs
        return f"srun --ntasks-per-node 1 bash -c {shlex.quote(line)}"
    return line


def run_probe(args) -> int:
    if all(k in os.environ for k in UNDER_TORCHRUN):
        from topology import probe

        return probe.main(probe_argv(args))
    line = torchrun_command(args)
    if not args.slurm:
        print(f"# on every node, NODE_RANK = 0..{args.nnodes - 1} "
              f"(node_rank 0 at {args.master_addr}):")
    print(line)
    return 0
