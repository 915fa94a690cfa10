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
host(s) or link(s), and every rank exits with status 1. A rank whose store calls fail (node
0's torchrun agent, which hosts the store, is gone) or stop being answered for ``--timeout-s``
exits with status 1 too, rank 0 after writing what it has
(:class:`topology.probe_coord.Deadman`). SIGINT, SIGTERM, SIGHUP or SIGQUIT (torchrun forwards
the one it gets to its workers) stop the run the same way: rank 0 writes the partial file and
tells the others. A partial file lists as ``missing`` every measurement without a figure. Each
node prints one line (from local rank 0; values flattened to one line) and no traceback:
torch's C++ warnings, which carry stack frames, are off unless ``$TORCH_CPP_LOG_LEVEL`` is set
(torchrun itself still reports a failed worker in its own words). Bad arguments or
environment: one line, status 2; so is a missing torch (``pip install 'configurator[probe]'``).

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

from configurator.core import validate as v
from configurator.core.errors import InputError
from topology import probe_coord as pc
from topology import probe_plan as pp
from topology.probe_plan import TorchMissing, add_probe_options, check_probe_options
from topology.probe_coord import Aborted, Coordinator, Guarded, StoreLost, end, say, wait_keys

# Before torch loads: c10's warnings when a peer or the store goes away carry C++ stack
# frames; the probe reports such failures itself, on one line.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

try:
    import torch
    import torch.distributed as dist
except Exception as _err:  # ImportError, or OSError from a broken CUDA library
    if __name__ == "__main__":
        if os.environ.get("LOCAL_RANK", "0") == "0":
            say(f"probe: error: {pp.torch_needed(_err)}")
        sys.exit(2)
    raise TorchMissing(pp.torch_needed(_err)) from None

from topology.probe_ops import Ops  # noqa: E402 - needs torch

EXIT_FAILED, EXIT_INPUT = pc.EXIT_FAILED, 2
HOSTNAME_ENV = pc.HOSTNAME_ENV


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, status 2
        self.exit(EXIT_INPUT, f"probe: error: {pc.flat(message)}\n")


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
        try:
            e[k] = int(e[k])
        except ValueError:
            raise InputError(k.upper(), e[k], "must be an integer") from None
    if e["local_world_size"] < 1 or e["world_size"] % e["local_world_size"] or \
            e["rank"] % e["local_world_size"] != e["local_rank"]:
        raise InputError("environment", f"RANK={e['rank']},LOCAL_RANK={e['local_rank']}",
                         "ranks must be node-major with equal LOCAL_WORLD_SIZE (torchrun)")
    v.display_name("MASTER_ADDR", e["master_addr"])
    e["agent_store"] = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return e


def _host() -> str:
    """This node's name: ``$CONFIGURATOR_PROBE_HOSTNAME`` or ``socket.gethostname()``, one
    line of printable characters (InputError otherwise)."""
    name = os.environ.get(HOSTNAME_ENV)
    return v.display_name(HOSTNAME_ENV if name else "hostname", name or socket.gethostname())


def _store(e: dict, timeout_s: float, master: bool) -> Guarded:
    """A client of (or, for ``master``, the server of) the coordination store."""
    store = dist.TCPStore(e["master_addr"], e["master_port"], None, master,
                          datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return Guarded(dist.PrefixStore(f"configurator-probe/{restart}", store))


# -- every rank ----------------------------------------------------------------------------

def _lost_line(e: dict, host: str, why: str) -> str:
    return (f"probe: error: rank {e['rank']} on {host}: lost the coordination store at "
            f"{e['master_addr']}:{e['master_port']} (node 0 gone?): {why}")


def _watchdog(e: dict, timeout_s: float, host: str) -> None:
    """Non-zero ranks: exit when rank 0 aborts or the store goes away (a hung collective
    cannot be interrupted). One line, from local rank 0 only (the same on every rank)."""
    quiet = e["local_rank"] != 0
    try:
        store = _store(e, timeout_s, master=False)
        while True:
            if store.check(["final"]):
                pc.DEADMAN.stopped = True
                return
            if store.check(["abort"]):
                why = store.get("abort").decode(errors="replace")
                end(EXIT_FAILED, None if quiet else f"probe: stopped by rank 0: {why}")
            pc.beat()
            time.sleep(0.1)
    except StoreLost as err:
        end(EXIT_FAILED, None if quiet else _lost_line(e, host, str(err)))
    except Exception as err:  # noqa: BLE001 - e.g. the store could not be reached at all
        end(EXIT_FAILED, None if quiet else _lost_line(e, host, pc.one_line(err)))


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
    """This rank's run. Returns 0 when the file is written; every failure ends the process
    itself (:func:`topology.probe_coord.end`: one line, status 1)."""
    rank, G, T = e["rank"], e["local_world_size"], args.timeout_s
    quiet = e["local_rank"] != 0
    host = _host()
    backend, device = _backend(args.backend, e["local_rank"])
    steps = pp.plan_steps(e["world_size"] // G, G, intra_p2p=backend == "nccl")
    coord: list[Coordinator] = []   # rank 0's, once started
    store_box: list[Guarded] = []

    def lost() -> None:  # a store call blocked for T s (connecting included)
        end(EXIT_FAILED, None if quiet else
            f"probe: error: rank {rank} on {host}: the coordination store at "
            f"{e['master_addr']}:{e['master_port']} has not answered for {T:g} s")

    def stopped(name: str) -> None:  # SIGINT, SIGTERM, ... (torchrun forwards its own)
        why = f"stopped by {name} on {host}"
        line = [f"probe: {why}"]
        if coord and coord[0].is_alive():
            coord[0].stop(why)
            coord[0].join(T + 5)  # it writes the partial file and ends the process
        if coord and coord[0].completed:
            line = [f"probe: {why} after writing {args.out}"]
        elif store_box and rank != 0:
            # torchrun stops the other local ranks with a signal when one ends: name the
            # cause (rank 0's abort, the store gone) where there is one, else ask rank 0 to
            # stop now, with this reason
            def ask() -> None:
                try:
                    if store_box[0].check(["abort"]):
                        abort = store_box[0].get("abort").decode(errors="replace")
                        line[0] = f"probe: stopped by rank 0: {abort}"
                    else:
                        store_box[0].set("stop", why)
                except StoreLost as err:
                    line[0] = _lost_line(e, host, str(err))

            t = threading.Thread(target=ask, daemon=True)
            t.start()
            t.join(2.0)
        end(EXIT_FAILED, None if quiet else line[0])

    pc.start_deadman(T, lost)
    pc.on_signals(stopped)
    try:
        store = _store(e, T, master=rank == 0 and not e["agent_store"])
    except Exception as err:  # noqa: BLE001 - torch raises several kinds here
        end(EXIT_FAILED, f"probe: error: rank {rank} on {host}: cannot reach the store at "
                         f"{e['master_addr']}:{e['master_port']}: {pc.one_line(err)}")
    store_box.append(store)
    if rank == 0:
        if os.path.exists(args.out) and not args.force:
            msg = str(InputError("out", args.out, "file exists; pass --force to overwrite"))
            end(EXIT_INPUT, f"probe: error: {msg}", lambda: (store.set("abort", msg),
                                                            time.sleep(0.5)))
        c = Coordinator(e, args, steps, backend, G, _store(e, T, master=False))
        if backend == "gloo" and G > 1:
            c.warnings.append("intra-node GPU links not measured: gloo runs on CPU")
        pc.DEADMAN.on_fire = c.store_lost
        coord.append(c)
        c.start()
    else:
        threading.Thread(target=_watchdog, args=(e, T, host), daemon=True).start()
    try:
        _participate(store, e, args, steps, backend, device, host)
    except Exception as err:  # noqa: BLE001 - every way out is one line
        if rank == 0:
            c = coord[0]
            if not isinstance(err, Aborted):  # Aborted: c is failing already
                c.stop(f"rank 0 on {host}: {pc.one_line(err)}")
            c.join()  # it ends the process, unless the file was written already
            if c.completed:
                return 0
            end(EXIT_FAILED, f"probe: error: rank 0 on {host}: {pc.one_line(err)}")
        if isinstance(err, Aborted):
            end(EXIT_FAILED, None if quiet else f"probe: {err}")
        if isinstance(err, StoreLost):
            end(EXIT_FAILED, None if quiet else _lost_line(e, host, str(err)))
        end(EXIT_FAILED, f"probe: error: rank {rank} on {host}: {pc.one_line(err)}")
    if rank == 0:
        coord[0].join()
    dist.destroy_process_group()
    return 0


def _participate(store: Guarded, e: dict, args, steps: list[pp.Step], backend: str,
                 device: torch.device, host: str) -> None:
    """Join, set up the process group, take this rank's part in every step. Raises Aborted
    when rank 0 gives up (or, as a last resort, leaves one step unfinished for 2·timeout + 30 s:
    rank 0 gives every step at most one timeout), StoreLost when the store goes away."""
    rank, G, T = e["rank"], e["local_world_size"], args.timeout_s
    silence = f"error: rank {rank} on {host}: no word from rank 0 within {2 * T + 30:g} s"

    def far() -> float:
        return time.monotonic() + 2 * T + 30

    store.set(f"join/{rank}", json.dumps({"host": host, "local_rank": e["local_rank"]}))
    if not wait_keys(store, ["roster"], far()):
        raise Aborted(silence)
    roster = json.loads(store.get("roster"))
    try:
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store.raw), rank=rank,
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
            raise Aborted(silence)
    if not wait_keys(store, ["final"], far()):
        raise Aborted(silence)
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
        _host()
    except InputError as err:
        if not quiet:
            say(f"probe: error: {err}")
        return EXIT_INPUT
    try:
        code = run(args, e)
    except InputError as err:
        end(EXIT_INPUT, None if quiet else f"probe: error: {err}")
    except Exception as err:  # noqa: BLE001 - a bug still ends in one line
        end(EXIT_FAILED, f"probe: error: rank {e['rank']}: probe internal error: "
                         f"{pc.one_line(err)}")
    end(code)


if __name__ == "__main__":
    sys.exit(main())
