"""Import nccl-tests logs (``sendrecv_perf``, ``alltoall_perf``, ``all_reduce_perf`` ...).

A log holds one or more test *sections* (several binaries run one after another, each may
start with ``# nccl-tests version`` and ``# Collective test starting: <name>``). Each section:

* ``#  Rank  0 Group  0 Pid 440010 on cnode2-001 device  0 [...] NVIDIA H100 80GB HBM3``
  lines (older builds omit ``Group``) give the hosts, in rank order, and the GPUs per host;
* a header naming the columns. Newer builds (≥ 2.13): ``size count type redop root time
  algbw busbw #wrong time algbw busbw #wrong``; older ones: no ``root`` and ``error`` instead
  of ``#wrong``. Columns are found by name: the first ``time/algbw/busbw`` are out-of-place,
  the second in-place (NVIDIA/nccl-tests src/common.cu, doc/PERFORMANCE.md);
* data rows (size in bytes, times in µs, bandwidths in GB/s = 1e9 B/s), then
  ``# Avg bus bandwidth : X``. A failed run prints ``<host>: Test NCCL failure ...`` instead.

The figure is a robust α–β fit over every data row of the section
(:func:`topology.linkfit.fit_alpha_beta`; Hockney's model ``time(n) = α + n / β``): each row
gives two samples (out-of-place and in-place ``time``, µs), and β is expressed as BUS
bandwidth, algbw × the test's factor over its ``k`` ranks (sendrecv 1, all_reduce
``2(k−1)/k``, all_gather/reduce_scatter/alltoall ``(k−1)/k``; doc/PERFORMANCE.md). Timings off
the fit (e.g. a sweep that collapses at its largest sizes, 0.97 GB/s at 16 GiB after
6.6–8.4 GB/s up to 512 MiB) are left out as outliers, with a warning that names their sizes.
What a record carries: ``bandwidth_Bps``/``busbw_Bps`` the fitted β; ``latency_s`` the fitted
α when the sweep resolves it (:attr:`topology.linkfit.LinkFit.latency_resolved`), else None;
``message_bytes`` the largest size the fit kept; ``samples_Bps`` (links) every busbw value of
the section, sizes ascending, out-of-place then in-place; ``method``
``"nccl-tests <test> busbw alpha-beta fit over <N> sizes"`` (N distinct sizes of the sweep).
Warnings also for ``#wrong``/``error`` values, for a largest fitted size below 32 MiB (the
bandwidth then rests on latency-affected sizes) and for every edge case of the fit. A section
whose rows carry busbw but no usable time falls back to the bus bandwidth at the largest size
(method ending ``"at the largest size"``). What becomes what:

* ``sendrecv_perf`` over exactly two hosts → host-level :class:`LinkMeasurement` both ways
  (2 ranks exchange both directions at once; with G GPUs per host the ranks form a ring, so
  one inter-node hop per direction carries the traffic: ``rails_used = 1``);
  over one host with two ranks → GPU-level intra-node links;
* anything else → :class:`CollectiveMeasurement` (``op`` = test name without ``_perf``).

A section without data rows yields a :class:`MissingMeasurement` and a warning, never an
exception. Host names and GPU counts come from the Rank lines, else from the file name
``nccl_N<nodes>_G<gpus>_<hostA>_<hostB>.log``; the test name from the section, else from
the file name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import pairwise

from configurator.core.units import GB, US, MiB
from configurator.core.validate import MAX_NAME_CHARS
from topology.linkfit import bus_factor, fit_alpha_beta
from topology.topofile import (CollectiveMeasurement, LinkMeasurement, MissingMeasurement,
                               Topology, host_sort_key)

#: A sweep whose largest fitted message is below this gets a warning: from 32 MiB up the
#: latency is about 1 % of a transfer's time on the shipped H100 sweeps
#: (:mod:`topology.linkfit`), so the fitted bandwidth is not latency-bound. Set by hand;
#: docs/measure.md asks for ``-b 32M`` accordingly.
MIN_GOOD_MESSAGE_BYTES = 32 * MiB
METHOD = "nccl-tests {test} busbw"

_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+"
                   r"device\s+(\d+)(?:\s+\[[^\]]*\]\s+(?P<name>\S.*?))?\s*$")
_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_FAIL = re.compile(r"Test (?:NCCL |CUDA )?failure\s+\S+\s*(?:'([^']*)')?")
_FILENAME = re.compile(r"N(\d+)_G(\d+)_(.+)$")
_TESTS = ("sendrecv", "all_reduce", "all_gather", "alltoall", "reduce_scatter", "broadcast",
          "reduce", "gather", "scatter", "hypercube")

#: Signature lines: a text holding one of these is taken for an nccl-tests log.
SIGNATURES = (re.compile(r"^# nccl-tests version", re.M),
              re.compile(r"^#\s*Collective test starting:", re.M),
              re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+\d+", re.M),
              re.compile(r"^#\s+size\s+count\s+type\s", re.M))


def looks_like_nccl_tests(text: str) -> bool:
    return any(s.search(text) for s in SIGNATURES)


@dataclass
class _Section:
    test: str | None = None
    ranks: dict[int, tuple[str, int]] = field(default_factory=dict)
    gpu_names: dict[str, None] = field(default_factory=dict)
    columns: list[str] | None = None
    rows: list[list[str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    bad_rows: int = 0
    has_nthread: bool = False

    @property
    def started(self) -> bool:
        return bool(self.test or self.ranks or self.columns or self.rows or self.has_nthread)


def _split_sections(lines: list[str]) -> list[_Section]:
    sections = [_Section()]
    for raw in lines:
        line = raw.rstrip()
        cur = sections[-1]
        if line.startswith("# nccl-tests version"):
            if cur.started:
                sections.append(_Section())
            continue
        m = _START.match(line)
        if m:
            if cur.test or cur.rows or cur.columns:
                cur = _Section()
                sections.append(cur)
            cur.test = m.group(1)
            continue
        if re.match(r"^#\s*nThread\s", line):
            if cur.has_nthread:
                cur = _Section(test=None)
                sections.append(cur)
            cur.has_nthread = True
            continue
        m = _RANK.match(line)
        if m:
            cur.ranks[int(m.group(1))] = (m.group(2), int(m.group(3)))
            if m.group("name"):
                cur.gpu_names[m.group("name")] = None
            continue
        if line.startswith("#"):
            toks = line[1:].split()
            if toks[:2] == ["size", "count"] and "busbw" in toks:
                if cur.rows:  # a second table without a new section header
                    cur = _Section(test=cur.test, ranks=dict(cur.ranks))
                    sections.append(cur)
                cur.columns = toks
            continue
        f = _FAIL.search(line)
        if f:
            cur.failures.append((f.group(1) or line.strip()).strip(" /"))
            continue
        toks = line.split()
        if not toks:
            continue
        if cur.columns and re.fullmatch(r"[0-9]+", toks[0]):
            if len(toks) == len(cur.columns):
                cur.rows.append(toks)
            else:
                cur.bad_rows += 1
        elif (cur.columns or cur.ranks) and " NCCL " not in line:
            cur.bad_rows += 1  # NCCL_DEBUG lines are expected noise, not malformed rows
    return [s for s in sections if s.started]


def _from_filename(name: str) -> tuple[str | None, int | None, list[str]]:
    """(test, gpus_per_host, hosts) as far as ``nccl_N2_G1_<a>_<b>.log`` tells."""
    stem = name.rsplit("/", 1)[-1]
    stem = re.sub(r"\.(log|txt|out)$", "", stem)
    test = next((t for t in _TESTS if t in stem.lower()), None)
    m = _FILENAME.search(stem)
    if not m:
        return test, None, []
    nodes, gpus, rest = int(m.group(1)), int(m.group(2)), m.group(3)
    parts = rest.split("_")
    hosts = parts if len(parts) == nodes else []
    return test, gpus, hosts


def _number(tok: str) -> float | None:
    try:
        x = float(tok)
    except ValueError:
        return None
    return x if x == x and abs(x) != float("inf") else None


@dataclass
class _Figure:
    """What one section yields: bus bandwidth (bytes/s), latency (s or None), largest size
    behind the figure (bytes), the per-size busbw values (bytes/s) and a method suffix."""
    bandwidth_Bps: float
    latency_s: float | None
    message_bytes: int
    samples_Bps: tuple[float, ...]
    how: str


def _gb(x: float) -> str:
    return f"{x / GB:.3g} GB/s"


def _size(n: int) -> str:
    """Bytes as the sweeps print them: 512 MiB, 16 GiB, 1000 B."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _figure(sec: _Section, where: str, warnings: list[str], op: str,
            ranks: int) -> _Figure | None:
    """The section's figure: an α–β fit over every row (out-of-place and in-place times),
    β as bus bandwidth; when no row has a usable time, the bus bandwidth at the largest size
    with one. None when no row has a usable figure at all."""
    cols = sec.columns
    busbw = [i for i, c in enumerate(cols) if c == "busbw"]
    times = [i for i, c in enumerate(cols) if c == "time"]
    wrong = [i for i, c in enumerate(cols) if c in ("#wrong", "error")]
    rows = sorted(sec.rows, key=lambda r: int(r[0]))
    samples: list[float] = []
    sizes_bw: dict[int, list[float]] = {}
    n_b: list[int] = []
    t_s: list[float] = []
    bad: list[tuple[int, str, str]] = []   # (size, column, value)
    for row in rows:
        size = int(row[0])
        vals = [_number(row[i]) for i in busbw]
        vals = [x * GB for x in vals if x is not None and x > 0]
        samples.extend(vals)
        if vals:
            sizes_bw.setdefault(size, []).extend(vals)
        for i in times:
            x = _number(row[i])
            if x is not None and x > 0 and size > 0:
                n_b.append(size)
                t_s.append(x * US)
        for i in wrong:
            w = _number(row[i])
            if w is not None and ((cols[i] == "#wrong" and w > 0)
                                  or (cols[i] == "error" and w > 1e-3)):
                bad.append((size, cols[i], row[i]))
                break
    if not n_b and not sizes_bw:
        return None
    largest = int(rows[-1][0])
    if bad:
        size, col, val = bad[-1]
        more = f" and {len(bad) - 1} more size(s)" if len(bad) > 1 else ""
        warnings.append(f"{where}: {col} = {val} at {size} B{more}; figure kept, but the data "
                        "did not validate")
    if not n_b:
        size = max(sizes_bw)
        vals = sizes_bw[size]
        warnings.append(f"{where}: no usable time column; took the busbw at {_size(size)} "
                        "instead of an alpha-beta fit")
        if size < largest:
            warnings.append(f"{where}: no usable busbw at the largest size {largest} B; "
                            f"took {size} B")
        return _Figure(bandwidth_Bps=min(vals), latency_s=None, message_bytes=size,
                       samples_Bps=tuple(vals), how="at the largest size")
    fit = fit_alpha_beta(n_b, t_s, bus_factor=bus_factor(op, ranks))
    for note in fit.notes:
        warnings.append(f"{where}: {note}")
    if fit.outliers:
        top = max(n_b)
        at_top = sizes_bw.get(top)
        tail = ""
        if top in fit.outlier_bytes and at_top:
            tail = (f"; at the largest size {top} B busbw {_gb(min(at_top))} vs fitted "
                    f"{_gb(fit.bandwidth_Bps)}")
        out = fit.outlier_bytes
        span = (_size(out[0]) if len(out) == 1
                else f"{len(out)} sizes, {_size(out[0])} to {_size(out[-1])}")
        warnings.append(f"{where}: {fit.outliers} of {fit.outliers + fit.samples} timings off "
                        f"the alpha-beta fit ({span}) left out as outliers{tail}")
    if max(n_b) < largest:
        warnings.append(f"{where}: no usable time at the largest size {largest} B; fitted up "
                        f"to {max(n_b)} B")
    if fit.max_message_bytes < MIN_GOOD_MESSAGE_BYTES:
        warnings.append(f"{where}: largest message fitted {fit.max_message_bytes} B is below "
                        "32 MiB; the bandwidth rests on latency-affected sizes")
    lat = fit.latency_s if fit.latency_resolved else None
    how = f"alpha-beta fit over {len(set(n_b))} sizes"
    return _Figure(bandwidth_Bps=fit.bandwidth_Bps, latency_s=lat,
                   message_bytes=fit.max_message_bytes, samples_Bps=tuple(samples), how=how)


def parse_nccl_tests(text: str, name: str = "<log>") -> Topology:
    """Parse one nccl-tests log (``name`` is its file name, used for hosts/test fallbacks and
    in messages). Returns a partial :class:`Topology`; problems become warnings and
    missing entries, never exceptions."""
    warnings: list[str] = []
    links: list[LinkMeasurement] = []
    colls: list[CollectiveMeasurement] = []
    missing: list[MissingMeasurement] = []
    hosts_seen: dict[str, None] = {}
    gpus_seen: list[int] = []
    f_test, f_gpus, f_hosts = _from_filename(name)
    sections = _split_sections(text.splitlines())
    if not sections:
        warnings.append(f"{name}: no nccl-tests section found")
    for sec in sections:
        test = (sec.test or (f"{f_test}_perf" if f_test else None) or "unknown_perf")
        where = f"{name}: {test}"
        if sec.ranks:
            order = [sec.ranks[r] for r in sorted(sec.ranks)]
            hosts = list(dict.fromkeys(h for h, _ in order))
            per_host = {h: sum(1 for x, _ in order if x == h) for h in hosts}
            gpus = min(per_host.values())
            if len(set(per_host.values())) > 1:
                warnings.append(f"{where}: uneven GPUs per host {per_host}; using {gpus}")
            if f_hosts and set(f_hosts) != set(hosts):
                warnings.append(f"{where}: Rank lines name hosts {hosts}, the file name "
                                f"{f_hosts}; using the Rank lines")
        else:
            hosts, gpus, order = list(f_hosts), f_gpus, []
        hosts_seen.update(dict.fromkeys(hosts))
        if gpus:
            gpus_seen.append(gpus)
        g_txt = f"G={gpus}" if gpus else "G=?"
        base = test.removesuffix("_perf")
        ranks = len(order) or len(hosts) * (gpus or 1)
        fig = (_figure(sec, where, warnings, base, ranks) if sec.columns and sec.rows
               else None)
        if fig is None:
            if sec.failures:
                reason = f"failed: {sec.failures[0]}"
            elif sec.columns:
                reason = "no data rows (the run stopped before the first size)"
            else:
                reason = "no result table (the run stopped during setup)"
            warnings.append(f"{where} {g_txt}: {reason}")
            pairs = list(pairwise(hosts)) if len(hosts) > 1 else [(h, h) for h in hosts]
            if not pairs:
                warnings.append(f"{where}: no host names in the log or its file name")
            for a, b in pairs:
                missing.append(MissingMeasurement(
                    src=a, dst=b, reason=f"{name}: {test} {g_txt}: {reason}"))
            continue
        if sec.bad_rows:
            warnings.append(f"{where}: skipped {sec.bad_rows} malformed line(s)")
        if sec.failures:
            warnings.append(f"{where}: failure after some rows: {sec.failures[0]}")
        method = f"{METHOD.format(test=test)} {fig.how}"
        bw, lat, size, vals = fig.bandwidth_Bps, fig.latency_s, fig.message_bytes, fig.samples_Bps
        if base == "sendrecv" and len(hosts) == 2 and gpus:
            a, b = hosts
            for s, d in ((a, b), (b, a)):
                links.append(LinkMeasurement(
                    src=s, dst=d, src_gpu=None, dst_gpu=None, bandwidth_Bps=bw,
                    latency_s=lat, link_class="network", message_bytes=size, method=method,
                    timestamp=None, samples_Bps=vals, gpus_per_host=gpus,
                    rails_used=1))
        elif base == "sendrecv" and len(hosts) == 1 and len(order) == 2:
            (h, g0), (_, g1) = order
            for s, d in ((g0, g1), (g1, g0)):
                links.append(LinkMeasurement(
                    src=h, dst=h, src_gpu=s, dst_gpu=d, bandwidth_Bps=bw,
                    latency_s=lat, link_class="intra-node", message_bytes=size,
                    method=method, timestamp=None, samples_Bps=vals, gpus_per_host=2))
        elif hosts and gpus:
            colls.append(CollectiveMeasurement(
                hosts=tuple(hosts), gpus_per_host=gpus, op=base, busbw_Bps=bw,
                latency_s=lat, message_bytes=size, method=method, timestamp=None))
        else:
            warnings.append(f"{where}: busbw found but no host names; figure dropped")
    names = list(dict.fromkeys(n for sec in sections for n in sec.gpu_names))
    if len(names) > 1:
        warnings.append(f"{name}: Rank lines name several GPUs ({', '.join(names)})")
    gpu_name = names[0] if len(names) == 1 else None
    if gpu_name is not None and not (gpu_name.isprintable()
                                     and len(gpu_name) <= MAX_NAME_CHARS):
        warnings.append(f"{name}: the Rank lines' GPU name is not a printable name of at most "
                        f"{MAX_NAME_CHARS} characters; left out")
        gpu_name = None
    return Topology(hosts=tuple(sorted(hosts_seen, key=host_sort_key)),
                    gpus_per_host=max(gpus_seen) if gpus_seen else None,
                    links=tuple(links), collectives=tuple(colls), missing=tuple(missing),
                    warnings=tuple(warnings),
                    gpu_name=gpu_name)
