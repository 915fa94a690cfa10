"""Options several commands share, spelt one way everywhere: the ``--help`` groups, the output
options (``-o/--out``, ``--force``, ``--json``) and the model and cluster options."""

from __future__ import annotations

import argparse

#: The option groups of ``--help``, in the order they are shown: what the job is for, the
#: plan's fields, precision, the search (or the fit, or the measurement), measured links,
#: and what is written.
GROUPS = ("model and cluster", "plan", "precision and kernels", "search", "time to train",
          "fit", "measurement", "topology and placement", "output")


def integer(text: str) -> int:
    """argparse ``type`` of an integer option: ``128``, or scientific notation with an
    integral value (``2e3``, ``1.28e2``; :func:`configurator.core.validate.integer_text`)."""
    from configurator.core.validate import integer_text

    num = integer_text(text)
    if num is None:
        raise argparse.ArgumentTypeError(f"{text!r}: must be an integer (128 or 1.28e2)")
    return num


def option_groups(p: argparse.ArgumentParser) -> dict[str, argparse._ArgumentGroup]:
    """One argument group of ``p`` per name of :data:`GROUPS`, in that order; ``--help``
    lists those that hold an option (argparse leaves an empty group out)."""
    return {name: p.add_argument_group(name) for name in GROUPS}


def add_out(group, help: str, *, metavar: str = "FILE", required: bool = False,
            default: str | None = None) -> None:
    """``-o/--out``: where a command writes (a file or a directory, as ``help`` says)."""
    group.add_argument("-o", "--out", metavar=metavar, required=required, default=default,
                       help=help)


def add_force(group, what: str = "existing output files") -> None:
    group.add_argument("--force", action="store_true",
                       help=f"overwrite {what} (never through a symbolic link)")


def add_json(group, what: str = "the result") -> None:
    group.add_argument("--json", action="store_true", help=f"print {what} as one JSON object")


def add_training_options(group) -> None:
    """The time-to-train options (``--train-tokens`` and what prices it; defaults and
    sources in configurator/cost/training_time.py and docs/training_time.md). Every option
    left out keeps the plain search's output."""
    from configurator.core.units import GB
    from configurator.cost.training_time import (DEFAULT_AGGREGATE_STORAGE_BPS,
                                                 DEFAULT_FAILURE_RATE_PER_NODE_DAY,
                                                 DEFAULT_GPU_POWER_FRACTION,
                                                 DEFAULT_NODE_STORAGE_BPS, DEFAULT_PUE,
                                                 DEFAULT_RESTART_OVERHEAD_S, OBJECTIVES)

    group.add_argument("--train-tokens", metavar="TOKENS",
                       help="tokens to train (15T, 300B, 2e12): adds days, GPU-hours, ETTR "
                            "and the checkpoint interval of every plan")
    group.add_argument("--objective", choices=OBJECTIVES, default="iteration",
                       help="what ranks the plans (and the node counts of --nodes-range): "
                            "iteration time (default), time-to-train, cost (GPU-hours "
                            "without --gpu-hour-price) or energy; needs --train-tokens")
    group.add_argument("--deadline", type=float, metavar="DAYS",
                       help="keep the plans that train within DAYS days, cheapest first "
                            "(exit 3 with the fastest time when none does)")
    group.add_argument("--failure-rate-per-node-day", type=float, metavar="R",
                       help="job interruptions per node-day (default "
                            f"{DEFAULT_FAILURE_RATE_PER_NODE_DAY:.5f}: Llama 3's 466 in 54 "
                            "days on 2,048 nodes)")
    group.add_argument("--restart-overhead-s", type=float, metavar="S",
                       help="fixed part of a restart: detection, re-queue, NCCL start-up "
                            f"(default {DEFAULT_RESTART_OVERHEAD_S:g} s); the checkpoint "
                            "load is added per plan")
    for kind in ("write", "read"):
        group.add_argument(f"--storage-{kind}-GBps", type=float, metavar="GBPS",
                           help=f"storage {kind} bandwidth per node, GB/s (default "
                                f"{DEFAULT_NODE_STORAGE_BPS / GB:.2f}: "
                                "Llama 3's 2 TB/s over 2,048 nodes)")
        group.add_argument(f"--storage-{kind}-aggregate-GBps", type=float, metavar="GBPS",
                           help=f"storage {kind} bandwidth of the whole file system, GB/s "
                                f"(default {DEFAULT_AGGREGATE_STORAGE_BPS / GB:g}, Llama 3's "
                                "Tectonic)")
    group.add_argument("--async-save", action="store_true",
                       help="asynchronous checkpoint saves (Megatron --async-save): the ranks "
                            "stall for the GPU-to-host copy only")
    group.add_argument("--gpu-hour-price", type=float, metavar="PRICE",
                       help="price of one GPU-hour, in your currency (no default: without "
                            "it the tool reports GPU-hours)")
    group.add_argument("--gpu-power-fraction", type=float, metavar="F",
                       help="GPU draw while training as a fraction of its rated power "
                            f"(default {DEFAULT_GPU_POWER_FRACTION:g}: Llama 2/3 model cards' TDP "
                            "accounting)")
    group.add_argument("--node-overhead-W", type=float, metavar="W",
                       help="power of a node beyond its GPUs, W (default: the DGX data "
                            "sheet's maximum less the GPUs' rated power; 0 for other GPUs)")
    group.add_argument("--pue", type=float, metavar="PUE",
                       help=f"data-centre power usage effectiveness (default {DEFAULT_PUE:g}: "
                            "BLOOM's Jean Zay)")


#: argparse destinations of :func:`add_training_options` that map to TrainingInputs options.
TRAINING_OPTION_DESTS = ("failure_rate_per_node_day", "restart_overhead_s",
                         "storage_write_GBps", "storage_write_aggregate_GBps",
                         "storage_read_GBps", "storage_read_aggregate_GBps", "gpu_hour_price",
                         "gpu_power_fraction", "node_overhead_W", "pue")
