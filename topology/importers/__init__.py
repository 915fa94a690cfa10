"""Importers: measurement files → :class:`topology.topofile.Topology`.

Formats, detected per file from its content:

* ``nccl-tests`` logs (:mod:`topology.importers.nccl_tests`);
* ``nvidia-smi topo -m`` output (:mod:`topology.importers.nvidia_smi`); the host name is the
  file's stem without a leading ``nvidia-smi``/``topo`` word (``topo_node7.txt`` → ``node7``);
* topology files written by :func:`topology.topofile.save_topology` (e.g. by the probe).

:func:`import_paths` takes files and directories (walked recursively, hidden entries
skipped), merges everything with one policy and lists, as missing, every host pair of an
inter-node sweep that has no link measurement.
"""

from __future__ import annotations

import dataclasses

import os
import re
from itertools import combinations
from pathlib import Path
from typing import Iterable

from configurator.core.errors import InputError
from configurator.core.units import MiB
from topology.importers.nccl_tests import looks_like_nccl_tests, parse_nccl_tests
from topology.importers.nvidia_smi import looks_like_topo_matrix, parse_topo_matrix
from configurator.core.limits import MAX_FILE_BYTES
from topology.topofile import (MissingMeasurement, Topology, check_policy, host_sort_key,
                               merge_topologies)
from topology.topofile_io import load_topology

FORMATS = ("nccl-tests", "nvidia-smi", "topology")
#: Files from which an import shows a progress bar unless asked (set by hand).
PROGRESS_MIN_FILES = 20
_TOPO_FORMAT = re.compile(r"[\"']?format[\"']?\s*:\s*[\"']?configurator-topology")


def detect_format(text: str) -> str | None:
    """``"nccl-tests"``, ``"nvidia-smi"``, ``"topology"`` or None (unknown)."""
    head = text.lstrip()[:4096]
    if _TOPO_FORMAT.search(head):
        return "topology"
    if looks_like_nccl_tests(text):
        return "nccl-tests"
    if looks_like_topo_matrix(text):
        return "nvidia-smi"
    if all(re.search(rf"^\s*[\"']?{k}[\"']?\s*:", text, re.M) for k in ("hosts", "links")):
        return "topology"
    return None


def host_from_filename(path: str | os.PathLike) -> str:
    """Host name for a topo -m file: its stem without a leading nvidia-smi/topo word."""
    stem = Path(path).name.split(".")[0]
    # the "-m" of "topo -m" only after "topo": a host named "m-01" keeps its name
    host = re.sub(r"^(nvidia[-_]?smi)?[-_]?(topo(?:[-_]m(?=[-_]))?)?[-_]?", "", stem)
    return host or stem or "localhost"


def _read_text(path: Path) -> str | None:
    """File text, or None when it is too big or binary (NUL bytes / not text)."""
    if path.stat().st_size > MAX_FILE_BYTES:
        return None
    data = path.read_bytes()
    if b"\x00" in data:
        return None
    return data.decode("utf-8", errors="replace")


def _read_file(p: Path) -> str:
    try:
        text = _read_text(p)
    except OSError as err:
        raise InputError("path", str(p), f"cannot read file ({err.strerror})") from None
    if text is None:
        raise InputError("path", str(p), f"binary or larger than {MAX_FILE_BYTES // MiB} MiB; "
                                         "not a measurement file")
    return text


def _parse(p: Path, text: str, fmt: str) -> Topology:
    if fmt == "nccl-tests":
        return parse_nccl_tests(text, p.name)
    if fmt == "nvidia-smi":
        return parse_topo_matrix(text, host_from_filename(p))
    if fmt == "topology":
        return load_topology(p)
    raise InputError("format", fmt, f"must be one of {', '.join(FORMATS)}")


def import_file(path: str | os.PathLike, fmt: str | None = None) -> Topology:
    """Import one file; ``fmt`` forces a format. Raises InputError for an unreadable,
    oversized, binary or unrecognised file, or a malformed topology file."""
    p = Path(path)
    text = _read_file(p)
    fmt = fmt or detect_format(text)
    if fmt is None:
        raise InputError("path", str(p), "not an nccl-tests log, 'nvidia-smi topo -m' output "
                                         "or topology file")
    return _parse(p, text, fmt)


def _collect(paths: Iterable[str | os.PathLike]) -> list[tuple[Path, bool]]:
    """(file, named explicitly) for every path; directories walked in sorted order."""
    out = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                out.extend((Path(root) / f, False) for f in sorted(files)
                           if not f.startswith("."))
        elif p.is_file():
            out.append((p, True))
        else:
            raise InputError("path", str(raw), "no such file or directory")
    return out


def _why_empty(path: Path, text: str, topo: Topology) -> str:
    """Why a parsed file measured nothing, for a one-line error: its last line and the
    parser's first word on it (``line 28: alltoall_perf G=8: no data rows (the run stopped
    before the first size)``)."""
    lines = text.count("\n") + (not text.endswith("\n"))
    said = next((w for w in topo.warnings), None) or next(
        (m.reason for m in topo.missing), None) or "no measurement record"
    prefix = f"{path.name}: "
    said = said[len(prefix):] if said.startswith(prefix) else said
    return f"line {lines}: the file ends with no measurement ({said})"


def fill_missing_pairs(topo: Topology) -> Topology:
    """Add a :class:`MissingMeasurement` for every pair of hosts that take part in inter-node
    measurements (links or missing entries) but have neither a link nor a missing entry."""
    net = {h for l in topo.links if l.src != l.dst for h in (l.src, l.dst)}
    if not net:
        return topo
    net |= {h for m in topo.missing if m.src != m.dst for h in (m.src, m.dst)}
    covered = topo.measured_pairs() | {frozenset((m.src, m.dst)) for m in topo.missing}
    extra = tuple(MissingMeasurement(src=a, dst=b, reason="no inter-node link measurement "
                                                          "for this pair in the inputs")
                  for a, b in combinations(sorted(net, key=host_sort_key), 2)
                  if frozenset((a, b)) not in covered)
    if not extra:
        return topo
    return dataclasses.replace(topo, missing=topo.missing + extra)


def import_paths(paths: Iterable[str | os.PathLike], policy: str = "min",
                 progress: bool | None = None) -> Topology:
    """Import files and directories into one :class:`Topology`.

    Each file's format is detected from its content. Explicitly named files must be
    recognised (InputError otherwise); unrecognised files inside directories are skipped with
    one warning. Duplicates are merged with ``policy`` (min | median | pNN). A progress bar
    (tqdm, on stderr) appears for ≥ 20 files when ``progress`` is None and stderr is a
    terminal. Raises InputError for a missing path, a bad policy, or when nothing was found.
    """
    from configurator.core.progress import progress as bar

    check_policy(policy)
    files = _collect(paths)
    if not files:
        raise InputError("path", [str(p) for p in paths], "holds no files")
    topos, skipped = [], []
    empty: list[tuple[Path, str]] = []    # files that measured nothing: (path, why)
    shown = (None if len(files) >= PROGRESS_MIN_FILES else False) if progress is None \
        else progress           # None: only on a terminal
    for path, explicit in bar(files, desc="import", unit="file", shown=shown):
        try:
            text = _read_file(path)
            fmt = detect_format(text)
        except InputError:
            fmt = None
        if fmt is None:
            if explicit:
                import_file(path)  # raises the InputError that says why
            skipped.append(path.name)
            continue
        topo = _parse(path, text, fmt)
        if not topo.links and not topo.collectives:
            empty.append((path, _why_empty(path, text, topo)))
        topos.append(topo)
    if topos and len(empty) == len(topos):
        path, why = empty[0]
        more = f" (and {len(empty) - 1} more file(s) like it)" if len(empty) > 1 else ""
        raise InputError("path", str(path), f"{why}: no link or collective measured{more}, "
                                            "so there is nothing to audit or plan on")
    if not topos:
        raise InputError("path", [str(p) for p in paths],
                         "holds no nccl-tests log, 'nvidia-smi topo -m' output or topology "
                         "file")
    merged = merge_topologies(topos, policy)
    warnings = merged.warnings
    if skipped:
        shown = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5
                                          else "")
        warnings += (f"skipped {len(skipped)} file(s) of unknown format: {shown}",)
    merged = dataclasses.replace(merged, hosts=tuple(sorted(merged.hosts, key=host_sort_key)),
                                 warnings=warnings)
    return fill_missing_pairs(merged)
