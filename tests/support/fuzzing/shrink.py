"""Shrinking and reproducers: :func:`shrink` reduces a failing case to a smaller one with the
same failure signature; :func:`save_case` writes a reproducer directory and
:func:`describe_files` prints a case's files for a report."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from tests.support.fuzzing.case import Case, preview
from tests.support.fuzzing.documents import (copy_doc, doc_at, doc_paths, dump_json, dump_yaml,
                                             encode)
from tests.support.fuzzing.runner import Outcome, Runner


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
        return None if s is None else encode(s)

    same = dump(doc)
    if same is not None and same != data:
        yield same
    for path in sorted(doc_paths(doc)[1:], key=len):
        d = copy_doc(doc)
        parent = doc_at(d, path[:-1])
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


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:60] or "failure"


def save_case(outcome: Outcome, directory: str | os.PathLike, signature: str) -> Path:
    """Write a reproducer: ``input/`` (the files), ``argv.json``, ``command.sh`` (run from
    anywhere) and ``outcome.txt``. Returns the directory."""
    d = Path(directory)
    (d / "input").mkdir(parents=True, exist_ok=True)
    for rel, data in outcome.case.files:
        p = d / "input" / os.fsdecode(encode(rel))
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
            out.append(f"{head} not UTF-8:\n{preview(data, limit)}")
            continue
        cut = text[:limit]
        more = "" if len(text) <= limit else f"\n... [{len(text) - limit} more characters]"
        out.append(head + "\n" + (cut if _plain(cut) else repr(cut)) + more)
    return "\n".join(out)


def _plain(text: str) -> bool:
    return all(c.isprintable() or c in "\n\t" for c in text)
