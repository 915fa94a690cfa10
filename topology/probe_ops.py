"""Timed torch.distributed operations of the bandwidth probe (one rank's side of each).

A transfer ``src → dst`` is timed by the receiver: it sends a small control message holding the
number of messages to come, then times until the last of them has arrived (CUDA synchronised).
``warmup`` untimed samples come first, the last of which sizes the timed ones to at least
:data:`MIN_SAMPLE_S` (short GPU transfers are repeated, up to :data:`MAX_REPS` messages);
then ``iters`` timed samples, each ``reps · message_bytes / seconds`` (bytes/s). Latency: half
the round trip of an 8-byte message, median of :data:`LATENCY_PINGS`. All-reduce: bus
bandwidth ``busbw = algbw · 2(n−1)/n`` (nccl-tests doc/PERFORMANCE.md).
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

MIN_SAMPLE_S = 0.02      # a timed sample lasts at least this long (messages are repeated)
MAX_REPS = 1000          # at most this many messages per sample
LATENCY_PINGS = 5        # round trips per latency figure (its median); set by hand


class Ops:
    """The timed operations on one rank; ``device`` is ``cuda:LOCAL_RANK`` or ``cpu``."""

    def __init__(self, device: torch.device, message_bytes: int, warmup: int, iters: int):
        self.device, self.nbytes = device, message_bytes
        self.warmup, self.iters = warmup, iters
        self.buf = torch.zeros(message_bytes // 4, dtype=torch.float32, device=device)
        self.ctl = torch.zeros(1, dtype=torch.int64, device=device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _next_reps(self, reps: int, dt: float) -> int:
        return max(1, min(MAX_REPS, math.ceil(MIN_SAMPLE_S * reps / max(dt, 1e-9))))

    def send(self, peer: int) -> dict:
        for _ in range(LATENCY_PINGS):
            dist.recv(self.ctl, peer)
            dist.send(self.ctl, peer)
        for _ in range(self.warmup + self.iters):
            dist.recv(self.ctl, peer)
            for _ in range(int(self.ctl.item())):
                dist.send(self.buf, peer)
            self.sync()
        return {"sent": True}

    def recv(self, peer: int) -> dict:
        lat = []
        for _ in range(LATENCY_PINGS):
            t0 = time.perf_counter()
            dist.send(self.ctl, peer)
            dist.recv(self.ctl, peer)
            self.sync()
            lat.append((time.perf_counter() - t0) / 2)
        reps, samples = 1, []
        for k in range(self.warmup + self.iters):
            self.ctl.fill_(reps)
            t0 = time.perf_counter()
            dist.send(self.ctl, peer)
            for _ in range(reps):
                dist.recv(self.buf, peer)
            self.sync()
            dt = time.perf_counter() - t0
            if k < self.warmup:
                reps = self._next_reps(reps, dt)
            else:
                samples.append(reps * self.nbytes / dt)
        return {"samples_Bps": samples, "latency_s": statistics.median(lat)}

    def all_reduce(self, ranks: tuple[int, ...], group) -> dict:
        n, reps, samples = len(ranks), 1, []
        for k in range(self.warmup + self.iters):
            self.ctl.fill_(reps)  # agree on the repetition count (and line up) first
            dist.all_reduce(self.ctl, op=dist.ReduceOp.MAX, group=group)
            reps = int(self.ctl.item())
            t0 = time.perf_counter()
            for _ in range(reps):
                dist.all_reduce(self.buf, group=group)
            self.sync()
            dt = time.perf_counter() - t0
            if k < self.warmup:
                reps = self._next_reps(reps, dt)
            else:  # nccl-tests PERFORMANCE.md: busbw = algbw · 2(n-1)/n
                samples.append(reps * self.nbytes / dt * 2 * (n - 1) / n)
        return {"busbw_samples_Bps": samples} if dist.get_rank() == ranks[0] else {"done": 1}
