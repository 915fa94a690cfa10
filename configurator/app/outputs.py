"""Files written by ``search --out`` and ``launch``: never overwriting without ``force``,
never writing through a symbolic link (:mod:`launchers.files`)."""

from __future__ import annotations

import os
import tempfile
from typing import Iterable

from configurator.core import jsonout
from configurator.core.document import plan_document
from configurator.search.rank import SearchResult, candidate_memory

SEARCH_FILES = ("plan.json", "plans.json", "table.txt", "plans.png", "launch_torchrun.sh",
                "launch_slurm.sbatch")
LAUNCH_FILES = ("launch_torchrun.sh", "launch_slurm.sbatch")


def check_out(out: str, names: Iterable[str], force: bool) -> None:
    """Raise :class:`InputError` (field ``out``) if ``out`` is not a directory, if ``out`` or
    one of ``names`` in it is a symbolic link (also with ``force``), or if one of ``names``
    exists in it and ``force`` is false."""
    from launchers import check_out_dir

    check_out_dir(out, names, force)


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
    ``res.ranked``). Every file is rendered first, then all are written without following a
    symbolic link (:func:`launchers.write_files`). Returns the names."""
    from configurator.report.plot import plot_search
    from configurator.report.table import format_table
    from launchers import FILE_MODE, check_out_dir, launch_files, write_files

    best = res.plans[0]
    estimate = best.to_dict()
    files = launch_files(model, best.plan, nodes=cluster.num_nodes,
                         gpus_per_node=cluster.gpus_per_node, summary=script_summary(estimate))
    doc = plan_document(model=model, cluster=cluster.to_dict(), plan=best.plan,
                        estimate=estimate)
    files["plan.json"] = (jsonout.dumps(doc, indent=2).encode(), FILE_MODE)
    files["plans.json"] = (jsonout.dumps(res.to_dict(), indent=2).encode(), FILE_MODE)
    files["table.txt"] = ((header + "\n" + format_table(res.plans, wide=True) + "\n").encode(),
                          FILE_MODE)
    with tempfile.TemporaryDirectory() as private:      # mode 0700, a fresh name
        png = os.path.join(private, "plans.png")
        plot_search(png, peak_memory_bytes=candidate_memory(model, res.ranked),
                    iteration_time_s=res.ranked_time_s, recompute=res.ranked.recompute,
                    capacity_bytes=cluster.gpu.memory_bytes,
                    title=f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name}: "
                          f"{res.feasible} feasible plans")
        with open(png, "rb") as fh:
            files["plans.png"] = (fh.read(), FILE_MODE)
    files = {name: files[name] for name in SEARCH_FILES}
    check_out_dir(out, files, force)
    write_files(out, files, force=force)
    return list(SEARCH_FILES)
