"""Column store of plans: one numpy array per per-candidate plan field, evaluated all at once.

The columns are the :data:`~configurator.core.plan.PLAN_FIELDS` with ``per_candidate`` set
(choices stored as integer codes: their index in the field's ``choices``; free text, the
pipeline layout, as its :func:`~configurator.core.layers.layout_code`); the other fields
are scalars shared by every plan. Both are reachable as attributes by field name or alias
(``c.tp``, ``c.mbs``, ``c.micro_batch_size``, ``c.precision``).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from configurator.core.layers import layout_code, layout_text
from configurator.core.plan import PLAN_FIELDS, ParallelPlan
from configurator.core.plan_terms import param_gather_overlap, recompute_code
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


#: The layout fields of a row of :attr:`Candidates.group_keys`, in order.
GROUP_KEY_FIELDS = ("tp", "cp", "dp", "pp")


class Candidates:
    """Plans as parallel arrays (all the same length) plus shared scalars.

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
            raise ValueError(f"Candidates needs fields {sorted(missing)}")
        self.columns = {f.name: np.asarray(columns[f.name], dtype=column_dtype(f))
                        for f in COLUMN_FIELDS}
        self.shared = {f.name: shared[f.name] for f in SHARED_FIELDS}
        self.group = group
        self.group_keys = group_keys

    def __getattr__(self, name: str):
        f = _BY_NAME.get(name)
        if f is None:
            raise AttributeError(name)
        store = self.columns if f.per_candidate else self.shared
        return store[f.name]

    @property
    def num_microbatches(self) -> np.ndarray:
        return self.global_batch_size // (self.mbs * self.dp)

    @property
    def recompute_code(self) -> np.ndarray:
        """Each plan's recompute code (:func:`configurator.core.plan_terms.recompute_code`: 0 none,
        2 full, the module bits of ``recompute_modules`` for selective)."""
        return recompute_code(self.recompute, self.recompute_modules)

    @property
    def stores_scores(self) -> bool:
        return self.attention_backend in SCORE_STORING_BACKENDS

    def __len__(self) -> int:
        return len(self.columns["tp"])

    def take(self, idx) -> "Candidates":
        """The plans ``idx`` selects (a slice: views; integer indices or a boolean mask:
        copies)."""
        if isinstance(idx, slice):
            sel = lambda a: a[idx]   # noqa: E731
        else:
            idx = np.asarray(idx)
            if idx.dtype == bool:
                idx = np.flatnonzero(idx)
            sel = lambda a: np.take(a, idx, axis=0)   # noqa: E731
        return Candidates({k: sel(a) for k, a in self.columns.items()}, self.shared,
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
    def from_plans(cls, plans: list[ParallelPlan]) -> "Candidates":
        """Plans that share their non-candidate fields, as one column store."""
        parts = [cls.from_plan(p) for p in plans]
        cols = {f.name: np.concatenate([c.columns[f.name] for c in parts])
                for f in COLUMN_FIELDS}
        return cls(cols, parts[0].shared)

    @classmethod
    def from_plan(cls, plan: ParallelPlan) -> "Candidates":
        cols = {}
        for f in COLUMN_FIELDS:
            val = getattr(plan, f.name)
            cols[f.name] = np.array([column_value(f, val)], dtype=column_dtype(f))
        return cls(cols, {f.name: getattr(plan, f.name) for f in SHARED_FIELDS})
