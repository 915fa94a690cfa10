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
