"""The engine: the memory and cost formulas applied to a whole search at speed.

The formulas (:mod:`memory_model`, :mod:`configurator.cost`) read as physics: each takes a
:class:`~configurator.core.plan_batch.PlanBatch` and gives bytes or seconds for every plan of
it, computed element by element. What makes a search of 10⁵–10⁶ plans fast lives here, and
changes no figure (every figure is computed plan by plan; the shortcuts only skip or share
work):

* **stage classes**: of a plan's pipeline ranks only one per class of what they hold is
  evaluated (:func:`configurator.core.layers.stage_class_arrays`; within a class the lowest
  rank holds the most microbatches in flight);
* **held terms**: above :data:`GROUP_ROWS_ABOVE` plans with a memory limit, a first pass
  prices weights, gradients and optimizer state alone; plans already over the limit keep that
  lower bound and only the others get their activations, adding them to the held bytes of
  the first pass (the same sum, in the same order);
* **row groups**: a layer's activation terms depend on a few columns
  (micro_batch_size, cp, tp, sequence_parallel, the recompute code, etp, ep (the busiest
  expert-parallel rank's routed tokens), the all-to-all overlap), so above
  :data:`GROUP_ROWS_ABOVE` plans they are computed once per distinct row
  (:func:`configurator.core.rows.row_groups`) and gathered back;
* **chunks**: batches are priced in slices of :data:`CHUNK_CANDIDATES` plans, bounding the
  temporaries (:func:`in_chunks`).

``tests/test_search_shortcuts.py`` holds the engine to the plain formulas: the same floats
with and without each shortcut, and a plan's peak equal to its worst stage.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from configurator.core.layers import stage_class_arrays
from configurator.core.model import ModelSpec
from configurator.core.plan_batch import PlanBatch
from configurator.core.rows import row_groups
from memory_model.estimate import (activation_memory, held_memory, plan_layer_terms,
                                   total_memory)

#: Plans above which :func:`peak_memory` groups them by their layer's inputs and, given a
#: limit, prices the held bytes first.
GROUP_ROWS_ABOVE = 1024

#: Plans priced at once by the memory model and the closed form: their temporaries take
#: about 1 KiB a plan, so a search of 10⁵–10⁶ plans (a cluster of 10⁵ GPUs) runs in slices
#: of this many. Every figure is computed row by row, so slicing changes none.
CHUNK_CANDIDATES = 1 << 16


def in_chunks(plans: PlanBatch, price: Callable):
    """``price(plans_slice, rows)`` (an array, or a dict of arrays, one entry per plan of the
    slice; ``rows``: the slice of ``plans`` it holds) computed on slices of
    :data:`CHUNK_CANDIDATES` plans and joined."""
    n = len(plans)
    if n <= CHUNK_CANDIDATES:
        return price(plans, slice(None))
    parts = [price(plans.take(slice(i, i + CHUNK_CANDIDATES)), slice(i, i + CHUNK_CANDIDATES))
             for i in range(0, n, CHUNK_CANDIDATES)]
    if isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


def peak_memory(model: ModelSpec, plans: PlanBatch, *, non_tn_fp8_gemm: bool = False,
                limit_bytes: float | None = None) -> np.ndarray:
    """Peak bytes over the pipeline ranks of every plan of ``plans`` (shape ``(len(plans),)``;
    :func:`memory_model.estimate.memory_arrays`' total, its layer split included).
    ``non_tn_fp8_gemm``: the GPU's. ``limit_bytes`` (a capacity): plans whose weights,
    gradients, optimizer state and fixed allowance alone exceed it get that figure, a lower
    bound above the limit, instead of their peak (module docstring, "held terms")."""
    classes = stage_class_arrays(model, pp=plans.pp, vp=plans.vp, first=plans.first,
                                 last=plans.last, account_embedding=plans.acct_emb,
                                 account_loss=plans.acct_loss, layout=plans.layout)
    ks = _classes_to_price(classes, plans.pp)
    n = len(plans)
    if limit_bytes is None or n <= GROUP_ROWS_ABOVE:
        return _peak(classes, ks, _held(model, plans, classes, ks, non_tn_fp8_gemm),
                     _activations(model, plans, classes, ks))
    held = _held(model, plans, classes, ks, non_tn_fp8_gemm)
    peak = _peak(classes, ks, held, None)
    keep = np.flatnonzero(peak <= limit_bytes)
    if len(keep) == n:
        return _peak(classes, ks, held, _activations(model, plans, classes, ks))
    if len(keep):
        sub = plans.take(keep)
        sub_classes = {k: np.take(v, keep, axis=0) for k, v in classes.items()}
        sub_held = {k: (np.take(h, keep), np.take(g, keep)) for k, (h, g) in held.items()}
        sub_ks = _classes_to_price(sub_classes, sub.pp)
        peak[keep] = _peak(sub_classes, sub_ks, sub_held,
                           _activations(model, sub, sub_classes, sub_ks))
    return peak


def _classes_to_price(classes: dict, pp) -> list[int]:
    """The stage classes whose ranks can hold a plan's peak: class 0 (the first rank), and
    a class that holds other layers than rank 0 or is the last rank for some plan (one
    holding what rank 0 holds, and not the last rank, has fewer microbatches in flight and
    no embedding: it is never above rank 0)."""
    last = np.asarray(pp) - 1
    return [k for k in range(classes["stage"].shape[1])
            if not k or np.any((classes["count"][:, k] > 0)
                               & ((classes["layers"][:, k] != classes["layers"][:, 0])
                                  | (classes["moe_layers"][:, k] != classes["moe_layers"][:, 0])
                                  | (classes["stage"][:, k] == last)))]


def _held(model, plans, classes, ks, non_tn_fp8_gemm) -> dict:
    """Per stage class ``k``: ``(held bytes, cp gather bytes)``
    (:func:`memory_model.estimate.held_memory`; held bytes summed weights, gradients,
    optimizer state)."""
    out = {}
    for k in ks:
        h = held_memory(model, plans, classes["stage"][:, k], classes["layers"][:, k],
                        classes["moe_layers"][:, k], non_tn_fp8_gemm)
        out[k] = (h["parameters_bytes"] + h["gradients_bytes"] + h["optimizer_bytes"],
                  h["cp_gather_bytes"])
    return out


def _activations(model, plans, classes, ks) -> dict:
    """Per stage class ``k``: the activation bytes of its lowest rank, the layer terms computed
    once for all classes (per distinct row above :data:`GROUP_ROWS_ABOVE` plans)."""
    terms = _layer_terms(model, plans)
    return {k: activation_memory(model, plans, classes["stage"][:, k], classes["layers"][:, k],
                                 classes["moe_layers"][:, k], terms) for k in ks}


def _layer_terms(model, plans: PlanBatch) -> dict:
    """:func:`memory_model.estimate.plan_layer_terms` of ``plans``; above
    :data:`GROUP_ROWS_ABOVE` plans computed for one plan per distinct row of the columns they
    depend on and gathered back (the same values)."""
    rows = None
    if len(plans) > GROUP_ROWS_ABOVE:
        rows = row_groups(plans.mbs, plans.cp, plans.tp, plans.sequence_parallel,
                          plans.recompute_code, plans.etp, plans.ep,
                          plans.overlap_moe_expert_parallel_comm)
    if rows is None:
        return plan_layer_terms(model, plans)
    first, inverse = rows
    t = plan_layer_terms(model, plans.take(first))
    return {k: v[inverse] if np.ndim(v) else v for k, v in t.items()}


def _peak(classes: dict, ks: list[int], held: dict, activations: dict | None) -> np.ndarray:
    """The largest total over the stage classes ``ks`` (:func:`total_memory`; without
    ``activations``, the lower bound of the held bytes and the allowance alone)."""
    peak = None
    for k in ks:
        held_bytes, gather = held[k]
        tot = total_memory(held_bytes, 0.0 if activations is None else activations[k], gather)
        tot = np.where(classes["count"][:, k] > 0, tot, 0.0)
        peak = tot if peak is None else np.maximum(peak, tot)
    return peak
