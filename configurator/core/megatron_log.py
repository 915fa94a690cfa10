"""Measured runs from Megatron-LM training logs (the text ``pretrain_gpt.py`` prints).

:func:`runs_from_megatron_log` reads a log's text, :func:`load_megatron_log` a log file;
both return :class:`~configurator.core.runs.MeasuredRun` objects built through
:func:`~configurator.core.runs.run_from_mapping` (the same checks as a run file), the model a
:class:`~configurator.core.model.ModelSpec` named after the log.

Lines read (formats of Megatron-LM core_v0.16.1; iteration lines without the leading
timestamp, as older Megatron-LM prints them, read too):

* the arguments dump of ``megatron/training/arguments.py`` ``_print_args``, printed once by
  rank 0 at the job's start, one argument a line, sorted, ``str()`` of each value::

      ------------------------ arguments ------------------------
        tensor_model_parallel_size ...................... 2
        inference_dynamic_batching_cuda_graph_max_tokens  16384
      -------------------- end of arguments ---------------------

  (``48 - len(name)`` dots; a name of 48 or more characters gets two spaces). Each dump
  starts a new run: a log of a job restarted in the same file gives one run per start
  with iteration lines (named ``NAME#k``, k counting those starts; a start with too few
  lines is left out when another has enough).
  It gives the model and the plan as :mod:`configurator.core.megatron_args` maps them
  (:data:`~configurator.core.megatron_args.MODEL_ARGS`,
  :data:`~configurator.core.megatron_args.PLAN_ARGS`).
* the vocabulary: ``padded_vocab_size`` is ``None`` in the dump unless given on the command
  line (the tokenizer is built after the dump), so the tokenizer's line
  ``> padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)`` gives it; without
  either, a ``NullTokenizer``'s ``vocab_size`` + 1 padded as Megatron pads it.
* ``training_log``'s iteration lines, printed by the last rank every ``--log-interval``
  iterations and after the first::

       [2025-11-03 10:14:49.733105] iteration        3/      20 | consumed samples: ... |
       elapsed time per iteration (ms): 4752.4 | throughput per GPU (TFLOP/s/GPU): 354.9 |
       learning rate: ... | global batch size:    64 | lm loss: ... | ...

  (one line). The first lines are warm-up: the first report's timer is not reset, so the
  second report averages over the first iteration too. The first ``skip_iterations``
  logged lines are dropped (default: 10 % of them, at least 2), after those of a smaller
  global batch (``--rampup-batch-size``) and repeated reports; the median of the rest's
  ``elapsed time per iteration (ms)`` is ``iteration_time_s`` and, when logged
  (``--log-throughput``), the median ``throughput per GPU (TFLOP/s/GPU)`` is
  ``tflops_per_gpu`` counted by ``flops_formula`` (default
  ``megatron``: Megatron-LM core_v0.16.1's ``num_floating_point_operations``; logs of
  Megatron-LM before 2025 count full attention: ``megatron-full-attention``).
* the hosts line the tool's launch scripts print before Megatron starts
  (``configurator: hosts cnode2-001 cnode2-002``: the job's hosts in node_rank order, from
  the placement or SLURM's node list) gives the run's ``hosts``, which
  ``validate``/``calibrate --topology`` price it on; a log without one names no hosts. A
  placement's GPU order (``configurator: gpu_order 0,4,1,5 0,4,1,5``: each node_rank's
  ``CUDA_VISIBLE_DEVICES``) gives the run's ``gpu_order``, the GPUs whose links each local
  rank takes.
* ``report_memory``'s lines ``[Rank 0] (after 10 iterations) memory (MB) | allocated: ... |
  max allocated: ... | reserved: ... | max reserved: 62286.00``, printed by the ranks of
  data-parallel rank 0. "MB" is MiB (bytes / 2**20); the largest ``max reserved``
  (``torch.cuda.max_memory_reserved``, a peak since the start) over the ranks and reports
  is ``peak_memory_GiB``.

Every line may carry a prefix (a timestamp, ``[rank0]:``, ``srun -l``'s ``0: ``); other
lines are ignored. Units: seconds, TFLOP/s per GPU, GiB. Bounds: at most
:data:`MAX_LOG_BYTES` bytes and :data:`MAX_LOG_LINES` lines are read, lines longer than
:data:`MAX_LINE_CHARS` are skipped; anything unreadable is an :class:`InputError`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import statistics
from array import array
from typing import Any, Iterable, Iterator, Mapping

from configurator.core.errors import InputError
from configurator.core.megatron_args import (MegatronArgs, finite_number, model_fields,
                                             plan_fields, split_overrides)
from configurator.core.model import ModelSpec, make_model
from configurator.core.runs import MeasuredRun, run_from_mapping

#: Largest log read (bytes or characters).
MAX_LOG_BYTES = 256 * 2**20
#: Most lines read from one log.
MAX_LOG_LINES = 10_000_000
#: Longer lines are skipped (characters).
MAX_LINE_CHARS = 2**20
#: Most arguments dumps (job starts) in one log.
MAX_SEGMENTS = 1000
#: Most arguments kept from one dump (Megatron-LM core_v0.16.1 prints about 650).
MAX_ARGS = 20_000

_HEADER = re.compile(r"-{3,} arguments -{3,}")
_END = re.compile(r"-{3,} end of arguments -{3,}")
_ARG = re.compile(r"(?:^|\s)([A-Za-z_]\w*) (\.+) (.*?)\s*$")
_LONG_ARG = re.compile(r"(?:^|\s)([A-Za-z_]\w{47,})  (.*?)\s*$")
_ITERATION = re.compile(r"\biteration\s+(\d{1,15})\s*/\s*(\d{1,15})\s*\|(.*)")
_MAX_RESERVED = re.compile(r"\|\s*max reserved:\s*([0-9][0-9.eE+]*)")
#: What the tool's launch scripts print before Megatron starts, followed by the job's hosts
#: in node_rank order (``launchers.script_parts.hosts_line``): read into the run's ``hosts``.
HOSTS_LINE_PREFIX = "configurator: hosts "
#: The same for a placement's GPU order, one comma-separated list per node_rank
#: (``CUDA_VISIBLE_DEVICES``): read into the run's ``gpu_order``.
GPU_ORDER_LINE_PREFIX = "configurator: gpu_order "
#: The run keys the launch scripts' lines give, with their prefix and pattern.
_PLACEMENT_LINES = {key: (prefix, re.compile(r"\b" + re.escape(prefix.rstrip())
                                             + r"((?: +\S+)+)\s*$"))
                    for key, prefix in (("hosts", HOSTS_LINE_PREFIX),
                                        ("gpu_order", GPU_ORDER_LINE_PREFIX))}
_PADDED = re.compile(r"padded vocab \(size: (\d{1,12})\) with -?\d{1,12} dummy tokens "
                     r"\(new size: (\d{1,12})\)")
_NO_ARGS = ("the log must cover the job's start, where Megatron-LM prints its '---- arguments "
            "----' block (or give model= and overrides= with tp, pp, num_gpus, "
            "micro_batch_size, global_batch_size, precision)")


@dataclasses.dataclass
class _Segment:
    """What one job start (arguments dump) and the lines after it hold."""

    args: dict[str, str] | None
    vocab: int | None = None                    # from the tokenizer's "padded vocab" line
    iteration: array = dataclasses.field(default_factory=lambda: array("q"))
    ms: array = dataclasses.field(default_factory=lambda: array("d"))
    tflops: array = dataclasses.field(default_factory=lambda: array("d"))  # nan: not logged
    gbs: array = dataclasses.field(default_factory=lambda: array("q"))     # -1: not logged
    max_reserved_mib: float | None = None
    memory_reports: int = 0
    #: the launch script's placement lines (:data:`_PLACEMENT_LINES`): run key -> words
    placed: dict[str, list[str]] = dataclasses.field(default_factory=dict)


def _parse(lines: Iterable[str], where: str) -> list[_Segment]:
    segments = [_Segment(args=None)]
    in_args = False
    pending: dict[str, list[str]] = {}   # placement lines waiting for the job start after
    for count, line in enumerate(lines, start=1):
        if count > MAX_LOG_LINES:
            raise InputError(where, f"{count:,} lines", f"too long: at most {MAX_LOG_LINES:,} "
                             "lines are read")
        if len(line) > MAX_LINE_CHARS:
            continue
        seg = segments[-1]
        if in_args:
            if " arguments " in line and "end of" not in line and _HEADER.search(line):
                in_args = False          # a new dump after one cut short
            elif "end of arguments" in line and _END.search(line):
                in_args = False
                continue
            elif "elapsed time per iteration" in line:
                in_args = False      # a dump cut short: go on with the iteration line
            else:
                m = _ARG.search(line) or _LONG_ARG.search(line)
                if m and len(seg.args) < MAX_ARGS:
                    seg.args[m.group(1)] = m.group(m.lastindex)
                continue
        if " arguments " in line and "end of" not in line and _HEADER.search(line):
            if len(segments) > MAX_SEGMENTS:
                raise InputError(where, f"{len(segments)} arguments blocks",
                                 f"at most {MAX_SEGMENTS} job starts are read")
            segments.append(_Segment(args={}, placed=pending))
            pending = {}
            in_args = True
        elif "elapsed time per iteration" in line:
            _iteration_line(seg, line)
        elif "memory (MB)" in line:
            m = _MAX_RESERVED.search(line)
            val = finite_number(m.group(1)) if m else None
            if val is not None and val >= 0:
                seg.memory_reports += 1
                seg.max_reserved_mib = max(val, seg.max_reserved_mib or 0.0)
        elif "padded vocab" in line:
            m = _PADDED.search(line)
            if m:
                seg.vocab = int(m.group(2))
        elif "configurator: " in line:
            for key, (prefix, pattern) in _PLACEMENT_LINES.items():
                m = pattern.search(line) if prefix in line else None
                if m:
                    words = m.group(1).split()
                    if seg.args is not None and key not in seg.placed and not len(seg.ms):
                        seg.placed[key] = words     # printed after Megatron's start
                    else:
                        pending[key] = words        # before the start it belongs to
    return segments


def _iteration_line(seg: _Segment, line: str) -> None:
    m = _ITERATION.search(line)
    if not m:
        return
    it = int(m.group(1))
    if seg.iteration and it <= seg.iteration[-1]:
        return                   # a repeated (or out-of-order) report
    fields = {}
    for part in m.group(3).split("|"):
        key, sep, val = part.partition(":")
        if sep:
            fields[key.strip()] = val.strip()
    ms = finite_number(fields.get("elapsed time per iteration (ms)", ""))
    if ms is None or ms <= 0:
        return
    tflops = finite_number(fields.get("throughput per GPU (TFLOP/s/GPU)", ""))
    gbs = fields.get("global batch size", "")
    seg.iteration.append(it)
    seg.ms.append(ms)
    seg.tflops.append(tflops if tflops is not None and tflops > 0 else math.nan)
    seg.gbs.append(int(gbs) if gbs.isdigit() and len(gbs) <= 12 else -1)


def _text_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` (``str.splitlines`` breaks) one at a time, without a copy."""
    start, n = 0, len(text)
    while start < n:
        end = text.find("\n", start)
        if end < 0:
            end = n
        yield from text[start:end].splitlines() or ("",)
        start = end + 1


def _file_lines(fh, where: str) -> Iterator[str]:
    """Lines of a binary file, decoded as UTF-8 (bad bytes replaced); over-long lines are
    left out."""
    total = 0
    while True:
        raw = fh.readline(MAX_LINE_CHARS + 1)
        if not raw:
            return
        total += len(raw)
        if total > MAX_LOG_BYTES:
            raise InputError(where, f"over {MAX_LOG_BYTES >> 20} MiB",
                             f"larger than {MAX_LOG_BYTES >> 20} MiB")
        if len(raw) > MAX_LINE_CHARS:
            while raw and not raw.endswith(b"\n"):       # skip the rest of the line
                raw = fh.readline(MAX_LINE_CHARS + 1)
                total += len(raw)
                if total > MAX_LOG_BYTES:
                    raise InputError(where, f"over {MAX_LOG_BYTES >> 20} MiB",
                                     f"larger than {MAX_LOG_BYTES >> 20} MiB")
            continue
        yield from raw.decode("utf-8", errors="replace").splitlines()


def _check_binary(head: str, where: str) -> None:
    if "\x00" in head:
        raise InputError(where, head[:40], "is binary (NUL bytes), not a Megatron-LM log")


# ---------------------------------------------------------------------------- runs


class _NoIterations(InputError):
    """A job start without enough iteration lines (skipped when other starts have them)."""


def _median(values: Iterable[float]) -> float | None:
    vals = [x for x in values if not math.isnan(x)]
    return statistics.median(vals) if vals else None


def _segment_run(seg: _Segment, *, where: str, cluster: str, name: str, source: str,
                 model: str | None, run_over: Mapping[str, Any],
                 model_over: Mapping[str, Any], skip_iterations: int | None,
                 flops_formula: str) -> MeasuredRun:
    row: dict[str, Any] = {}
    notes: list[str] = []
    if seg.args is None and model is None:
        raise InputError(where, "no arguments block", _NO_ARGS)
    a = MegatronArgs(seg.args or {}, where)
    kw: dict[str, Any] = {}
    moe = a.int("num_experts") is not None
    if model is None:
        kw = {**model_fields(a, seg.vocab), **model_over}
        if "vocab_size" not in kw:
            raise InputError(f"{where} arguments.padded_vocab_size", None,
                             "the vocabulary size is not in the log (no '> padded vocab "
                             "(size: ...)' line): give overrides={'vocab_size': N}")
        moe = kw.get("num_experts") is not None
    if seg.args is not None:
        row, notes = plan_fields(a, moe)
        if a.int("seq_length") is not None:
            row["seq_length"] = a.int("seq_length")
    if "dp" not in run_over and any(k in run_over for k in ("tp", "pp", "cp", "num_gpus")):
        row.pop("dp", None)          # re-derived from the overridden sizes
    row.update(run_over)
    run_name = row.pop("name", name)
    spec: ModelSpec | None = None
    if model is None:
        kw["name"] = run_name
        try:
            spec = make_model(**kw)
        except InputError as exc:
            raise InputError(f"{where} model.{exc.field}", exc.value, exc.rule) from None
    gbs = row.get("global_batch_size", row.get("gbs"))
    gbs = int(gbs) if isinstance(gbs, int) or (isinstance(gbs, str) and gbs.isdigit()) else None
    keep = [i for i in range(len(seg.ms)) if gbs is None or seg.gbs[i] in (-1, gbs)]
    if not keep:
        raise _NoIterations(where, f"{len(seg.ms)} iteration lines", "holds no Megatron-LM "
                         "iteration line ('iteration N/ M | ... | elapsed time per iteration "
                         f"(ms): ...'{' of global batch size %d' % gbs if gbs else ''}): "
                         "was the job logged past its first iteration?")
    if skip_iterations is None:
        skip = max(2, math.ceil(len(keep) / 10))
    elif isinstance(skip_iterations, bool) or not isinstance(skip_iterations, int) or \
            skip_iterations < 0:
        raise InputError("skip_iterations", skip_iterations, "must be a whole number >= 0")
    else:
        skip = skip_iterations
    if skip >= len(keep):
        raise _NoIterations(where, f"{len(keep)} iteration lines", f"too few: the first {skip} "
                         "are skipped as warm-up (skip_iterations); log more iterations or "
                         "a smaller --log-interval")
    used = keep[skip:]
    measured: dict[str, Any] = {"iteration_time_s": _median(seg.ms[i] for i in used) / 1000}
    tflops = _median(seg.tflops[i] for i in used)
    if tflops is not None:
        measured.update(tflops_per_gpu=tflops, flops_formula=flops_formula)
    if seg.max_reserved_mib:
        measured["peak_memory_GiB"] = seg.max_reserved_mib / 1024
    for key, words in seg.placed.items():
        row.setdefault(key, words)
    row = {**measured, **row, "model": model or run_name, "cluster": cluster,
           "name": run_name, "source": source or None}
    run = run_from_mapping(row, where)
    extra = {"iterations": (seg.iteration[used[0]], seg.iteration[used[-1]]),
             "iteration_lines": len(used), "skipped_lines": skip,
             "memory_reports": seg.memory_reports, "notes": tuple(notes)}
    return dataclasses.replace(run, model=spec if spec is not None else run.model,
                               extra=extra)


def _runs(lines: Iterable[str], *, where: str, cluster: str, name: str, source: str,
          model: str | None, overrides: Mapping[str, Any] | None,
          skip_iterations: int | None, flops_formula: str) -> list[MeasuredRun]:
    if not isinstance(cluster, str):
        raise InputError("cluster", cluster, "must be a cluster preset name or file")
    if model is not None and not isinstance(model, str):
        raise InputError("model", model, "must be a model preset name or file")
    run_over, model_over = split_overrides(overrides, model is not None)
    segments = _parse(lines, where)
    started = [s for s in segments if s.args is not None]
    if not started:
        if model is None:
            raise InputError(where, "no arguments block", _NO_ARGS)
        started = segments[:1]
    with_iterations = [s for s in started if len(s.ms)] or started[-1:]
    many = len(with_iterations) > 1
    out: list[MeasuredRun] = []
    first_error: InputError | None = None
    for k, seg in enumerate(with_iterations, start=1):
        try:
            out.append(_segment_run(
                seg, where=f"{where} run {k}" if many else where, cluster=cluster,
                name=f"{name[:120]}#{k}" if many else name, source=source, model=model,
                run_over=run_over, model_over=model_over, skip_iterations=skip_iterations,
                flops_formula=flops_formula))
        except _NoIterations as exc:      # a start that crashed early: the others count
            first_error = first_error or exc
    if not out:
        assert first_error is not None
        raise InputError(first_error.field, first_error.value, first_error.rule)
    return out


def runs_from_megatron_log(text: str, *, cluster: str, name: str | None = None,
                           source: str = "", model: str | None = None,
                           overrides: Mapping[str, Any] | None = None,
                           skip_iterations: int | None = None,
                           flops_formula: str = "megatron") -> list[MeasuredRun]:
    """The measured runs of a Megatron-LM log's text, one per job start (arguments dump)
    followed by iteration lines; see the module docstring for the lines read.

    ``cluster``: the cluster the job ran on (preset or file); ``name``: the runs' and the
    model's name (default ``megatron-log``); ``source``: where the figures come from.
    ``model``: a model preset or file used instead of the arguments' model (needed, with
    ``overrides`` giving the plan, for a log without its arguments dump). ``overrides``:
    run keys (:data:`~configurator.core.runs.RUN_KEYS`, their aliases, or Megatron's plan
    argument names) and model keys merged over what the log says. ``skip_iterations``:
    iteration lines dropped as warm-up (default: 10 %, at least 2). ``flops_formula``: how
    the logged TFLOP/s were counted. Raises :class:`InputError` (one line) for a log that
    holds no run, or values Megatron would not print.
    """
    label = name if name is not None else "megatron-log"
    if not isinstance(text, str):
        raise InputError(label, type(text).__name__, "a Megatron-LM log must be text")
    if len(text) > MAX_LOG_BYTES:
        raise InputError(label, f"{len(text):,} characters",
                         f"larger than {MAX_LOG_BYTES >> 20} MiB")
    _check_binary(text[:65536], label)
    return _runs(_text_lines(text), where=label, cluster=cluster, name=label, source=source,
                 model=model, overrides=overrides, skip_iterations=skip_iterations,
                 flops_formula=flops_formula)


def load_megatron_log(path: str, *, cluster: str, name: str | None = None,
                      source: str | None = None, model: str | None = None,
                      overrides: Mapping[str, Any] | None = None,
                      skip_iterations: int | None = None,
                      flops_formula: str = "megatron") -> list[MeasuredRun]:
    """:func:`runs_from_megatron_log` of the file at ``path`` (read line by line, at most
    :data:`MAX_LOG_BYTES`, bad UTF-8 replaced). ``name`` defaults to the file's name without
    its extension, ``source`` to the file's name."""
    base = "".join(c for c in os.path.basename(str(path)) if c.isprintable()) or "log"
    label = name if name is not None else (os.path.splitext(base)[0] or base)[:128]
    try:
        with open(path, "rb", buffering=65536) as fh:
            _check_binary(fh.peek(65536)[:65536].decode("latin-1"), base)
            return _runs(_file_lines(fh, base), where=base, cluster=cluster, name=label,
                         source=base[-128:] if source is None else source, model=model,
                         overrides=overrides, skip_iterations=skip_iterations,
                         flops_formula=flops_formula)
    except OSError as exc:
        raise InputError("megatron log", path, f"cannot be read ({type(exc).__name__})") \
            from None
