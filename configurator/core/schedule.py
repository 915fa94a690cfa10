"""Pipeline-schedule facts shared by the time model (bubble, p2p count) and the memory model
(microbatches in flight): 1F1B (PipeDream-Flush) and interleaved 1F1B.

Sources: Narayanan et al. SC'21 §2.2 (bubble ``(p-1)/v`` of the ideal time, interleaved
chunks of ``L/(p·v)`` layers); Megatron-LM core_v0.16.1
``megatron/core/pipeline_parallel/schedules.py`` (warm-up microbatch counts of
``forward_backward_pipelining_without_interleaving`` and ``..._with_interleaving``); shared
REFERENCE §2. All functions broadcast over numpy arrays (``pp`` pipeline ranks, ``vp``
virtual stages per rank, ``m`` microbatches, ``stage`` the 0-based pipeline rank).
"""

from __future__ import annotations

import numpy as np


def bubble_stage_times(pp, vp):
    """Idle time of a pipeline rank per iteration, in units of one (fwd + bwd) stage-time of
    one microbatch: ``(pp - 1) / vp`` (SC'21 §2.2, Eq. 1 and its interleaved form)."""
    return (np.asarray(pp, dtype=float) - 1) / np.asarray(vp, dtype=float)


def p2p_transfers(pp, vp, m):
    """Activation/gradient sends on the critical path per iteration; 0 when ``pp == 1``.

    1F1B: ``m + 2·(pp - 1)``. Megatron batches each send with the next receive and waits
    for both (``overlap_p2p_comm`` is forced off without interleaving,
    megatron/training/arguments.py), so a send occupies its sender; the pace is set by the
    slowest stage, an end stage (it carries the embedding or the loss), which sends once
    per microbatch, plus the fill and drain through every boundary. (A middle stage sends
    twice; it sets the pace when the end stages' extra work is shorter than one send: the
    time model adds that difference, :func:`configurator.cost.iteration.iteration_time`.) Interleaved:
    ``2·(pp·vp - 1)``, the first microbatch's way through every virtual stage and back;
    steady-state sends overlap compute (``overlap_p2p_comm``, on by default with
    interleaving). Both are what the schedule simulator
    (:mod:`configurator.cost.schedule_sim`, :mod:`configurator.cost.placed`) finds."""
    pp, vp, m = (np.asarray(x, dtype=float) for x in (pp, vp, m))
    n = np.where(vp > 1, 2 * (pp * vp - 1), m + 2 * (pp - 1))
    return np.where(pp > 1, n, 0.0)


def warmup_forwards_1f1b(pp, m, stage):
    """Forwards rank ``stage`` runs before its first backward under 1F1B:
    ``min(pp - stage - 1, m)`` (``num_warmup_microbatches`` of
    ``forward_backward_pipelining_without_interleaving``)."""
    return np.minimum(np.asarray(pp) - np.asarray(stage) - 1, m)


def warmup_forwards_interleaved(pp, vp, m, stage):
    """Model-chunk forwards rank ``stage`` runs before its first backward under interleaved
    1F1B (``vp > 1``): ``min(2·(pp - stage - 1) + (vp - 1)·pp, m·vp)``
    (``num_warmup_microbatches`` of ``forward_backward_pipelining_with_interleaving``)."""
    pp, vp, m, r = (np.asarray(x) for x in (pp, vp, m, stage))
    return np.minimum(2 * (pp - r - 1) + (vp - 1) * pp, m * vp)


def warmup_forwards(pp, vp, m, stage):
    """Forwards (of model chunks) rank ``stage`` runs before its first backward: 1F1B for
    ``vp`` 1 (:func:`warmup_forwards_1f1b`), else interleaved
    (:func:`warmup_forwards_interleaved`)."""
    return np.where(np.asarray(vp) > 1, warmup_forwards_interleaved(pp, vp, m, stage),
                    warmup_forwards_1f1b(pp, m, stage))


def inflight_microbatches_1f1b(pp, m, stage):
    """Microbatches whose activations rank ``stage`` holds at the end of 1F1B's warm-up:
    ``min(pp - stage, m)`` (:func:`warmup_forwards_1f1b` + 1, at most ``m``)."""
    return np.minimum(warmup_forwards_1f1b(pp, m, stage) + 1, m)


def inflight_chunks_interleaved(pp, vp, m, stage):
    """Model chunks (of ``L/(pp·vp)`` layers) rank ``stage`` holds under interleaved 1F1B
    (``vp > 1``): ``min(m·vp, 2·(pp - stage - 1) + (vp - 1)·pp + 1)``
    (:func:`warmup_forwards_interleaved` + 1, at most ``m·vp``)."""
    return np.minimum(warmup_forwards_interleaved(pp, vp, m, stage) + 1,
                      np.asarray(m) * np.asarray(vp))


def inflight_layers(num_layers: int, *, pp, vp, num_microbatches, stage, rank_layers=None):
    """Layer-microbatches whose activations rank ``stage`` holds at its peak (count):
    1F1B ``min(pp - r, m)·n``; interleaved chunks × ``n/vp``, with ``n`` the layers the rank
    builds (``rank_layers``; default ``L/pp``)."""
    pp, vp = np.asarray(pp), np.asarray(vp)
    n = num_layers / pp if rank_layers is None else np.asarray(rank_layers, dtype=float)
    plain = inflight_microbatches_1f1b(pp, num_microbatches, stage) * n
    chunks = inflight_chunks_interleaved(pp, vp, num_microbatches, stage)
    return np.where(vp > 1, chunks * (n / vp), plain)
