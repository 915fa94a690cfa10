"""Files written by ``search --out`` and ``launch``: never overwriting without ``force``,
never writing through a symbolic link (:mod:`launchers.files`)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Iterable, Mapping

from configurator.core import jsonout
from configurator.core.errors import InputError
from configurator.core.document import PlacementRecord, plan_document
from configurator.search.rank import SearchResult
from configurator.search.engine import peak_memory

SEARCH_FILES = ("plan.json", "plans.json", "table.txt", "plans.png", "report.html",
                "launch_torchrun.sh", "launch_slurm.sbatch", "bridge_overrides.yaml")
LAUNCH_FILES = ("launch_torchrun.sh", "launch_slurm.sbatch", "bridge_overrides.yaml")


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


@dataclass(frozen=True)
class SearchFiles:
    """The rendered outputs of a search (:data:`SEARCH_FILES` → ``(bytes, creation mode)``)
    and what a report built on them reuses: the best plan's placement record and the Gantt
    chart of its simulated schedule."""

    files: dict
    placement: PlacementRecord | None
    gantt_png: bytes


def search_files(model, cluster, res: SearchResult, header: str, *,
                 document: dict | None = None, names=SEARCH_FILES) -> SearchFiles:
    """Render the best plan's launch scripts, ``plan.json`` (the plan document, with the
    placement when the plans were placed), ``plans.json`` (every ranked plan shown),
    ``table.txt`` (``header`` and the wide table), ``plans.png`` (iteration time against
    peak memory of every feasible plan; needs ``res.ranked``) and ``report.html`` (Gantt
    chart of the best plan's simulated schedule, its placement). ``cluster``: the cluster
    searched (the plan's nodes); ``document``: the search's JSON for ``plans.json`` (None:
    the result's); ``names``: the files wanted (default all). The best plan's placement and
    schedule are those its evaluation carries (priced when it was placed, not again)."""
    from configurator.report.gantt import gantt_png
    from configurator.report.plan_html import render_plan_html
    from configurator.report.plot import plot_search
    from configurator.report.table import format_table
    from launchers import FILE_MODE, launch_files

    best = res.plans[0]
    estimate = best.to_dict()
    record = best.placement
    files = launch_files(model, best.plan, nodes=cluster.num_nodes,
                         gpus_per_node=cluster.gpus_per_node, summary=script_summary(estimate),
                         placement=record, training=checkpoint_args(estimate))
    doc = plan_document(model=model, cluster=cluster.to_dict(), plan=best.plan,
                        estimate=estimate, placement=record)
    files["plan.json"] = (jsonout.dumps(doc, indent=2).encode(), FILE_MODE)
    files["plans.json"] = (jsonout.dumps(document or res.to_dict(), indent=2).encode(),
                           FILE_MODE)
    table = format_table(res.plans, wide=True)
    files["table.txt"] = ((header + "\n" + table + "\n").encode(), FILE_MODE)
    timed = best.schedule
    # the chart's iteration time is the plan's, the figure the table prints
    gantt = gantt_png(timed.recorded(), title=f"{model.name}: simulated schedule of the "
                                              f"slowest data-parallel replica "
                                              f"({timed.critical_replica})",
                      iteration_time_s=best.iteration_time_s, optimizer_s=timed.optimizer_s)
    files["report.html"] = (render_plan_html(
        title=f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name}", header=header,
        table=table, placement=record, gantt_png=gantt).encode(), FILE_MODE)
    if "plans.png" not in names:
        return SearchFiles(files={n: files[n] for n in names}, placement=record,
                           gantt_png=gantt)
    with tempfile.TemporaryDirectory() as private:      # mode 0700, a fresh name
        png = os.path.join(private, "plans.png")
        plot_search(png, peak_memory_bytes=peak_memory(
                        model, res.ranked, non_tn_fp8_gemm=cluster.gpu.non_tn_fp8_gemm),
                    iteration_time_s=res.ranked_time_s, recompute=res.ranked.recompute,
                    capacity_bytes=cluster.gpu.memory_bytes,
                    title=f"{model.name} on {cluster.num_gpus} x {cluster.gpu.name}: "
                          f"{res.feasible} feasible plans")
        with open(png, "rb") as fh:
            files["plans.png"] = (fh.read(), FILE_MODE)
    return SearchFiles(files={name: files[name] for name in names}, placement=record,
                       gantt_png=gantt)


def checkpoint_args(estimate: dict):
    """The launch scripts' training arguments of a priced plan (its estimate has
    ``training``: the chosen save interval and whether saves are asynchronous), or None
    (the scripts' defaults, no checkpoints)."""
    from configurator.core import validate as v
    from launchers import TrainingArgs

    t = estimate.get("training") if isinstance(estimate, Mapping) else None
    if t is None:
        return None
    if not isinstance(t, Mapping):
        raise InputError("estimate.training", t, "must be a mapping (the time to train)")
    return TrainingArgs(
        save_interval=v.int_in_range("estimate.training.interval_iterations",
                                     t.get("interval_iterations"), key="save_interval"),
        async_save=v.boolean("estimate.training.async_save", t.get("async_save", False)))


def write_search_outputs(out: str, model, cluster, res: SearchResult, header: str,
                         force: bool, *, document: dict | None = None) -> list[str]:
    """Render (:func:`search_files`) and write the search's outputs into ``out``: every
    file is rendered first, then all are written without following a symbolic link
    (:func:`launchers.write_files`). Returns the names."""
    from launchers import check_out_dir, write_files

    files = search_files(model, cluster, res, header, document=document).files
    check_out_dir(out, files, force)
    write_files(out, files, force=force)
    return list(SEARCH_FILES)
