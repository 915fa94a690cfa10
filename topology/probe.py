"""Bandwidth probe: measure GPU↔GPU and node↔node links with torch.distributed, write a
topology file (:mod:`topology.topofile`).

Run the same command on every node (torchrun static rendezvous: deterministic node ranks)::

    torchrun --nnodes N --nproc-per-node G --node-rank R --master-addr A --master-port P \\
        -m topology.probe --out topo.json [--size-mb 32] [--iters 5] [--warmup 2] \\
        [--timeout-s 120] [--backend auto|nccl|gloo] [--expected-hosts h0,h1,...] [--force]

What is measured and in which order: :mod:`topology.probe_plan`; how each figure is timed:
:mod:`topology.probe_ops`. NCCL on GPUs (``torch.cuda.set_device(LOCAL_RANK)`` first), gloo on
CPU (no intra-node GPU links then). Messages of ``--size-mb`` MB (1e6 bytes; ≥ 32 MB
recommended: smaller messages measure latency more than bandwidth), ``--warmup`` untimed and
``--iters`` timed samples per direction (all kept in ``samples``; the record holds their
median). torch is imported only by this module and :mod:`topology.probe_ops`.

Coordination goes through a TCP store beside the process group (torchrun's agent store, or
one hosted by rank 0 when launched without torchrun), so a stuck link cannot stop it: ranks
register their host name (``socket.gethostname()``, or ``$CONFIGURATOR_PROBE_HOSTNAME``), rank
0 waits at most ``--timeout-s`` for every rank to join, to finish process-group set-up and to
report each step. When a deadline passes, or a rank reports an error, rank 0 writes the
measurements gathered so far plus ``missing`` records to ``--out``, prints one line naming the
host(s) or link(s), and every rank exits with status 1. A rank whose store calls stop being
answered for ``--timeout-s`` (node 0 gone) exits with status 1 too, rank 0 after writing what
it has (:class:`topology.probe_coord.Deadman`). Bad arguments: one line, status 2.

A node whose torchrun never starts is caught by torchrun's own rendezvous before any probe
process runs (pass ``--rdzv-conf timeout=SECONDS``); ``configurator probe`` prints such a
command line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist

from configurator.core.errors import InputError
from topology import probe_coord as pc
from topology import probe_plan as pp
from topology.probe_plan import add_probe_options, check_probe_options
from topology.probe_coord import Aborted, Coordinator, wait_keys
from topology.probe_ops import Ops

EXIT_FAILED, EXIT_INPUT = pc.EXIT_FAILED, 2
HOSTNAME_ENV = pc.HOSTNAME_ENV


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, status 2
        self.exit(EXIT_INPUT, f"probe: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the probe's arguments; InputError names a bad value."""
    p = _Parser(prog="python -m topology.probe", description=__doc__.split("\n\n")[0])
    add_probe_options(p, out_required=True)
    args = p.parse_args(argv)
    check_probe_options(args)
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


# -- every rank ----------------------------------------------------------------------------

def _watchdog(e: dict, timeout_s: float) -> None:
    """Non-zero ranks: exit when rank 0 aborts (a hung collective cannot be interrupted)."""
    store = _store(e, timeout_s, master=False)
    while True:
        try:
            if store.check(["final"]):
                pc.DEADMAN.stopped = True
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
        pc.beat()
        time.sleep(0.1)


def _backend(choice: str, local_rank: int) -> tuple[str, torch.device]:
    """Backend and device: ``cuda:LOCAL_RANK`` (or ``cuda:0`` when the launcher shows each
    rank a single GPU) made current before NCCL starts; CPU for gloo."""
    cuda = torch.cuda.is_available()
    name = choice if choice != "auto" else ("nccl" if cuda and dist.is_nccl_available()
                                           else "gloo")
    if name == "gloo":
        return name, torch.device("cpu")
    count = torch.cuda.device_count() if cuda else 0
    if count <= local_rank and count != 1:
        raise InputError("backend", "nccl", f"needs a CUDA device for local rank {local_rank} "
                                            f"({count} visible)")
    index = local_rank if count > local_rank else 0
    torch.cuda.set_device(index)
    return name, torch.device("cuda", index)


def run(args, e: dict) -> int:
    rank, G, T = e["rank"], e["local_world_size"], args.timeout_s
    backend, device = _backend(args.backend, e["local_rank"])
    steps = pp.plan_steps(e["world_size"] // G, G, intra_p2p=backend == "nccl")
    host = os.environ.get(HOSTNAME_ENV) or socket.gethostname()

    def lost():  # a store call blocked for T s (connecting included)
        if e["local_rank"] == 0:
            print(f"probe: error: rank {rank} on {host}: the coordination store at "
                  f"{e['master_addr']}:{e['master_port']} has not answered for {T:g} s",
                  file=sys.stderr)

    pc.start_deadman(T, lost)
    try:
        store = _store(e, T, master=rank == 0 and not e["agent_store"])
    except Exception as err:
        print(f"probe: error: rank {rank} on {host}: cannot reach the store at "
              f"{e['master_addr']}:{e['master_port']}: {pc.one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    if rank == 0:
        if os.path.exists(args.out) and not args.force:
            msg = str(InputError("out", args.out, "file exists; pass --force to overwrite"))
            store.set("abort", msg)
            print(f"probe: error: {msg}", file=sys.stderr)
            time.sleep(0.5)
            return EXIT_INPUT
        coord = Coordinator(e, args, steps, backend, G, _store(e, T, master=False))
        if backend == "gloo" and G > 1:
            coord.warnings.append("intra-node GPU links not measured: gloo runs on CPU")
        pc.DEADMAN.on_fire = coord.store_lost
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
        print(f"probe: error: rank {rank} on {host}: {pc.one_line(err)}", file=sys.stderr)
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
    when rank 0 gives up (or, as a last resort, leaves one step unfinished for 2·timeout + 30 s:
    rank 0 gives every step at most one timeout)."""
    rank, G, T = e["rank"], e["local_world_size"], args.timeout_s

    def far() -> float:
        return time.monotonic() + 2 * T + 30

    store.set(f"join/{rank}", json.dumps({"host": host, "local_rank": e["local_rank"]}))
    if not wait_keys(store, ["roster"], far()):
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
        status = {"error": pc.one_line(err)}
    store.set(f"init/{rank}", json.dumps(status))
    for k, step in enumerate(steps):
        role = step.role(rank)
        if role is not None and "error" not in status:
            try:
                kind, peer = role
                res = (ops.send(peer) if kind == "send" else ops.recv(peer) if kind == "recv"
                       else ops.all_reduce(peer, groups[peer]))
            except Exception as err:
                res = {"error": pc.one_line(err)}
            store.set(f"res/{k}/{rank}", json.dumps(res))
        if not wait_keys(store, [f"done/{k}"], far()):
            raise Aborted("no word from rank 0")
    if not wait_keys(store, ["final"], far()):
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
