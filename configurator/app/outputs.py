"""Files written by ``search --out`` and ``launch``: never overwriting without ``force``."""

from __future__ import annotations

import json
import os
from typing import Iterable

from configurator.core.document import plan_document
from configurator.core.errors import InputError
from configurator.search.rank import SearchResult, candidate_memory

SEARCH_FILES = ("plan.json", "plans.json", "table.txt", "plans.png", "launch_torchrun.sh",
                "launch_slurm.sbatch")
LAUNCH_FILES = ("launch_torchrun.sh", "launch_slurm.sbatch")


def check_out(out: str, names: Iterable[str], force: bool) -> None:
    """Raise :class:`InputError` (field ``out``) if ``out`` is not a directory, or if one of
    ``names`` exists in it and ``force`` is false."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError("out", out, "exists and is not a directory")
    if not force:
        for n in names:
            path = os.path.join(out, n)
            if os.path.lexists(path):
                raise InputError("out", path, "exists; pass --force to overwrite")


def script_summary(estimate: dict) -> dict:
    """Predicted figures written into the launch script's header comment."""
    return {"iteration_time_s": round(estimate["iteration_time_s"], 3),
            "model_tflops_per_gpu": round(estimate["model_tflops_per_gpu"], 1),
            "mfu": round(estimate["mfu"], 3),
            "peak_memory_GiB": round(estimate["peak_memory_bytes"] / 2**30, 2)}


def write_search_outputs(out: str, model, cluster, res: SearchResult, header: str,
                         force: bool) -> list[str]:
    """Write the best plan's launch scripts, ``plan.json`` (the plan document),
    ``plans.json`` (every ranked plan shown), ``table.txt`` (``header`` and the wide table)
    and ``plans.png`` (iteration time against peak memory of every feasible plan; needs
    ``res.ranked``). Returns the names."""
    from configurator.report.plot import plot_search
    from configurator.report.table import format_table
    from launchers import write_launch_files

    os.makedirs(out, exist_ok=True)
    best = res.plans[0]
    estimate = best.to_dict()
    write_launch_files(out, model, best.plan, nodes=cluster.num_nodes,
                       gpus_per_node=cluster.gpus_per_node, force=force,
                       summary=script_summary(estimate))
    doc = plan_document(model=model, cluster=cluster.to_dict(), plan=best.plan,
                        estimate=estimate)
    with open(os.path.join(out, "plan.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)
    with open(os.path.join(out, "plans.json"), "w", encoding="utf-8") as fh:
        json.dump(res.to_dict(), fh, indent=2)
    with open(os.path.join(out, "table.txt"), "w", encoding="utf-8") as fh:
        fh.write(header + "\n" + format_table(res.plans, wide=True) + "\n")
    plot_search(os.path.join(out, "plans.png"),
                peak_memory_bytes=candidate_memory(model, res.ranked),
                iteration_time_s=res.ranked_time_s, recompute=res.ranked.recompute,
                capacity_bytes=cluster.gpu.memory_bytes,
                title=f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name}: "
                      f"{res.feasible} feasible plans")
    return list(SEARCH_FILES)
