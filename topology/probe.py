"""Bandwidth probe: measure GPU↔GPU and node↔node links with torch.distributed, write a
topology file (:mod:`topology.topofile`).

Run the same command on every node (static rendezvous, REFERENCE §6)::

    torchrun --nnodes N --nproc-per-node G --node-rank R --master-addr A --master-port P \\
        -m topology.probe --out topo.json [--size-mb 32] [--iters 5] [--warmup 2] \\
        [--timeout-s 120] [--backend auto|nccl|gloo] [--expected-hosts h0,h1,...] [--force]

What is measured and in which order: :mod:`topology.probe_plan`; how each figure is timed:
:mod:`topology.probe_ops`. NCCL on GPUs (``torch.cuda.set_device(LOCAL_RANK)`` first), gloo on
CPU (no intra-node GPU links then). Messages of ``--size-mb`` MB (1e6 bytes; ≥ 32 MB recommended,
REFERENCE §5), ``--warmup`` untimed and ``--iters`` timed samples per direction (all kept in
``samples``; the record holds their median). torch is imported only by this module and
:mod:`topology.probe_ops`.

Coordination goes through a TCP store beside the process group (torchrun's agent store, or
one hosted by rank 0 when launched without torchrun), so a stuck link cannot stop it: ranks
register their host name (``socket.gethostname()``, or ``$CONFIGURATOR_PROBE_HOSTNAME``), rank
0 waits at most ``--timeout-s`` for every rank to join, to finish process-group set-up and to
report each step. When a deadline passes, or a rank reports an error, rank 0 writes the
measurements gathered so far plus ``missing`` records to ``--out``, prints one line naming the
host(s) or link(s), and every rank exits with status 1. Bad arguments: one line, status 2.

A node whose torchrun never starts is caught by torchrun's own rendezvous before any probe
process runs (pass ``--rdzv-conf timeout=SECONDS``); ``configurator probe`` prints such a
command line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import statistics
import sys
import threading
import time

import torch
import torch.distributed as dist

from configurator import validate as v
from configurator.errors import InputError
from topology import probe_plan as pp
from topology.probe_ops import Ops
from topology.topofile import MissingMeasurement, save_topology

EXIT_FAILED, EXIT_INPUT = 1, 2
POLL_S = 0.01
HOSTNAME_ENV = "CONFIGURATOR_PROBE_HOSTNAME"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, status 2
        self.exit(EXIT_INPUT, f"probe: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the probe's arguments; InputError names a bad value."""
    p = _Parser(prog="python -m topology.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="topology file to write (.json, else YAML)")
    p.add_argument("--size-mb", type=float, default=32.0, help="message size, MB (1e6 bytes)")
    p.add_argument("--iters", type=int, default=5, help="timed samples per direction")
    p.add_argument("--warmup", type=int, default=2, help="untimed samples per direction")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="deadline for joining, set-up and each step, seconds")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--expected-hosts", default=None,
                   help="comma-separated host names by node_rank, to name nodes that never join")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    args = p.parse_args(argv)
    v.positive_float("size_mb", args.size_mb)
    v.positive_int("iters", args.iters)
    if args.warmup < 0:
        raise InputError("warmup", args.warmup, "must be an integer >= 0")
    v.positive_float("timeout_s", args.timeout_s)
    args.message_bytes = int(args.size_mb * 1e6) // 4 * 4
    if args.message_bytes < 4:
        raise InputError("size_mb", args.size_mb, "must give at least 4 bytes")
    args.expected_hosts = [h for h in (args.expected_hosts or "").split(",") if h]
    return args


def _env() -> dict:
    need = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    lacking = [k for k in need if k not in os.environ]
    if lacking:
        raise InputError("environment", ",".join(lacking),
                         "not set; launch with torchrun (see `configurator probe`)")
    e = {k.lower(): os.environ[k] for k in need}
    for k in ("rank", "world_size", "local_rank", "local_world_size", "master_port"):
        e[k] = int(e[k])
    if e["world_size"] % e["local_world_size"] or e["rank"] % e["local_world_size"] != \
            e["local_rank"]:
        raise InputError("environment", f"RANK={e['rank']},LOCAL_RANK={e['local_rank']}",
                         "ranks must be node-major with equal LOCAL_WORLD_SIZE (torchrun)")
    e["agent_store"] = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return e


def _store(e: dict, timeout_s: float, master: bool):
    """A client of (or, for ``master``, the server of) the coordination store."""
    store = dist.TCPStore(e["master_addr"], e["master_port"], None, master,
                          datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"configurator-probe/{restart}", store)


def _one_line(err: BaseException) -> str:
    """The error on one line, without gloo's ``[source.cc:123]`` prefix, ≤ 300 characters."""
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ?", "", " ".join(str(err).split()))
    return (text or type(err).__name__)[:300]


class Aborted(Exception):
    """Rank 0 gave up (its reason is the message)."""


def wait_keys(store, keys: list[str], deadline: float) -> bool:
    """Poll until every key exists (True), the deadline passes (False) or ``abort`` is set
    (raises Aborted)."""
    while True:
        if store.check(keys):
            return True
        if store.check(["abort"]):
            raise Aborted(store.get("abort").decode())
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)


# -- rank 0: the coordinator ---------------------------------------------------------------

class Coordinator(threading.Thread):
    """Rank 0's watch over joining, set-up and every step; writes the file (full or partial)."""

    def __init__(self, e: dict, args, steps: list[pp.Step], backend: str, G: int):
        super().__init__(name="probe-coordinator", daemon=True)
        self.e, self.args, self.steps, self.backend, self.G = e, args, steps, backend, G
        self.nodes = e["world_size"] // G
        self.hosts = [None] * self.nodes
        self.results: dict[tuple[int, int], dict] = {}
        self.warnings: list[str] = []
        self.timestamp = datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds")
        self.store = _store(e, args.timeout_s, master=False)

    def _host_names(self) -> list[str]:
        exp = self.args.expected_hosts
        return [h or (exp[k] if k < len(exp) else f"node_rank{k}")
                for k, h in enumerate(self.hosts)]

    def _write(self, missing: list[MissingMeasurement]):
        topo = pp.build_topology(hosts=self._host_names(), gpus_per_node=self.G,
                                 steps=self.steps, results=self.results, backend=self.backend,
                                 message_bytes=self.args.message_bytes,
                                 timestamp=self.timestamp, missing=missing,
                                 warnings=self.warnings)
        save_topology(topo, self.args.out, force=True)
        return topo

    def fail(self, what: str, missing: list[MissingMeasurement], first_unrun: int,
             write: bool = True) -> None:
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
            if pending and time.monotonic() > deadline:
                return got, pending
            if pending:
                time.sleep(POLL_S)
        return got, []

    def run(self) -> None:
        try:
            self._run()
        except Exception as err:  # never leave the other ranks waiting
            self.fail(f"probe internal error: {_one_line(err)}", [], len(self.steps))

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


def summary(topo) -> str:
    """One line: counts and the slowest/median inter-node host-level link (MB/s)."""
    inter = sorted((l.bandwidth_Bps, l.src, l.dst) for l in topo.links
                   if l.src != l.dst and l.src_gpu is None)
    text = f"{len(topo.links)} links, {len(topo.collectives)} collectives"
    if inter:
        med = statistics.median(b for b, _, _ in inter) / 1e6
        text += (f"; inter-node median {med:.1f} MB/s, slowest {inter[0][1]} -> "
                 f"{inter[0][2]} {inter[0][0] / 1e6:.1f} MB/s")
    return text


# -- every rank ----------------------------------------------------------------------------

def _watchdog(e: dict, timeout_s: float) -> None:
    """Non-zero ranks: exit when rank 0 aborts (a hung collective cannot be interrupted)."""
    store = _store(e, timeout_s, master=False)
    while True:
        try:
            if store.check(["final"]):
                return
            if store.check(["abort"]):
                if e["local_rank"] == 0:
                    print(f"probe: stopped by rank 0: {store.get('abort').decode()}",
                          file=sys.stderr, flush=True)
                os._exit(EXIT_FAILED)
        except Exception:  # the store went away: rank 0 (or its agent) is gone
            if e["local_rank"] == 0:
                print("probe: stopped: lost the coordination store (rank 0 is gone)",
                      file=sys.stderr, flush=True)
            os._exit(EXIT_FAILED)
        time.sleep(0.1)


def _backend(choice: str, local_rank: int) -> tuple[str, torch.device]:
    cuda = torch.cuda.is_available()
    name = choice if choice != "auto" else ("nccl" if cuda and dist.is_nccl_available()
                                           else "gloo")
    if name == "gloo":
        return name, torch.device("cpu")
    if not cuda or torch.cuda.device_count() <= local_rank:
        raise InputError("backend", "nccl", f"needs a CUDA device for local rank {local_rank}")
    torch.cuda.set_device(local_rank)
    return name, torch.device("cuda", local_rank)


def run(args, e: dict) -> int:
    rank, G, T = e["rank"], e["local_world_size"], args.timeout_s
    backend, device = _backend(args.backend, e["local_rank"])
    steps = pp.plan_steps(e["world_size"] // G, G, intra_p2p=backend == "nccl")
    host = os.environ.get(HOSTNAME_ENV) or socket.gethostname()
    try:
        store = _store(e, T, master=rank == 0 and not e["agent_store"])
    except Exception as err:
        print(f"probe: error: rank {rank} on {host}: cannot reach the store at "
              f"{e['master_addr']}:{e['master_port']}: {_one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    if rank == 0:
        if os.path.exists(args.out) and not args.force:
            msg = str(InputError("out", args.out, "file exists; pass --force to overwrite"))
            store.set("abort", msg)
            print(f"probe: error: {msg}", file=sys.stderr)
            time.sleep(0.5)
            return EXIT_INPUT
        coord = Coordinator(e, args, steps, backend, G)
        if backend == "gloo" and G > 1:
            coord.warnings.append("intra-node GPU links not measured: gloo runs on CPU")
        coord.start()
    else:
        threading.Thread(target=_watchdog, args=(e, T), daemon=True).start()
    try:
        _participate(store, e, args, steps, backend, device, host)
    except Aborted:
        if rank == 0:
            coord.join()  # it writes the partial file, then ends the process
        raise
    except Exception as err:  # e.g. the store went away with rank 0
        print(f"probe: error: rank {rank} on {host}: {_one_line(err)}", file=sys.stderr)
        if rank == 0:
            coord.join()
        return EXIT_FAILED
    if rank == 0:
        coord.join()
    dist.destroy_process_group()
    return 0


def _participate(store, e: dict, args, steps: list[pp.Step], backend: str,
                 device: torch.device, host: str) -> None:
    """Join, set up the process group, take this rank's part in every step. Raises Aborted
    when rank 0 gives up (or, as a last resort, falls silent for 3·timeout + 30 s)."""
    rank, G, T = e["rank"], e["local_world_size"], args.timeout_s
    store.set(f"join/{rank}", json.dumps({"host": host, "local_rank": e["local_rank"]}))
    far = time.monotonic() + 3 * T + 30  # rank 0 aborts long before this
    if not wait_keys(store, ["roster"], far):
        raise Aborted("no roster from rank 0")
    roster = json.loads(store.get("roster"))
    try:
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank,
                                world_size=e["world_size"],
                                timeout=datetime.timedelta(seconds=T))
        names: list = [None] * e["world_size"]
        dist.all_gather_object(names, host)
        if [names[r] for r in range(0, e["world_size"], G)] != roster:
            raise RuntimeError(f"host names {names} differ from the roster {roster}")
        groups = {}
        for g in (s.groups for s in steps if s.groups):
            for ranks in g:
                groups[ranks] = dist.new_group(list(ranks))
        ops = Ops(device, args.message_bytes, args.warmup, args.iters)
        status = {"ok": 1}
    except Exception as err:
        status = {"error": _one_line(err)}
    store.set(f"init/{rank}", json.dumps(status))
    for k, step in enumerate(steps):
        role = step.role(rank)
        if role is not None and "error" not in status:
            try:
                kind, peer = role
                res = (ops.send(peer) if kind == "send" else ops.recv(peer) if kind == "recv"
                       else ops.all_reduce(peer, groups[peer]))
            except Exception as err:
                res = {"error": _one_line(err)}
            store.set(f"res/{k}/{rank}", json.dumps(res))
        if not wait_keys(store, [f"done/{k}"], far):
            raise Aborted("no word from rank 0")
    if not wait_keys(store, ["final"], far):
        raise Aborted("no final word from rank 0")
    store.set(f"bye/{rank}", "{}")


def main(argv: list[str] | None = None) -> int:
    """Entry point (``python -m topology.probe`` under torchrun). Bad arguments or environment:
    one line, returns 2. Otherwise the run ends the process itself with ``os._exit(status)``
    once output is flushed (0 ok, 1 failed, 2 bad input): torch's store and gloo threads can
    abort an ordinary interpreter exit, which torchrun would report as a failed node."""
    quiet = os.environ.get("LOCAL_RANK", "0") != "0"
    try:
        args = parse_args(argv)
        e = _env()
    except InputError as err:
        if not quiet:
            print(f"probe: error: {err}", file=sys.stderr)
        return EXIT_INPUT
    try:
        code = run(args, e)
    except InputError as err:
        if not quiet:
            print(f"probe: error: {err}", file=sys.stderr)
        code = EXIT_INPUT
    except Aborted:
        code = EXIT_FAILED
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
