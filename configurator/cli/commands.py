"""The one table of ``configurator`` commands: name, help, arguments, and the function that
runs it (which calls one library function in :mod:`configurator.app`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from configurator.cli import (audit_command, plan_commands, probe_command, profile_command,
                              topology_commands, validate_commands)
from configurator.core.errors import one_line
from configurator.core.limits import describe_ranges

EXIT_OK, EXIT_BUG, EXIT_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3
#: What ``search``, ``estimate`` and ``launch`` accept (configurator/core/limits.py).
RANGES_EPILOG = ("Accepted integer ranges (inclusive): " + describe_ranges()
                 + "; at most 262,144 GPUs in all. Exit codes: 0 ok, 2 bad input, 3 no plan "
                   "fits.")


class Parser(argparse.ArgumentParser):
    """argparse exits with 2 on usage errors already; keep its message to one line. Options
    are matched whole, never by a prefix: ``search --tp 8`` is an unknown option there, not
    ``--tp-comm-overlap``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(EXIT_INPUT, f"{self.prog}: error: {one_line(message)}\n")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    description: str
    add_arguments: Callable
    run: Callable | None      # None: a group whose sub-commands run
    epilog: str | None = None


def add_commands(sub, table) -> None:
    """Add every :class:`Command` of ``table`` to the sub-parsers ``sub``."""
    for cmd in table:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description,
                           epilog=cmd.epilog)
        cmd.add_arguments(p)
        if cmd.run is not None:
            p.set_defaults(func=cmd.run)


def _topology_group(p) -> None:
    sub = p.add_subparsers(dest="topology_command", required=True, metavar="SUBCOMMAND",
                           parser_class=type(p))
    add_commands(sub, TOPOLOGY_COMMANDS)


#: ``configurator topology <sub-command>``.
TOPOLOGY_COMMANDS: tuple[Command, ...] = (
    Command("import", "import measurement files into one topology file",
            "Import nccl-tests logs (sendrecv_perf pairs become per-direction links, other "
            "tests collectives), 'nvidia-smi topo -m' output (nominal intra-node links) and "
            "topology files; files or directories, format detected per file. Duplicate links "
            "are merged with --merge.",
            topology_commands.add_import_arguments, topology_commands.run_import),
)

COMMANDS: tuple[Command, ...] = (
    Command("search", "rank every legal plan that fits in memory",
            "Enumerate every plan Megatron-LM accepts (tp, pp, dp, cp, vp, ep, etp, layer "
            "split, micro batch size, recompute, sequence parallel, distributed optimizer), "
            "drop those that do not fit, rank the rest by predicted iteration time.",
            plan_commands.add_search_arguments, plan_commands.run_search, RANGES_EPILOG),
    Command("estimate", "predict memory and iteration time of one plan",
            "Predict per-stage memory and iteration time of one plan (dp is derived from the "
            "GPU count). Estimates also plans that do not fit (then fits is false).",
            plan_commands.add_estimate_arguments, plan_commands.run_estimate, RANGES_EPILOG),
    Command("launch", "write launch scripts from a saved plan JSON",
            "Write the torchrun and SLURM launch scripts of a plan saved by "
            "'configurator search --out' (plan.json).",
            plan_commands.add_launch_arguments, plan_commands.run_launch, RANGES_EPILOG),
    Command("explain", "show where two saved plans differ in time and memory",
            "Compare two plan.json files (search --out): iteration time and each term of its "
            "breakdown (compute, recompute, bubble, tp/cp/pp/dp communication, optimizer, "
            "schedule and placement), throughput, and memory per pipeline stage, with B - A.",
            plan_commands.add_explain_arguments, plan_commands.run_explain),
    Command("validate", "compare predicted with measured iteration times of real runs",
            "Price measured runs (run files or Megatron-LM logs; default: the published runs "
            "of the shared ground truth) as 'estimate' would and report, per group, the mean "
            "absolute percentage error, the worst run and Spearman's rank correlation; "
            "--html writes a report with a predicted-vs-measured scatter plot.",
            validate_commands.add_validate_arguments, validate_commands.run_validate),
    Command("calibrate", "fit a GPU's efficiencies to measured runs",
            "Fit, per GPU type and precision, the GEMM and fused-attention efficiencies and "
            "the host time per operation to measured runs by least squares; report the "
            "error before and after and the leave-one-out error; refuse parameters the runs "
            "do not determine. Use the file with search/estimate/validate --calibration.",
            validate_commands.add_calibrate_arguments, validate_commands.run_calibrate),
    Command("profile", "time one transformer layer with torch (CUDA or CPU)",
            "Time one transformer layer's forward and backward with torch on the local device "
            "(CUDA when present, else the CPU) at the per-rank shapes of each --tp/--cp/--mbs, "
            "write the profile (estimate/search --profile use it instead of the analytic "
            "layer compute) and, on a GPU, compare it with the analytic layer time.",
            profile_command.add_profile_arguments, profile_command.run_profile),
    Command("topology", "import and inspect measured cluster topologies",
            "Measured topology files: import nccl-tests logs, nvidia-smi topo -m output and "
            "probe results.",
            _topology_group, None),
    Command("probe", "print the torchrun command that measures links (or run it under "
            "torchrun)",
            "Print the torchrun command that runs the bandwidth probe on every node "
            "(node_rank from $NODE_RANK, or $SLURM_NODEID with --slurm). Started by torchrun "
            "itself (torchrun ... --no-python configurator probe --out FILE) it runs the "
            "probe, python -m topology.probe.",
            probe_command.add_probe_arguments, probe_command.run_probe),
    Command("audit", "audit measured cluster links (slow links, slow nodes, missing pairs)",
            "Audit a measured topology: per link class (intra/inter-node, method, GPUs per "
            "host) a robust baseline (median, scaled MAD); flag slow links (< 80 %% of the "
            "median and robust z < -4), asymmetric pairs (> 20 %% apart), hosts slow with "
            "half or more of their partners, and host pairs never measured. Exit 0 with a "
            "report even when problems are found.",
            audit_command.add_audit_arguments, audit_command.run_audit),
)
