"""``configurator probe``: the torchrun command line that runs the bandwidth probe.

Outside torchrun it prints the command to run on every node (node_rank from ``$NODE_RANK``,
or from ``$SLURM_NODEID`` inside ``srun bash -c '...'`` with ``--slurm``, so that it expands
on each node). Started by torchrun itself (``torchrun ... --no-python configurator probe
--out ...``: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` set) it runs the probe,
:mod:`topology.probe` (torch is imported only then; without torch: one line saying how to
install it, exit 2, from local rank 0 only).
"""

from __future__ import annotations

import os
import sys

from configurator.cli.options import integer
from configurator.core.errors import one_line
from topology.probe_plan import (TorchMissing, add_probe_options, probe_argv, shell_word,
                                 torchrun_command)

UNDER_TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
EXIT_INPUT = 2


def add_probe_arguments(p) -> None:
    g = p.add_argument_group("torchrun")
    g.add_argument("--nnodes", type=integer, help="number of nodes (required to print)")
    g.add_argument("--nproc-per-node", type=integer,
                   help="GPUs (ranks) per node (required to print)")
    g.add_argument("--master-addr", default="$MASTER_ADDR",
                   help="host of node_rank 0 (default: $MASTER_ADDR on each node)")
    g.add_argument("--master-port", type=integer, default=29500, help="(default 29500)")
    g.add_argument("--slurm", action="store_true",
                   help="wrap in srun, node_rank from $SLURM_NODEID")
    add_probe_options(p.add_argument_group(
        "probe options (passed to python -m topology.probe)"), out_required=False)


def run_probe(args) -> int:
    if all(k in os.environ for k in UNDER_TORCHRUN):
        try:
            from topology import probe
        except TorchMissing as err:
            if os.environ.get("LOCAL_RANK", "0") == "0":
                print(f"configurator: error: {one_line(str(err))}", file=sys.stderr)
            return EXIT_INPUT
        return probe.main(probe_argv(args))
    line = torchrun_command(args)
    if not args.slurm:
        print(f"# on every node, NODE_RANK = 0..{args.nnodes - 1} "
              f"(node_rank 0 at {one_line(shell_word(args.master_addr))}):")
    print(line)
    return 0
