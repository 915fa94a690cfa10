"""Timing kernels with torch on the local device: torch imported on demand (a one-line error
without it), the device chosen (``auto``: CUDA when torch sees one, else the CPU) and the
median forward and backward times of a callable (:func:`time_forward_backward`), for the
layer profiler (:mod:`configurator.profiler.layer`) and the kernel benchmarks under
``bench/``.

torch is imported only inside :func:`import_torch`, never on the tool's import path.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from configurator.core import validate as v
from configurator.core.errors import InputError

DEVICES = ("auto", "cuda", "cpu")


def import_torch():
    """The torch module; :class:`InputError` (one line) where it is not installed."""
    try:
        import torch
    except ImportError:
        raise InputError("profile", "torch", "needs PyTorch (pip install torch)") from None
    return torch


def bench_torch(dry_run: bool):
    """``(torch, cuda)`` for a benchmark that times kernels on the local GPU
    (``bench/kernels/``: ``kernel_shapes``, ``gemm_shapes``, ``attention_masks``);
    ``dry_run`` lets it run its code path on the CPU. Raises :class:`InputError` without
    torch, or without a CUDA device unless ``dry_run``."""
    torch = import_torch()
    cuda = torch.cuda.is_available()
    if not cuda and not dry_run:
        raise InputError("device", "cpu", "needs a CUDA device (--dry-run: the CPU)")
    return torch, cuda


def torch_device(torch, device: str):
    """The ``torch.device`` for ``device`` (one of :data:`DEVICES`; ``auto``: CUDA when torch
    sees one, else the CPU). Raises :class:`InputError` for ``cuda`` without a CUDA device."""
    v.choice("device", device, DEVICES)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device", "cuda", "torch sees no CUDA device")
    return torch.device(device)


def time_forward_backward(torch, forward: Callable, backward: Callable, *, warmup: int,
                          repeats: int, cuda: bool, before: Callable | None = None
                          ) -> tuple[float, float]:
    """Median seconds ``(forward, backward)`` of ``out = forward()`` then ``backward(out)``
    over ``repeats`` runs after ``warmup`` untimed ones: CUDA events on a GPU (``cuda``),
    :func:`time.perf_counter` on the CPU; ``before()`` runs ahead of each run, untimed.
    The profiler's timing, and ``bench/kernels/kernel_shapes.py``'s and
    ``bench/kernels/gemm_shapes.py``'s."""
    fwd_s, bwd_s = [], []
    for i in range(warmup + repeats):
        if before is not None:
            before()
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record()
            out = forward()
            ev[1].record()
            backward(out)
            ev[2].record()
            torch.cuda.synchronize()
            f, b = ev[0].elapsed_time(ev[1]) / 1e3, ev[1].elapsed_time(ev[2]) / 1e3
        else:
            t0 = time.perf_counter()
            out = forward()
            t1 = time.perf_counter()
            backward(out)
            f, b = t1 - t0, time.perf_counter() - t1
        del out
        if i >= warmup:
            fwd_s.append(f)
            bwd_s.append(b)
    return statistics.median(fwd_s), statistics.median(bwd_s)
