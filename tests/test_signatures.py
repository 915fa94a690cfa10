"""The memory and cost models take a plan batch and a few figures, never long keyword lists:
no function of ``memory_model`` or ``configurator/cost`` takes more than
:data:`MAX_PARAMETERS` parameters (``self``/``cls`` not counted; ``*args`` and ``**kwargs``
count one each)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memory_model", "configurator/cost")
MAX_PARAMETERS = 8


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (names[:1] in (["self"], ["cls"]))


def long_signatures(source: str) -> list[tuple[int, str, int]]:
    return [(fn.lineno, fn.name, parameter_count(fn)) for fn in ast.walk(ast.parse(source))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and parameter_count(fn) > MAX_PARAMETERS]


def test_no_function_of_the_models_takes_more_than_eight_parameters():
    found = [f"{path.relative_to(ROOT)}:{line} {name} ({n})"
             for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
             for line, name, n in long_signatures(path.read_text(encoding="utf-8"))]
    assert not found, found


def test_the_count_sees_every_kind_of_parameter():
    src = ("def f(a, /, b, *c, d, e=1, **g): pass\n"
           "class K:\n    def m(self, a, b, c, d, e, f, g, h, i): pass\n")
    assert [n for _, _, n in long_signatures(src)] == [9]
    assert parameter_count(ast.parse(src).body[0]) == 6


#: The one module of the models that builds plans of its own: published runs typed as the
#: plans their sources used (records, not an input form).
PLAN_RECORDS = {"configurator/cost/groundtruth.py"}


def plan_type_imports(source: str) -> list[int]:
    """Lines that import the single-plan types (``ParallelPlan``, ``PlanLayout``)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom)
            and any(a.name in ("ParallelPlan", "PlanLayout") for a in node.names)]


def test_the_models_take_plans_only_as_a_plan_batch():
    """A single plan reaches the memory and cost models as a batch of one
    (``PlanBatch.from_plan``): no module of theirs imports the single-plan types."""
    found = [f"{path.relative_to(ROOT)}:{line}"
             for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))
             if str(path.relative_to(ROOT)) not in PLAN_RECORDS
             for line in plan_type_imports(path.read_text(encoding="utf-8"))]
    assert not found, found
    assert plan_type_imports("from configurator.core.plan import ParallelPlan\n") == [1]
