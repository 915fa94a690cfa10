"""Strict JSON out: every document this tool writes or prints is RFC 8259 JSON.

Python's ``json`` writes ``NaN`` and ``Infinity`` for non-finite floats, which other JSON
readers reject; :func:`dumps` writes ``null`` for them (a figure that could not be computed,
e.g. the bandwidth of a group of one GPU) and numpy scalars as plain numbers.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with non-finite floats replaced by None and numpy scalars and arrays turned
    into Python numbers and lists (recursively through dicts, lists and tuples)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if hasattr(obj, "tolist") and type(obj).__module__ == "numpy":   # numpy scalar or array
        return finite(obj.tolist())
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(obj)`` that never writes NaN or Infinity."""
    return json.dumps(finite(obj), allow_nan=False, **kw)
