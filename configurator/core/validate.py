"""Small checkers for user input; each raises :class:`InputError` naming field, value, rule."""

from __future__ import annotations

import decimal
import difflib
import functools
import math
import operator
import os
import re
from typing import Any, Iterable, Mapping

from configurator.core.errors import InputError
from configurator.core.limits import (FLOAT_RANGES, INT_RANGES, MAX_FILE_BYTES,
                                      MIN_EFFICIENCY)


def positive_int(field: str, value: Any) -> int:
    """Return ``value`` as int; raise InputError unless it is an integer > 0 (bools rejected)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value)) or int(value) != value):
        raise InputError(field, value, "must be a positive integer")
    if value <= 0:
        raise InputError(field, value, "must be a positive integer (> 0)")
    return int(value)


def whole_number(field: str, value: Any) -> int:
    """Return ``value`` as a Python int; raise InputError unless it already is an integer
    (an int or a NumPy integer; bools and floats, even integral ones, rejected). For values
    made in code rather than read from a file: no range, that being the rules' to name."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise InputError(field, value, "must be a whole number (an int)") from None


def efficiency(field: str, value: Any) -> float:
    """An efficiency: a number in [:data:`~configurator.core.limits.MIN_EFFICIENCY`, 1] (a
    fraction of a data-sheet rate). Raises :class:`InputError` naming the field, the value
    and the rule."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not MIN_EFFICIENCY <= value <= 1):
        raise InputError(field, value, f"must be an efficiency in [{MIN_EFFICIENCY:g}, 1] (a "
                                       "fraction of the data-sheet rate)")
    return float(value)


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


#: Longest display name (model, cluster, GPU), characters.
MAX_NAME_CHARS = 128


def printable_text(field: str, value: Any) -> str:
    """A non-empty string of printable characters only (no control characters or line
    breaks): text echoed in one-line messages or written into files and scripts."""
    if not isinstance(value, str) or not value or not value.isprintable():
        raise InputError(field, value, "must be a non-empty string of printable characters "
                                       "(no control characters or line breaks)")
    return value


def display_name(field: str, value: Any) -> str:
    """A name shown in tables, plots, reports and script comments: :func:`printable_text` of
    at most :data:`MAX_NAME_CHARS` characters."""
    if isinstance(value, str) and len(value) > MAX_NAME_CHARS:
        raise InputError(field, value, f"must be a non-empty string of at most "
                                       f"{MAX_NAME_CHARS} characters")
    return printable_text(field, value)


def close_matches(value: Any, options: Iterable[str], n: int = 3) -> list[str]:
    """The ``options`` closest to ``value`` (case-insensitive), best first: those that start
    with it or that it starts with (``dgx-h100`` → ``dgx-h100-80gb``), then difflib's close
    matches (Ratcliff–Obershelp similarity ≥ 0.6: ``lama3-70b`` → ``llama3-70b``,
    ``num_query_group`` → ``num_query_groups``). Empty for a value that is not a string."""
    if not isinstance(value, str) or not value.strip():
        return []
    options = list(dict.fromkeys(options))
    low = {o.lower(): o for o in options}
    key = value.strip().lower()
    prefix = [o for o in options if o.lower().startswith(key) or key.startswith(o.lower())]
    fuzzy = [low[m] for m in difflib.get_close_matches(key, list(low), n=n, cutoff=0.6)]
    return list(dict.fromkeys(prefix + fuzzy))[:n]


def did_you_mean(value: Any, options: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` (or ``'x' or 'y'``) for :func:`close_matches`, else ``""``:
    the tail of a rule that names the options a misspelt name was probably meant to be."""
    best = close_matches(value, options, n=2)
    return "; did you mean " + " or ".join(f"'{b}'" for b in best) + "?" if best else ""


def preset_name(value: Any, presets: Iterable[str]) -> str | None:
    """The preset ``value`` names, compared case-insensitively (``llama3-70B`` →
    ``llama3-70b``), or None."""
    if not isinstance(value, str):
        return None
    low = {p.lower(): p for p in presets}
    return low.get(value.strip().lower())


def choice(field: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise InputError(field, value, f"must be one of {', '.join(allowed)}"
                         + did_you_mean(value, allowed))
    return value


@functools.lru_cache(maxsize=256)
def _known_keys(required: tuple, optional: tuple) -> frozenset:
    return frozenset(required) | frozenset(optional)


def exact_keys(where: str, data: Any, required: Iterable[str], optional: Iterable[str]) -> Mapping:
    """Check a mapping has every required key and no unknown key (an unknown key's error
    suggests the closest known ones, :func:`did_you_mean`)."""
    if type(data) is not dict and not isinstance(data, Mapping):
        raise InputError(where, type(data).__name__, "must be a mapping of keys to values")
    required, optional = tuple(required), tuple(optional)
    known = _known_keys(required, optional)
    for key in data:
        if key not in known:
            hint = did_you_mean(key, sorted(known))
            raise InputError(f"{where}.{key}", data[key], "unknown key" + (
                hint or f"; allowed keys: {', '.join(sorted(known))}"))
    for key in required:
        if key not in data:
            raise InputError(f"{where}.{key}", None, "missing required key")
    return data


def read_text_file(field: str, path: str) -> str:
    """The UTF-8 text of ``path``; InputError (field ``field``) if it cannot be read, is not
    UTF-8, or is larger than :data:`~configurator.core.limits.MAX_FILE_BYTES`."""
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            raise InputError(field, path, f"larger than {MAX_FILE_BYTES >> 20} MiB")
        with open(path, "rb") as fh:
            return fh.read(MAX_FILE_BYTES + 1).decode("utf-8")
    except OSError as err:
        raise InputError(field, path, f"cannot read file ({err.strerror})") from None
    except UnicodeDecodeError:
        raise InputError(field, path, "not a UTF-8 text file") from None


#: A float as people write it, YAML 1.2's core schema (``1e-06``, ``2E12``, ``-3.5e+2``,
#: ``1.``, ``.5``, ``.inf``, ``.nan``): YAML 1.1, which PyYAML implements, needs a dot and a
#: signed exponent (``1.0e-06``) and reads ``1e-06`` as a string (yaml.org/spec/1.2.2
#: §10.3.2, tag resolution of the core schema).
YAML_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
                           |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                           |[-+]?\.(?:inf|Inf|INF)
                           |\.(?:nan|NaN|NAN))$""", re.X)


@functools.lru_cache(maxsize=1)
def _yaml_loader():
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        """Safe YAML without aliases (``*name`` can expand a few bytes into gigabytes),
        numbers resolved as YAML 1.2 does (:data:`YAML_FLOAT`)."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"aliases (*name) are not allowed (line {mark.line + 1})")
            return super().compose_node(parent, index)

    NoAliasLoader.add_implicit_resolver("tag:yaml.org,2002:float", YAML_FLOAT,
                                        list("-+0123456789."))
    return NoAliasLoader


def load_yaml(text: str) -> Any:
    """Parse YAML ``text`` with the one loader every YAML input of the tool goes through
    (safe, no aliases, ``1e-06`` a number: :func:`_yaml_loader`). Raises PyYAML's errors."""
    import yaml

    return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader


def integer_text(text: str) -> int | None:
    """The integer a command-line or CSV word spells, plain (``128``) or in scientific
    notation with an integral value (``2e12``, ``1.28e2``); None for anything else
    (``1.5``, ``abc``, more than 32 characters)."""
    text = text.strip()
    if len(text) > 32:
        return None
    if re.fullmatch(r"[-+]?[0-9]+", text):
        return int(text)
    if not re.fullmatch(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+", text):
        return None
    try:
        num = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return None
    if abs(num.adjusted()) > 30 or num != num.to_integral_value():
        return None
    return int(num)


def parse_text(field: str, path: str, text: str, as_json: bool) -> Any:
    """Parse ``text``: JSON when ``as_json`` (NaN/Infinity parse; the field validators refuse
    them), else YAML without aliases (:func:`load_yaml`). InputError (field ``field``, value
    ``path``) for malformed text, whatever PyYAML's constructors raise (``!!timestamp 1`` an
    AttributeError, ``!!int 0x`` a ValueError), or nesting too deep."""
    import json

    try:
        return json.loads(text) if as_json else load_yaml(text)
    except RecursionError:
        raise InputError(field, path, "malformed YAML/JSON (nested too deeply)") from None
    except Exception as err:  # noqa: BLE001 - every one means the text is malformed
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(field, path, f"malformed YAML/JSON ({first})") from None


def parse_mapping_text(field: str, path: str, text: str, as_json: bool) -> Mapping:
    """Parse ``text`` (:func:`parse_text`) into a mapping whose keys, at every depth, are
    strings. InputError (field ``field``, value ``path``) for malformed text, nesting too
    deep, a non-string key or a top level that is not a mapping."""
    data = parse_text(field, path, text, as_json)
    if not isinstance(data, Mapping):
        raise InputError(field, path, "file must hold a mapping of keys to values")
    if as_json:
        return data               # a JSON object's keys are strings (RFC 8259 §4)
    stack = [(data, field)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, Mapping):
            for key, val in node.items():
                if not isinstance(key, str):
                    raise InputError(where, key, "keys must be strings")
                stack.append((val, f"{where}.{key}"))
        elif isinstance(node, list):
            stack.extend((val, f"{where}[{i}]") for i, val in enumerate(node))
    return data


def load_mapping_file(field: str, path: str) -> Mapping:
    """Read a YAML or JSON file (by its ``.json`` suffix) into a mapping; see
    :func:`read_text_file` and :func:`parse_mapping_text` for what is refused."""
    return parse_mapping_text(field, path, read_text_file(field, path),
                              as_json=str(path).endswith(".json"))
