"""Small checkers for user input; each raises :class:`InputError` naming field, value, rule."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from configurator.core.errors import InputError
from configurator.core.limits import FLOAT_RANGES, INT_RANGES


def positive_int(field: str, value: Any) -> int:
    """Return ``value`` as int; raise InputError unless it is an integer > 0 (bools rejected)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value)) or int(value) != value):
        raise InputError(field, value, "must be a positive integer")
    if value <= 0:
        raise InputError(field, value, "must be a positive integer (> 0)")
    return int(value)


def int_in_range(field: str, value: Any, key: str | None = None) -> int:
    """Return ``value`` as int; raise InputError unless it is an integer (bools rejected)
    within the documented range of ``key`` (default ``field``;
    :data:`configurator.core.limits.INT_RANGES`)."""
    lo, hi = INT_RANGES[key or field]
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value)) or int(value) != value):
        raise InputError(field, value, f"must be an integer in {lo:,}..{hi:,}")
    if not lo <= value <= hi:
        raise InputError(field, value, f"must be an integer in {lo:,}..{hi:,}")
    return int(value)


def float_in_range(field: str, value: Any, key: str | None = None) -> float:
    """Return ``value`` as float; raise InputError unless it is a finite number within the
    documented range of ``key`` (default ``field``; :data:`configurator.core.limits.FLOAT_RANGES`)."""
    lo, hi = FLOAT_RANGES[key or field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(field, value, f"must be a number in {lo:g}..{hi:g}")
    try:
        v = float(value)
    except OverflowError:
        raise InputError(field, value, f"must be a number in {lo:g}..{hi:g}") from None
    if not (math.isfinite(v) and lo <= v <= hi):
        raise InputError(field, value, f"must be a number in {lo:g}..{hi:g}")
    return v


def positive_float(field: str, value: Any) -> float:
    """Return ``value`` as float; raise InputError unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(field, value, "must be a positive number")
    try:
        v = float(value)
    except OverflowError:
        raise InputError(field, value, "must be a positive finite number (> 0)") from None
    if not v > 0 or v == float("inf"):
        raise InputError(field, value, "must be a positive finite number (> 0)")
    return v


def boolean(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InputError(field, value, "must be true or false")
    return value


def choice(field: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise InputError(field, value, f"must be one of {', '.join(allowed)}")
    return value


def exact_keys(where: str, data: Any, required: Iterable[str], optional: Iterable[str]) -> Mapping:
    """Check a mapping has every required key and no unknown key."""
    if not isinstance(data, Mapping):
        raise InputError(where, type(data).__name__, "must be a mapping of keys to values")
    required, optional = tuple(required), tuple(optional)
    known = set(required) | set(optional)
    for key in data:
        if key not in known:
            raise InputError(f"{where}.{key}", data[key],
                             f"unknown key; allowed keys: {', '.join(sorted(known))}")
    for key in required:
        if key not in data:
            raise InputError(f"{where}.{key}", None, "missing required key")
    return data


def load_mapping_file(field: str, path: str) -> Mapping:
    """Read a YAML or JSON file into a mapping (JSON is YAML 1.2's subset; both parse here)."""
    import json

    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as err:
        raise InputError(field, path, f"cannot read file ({err.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(field, path, "not a UTF-8 text file") from None
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(field, path, f"malformed YAML/JSON ({first})") from None
    if not isinstance(data, Mapping):
        raise InputError(field, path, "file must hold a mapping of keys to values")
    return data
