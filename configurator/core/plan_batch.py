"""The plan batch: plans as one numpy array per per-candidate plan field, priced all at once.

:class:`PlanBatch` is the one form in which the memory model (:mod:`memory_model`) and the
cost model (:mod:`configurator.cost`) take plans; a single plan is a batch of one
(:meth:`PlanBatch.from_plan`). Its attributes are generated from the plan schema
(:data:`~configurator.core.plan.PLAN_FIELDS`), as the CLI options, the JSON keys and the table
columns are: the fields with ``per_candidate`` set are columns (numpy arrays, one entry per
plan: choices stored as integer codes, their index in the field's ``choices``; free text, the
pipeline layout, as its :func:`~configurator.core.layers.layout_code`); the other fields are
scalars shared by every plan of the batch. Each is reachable by field name or alias
(``b.tp``, ``b.mbs``, ``b.micro_batch_size``, ``b.precision``). The terms the models derive from
fields alone (microbatches, the recompute code, the optimizer's bytes per parameter, ...) are
properties, documented where they are defined (:mod:`configurator.core.plan_terms`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from configurator.core.layers import layout_code, layout_text
from configurator.core.plan import PLAN_FIELD, PLAN_FIELDS, ParallelPlan
from configurator.core.plan_terms import (fp8_weights_gathered, main_grad_bytes,
                                          optimizer_state_bytes, param_gather_overlap,
                                          recompute_code, tp_comm_overlapped)
from configurator.core.plan_values import SCORE_STORING_BACKENDS

COLUMN_FIELDS = tuple(f for f in PLAN_FIELDS if f.per_candidate)
SHARED_FIELDS = tuple(f for f in PLAN_FIELDS if not f.per_candidate)
_BY_NAME = {**{f.name: f for f in PLAN_FIELDS}, **{f.alias: f for f in PLAN_FIELDS if f.alias}}


def column_dtype(f) -> type:
    """A column's numpy dtype: booleans, else integers (numbers, choice codes, layout
    codes)."""
    return bool if f.type is bool else np.int64


def column_value(f, value: Any):
    """The column entry of plan field ``f``'s ``value``: a choice's index, a free text's
    :func:`configurator.core.layers.layout_code`, else the value."""
    if f.choices:
        return f.choices.index(value)
    return layout_code(value) if f.type is str else value


def field_value(f, entry: Any) -> Any:
    """The plan value of column entry ``entry`` (:func:`column_value` undone)."""
    if f.choices:
        return f.choices[int(entry)]
    return layout_text(entry) if f.type is str else f.type(entry)


#: The layout fields of a row of :attr:`PlanBatch.group_keys`, in order.
GROUP_KEY_FIELDS = ("tp", "cp", "dp", "pp")


class PlanBatch:
    """Plans as parallel arrays (all the same length) plus shared scalars (module docstring).

    ``columns``: field name -> array (codes for fields with choices); ``shared``: field name ->
    value for the non-candidate fields. ``group`` (optional): index into ``group_keys`` (rows
    of :data:`GROUP_KEY_FIELDS`) per plan, so collective figures are computed once per layout.
    """

    __slots__ = ("columns", "shared", "group", "group_keys")

    def __init__(self, columns: Mapping[str, np.ndarray], shared: Mapping[str, Any], *,
                 group: np.ndarray | None = None, group_keys: np.ndarray | None = None):
        missing = {f.name for f in COLUMN_FIELDS} - set(columns)
        missing |= {f.name for f in SHARED_FIELDS} - set(shared)
        if missing:
            raise ValueError(f"PlanBatch needs fields {sorted(missing)}")
        self.columns = {f.name: np.asarray(columns[f.name], dtype=column_dtype(f))
                        for f in COLUMN_FIELDS}
        self.shared = {f.name: shared[f.name] for f in SHARED_FIELDS}
        self.group = group
        self.group_keys = group_keys

    @property
    def num_microbatches(self) -> np.ndarray:
        """Microbatches per iteration and pipeline, ``global_batch_size // (mbs·dp)``
        (Megatron's ``get_num_microbatches``; the rules require the division to be exact)."""
        return self.global_batch_size // (self.mbs * self.dp)

    @property
    def recompute_code(self) -> np.ndarray:
        """Each plan's recompute code (:func:`configurator.core.plan_terms.recompute_code`: 0 none,
        2 full, the module bits of ``recompute_modules`` for selective)."""
        return recompute_code(self.recompute, self.recompute_modules)

    @property
    def stores_scores(self) -> bool:
        """Whether the attention backend keeps the ``s×s`` scores for backward (the local,
        unfused backends of :data:`~configurator.core.plan_values.SCORE_STORING_BACKENDS`)."""
        return self.attention_backend in SCORE_STORING_BACKENDS

    @property
    def fp8_weights_gathered(self) -> np.ndarray:
        """Whether each plan keeps and gathers its GEMM weights in FP8 only
        (:func:`configurator.core.plan_terms.fp8_weights_gathered`)."""
        return fp8_weights_gathered(self.fp8_param_gather, self.distributed_optimizer,
                                    self.precision)

    @property
    def main_grad_bytes(self) -> float:
        """Bytes of one main gradient, what the gradient buffer holds and the data-parallel
        reduction moves (:func:`configurator.core.plan_terms.main_grad_bytes`: 4, or 2 with
        FP16, ``--grad-reduce-in-bf16`` or ``--main-grads-dtype bf16``)."""
        return main_grad_bytes(self.precision, self.grad_reduce_in_bf16, self.main_grads_dtype)

    @property
    def tp_comm_overlap_on(self) -> np.ndarray:
        """Whether each plan's tensor-parallel communication overlap takes effect
        (:func:`configurator.core.plan_terms.tp_comm_overlapped`)."""
        return tp_comm_overlapped(self.tp_comm_overlap, self.tp, self.sequence_parallel,
                                  self.attention_backend)

    @property
    def optimizer_bytes_per_parameter(self) -> float:
        """Optimizer-state bytes per parameter before sharding
        (:func:`configurator.core.plan_terms.optimizer_state_bytes`: 12 for Adam's FP32 master
        weight, m and v; less with the precision-aware optimizer's dtypes)."""
        return optimizer_state_bytes(self)

    @property
    def world_size(self) -> np.ndarray:
        """GPUs of each plan, ``tp·pp·dp·cp`` (Megatron's world size)."""
        return self.tp * self.pp * self.dp * self.cp

    #: The fields of :meth:`layer_split`, in order.
    LAYER_SPLIT_FIELDS = ("pp", "vp", "decoder_first_pipeline_num_layers",
                          "decoder_last_pipeline_num_layers",
                          "account_for_embedding_in_pipeline_split",
                          "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout")

    def layer_split(self, i: int = 0) -> tuple:
        """Plan ``i``'s ``(pp, vp, first, last, account_embedding, account_loss, layout)``:
        the arguments of :func:`configurator.core.layers.rank_layer_counts` (the layout as
        its text)."""
        out = []
        for name in self.LAYER_SPLIT_FIELDS:
            f = PLAN_FIELD[name]
            out.append(field_value(f, self.columns[name][i]) if f.per_candidate
                       else self.shared[name])
        return tuple(out)

    def __len__(self) -> int:
        return len(self.columns["tp"])

    def take(self, idx) -> "PlanBatch":
        """The plans ``idx`` selects (a slice: views; integer indices or a boolean mask:
        copies)."""
        if isinstance(idx, slice):
            sel = lambda a: a[idx]   # noqa: E731
        else:
            idx = np.asarray(idx)
            if idx.dtype == bool:
                idx = np.flatnonzero(idx)
            sel = lambda a: np.take(a, idx, axis=0)   # noqa: E731
        return PlanBatch({k: sel(a) for k, a in self.columns.items()}, self.shared,
                          group=None if self.group is None else sel(self.group),
                          group_keys=self.group_keys)

    def plan(self, i: int) -> ParallelPlan:
        """Plan ``i`` as a :class:`ParallelPlan`. The shared ``overlap_param_gather`` applies
        only to plans with the distributed optimizer (Megatron's flag needs it)."""
        kw = dict(self.shared)
        for f in COLUMN_FIELDS:
            val = self.columns[f.name][i]
            kw[f.name] = field_value(f, val)
        kw["overlap_param_gather"] = bool(param_gather_overlap(kw["overlap_param_gather"],
                                                               kw["distributed_optimizer"]))
        return ParallelPlan(**kw)

    @classmethod
    def from_plans(cls, plans: list[ParallelPlan]) -> "PlanBatch":
        """Plans that share their non-candidate fields, as one column store."""
        parts = [cls.from_plan(p) for p in plans]
        cols = {f.name: np.concatenate([c.columns[f.name] for c in parts])
                for f in COLUMN_FIELDS}
        return cls(cols, parts[0].shared)

    @classmethod
    def from_plan(cls, plan: ParallelPlan) -> "PlanBatch":
        cols = {}
        for f in COLUMN_FIELDS:
            val = getattr(plan, f.name)
            cols[f.name] = np.array([column_value(f, val)], dtype=column_dtype(f))
        return cls(cols, {f.name: getattr(plan, f.name) for f in SHARED_FIELDS})

    @classmethod
    def of(cls, **fields: Any) -> "PlanBatch":
        """A batch from plan values by field name or alias, each a scalar or a sequence of one
        length (the number of plans); fields not given take their schema default, choices
        and layouts are given as their values (``recompute="full"``), not codes. Raises
        :class:`ValueError` for an unknown field or sequences of different lengths."""
        unknown = sorted(set(fields) - set(_BY_NAME))
        if unknown:
            raise ValueError(f"PlanBatch.of: unknown plan field(s) {unknown}")
        values = {_BY_NAME[k].name: v for k, v in fields.items()}
        lengths = {len(v) for k, v in values.items()
                   if PLAN_FIELD[k].per_candidate and np.ndim(v) == 1}
        if len(lengths) > 1:
            raise ValueError(f"PlanBatch.of: columns of different lengths {sorted(lengths)}")
        n = lengths.pop() if lengths else 1
        cols = {}
        for f in COLUMN_FIELDS:
            v = values.get(f.name, f.default)
            seq = list(v) if np.ndim(v) == 1 else [v] * n
            cols[f.name] = np.array([column_value(f, x.item() if hasattr(x, "item") else x)
                                     for x in seq], dtype=column_dtype(f))
        return cls(cols, {f.name: values.get(f.name, f.default) for f in SHARED_FIELDS})


def _field_property(f) -> property:
    """The attribute of plan field ``f``: its column (per-candidate fields) or shared value."""
    store = "columns" if f.per_candidate else "shared"
    name = f.name

    def get(self):
        return getattr(self, store)[name]

    where = "column, one entry per plan" if f.per_candidate else "shared by every plan"
    megatron = f" (Megatron ``{f.megatron_name}``)" if f.megatron_name else ""
    return property(get, doc=f"{f.help}{megatron}: {where}.")


for _f in PLAN_FIELDS:
    _prop = _field_property(_f)
    PlanBatch.__annotations__[_f.name] = "np.ndarray" if _f.per_candidate else _f.type
    for _name in (_f.name, _f.alias):
        if _name:
            if hasattr(PlanBatch, _name):   # a field named like a method or derived term
                raise TypeError(f"plan field {_name!r} shadows PlanBatch.{_name}")
            setattr(PlanBatch, _name, _prop)
del _f, _prop, _name
