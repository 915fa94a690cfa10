"""Fuzzing the ``configurator`` CLI end to end: Hypothesis strategies that build one CLI call
(argv plus the input files it names) per input format, and a runner that feeds each call to
the real CLI (:func:`configurator.cli.main`) and classifies what happened.

Targets (:data:`TARGETS`), one per input format:

``model``      model YAML/JSON with Megatron keys (``--model FILE`` of search/estimate)
``cluster``    cluster YAML/JSON, GPU preset or full GPU mapping (``--cluster FILE``)
``hf_config``  Hugging Face ``config.json`` (Llama/Mistral/Qwen or GPT-2 keys; the folder name
               becomes the model name)
``topofile``   measured topology file (``audit --topology``, ``topology import``,
               ``search/estimate --topology``)
``nccl``       nccl-tests logs (``topology import``, ``audit LOGS``)
``nvsmi``      ``nvidia-smi topo -m`` output (``topology import``, ``audit``)
``plan``       ``plan.json`` of ``search --out``, mutated (``launch --plan``)
``argv``       random flags and values for search, estimate, launch, topology import, audit,
               probe

Each input mixes valid-looking documents with hostile ones: integers >= 2**63, 1e308,
NaN/inf, negatives, strings where numbers go, non-string YAML keys, YAML alias bombs, deep
nesting, non-ASCII digits in host names, ``$...$`` in names, control characters and Unicode
line separators, truncated/garbage/binary/empty files, very long lines.

The runner (:class:`Runner`) keeps one long-lived worker subprocess per target (fed over a
pipe, restarted after a hang, a crash, a MemoryError or every :data:`RECYCLE_AFTER` inputs).
The worker writes the input files into a fresh temporary directory, makes it the working
directory (argv uses relative paths), calls ``main(argv)`` with stdout/stderr captured and
reports back. :func:`classify` turns that into failures:

``traceback``  an exception escaping ``main``, a SystemExit/return code other than 0, 2, 3,
               or the worker process dying;
``hang``       no answer within :data:`TIMEOUT_S` seconds;
``memory``     peak RSS above :data:`MEMORY_LIMIT` (the worker also runs under RLIMIT_AS) or
               a MemoryError;
``multiline``  exit 2 or 3 whose stderr is not exactly one non-empty line (``str.splitlines``:
               Unicode line separators count);
``json``       ``--json`` output, or a ``.json`` file the call wrote, that is not strict JSON
               (NaN/Infinity, or not JSON at all).

:func:`shrink` reduces a failing :class:`Case` to a smaller one with the same failure
signature; :func:`save_case` writes a reproducer directory. Used by
``tests/test_fuzz_inputs.py`` (quick profile) and ``bench/fuzz.py`` (report).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("model", "cluster", "hf_config", "topofile", "nccl", "nvsmi", "plan", "argv")
CATEGORIES = ("traceback", "hang", "memory", "multiline", "json")
#: Seconds an input may run before it counts as a hang.
TIMEOUT_S = 10.0
#: Peak resident memory above which an input counts as over-memory (bytes).
MEMORY_LIMIT = 2 * 2**30
#: A worker is replaced after this many inputs (bounds what leaks between calls).
RECYCLE_AFTER = 400
#: Directories whose frames count as product code in a traceback.
PRODUCT_DIRS = ("configurator", "topology", "launchers", "memory_model")


# ============================================================================================
# The case: one CLI call
# ============================================================================================

@dataclass(frozen=True)
class Case:
    """One CLI call: ``argv`` (without the program name; paths relative to the directory the
    ``files`` are written into) and ``files`` (relative path, content)."""

    target: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...] = ()

    def size(self) -> int:
        return sum(len(a) + 1 for a in self.argv) + sum(len(n) + len(b) for n, b in self.files)

    def command(self) -> str:
        return shlex.join(["configurator", *self.argv])

    def __repr__(self) -> str:  # what Hypothesis prints as the falsifying example
        files = ", ".join(f"{n!r}: {_preview(b)}" for n, b in self.files)
        return f"Case({self.target}: {self.command()} | files {{{files}}})"


def _preview(data: bytes, limit: int = 300) -> str:
    text = repr(data[:limit])
    return text + (f"... ({len(data)} bytes)" if len(data) > limit else "")


# ============================================================================================
# Hostile values
# ============================================================================================

HUGE_INTS = [2**63, 2**63 - 1, 2**64 + 1, -(2**63) - 1, 10**30, 10**400, 2**1000]
ODD_FLOATS = [1e308, -1e308, 1.7976931348623157e308, 5e-324, float("nan"), float("inf"),
              float("-inf"), -0.0, 1e-300, 0.5, 2.5, 1e16]
SMALL_INTS = [-1, 0, 1, 2, 3, 7, 8, 16, 64, 1000000]
WEIRD_STRINGS = [
    "", " ", "0", "8", "12", "-1", "1e3", "1e308", "0x10", "1_000", "٣", "²", "１２", "NaN",
    "nan", "inf", "-inf", "Infinity", "null", "~", "true", "yes", "$x^2$", "$", "$$",
    "$\\frac{1}{0}$", "$\\alpha", "a_{b}^c", "a\nb", "a\rb", "a\u2028b", "a\u2029b",
    "a\x85b", "a\x0bb", "a\x1cb", "\x00", "\x1b[31mred\x1b[0m", "\t", "é", "名前", "\U0001F600",
    "%s%n", "{0}", "<script>", "'; rm -rf ~; '", "`id`", "$(id)", "\\", "x" * 129, "y" * 5000,
    "\u202etxt", "\ufeff", "\ud800",
]
#: Display names: mostly printable, several with mathtext.
ODD_NAMES = ["$x^2$", "$\\alpha$ model", "$", "cost $5", "$$", "$\\frac{a}{$", "a_b^c",
             "$\\foo$", "$x^$", "${$", "a $b$ c $\\bad{$ d",
             "100%", "{name}", "\\n", "名前", "é", "\U0001F600", "x" * 128, "x" * 129, "a\nb",
             "a\u2028b", "tab\there", "\x1b[1m", "", " ", "'quote\"", "$(id)", "`id`",
             "a;b", "<b>bold</b>", "\u0663", "node\u00b2"]
#: Host names: non-ASCII digits, separators, shell and mathtext characters.
ODD_HOSTS = ["²", "node1²", "\u0663\u00b2", "1\u2070", "node\u00b3-2", "node²", "node\u0663",
             "$\\foo$", "$x^$", "n\u00b9\u00b2", "node١٠", "node10", "node9", "node01",
             "dgx-a100-001", "h$x$", "$", "a b", "a:b", "a/b", "é", "名前", "x" * 300, "1",
             "00", "9" * 40, "node-" + "9" * 30, "NaN", "inf", "-", "_", "node\u2028x",
             "x\x1b", "a,b", "*", "'q'"]
NORMAL_HOSTS = ["hostA", "hostB", "hostC", "node0001", "node0002", "node0010", "cnode2-001",
                "cnode2-002", "dgx-01", "dgx-02"]


def _encode(text: str) -> bytes:
    """UTF-8, lone surrogates becoming the raw bytes they stand for (invalid UTF-8)."""
    return text.encode("utf-8", errors="surrogateescape") if _has_surrogate(text) else \
        text.encode("utf-8")


def _has_surrogate(text: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in text)


def _safe_text(text: str) -> str:
    """Characters that survive as file content (surrogates only as \\udc80-\\udcff)."""
    return "".join(c if not ("\ud800" <= c <= "\udfff") or "\udc80" <= c <= "\udcff"
                   else "?" for c in text)


hostile_scalar = (st.sampled_from(HUGE_INTS + ODD_FLOATS + SMALL_INTS + [None, True, False])
                  | st.sampled_from(WEIRD_STRINGS).map(_safe_text)
                  | st.integers() | st.floats() | st.text(max_size=12).map(_safe_text))
json_like = st.recursive(hostile_scalar,
                         lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=6).map(_safe_text), inner,
                                           max_size=4),
                         max_leaves=12)
odd_key = (st.sampled_from([1, 0, -1, 1.5, True, False, None, 2**64, float("nan"), "",
                            "extra", "name ", "Name", "num_layers\u200b", "<<", "?"])
           | st.text(max_size=8).map(_safe_text))


def chance(percent: float) -> st.SearchStrategy[bool]:
    """True in about ``percent`` % of draws. (``st.integers(0, 99) < p`` is true far more
    often: Hypothesis favours small values; here False, the common case, is index 0.)"""
    k = max(1, round(percent / 5))
    return st.sampled_from([False] * (20 - k) + [True] * k)


def _numeric_variants(value: Any) -> list:
    """Hostile variants of a number: as a string, huge, negative, non-finite, fractional."""
    try:
        as_float = float(value)
    except OverflowError:            # an int past float range (a mutation of a mutation)
        as_float = 1e308
    out: list = [str(value), -value if value else -1, value * 2**63 if value else 2**63,
                 as_float + 0.5, float("nan"), float("inf"), 1e308, 0, True,
                 [value], {"value": value}]
    if isinstance(value, int) and not isinstance(value, bool):
        out += [10**400, as_float, str(value).translate(str.maketrans("0123456789",
                                                                      "٠١٢٣٤٥٦٧٨٩"))]
    return out


# ============================================================================================
# Documents: mutations and serialisation
# ============================================================================================

def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indices) to a node of ``doc``, the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _deepcopy(doc):
    if isinstance(doc, dict):
        return {k: _deepcopy(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_deepcopy(v) for v in doc]
    return doc


@st.composite
def mutated_doc(draw, base: Any, max_mutations: int = 4, focus: Callable | None = None):
    """``base`` (a JSON-like tree) with 0..``max_mutations`` edits: a value replaced by a
    hostile one (or a hostile variant of itself), a key deleted or added (non-string keys
    too), a key renamed. ``focus`` (path -> bool) restricts where edits land, when it can."""
    doc = _deepcopy(base)
    n = draw(st.sampled_from([0, 0, 1, 1, 1, 2, 2, 3, max_mutations]))
    for _ in range(n):
        paths = _paths(doc)
        if focus is not None:
            paths = [p for p in paths if focus(p)] or paths
        path = draw(st.sampled_from(paths))
        node = _get(doc, path)
        op = draw(st.sampled_from(["set", "set", "variant", "delete", "add", "rename"]))
        if not path and op in ("set", "variant", "delete", "rename"):
            op = "add" if isinstance(doc, dict) else "set"
        if op == "add" and not isinstance(node, (dict, list)):
            op = "set"
        if op == "rename" and not isinstance(_get(doc, path[:-1]), dict):
            op = "delete"
        parent = _get(doc, path[:-1]) if path else None
        if op == "set":
            value = draw(json_like)
            if not path:
                doc = value if draw(st.booleans()) else doc
                continue
            parent[path[-1]] = value
        elif op == "variant":
            if isinstance(node, (int, float)) and not isinstance(node, bool):
                value = draw(st.sampled_from(_numeric_variants(node)))
            elif isinstance(node, str):
                value = draw(st.sampled_from(WEIRD_STRINGS + ODD_NAMES + [node * 1000,
                                                                           node + "\n"]))
                value = _safe_text(value)
            else:
                value = draw(json_like)
            parent[path[-1]] = value
        elif op == "delete":
            del parent[path[-1]]
        elif op == "add":
            if isinstance(node, dict):
                node[draw(odd_key)] = draw(json_like)
            else:
                node.insert(draw(st.integers(0, len(node))), draw(json_like))
        elif op == "rename":
            value = parent.pop(path[-1])
            parent[draw(odd_key)] = value
    return doc


def _yaml_dumper():
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    return Dumper


def dump_yaml(doc: Any, flow: bool = False, unicode: bool = True) -> str | None:
    import yaml

    try:
        return yaml.dump(doc, Dumper=_yaml_dumper(), sort_keys=False, allow_unicode=unicode,
                         default_flow_style=flow, width=100)
    except (yaml.YAMLError, RecursionError, ValueError, TypeError):
        return None


def dump_json(doc: Any, indent: int | None = 2, ascii_: bool = False) -> str | None:
    try:
        return json.dumps(doc, indent=indent, ensure_ascii=ascii_, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return None


def alias_bomb(depth: int = 8, width: int = 9) -> str:
    """The billion-laughs YAML: each level a list of ``width`` aliases of the previous."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, depth + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def alias_bomb_inline(depth: int = 8, width: int = 9) -> str:
    """One flow value holding the whole chain: ``[&a0 [lol, ...], &a1 [*a0, ...], ...]``
    (no extra top-level keys, so it reaches the validator of whichever key holds it)."""
    items = [f"&a0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, depth + 1):
        items.append(f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "[" + ", ".join(items) + "]"


#: Explicitly tagged YAML scalars and collections, valid and not.
YAML_TAGGED = ["!!timestamp 1", "!!timestamp x", "!!timestamp 2001-13-45",
               "!!timestamp 2001-12-14t21:59:43.10-05:00", "!!binary x", "!!binary '='",
               "!!float abc", "!!float 1e999", "!!float .nan", "!!int 0x", "!!int 0b2",
               "!!int 0o9", "!!int 1:2:3", "!!int 99999999999999999999999", "!!bool maybe",
               "!!null x", "!!str 1", "!!set {a, b}", "!!set [a]", "!!omap [a]",
               "!!omap [{a: 1}, {a: 2}]", "!!pairs [{a: 1}]", "!!seq {a: 1}", "!!map [1]",
               "!!merge 1", "!!value 1", "!!yaml 1", "!!python/none ''", "!unknown 1",
               "!<tag:yaml.org,2002:int> 7", "!!timestamp 2001-12-14 21:59:43.10 -5"]


RAW_HOSTILE = ("truncate", "alias_bomb", "alias_bomb_key", "empty", "blank", "binary",
               "bad_utf8", "bom",
               "deep_list", "deep_map", "deep_json", "long_line", "huge_number",
               "tabs", "tags", "list_top", "scalar_top", "garbage", "crlf",
               "line_sep", "complex_key", "dup_keys", "merge_key", "null_bytes")


@st.composite
def hostile_text(draw, valid: str, key: str = "num_layers") -> bytes:
    """A hostile variant of the YAML/JSON document text ``valid`` (its first key ``key``)."""
    kind = draw(st.sampled_from(RAW_HOSTILE + ("alias_bomb_key", "alias_bomb_key", "alias_bomb",
                                                "huge_number", "deep_list", "tag_value",
                                                "tag_value")))
    if kind == "tag_value":
        # One value of the document given an explicit YAML tag (PyYAML's constructors:
        # some raise ValueError/AttributeError/TypeError rather than YAMLError).
        tagged = draw(st.sampled_from(YAML_TAGGED))
        lines = valid.splitlines(keepends=True)
        spots = [i for i, ln in enumerate(lines) if re.match(r"^\s*[\w\- ]+: \S", ln)]
        if spots and not valid.lstrip().startswith("{"):
            i = draw(st.sampled_from(spots))
            head = lines[i].split(": ", 1)[0]
            lines[i] = f"{head}: {tagged}\n"
            return "".join(lines).encode()
        return f"{key}: {tagged}\n".encode()
    if kind == "empty":
        return b""
    if kind == "blank":
        return draw(st.sampled_from([b" ", b"\n\n", b"\t", b"---\n", b"...\n", b"{}", b"[]",
                                     b"null", b"~"]))
    if kind == "binary":
        return draw(st.binary(min_size=1, max_size=400))
    if kind == "bad_utf8":
        return valid.encode() + b"\xff\xfe\x80" + draw(st.binary(max_size=20))
    if kind == "bom":
        return b"\xef\xbb\xbf" + valid.encode()
    if kind == "alias_bomb":
        return (alias_bomb(draw(st.integers(2, 8))) + valid).encode()
    if kind == "alias_bomb_key":
        bomb = f"{key}: {alias_bomb_inline(draw(st.sampled_from([8, 3, 6])))}\n"
        if valid.lstrip().startswith("{"):
            return bomb.encode()
        lines = [ln for ln in valid.splitlines(keepends=True)
                 if not ln.startswith(f"{key}:")]
        return ("".join(lines) + bomb).encode()
    if kind == "deep_list":
        d = draw(st.sampled_from([50, 500, 5000, 50000]))
        return f"{key}: {'[' * d}1{']' * d}\n".encode()
    if kind == "deep_map":
        d = draw(st.sampled_from([50, 300, 3000]))
        return ("".join(f"{'  ' * i}k{i}:\n" for i in range(d)) + "  " * d + "1\n").encode()
    if kind == "deep_json":
        d = draw(st.sampled_from([100, 1000, 100000]))
        return ('{"a":' * d + "1" + "}" * d).encode()
    if kind == "long_line":
        n = draw(st.sampled_from([10_000, 1_000_000]))
        return (valid + f"\n# {'x' * n}\nname: {'n' * n}\n").encode()
    if kind == "huge_number":
        digits = draw(st.sampled_from([20, 400, 5000, 100_000]))
        return (valid + f"\n{key}: {'9' * digits}\n").encode()
    if kind == "tabs":
        return valid.replace("  ", "\t").encode()
    if kind == "tags":
        tag = draw(st.sampled_from(["!!python/object:os.system", "!!binary", "!!set",
                                    "!!timestamp", "!!float", "!!int", "!!omap", "!custom",
                                    "!!python/name:os.system"]))
        return f"{key}: {tag} 1\n{valid}".encode()
    if kind == "list_top":
        return f"- {key}\n- 1\n".encode()
    if kind == "scalar_top":
        return draw(st.sampled_from([b"42", b"'text'", b"2001-12-14", b"1e308", b".nan",
                                     b"&a x", b"*a", b"%YAML 1.2\n---\n1"]))
    if kind == "truncate":
        data = valid.encode()
        return data[:draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == "garbage":
        data = valid
        pos = draw(st.integers(0, len(data)))
        junk = _safe_text(draw(st.text(min_size=1, max_size=40)))
        return _encode(data[:pos] + junk + data[pos:])
    if kind == "crlf":
        return valid.replace("\n", "\r\n").encode() + b"\r"
    if kind == "line_sep":
        sep = draw(st.sampled_from(["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\r"]))
        return valid.replace("\n", sep, draw(st.integers(1, 3))).encode()
    if kind == "complex_key":
        extra = draw(st.sampled_from(["? [a, b]\n: 1\n", "? {x: 1}\n: 2\n", "1: one\n",
                                      "null: x\n", "true: y\n", "1.5: z\n", "2001-01-01: d\n",
                                      ".nan: n\n", f"? {key}\n: 1\n"]))
        return (valid + "\n" + extra if not valid.lstrip().startswith("{") else extra).encode()
    if kind == "dup_keys":
        return (valid + f"\n{key}: 1\n{key}: 2\n").encode()
    if kind == "merge_key":
        return f"base: &b {{{key}: 1}}\n<<: *b\n{valid}".encode()
    # null_bytes
    pos = draw(st.integers(0, len(valid)))
    return valid[:pos].encode() + b"\x00" + valid[pos:].encode()


@st.composite
def document_file(draw, base: Any, *, ext: str | None = None, key: str = "num_layers",
                  hostile_p: int = 20, focus: Callable | None = None,
                  max_mutations: int = 4) -> tuple[str, bytes]:
    """(extension, content) of a YAML or JSON file holding a mutation of ``base``; in about
    ``hostile_p`` % of cases a raw hostile text instead."""
    if ext is None:
        ext = draw(st.sampled_from([".yaml", ".yaml", ".yml", ".json", ".json", ""]))
    if draw(chance(hostile_p)):
        # Raw hostile text around the valid document (most are YAML tricks: a YAML name).
        if ext == ".json" and draw(chance(70)):
            ext = ".yaml"
        text = (dump_json(base, indent=1) if ext == ".json" else dump_yaml(base)) or "{}"
        if isinstance(base, dict) and base and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(k for k in base if isinstance(k, str)) or [key]))
        return ext, draw(hostile_text(text, key))
    doc = draw(mutated_doc(base, max_mutations=max_mutations, focus=focus))
    as_json = ext == ".json"
    if draw(chance(10)):
        as_json = not as_json                  # JSON in a .yaml file, YAML in a .json file
    text = (dump_json(doc, indent=draw(st.sampled_from([None, 1, 2])),
                      ascii_=draw(st.booleans())) if as_json
            else dump_yaml(doc, flow=draw(chance(20)), unicode=draw(st.booleans())))
    if text is None:
        text = dump_json(base) or "{}"
    return ext, _encode(text)


# ============================================================================================
# Argument pieces
# ============================================================================================

MODEL_PRESETS_SMALL = ("gpt-1.7b", "gpt-3.6b", "llama2-7b", "llama3-8b", "qwen3-30b-a3b")
CLUSTER_PRESETS = ("dgx-a100-80gb", "dgx-h100-80gb", "dgx-h200-141gb")
#: Integer-ish argument values: mostly sane, sometimes hostile.
ODD_INT_ARGS = ["0", "-1", "-8", "1000000", "262145", "32769", str(2**63), str(10**30),
                "9" * 400, "1e3", "1.5", "nan", "inf", "", " 8", "8 ", "٣", "²", "0x10",
                "1_0", "+8", "08", "x", "--", "-", "\u2028", "8\n"]
ODD_FLOAT_ARGS = ["0", "-1", "1e308", "1e309", "-1e308", "nan", "NaN", "inf", "-inf",
                  "5e-324", "1e-320", "0.0", "2", "1.0000001", "x", "", "٣.٥", "0x1p-2",
                  "1_0.5", "infinity"]


@st.composite
def int_arg(draw, sane: list[int]) -> str:
    if not draw(chance(30)):
        return str(draw(st.sampled_from(sane)))
    return draw(st.sampled_from(ODD_INT_ARGS) | st.integers().map(str))


@st.composite
def float_arg(draw, sane: list[float]) -> str:
    if not draw(chance(30)):
        return repr(draw(st.sampled_from(sane)))
    return draw(st.sampled_from(ODD_FLOAT_ARGS) | st.floats().map(repr))


def _plan_flags(draw, command: str, hostile: bool) -> list[str]:
    """The plan options of search/estimate (sane values, sometimes hostile)."""
    argv: list[str] = []
    pick = (lambda sane: draw(int_arg(sane))) if hostile else (
        lambda sane: str(draw(st.sampled_from(sane))))
    argv += ["--gbs", pick([8, 16, 64, 128, 512, 1536])]
    if draw(chance(25)):
        argv += ["--nodes", pick([1, 2, 4, 8])]
    if draw(chance(17)):
        argv += ["--seq-length", pick([512, 1024, 2048, 4096])]
    if draw(chance(17)):
        argv += ["--precision", draw(st.sampled_from(["bf16", "fp16", "fp8", "mxfp8"]))]
    if command == "estimate":
        argv += ["--tp", pick([1, 2, 4, 8]), "--pp", pick([1, 2, 4]), "--mbs", pick([1, 2, 4])]
        if draw(chance(25)):
            argv += ["--recompute", draw(st.sampled_from(["none", "selective", "full"]))]
        if draw(chance(20)):
            argv += ["--cp", pick([1, 2])]
        if draw(chance(20)):
            argv += ["--vp", pick([1, 2])]
        if draw(chance(20)):
            argv += ["--ep", pick([1, 2, 8]), "--etp", pick([1, 2])]
        if draw(chance(15)):
            argv += ["--decoder-first-pipeline-num-layers", pick([0, 2, 7]),
                     "--decoder-last-pipeline-num-layers", pick([0, 2, 7])]
        if draw(chance(10)):
            argv += ["--account-for-embedding-in-pipeline-split"]
    else:
        if draw(chance(15)):
            argv += ["--ep", pick([1, 2, 8, 16])]
        if draw(chance(20)):
            argv += ["--top", pick([1, 3, 10])]
        if draw(chance(17)):
            argv += ["--max-memory-fraction", draw(float_arg([0.5, 0.9, 1.0]))
                     if hostile else "0.9"]
    return argv


@st.composite
def plan_command(draw, *, model: str, cluster: str, topology: str | None = None,
                 out_p: int = 25, hostile_flags: bool | None = None) -> list[str]:
    """argv of ``search`` or ``estimate`` for ``model`` on ``cluster``: ``--json`` mostly,
    ``--out out`` (search: plans.png, plan.json, launch scripts) in ``out_p`` % of cases."""
    command = draw(st.sampled_from(["search", "search", "estimate"]))
    argv = [command, "--model", model, "--cluster", cluster]
    if hostile_flags is None:
        hostile_flags = draw(chance(15))
    argv += _plan_flags(draw, command, hostile_flags)
    if topology is not None:
        argv += ["--topology", topology]
        if command == "search" and draw(chance(25)):
            argv += ["--exclude-flagged"]
    if command == "search" and draw(chance(out_p)):
        argv += ["--out", "out"]
        if draw(chance(25)):
            argv += ["--json"]
    else:
        argv += ["--json"] if not draw(chance(17)) else (
            ["--wide"] if command == "search" else [])
    return argv


# ============================================================================================
# Targets
# ============================================================================================

def _model_base(preset: str) -> dict:
    from configurator.core.model import MODEL_PRESETS

    return MODEL_PRESETS[preset].to_dict()


@st.composite
def model_cases(draw, out_p: int = 25) -> Case:
    base = _model_base(draw(st.sampled_from(MODEL_PRESETS_SMALL + ("gpt-18.4b",))))
    if draw(st.booleans()):
        base["name"] = _safe_text(draw(st.sampled_from(ODD_NAMES)))
    for k in ("num_query_groups", "ffn_hidden_size", "swiglu", "normalization"):
        if draw(chance(17)):
            base.pop(k, None)
    ext, content = draw(document_file(base, key="num_layers"))
    name = "model" + ext
    argv = draw(plan_command(model=name, cluster=draw(st.sampled_from(CLUSTER_PRESETS)),
                             out_p=out_p))
    return Case("model", tuple(argv), ((name, content),))


GPU_MAPPING = {"name": "my-gpu", "peak_tflops": {"bf16": 312, "fp16": 312},
               "memory_GiB": 80, "hbm_bandwidth_GBps": 2039, "num_sms": 108,
               "efficiency": {"gemm": 0.69, "hbm": 0.83, "flash_attention": 0.55,
                              "kernel_overhead_us": 4, "source": "datasheet"}}


@st.composite
def cluster_cases(draw, out_p: int = 25) -> Case:
    from topology.cluster import CLUSTER_PRESETS as PRESETS

    base = dict(PRESETS[draw(st.sampled_from(sorted(PRESETS)))])
    base["nodes"] = draw(st.sampled_from([1, 2, 4]))
    if draw(st.booleans()):
        gpu = _deepcopy(GPU_MAPPING)
        if draw(st.booleans()):
            gpu["peak_tflops"]["fp8"] = 624
            gpu["efficiency"]["gemm_fp8"] = 0.6
        base["gpu"] = gpu
    if draw(st.booleans()):
        base["name"] = _safe_text(draw(st.sampled_from(ODD_NAMES)))
    if draw(chance(25)) and isinstance(base["gpu"], dict):
        base["gpu"]["name"] = _safe_text(draw(st.sampled_from(ODD_NAMES)))
    ext, content = draw(document_file(base, key="gpus_per_node"))
    name = "cluster" + ext
    argv = draw(plan_command(model=draw(st.sampled_from(MODEL_PRESETS_SMALL)), cluster=name,
                             out_p=out_p))
    return Case("cluster", tuple(argv), ((name, content),))


HF_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
            "intermediate_size": 5504, "num_attention_heads": 16, "num_hidden_layers": 8,
            "num_key_value_heads": 16, "max_position_embeddings": 2048, "vocab_size": 32000,
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16"}
HF_GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
           "n_ctx": 1024, "n_inner": None, "vocab_size": 50257, "resid_pdrop": 0.1,
           "attn_pdrop": 0.1, "activation_function": "gelu_new"}
HF_QWEN = dict(HF_LLAMA, model_type="qwen2", num_key_value_heads=4, attention_bias=True,
               hidden_act="swiglu", tie_word_embeddings=True, sliding_window=None,
               attention_dropout=0.0)
HF_MIXTRAL = dict(HF_LLAMA, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2,
                  sliding_window=None, router_aux_loss_coef=0.02)
HF_QWEN3_MOE = dict(HF_LLAMA, model_type="qwen3_moe", head_dim=128, num_experts=16,
                    num_experts_per_tok=4, moe_intermediate_size=768, decoder_sparse_step=1,
                    mlp_only_layers=[0], norm_topk_prob=True)
HF_DEEPSEEK = dict(HF_LLAMA, model_type="deepseek_v3", n_routed_experts=16,
                   num_experts_per_tok=4, moe_intermediate_size=512, n_shared_experts=1,
                   first_k_dense_replace=1, moe_layer_freq=1, q_lora_rank=384,
                   kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                   num_nextn_predict_layers=1, n_group=4, topk_group=2)
ODD_DIRS = ["llama", "$x^2$", "$\\alpha$-7b", "$\\foo$", "$x^$", "a$\\frac{$b", "my model",
            "名前", "é" * 70, "m" * 200,
            "a$b$c", "\u2028", "tab\tdir", "model\x1b[31m", "100%", "{x}", "٣", "_", "-",
            "x\udcff", "$(id)", "a'b\"c"]


@st.composite
def hf_config_cases(draw, out_p: int = 25) -> Case:
    base = _deepcopy(draw(st.sampled_from([HF_LLAMA, HF_GPT2, HF_QWEN, HF_MIXTRAL,
                                           HF_QWEN3_MOE, HF_DEEPSEEK])))
    if draw(chance(25)):   # strings where numbers go, HF-style
        k = draw(st.sampled_from(sorted(k for k, v in base.items()
                                        if isinstance(v, (int, float)) and
                                        not isinstance(v, bool))))
        base[k] = str(base[k])
    ext, content = draw(document_file(base, ext=".json", key="num_hidden_layers",
                                      hostile_p=15))
    folder = draw(st.sampled_from(ODD_DIRS)) if draw(st.booleans()) else "hf-model"
    fname = (draw(st.sampled_from(["config.json", "config.json", "hf.json"])) if ext == ".json"
             else draw(st.sampled_from(["config.yaml", "cfg"])))
    path = f"{folder}/{fname}"
    argv = draw(plan_command(model=path, cluster=draw(st.sampled_from(CLUSTER_PRESETS)),
                             out_p=out_p))
    return Case("hf_config", tuple(argv), ((path, content),))


def _host_names(draw, n: int) -> list[str]:
    names: list[str] = []
    pool = ODD_HOSTS if draw(st.booleans()) else NORMAL_HOSTS
    while len(names) < n:
        h = draw(st.sampled_from(pool + NORMAL_HOSTS))
        if h not in names:
            names.append(h)
    return names


def topology_base(draw) -> dict:
    n = draw(st.integers(1, 4))
    hosts = _host_names(draw, n)
    bw = draw(st.sampled_from([12.5, 23.0, 46.5, 0.001, 1e6]))
    links = []
    for a in hosts:
        for b in hosts:
            if a != b:
                slow = draw(chance(12))
                links.append(dict(src=a, dst=b, src_gpu=None, dst_gpu=None,
                                  bandwidth_GBps=bw / 10 if slow else bw,
                                  latency_us=draw(st.sampled_from([None, 7.5])),
                                  link_class="network", message_bytes=2**25,
                                  method="nccl-tests sendrecv_perf busbw",
                                  timestamp=draw(st.sampled_from(
                                      [None, "2025-11-03T10:00:00+00:00"])),
                                  samples_GBps=[bw, bw * 1.01], rails_used=1,
                                  gpus_per_host=1))
    if draw(st.booleans()):
        links.append(dict(src=hosts[0], dst=hosts[0], src_gpu=0, dst_gpu=1,
                          bandwidth_GBps=370.0, latency_us=None, link_class="nvlink",
                          message_bytes=None, method="nvidia-smi topo -m (nominal)",
                          timestamp=None))
    doc = dict(format="configurator-topology", version=1, hosts=hosts,
               gpus_per_host=draw(st.sampled_from([8, None, 1])), merge_policy="min",
               links=links)
    if draw(st.booleans()):
        doc["collectives"] = [dict(hosts=hosts, gpus_per_host=8, op="all_reduce",
                                   busbw_GBps=180.0, message_bytes=2**27,
                                   method="nccl-tests all_reduce_perf busbw",
                                   timestamp=None)]
    if n > 1 and draw(st.booleans()):
        doc["missing"] = [dict(src=hosts[0], dst=hosts[-1], reason="x.log: failed")]
        doc["links"] = [l for l in links if {l["src"], l["dst"]} != {hosts[0], hosts[-1]}]
    if draw(st.booleans()):
        doc["warnings"] = ["w1"]
    return doc


@st.composite
def topofile_cases(draw, out_p: int = 25) -> Case:
    base = topology_base(draw)
    ext, content = draw(document_file(base, key="hosts"))
    name = "topo" + ext
    kind = draw(st.sampled_from(["audit", "audit", "import", "plan", "plan"]))
    if kind == "audit":
        argv = ["audit", "--topology", name]
        argv += ["--out", "report"] if draw(chance(out_p)) else ["--json"]
    elif kind == "import":
        argv = ["topology", "import", name, "-o", draw(st.sampled_from(["t.json", "t.yaml"]))]
        argv += draw(st.sampled_from([[], ["--json"], ["-v"], ["--merge", "median"],
                                      ["--merge", "p10", "--json"]]))
    else:
        argv = draw(plan_command(model="gpt-1.7b", cluster=draw(st.sampled_from(
            CLUSTER_PRESETS)), topology=name, out_p=out_p))
    files = [(name, content)]
    if kind == "plan":
        argv += draw(placement_flags(argv[0], base.get("hosts") or [], files))
    return Case("topofile", tuple(argv), tuple(files))


@st.composite
def placement_flags(draw, command: str, hosts: list, files: list) -> list[str]:
    """The placement options of search/estimate on a topology, sane or hostile; an
    ``estimate --placement FILE`` adds its (mutated) placement file to ``files``."""
    argv: list[str] = []
    if draw(chance(25)):
        argv += _opt(draw, "--placement-evaluations", st.sampled_from(["1", "10", "100"]))
    if draw(chance(20)):
        argv += _opt(draw, "--placement-time-s", st.sampled_from(["0.01", "0.5", "2.0"]))
    if draw(chance(20)):
        argv += _opt(draw, "--seed", st.sampled_from(["0", "1", "7"]))
    if command == "search" and draw(chance(20)):
        argv += _opt(draw, "--nodes-range", st.sampled_from(["1:2", "1:1", "2:4", "3:1",
                                                             "1:", ":2", "a:b", "1:2:3"]))
    if command == "estimate" and draw(chance(50)):
        kind = draw(st.sampled_from(["default", "optimized", "file", "file", "file"]))
        if kind != "file":
            return argv + ["--placement", kind]
        n = draw(st.sampled_from([1, 1, 2]))
        names = [h for h in hosts if isinstance(h, str)][:n] or ["h0"]
        doc = {"hosts": names, "gpu_order": [list(range(8)) for _ in names]}
        if draw(st.booleans()):
            doc = {"placement": doc}          # a plan document's placement
        ext, content = draw(document_file(doc, ext=draw(st.sampled_from([".json", ".yaml"])),
                                          key="hosts"))
        files.append(("placement" + ext, content))
        argv += ["--placement", "placement" + ext]
    return argv


NCCL_TESTS = ("sendrecv", "all_reduce", "alltoall", "all_gather", "reduce_scatter")
NCCL_NUMBERS = ["nan", "-nan", "inf", "-inf", "1e308", "1e309", "-1", "0", "N/A", "x",
                str(2**63), "9" * 40, "٣", "1,5", "0x10", "", "1e-320"]


@st.composite
def nccl_log(draw, hosts: list[str], gpus: int, test: str) -> str:
    new = draw(st.booleans())
    lines = []
    if new:
        lines += ["# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807",
                  f"# Collective test starting: {test}_perf"]
    lines += [f"# nThread 1 nGpus {1 if new else gpus} minBytes 33554432 maxBytes 134217728 "
              "step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
              "#", "# Using devices"]
    rank = 0
    for h in hosts:
        for d in range(gpus):
            group = "Group  0 " if new else ""
            lines.append(f"#  Rank {rank:2d} {group}Pid {1000 + rank} on {h:>10} device {d:2d} "
                         "[0000:1b:00] NVIDIA H100 80GB HBM3")
            rank += 1
    lines.append("#")
    if new:
        lines += ["#       size         count      type   redop    root     time   algbw   "
                  "busbw  #wrong     time   algbw   busbw  #wrong",
                  "#        (B)    (elements)                               (us)  (GB/s)  "
                  "(GB/s)             (us)  (GB/s)  (GB/s)"]
    else:
        lines += ["#       size         count      type   redop     time   algbw   busbw  "
                  "error     time   algbw   busbw  error",
                  "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)     "
                  "       (us)  (GB/s)  (GB/s)"]
    rows = draw(st.sampled_from([3, 1, 2, 4, 0]))
    for i in range(rows):
        size = 33554432 << i
        bw = draw(st.sampled_from([13.35, 180.6, 46.1, 0.01, 370.0]))
        vals = [f"{size}", f"{size // 8}", "double", "sum"] + (["-1"] if new else [])
        vals += [f"{size / bw / 1e3:.2f}", f"{bw:.2f}", f"{bw:.2f}", "0",
                 f"{size / bw / 1e3:.2f}", f"{bw:.2f}", f"{bw:.2f}", "N/A" if new else "0"]
        if draw(chance(25)):
            j = draw(st.integers(0, len(vals) - 1))
            vals[j] = draw(st.sampled_from(NCCL_NUMBERS))
        lines.append("  " + "  ".join(f"{v:>9}" for v in vals))
    if draw(chance(17)):
        lines.append(f"{hosts[0]}: Test NCCL failure common.cu:1234 'unhandled system error "
                     f"(run with NCCL_DEBUG=INFO for details)'")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 13.4454", "#"]
    if new:
        lines.append(f"# Collective test concluded: {test}_perf")
    return "\n".join(lines) + "\n"


@st.composite
def mangled_text(draw, text: str) -> str:
    """``text`` truncated, shuffled, with lines dropped/duplicated or garbage spliced in."""
    lines = text.splitlines(keepends=True)
    op = draw(st.sampled_from(["truncate", "shuffle", "garbage", "drop", "dup", "longline"]))
    if op == "truncate":
        return text[:draw(st.integers(0, len(text)))]
    if op == "shuffle":
        return "".join(draw(st.permutations(lines)))
    if op == "drop" and lines:
        i = draw(st.integers(0, len(lines) - 1))
        return "".join(lines[:i] + lines[i + 1:])
    if op == "dup" and lines:
        i = draw(st.integers(0, len(lines) - 1))
        return "".join(lines[:i] + lines[i:i + 1] * draw(st.sampled_from([2, 100, 20000]))
                       + lines[i + 1:])
    if op == "longline":
        return text + "#" + "x" * draw(st.sampled_from([10_000, 1_000_000])) + "\n"
    junk = _safe_text(draw(st.text(min_size=1, max_size=80)))
    pos = draw(st.integers(0, len(text)))
    return text[:pos] + junk + text[pos:]


@st.composite
def nccl_files(draw) -> list[tuple[str, bytes]]:
    files = []
    for k in range(draw(st.integers(1, 3))):
        test = draw(st.sampled_from(NCCL_TESTS))
        if test == "sendrecv":
            two = not draw(chance(25))
            hosts = _host_names(draw, 2 if two else 1)
            gpus = 1 if two else 2
        else:
            hosts = _host_names(draw, draw(st.integers(1, 3)))
            gpus = draw(st.sampled_from([1, 2, 8]))
        text = draw(nccl_log(hosts, gpus, test))
        r = draw(st.sampled_from(["plain"] * 7 + ["mangle"] * 2 + ["raw"]))
        if r == "mangle":
            text = draw(mangled_text(text))
        if r == "raw":
            data = draw(st.sampled_from([b"", b"\x00\x01", b"# nccl-tests version\n",
                                         b"#  Rank  0 Pid 1 on \xff\xfe device 0\n"]))
        else:
            data = _encode(text)
        fh = "_".join(hosts) if draw(st.booleans()) else "x"
        name = draw(st.sampled_from([f"nccl_N{len(hosts)}_G{gpus}_{fh}.log",
                                     f"{test}_{k}.log", f"{test}_perf_{fh}.txt"]))
        name = name.replace("/", "_")[:200] or "x.log"
        files.append((f"logs/{name}", data))
    # unique names
    seen, out = set(), []
    for n, d in files:
        while n in seen:
            n = n + "_"
        seen.add(n)
        out.append((n, d))
    return out


def _import_or_audit(draw, paths: list[str], out_p: int) -> list[str]:
    if draw(st.booleans()):
        argv = ["topology", "import", *paths, "-o", draw(st.sampled_from(["t.json", "t.yaml"]))]
        argv += draw(st.sampled_from([[], ["--json"], ["-v"], ["--json", "-v"],
                                      ["--merge", "median"], ["--merge", "p90", "--json"],
                                      ["--merge", draw(st.sampled_from(
                                          ["p100", "p0", "p1e3", "p٣", "p-1", "max", ""]))]]))
        return argv
    argv = ["audit", *paths]
    argv += ["--out", "report"] if draw(chance(out_p)) else (
        ["--json"] if not draw(chance(25)) else [])
    return argv


@st.composite
def nccl_cases(draw, out_p: int = 25) -> Case:
    files = draw(nccl_files())
    paths = ["logs"] if draw(st.booleans()) else [n for n, _ in files]
    return Case("nccl", tuple(_import_or_audit(draw, paths, out_p)), tuple(files))


NVSMI_CODES = ["NV12", "NV18", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
NVSMI_ODD = ["NV0", "NV999999999999999999999", "NV-1", "NV١٢", "NV²", "NV", "X", "x", "N/A",
             "", "SYS SYS", "\x1b[0m", "NV1e3", "NVnan"]


@st.composite
def nvsmi_text(draw) -> str:
    ngpu = draw(st.sampled_from([1, 2, 4, 8, 8, 0, 20]))
    nnic = draw(st.sampled_from([0, 2, 4]))
    mlx = draw(st.booleans())
    devs = [f"GPU{i}" for i in range(ngpu)] + [f"mlx5_{i}" if mlx else f"NIC{i}"
                                               for i in range(nnic)]
    sep = draw(st.sampled_from(["\t", "\t", "   "]))
    header = sep.join(devs + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    if draw(st.booleans()):
        header = "\x1b[4m" + header + "\x1b[0m"
    nv = draw(st.sampled_from(NVSMI_CODES))
    lines = [sep + header]
    for i, d in enumerate(devs):
        cells = []
        for j in range(len(devs)):
            if i == j:
                cells.append(" X ")
            elif i < ngpu and j < ngpu:
                cells.append(nv if not draw(chance(12)) else draw(st.sampled_from(
                    NVSMI_CODES + NVSMI_ODD)))
            else:
                cells.append(draw(st.sampled_from(["PIX", "PXB", "SYS", "NODE"])))
        tail = ["0-15", "0", "N/A"] if i < ngpu else ["", "", ""]
        lines.append(sep.join([d] + cells + tail))
    lines += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set "
              "of # NVLinks"]
    if nnic and not mlx:
        lines += ["", "NIC Legend:", ""] + [f"  NIC{i}: mlx5_{i}" for i in range(nnic)]
    return "\n".join(lines) + "\n"


@st.composite
def nvsmi_cases(draw, out_p: int = 25) -> Case:
    files = []
    hosts = _host_names(draw, draw(st.integers(1, 3)))
    data_dir = REPO / "tests" / "data"
    for h in hosts:
        if draw(chance(20)):
            text = (data_dir / draw(st.sampled_from(["nvidia-smi-topo_dgx-a100.txt",
                                                     "nvidia-smi-topo_dgx-h100.txt"]))
                    ).read_text()
        else:
            text = draw(nvsmi_text())
        if draw(chance(20)):
            text = draw(mangled_text(text))
        prefix = draw(st.sampled_from(["topo_", "nvidia-smi-topo_", "nvidia_smi_topo_m_", ""]))
        name = (prefix + h).replace("/", "_")[:200] + draw(st.sampled_from([".txt", ".log", ""]))
        if name.startswith("."):
            name = "_" + name
        files.append((f"smi/{name}", _encode(text)))
    files = list(dict(files).items())
    paths = ["smi"] if draw(st.booleans()) else [n for n, _ in files]
    return Case("nvsmi", tuple(_import_or_audit(draw, paths, out_p)), tuple(files))


_PLAN_TEXT: str | None = None


def base_plan_text() -> str:
    """A valid plan.json: ``configurator search --out`` run once (cached per process)."""
    global _PLAN_TEXT
    if _PLAN_TEXT is None:
        with tempfile.TemporaryDirectory(prefix="fuzz-plan-") as tmp:
            out = os.path.join(tmp, "out")
            proc = subprocess.run(
                [sys.executable, "-m", "configurator", "search", "--model", "gpt-1.7b",
                 "--cluster", "dgx-a100-80gb", "--nodes", "2", "--gbs", "64", "--out", out],
                capture_output=True, text=True, timeout=300, cwd=REPO,
                env=dict(_worker_env(), PYTHONWARNINGS="ignore"))
            if proc.returncode != 0:
                raise RuntimeError("configurator search --out failed: " + proc.stderr[-2000:])
            _PLAN_TEXT = Path(out, "plan.json").read_text(encoding="utf-8")
    return _PLAN_TEXT


def _plan_focus(path: tuple) -> bool:
    # Edits land on the model, cluster, plan and the estimate's summary keys, mostly.
    if not path:
        return True
    if path[0] != "estimate":
        return True          # (the placement, when there is one, included)
    return len(path) == 1 or path[1] in ("iteration_time_s", "model_tflops_per_gpu", "mfu",
                                         "peak_memory_bytes", "config")


@st.composite
def plan_cases(draw, out_p: int = 0) -> Case:
    base = json.loads(base_plan_text())
    if draw(chance(17)):                      # schema version 0
        base.pop("schema_version")
        base.pop("plan")
    elif draw(chance(40)):                    # a placement to enforce (2 nodes of 8 GPUs)
        hosts = _host_names(draw, 3)
        base["placement"] = dict(
            hosts=hosts[:2], gpu_order=[list(range(8)), list(range(7, -1, -1))],
            excluded_hosts=hosts[2:], method="optimized", iteration_time_s=1.0,
            default_iteration_time_s=1.1, random_median_iteration_time_s=1.05)
    if draw(chance(33)):
        base["model"]["name"] = _safe_text(draw(st.sampled_from(ODD_NAMES)))
    if draw(chance(20)):
        base["cluster"][draw(st.sampled_from(["name", "gpu"]))] = _safe_text(
            draw(st.sampled_from(ODD_NAMES)))
    ext, content = draw(document_file(base, ext=draw(st.sampled_from([".json"] * 4 + [".yaml"])),
                                      key="schema_version", focus=_plan_focus))
    name = "plan" + ext
    if draw(chance(20)):                      # explain: the mutated plan against the valid one
        files = ((name, content), ("valid.json", base_plan_text().encode()))
        pair = [name, "valid.json"] if draw(st.booleans()) else ["valid.json", name]
        return Case("plan", tuple(["explain", *pair] + draw(st.sampled_from([[], ["--json"]]))),
                    files)
    argv = ["launch", "--plan", name, "--out", "scripts"]
    if draw(chance(25)):
        argv += ["--nodes", draw(int_arg([1, 2, 4]))]
    if draw(chance(25)):
        argv += ["--data-path", _safe_text(draw(st.sampled_from(
            ["data/my_text_document", "a b", "$HOME/x", "x'y", "x\ny", "-", "名前"])))]
        if draw(st.booleans()):
            argv += ["--tokenizer-model", _safe_text(draw(st.sampled_from(
                ["tok.model", "t'o\"k", "$(id)", "a\u2028b"])))]
    if draw(chance(17)):
        argv += ["--force"]
    return Case("plan", tuple(argv), ((name, content),))


#: Values for path-like options that only read (never written to).
READ_PATHS = ["missing.yaml", ".", "/dev/null", "/dev/zero", "empty.yaml", "", "-", "model.yaml",
              "名前.yaml", "a\u2028b", "x\udcff"]
#: Values for options naming a directory or file the call writes: relative names only.
WRITE_PATHS = ["out", "out2/nested", "existing", "file.txt", "", "-", "名前", "a b", "x\udcff",
               "out/../out3"]
_ODD_VALUE = st.sampled_from(ODD_INT_ARGS + ODD_FLOAT_ARGS + WEIRD_STRINGS).map(
    lambda s: _safe_text(s.replace("\x00", "")))


def _opt(draw, flag: str, sane) -> list[str]:
    """``flag VALUE`` with a sane value mostly, an odd one otherwise (or no value)."""
    r = draw(st.sampled_from(["sane"] * 16 + ["odd"] * 3 + ["bare"]))
    if r == "bare":
        return [flag]
    if r == "odd":
        return [flag, draw(_ODD_VALUE)]
    return [flag, draw(sane) if isinstance(sane, st.SearchStrategy) else str(sane)]


@st.composite
def argv_cases(draw, out_p: int = 10) -> Case:
    files = [("model.yaml", _encode(dump_yaml(_model_base("gpt-1.7b")) or "")),
             ("empty.yaml", b""), ("file.txt", b"x"), ("existing/keep", b"x"),
             ("plan.json", base_plan_text().encode()),
             ("logs/nccl_N2_G1_hostA_hostB.log",
              _encode(draw(nccl_log(["hostA", "hostB"], 1, "sendrecv"))))]
    command = draw(st.sampled_from(["search", "estimate", "launch", "topology", "audit",
                                    "probe", "bogus", "", "--version", "--help", "-h"]))
    ints = lambda *xs: st.sampled_from([str(x) for x in xs])  # noqa: E731
    argv: list[str] = [command] if command else []
    if command in ("search", "estimate"):
        opts = [("--model", st.sampled_from(list(MODEL_PRESETS_SMALL) + READ_PATHS)),
                ("--cluster", st.sampled_from(list(CLUSTER_PRESETS) + READ_PATHS[:4])),
                ("--nodes", ints(1, 2, 4, 1000000, 32768, 32769, 0)),
                ("--gbs", ints(8, 64, 512, 2**24, 2**24 + 1)),
                ("--seq-length", ints(1, 2048, 2**24, 2**24 + 1)),
                ("--precision", st.sampled_from(["bf16", "fp16", "fp8", "fp4"])),
                ("--attention-backend", st.sampled_from(["auto", "flash", "local", "unfused"])),
                ("--topology", st.sampled_from(READ_PATHS))]
        if command == "search":
            opts += [("--top", ints(1, 10, 100000, 100001)),
                     ("--out", st.sampled_from(WRITE_PATHS)),
                     ("--recompute", st.sampled_from(["none", "full", "selective", "all"])),
                     ("--max-memory-fraction", st.sampled_from(["0.5", "1", "1e-300", "nan"])),
                     ("--wide", None), ("--force", None), ("--exclude-flagged", None),
                     ("--json", None)]
        else:
            opts += [("--tp", ints(1, 2, 8, 3, 262144)), ("--pp", ints(1, 2, 2048, 4096)),
                     ("--mbs", ints(1, 4, 2**24)), ("--cp", ints(1, 2)), ("--vp", ints(1, 2, 3)),
                     ("--recompute", st.sampled_from(["none", "full"])),
                     ("--ep", ints(1, 2, 8, 3, 65537)), ("--etp", ints(1, 2, 3)),
                     ("--decoder-first-pipeline-num-layers", ints(0, 1, 3, 2049)),
                     ("--account-for-loss-in-pipeline-split", None),
                     ("--sequence-parallel", None), ("--no-sequence-parallel", None),
                     ("--distributed-optimizer", None), ("--json", None)]
        required = {"--model", "--cluster", "--gbs"} | (
            {"--tp", "--pp", "--mbs"} if command == "estimate" else set())
    elif command == "launch":
        opts = [("--plan", st.sampled_from(["plan.json"] * 5 + READ_PATHS)),
                ("--out", st.sampled_from(WRITE_PATHS)), ("--nodes", ints(1, 2, 3, 0, 10**6)),
                ("--data-path", st.sampled_from(["d", "a b", "$x"])),
                ("--tokenizer-model", st.sampled_from(["t", "$(id)"])), ("--force", None)]
        required = {"--plan", "--out"}
    elif command == "topology":
        argv.append(draw(st.sampled_from(["import", "import", "import", "export", ""])))
        opts = [("-o", st.sampled_from(["t.json", "t.yaml"] + WRITE_PATHS)),
                ("--merge", st.sampled_from(["min", "median", "p50", "p101", "p", "mean"])),
                ("--force", None), ("--json", None), ("-v", None)]
        argv += draw(st.lists(st.sampled_from(["logs", "logs/nccl_N2_G1_hostA_hostB.log",
                                               "missing.log", "model.yaml", "."]),
                              max_size=3))
        required = {"-o"}
    elif command == "audit":
        opts = [("--topology", st.sampled_from(READ_PATHS)),
                ("--out", st.sampled_from(WRITE_PATHS)), ("--json", None), ("--force", None)]
        argv += draw(st.lists(st.sampled_from(["logs", "missing.log", "model.yaml"]),
                              max_size=2))
        required = set()
    elif command == "probe":
        opts = [("--nnodes", ints(1, 2, 16, 0, 10**6, 2**63)),
                ("--nproc-per-node", ints(1, 8, 0, 10**6)),
                ("--master-addr", st.sampled_from(["10.0.0.1", "$MASTER_ADDR", "a b", "h'x",
                                                   "$(id)", "", "名前"])),
                ("--master-port", ints(29500, 0, 65536, 2**63)), ("--slurm", None),
                ("--out", st.sampled_from(["topo.json", "a b.json", "$x"])),
                ("--size-mb", st.sampled_from(["32", "1e308", "1e-320", "0.5"])),
                ("--iters", ints(1, 5, 0, 10**9)), ("--warmup", ints(0, 2, -1)),
                ("--timeout-s", st.sampled_from(["120", "1e308", "0.001", "1e-320"])),
                ("--backend", st.sampled_from(["auto", "nccl", "gloo", "mpi"])),
                ("--expected-hosts", st.sampled_from(["a,b", "", "a,,b", "名前,٣"])),
                ("--force", None)]
        required = {"--nnodes", "--nproc-per-node"}
    else:
        opts, required = [("--json", None), ("--help", None)], set()
    chosen = [o for o in opts if o[0] in required and not draw(chance(6))]
    chosen += draw(st.lists(st.sampled_from(opts), max_size=5)) if opts else []
    for flag, values in chosen:
        if values is None:
            argv.append(flag)
        else:
            argv += _opt(draw, flag, values)
    if draw(chance(10)):       # stray tokens anywhere
        pos = draw(st.integers(0, len(argv)))
        argv.insert(pos, draw(_ODD_VALUE | st.sampled_from(["--help", "-h", "--version",
                                                            "--json=1", "--no-json", "-"])))
    if out_p and command == "search" and "--out" not in argv and draw(chance(out_p)):
        argv += ["--out", "out"]
    argv = [a.replace("\x00", "") for a in argv]
    return Case("argv", tuple(argv), tuple(files))


_STRATEGIES = {"model": model_cases, "cluster": cluster_cases, "hf_config": hf_config_cases,
               "topofile": topofile_cases, "nccl": nccl_cases, "nvsmi": nvsmi_cases,
               "plan": plan_cases, "argv": argv_cases}


def case_strategy(target: str, out_p: int | None = None) -> st.SearchStrategy[Case]:
    """The Hypothesis strategy of :class:`Case` for ``target``; ``out_p``: the percentage of
    calls that write ``--out`` files (plots) where the target has such calls."""
    if target not in _STRATEGIES:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    fn = _STRATEGIES[target]
    return fn() if out_p is None else fn(out_p=out_p)


# ============================================================================================
# Known hostile inputs (a fixed corpus, one or more per bug class; run by the quick profile)
# ============================================================================================

_SENDRECV = """\
# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: sendrecv_perf
# nThread 1 nGpus 1 minBytes 33554432 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid 1 on {a} device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid 2 on {b} device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
   134217728      16777216    double     sum      -1  9947.83   {bw}   {bw}       0  9927.85   13.52   13.52    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 13.4454
#
# Collective test concluded: sendrecv_perf
"""


def _yaml_doc(doc: dict, **over) -> bytes:
    d = dict(doc)
    d.update(over)
    return _encode(dump_yaml(d) or "")


def regression_cases() -> dict[str, list[Case]]:
    """Per target, fixed hostile inputs of every bug class seen so far (YAML alias bombs,
    tags, non-string keys, huge/non-finite numbers, HF strings and mappings, non-ASCII digits
    in host names, mathtext in names, huge node counts, line separators in argv, ...)."""
    m = _model_base("gpt-1.7b")
    ok = ("--cluster", "dgx-a100-80gb", "--gbs", "64", "--json")
    srch = lambda model, *extra: ("search", "--model", model, *ok, *extra)  # noqa: E731
    cl = dict(__import__("topology.cluster", fromlist=["x"]).CLUSTER_PRESETS["dgx-a100-80gb"])
    cl["nodes"] = 2
    csrch = lambda *extra: ("search", "--model", "gpt-1.7b", "--cluster", "cluster.yaml",  # noqa
                            "--gbs", "64", *extra)
    bomb = alias_bomb_inline(8)
    m_no = {k: v for k, v in m.items() if k != "num_layers"}
    out: dict[str, list[Case]] = {t: [] for t in TARGETS}
    model = lambda content, *argv: out["model"].append(  # noqa: E731
        Case("model", argv or srch("model.yaml"), (("model.yaml", content),)))
    model((dump_yaml(m_no) + f"num_layers: {bomb}\n").encode())
    model((dump_yaml(m_no) + f"num_layers: {bomb}\n").encode(),
          "search", "--model", "model.yaml", "--cluster", "dgx-a100-80gb", "--gbs", "64")
    model((alias_bomb(8) + dump_yaml(m)).encode())
    model(_yaml_doc(m, num_layers=2**63))
    model(_yaml_doc(m, hidden_size=10**400))
    model(_yaml_doc(m, vocab_size=1e308))
    model(_yaml_doc(m, seq_length=float("nan")))
    model(_yaml_doc(m, hidden_dropout=float("inf")))
    model(_yaml_doc(m, num_layers="24"))
    model(_yaml_doc(m, num_layers="٢٤"))
    model((dump_yaml(m) + "1: one\nnull: x\n? [a, b]\n: c\n").encode())
    model((dump_yaml(m_no) + "num_layers: !!timestamp 1\n").encode())
    model((dump_yaml({k: v for k, v in m.items() if k != "swiglu"}) + "swiglu: !!bool maybe\n"
           ).encode())
    model(_yaml_doc(m, name="$\\foo$"), "search", "--model", "model.yaml", "--cluster",
          "dgx-a100-80gb", "--gbs", "64", "--out", "out")
    model(_yaml_doc(m, name="a\u2028b"))
    model(b"")
    model(b"\x00\xff\xfe binary")
    model(("[" * 100000 + "]" * 100000).encode())
    model((dump_yaml(m) + "# " + "x" * 1_000_000 + "\n").encode())
    clus = lambda content, *argv: out["cluster"].append(  # noqa: E731
        Case("cluster", argv or csrch("--json"), (("cluster.yaml", content),)))
    clus(_yaml_doc(cl, nodes=2**63))
    clus(_yaml_doc(cl, nodes=1000000))
    clus(_yaml_doc(cl, gpus_per_node=1e308))
    clus(_yaml_doc(cl, inter_node_bandwidth_GBps=float("nan")))
    clus(_yaml_doc(cl, intra_node_latency_us="3"))
    clus(_yaml_doc(cl, name="$\\foo$"), *csrch("--out", "out"))
    clus(_yaml_doc(cl, gpu=dict(GPU_MAPPING, name="$x^$")), *csrch("--out", "out"))
    clus(_yaml_doc(cl, gpu=dict(GPU_MAPPING, num_sms=2**64)))
    clus((dump_yaml({k: v for k, v in cl.items() if k != "nodes"}) + f"nodes: {bomb}\n"
          ).encode())
    clus(_yaml_doc(cl), "search", "--model", "gpt-1.7b", "--cluster", "cluster.yaml", "--gbs",
         "64", "--nodes", "1000000", "--json")
    hf = lambda cfg, path="hf-model/config.json", *extra: out["hf_config"].append(  # noqa
        Case("hf_config", srch(path, *extra), ((path, _encode(json.dumps(cfg))),)))
    hf({"n_embd": {}, "n_head": 12, "n_layer": 12})
    hf({"n_embd": "768", "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "vocab_size": 50257})
    hf(dict(HF_LLAMA, hidden_size="2048"))
    hf(dict(HF_LLAMA, num_hidden_layers=2**63))
    hf(dict(HF_LLAMA, max_position_embeddings=float("inf")))
    hf(dict(HF_LLAMA, tie_word_embeddings="false"))
    hf(dict(HF_LLAMA, model_type=["llama"], hidden_act={"a": 1}))
    hf(dict(HF_LLAMA, model_type={"llama": 1}))
    hf(dict(HF_QWEN3_MOE, mlp_only_layers=3))
    hf(dict(HF_DEEPSEEK, n_shared_experts="1", moe_intermediate_size="512"))
    hf(dict(HF_MIXTRAL, sliding_window="4096"))
    hf(dict(HF_LLAMA, num_local_experts=8, num_experts_per_tok=2))   # experts, not mixtral
    hf(dict(HF_DEEPSEEK, first_k_dense_replace=10**9))
    hf(HF_LLAMA, "$\\foo$/config.json", "--out", "out")
    hf(HF_LLAMA, "a\u2028b/config.json")
    tb = {"hosts": ["²", "node1²"], "gpus_per_host": 1, "links": [
        dict(src="²", dst="node1²", src_gpu=None, dst_gpu=None, bandwidth_GBps=12.5,
             latency_us=None, link_class="network", message_bytes=2**25,
             method="nccl-tests sendrecv_perf busbw", timestamp=None)]}
    topo = lambda content, *argv: out["topofile"].append(  # noqa: E731
        Case("topofile", argv or ("audit", "--topology", "topo.yaml", "--json"),
             (("topo.yaml", content),)))
    topo(_yaml_doc(tb))
    topo(_yaml_doc(tb), "topology", "import", "topo.yaml", "-o", "t.json", "--json")
    topo(_yaml_doc(tb), "search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
         "--gbs", "64", "--topology", "topo.yaml", "--json")
    topo(_yaml_doc(tb, hosts=["$\\foo$", "$x^$"], links=[]), "audit", "--topology",
         "topo.yaml", "--out", "report")
    topo(b"hosts: !!timestamp 1\nlinks: []\n")
    topo(_yaml_doc(tb, gpus_per_host=2**63))
    topo(_yaml_doc(tb, links=[dict(tb["links"][0], bandwidth_GBps=1e308, message_bytes=10**30,
                                   latency_us=float("nan"))]))
    topo(f"hosts: {bomb}\nlinks: []\n".encode())
    # placements and the placement options on a measured topology
    est = ("estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
           "--tp", "8", "--pp", "2", "--mbs", "1", "--nodes", "2", "--topology", "topo.yaml",
           "--json")
    ab = _yaml_doc(tb, hosts=["hostA", "hostB"], links=[
        dict(tb["links"][0], src="hostA", dst="hostB")])
    for place in ({"hosts": ["hostA", "hostA"]}, {"hosts": ["hostA", "nope"]},
                  {"hosts": ["hostA"]}, {"hosts": ["²", "hostB"]},
                  {"hosts": ["hostA", "hostB"], "gpu_order": [[0] * 8, list(range(8))]},
                  {"hosts": ["hostA", "hostB"], "gpu_order": [list(range(9))] * 2},
                  {"hosts": ["hostA", "hostB"], "gpu_order": [[2**63] * 8] * 2},
                  {"hosts": ["hostA", "hostB"], "gpu_order": [list(range(8))]},
                  {"placement": {"hosts": "hostA"}}, {"hosts": {"a": 1}}, [1, 2],
                  {"hosts": None}, {"hosts": ["hostB", "hostA"], "extra": 1}):
        out["topofile"].append(Case("topofile", (*est, "--placement", "p.yaml"),
                                    (("topo.yaml", ab),
                                     ("p.yaml", _encode(dump_yaml(place) or "")))))
    out["topofile"].append(Case("topofile", (*est, "--placement", "p.yaml"),
                                (("topo.yaml", ab), ("p.yaml", f"hosts: {bomb}\n".encode()))))
    for flags in (("--nodes-range", "1:99999"), ("--nodes-range", "2:1"),
                  ("--nodes-range", "\u0663:\u0664"), ("--nodes", "3"),
                  ("--placement-evaluations", "0"), ("--placement-evaluations", str(2**63)),
                  ("--placement-time-s", "nan"), ("--placement-time-s", "1e309"),
                  ("--seed", "-1"), ("--seed", "9" * 400)):
        topo(_yaml_doc(tb), "search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
             "--gbs", "64", "--topology", "topo.yaml", "--json", *flags)
    nccl = lambda files, *argv: out["nccl"].append(  # noqa: E731
        Case("nccl", argv or ("topology", "import", "logs", "-o", "t.json", "--json"),
             tuple(files)))
    for a, b in (("²", "node1²"), ("\u0663\u00b2", "1\u2070"), ("x" * 300, "node10")):
        nccl([("logs/a.log", _encode(_SENDRECV.format(a=a, b=b, bw="13.35")))])
    nccl([("logs/a.log", _encode(_SENDRECV.format(a="$\\foo$", b="$x^$", bw="13.35")))],
         "audit", "logs", "--out", "report")
    nccl([("logs/a.log", _encode(_SENDRECV.format(a="hostA", b="hostB", bw="1e309")))])
    nccl([("logs/a.log", _encode(_SENDRECV.format(a="hostA", b="hostB", bw="nan")))],
         "audit", "logs", "--json")
    nccl([("logs/nccl_N2_G1_²_node1².log", b"# nThread 1 nGpus 1 minBytes 1\n")])
    smi_text = (REPO / "tests" / "data" / "nvidia-smi-topo_dgx-a100.txt").read_text()
    smi = lambda files, *argv: out["nvsmi"].append(  # noqa: E731
        Case("nvsmi", argv or ("topology", "import", "smi", "-o", "t.json", "--json"),
             tuple(files)))
    smi([("smi/topo_².txt", _encode(smi_text)), ("smi/topo_node1².txt", _encode(smi_text))])
    smi([("smi/topo_$\\foo$.txt", _encode(smi_text))], "audit", "smi", "--out", "report")
    smi([("smi/topo_h.txt", _encode(smi_text.replace("NV12", "NV999999999999999999999")))])
    smi([("smi/topo_h.txt", _encode(smi_text.replace("NV12", "NV١٢")))])
    plan_doc = json.loads(base_plan_text())

    def plan(edit, *extra, name="plan.json"):
        d = json.loads(json.dumps(plan_doc))
        edit(d)
        out["plan"].append(Case("plan", ("launch", "--plan", name, "--out", "scripts", *extra),
                                ((name, _encode(json.dumps(d, allow_nan=True))),)))
    plan(lambda d: d["estimate"].update(mfu=float("nan")))
    plan(lambda d: d["estimate"].update(iteration_time_s=float("inf")))
    plan(lambda d: d["plan"].update(tp=2**63))
    plan(lambda d: d["model"].update(num_layers=10**400))
    plan(lambda d: d["model"].update(name="$\\foo$ $(id)'\""))
    plan(lambda d: d["cluster"].update(name="a\u2028b"))
    plan(lambda d: d.update({"1": 2}), "--nodes", "1000000")
    plan(lambda d: d["model"].update({"1": 2}))
    plan(lambda d: None, "--nodes", str(2**63))
    plan(lambda d: None, "--data-path", "a'b\"$(id)`x`", "--tokenizer-model", "a\u2028b")
    files = (("plan.json", base_plan_text().encode()),)
    for argv in (("estimate", "a\x0bb", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                  "--gbs", "8", "--tp", "1", "--pp", "1", "--mbs", "1"),
                 ("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
                  "extra\u2028token"),
                 ("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
                  "--nodes", "1000000", "--json"),
                 ("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs",
                  "9" * 400, "--json"),
                 ("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
                  "--max-memory-fraction", "nan", "--json"),
                 ("estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs",
                  "64", "--tp", "262144", "--pp", "2048", "--mbs", "1", "--json"),
                 ("search", "--model", "/dev/zero", "--cluster", "dgx-a100-80gb", "--gbs",
                  "64"),
                 ("launch", "--plan", "plan.json", "--out", "s", "--nodes", "1000000"),
                 ("probe", "--nnodes", str(2**63), "--nproc-per-node", "8"),
                 ("probe", "--nnodes", "2", "--nproc-per-node", "8", "--timeout-s", "1e308",
                  "--size-mb", "1e-320"),
                 ("topology", "import", "/dev/zero", "-o", "t.json")):
        out["argv"].append(Case("argv", argv, files))
    return out


# ============================================================================================
# Worker (runs in the subprocess)
# ============================================================================================

def _send(fh, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(struct.pack("<Q", len(data)) + data)
    fh.flush()


def _recv_exact(fh, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = fh.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _recv(fh):
    (n,) = struct.unpack("<Q", _recv_exact(fh, 8))
    return pickle.loads(_recv_exact(fh, n))


def _status_kib(pid: int | str, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _strict_json_problem(text: str) -> str | None:
    """None if ``text`` is strict JSON; else what is wrong."""
    def bad_constant(name):
        raise ValueError(f"non-finite number {name}")

    try:
        json.loads(text, parse_constant=bad_constant)
    except ValueError as err:
        msg = str(err)
        return "NaN/Infinity" if msg.startswith("non-finite") else f"not JSON ({msg[:80]})"
    return None


def _product_frame(tb_frames) -> tuple[str | None, str | None]:
    """(deepest product frame 'path:line in func', deepest frame overall outside it)."""
    prod, last = None, None
    for fr in tb_frames:
        rel = _relpath(fr.filename)
        loc = f"{rel}:{fr.lineno} in {fr.name}"
        if rel.split("/", 1)[0] in PRODUCT_DIRS:
            prod, last = loc, None
        else:
            last = loc
    return prod, last


def _relpath(filename: str) -> str:
    try:
        return str(Path(filename).resolve().relative_to(REPO))
    except ValueError:
        parts = Path(filename).parts
        for marker in ("site-packages", "lib"):
            if marker in parts:
                i = len(parts) - 1 - parts[::-1].index(marker)
                return "/".join(parts[i + 1:])
        return filename


def _run_in_worker(msg: dict, base: str, main) -> dict:
    import contextlib
    import warnings

    argv, files = msg["argv"], msg["files"]
    d = tempfile.mkdtemp(dir=base)
    inputs = set()
    for rel, data in files:
        p = os.path.join(d, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as fh:
            fh.write(data)
        inputs.add(os.path.normpath(rel))
    os.chdir(d)
    try:
        with open("/proc/self/clear_refs", "w") as fh:   # resets VmHWM (peak RSS)
            fh.write("5")
    except OSError:
        pass
    out_b, err_b = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_b, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(err_b, encoding="utf-8", errors="backslashreplace",
                           write_through=True)
    res: dict[str, Any] = {"kind": None, "code": None, "exc_type": None, "exc": None,
                           "traceback": None, "where": None, "raised_in": None}
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res["kind"], res["code"] = "return", main(list(argv))
        except SystemExit as e:
            res["kind"], res["code"] = "exit", e.code
        except BaseException as e:  # noqa: BLE001 - the point is to catch everything
            res["kind"] = "memory" if isinstance(e, MemoryError) else "exception"
            res["exc_type"] = type(e).__name__
            try:
                res["exc"] = str(e)[:500]
            except Exception:  # noqa: BLE001
                res["exc"] = "<unprintable>"
            frames = traceback.extract_tb(e.__traceback__)
            res["where"], res["raised_in"] = _product_frame(frames)
            res["traceback"] = "".join(traceback.format_exception(e))[-6000:]
            del e
    res["seconds"] = time.perf_counter() - t0
    res["peak_rss"] = _status_kib("self", "VmHWM") * 1024
    try:
        out.flush()
        err.flush()
    except Exception:  # noqa: BLE001
        pass
    stderr = err_b.getvalue().decode("utf-8", errors="replace")
    # Warnings as a fresh process would print them: once per location, default filters.
    seen = set()
    for w in caught:
        if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning,
                                   ImportWarning, ResourceWarning)):
            continue
        key = (str(w.message), w.category, w.filename, w.lineno)
        if key not in seen:
            seen.add(key)
            stderr += warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
    res["stdout"] = out_b.getvalue().decode("utf-8", errors="replace")
    res["stderr"] = stderr
    # .json files the call wrote (or rewrote)
    written = []
    for root, _, names in os.walk(d):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), d)
            if n.endswith(".json") and rel not in inputs:
                try:
                    with open(os.path.join(root, n), encoding="utf-8", errors="replace") as fh:
                        problem = _strict_json_problem(fh.read(MEMORY_LIMIT // 4))
                except OSError as e:
                    problem = f"unreadable ({e})"
                written.append((rel, problem))
    res["written_json"] = written
    os.chdir(base)
    shutil.rmtree(d, ignore_errors=True)
    return res


def worker_main() -> None:
    """Serve inputs on stdin (length-prefixed pickles), answer on stdout."""
    import gc
    import resource

    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)          # stray writes to fd 1 must not corrupt the protocol
    sys.path[:] = [str(REPO)] + [p for p in sys.path if p not in ("", str(REPO))]
    os.environ.pop("COLUMNS", None)
    from configurator.cli import main
    # modules the commands import lazily: loaded now, not timed against the first input
    import topology.audit  # noqa: F401
    import topology.importers  # noqa: F401
    import configurator.report.table  # noqa: F401
    import launchers  # noqa: F401

    vm = _status_kib("self", "VmSize") * 1024
    limit = vm + MEMORY_LIMIT + 512 * 2**20
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass
    base = tempfile.mkdtemp(prefix="fuzz-worker-")
    _send(proto_out, {"ready": True, "pid": os.getpid()})
    try:
        while True:
            try:
                msg = _recv(proto_in)
            except EOFError:
                break
            try:
                res = _run_in_worker(msg, base, main)
            except MemoryError:
                res = {"kind": "memory", "code": None, "stdout": "", "stderr": "",
                       "exc_type": "MemoryError", "where": None, "traceback": None,
                       "seconds": 0.0, "peak_rss": 0, "written_json": []}
            gc.collect()
            _send(proto_out, res)
    finally:
        os.chdir("/")
        shutil.rmtree(base, ignore_errors=True)


# ============================================================================================
# Runner (parent side)
# ============================================================================================

def _worker_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                        "MASTER_ADDR", "MASTER_PORT", "SLURM_NODEID", "NODE_RANK",
                        "PYTHONWARNINGS", "COLUMNS")}
    # CONFIGURATOR_DEBUG: main() re-raises unexpected exceptions instead of its one-line
    # "internal error" (exit 1), so the traceback names where the bug is.
    env.update(CONFIGURATOR_DEBUG="1", MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", PYTHONIOENCODING="utf-8")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get(
        "PYTHONPATH", "").split(os.pathsep) if p])
    return env


class _Worker:
    def __init__(self, timeout: float, mem_limit: int):
        self.timeout, self.mem_limit = timeout, mem_limit
        self.log = tempfile.NamedTemporaryFile(prefix="fuzz-worker-", suffix=".stderr",
                                               delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import tests.fuzzing as f; f.worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, cwd=REPO,
            env=_worker_env(), start_new_session=True)
        self.served = 0
        hello = self._wait(120.0)
        if not isinstance(hello, dict) or not hello.get("ready"):
            err = self._log_tail()
            self.kill()
            raise RuntimeError(f"fuzz worker did not start: {hello!r}\n{err}")

    def _log_tail(self) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _wait(self, timeout: float):
        """The worker's next message, or ("hang"|"memory"|"crash", detail)."""
        t0 = time.monotonic()
        fd = self.proc.stdout.fileno()
        peak = 0
        while True:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    return _recv(self.proc.stdout)
                except (EOFError, pickle.UnpicklingError, struct.error):
                    rc = self.proc.wait()
                    return ("crash", f"worker died (exit {rc}"
                            + (f", signal {signal.Signals(-rc).name}" if rc < 0 else "") + ")",
                            peak)
            rss = _status_kib(self.proc.pid, "VmRSS") * 1024
            peak = max(peak, rss)
            if rss > self.mem_limit:
                self.kill()
                return ("memory", f"RSS {rss / 2**30:.2f} GiB", peak)
            if time.monotonic() - t0 > timeout:
                self.kill()
                return ("hang", f"no answer in {timeout:g} s", peak)
            if self.proc.poll() is not None:
                continue   # select will see EOF

    def run(self, case: Case) -> dict:
        self.served += 1
        try:
            _send(self.proc.stdin, {"argv": list(case.argv), "files": list(case.files)})
        except (BrokenPipeError, OSError):
            return {"kind": "crash", "detail": "worker pipe closed"}
        t0 = time.monotonic()
        res = self._wait(self.timeout)
        if isinstance(res, tuple):
            kind, detail, peak = res
            return {"kind": kind, "detail": detail, "peak_rss": peak,
                    "seconds": time.monotonic() - t0, "log": self._log_tail()}
        return res

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()
        for fh in (self.proc.stdin, self.proc.stdout):
            try:
                fh.close()
            except OSError:
                pass

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


@dataclass(frozen=True)
class Failure:
    category: str       # one of CATEGORIES
    signature: str      # grouping key: one root cause
    detail: str


@dataclass
class Outcome:
    case: Case
    result: dict
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def report(self) -> str:
        r = self.result
        lines = [f"{self.case!r}", f"  result: {r.get('kind')} code={r.get('code')!r} "
                 f"{r.get('seconds', 0):.2f}s peak_rss={r.get('peak_rss', 0) / 2**20:.0f} MiB"]
        for f in self.failures:
            lines.append(f"  FAIL [{f.category}] {f.signature}: {f.detail}")
        if r.get("stderr"):
            lines.append("  stderr: " + repr(r["stderr"][-1500:]))
        if r.get("traceback"):
            lines.append("  " + r["traceback"][-3000:].replace("\n", "\n  "))
        if r.get("log"):
            lines.append("  worker stderr: " + r["log"][-1500:])
        return "\n".join(lines)


def _command_of(argv) -> str:
    words = [a for a in argv if not a.startswith("-")][:2]
    if words and words[0] == "topology":
        return " ".join(words[:2])
    return words[0] if words else "(none)"


def _norm(text: str) -> str:
    return re.sub(r"\d+", "N", text)


def classify(case: Case, res: dict) -> list[Failure]:
    """The failures of one result (see the module docstring)."""
    fails: list[Failure] = []
    cmd = _command_of(case.argv)
    kind = res.get("kind")
    if kind == "hang":
        return [Failure("hang", f"hang in {cmd}", res.get("detail", ""))]
    if kind == "crash":
        return [Failure("traceback", f"{res.get('detail', 'worker died')} in {cmd}",
                        res.get("log", "")[-500:])]
    if kind == "memory":
        where = res.get("where") or res.get("detail") or ""
        return [Failure("memory", f"over memory in {cmd}"
                        + (f" at {_strip_line(where)}" if res.get("where") else ""),
                        res.get("detail") or res.get("exc_type") or "")]
    if res.get("peak_rss", 0) > MEMORY_LIMIT:
        fails.append(Failure("memory", f"over memory in {cmd}",
                             f"peak RSS {res['peak_rss'] / 2**30:.2f} GiB"))
    if kind == "exception":
        where = res.get("where") or "?"
        raised = f" (raised in {res['raised_in']})" if res.get("raised_in") else ""
        fails.append(Failure("traceback", f"{res['exc_type']} at {where}{raised}",
                             (res.get("exc") or "")[:300]))
        return fails
    code = res.get("code")
    if code is None:
        code = 0
    if isinstance(code, bool) or not isinstance(code, int) or code not in (0, 2, 3):
        fails.append(Failure("traceback", f"exit code {code!r} from {cmd}",
                             (res.get("stderr") or "")[:300]))
        return fails
    stderr = res.get("stderr") or ""
    if "MemoryError" in stderr:       # main() turns a MemoryError into a one-line exit 2
        fails.append(Failure("memory", f"MemoryError (caught) in {cmd}",
                             stderr.strip()[:300]))
    if code in (2, 3):
        lines = stderr.splitlines()
        if len(lines) != 1 or not lines[0].strip():
            warn = re.search(r"^(.*?):(\d+): (\w+Warning): ", stderr, re.M)
            if warn:
                sig = f"warning on stderr: {warn.group(3)} at {_relpath(warn.group(1))}:" \
                      f"{warn.group(2)}"
            else:
                first = lines[0] if lines else ""
                m = re.match(r"^(\S+: (?:error|no feasible plan): )(argument [^:]+|[^=:]*)",
                             first)
                sig = f"multi-line error from {cmd} (exit {code}): " + (
                    _norm(m.group(1) + m.group(2)) if m else _norm(first[:40]) or "<empty>")
            fails.append(Failure("multiline", sig, repr(stderr[:300])))
    if kind == "return" and code == 0 and "--json" in case.argv:
        problem = _strict_json_problem(res.get("stdout") or "")
        if problem:
            fails.append(Failure("json", f"--json stdout of {cmd}: {problem.split(' (')[0]}",
                                 problem))
    for rel, problem in res.get("written_json") or []:
        if problem:
            fails.append(Failure("json", f"{cmd} wrote {os.path.basename(rel)}: "
                                         f"{problem.split(' (')[0]}", problem))
    return fails


def _strip_line(where: str) -> str:
    return re.sub(r":\d+ in ", " in ", where)


class Runner:
    """Feeds cases to one long-lived worker per target (see the module docstring)."""

    def __init__(self, timeout: float = TIMEOUT_S, mem_limit: int = MEMORY_LIMIT,
                 recycle_after: int = RECYCLE_AFTER):
        self.timeout, self.mem_limit, self.recycle_after = timeout, mem_limit, recycle_after
        self._workers: dict[str, _Worker] = {}
        self.runs = 0

    def _worker(self, target: str) -> _Worker:
        w = self._workers.get(target)
        if w is not None and (not w.alive or w.served >= self.recycle_after):
            w.close()
            w = None
        if w is None:
            w = self._workers[target] = _Worker(self.timeout, self.mem_limit)
        return w

    def run(self, case: Case) -> Outcome:
        w = self._worker(case.target)
        res = w.run(case)
        self.runs += 1
        if res.get("kind") in ("hang", "crash", "memory"):
            w.close()
            self._workers.pop(case.target, None)
        return Outcome(case, res, classify(case, res))

    def close_target(self, target: str) -> None:
        w = self._workers.pop(target, None)
        if w is not None:
            w.close()

    def close(self) -> None:
        for t in list(self._workers):
            self.close_target(t)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ============================================================================================
# Shrinking and reproducers
# ============================================================================================

def _candidates_argv(argv: tuple[str, ...]):
    n = len(argv)
    for i in range(1, n):
        if argv[i].startswith("-") and i + 1 < n and not argv[i + 1].startswith("-"):
            yield argv[:i] + argv[i + 2:]
        yield argv[:i] + argv[i + 1:]


def _ddmin_lines(data: bytes):
    lines = data.splitlines(keepends=True)
    n = len(lines)
    chunk = max(1, n // 2)
    while chunk >= 1 and n > 1:
        for start in range(0, n, chunk):
            yield b"".join(lines[:start] + lines[start + chunk:])
        if chunk == 1:
            break
        chunk //= 2


def _long_line_cuts(data: bytes):
    lines = data.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if len(line) > 120:
            body = line.rstrip(b"\r\n")
            end = line[len(body):]
            for cut in (body[:len(body) // 2], body[:80]):
                yield b"".join(lines[:i] + [cut + end] + lines[i + 1:])


def _structural(data: bytes):
    """Smaller documents: a key or list item removed (JSON or alias-free YAML)."""
    if len(data) > 200_000 or b"*" in data and b"&" in data:
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    as_json = text.lstrip().startswith(("{", "["))
    try:
        if as_json:
            doc = json.loads(text)
        else:
            import yaml

            doc = yaml.safe_load(text)
    except Exception:  # noqa: BLE001 - any parse failure: nothing structural to do
        return
    if not isinstance(doc, (dict, list)):
        return
    indent = 1 if "\n" in text.strip() else None

    def dump(d):
        s = dump_json(d, indent=indent) if as_json else dump_yaml(d)
        return None if s is None else _encode(s)

    same = dump(doc)
    if same is not None and same != data:
        yield same
    for path in sorted(_paths(doc)[1:], key=len):
        d = _deepcopy(doc)
        parent = _get(d, path[:-1])
        try:
            del parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        s = dump(d)
        if s is not None:
            yield s


def shrink(runner: Runner, outcome: Outcome, signature: str | None = None,
           max_runs: int = 150, max_seconds: float = 60.0) -> Outcome:
    """A smaller case whose failures include ``signature`` (default: the first failure's),
    found greedily: argv tokens dropped, files dropped, document keys/lines removed, long
    lines cut. Stops after ``max_runs`` calls or ``max_seconds``."""
    sig = signature or outcome.failures[0].signature
    best = outcome
    t0, runs = time.monotonic(), 0

    def budget() -> bool:
        return runs < max_runs and time.monotonic() - t0 < max_seconds

    def attempt(case: Case) -> bool:
        nonlocal best, runs
        if case.size() >= best.case.size() or not budget():
            return False
        runs += 1
        o = runner.run(case)
        if any(f.signature == sig for f in o.failures):
            best = o
            return True
        return False

    progress = True
    while progress and budget():
        progress = False
        files = best.case.files
        for i in range(len(files)):
            if attempt(Case(best.case.target, best.case.argv, files[:i] + files[i + 1:])):
                progress = True
                break
        if progress:
            continue
        for argv in list(_candidates_argv(best.case.argv)):
            if attempt(Case(best.case.target, argv, best.case.files)):
                progress = True
                break
        if progress:
            continue
        for i, (name, data) in enumerate(files):
            for gen in (_structural, _ddmin_lines, _long_line_cuts):
                for new in gen(data):
                    cand = files[:i] + ((name, new),) + files[i + 1:]
                    if attempt(Case(best.case.target, best.case.argv, cand)):
                        progress = True
                        break
                    if not budget():
                        break
                if progress or not budget():
                    break
            if progress or not budget():
                break
    return best


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:60] or "failure"


def save_case(outcome: Outcome, directory: str | os.PathLike, signature: str) -> Path:
    """Write a reproducer: ``input/`` (the files), ``argv.json``, ``command.sh`` (run from
    anywhere) and ``outcome.txt``. Returns the directory."""
    d = Path(directory)
    (d / "input").mkdir(parents=True, exist_ok=True)
    for rel, data in outcome.case.files:
        p = d / "input" / os.fsdecode(_encode(rel))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (d / "argv.json").write_text(json.dumps(list(outcome.case.argv), ensure_ascii=True) + "\n")
    (d / "command.sh").write_text(
        "#!/bin/sh\n# reproducer: " + signature.replace("\n", " ") + "\n"
        'cd "$(dirname "$0")/input" || exit 1\n' + outcome.case.command() + "\n",
        encoding="utf-8", errors="surrogateescape")
    (d / "outcome.txt").write_text(outcome.report() + "\n", encoding="utf-8",
                                   errors="backslashreplace")
    return d


def describe_files(case: Case, limit: int = 600) -> str:
    """The files of ``case`` as text for a report (as a Python literal when not plain)."""
    out = []
    for rel, data in case.files:
        head = f"--- {rel!r} ({len(data)} bytes) ---"
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            out.append(f"{head} not UTF-8:\n{_preview(data, limit)}")
            continue
        cut = text[:limit]
        more = "" if len(text) <= limit else f"\n... [{len(text) - limit} more characters]"
        out.append(head + "\n" + (cut if _plain(cut) else repr(cut)) + more)
    return "\n".join(out)


def _plain(text: str) -> bool:
    return all(c.isprintable() or c in "\n\t" for c in text)


def run_target(runner: Runner, target: str, examples: int, *, seed: int | None = 0,
               out_p: int | None = None, on_outcome: Callable[[Outcome], None] | None = None,
               ) -> list[Outcome]:
    """Run ``examples`` generated cases of ``target`` (no Hypothesis shrinking); returns every
    outcome."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    outcomes: list[Outcome] = []

    @settings(max_examples=examples, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck), derandomize=seed is None,
              print_blob=False)
    @given(case_strategy(target, out_p))
    def explore(case):
        o = runner.run(case)
        outcomes.append(o)
        if on_outcome is not None:
            on_outcome(o)

    if seed is not None:
        explore = hseed(seed)(explore)
    explore()
    return outcomes


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker_main()
