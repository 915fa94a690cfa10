"""The parent side: :class:`Runner` feeds cases to one long-lived worker subprocess per
target, restarting it after a hang, a crash, a MemoryError or every :data:`RECYCLE_AFTER`
inputs; :func:`classify` turns each answer into :class:`Failure` s (the package docstring
lists the categories); :func:`run_target` runs generated cases of one target."""

from __future__ import annotations

import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.support.fuzzing.case import Case
from tests.support.fuzzing.strategies import case_strategy
from tests.support.fuzzing.worker import (MEMORY_LIMIT, REPO, recv_message, repo_relpath,
                                          send_message, status_kib, strict_json_problem,
                                          worker_env)

CATEGORIES = ("traceback", "hang", "memory", "multiline", "json")
#: Seconds an input may run before it counts as a hang.
TIMEOUT_S = 10.0
#: A worker is replaced after this many inputs (bounds what leaks between calls).
RECYCLE_AFTER = 400


class _Worker:
    """One worker subprocess (:func:`~tests.support.fuzzing.worker.worker_main`), seen from
    the parent: started, fed one case at a time, watched for hangs and memory, killed."""

    def __init__(self, timeout: float, mem_limit: int):
        self.timeout, self.mem_limit = timeout, mem_limit
        self.log = tempfile.NamedTemporaryFile(prefix="fuzz-worker-", suffix=".stderr",
                                               delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-c",
             "from tests.support.fuzzing.worker import worker_main; worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, cwd=REPO,
            env=worker_env(), start_new_session=True)
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
                    return recv_message(self.proc.stdout)
                except (EOFError, pickle.UnpicklingError, struct.error):
                    rc = self.proc.wait()
                    return ("crash", f"worker died (exit {rc}"
                            + (f", signal {signal.Signals(-rc).name}" if rc < 0 else "") + ")",
                            peak)
            rss = status_kib(self.proc.pid, "VmRSS") * 1024
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
            send_message(self.proc.stdin, {"argv": list(case.argv), "files": list(case.files)})
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
                sig = f"warning on stderr: {warn.group(3)} at {repo_relpath(warn.group(1))}:" \
                      f"{warn.group(2)}"
            else:
                first = lines[0] if lines else ""
                m = re.match(r"^(\S+: (?:error|no feasible plan): )(argument [^:]+|[^=:]*)",
                             first)
                sig = f"multi-line error from {cmd} (exit {code}): " + (
                    _norm(m.group(1) + m.group(2)) if m else _norm(first[:40]) or "<empty>")
            fails.append(Failure("multiline", sig, repr(stderr[:300])))
    if kind == "return" and code == 0 and "--json" in case.argv:
        problem = strict_json_problem(res.get("stdout") or "")
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
