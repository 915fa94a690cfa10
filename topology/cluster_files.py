"""Cluster presets and cluster files: the YAML schema a cluster is described in, the presets
(:data:`CLUSTER_PRESETS`, shipped with their sources as
``configurator/data/clusters/presets.yaml``) and :func:`load_cluster`, which builds a
:class:`topology.cluster.Cluster` from either.
"""

from __future__ import annotations

from typing import Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.units import GB, US
from configurator.data import CLUSTERS, data_path
from topology.cluster import (DEFAULT_INTER_EFFICIENCY, DEFAULT_INTRA_EFFICIENCY, Cluster,
                              build_cluster)
from topology.gpus import gpu_from_config

#: Keys of a cluster file (:func:`cluster_from_config`): those it must have, those it may.
CLUSTER_KEYS_REQUIRED = ("gpu", "gpus_per_node", "nodes", "intra_node_bandwidth_GBps",
                         "inter_node_bandwidth_GBps", "intra_node_latency_us",
                         "inter_node_latency_us")
CLUSTER_KEYS_OPTIONAL = ("name", "intra_node_efficiency", "inter_node_efficiency",
                         "nvlink_domain_gpus", "training")

#: Keys of a cluster file's optional ``training`` section (what the time to train assumes of
#: this cluster; configurator/cost/training_time.py, docs/training_time.md) → the range its
#: value must lie in (:data:`configurator.core.limits.FLOAT_RANGES`). Units in the names.
TRAINING_KEYS = {
    "failure_rate_per_node_day": "failure_rate_per_node_day",
    "restart_overhead_s": "restart_overhead_s",
    "storage_write_GBps_per_node": "storage_GBps",
    "storage_write_GBps_aggregate": "storage_GBps",
    "storage_read_GBps_per_node": "storage_GBps",
    "storage_read_GBps_aggregate": "storage_GBps",
    "gpu_hour_price": "gpu_hour_price",
    "gpu_power_fraction": "gpu_power_fraction",
    "node_overhead_W": "node_overhead_W",
    "pue": "pue",
}


def training_section(data: Any) -> dict[str, float]:
    """A cluster file's ``training`` mapping checked: known keys (:data:`TRAINING_KEYS`),
    each a number in its range; returned as floats in the file's units. Raises
    :class:`InputError` naming ``training.KEY``."""
    v.exact_keys("training", data, (), tuple(TRAINING_KEYS))
    return {key: v.float_in_range(f"training.{key}", val, key=TRAINING_KEYS[key])
            for key, val in data.items()}


def _load_presets() -> dict[str, dict[str, Any]]:
    """The presets of ``configurator/data/clusters/presets.yaml``, in its order, each in the
    cluster-file schema with its key as ``name`` (its ``source`` stays in the file)."""
    doc = v.load_yaml(data_path(CLUSTERS, "presets.yaml").read_text(encoding="utf-8"))
    return {key: {"name": key, **{k: val for k, val in entry.items() if k != "source"}}
            for key, entry in doc.items()}


#: Presets, in the YAML schema of a cluster file (:func:`cluster_from_config`), by name.
#: Bandwidths are nominal, per GPU, per direction; the ``intra_node_*`` figures are those of
#: the NVLink domain (a host unless ``nvlink_domain_gpus`` says otherwise), the
#: ``inter_node_*`` ones those between domains. Each figure's source is in the data file.
CLUSTER_PRESETS: dict[str, dict[str, Any]] = _load_presets()


def cluster_from_config(data: Mapping[str, Any], nodes: int | None = None) -> Cluster:
    """Build a cluster from the YAML schema (see :data:`CLUSTER_PRESETS`); ``nodes`` overrides.

    ``nodes`` counts hosts of ``gpus_per_node`` GPUs (torchrun/SLURM nodes; an NVL72 compute
    tray). Optional ``nvlink_domain_gpus``: GPUs of one NVLink domain, a positive multiple
    of ``gpus_per_node`` (default: one host); hosts are grouped into domains in order, the
    last one possibly partial. The ``intra_node_*`` figures apply inside a domain."""
    return cluster_and_training(data, nodes)[0]


def cluster_and_training(data: Mapping[str, Any], nodes: int | None = None
                         ) -> tuple[Cluster, dict[str, float]]:
    """:func:`cluster_from_config` and the cluster's checked ``training`` section
    (:func:`training_section`; empty when it has none), both checked in one pass over
    ``data``. Raises :class:`InputError` naming the offending key."""
    v.exact_keys("cluster", data, CLUSTER_KEYS_REQUIRED, CLUSTER_KEYS_OPTIONAL)
    training = training_section(data["training"]) if "training" in data else {}
    gpu = gpu_from_config(data["gpu"])
    gpn = v.int_in_range("gpus_per_node", data["gpus_per_node"])
    n = v.int_in_range("nodes", data["nodes"] if nodes is None else nodes)
    v.int_in_range("nodes*gpus_per_node", n * gpn, key="num_gpus")
    domain = v.int_in_range("nvlink_domain_gpus", data.get("nvlink_domain_gpus", gpn),
                            key="num_gpus")
    if domain % gpn:
        raise InputError("nvlink_domain_gpus", domain,
                         f"must be a positive multiple of gpus_per_node ({gpn}): an NVLink "
                         "domain is made of whole hosts")
    eff = {}
    for key, default in (("intra_node_efficiency", DEFAULT_INTRA_EFFICIENCY),
                         ("inter_node_efficiency", DEFAULT_INTER_EFFICIENCY)):
        eff[key] = v.efficiency(key, data.get(key, default))
    name = v.display_name("name", data.get("name", "custom-cluster"))
    figure = {key: v.float_in_range(key, data[key]) for key in CLUSTER_KEYS_REQUIRED
              if key.endswith(("_GBps", "_us"))}
    cluster = build_cluster(
        name=name, gpu=gpu, gpus_per_node=gpn, hosts=[f"node{i:04d}" for i in range(n)],
        intra_bandwidth_Bps=figure["intra_node_bandwidth_GBps"] * GB,
        inter_bandwidth_Bps=figure["inter_node_bandwidth_GBps"] * GB,
        intra_latency_s=figure["intra_node_latency_us"] * US,
        inter_latency_s=figure["inter_node_latency_us"] * US,
        intra_efficiency=eff["intra_node_efficiency"],
        inter_efficiency=eff["inter_node_efficiency"], nvlink_domain_gpus=domain)
    return cluster, training


def cluster_config(ref: str) -> Mapping[str, Any]:
    """The mapping that describes cluster ``ref``: a preset's (name in any case) or a
    YAML/JSON cluster file's, unchecked (:func:`cluster_and_training` checks it). Raises
    :class:`InputError` (field ``cluster``) when ``ref`` is neither."""
    import os

    preset = v.preset_name(ref, CLUSTER_PRESETS)
    if preset is not None:
        return CLUSTER_PRESETS[preset]
    if not os.path.exists(ref):
        raise InputError("cluster", ref, "not a preset name nor an existing file"
                         + (v.did_you_mean(ref, CLUSTER_PRESETS)
                            or " (presets: " + ", ".join(CLUSTER_PRESETS) + ")"))
    return v.load_mapping_file("cluster", ref)


def load_cluster(ref: str, nodes: int | None = None) -> Cluster:
    """Resolve a preset name (any case) or a YAML/JSON cluster file; ``nodes`` overrides its
    node count.

    Raises :class:`InputError` (field ``cluster``, ``nodes``, or the offending key).
    """
    return read_cluster(ref, nodes)[0]


def read_cluster(ref: str, nodes: int | None = None, gpus: int | None = None, *,
                 gpus_field: str = "gpus") -> tuple[Cluster, dict[str, float]]:
    """:func:`load_cluster` and the cluster's checked ``training`` section
    (:func:`training_section`; empty when it has none): the preset or file read once for
    both. ``gpus``: the job's GPU count instead of whole nodes (:func:`config_for_gpus`).
    Raises :class:`InputError` (field ``cluster``, ``nodes``, ``gpus_field`` or the
    offending key)."""
    data = cluster_config(ref)
    if gpus is not None:
        data, nodes = config_for_gpus(data, gpus, nodes, ref=ref, field=gpus_field)
    return cluster_and_training(data, nodes)


def config_for_gpus(data: Mapping[str, Any], gpus: int, nodes: int | None = None, *,
                    ref: str = "the cluster", field: str = "gpus"
                    ) -> tuple[Mapping[str, Any], int]:
    """``(data, nodes)`` for a job on ``gpus`` GPUs of cluster ``data``: whole nodes
    (``gpus`` a multiple of ``gpus_per_node``), or part of one node (a divisor of it: one
    host of ``gpus`` GPUs on the same links, its NVLink domain those GPUs; a 4-GPU job on a
    DGX, as Megatron runs it with ``--nproc-per-node 4``). ``nodes``, if given, must agree.
    Raises :class:`InputError` (field ``field`` or ``nodes``)."""
    n = v.int_in_range(field, gpus, key="num_gpus")
    g = v.int_in_range("gpus_per_node", data.get("gpus_per_node"))
    if n < g and g % n == 0:
        if nodes not in (None, 1):
            raise InputError("nodes", nodes, f"must be 1 with {n} GPUs: they are part of one "
                                             f"node of {g} ({ref})")
        return {**data, "gpus_per_node": n, "nvlink_domain_gpus": n}, 1
    if n % g:
        raise InputError(field, n, f"must be a multiple or a divisor of the {g} GPUs per "
                                   f"node of {ref}")
    if nodes is not None and nodes != n // g:
        raise InputError("nodes", nodes, f"disagrees with {n} GPUs: {n // g} nodes of {g} "
                                         f"({ref})")
    return data, n // g
