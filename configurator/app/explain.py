"""``configurator explain``: where two saved plans' time and memory differ."""

from __future__ import annotations

import math
from dataclasses import dataclass

from configurator.core import validate as v
from configurator.core.document import read_plan_document
from configurator.core.errors import InputError
from configurator.core.plan import PLAN_FIELDS


@dataclass(frozen=True)
class ExplainRow:
    """One compared figure: ``kind`` ``time`` or ``time per stage`` (seconds),
    ``throughput`` or ``memory`` (bytes), ``name``,
    the two values (None where a plan lacks the figure) and their difference."""

    kind: str
    name: str
    a: float | None
    b: float | None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a


@dataclass(frozen=True)
class Explanation:
    """The two plans (their one-line descriptions), the plan fields that differ and the
    compared figures, largest time difference first within each kind."""

    plan_a: str
    plan_b: str
    field_changes: list[tuple[str, object, object]]
    rows: list[ExplainRow]

    def to_dict(self) -> dict:
        return {"plan_a": self.plan_a, "plan_b": self.plan_b,
                "field_changes": [{"field": f, "a": a, "b": b}
                                  for f, a, b in self.field_changes],
                "rows": [{"kind": r.kind, "name": r.name, "a": r.a, "b": r.b,
                          "delta": r.delta} for r in self.rows]}


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and \
        math.isfinite(x) else None


def _per_stage(kind: str, sa, sb, suffix: str) -> list[ExplainRow]:
    """Rows ``stage s <key>`` for every key ending in ``suffix`` of the per-stage lists
    ``sa``/``sb`` (missing or malformed entries compare as absent)."""
    sa = sa if isinstance(sa, list) else []
    sb = sb if isinstance(sb, list) else []
    rows = []
    for s in range(max(len(sa), len(sb))):
        a = sa[s] if s < len(sa) and isinstance(sa[s], dict) else {}
        b = sb[s] if s < len(sb) and isinstance(sb[s], dict) else {}
        for key in dict.fromkeys([*a, *b]):
            if isinstance(key, str) and key.endswith(suffix):
                rows.append(ExplainRow(kind, f"stage {s} {key}", _number(a.get(key)),
                                       _number(b.get(key))))
    return rows


def explain_plans(path_a: str, path_b: str) -> Explanation:
    """Compare two plan documents (``plan.json`` of ``search --out``): iteration time and
    each term of its breakdown (compute, recompute, bubble, tp/cp/pp/dp communication,
    optimizer, schedule and placement), time per pipeline stage of the simulated schedule
    (forward, backward, busy, exposed data-parallel reduction, idle), throughput, and memory
    per pipeline stage (total and its parts). Raises :class:`InputError` naming the file's bad field."""
    docs = []
    for field, path in (("plan_a", path_a), ("plan_b", path_b)):
        data = v.load_mapping_file(field, path)
        docs.append(read_plan_document(data, where=field))
    ea, eb = (d.estimate for d in docs)
    pa, pb = (d.plan.to_dict() for d in docs)
    changes = [(f.name, pa[f.name], pb[f.name]) for f in PLAN_FIELDS
               if pa[f.name] != pb[f.name]]
    rows = [ExplainRow("time", "iteration_time_s", _number(ea.get("iteration_time_s")),
                       _number(eb.get("iteration_time_s")))]
    ba, bb = ea.get("time_breakdown_s") or {}, eb.get("time_breakdown_s") or {}
    if not isinstance(ba, dict) or not isinstance(bb, dict):
        raise InputError("estimate.time_breakdown_s", type(ba).__name__, "must be a mapping")
    terms = [ExplainRow("time", k, _number(ba.get(k)), _number(bb.get(k)))
             for k in dict.fromkeys([*ba, *bb])]
    terms.sort(key=lambda r: -abs(r.delta or 0.0))
    rows += terms
    rows += _per_stage("time per stage", ea.get("time_per_stage"), eb.get("time_per_stage"),
                       "_s")
    for key in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu"):
        rows.append(ExplainRow("throughput", key, _number(ea.get(key)), _number(eb.get(key))))
    rows.append(ExplainRow("memory", "peak_memory_bytes", _number(ea.get("peak_memory_bytes")),
                           _number(eb.get("peak_memory_bytes"))))
    rows += _per_stage("memory", ea.get("memory_per_stage"), eb.get("memory_per_stage"),
                       "_bytes")
    desc = [" ".join(f"{k}={d.plan.to_dict()[k]}" for k in ("tp", "pp", "dp", "cp", "vp",
                                                            "mbs", "recompute"))
            for d in docs]
    return Explanation(plan_a=desc[0], plan_b=desc[1], field_changes=changes, rows=rows)
