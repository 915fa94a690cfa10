"""The ``search``, ``estimate`` and ``launch`` jobs: one library function each, taking a
request dataclass and returning the result the CLI prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from configurator.app.inputs import JobInputs, resolve
from configurator.app.outputs import (LAUNCH_FILES, SEARCH_FILES, check_out, script_summary,
                                      write_search_outputs)
from configurator.core import validate as v
from configurator.core.document import read_plan_document
from configurator.core.errors import InputError, NoFeasiblePlanError
from configurator.core.plan import RECOMPUTE
from configurator.core.rules import plan_for_world
from configurator.search.evaluate import Evaluation, evaluate_plan
from configurator.search.rank import SearchResult, search
from configurator.search.space import SearchSpace


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """``configurator search``: inputs, the shared plan settings, the search restrictions
    and where to write (``out``: a directory, or None)."""

    inputs: JobInputs
    global_batch_size: int
    precision: str = "bf16"
    attention_backend: str = "auto"
    recompute: tuple[str, ...] = RECOMPUTE
    top: int = 10
    max_memory_fraction: float = 1.0
    out: str | None = None
    force: bool = False


@dataclass(frozen=True, kw_only=True)
class SearchOutcome:
    """What a search found: the result, the header line(s), the JSON document, and the
    files written (if any). The table is rendered by whoever shows it
    (:func:`configurator.report.table.format_table`)."""

    result: SearchResult
    header: str
    document: dict
    written: list[str] = field(default_factory=list)


def run_search(req: SearchRequest) -> SearchOutcome:
    """Rank every legal plan that fits; with ``req.out`` write the outputs there.
    Raises :class:`InputError` (bad input) or :class:`NoFeasiblePlanError`."""
    model, cluster = resolve(req.inputs)
    v.int_in_range("gbs", req.global_batch_size)
    v.int_in_range("top", req.top)
    if not 0 < req.max_memory_fraction <= 1:
        raise InputError("max_memory_fraction", req.max_memory_fraction, "must be in (0, 1]")
    if req.out:
        check_out(req.out, SEARCH_FILES, req.force)
    space = SearchSpace(recompute=tuple(req.recompute))
    res = search(model, cluster, req.global_batch_size, precision=req.precision,
                 attention_backend=req.attention_backend, top_k=req.top, space=space,
                 keep_ranking=bool(req.out), max_memory_fraction=req.max_memory_fraction)
    header = (f"{model.name} on {cluster.num_nodes}x{cluster.gpus_per_node} "
              f"{cluster.gpu.name}, gbs {req.global_batch_size}, seq {model.seq_length}, "
              f"{req.precision}: {res.candidates_evaluated} plans evaluated, "
              f"{res.feasible} fit, {res.search_time_s:.2f} s")
    doc = res.to_dict()
    if req.inputs.exclude_flagged:
        doc["exclusion"] = exclusion_effect(req, model, cluster, res, space)
        header += "\n" + doc["exclusion"]["summary"]
    written = []
    if req.out:
        written = write_search_outputs(req.out, model, cluster, res, header, req.force)
    return SearchOutcome(result=res, header=header, document=doc,
                         written=written)


def exclusion_effect(req: SearchRequest, model, healthy, res: SearchResult,
                     space: SearchSpace) -> dict:
    """Compare the best plan on the healthy hosts with the best on every host."""
    _, full = resolve(req.inputs, exclude_flagged=False)
    kept = set(healthy.hosts)
    excluded = [h for h in full.hosts if h not in kept]
    best = res.plans[0]
    out = {"excluded_hosts": excluded, "gpus_kept": healthy.num_gpus,
           "gpus_all": full.num_gpus, "iteration_time_s": best.iteration_time_s,
           "tokens_per_s": best.tokens_per_s_per_gpu * healthy.num_gpus}
    try:
        alls = search(model, full, req.global_batch_size, precision=req.precision,
                      attention_backend=req.attention_backend, top_k=1, space=space).plans[0]
        out["all_hosts_iteration_time_s"] = alls.iteration_time_s
        out["all_hosts_tokens_per_s"] = alls.tokens_per_s_per_gpu * full.num_gpus
        change = 100 * (best.iteration_time_s / alls.iteration_time_s - 1)
        out["summary"] = (f"excluding {', '.join(excluded) or 'no host'}: best iteration "
                          f"{best.iteration_time_s:.3f} s on {healthy.num_gpus} GPUs vs "
                          f"{alls.iteration_time_s:.3f} s on all {full.num_gpus} GPUs "
                          f"({change:+.1f} %)")
    except (InputError, NoFeasiblePlanError) as err:
        out["summary"] = (f"excluding {', '.join(excluded) or 'no host'}; with all hosts no "
                          f"plan: {err}")
    return out


@dataclass(frozen=True, kw_only=True)
class EstimateRequest:
    """``configurator estimate``: inputs and the plan's fields as given (``None``: the
    default the field's help states; ``dp`` is derived from the GPU count)."""

    inputs: JobInputs
    fields: dict


@dataclass(frozen=True, kw_only=True)
class EstimateOutcome:
    evaluation: Evaluation
    title: str


def run_estimate(req: EstimateRequest) -> EstimateOutcome:
    """Memory per stage and iteration time of one plan (also one that does not fit)."""
    model, cluster = resolve(req.inputs)
    plan = plan_for_world(req.fields, cluster.num_gpus)
    e = evaluate_plan(model, cluster, plan)
    title = (f"{model.name} on {cluster.num_nodes} x {cluster.gpus_per_node} "
             f"{cluster.gpu.name} ({cluster.name})")
    return EstimateOutcome(evaluation=e, title=title)


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """``configurator launch``: a plan document, where to write, data and tokenizer.

    ``data_path``: the words of Megatron's ``--data-path``: one path, or a blend (several
    paths, or weights and paths alternating: ``("0.3", "/a", "0.7", "/b")``); it requires
    ``tokenizer_model``. None: mock data."""

    plan_path: str
    out: str
    nodes: int | None = None
    data_path: str | tuple[str, ...] | None = None
    tokenizer_model: str | None = None
    force: bool = False


def run_launch(req: LaunchRequest) -> list[str]:
    """Write the torchrun and SLURM scripts of a saved plan document; returns their paths.
    Nothing is written when an input is refused (the scripts are rendered first); the
    output directory and files must not be symbolic links."""
    from launchers import write_launch_files

    doc = read_plan_document(v.load_mapping_file("plan", req.plan_path))
    plan = doc.plan
    nodes = v.int_in_range("nodes", req.nodes if req.nodes else doc.nodes)
    gpn = doc.gpus_per_node
    if nodes * gpn != plan.world_size:
        raise InputError("nodes", nodes, f"nodes * gpus_per_node ({nodes * gpn}) must equal "
                         f"the plan's world size tp*pp*dp*cp ({plan.world_size})")
    check_out(req.out, LAUNCH_FILES, req.force)
    paths = write_launch_files(req.out, doc.model, plan, nodes=nodes, gpus_per_node=gpn,
                               force=req.force, data_path=req.data_path,
                               tokenizer_model=req.tokenizer_model,
                               summary=script_summary(doc.estimate))
    return list(paths.values())
