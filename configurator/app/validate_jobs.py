"""``configurator validate``: the cost model against measured runs.

Each run (:mod:`configurator.core.runs`) is priced as ``configurator estimate`` prices its
plan (the model at the run's sequence length, the cluster preset or file with the run's GPU
count, the calibration if one is given) and compared with what was measured. Per group
(the run's ``group``, else ``<gpu> <precision>``): mean absolute percentage error (MAPE),
the worst row, and Spearman's rank correlation of predicted and measured iteration times
(:func:`scipy.stats.spearmanr`: does the model order the runs as the cluster did?).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.model_presets import load_model
from configurator.core.runs import MeasuredRun, gpu_order_text
from configurator.cost.measured import measured_iteration_time_s
from configurator.search.evaluate import Evaluation, evaluate_plan
from configurator.search.rank import best_layer_split
from topology.cluster import Cluster
from topology.cluster_files import cluster_config, cluster_from_config, config_for_gpus

if TYPE_CHECKING:
    from topology.topofile import Topology


@dataclass(frozen=True, kw_only=True)
class RunCheck:
    """One run, predicted and measured: times in s, memory in bytes (:meth:`to_dict` also
    gives the hosts and GPU order it was priced on, as the run names them); ``error`` is
    ``predicted / measured - 1`` (None without a measured time); ``problem``: why the run
    could not be priced (then the figures are None). ``run`` carries the plan as priced (with
    the layer split chosen for a run that names none)."""

    run: MeasuredRun
    group: str
    measured_iteration_time_s: float | None = None
    predicted_iteration_time_s: float | None = None
    predicted_peak_memory_bytes: float | None = None
    memory_capacity_bytes: float | None = None
    fits: bool | None = None
    mfu: float | None = None
    problem: str | None = None

    @property
    def error(self) -> float | None:
        if self.measured_iteration_time_s is None or self.predicted_iteration_time_s is None:
            return None
        return self.predicted_iteration_time_s / self.measured_iteration_time_s - 1.0

    @property
    def memory_error(self) -> float | None:
        if self.run.peak_memory_bytes is None or self.predicted_peak_memory_bytes is None:
            return None
        return self.predicted_peak_memory_bytes / self.run.peak_memory_bytes - 1.0

    def to_dict(self) -> dict:
        r = self.run
        return {"name": r.name, "group": self.group, "source": r.source,
                "model": r.model if isinstance(r.model, str) else r.model.name,
                "cluster": r.cluster, "num_gpus": r.num_gpus,
                "hosts": None if r.hosts is None else list(r.hosts),
                "gpu_order": None if r.gpu_order is None else [list(g) for g in r.gpu_order],
                "config": r.plan.to_dict(),
                "measured_iteration_time_s": self.measured_iteration_time_s,
                "predicted_iteration_time_s": self.predicted_iteration_time_s,
                "error": self.error, "measured_peak_memory_bytes": r.peak_memory_bytes,
                "predicted_peak_memory_bytes": self.predicted_peak_memory_bytes,
                "memory_error": self.memory_error,
                "memory_capacity_bytes": self.memory_capacity_bytes, "fits": self.fits,
                "mfu": self.mfu, "problem": self.problem}


@dataclass(frozen=True, kw_only=True)
class GroupStats:
    """Agreement of one group: rows with a time, MAPE and worst |error| (fractions), the
    worst row's name and signed error, Spearman's ρ (None under 3 rows or constant data),
    the mean signed error (negative: predicted too fast on average), and memory rows' MAPE
    where peak memory was measured."""

    group: str
    rows: int
    mape: float
    worst_abs_error: float
    worst_name: str
    worst_error: float
    spearman: float | None
    memory_rows: int = 0
    memory_mape: float | None = None
    mean_error: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    checks: list[RunCheck]
    groups: list[GroupStats]
    overall: GroupStats | None
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"groups": [g.to_dict() for g in self.groups],
                "overall": self.overall.to_dict() if self.overall else None,
                "runs": [c.to_dict() for c in self.checks], "skipped": list(self.skipped)}


def run_model(run: MeasuredRun) -> ModelSpec:
    """The run's model at its sequence length. Raises :class:`InputError`."""
    model = run.model if isinstance(run.model, ModelSpec) else load_model(run.model)
    return model.with_seq_length(run.seq_length) if run.seq_length else model


def run_cluster(run: MeasuredRun, topology: Topology | None = None) -> Cluster:
    """The run's cluster with ``num_gpus / gpus_per_node`` nodes, or, for a job on part of
    one node (NeMo's 4-GPU runs on a DGX H100), one host of ``num_gpus`` GPUs on the same
    links; with ``topology`` (``validate``/``calibrate --topology``), on the links the run's
    GPUs sit on there (:func:`on_topology`). Raises :class:`InputError` if the GPUs are
    neither whole nodes nor a divisor of one, or the topology has fewer hosts than the run
    spans."""
    config = cluster_config(run.cluster)
    data, nodes = config_for_gpus(config, run.num_gpus, ref=run.cluster, field="num_gpus")
    cluster = cluster_from_config(data, nodes)
    part = cluster.gpus_per_node < config["gpus_per_node"]
    return cluster if topology is None else on_topology(cluster, topology, part, run.hosts,
                                                        run.gpu_order)


def topology_host(topology: Topology, name: str) -> str:
    """The host of ``topology`` that a run's host ``name`` is: the same name, else the one
    host with the same short name (before the first ``.``: SLURM's node list and the
    hostname nccl-tests prints may differ by a domain). Raises :class:`InputError` (field
    ``hosts``) for a name the topology does not hold."""
    if name in topology.hosts:
        return name
    short = name.split(".")[0]
    same = [h for h in topology.hosts if h.split(".")[0] == short]
    if len(same) != 1:
        raise InputError("hosts", name, f"not one of the topology's {len(topology.hosts)} "
                                        f"hosts" + (" (its short name matches several)"
                                                    if same else ""))
    return same[0]


def on_topology(cluster: Cluster, topology: Topology, part: bool,
                hosts: tuple[str, ...] | None = None,
                gpu_order: tuple[tuple[int, ...], ...] | None = None) -> Cluster:
    """``cluster`` (a run's, :func:`run_cluster`) on the links of ``topology``
    (:func:`topology.topofile.apply_topology`) that the run's GPUs sit on: its ``hosts`` in
    node_rank order (the run file's ``hosts``), else the topology's first
    ``cluster.num_nodes`` hosts; on each, local rank ``k`` on GPU ``gpu_order[node][k]``
    (the run's ``gpu_order``, its ``CUDA_VISIBLE_DEVICES``: a GPU's links, NVLink and its
    rail's NIC, become the local rank's), else on GPU ``k`` (torchrun's local ranks on the
    GPUs CUDA numbers first when ``CUDA_VISIBLE_DEVICES`` is unset; for a run on ``part``
    of one host, GPUs 0 to ``gpus_per_node - 1`` of it). A host is matched by
    :func:`topology_host`. Raises :class:`InputError` (field ``hosts``) for a host the
    topology does not name, one named twice or a count other than the run's nodes, (field
    ``gpu_order``) for a count of lists or of GPUs other than the run's or a GPU the
    topology's hosts lack, (field ``topology hosts``) when the topology has fewer hosts than
    the run spans, and (field ``cluster``) when it was measured on another GPU
    (:func:`configurator.app.inputs.check_measured_gpu`)."""
    from configurator.app.inputs import check_measured_gpu
    from topology.topofile import apply_topology

    k, gpn = cluster.num_nodes, cluster.gpus_per_node
    if hosts is not None:
        hosts = tuple(topology_host(topology, h) for h in hosts)
        if len(set(hosts)) < len(hosts):
            raise InputError("hosts", " ".join(hosts), "names one of the topology's hosts "
                                                       "twice")
        if len(hosts) != k:
            raise InputError("hosts", " ".join(hosts), f"must name the {k} node(s) the run "
                                                       f"spans, in node_rank order")
    elif len(topology.hosts) < k:
        raise InputError("topology hosts", len(topology.hosts),
                         f"fewer than the {k} nodes the run spans (a run on N nodes that "
                         f"names no hosts is priced on the topology's first N)")
    check_measured_gpu(topology, cluster, "the topology")
    if hosts is None:
        hosts = tuple(topology.hosts[:k])
    keep = set(hosts)
    if gpu_order is None:
        links = tuple(l for l in topology.links if l.src in keep and l.dst in keep
                      and (not part or all(i is None or i < gpn
                                           for i in (l.src_gpu, l.dst_gpu))))
    else:
        links = _on_gpu_order(topology, hosts, gpu_order, gpn)
    return apply_topology(cluster, dataclasses.replace(
        topology, hosts=hosts, links=links,
        collectives=tuple(c for c in topology.collectives if keep.issuperset(c.hosts)),
        missing=tuple(m for m in topology.missing if m.src in keep and m.dst in keep)))


def _on_gpu_order(topology: Topology, hosts: tuple[str, ...],
                  gpu_order: tuple[tuple[int, ...], ...], gpn: int) -> tuple:
    """The links of ``topology`` among ``hosts`` with each GPU index replaced by the local
    rank that runs on that GPU (``gpu_order[node][k]`` is local rank ``k``'s GPU); the
    records of GPUs no rank runs on left out. Raises :class:`InputError` (field
    ``gpu_order``) as :func:`on_topology` says."""
    shown = gpu_order_text(gpu_order)
    if len(gpu_order) != len(hosts) or any(len(g) != gpn for g in gpu_order):
        raise InputError("gpu_order", shown, f"must give each of the run's {len(hosts)} "
                                             f"node(s) {gpn} GPUs, in node_rank order")
    have = topology.gpus_per_host
    if have is not None and any(i >= have for g in gpu_order for i in g):
        raise InputError("gpu_order", shown, f"names a GPU the topology's hosts lack (they "
                                             f"have {have}: 0 to {have - 1})")
    rank_of = {h: {gpu: k for k, gpu in enumerate(g)} for h, g in zip(hosts, gpu_order)}
    out = []
    for link in topology.links:
        src, dst = rank_of.get(link.src), rank_of.get(link.dst)
        if src is None or dst is None:
            continue
        if (link.src_gpu is not None and link.src_gpu not in src) or (
                link.dst_gpu is not None and link.dst_gpu not in dst):
            continue
        out.append(dataclasses.replace(
            link, src_gpu=None if link.src_gpu is None else src[link.src_gpu],
            dst_gpu=None if link.dst_gpu is None else dst[link.dst_gpu]))
    return tuple(out)


def priced_run(run: MeasuredRun, topology: Topology | None = None) -> tuple:
    """``(model, cluster, run)`` as ``validate`` and ``calibrate`` price a run: its model and
    cluster resolved (on ``topology``'s links if given, :func:`run_cluster`), and a pp that
    does not divide the layers, with no split named, given the split ``estimate`` would
    choose (:func:`configurator.search.rank.best_layer_split`). Raises :class:`InputError`
    for an unknown preset or a plan Megatron rejects."""
    model, cluster = run_model(run), run_cluster(run, topology)
    return model, cluster, dataclasses.replace(
        run, plan=best_layer_split(model, cluster, run.plan))


def check_run(run: MeasuredRun, calibration=None, topology=None) -> RunCheck:
    """Price one run (:class:`RunCheck`), on ``topology``'s links if given
    (:func:`run_cluster`); an input problem of the run (unknown preset,
    a plan Megatron rejects) is recorded in ``problem`` rather than raised. A run whose pp
    does not divide the layers and which names no split is priced with the split
    ``estimate`` would choose (:func:`configurator.search.rank.best_layer_split`)."""
    group = run.group
    try:
        model, cluster, run = priced_run(run, topology)
        if calibration is not None:
            cluster = calibration.apply_cluster(cluster, run.plan.precision)
        group = group or f"{cluster.gpu.name} {run.plan.precision}"
        ev: Evaluation = evaluate_plan(model, cluster, run.plan, measured=True)
    except InputError as exc:
        return RunCheck(run=run, group=group or "unpriced", problem=str(exc))
    return RunCheck(run=run, group=group,
                    measured_iteration_time_s=measured_iteration_time_s(model, run),
                    predicted_iteration_time_s=ev.iteration_time_s,
                    predicted_peak_memory_bytes=ev.peak_memory_bytes,
                    memory_capacity_bytes=ev.memory_capacity_bytes, fits=ev.fits,
                    mfu=ev.mfu)


def _spearman(xs, ys) -> float | None:
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    from scipy.stats import spearmanr

    rho = spearmanr(xs, ys).statistic
    return None if rho is None or math.isnan(rho) else float(rho)


def group_stats(name: str, checks: list[RunCheck]) -> GroupStats | None:
    """:class:`GroupStats` of the checks that have both times (None if none has)."""
    timed = [c for c in checks if c.error is not None]
    if not timed:
        return None
    worst = max(timed, key=lambda c: abs(c.error))
    mem = [abs(c.memory_error) for c in checks if c.memory_error is not None]
    return GroupStats(
        group=name, rows=len(timed), mape=sum(abs(c.error) for c in timed) / len(timed),
        worst_abs_error=abs(worst.error), worst_name=worst.run.name, worst_error=worst.error,
        spearman=_spearman([c.predicted_iteration_time_s for c in timed],
                           [c.measured_iteration_time_s for c in timed]),
        memory_rows=len(mem), memory_mape=sum(mem) / len(mem) if mem else None,
        mean_error=sum(c.error for c in timed) / len(timed))


def validate_runs(runs: list[MeasuredRun], calibration=None, skipped=(),
                  progress=None, topology=None) -> ValidationReport:
    """Check every run (on ``topology``'s links if given, :func:`run_cluster`) and summarise
    per group (in order of first appearance) and overall. ``progress``: optional callable
    wrapping the iterable (a progress bar)."""
    it = progress(runs) if progress else runs
    checks = [check_run(r, calibration, topology) for r in it]
    names = list(dict.fromkeys(c.group for c in checks if c.problem is None))
    groups = [g for g in (group_stats(n, [c for c in checks if c.group == n]) for n in names)
              if g is not None]
    return ValidationReport(checks=checks, groups=groups,
                            overall=group_stats("all", [c for c in checks if c.problem is None]),
                            skipped=list(skipped))


#: Suffixes read as Megatron-LM training logs (:mod:`configurator.core.megatron_log`).
LOG_SUFFIXES = (".log", ".txt", ".out")


def load_run_files(paths, cluster: str | None = None) -> tuple[list[MeasuredRun], list[str]]:
    """Runs from run files (CSV/YAML/JSON, :func:`configurator.core.runs.load_runs`) and
    Megatron-LM logs (``.log``/``.txt``/``.out``; ``cluster`` names their cluster); with no
    path, the published runs that ship with the tool
    (:func:`configurator.cost.groundtruth.published_runs`). Returns ``(runs, skipped)``."""
    import os

    from configurator.core.runs import load_runs

    if not paths:
        from configurator.cost.groundtruth import published_runs

        return published_runs()
    runs: list[MeasuredRun] = []
    for path in paths:
        if os.path.splitext(path)[1].lower() in LOG_SUFFIXES:
            from configurator.core.megatron_log import load_megatron_log

            if not cluster:
                raise InputError("cluster", None, f"required to read the Megatron log {path}: "
                                 "name the cluster preset or file it ran on")
            runs.extend(load_megatron_log(path, cluster=cluster))
        else:
            runs.extend(load_runs(path))
    return runs, []
