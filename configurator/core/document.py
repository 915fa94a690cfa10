"""The plan document (``plan.json``): what a plan was made for and what it predicts.

Schema (``schema_version`` 1)::

    {"schema_version": 1,
     "tool": {"name": "configurator", "version": "0.2.0"},
     "model": {ModelSpec fields},                  # configurator.core.model
     "cluster": {"name", "gpu", "gpus_per_node", "nodes", "num_gpus"},
     "seq_length": int, "precision": str, "global_batch_size": int,
     "plan": {ParallelPlan fields},                # configurator.core.plan.PLAN_FIELDS
     "estimate": {Evaluation.to_dict()},           # predicted figures
     "placement": {                                # optional: where each rank runs
         "hosts": [str, ...],                      # host of node_rank 0, 1, ... (nodes)
         "gpu_order": [[int, ...], ...],           # per node_rank, the physical GPU index
                                                   # (PCI bus order) of local rank 0..G-1
         "excluded_hosts": [str, ...],             # hosts left out of the job
         "iteration_time_s": float | null,         # predicted with this placement (s)
         "default_iteration_time_s": float | null, # predicted with the default placement
         "random_median_iteration_time_s": float | null,  # median over random placements
         "method": "default" | "optimized" | "file"}}

``configurator launch --plan`` reads it back (:func:`read_plan_document`), validating every
field as the CLI would; documents written before ``schema_version`` existed (no such key:
``model``, ``cluster`` and ``estimate.config``) are read as version 0. ``placement`` is
optional in version 1 (a document without one launches with node ranks and the master
address taken from the environment); build it with :func:`placement_record`. Global rank r
runs on ``hosts[r // G]``, physical GPU ``gpu_order[r // G][r % G]`` (G = gpus_per_node).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

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
#: How a placement was chosen: the cluster's own order, the search's optimizer, or a file.
PLACEMENT_METHODS = ("default", "optimized", "file")
#: Predicted iteration times (seconds, or null) a placement record carries.
PLACEMENT_FIGURES = ("iteration_time_s", "default_iteration_time_s",
                     "random_median_iteration_time_s")
PLACEMENT_KEYS = ("hosts", "gpu_order", "excluded_hosts", *PLACEMENT_FIGURES, "method")
#: What the placement search did (kept in an estimate's ``placement``, not in ``plan.json``'s):
#: distinct placements priced, its wall-clock seconds, whether it priced every placement.
SEARCH_FIGURES = ("evaluations", "wall_time_s", "exhaustive")
#: Keys of an estimate's ``placement`` (``Evaluation.to_dict()``), in the order written.
ESTIMATE_PLACEMENT_KEYS = ("hosts", "gpu_order", "excluded_hosts", "method", *PLACEMENT_FIGURES,
                           *SEARCH_FIGURES)
#: A host name, matched in full (``re.fullmatch``): letters, digits, '.', '-' and '_', not
#: starting with a punctuation character; safe unquoted in a bash ``case`` pattern.
HOST_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_HOST_CHARS = 253


def check_host_name(field: str, value: Any) -> str:
    """A host name: a string of at most 253 characters matching :data:`HOST_NAME_RE` in
    full. Returns it; raises :class:`InputError` naming ``field``."""
    if (not isinstance(value, str) or len(value) > MAX_HOST_CHARS
            or not HOST_NAME_RE.fullmatch(value)):
        raise InputError(field, value, "must be a host name of letters, digits, '.', '-' and "
                                       "'_' (starting with a letter or digit)")
    return value


@dataclass(frozen=True, kw_only=True)
class PlacementRecord:
    """Where each rank of a plan runs: the placement search's result
    (:func:`configurator.search.placement_search.place_plan`), an evaluation's ``placement``,
    the plan document's ``placement`` (validated by :func:`read_placement`) and what the
    launch scripts enforce.

    ``hosts``: host name of node_rank 0..nodes-1. ``gpu_order``: per node_rank, the physical
    GPU index (PCI bus order, as ``CUDA_VISIBLE_DEVICES`` with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``)
    of local rank 0..G-1, a permutation of 0..G-1. ``excluded_hosts``: hosts kept out of the
    job (disjoint from ``hosts``). Figures: predicted iteration times in seconds, or None.
    ``method``: one of :data:`PLACEMENT_METHODS`. :data:`SEARCH_FIGURES`: what the search
    did (``evaluations`` placements priced, ``wall_time_s`` seconds, ``exhaustive``: every
    placement priced); an estimate shows them, ``plan.json`` does not (read back: 0, 0.0,
    False).
    """

    hosts: tuple[str, ...]
    gpu_order: tuple[tuple[int, ...], ...]
    excluded_hosts: tuple[str, ...] = ()
    iteration_time_s: float | None = None
    default_iteration_time_s: float | None = None
    random_median_iteration_time_s: float | None = None
    method: str = "default"
    evaluations: int = 0
    wall_time_s: float = 0.0
    exhaustive: bool = False

    @property
    def nodes(self) -> int:
        return len(self.hosts)

    @property
    def gpus_per_node(self) -> int:
        return len(self.gpu_order[0])

    def rank_location(self, rank: int) -> tuple[str, int]:
        """``(host, physical GPU index)`` of global rank ``rank`` (0..nodes*G-1)."""
        node, local = divmod(rank, self.gpus_per_node)
        return self.hosts[node], self.gpu_order[node][local]

    def to_dict(self) -> dict:
        """The ``plan.json`` ``placement`` object (lists, keys in :data:`PLACEMENT_KEYS`
        order)."""
        return {"hosts": list(self.hosts), "gpu_order": [list(p) for p in self.gpu_order],
                "excluded_hosts": list(self.excluded_hosts),
                **{k: getattr(self, k) for k in PLACEMENT_FIGURES}, "method": self.method}

    def to_estimate_dict(self) -> dict:
        """An estimate's ``placement`` object: :meth:`to_dict`'s keys and the search's
        figures, in :data:`ESTIMATE_PLACEMENT_KEYS` order."""
        return {"hosts": list(self.hosts), "gpu_order": [list(p) for p in self.gpu_order],
                "excluded_hosts": list(self.excluded_hosts), "method": self.method,
                **{k: getattr(self, k) for k in (*PLACEMENT_FIGURES, *SEARCH_FIGURES)}}

    def describe(self) -> str:
        """One line, e.g. ``optimized, 16 hosts, excluded cnode2-003; predicted 1.234 s per
        iteration (default placement 1.301 s, random median 1.322 s)``; the figures only
        when known."""
        excluded = (f"excluded {', '.join(self.excluded_hosts)}" if self.excluded_hosts
                    else "no host excluded")
        line = f"{self.method}, {self.nodes} hosts, {excluded}"
        if self.iteration_time_s is not None:
            others = [f"{name} {val:.3f} s" for name, val in (
                ("default placement", self.default_iteration_time_s),
                ("random median", self.random_median_iteration_time_s)) if val is not None]
            line += (f"; predicted {self.iteration_time_s:.3f} s per iteration"
                     + (f" ({', '.join(others)})" if others else ""))
        return line


def _host_list(field: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InputError(field, value, "must be a list of host names")
    hosts = tuple(check_host_name(f"{field}[{i}]", h) for i, h in enumerate(value))
    seen: dict[str, int] = {}
    for i, h in enumerate(hosts):
        if h in seen:
            raise InputError(f"{field}[{i}]", h, f"repeats {field}[{seen[h]}]; every host "
                                                 "appears once")
        seen[h] = i
    return hosts


def _figure(field: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise InputError(field, value, "must be a finite number >= 0 (seconds) or null")
    return float(value)


def read_placement(data: Any, where: str = "placement", *, nodes: int | None = None,
                   gpus_per_node: int | None = None) -> PlacementRecord:
    """Validate a ``placement`` object (keys :data:`PLACEMENT_KEYS`; ``hosts`` and
    ``gpu_order`` required, the others default to ``[]``, null and ``"default"``).

    ``hosts``: ``nodes`` distinct host names (:func:`check_host_name`); ``gpu_order``:
    ``nodes`` lists, each a permutation of ``0..gpus_per_node-1``; ``excluded_hosts``:
    distinct host names, none of them in ``hosts``; figures finite >= 0 or null; ``method``
    one of :data:`PLACEMENT_METHODS`. ``nodes``/``gpus_per_node`` None: taken from
    ``hosts`` and ``gpu_order[0]``. Raises :class:`InputError` naming the field
    (``placement.hosts[3]``), the value and the rule.
    """
    v.exact_keys(where, data, ("hosts", "gpu_order"),
                 ("excluded_hosts", *PLACEMENT_FIGURES, "method"))
    hosts = _host_list(f"{where}.hosts", data["hosts"])
    if not hosts:
        raise InputError(f"{where}.hosts", [], "must name at least one host")
    if nodes is not None and len(hosts) != nodes:
        raise InputError(f"{where}.hosts", list(hosts),
                         f"must name exactly nodes={nodes} hosts (one per node_rank)")
    order = data["gpu_order"]
    if isinstance(order, (str, bytes)) or not isinstance(order, Sequence):
        raise InputError(f"{where}.gpu_order", order, "must be a list of GPU index lists")
    if len(order) != len(hosts):
        raise InputError(f"{where}.gpu_order", order, f"must hold one list per host "
                                                      f"({len(hosts)})")
    gpus = gpus_per_node
    perms = []
    for n, perm in enumerate(order):
        field = f"{where}.gpu_order[{n}]"
        if isinstance(perm, (str, bytes)) or not isinstance(perm, Sequence):
            raise InputError(field, perm, "must be a list of GPU indices")
        if gpus is None:
            gpus = len(perm)
        for i, d in enumerate(perm):
            if isinstance(d, bool) or not isinstance(d, int):
                raise InputError(f"{field}[{i}]", d, "must be an integer GPU index")
        if not perm or sorted(perm) != list(range(gpus)):
            raise InputError(field, perm, f"must be a permutation of 0..{gpus - 1} (the GPU "
                                          f"index of local rank 0..{gpus - 1})"
                             if gpus else "must list at least one GPU index")
        perms.append(tuple(perm))
    excluded = _host_list(f"{where}.excluded_hosts", data.get("excluded_hosts", []))
    for i, h in enumerate(excluded):
        if h in hosts:
            raise InputError(f"{where}.excluded_hosts[{i}]", h,
                             f"is hosts[{hosts.index(h)}]; an excluded host cannot run a rank")
    figures = {k: _figure(f"{where}.{k}", data.get(k)) for k in PLACEMENT_FIGURES}
    method = v.choice(f"{where}.method", data.get("method", "default"), PLACEMENT_METHODS)
    return PlacementRecord(hosts=hosts, gpu_order=tuple(perms), excluded_hosts=excluded,
                           method=method, **figures)


def placement_record(hosts: Sequence[str], gpu_order: Sequence[Sequence[int]],
                     excluded_hosts: Sequence[str] = (), method: str = "default", *,
                     iteration_time_s: float | None = None,
                     default_iteration_time_s: float | None = None,
                     random_median_iteration_time_s: float | None = None) -> dict:
    """The ``plan.json`` ``placement`` object, validated (:func:`read_placement`).

    ``hosts``: host of node_rank 0, 1, ...; ``gpu_order``: per node_rank, the physical GPU
    index of local rank 0..G-1; ``excluded_hosts``: hosts kept out; ``method``: ``default``,
    ``optimized`` or ``file``; figures: predicted iteration times in seconds (this placement,
    the default placement, the median of random placements) or None. Give the result to
    :func:`plan_document` (``placement=``) and to ``launchers.launch_files`` /
    ``write_launch_files`` (``placement=``). Raises :class:`InputError` (field
    ``placement...``).
    """
    data = {"hosts": list(hosts), "gpu_order": [list(p) for p in gpu_order],
            "excluded_hosts": list(excluded_hosts), "iteration_time_s": iteration_time_s,
            "default_iteration_time_s": default_iteration_time_s,
            "random_median_iteration_time_s": random_median_iteration_time_s,
            "method": method}
    return read_placement(data).to_dict()


def as_placement(placement: PlacementRecord | Mapping[str, Any], where: str = "placement", *,
                 nodes: int | None = None,
                 gpus_per_node: int | None = None) -> PlacementRecord:
    """``placement`` checked (:func:`read_placement`, against ``nodes``/``gpus_per_node``
    when given): a :class:`PlacementRecord` comes back unchanged, a ``placement`` object as
    the record it validates to."""
    if isinstance(placement, PlacementRecord):
        read_placement(placement.to_dict(), where, nodes=nodes, gpus_per_node=gpus_per_node)
        return placement
    return read_placement(placement, where, nodes=nodes, gpus_per_node=gpus_per_node)


def plan_document(*, model: ModelSpec, cluster: Mapping[str, Any], plan: ParallelPlan,
                  estimate: Mapping[str, Any],
                  placement: PlacementRecord | Mapping[str, Any] | None = None) -> dict:
    """The plan document of ``plan`` for ``model`` on ``cluster`` (its ``to_dict``), with
    ``placement`` (:func:`placement_record`) when given; a placement is checked against
    ``cluster["nodes"]`` and ``cluster["gpus_per_node"]`` (:class:`InputError`)."""
    doc = {"schema_version": SCHEMA_VERSION,
           "tool": {"name": TOOL_NAME, "version": tool_version()},
           "model": model.to_dict(), "cluster": dict(cluster),
           "seq_length": model.seq_length, "precision": plan.precision,
           "global_batch_size": plan.global_batch_size,
           "plan": plan.to_dict(), "estimate": dict(estimate)}
    if placement is not None:
        doc["placement"] = as_placement(placement, nodes=cluster.get("nodes"),
                                        gpus_per_node=cluster.get("gpus_per_node")).to_dict()
    return doc


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
    placement: PlacementRecord | None = None


def _get(doc: Mapping, key: str, where: str):
    if key not in doc:
        raise InputError(f"{where}.{key}", None, "missing required key")
    return doc[key]


def read_plan_document(doc: Any, where: str = "plan") -> PlanDocument:
    """Validate a parsed plan document (any schema version this tool wrote) and rebuild its
    objects. Raises :class:`InputError` naming the field (``plan.model.hidden_size``,
    ``plan.plan.tp``, ``plan.placement.hosts[3]`` …) for a missing, unknown or out-of-range
    value, for a plan that breaks Megatron's rules on its cluster, or for a placement that
    does not fit the cluster's ``nodes`` × ``gpus_per_node`` (:func:`read_placement`)."""
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
    placement = None
    if doc.get("placement") is not None:
        placement = read_placement(doc["placement"], f"{where}.placement", nodes=nodes,
                                   gpus_per_node=gpn)
    return PlanDocument(schema_version=version, model=model, plan=plan,
                        cluster_name=names["name"], gpu=names["gpu"], nodes=nodes,
                        gpus_per_node=gpn, estimate=estimate, placement=placement)
