"""Resolve what the user named (model, cluster, nodes, sequence length, measured topology)
into core objects: a :class:`~configurator.core.model.ModelSpec` and a
:class:`~topology.cluster.Cluster` whose links are the measured ones where given."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec, load_model
from topology.cluster import Cluster, load_cluster


@dataclass(frozen=True, kw_only=True)
class JobInputs:
    """What a plan is made for, as named by the user (references, not yet loaded).

    ``model``: preset, YAML/JSON file or HF ``config.json``; ``cluster``: preset or file;
    ``nodes``: node count (default the cluster's own, or the topology's hosts);
    ``topology``: a measured topology file; ``exclude_flagged``: plan only on the hosts the
    topology's audit does not recommend draining.
    """

    model: str
    cluster: str
    nodes: int | None = None
    seq_length: int | None = None
    topology: str | None = None
    exclude_flagged: bool = False


def healthy_topology(topo):
    """``topo`` without the hosts its audit recommends draining (and their links)."""
    from topology.audit import audit

    drop = set(audit(topo).drain_hosts)
    return dataclasses.replace(
        topo, hosts=tuple(h for h in topo.hosts if h not in drop),
        links=tuple(lk for lk in topo.links if lk.src not in drop and lk.dst not in drop),
        collectives=tuple(c for c in topo.collectives if not drop & set(c.hosts)),
        missing=tuple(m for m in topo.missing if m.src not in drop and m.dst not in drop))


def resolve(inputs: JobInputs, *, exclude_flagged: bool | None = None) -> tuple[ModelSpec,
                                                                                 Cluster]:
    """Load the model and build the cluster. With ``exclude_flagged`` (default
    ``inputs.exclude_flagged``) the cluster keeps only the hosts the audit of the topology
    does not flag (the world size shrinks). Raises :class:`InputError`."""
    exclude = inputs.exclude_flagged if exclude_flagged is None else exclude_flagged
    model = load_model(inputs.model)
    if inputs.seq_length is not None:
        model = model.with_seq_length(inputs.seq_length)
    if inputs.nodes is not None:
        v.int_in_range("nodes", inputs.nodes)
    if not inputs.topology:
        if exclude:
            raise InputError("exclude_flagged", True, "needs --topology FILE")
        return model, load_cluster(inputs.cluster, inputs.nodes)
    from topology.topofile import apply_topology
    from topology.topofile_io import load_topology

    topo = load_topology(inputs.topology)
    nodes = inputs.nodes
    if exclude:
        topo = healthy_topology(topo)
        nodes = len(topo.hosts)
    return model, apply_topology(load_cluster(inputs.cluster, nodes), topo)
