"""Resolve what the user named (model, cluster, nodes, sequence length, measured topology,
calibration, layer profile) into core objects: a :class:`~configurator.core.model.ModelSpec`,
a :class:`~topology.cluster.Cluster` whose links are the measured ones where given, and the
:class:`~configurator.core.profile.LayerProfile` the cost model prices layers with, if any."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.model_presets import load_model
from configurator.core.profile import LayerProfile, load_profile
from topology.calibration import load_calibration, with_measurements
from topology.cluster import Cluster
from topology.cluster_files import read_cluster

if TYPE_CHECKING:
    from topology.audit import AuditReport
    from topology.topofile import Topology


@dataclass(frozen=True, kw_only=True)
class JobInputs:
    """What a plan is made for, as named by the user (references, not yet loaded).

    ``model``: preset, YAML/JSON file or HF ``config.json``; ``cluster``: preset or file;
    ``nodes``: node count (default the cluster's own; with a topology, how many of its hosts
    the plan uses, at most all of them: the placement chooses which); ``topology``: a
    measured topology file; ``exclude_flagged``: never use the hosts the topology's audit
    recommends draining; ``gpus``: the job's GPU count instead of whole nodes, part of one
    node where it divides the node's GPUs (:func:`topology.cluster_files.config_for_gpus`;
    not with a topology).
    """

    model: str
    cluster: str
    nodes: int | None = None
    gpus: int | None = None
    seq_length: int | None = None
    topology: str | None = None
    exclude_flagged: bool = False
    calibration: str | None = None
    #: measured layer times (``configurator profile``) in place of the analytic compute
    profile: str | None = None


@dataclass(frozen=True, kw_only=True)
class ResolvedJob:
    """A :class:`JobInputs` resolved (:func:`resolve`, :func:`resolve_uncalibrated`).

    ``model``: the model (at the sequence length asked for); ``cluster``: its nodes, its
    links measured where a topology was given, and with :func:`resolve` the profile's host
    time and the calibration applied (:func:`topology.calibration.with_measurements`);
    ``profile``: the layer profile the cost prices layers with, or None; ``training``: the
    cluster's checked ``training`` section (:func:`topology.cluster_files.training_section`,
    in the cluster file's units; empty when it has none), read with the cluster."""

    model: ModelSpec
    cluster: Cluster
    profile: LayerProfile | None = None
    training: Mapping[str, float] = field(default_factory=dict)
    #: the cluster as :func:`resolve_uncalibrated` built it: without the profile's host time
    #: and the calibration (what a calibration is compared against)
    uncalibrated_cluster: Cluster


def resolve(inputs: JobInputs, *, exclude_flagged: bool | None = None,
            precision: str = "bf16") -> ResolvedJob:
    """:func:`resolve_uncalibrated`, then the layer profile (checked against the model, the
    GPU and ``precision``, the plan's: :meth:`configurator.core.profile.LayerProfile.check_job`)
    and the calibration, both applied to the cluster
    (:func:`topology.calibration.with_measurements`)."""
    job = resolve_uncalibrated(inputs, exclude_flagged=exclude_flagged)
    profile = None
    if inputs.profile:
        profile = load_profile(inputs.profile)
        profile.check_job(job.model, job.cluster.gpu.name, precision)
    calibration = load_calibration(inputs.calibration) if inputs.calibration else None
    cluster = with_measurements(job.cluster, profile, calibration, precision)
    return dataclasses.replace(job, cluster=cluster, profile=profile)


def resolve_uncalibrated(inputs: JobInputs, *, exclude_flagged: bool | None = None
                         ) -> ResolvedJob:
    """Load the model and build the cluster (no profile, no calibration). Without a
    topology: ``inputs.nodes`` nodes of the cluster (default its own count), or
    ``inputs.gpus`` GPUs (whole nodes or part of one). With one:
    every host of the topology, its links measured; :func:`host_pool` then says which hosts
    a plan may use and how many. ``exclude_flagged`` (default ``inputs.exclude_flagged``)
    needs a topology. The cluster is read once, its ``training`` section with it.
    Raises :class:`InputError`."""
    exclude = inputs.exclude_flagged if exclude_flagged is None else exclude_flagged
    model = load_model(inputs.model)
    if inputs.seq_length is not None:
        model = model.with_seq_length(inputs.seq_length)
    if inputs.nodes is not None:
        v.int_in_range("nodes", inputs.nodes)
    if inputs.gpus is not None and inputs.topology:
        raise InputError("gpus", inputs.gpus, "not with --topology: a measured topology's "
                                              "plans run on whole hosts (--nodes)")
    topo = None
    if inputs.topology:
        topo = load_measured_topology(inputs.topology)
    elif exclude:
        raise InputError("exclude_flagged", True, "needs --topology FILE")
    nodes = inputs.nodes if topo is None else len(topo.hosts)
    cluster, training = read_cluster(inputs.cluster, nodes, inputs.gpus)
    if topo is not None:
        from topology.topofile import apply_topology

        check_measured_gpu(topo, cluster, inputs.topology)
        if inputs.nodes is not None and inputs.nodes > len(topo.hosts):
            raise InputError("nodes", inputs.nodes, f"must be at most the {len(topo.hosts)} "
                             f"hosts of the topology {inputs.topology}")
        cluster = apply_topology(cluster, topo)
    return ResolvedJob(model=model, cluster=cluster, training=training,
                       uncalibrated_cluster=cluster)


def load_measured_topology(path: str) -> Topology:
    """:func:`topology.topofile_io.load_topology`, saying so when the file is measurement
    output (an nccl-tests log, ``nvidia-smi topo -m``) rather than a topology file."""
    from topology.topofile_io import load_topology

    try:
        return load_topology(path)
    except InputError:
        from topology.importers import detect_format

        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                fmt = detect_format(fh.read(1 << 20))
        except OSError:
            fmt = None
        if fmt in ("nccl-tests", "nvidia-smi"):
            raise InputError("topology", path, f"is {fmt} output, not a topology file: "
                             "'configurator topology import' makes one of it (plan --logs "
                             "takes it as it is)") from None
        raise


def cluster_ref_for(topo: Topology, given: str | None) -> str:
    """The cluster a measured topology runs on: ``given`` (a preset or a file), else the
    preset whose GPU the measurements name (nccl-tests' Rank lines,
    :attr:`topology.topofile.Topology.gpu_name`) and whose hosts hold the topology's GPUs
    per host. Raises :class:`InputError` (field ``cluster``) when neither says."""
    from topology.cluster_files import CLUSTER_PRESETS
    from topology.gpus import guess_gpu_preset

    if given:
        return given
    gpu = guess_gpu_preset(topo.gpu_name) if topo.gpu_name else None
    fits = [name for name, c in CLUSTER_PRESETS.items()
            if c["gpu"] == gpu and c["gpus_per_node"] == topo.gpus_per_host]
    if not fits:
        seen = (f"no cluster preset has {topo.gpu_name!r} GPUs, {topo.gpus_per_host} per "
                f"host, as the measurements name" if topo.gpu_name
                else "the measurements do not name their GPU")
        raise InputError("cluster", None, f"required: {seen}; name the cluster (a preset or "
                                          f"a YAML file)")
    return fits[0]


def check_measured_gpu(topo: Topology, cluster: Cluster, where: str) -> None:
    """Refuse a cluster whose GPU is not the one the measurements were taken on: links
    measured between H100 hosts priced with A100 compute describe no real cluster. Compared
    where both are known: the GPU preset the measurements' device name maps to
    (:func:`topology.gpus.guess_gpu_preset`, e.g. ``NVIDIA H100 80GB HBM3`` → ``h100-80gb``)
    and the cluster's GPU when it is a preset (a custom GPU cannot be compared). Raises
    :class:`InputError` (field ``cluster``)."""
    from topology.gpus import GPU_PRESETS, guess_gpu_preset

    measured = guess_gpu_preset(topo.gpu_name) if topo.gpu_name else None
    if measured is None or cluster.gpu.name not in GPU_PRESETS or measured == cluster.gpu.name:
        return
    raise InputError("cluster", cluster.name,
                     f"has {cluster.gpu.name} GPUs but {where} was measured on "
                     f"{topo.gpu_name!r} ({measured}): name a cluster of {measured} GPUs")


def host_pool(inputs: JobInputs, cluster: Cluster, *,
              exclude_flagged: bool | None = None) -> tuple[list[int], int, list[str]]:
    """``(pool, nodes, flagged)``: the host indices a plan may use (all, or with
    ``exclude_flagged`` those the topology's audit does not recommend draining), how many
    it uses (``inputs.nodes``, default the whole pool) and the hosts left out as flagged.
    Raises :class:`InputError` when ``nodes`` exceeds the pool."""
    exclude = inputs.exclude_flagged if exclude_flagged is None else exclude_flagged
    pool = list(range(cluster.num_nodes))
    flagged: list[str] = []
    if inputs.topology and exclude:
        drop = set(flagged_hosts(inputs.topology))
        flagged = [h for h in cluster.hosts if h in drop]
        pool = [i for i, h in enumerate(cluster.hosts) if h not in drop]
    nodes = len(pool) if inputs.nodes is None else inputs.nodes
    if nodes > len(pool):
        raise InputError("nodes", nodes, f"must be at most the {len(pool)} hosts the audit "
                         f"does not flag (flagged: {', '.join(flagged)})")
    return pool, nodes, flagged


def flagged_hosts(topology: str) -> tuple[str, ...]:
    """The hosts the audit of the topology file recommends leaving out."""
    return audit_of(topology).drain_hosts


def audit_of(topology: str) -> AuditReport:
    """The audit (:func:`topology.audit.audit`) of a topology file, made once per file
    while it is unchanged (:func:`topology.topofile_io.load_topology` keeps the file's
    topology; its audit is kept with it)."""
    from topology.topofile_io import load_topology

    return _audit(load_topology(topology))


@functools.lru_cache(maxsize=8)
def _audit(topo):
    from topology.audit import audit

    return audit(topo)
