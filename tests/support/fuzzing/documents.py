"""Hostile values and documents: numbers, strings, names and host names that break parsers,
YAML/JSON documents mutated from a valid one (values replaced, keys added, deleted or renamed)
and their serialisation, and raw hostile texts (alias bombs, tags, deep nesting, binary,
truncated, BOM, line separators, ...)."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from hypothesis import strategies as st

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


def encode(text: str) -> bytes:
    """UTF-8, lone surrogates becoming the raw bytes they stand for (invalid UTF-8)."""
    return text.encode("utf-8", errors="surrogateescape") if _has_surrogate(text) else \
        text.encode("utf-8")


def _has_surrogate(text: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in text)


def safe_text(text: str) -> str:
    """Characters that survive as file content (surrogates only as \\udc80-\\udcff)."""
    return "".join(c if not ("\ud800" <= c <= "\udfff") or "\udc80" <= c <= "\udcff"
                   else "?" for c in text)


hostile_scalar = (st.sampled_from(HUGE_INTS + ODD_FLOATS + SMALL_INTS + [None, True, False])
                  | st.sampled_from(WEIRD_STRINGS).map(safe_text)
                  | st.integers() | st.floats() | st.text(max_size=12).map(safe_text))
json_like = st.recursive(hostile_scalar,
                         lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=6).map(safe_text), inner,
                                           max_size=4),
                         max_leaves=12)
odd_key = (st.sampled_from([1, 0, -1, 1.5, True, False, None, 2**64, float("nan"), "",
                            "extra", "name ", "Name", "num_layers\u200b", "<<", "?"])
           | st.text(max_size=8).map(safe_text))


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

def doc_paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys/indices) to a node of ``doc``, the root included."""
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += doc_paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += doc_paths(v, prefix + (i,))
    return out


def doc_at(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def copy_doc(doc):
    if isinstance(doc, dict):
        return {k: copy_doc(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [copy_doc(v) for v in doc]
    return doc


@st.composite
def mutated_doc(draw, base: Any, max_mutations: int = 4, focus: Callable | None = None):
    """``base`` (a JSON-like tree) with 0..``max_mutations`` edits: a value replaced by a
    hostile one (or a hostile variant of itself), a key deleted or added (non-string keys
    too), a key renamed. ``focus`` (path -> bool) restricts where edits land, when it can."""
    doc = copy_doc(base)
    n = draw(st.sampled_from([0, 0, 1, 1, 1, 2, 2, 3, max_mutations]))
    for _ in range(n):
        paths = doc_paths(doc)
        if focus is not None:
            paths = [p for p in paths if focus(p)] or paths
        path = draw(st.sampled_from(paths))
        node = doc_at(doc, path)
        op = draw(st.sampled_from(["set", "set", "variant", "delete", "add", "rename"]))
        if not path and op in ("set", "variant", "delete", "rename"):
            op = "add" if isinstance(doc, dict) else "set"
        if op == "add" and not isinstance(node, (dict, list)):
            op = "set"
        if op == "rename" and not isinstance(doc_at(doc, path[:-1]), dict):
            op = "delete"
        parent = doc_at(doc, path[:-1]) if path else None
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
                value = safe_text(value)
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
        junk = safe_text(draw(st.text(min_size=1, max_size=40)))
        return encode(data[:pos] + junk + data[pos:])
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
    return ext, encode(text)
