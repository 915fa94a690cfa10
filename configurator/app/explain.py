"""``configurator explain``: where two saved plans' time and memory differ."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from configurator.core import validate as v
from configurator.core.document import SCHEMA_VERSION, read_plan_document
from configurator.core.errors import InputError
from configurator.core.plan import PLAN_FIELDS
from configurator.search.evaluate import TIME_TERMS

#: Time terms the headline names: those that differ most.
HEADLINE_TERMS = 3
#: ``FILE:N``: entry N (1 = the best) of a ``plans.json``.
_ENTRY_RE = re.compile(r"^(?P<path>.+):(?P<index>\d{1,9})$")


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
    """The two plans (where each comes from and its one-line description), the headline, the
    plan fields that differ, the compared figures (largest time difference first within
    each kind) and what each time term shown holds (:data:`TIME_TERMS`)."""

    source_a: str
    source_b: str
    plan_a: str
    plan_b: str
    headline: str
    field_changes: list[tuple[str, object, object]]
    rows: list[ExplainRow]
    terms: dict[str, str]

    def to_dict(self) -> dict:
        return {"headline": self.headline, "source_a": self.source_a,
                "source_b": self.source_b, "plan_a": self.plan_a, "plan_b": self.plan_b,
                "field_changes": [{"field": f, "a": a, "b": b}
                                  for f, a, b in self.field_changes],
                "rows": [{"kind": r.kind, "name": r.name, "a": r.a, "b": r.b,
                          "delta": r.delta} for r in self.rows],
                "terms": dict(self.terms)}


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


def load_plan_ref(field: str, ref: str):
    """The plan document ``ref`` names, validated (:func:`read_plan_document`): a plan
    document (``plan.json`` of ``search --out``, ``estimate --out``), or ``FILE:N``, entry
    ``N`` (1 = the best) of a ``plans.json`` (``search --out``, ``search --json``), whose
    model and cluster it shares. Raises :class:`InputError` naming ``field``."""
    m = None if os.path.exists(ref) else _ENTRY_RE.match(ref)
    path = m.group("path") if m else ref
    data = v.load_mapping_file(field, path)
    plans = data.get("plans")
    if not isinstance(plans, list):
        if m:
            raise InputError(field, ref, f"{path} is a plan document, not a plans.json: name "
                                         "it without ':N'")
        return read_plan_document(data, where=field)
    if not m:
        raise InputError(field, ref, f"a plans.json holds {len(plans)} plans: name one as "
                                     f"{path}:N, N from 1 (the best) to {len(plans)}")
    index = int(m.group("index"))
    if not 1 <= index <= len(plans):
        raise InputError(field, ref, f"{path} holds plans 1..{len(plans)}")
    for key in ("model", "cluster"):
        if key not in data:
            raise InputError(f"{field}.{key}", None, f"missing in {path}: a plans.json names "
                             "its model and cluster (re-run configurator search)")
    entry = plans[index - 1]
    if not isinstance(entry, dict):
        raise InputError(f"{field}.plans[{index - 1}]", type(entry).__name__,
                         "must be a mapping (one ranked plan)")
    doc = {"schema_version": SCHEMA_VERSION, "model": data["model"], "cluster": data["cluster"],
           "plan": entry.get("config"), "estimate": entry}
    return read_plan_document(doc, where=f"{field}.plans[{index - 1}]")


def headline(ta: float | None, tb: float | None, terms: list[ExplainRow]) -> str:
    """One sentence: which plan is faster per iteration and by how much, and the
    :data:`HEADLINE_TERMS` time terms whose difference is largest (B − A, seconds)."""
    if ta is None or tb is None or ta <= 0 or tb <= 0:
        return "the iteration times cannot be compared (a plan lacks one)"
    if ta == tb:
        lead = f"A and B take the same time per iteration ({ta:.3f} s)"
    else:
        fast, slow, tf, ts = ("A", "B", ta, tb) if ta < tb else ("B", "A", tb, ta)
        lead = (f"{fast} is {100 * (ts / tf - 1):.1f} % faster than {slow}: {tf:.3f} s vs "
                f"{ts:.3f} s per iteration")
    top = [r for r in terms if r.delta][:HEADLINE_TERMS]
    if not top:
        return lead
    return lead + "; most of the difference (B - A): " + ", ".join(
        f"{r.name} {r.delta:+.3f} s" for r in top)


def explain_plans(ref_a: str, ref_b: str) -> Explanation:
    """Compare two saved plans (:func:`load_plan_ref`): iteration time and each term of its
    breakdown (compute, recompute, bubble, tp/cp/pp/dp communication, optimizer, and the
    simulated schedule's correction), time per pipeline stage of the simulated schedule
    (forward, backward, busy, exposed data-parallel reduction, idle), throughput, and memory
    per pipeline stage (total and its parts), with a headline first. Raises
    :class:`InputError` naming the file's bad field."""
    docs = [load_plan_ref(field, ref) for field, ref in (("plan_a", ref_a), ("plan_b", ref_b))]
    ea, eb = (d.estimate for d in docs)
    pa, pb = (d.plan.to_dict() for d in docs)
    changes = [(f.name, pa[f.name], pb[f.name]) for f in PLAN_FIELDS
               if pa[f.name] != pb[f.name]]
    ta, tb = _number(ea.get("iteration_time_s")), _number(eb.get("iteration_time_s"))
    rows = [ExplainRow("time", "iteration_time_s", ta, tb)]
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
    shown = {r.name: TIME_TERMS[r.name] for r in terms if r.name in TIME_TERMS}
    return Explanation(source_a=ref_a, source_b=ref_b, plan_a=desc[0], plan_b=desc[1],
                       headline=headline(ta, tb, terms), field_changes=changes, rows=rows,
                       terms=shown)
