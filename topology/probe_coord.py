"""Coordination of the bandwidth probe through a TCP store (no torch import here).

Keys, under one prefix per torchrun restart: ``join/<rank>`` (host name), ``roster`` (host of
each node_rank, written by rank 0), ``init/<rank>`` and ``res/<step>/<rank>`` (results or
``{"error": ...}``), ``done/<step>``, ``final``, ``abort`` (rank 0's one-line reason) and
``bye/<rank>``. Rank 0's :class:`Coordinator` thread owns every deadline and writes the file;
the others only follow. Every process also runs a :class:`Deadman`.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import statistics
import sys
import threading
import time

from configurator.core.errors import InputError
from configurator.core.units import GB
from topology import probe_plan as pp
from topology.topofile import MissingMeasurement
from topology.topofile_io import save_topology

EXIT_FAILED = 1
POLL_S = 0.01
HOSTNAME_ENV = "CONFIGURATOR_PROBE_HOSTNAME"


def one_line(err: BaseException) -> str:
    """The error on one line, without gloo's ``[source.cc:123]`` prefix, ≤ 300 characters."""
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ?", "", " ".join(str(err).split()))
    return (text or type(err).__name__)[:300]


class Aborted(Exception):
    """Rank 0 gave up (its reason is the message)."""


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
                self.on_fire()
                sys.stderr.flush()
                os._exit(EXIT_FAILED)


DEADMAN: Deadman | None = None


def beat() -> None:
    if DEADMAN is not None:
        DEADMAN.beat()


def wait_keys(store, keys: list[str], deadline: float) -> bool:
    """Poll until every key exists (True), the deadline passes (False) or ``abort`` is set
    (raises Aborted)."""
    while True:
        if store.check(keys):
            return True
        if store.check(["abort"]):
            raise Aborted(store.get("abort").decode())
        beat()
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)


class Coordinator(threading.Thread):
    """Rank 0's watch over joining, set-up and every step; writes the file (full or partial).
    ``store``: a client of the coordination store for this thread alone."""

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
        self.current = 0

    def store_lost(self) -> None:
        """The store stopped answering: write what is known, without telling anyone."""
        self.fail(f"the coordination store at {self.e['master_addr']}:{self.e['master_port']} "
                  f"has not answered for {self.args.timeout_s:g} s", [], self.current,
                  tell=False)

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

    def fail(self, what: str, missing: list[MissingMeasurement], first_unrun: int,
             write: bool = True, tell: bool = True) -> None:
        """Write what was measured plus ``missing`` (and every step from ``first_unrun`` as
        not measured), print one line, tell every rank to stop, exit with status 1."""
        hosts = self._host_names()
        for step in self.steps[first_unrun:]:
            missing += pp.missing_for(step, set(), hosts, self.G,
                                      f"not measured: probe stopped ({what})")
        missing = list(dict.fromkeys(missing))
        where = "nothing written"
        if write:
            try:
                topo = self._write(missing)
                where = (f"partial topology written to {self.args.out} ({len(topo.links)} "
                         f"links, {len(topo.missing)} missing)")
            except InputError as err:
                where = f"partial topology not written: {err}"
        msg = f"{what}; {where}"
        print(f"probe: error: {msg}", file=sys.stderr, flush=True)
        if tell:
            self.store.set("abort", msg)
            time.sleep(1.0)  # let the other ranks read the reason before the store goes
        os._exit(EXIT_FAILED)

    def _wait(self, prefix: str, ranks: list[int], deadline: float) -> tuple[dict, list[int]]:
        """Results (rank → dict) under ``prefix/<rank>``, and the ranks that never reported."""
        pending, got = list(ranks), {}
        while pending:
            still = []
            for r in pending:
                key = f"{prefix}/{r}"
                if self.store.check([key]):
                    got[r] = json.loads(self.store.get(key))
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
        except Exception as err:  # never leave the other ranks waiting
            self.fail(f"probe internal error: {one_line(err)}", [], len(self.steps))

    def _run(self) -> None:
        T, G, world = self.args.timeout_s, self.G, self.e["world_size"]
        joined, late = self._wait("join", list(range(world)), time.monotonic() + T)
        for r, info in joined.items():
            self.hosts[r // G] = self.hosts[r // G] or info["host"]
        if late:
            names = self._host_names()
            nodes = sorted({r // G for r in late})
            who = ", ".join(f"node_rank {k} ({names[k]})" for k in nodes)
            missing = [MissingMeasurement(src=names[a], dst=names[k], reason="did not join")
                       for k in nodes for a in range(self.nodes) if a not in nodes]
            self.fail(f"{who} did not join within {T:g} s", missing, len(self.steps))
        clash = {r: i["host"] for r, i in joined.items() if i["host"] != self.hosts[r // G]}
        if clash or len(set(self.hosts)) != len(self.hosts):
            self.fail(f"host names must be one per node, got {self.hosts} (ranks {clash}); "
                      f"set ${HOSTNAME_ENV} where nodes share a name", [], len(self.steps),
                      write=False)
        self.store.set("roster", json.dumps(self.hosts))
        names = self.hosts
        got, bad = self._wait("init", list(range(world)), time.monotonic() + T)
        if bad:
            why = got.get(bad[0], {}).get("error", f"not done within {T:g} s")
            who = ", ".join(sorted({names[r // G] for r in bad}))
            self.fail(f"process-group set-up failed on {who}: {why}", [], 0)
        for k, step in enumerate(self.steps):
            self.current = k
            parts = sorted({r for t in step.transfers for r in t} |
                           {r for g in step.groups for r in g})
            got, bad = self._wait(f"res/{k}", parts, time.monotonic() + T)
            for r, res in got.items():
                self.results[(k, r)] = res
            if bad:
                broken = [(s, d) for s, d in step.transfers if s in bad or d in bad]
                links = ", ".join(pp.describe_transfer(step, s, d, names, G) for s, d in broken)
                links = links or ", ".join(sorted({names[r // G] for r in bad}))
                why = got.get(bad[0], {}).get("error", f"no result within {T:g} s")
                done = {r for r in step.reporters() if r in got and r not in bad}
                self.fail(f"{step.name}: {links}: {why}",
                          pp.missing_for(step, done, names, G, f"{step.name}: {why}"), k + 1)
            self.store.set(f"done/{k}", "1")
        try:
            topo = self._write([])
        except InputError as err:
            self.fail(f"cannot write the topology: {err}", [], len(self.steps))
        print(f"probe: wrote {self.args.out}: {summary(topo)}", flush=True)
        self.store.set("final", "1")
        self._wait("bye", list(range(1, world)), time.monotonic() + min(T, 10.0))
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
