"""What the bandwidth probe measures, in which order, and how its results become a Topology.

Pure Python (no torch): the schedule is a list of :class:`Step` run one after another by every
rank, with a barrier between steps; within a step each rank takes part in at most one
transfer, so the transfers of a step run concurrently without sharing an endpoint.

Ranks follow torchrun: ``rank = node_rank · G + local_rank`` with ``G`` processes (GPUs) per
node (torchrun static rendezvous). The steps, in order:

1. ``intra``: GPU↔GPU send/recv inside every node, one ordered local pair ``i → j`` at a time
   (all nodes at once; NCCL only — gloo runs on CPU where there is no GPU link to measure);
2. ``all_reduce``: all-reduce among the ``G`` ranks of every node (all nodes at once), when
   ``G > 1``; bus bandwidth ``busbw = algbw · 2(G−1)/G`` (nccl-tests PERFORMANCE.md);
3. ``host``: node↔node send/recv with one rank per node (local rank 0), node pairs in the
   rounds of :func:`circle_rounds`, each round once per direction;
4. ``rail``: the same rounds with all ``G`` local ranks at once, rank ``(A, i) ↔ (B, i)``
   (rail ``i``), when ``G > 1``.
"""

from __future__ import annotations

import math
import re
import shlex
import statistics
from dataclasses import dataclass

from configurator.core import validate as v
from configurator.core.errors import InputError, one_line

from topology.topofile import (CollectiveMeasurement, LinkMeasurement, MissingMeasurement,
                               Topology)

#: Label of intra-node GPU↔GPU records: send/recv cannot tell NVLink from PCIe peer access.
INTRA_LINK_CLASS = "gpu-p2p"
INTER_LINK_CLASS = "network"


def circle_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Round-robin pairing of ``n`` items by the circle method (Kirkman/Lucas; the schedule of
    a round-robin tournament): item 0 stays fixed while the others rotate one place a round.

    Returns ``n − 1`` rounds of ``n/2`` disjoint pairs ``(a, b)`` with ``a < b`` for even
    ``n``; for odd ``n`` a dummy item gives each item one bye: ``n`` rounds of ``(n−1)/2``
    pairs. Every unordered pair appears exactly once. ``n < 2`` gives no rounds. Raises
    ValueError for negative ``n``.
    """
    if n < 0:
        raise ValueError(f"circle_rounds needs n >= 0, got {n}")
    if n < 2:
        return []
    m = n + (n % 2)                 # index m-1 is the dummy ("bye") when n is odd
    ring = list(range(m))
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = ring[k], ring[m - 1 - k]
            if a < n and b < n:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ring = [ring[0], ring[-1]] + ring[1:-1]
    return rounds


@dataclass(frozen=True)
class Step:
    """One barrier-separated stage. ``kind``: ``intra`` | ``all_reduce`` | ``host`` | ``rail``.
    ``transfers``: directed ``(src_rank, dst_rank)`` pairs (the receiver times and reports);
    ``groups``: rank tuples of an all-reduce (the first rank reports)."""
    name: str
    kind: str
    transfers: tuple[tuple[int, int], ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()

    def reporters(self) -> tuple[int, ...]:
        """Ranks whose result completes the step."""
        return tuple(d for _, d in self.transfers) + tuple(g[0] for g in self.groups)

    def role(self, rank: int) -> tuple[str, object] | None:
        """``("send", peer)``, ``("recv", peer)``, ``("group", ranks)`` or None (idle)."""
        for s, d in self.transfers:
            if rank == s:
                return "send", d
            if rank == d:
                return "recv", s
        for g in self.groups:
            if rank in g:
                return "group", g
        return None


def plan_steps(nodes: int, gpus_per_node: int, intra_p2p: bool) -> list[Step]:
    """The probe's schedule for ``nodes`` nodes of ``gpus_per_node`` ranks (module docstring).
    ``intra_p2p`` False skips step kind ``intra`` (gloo). Raises ValueError for counts < 1."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"plan_steps needs nodes, gpus_per_node >= 1, got {nodes}, "
                         f"{gpus_per_node}")
    G = gpus_per_node
    steps: list[Step] = []
    if intra_p2p and G > 1:
        for i in range(G):
            for j in range(G):
                if i != j:
                    steps.append(Step(f"intra-node gpu{i}->gpu{j}", "intra",
                                      tuple((h * G + i, h * G + j) for h in range(nodes))))
    if G > 1:
        steps.append(Step("intra-node all_reduce", "all_reduce",
                          groups=tuple(tuple(range(h * G, h * G + G)) for h in range(nodes))))
    rounds = circle_rounds(nodes)
    for kind, lanes in (("host", (0,)), ("rail", tuple(range(G)) if G > 1 else ())):
        if not lanes:
            continue
        for r, pairs in enumerate(rounds):
            for direction, flip in (("forward", False), ("backward", True)):
                transfers = tuple(((b, a) if flip else (a, b)) for a, b in pairs)
                steps.append(Step(
                    f"inter-node {kind} round {r + 1}/{len(rounds)} {direction}", kind,
                    tuple((s * G + i, d * G + i) for s, d in transfers for i in lanes)))
    return steps


def _median(values) -> float:
    return float(statistics.median(values))


def build_topology(*, hosts: list[str], gpus_per_node: int, steps: list[Step],
                   results: dict[tuple[int, int], dict], backend: str, message_bytes: int,
                   timestamp: str, missing: list[MissingMeasurement] = (),
                   warnings: list[str] = ()) -> Topology:
    """Turn the reported results into a :class:`~topology.topofile.Topology`.

    ``hosts[k]`` is node_rank ``k``'s name; ``results[(step_index, rank)]`` is what rank
    reported for that step: ``{"samples_Bps": [...], "latency_s": x}`` for a transfer
    (bytes/s per sample, seconds) or ``{"busbw_samples_Bps": [...]}`` for an all-reduce.
    Steps or transfers without a result are skipped (the caller lists them in ``missing``).
    Per-direction bandwidth is the median of the samples; all samples are kept.
    """
    G = gpus_per_node
    links, colls = [], []
    method = f"probe {backend} send/recv"
    for k, step in enumerate(steps):
        for s, d in step.transfers:
            res = results.get((k, d))
            if not res or not res.get("samples_Bps"):
                continue
            samples = tuple(float(x) for x in res["samples_Bps"])
            common = dict(src=hosts[s // G], dst=hosts[d // G],
                          bandwidth_Bps=_median(samples), latency_s=res.get("latency_s"),
                          message_bytes=message_bytes, method=method, timestamp=timestamp,
                          samples_Bps=samples)
            if step.kind == "intra":
                links.append(LinkMeasurement(src_gpu=s % G, dst_gpu=d % G,
                                             link_class=INTRA_LINK_CLASS, **common))
            elif step.kind == "host":
                links.append(LinkMeasurement(src_gpu=None, dst_gpu=None, gpus_per_host=1,
                                             rails_used=1, link_class=INTER_LINK_CLASS,
                                             **common))
            else:  # rail: one NIC per local rank, all rails loaded at once
                links.append(LinkMeasurement(src_gpu=s % G, dst_gpu=d % G, gpus_per_host=G,
                                             link_class=INTER_LINK_CLASS, **common))
        for g in step.groups:
            res = results.get((k, g[0]))
            if not res or not res.get("busbw_samples_Bps"):
                continue
            colls.append(CollectiveMeasurement(
                hosts=(hosts[g[0] // G],), gpus_per_host=len(g), op="all_reduce",
                busbw_Bps=_median(res["busbw_samples_Bps"]), message_bytes=message_bytes,
                method=f"probe {backend} all_reduce busbw", timestamp=timestamp))
    return Topology(hosts=tuple(hosts), gpus_per_host=G, links=tuple(links),
                    collectives=tuple(colls), missing=tuple(missing),
                    warnings=tuple(warnings))


def describe_transfer(step: Step, src: int, dst: int, hosts: list[str], G: int) -> str:
    """``"hostA -> hostB"`` (host-level) or ``"hostA/gpu1 -> hostB/gpu1"`` for messages."""
    if step.kind == "host":
        return f"{hosts[src // G]} -> {hosts[dst // G]}"
    return f"{hosts[src // G]}/gpu{src % G} -> {hosts[dst // G]}/gpu{dst % G}"


def missing_for(step: Step, done: set[int], hosts: list[str], G: int,
                reason: str) -> list[MissingMeasurement]:
    """Missing records for the transfers/groups of ``step`` whose reporter is not in ``done``
    (one per host pair; a group of one node is recorded as ``host → host``)."""
    out: dict[tuple[str, str], None] = {}
    for s, d in step.transfers:
        if d not in done:
            out[(hosts[s // G], hosts[d // G])] = None
    for g in step.groups:
        if g[0] not in done:
            out[(hosts[g[0] // G], hosts[g[0] // G])] = None
    return [MissingMeasurement(src=a, dst=b, reason=reason) for a, b in out]


def add_probe_options(p, *, out_required: bool) -> None:
    """The probe's own options, declared once for ``python -m topology.probe`` and for
    ``configurator probe`` (which passes them through to the command it prints)."""
    p.add_argument("-o", "--out", required=out_required, default=None if out_required else
                   "topology.json", help="topology file rank 0 writes (.json, else YAML)")
    p.add_argument("--size-mb", type=float, default=32.0, help="message size, MB (1e6 bytes)")
    p.add_argument("--iters", type=int, default=5, help="timed samples per direction")
    p.add_argument("--warmup", type=int, default=2, help="untimed samples per direction")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="deadline for joining, set-up and each step, seconds")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--expected-hosts", default=None,
                   help="comma-separated host names by node_rank, to name nodes that never join")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")


def check_probe_options(args) -> None:
    """Raise InputError naming the first bad probe option."""
    v.positive_float("size_mb", args.size_mb)
    v.positive_int("iters", args.iters)
    if args.warmup < 0:
        raise InputError("warmup", args.warmup, "must be an integer >= 0")
    v.positive_float("timeout_s", args.timeout_s)
    v.printable_text("out", args.out)
    if args.expected_hosts:
        for i, name in enumerate(args.expected_hosts.split(",")):
            if name:
                v.display_name(f"expected_hosts[{i}]", name)


class TorchMissing(ImportError):
    """torch cannot be imported where the probe runs; the message says how to install it."""


def torch_needed(err: BaseException) -> str:
    """One line: torch is needed (``err``: why importing it failed) and how to install it."""
    how = "install it with: pip install 'configurator[probe]' (or pip install torch)"
    name = getattr(err, "name", None) or ""
    if isinstance(err, ModuleNotFoundError) and (name == "torch" or name.startswith("torch.")):
        return f"the bandwidth probe needs torch, which is not installed; {how}"
    why = " ".join(one_line(f"{type(err).__name__}: {err}").split())[:200]
    return f"the bandwidth probe needs torch, which cannot be imported ({why}); {how}"


#: ``$NAME`` or ``${NAME}``: a shell variable that expands on each node.
_SHELL_VAR = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")


def shell_word(value: str) -> str:
    """``value`` as one shell word: a lone variable reference (``$MASTER_ADDR``) in double
    quotes, so that it still expands (to one word) where the command runs; anything else
    single-quoted as needed (:func:`shlex.quote`), so that nothing in it is interpreted."""
    if _SHELL_VAR.fullmatch(value):
        return f'"{value}"'
    return shlex.quote(value)


def probe_argv(args) -> list[str]:
    """The arguments of ``python -m topology.probe`` for the parsed ``args``."""
    out = ["--out", args.out, "--size-mb", f"{args.size_mb:g}", "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--timeout-s", f"{args.timeout_s:g}",
           "--backend", args.backend]
    if args.expected_hosts:
        out += ["--expected-hosts", args.expected_hosts]
    return out + (["--force"] if args.force else [])


def torchrun_command(args) -> str:
    """The shell command for every node. torchrun's static rendezvous waits ``timeout_s`` for
    all nodes (``--rdzv-conf timeout``) before any probe process starts. ``master_addr`` is a
    host, an address or a ``$VARIABLE`` (double-quoted: it expands on each node, also inside
    the ``--slurm`` form's ``bash -c '...'``); every value is one shell word (no injection)."""
    fields = (("nnodes", "nodes"), ("nproc_per_node", "gpus_per_node"))
    missing = [field for field, _ in fields if getattr(args, field) is None]
    if missing:   # every one at once; the CLI names them as its flags
        raise InputError(", ".join(missing), None, "required to print the torchrun command")
    for field, key in fields:
        v.int_in_range(field, getattr(args, field), key=key)
    v.positive_int("master_port", args.master_port)
    check_probe_options(args)
    v.printable_text("master_addr", args.master_addr)
    rank = shell_word("$SLURM_NODEID" if args.slurm else "$NODE_RANK")
    words = ["torchrun", "--nnodes", str(args.nnodes), "--nproc-per-node",
             str(args.nproc_per_node), "--node-rank", rank, "--master-addr",
             shell_word(args.master_addr),
             "--master-port", str(args.master_port), "--rdzv-conf",
             f"timeout={math.ceil(args.timeout_s)}", "-m", "topology.probe"]
    words += [shlex.quote(w) for w in probe_argv(args)]
    line = " ".join(words)
    if args.slurm:  # quoted: $SLURM_NODEID expands on each node, not where srun runs
        return f"srun --ntasks-per-node 1 bash -c {shlex.quote(line)}"
    return line
