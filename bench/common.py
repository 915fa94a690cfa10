"""What the benches share: their argument parser, markdown table heads, the entry point of
the CUDA benches, their timing of a forward and a backward, the SC'21 runs' cluster and the
plans the placement benches price."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser whose ``--help`` describes the bench by its module docstring's
    first paragraph."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def table_head(columns: Sequence[str], align: Sequence[str] | None = None) -> str:
    """A markdown table's head: the column names, then the rule (``---`` per column unless
    ``align`` gives each, e.g. ``---:`` right-aligned)."""
    rule = align or ["---"] * len(columns)
    return "| " + " | ".join(columns) + " |\n|" + "|".join(rule) + "|"


def run_cuda_bench(main: Callable[[], int], name: str) -> None:
    """Exit with ``main()``'s code; an :class:`~configurator.core.errors.InputError` (no
    CUDA without ``--dry-run``, a bad argument) becomes one line ``name: error`` and exit 2."""
    from configurator.core.errors import InputError

    try:
        sys.exit(main())
    except InputError as err:
        print(f"{name}: {err}", file=sys.stderr)
        sys.exit(2)


def time_passes(torch, fn, backward, warmup: int, repeats: int) -> tuple[float, float]:
    """Median forward and backward seconds of ``fn()`` and ``backward(out)``
    (:func:`configurator.profiler.timing.time_forward_backward`, CUDA events on a GPU)."""
    from configurator.profiler.timing import time_forward_backward

    return time_forward_backward(torch, fn, backward, warmup=warmup, repeats=repeats,
                                 cuda=torch.cuda.is_available())


def sc21_cluster(row):
    """The DGX A100 80GB cluster (nodes of 8 GPUs) of one SC'21 Table 1 row."""
    from topology.cluster_files import load_cluster

    return load_cluster("dgx-a100-80gb", nodes=row.num_gpus // 8)


def placement_plan(fields: dict, world: int):
    """A plan for ``world`` GPUs from ``fields`` over the placement benches' defaults (cp 1,
    vp 1, mbs 1, no recompute, bf16, attention backend auto)."""
    from configurator.core.rules import plan_for_world

    return plan_for_world(dict(dict(cp=1, vp=1, micro_batch_size=1, recompute="none",
                                    precision="bf16", attention_backend="auto"), **fields),
                          world)
