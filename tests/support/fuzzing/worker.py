"""The worker subprocess that runs CLI calls, and the pipe protocol it speaks: the parent
sends each call (argv and files) as a length-prefixed pickle; the worker writes the files into
a fresh temporary directory, runs ``main(argv)`` there with stdout/stderr captured, under
RLIMIT_AS, and answers with what happened (exit, exception and where it was raised, peak
RSS, the JSON files the call wrote and whether they are strict)."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
#: Peak resident memory above which an input counts as over-memory (bytes).
MEMORY_LIMIT = 2 * 2**30
#: Directories whose frames count as product code in a traceback.
PRODUCT_DIRS = ("configurator", "topology", "launchers", "memory_model")


def worker_env() -> dict:
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


def send_message(fh, obj) -> None:
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


def recv_message(fh):
    (n,) = struct.unpack("<Q", _recv_exact(fh, 8))
    return pickle.loads(_recv_exact(fh, n))


def status_kib(pid: int | str, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def strict_json_problem(text: str) -> str | None:
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
        rel = repo_relpath(fr.filename)
        loc = f"{rel}:{fr.lineno} in {fr.name}"
        if rel.split("/", 1)[0] in PRODUCT_DIRS:
            prod, last = loc, None
        else:
            last = loc
    return prod, last


def repo_relpath(filename: str) -> str:
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
    res["peak_rss"] = status_kib("self", "VmHWM") * 1024
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
                        problem = strict_json_problem(fh.read(MEMORY_LIMIT // 4))
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

    vm = status_kib("self", "VmSize") * 1024
    limit = vm + MEMORY_LIMIT + 512 * 2**20
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass
    base = tempfile.mkdtemp(prefix="fuzz-worker-")
    send_message(proto_out, {"ready": True, "pid": os.getpid()})
    try:
        while True:
            try:
                msg = recv_message(proto_in)
            except EOFError:
                break
            try:
                res = _run_in_worker(msg, base, main)
            except MemoryError:
                res = {"kind": "memory", "code": None, "stdout": "", "stderr": "",
                       "exc_type": "MemoryError", "where": None, "traceback": None,
                       "seconds": 0.0, "peak_rss": 0, "written_json": []}
            gc.collect()
            send_message(proto_out, res)
    finally:
        os.chdir("/")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker_main()
