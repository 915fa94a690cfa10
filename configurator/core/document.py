"""The plan document (``plan.json``): what a plan was made for and what it predicts.

Schema (``schema_version`` 1)::

    {"schema_version": 1,
     "tool": {"name": "configurator", "version": "0.2.0"},
     "model": {ModelSpec fields},                  # configurator.core.model
     "cluster": {"name", "gpu", "gpus_per_node", "nodes", "num_gpus"},
     "seq_length": int, "precision": str, "global_batch_size": int,
     "plan": {ParallelPlan fields},                # configurator.core.plan.PLAN_FIELDS
     "estimate": {Evaluation.to_dict()}}           # predicted figures

``configurator launch --plan`` reads it back (:func:`read_plan_document`), validating every
field as the CLI would; documents written before ``schema_version`` existed (no such key:
``model``, ``cluster`` and ``estimate.config``) are read as version 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec, make_model
from configurator.core.plan import ParallelPlan, plan_from_dict
from configurator.core.rules import check_plan
from configurator.core.version import TOOL_NAME, tool_version

SCHEMA_VERSION = 1
#: Estimate figures a launch script's header shows.
SUMMARY_KEYS = ("iteration_time_s", "model_tflops_per_gpu", "mfu", "peak_memory_bytes")
CLUSTER_KEYS = ("name", "gpu", "gpus_per_node", "nodes", "num_gpus")


def plan_document(*, model: ModelSpec, cluster: Mapping[str, Any], plan: ParallelPlan,
                  estimate: Mapping[str, Any]) -> dict:
    """The plan document of ``plan`` for ``model`` on ``cluster`` (its ``to_dict``)."""
    return {"schema_version": SCHEMA_VERSION,
            "tool": {"name": TOOL_NAME, "version": tool_version()},
            "model": model.to_dict(), "cluster": dict(cluster),
            "seq_length": model.seq_length, "precision": plan.precision,
            "global_batch_size": plan.global_batch_size,
            "plan": plan.to_dict(), "estimate": dict(estimate)}


@dataclass(frozen=True, kw_only=True)
class PlanDocument:
    """A validated plan document: the model, the plan, the cluster's shape and the estimate."""

    schema_version: int
    model: ModelSpec
    plan: ParallelPlan
    cluster_name: str
    gpu: str
    nodes: int
    gpus_per_node: int
    estimate: Mapping[str, Any]


def _get(doc: Mapping, key: str, where: str):
    if key not in doc:
        raise InputError(f"{where}.{key}", None, "missing required key")
    return doc[key]


def read_plan_document(doc: Any, where: str = "plan") -> PlanDocument:
    """Validate a parsed plan document (any schema version this tool wrote) and rebuild its
    objects. Raises :class:`InputError` naming the field (``plan.model.hidden_size``,
    ``plan.plan.tp`` …) for a missing, unknown or out-of-range value, or for a plan that
    breaks Megatron's rules on its cluster."""
    if not isinstance(doc, Mapping):
        raise InputError(where, type(doc).__name__, "must be a mapping (a plan.json object)")
    version = doc.get("schema_version", 0)
    if version not in (0, SCHEMA_VERSION):
        raise InputError(f"{where}.schema_version", version,
                         f"unsupported; this tool reads 0..{SCHEMA_VERSION}")
    model_data = _get(doc, "model", where)
    if not isinstance(model_data, Mapping):
        raise InputError(f"{where}.model", type(model_data).__name__, "must be a mapping")
    for key in model_data:
        if not isinstance(key, str):
            raise InputError(f"{where}.model", key, "keys must be strings")
    model = make_model(**dict(model_data))
    estimate = _get(doc, "estimate", where)
    if not isinstance(estimate, Mapping):
        raise InputError(f"{where}.estimate", type(estimate).__name__, "must be a mapping")
    for key in SUMMARY_KEYS:   # shown in the launch script's header
        val = _get(estimate, key, f"{where}.estimate")
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not (
                math.isfinite(val) and val >= 0):
            raise InputError(f"{where}.estimate.{key}", val, "must be a finite number >= 0")
    plan_data = _get(doc, "plan", where) if version else _get(estimate, "config",
                                                                  f"{where}.estimate")
    plan = plan_from_dict(plan_data, f"{where}.plan." if version else f"{where}.estimate.config.")
    cluster = _get(doc, "cluster", where)
    if not isinstance(cluster, Mapping):
        raise InputError(f"{where}.cluster", type(cluster).__name__, "must be a mapping")
    nodes = v.int_in_range(f"{where}.cluster.nodes", _get(cluster, "nodes", f"{where}.cluster"),
                           key="nodes")
    gpn = v.int_in_range(f"{where}.cluster.gpus_per_node",
                         _get(cluster, "gpus_per_node", f"{where}.cluster"), key="gpus_per_node")
    names = {key: v.display_name(f"{where}.cluster.{key}", cluster.get(key, "unknown"))
             for key in ("name", "gpu")}
    check_plan(model, plan, nodes * gpn)
    return PlanDocument(schema_version=version, model=model, plan=plan,
                        cluster_name=names["name"], gpu=names["gpu"], nodes=nodes,
                        gpus_per_node=gpn, estimate=estimate)
