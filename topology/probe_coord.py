"""Coordination of the bandwidth probe through a TCP store (no torch import here).

Keys, under one prefix per torchrun restart: ``join/<rank>`` (host name), ``roster`` (host of
each node_rank, written by rank 0), ``init/<rank>`` and ``res/<step>/<rank>`` (results or
``{"error": ...}``), ``done/<step>``, ``final``, ``abort`` (rank 0's one-line reason),
``stop`` (a rank's request to stop: it got SIGINT/SIGTERM/...) and ``bye/<rank>``. Rank 0's
:class:`Coordinator` thread owns every deadline and writes the file; the others only follow.
Every process also runs a :class:`Deadman` and a signal listener (:func:`on_signals`).

Every process ends through :func:`end`: at most one line (flattened to one line by
:func:`say`), then ``os._exit``; whichever thread comes first decides the line, so a process
never prints two. Store calls go through :class:`Guarded`, which turns any failure of the
store (its host is gone) into :class:`StoreLost`.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import statistics
import sys
import threading
import time

from configurator.core.errors import InputError, flat
from configurator.core.units import GB
from topology import probe_plan as pp
from topology.topofile import MissingMeasurement
from topology.topofile_io import save_topology

#: Exit status of a failed probe (the shell's usual failure code).
EXIT_FAILED = 1
#: Sleep between polls of the coordination files (s): set by hand, short beside the probe's
#: ≈ 17 ms a step (docs/measure.md).
POLL_S = 0.01
HOSTNAME_ENV = "CONFIGURATOR_PROBE_HOSTNAME"
#: Signals that stop the probe with one line (torchrun forwards the one it gets to workers).
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


def one_line(err: BaseException) -> str:
    """The error on one line, without gloo's ``[source.cc:123]`` prefix, ≤ 300 characters."""
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ?", "", flat(err))
    return (text.strip() or type(err).__name__)[:300]


def say(line: str, out: bool = False) -> None:
    """Print ``line`` flattened to one line (stderr, or stdout with ``out``). The probe's only
    ``print``."""
    try:
        print(flat(line), file=sys.stdout if out else sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed or broken stream: nothing more to say
        pass


_ENDING = threading.Lock()


def end(code: int, line: str | None = None, before_exit=None) -> None:
    """End the process with ``code`` after printing ``line`` (if any) and calling
    ``before_exit()`` (if any; its errors are ignored). Once per process: a second caller
    waits for the first, which ends the process, so a process prints at most one line."""
    if not _ENDING.acquire(timeout=60):
        os._exit(code)
    if line:
        say(line)
    if before_exit is not None:
        try:
            before_exit()
        except Exception:  # noqa: BLE001 - the process is ending anyway
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class Aborted(Exception):
    """This rank stops: rank 0 gave up, or never answered (the message is the line to print
    after ``probe: ``)."""


class Stopped(Exception):
    """Rank 0's coordinator was asked to stop (a signal, a rank's request); message: why."""


class StoreLost(Exception):
    """A call to the coordination store failed: the store's host (node 0) is gone."""


class Guarded:
    """A store whose every failure is :class:`StoreLost` (one line). ``raw``: the store."""

    def __init__(self, store):
        self.raw = store

    def _call(self, name: str, *args):
        try:
            return getattr(self.raw, name)(*args)
        except Exception as err:  # torch's DistNetworkError, DistStoreError, RuntimeError …
            raise StoreLost(one_line(err)) from None

    def check(self, keys: list[str]) -> bool:
        return self._call("check", keys)

    def get(self, key: str) -> bytes:
        return self._call("get", key)

    def set(self, key: str, value) -> None:
        self._call("set", key, value)


class Deadman(threading.Thread):
    """Ends the process when the coordination store has not answered for ``limit_s``: a
    TCPStore call blocks without limit once the store's host stops answering (seen with torch
    2.13), so no deadline in the polling loops could fire. Every successful poll calls
    :meth:`beat`; ``on_fire()`` reports, then the process exits with status 1."""

    def __init__(self, limit_s: float, on_fire):
        super().__init__(name="probe-deadman", daemon=True)
        self.limit_s, self.on_fire = limit_s, on_fire
        self.last, self.stopped = time.monotonic(), False

    def beat(self) -> None:
        self.last = time.monotonic()

    def run(self) -> None:
        while not self.stopped:
            time.sleep(0.2)
            if not self.stopped and time.monotonic() - self.last > self.limit_s:
                try:
                    self.on_fire()
                finally:
                    end(EXIT_FAILED)


DEADMAN: Deadman | None = None


def beat() -> None:
    if DEADMAN is not None:
        DEADMAN.beat()


def on_signals(handler) -> None:
    """Call ``handler(signal_name)`` in a thread of its own when one of :data:`STOP_SIGNALS`
    arrives, also while the main thread is blocked in a collective (the C-level handler
    writes to a wake-up pipe at once; a Python handler would wait for the main thread).
    Call from the main thread."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), lambda signum, frame: None)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def listen() -> None:
        while True:  # other signals with a Python handler write here too: skip them
            data = os.read(r, 1)
            try:
                name = signal.Signals(data[0]).name
            except (ValueError, IndexError):
                continue
            if name in STOP_SIGNALS:
                handler(name)
                return

    threading.Thread(target=listen, name="probe-signals", daemon=True).start()


def wait_keys(store: Guarded, keys: list[str], deadline: float) -> bool:
    """Poll until every key exists (True), the deadline passes (False) or ``abort`` is set
    (raises Aborted). Store failures raise StoreLost."""
    while True:
        if store.check(keys):
            return True
        if store.check(["abort"]):
            raise Aborted(f"stopped by rank 0: {flat(store.get('abort').decode(errors='replace'))}")
        beat()
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)


def measured(res: dict | None) -> bool:
    """Whether a rank's result for a step holds a figure (what :func:`build_topology` keeps)."""
    return bool(res) and bool(res.get("samples_Bps") or res.get("busbw_samples_Bps"))


class Coordinator(threading.Thread):
    """Rank 0's watch over joining, set-up and every step; writes the file (full or partial).
    ``store``: a :class:`Guarded` client of the coordination store for this thread alone.

    Whatever ends a run early (a deadline, a rank's error, a signal, :meth:`stop`, the store
    going away, an internal error) goes through :meth:`fail`, which lists as missing every
    measurement without a figure."""

    def __init__(self, e: dict, args, steps: list[pp.Step], backend: str, G: int, store):
        super().__init__(name="probe-coordinator", daemon=True)
        self.e, self.args, self.steps, self.backend, self.G = e, args, steps, backend, G
        self.nodes = e["world_size"] // G
        self.hosts = [None] * self.nodes
        self.results: dict[tuple[int, int], dict] = {}
        self.warnings: list[str] = []
        self.timestamp = datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds")
        self.store = store  # its own client: the main thread may be blocked in another
        self.stop_reason: str | None = None
        self.completed = False  # the full file is written
        self._failing = threading.Lock()

    def where(self) -> str:
        return f"{self.e['master_addr']}:{self.e['master_port']}"

    def stop(self, reason: str) -> None:
        """Ask the coordinator to fail with ``reason`` at its next poll (any thread)."""
        self.stop_reason = self.stop_reason or flat(reason)

    def store_lost(self) -> None:
        """The store stopped answering (the deadman fired): write what is known, without
        telling anyone; returns at once when another thread is already failing."""
        self.fail(f"the coordination store at {self.where()} has not answered for "
                  f"{self.args.timeout_s:g} s", tell=False, wait=False)

    def _host_names(self) -> list[str]:
        exp = self.args.expected_hosts
        return [h or (exp[k] if k < len(exp) else f"node_rank{k}")
                for k, h in enumerate(self.hosts)]

    def _write(self, missing: list[MissingMeasurement]):
        topo = pp.build_topology(hosts=self._host_names(), gpus_per_node=self.G,
                                 steps=self.steps, results=dict(self.results),
                                 backend=self.backend,
                                 message_bytes=self.args.message_bytes,
                                 timestamp=self.timestamp, missing=missing,
                                 warnings=self.warnings)
        save_topology(topo, self.args.out, force=True)
        return topo

    def missing(self, what: str, failed_step: int | None = None, step_reason: str = "",
                late: frozenset[int] = frozenset()) -> list[MissingMeasurement]:
        """A record for every transfer or group of every step without a figure: ``did not
        join`` where it involves a node of ``late``, ``step_reason`` in step
        ``failed_step``, else ``not measured: probe stopped (what)``."""
        hosts, G = self._host_names(), self.G
        out: list[MissingMeasurement] = []
        for k, step in enumerate(self.steps):
            done = {r for r in step.reporters() if measured(self.results.get((k, r)))}
            if late:
                involved = ({d for s, d in step.transfers if s // G in late or d // G in late}
                            | {g[0] for g in step.groups if any(r // G in late for r in g)})
                out += pp.missing_for(step, done | (set(step.reporters()) - involved), hosts,
                                      G, "did not join")
                done |= involved
            reason = step_reason if k == failed_step else f"not measured: probe stopped ({what})"
            out += pp.missing_for(step, done, hosts, G, flat(reason))
        return list(dict.fromkeys(out))

    def fail(self, what: str, failed_step: int | None = None, step_reason: str = "",
             late: frozenset[int] = frozenset(), write: bool = True, tell: bool = True,
             wait: bool = True) -> None:
        """Write what was measured plus a missing record for everything else, print one
        line, tell every rank to stop (``abort``), end the process with status 1. Once: a
        second caller waits for the first (or, without ``wait``, returns)."""
        if not self._failing.acquire(blocking=False):
            if not wait:
                return
            while True:  # the first caller ends the process
                time.sleep(1.0)
        what = flat(what)
        where = "nothing written"
        if write:
            try:
                topo = self._write(self.missing(what, failed_step, step_reason, late))
                where = (f"partial topology written to {self.args.out} ({len(topo.links)} "
                         f"links, {len(topo.missing)} missing)")
            except InputError as err:
                where = f"partial topology not written: {err}"
            except Exception as err:  # noqa: BLE001 - still one line, still the exit
                where = f"partial topology not written: {one_line(err)}"
        msg = flat(f"{what}; {where}")

        def tell_all() -> None:
            self.store.set("abort", msg)
            time.sleep(1.0)  # let the other ranks read the reason before the store goes

        end(EXIT_FAILED, f"probe: error: {msg}", tell_all if tell else None)

    def _poll_stop(self) -> None:
        if self.stop_reason:
            raise Stopped(self.stop_reason)
        if self.store.check(["stop"]):
            raise Stopped(flat(self.store.get("stop").decode(errors="replace")))

    def _wait(self, prefix: str, ranks: list[int], deadline: float, step: int | None = None,
              stoppable: bool = True) -> tuple[dict, list[int]]:
        """Results (rank → dict) under ``prefix/<rank>``, and the ranks that never reported
        (or the first that reported an error). With ``step``, each result is kept in
        :attr:`results` as it arrives."""
        pending, got = list(ranks), {}
        while pending:
            if stoppable:
                self._poll_stop()
            still = []
            for r in pending:
                key = f"{prefix}/{r}"
                if self.store.check([key]):
                    got[r] = json.loads(self.store.get(key))
                    if step is not None:
                        self.results[(step, r)] = got[r]
                    if "error" in got[r]:
                        return got, [r]
                else:
                    still.append(r)
            pending = still
            beat()
            if pending and time.monotonic() > deadline:
                return got, pending
            if pending:
                time.sleep(POLL_S)
        return got, []

    def run(self) -> None:
        try:
            self._run()
        except Stopped as why:
            self.fail(str(why))
        except StoreLost as err:
            self.fail(f"lost the coordination store at {self.where()}: {err}", tell=False)
        except Exception as err:  # never leave the other ranks waiting
            self.fail(f"probe internal error: {one_line(err)}")

    def _run(self) -> None:
        T, G, world = self.args.timeout_s, self.G, self.e["world_size"]
        joined, late = self._wait("join", list(range(world)), time.monotonic() + T)
        for r, info in joined.items():
            self.hosts[r // G] = self.hosts[r // G] or info["host"]
        if late:
            names = self._host_names()
            nodes = sorted({r // G for r in late})
            who = ", ".join(f"node_rank {k} ({names[k]})" for k in nodes)
            self.fail(f"{who} did not join within {T:g} s", late=frozenset(nodes))
        clash = {r: i["host"] for r, i in joined.items() if i["host"] != self.hosts[r // G]}
        if clash or len(set(self.hosts)) != len(self.hosts):
            self.fail(f"host names must be one per node, got {self.hosts} (ranks {clash}); "
                      f"set ${HOSTNAME_ENV} where nodes share a name", write=False)
        self.store.set("roster", json.dumps(self.hosts))
        names = self.hosts
        got, bad = self._wait("init", list(range(world)), time.monotonic() + T)
        if bad:
            why = got.get(bad[0], {}).get("error", f"not done within {T:g} s")
            who = ", ".join(sorted({names[r // G] for r in bad}))
            self.fail(f"process-group set-up failed on {who}: {why}")
        for k, step in enumerate(self.steps):
            parts = sorted({r for t in step.transfers for r in t} |
                           {r for g in step.groups for r in g})
            got, bad = self._wait(f"res/{k}", parts, time.monotonic() + T, step=k)
            if bad:
                broken = [(s, d) for s, d in step.transfers if s in bad or d in bad]
                links = ", ".join(pp.describe_transfer(step, s, d, names, G) for s, d in broken)
                links = links or ", ".join(sorted({names[r // G] for r in bad}))
                why = got.get(bad[0], {}).get("error", f"no result within {T:g} s")
                self.fail(f"{step.name}: {links}: {why}", failed_step=k,
                          step_reason=f"{step.name}: {why}")
            self.store.set(f"done/{k}", "1")
        try:
            topo = self._write([])
        except InputError as err:
            self.fail(f"cannot write the topology: {err}")
        self.completed = True
        say(f"probe: wrote {self.args.out}: {summary(topo)}", out=True)
        self.store.set("final", "1")
        try:
            self._wait("bye", list(range(1, world)), time.monotonic() + min(T, 10.0),
                       stoppable=False)
        except StoreLost:  # the file is written; a rank that left early is no failure
            pass
        DEADMAN.stopped = True


def summary(topo) -> str:
    """One line: counts and the median and slowest inter-node host-level link (GB/s)."""
    inter = sorted((l.bandwidth_Bps, l.src, l.dst) for l in topo.links
                   if l.src != l.dst and l.src_gpu is None)
    text = f"{len(topo.links)} links, {len(topo.collectives)} collectives"
    if inter:
        med = statistics.median(b for b, _, _ in inter) / GB
        text += (f"; inter-node median {med:.4g} GB/s, slowest {inter[0][1]} -> "
                 f"{inter[0][2]} {inter[0][0] / GB:.4g} GB/s")
    return text


def start_deadman(limit_s: float, on_fire) -> None:
    global DEADMAN
    DEADMAN = Deadman(limit_s, on_fire)
    DEADMAN.start()
