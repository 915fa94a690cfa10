"""Exact simulation of one iteration's pipeline schedule: every microbatch's forward and
backward chunk on every pipeline rank, in Megatron-LM's per-rank execution order.

Source of the order: Megatron-LM core_v0.16.1 ``megatron/core/pipeline_parallel/schedules.py``
(``forward_backward_pipelining_without_interleaving``, ``forward_backward_pipelining_with_
interleaving``, ``get_pp_rank_microbatches``, ``get_schedule_table``); the closed form it
refines is :mod:`configurator.core.schedule` (bubble ``(pp-1)/vp`` stage-times, exposed
sends), shared REFERENCE §2.

Order on pipeline rank ``r`` of ``pp`` (``m`` microbatches, ``vp`` model chunks per rank,
virtual stage ``k = chunk·pp + r``):

* 1F1B (``vp == 1``): ``min(pp - r - 1, m)`` warm-up forwards, then one forward and one
  backward alternately (steady state), then the remaining backwards (cool-down).
* interleaved 1F1B (``vp > 1``, ``m`` divisible by ``pp``): the ``m·vp`` virtual microbatches
  follow Megatron's schedule table with ``microbatch_group_size_per_vp_stage = pp``: for each
  group of ``pp`` consecutive microbatches, chunk 0 of all of them, then chunk 1, ... The
  ``j``-th forward runs table entry ``j``; the ``j``-th backward runs the same microbatch on
  chunk ``vp - 1 - chunk(j)``. Warm-up ``min(2·(pp - r - 1) + (vp - 1)·pp, m·vp)`` forwards,
  then forward ``j + warm-up`` and backward ``j`` alternately, then the remaining backwards.
  (core_v0.16.1 no longer makes every rank all-forward when ``m == pp``; only ranks whose
  warm-up count reaches ``m·vp`` run everything forward first.)
* ``pp == 1``: forward, backward of each microbatch in turn (``forward_backward_no_pipelining``).

Timing model (a dependency DAG, evaluated exactly): each rank runs its ops one at a time in
the order above, an op starting as soon as the rank has finished its previous op and its
input has arrived. The forward of (microbatch, stage ``k``) needs the forward of stage
``k-1`` finished plus the p2p time of that link; the backward of stage ``k`` needs the
backward of stage ``k+1`` finished plus the p2p time back (the last virtual stage's backward
follows its own forward). Sends are non-blocking: communication is a delay on the edge and
never occupies the ranks; Megatron's batching of a step's isend/irecv pairs into one wait
(which couples neighbouring ranks) is not modelled, nor are the overlap_p2p_comm variants.
A rank's ``tail_s`` (e.g. the exposed data-parallel gradient reduction) runs after its last
backward; the iteration's makespan is the latest rank's finish including its tail. A caller
that wants a send to occupy its sender (Megatron's 1F1B, whose batched send/receive waits)
adds the send to the sender's op and passes no p2p time (:mod:`configurator.cost.placed`).

Evaluation: :func:`schedule_order` compiles the DAG once per ``(pp, vp, m)`` (cached): ops in
a global topological order grouped by level (each level holds at most one op per rank, all of
whose predecessors lie in earlier levels). :func:`simulate` walks it in plain Python for one
or few replicas and level by level with numpy over ``[ops, D]`` for many; both give the same
floating-point results. Each rank's finish of a small schedule is kept by its exact inputs
(tails aside), so a plan that differs from one priced before only in its tails is not walked
again.
"""

from __future__ import annotations

import functools
import operator
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from configurator.core.schedule import warmup_forwards

__all__ = ["ScheduleOrder", "SimResult", "clear_cache", "rank_op_sequence", "schedule_order",
           "simulate"]


def _check_int(name: str, value, minimum: int) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return v


def _check_schedule(pp, vp, num_microbatches) -> tuple[int, int, int]:
    """Validated ``(pp, vp, m)``; ValueError for what Megatron-LM would refuse."""
    pp = _check_int("pp", pp, 1)
    vp = _check_int("vp", vp, 1)
    m = _check_int("num_microbatches", num_microbatches, 1)
    if vp != 1 and pp == 1:
        raise ValueError(f"the interleaved schedule (vp={vp}) needs pp > 1")
    if vp != 1 and m % pp != 0:
        raise ValueError(f"the interleaved schedule needs num_microbatches ({m}) divisible "
                         f"by pp ({pp})")
    return pp, vp, m


def rank_op_sequence(pp, vp, num_microbatches, rank) -> list[tuple[str, int, int]]:
    """Ops of pipeline rank ``rank`` in Megatron-LM's execution order: a list of
    ``('F' | 'B', microbatch, chunk)``, ``2·m·vp`` long (module docstring for the rules;
    the row of :func:`_rank_sequences`, decoded).

    Raises ValueError for ``rank`` outside ``[0, pp)``, ``vp > 1`` with ``pp == 1`` or with
    ``num_microbatches`` not divisible by ``pp``, or non-positive counts.
    """
    pp, vp, m = _check_schedule(pp, vp, num_microbatches)
    rank = _check_int("rank", rank, 0)
    if rank >= pp:
        raise ValueError(f"rank must be in [0, pp={pp}), got {rank}")
    n_stages = pp * vp
    is_bwd, rest = np.divmod(_rank_sequences(pp, vp, m)[rank], m * n_stages)
    mb, stage = np.divmod(rest, n_stages)
    return [("B" if b else "F", int(x), int(k) // pp)
            for b, x, k in zip(is_bwd.tolist(), mb.tolist(), stage.tolist())]


def _rank_sequences(pp: int, vp: int, m: int) -> np.ndarray:
    """Every rank's ops in execution order as ids, ``[pp, 2·m·vp]`` int64 (arguments already
    checked): the forward of (microbatch ``mb``, virtual stage ``k``) is ``mb·pp·vp + k``,
    its backward that plus ``m·pp·vp``. The ``j``-th forward of a rank runs entry ``j`` of
    Megatron's ``get_schedule_table`` with ``microbatch_group_size_per_vp_stage = pp``
    (for each group of ``pp`` consecutive microbatches, chunk 0 of all of them, then chunk 1,
    ...; ``m`` is a multiple of ``pp`` when ``vp > 1``), the ``j``-th backward the same
    microbatch on chunk ``vp − 1 − chunk``; warm-up forwards
    (:func:`configurator.core.schedule.warmup_forwards`), then one forward and one backward
    alternately, then the remaining backwards (module docstring)."""
    total = m * vp
    n_stages = pp * vp
    t = np.arange(total)
    if vp == 1:
        mb, chunk = t, np.zeros_like(t)
    else:                               # the schedule table: groups of pp microbatches
        group, within = np.divmod(t, n_stages)
        chunk, offset = np.divmod(within, pp)
        mb = group * pp + offset
    ranks = np.arange(pp)[:, None]
    fwd = mb * n_stages + chunk * pp + ranks                           # [pp, total]
    bwd = m * n_stages + mb * n_stages + (vp - 1 - chunk) * pp + ranks
    warm = np.asarray(warmup_forwards(pp, vp, m, np.arange(pp)), dtype=np.int64)
    out = np.empty((pp, 2 * total), dtype=np.int64)
    for r in range(pp):
        w = int(warm[r])
        steady = total - w
        row = out[r]
        row[:w] = fwd[r, :w]
        row[w:w + 2 * steady:2] = fwd[r, w:]
        row[w + 1:w + 2 * steady:2] = bwd[r, :steady]
        row[w + 2 * steady:] = bwd[r, steady:]
    return out


#: Pipeline ranks from which :func:`_op_levels` places a level's ops with array operations
#: (a few µs a level whatever the ranks) rather than op by op in plain Python (under 1 µs an
#: op, a level holding up to one op a rank); both give the same levels. Whole compiles of
#: the search's schedules on the 2-core machine: pp 24 (vp 4, 1,152 microbatches) 0.085 s op
#: by op against 0.091 s by levels, pp 32 (vp 4, 1,408) 0.178 against 0.144 s, pp 64 (vp 2,
#: 2,816) 0.398 against 0.246 s.
ARRAY_LEVELS_MIN_PP = 32


def _op_levels(seq_ids: np.ndarray, data_pred: np.ndarray) -> np.ndarray:
    """Level of every op (``[n]`` int64; ids as :func:`_rank_sequences`): one past the later
    of its rank's previous op's and its input's (``data_pred``, -1 for none), 0 for an op
    with neither: the longest path to it, so each level holds at most one op a rank, all
    of whose predecessors lie in earlier levels. RuntimeError if some op can never run."""
    pp, per_rank = seq_ids.shape
    n = data_pred.shape[0]
    if pp >= ARRAY_LEVELS_MIN_PP:
        # Level by level: each rank places its next op where its input is placed already.
        lv = np.full(n + 1, -1, dtype=np.int64)
        lv[n] = 0                                   # index n: "no input", always placed
        inputs = np.where(data_pred >= 0, data_pred, n)
        pos = np.zeros(pp, dtype=np.int64)
        active = np.arange(pp)
        level = 0
        while active.size:
            cand = seq_ids[active, pos[active]]
            ok = lv[inputs[cand]] >= 0
            if not ok.any():
                raise RuntimeError(f"schedule deadlocks ({pp} ranks)")
            lv[cand[ok]] = level
            pos[active[ok]] += 1
            active = active[pos[active] < per_rank]
            level += 1
        return lv[:n]
    # Sweep after sweep, every rank as far as its inputs allow (-1: not placed yet).
    lv = [-1] * n
    dp_l = data_pred.tolist()
    rows = seq_ids.tolist()
    pos = [0] * pp
    top = [-1] * pp                   # each rank's last placed op's level
    remaining = n
    while remaining:
        progressed = False
        for r in range(pp):
            ids = rows[r]
            i = first = pos[r]
            prev = top[r]
            while i < per_rank:
                op = ids[i]
                d = dp_l[op]
                if d >= 0:
                    ld = lv[d]
                    if ld < 0:
                        break
                    if ld > prev:
                        prev = ld
                prev += 1
                lv[op] = prev
                i += 1
            if i > first:
                remaining -= i - first
                pos[r], top[r] = i, prev
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule deadlocks ({pp} ranks)")
    return np.asarray(lv, dtype=np.int64)


def _frozen(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class ScheduleOrder:
    """The compiled DAG of one ``(pp, vp, num_microbatches)`` schedule (read-only arrays).

    Ops (``n_ops = 2·pp·vp·m``) are numbered in a global topological order sorted by level;
    every per-op array has shape ``[n_ops]``:

    * ``rank``, ``kind`` (``'F'``/``'B'``), ``microbatch``, ``chunk``, ``stage`` (virtual
      stage ``chunk·pp + rank``);
    * ``rank_pred``: the op run just before on the same rank, -1 for a rank's first op;
    * ``data_pred``: the op whose output it needs (forward of stage ``k-1``, backward of
      stage ``k+1``, or for the last stage's backward its own forward), -1 for none;
    * ``link``: which p2p time delays the ``data_pred`` edge, an index into
      ``concat(p2p_fwd_s, p2p_bwd_s)`` (``r`` forward link ``r → r+1``, ``pp + r`` backward
      link ``r+1 → r``), -1 for no transfer;
    * ``dur_index``: index into ``concat(fwd_s.ravel(), bwd_s.ravel())`` of its duration.

    ``level_bounds`` ``[n_levels + 1]``: ops ``level_bounds[i]:level_bounds[i+1]`` form
    level ``i``. ``rank_ops``: per rank, its op indices in execution order; ``last_op``
    ``[pp]``: each rank's last op.
    """

    pp: int
    vp: int
    num_microbatches: int
    rank: np.ndarray
    kind: np.ndarray
    microbatch: np.ndarray
    chunk: np.ndarray
    stage: np.ndarray
    rank_pred: np.ndarray
    data_pred: np.ndarray
    link: np.ndarray
    dur_index: np.ndarray
    level_bounds: np.ndarray
    rank_ops: tuple[np.ndarray, ...]
    last_op: np.ndarray
    # Pre-cut per-level index arrays and plain lists for the evaluation loops.
    _levels: tuple = field(repr=False, default=())
    _lists: tuple = field(repr=False, default=())

    @property
    def n_ops(self) -> int:
        """Number of ops, ``2·pp·vp·m``."""
        return int(self.rank.shape[0])

    @property
    def n_levels(self) -> int:
        """Number of levels of the topological order."""
        return int(self.level_bounds.shape[0] - 1)


# a search re-ranks 16 plans; validate prices ~50 schedule shapes over and over in a fit (the
# published runs' 48 orders take 34 MB: ~70 B per op)
@functools.lru_cache(maxsize=128)
def schedule_order(pp: int, vp: int, num_microbatches: int) -> ScheduleOrder:
    """Compile (and cache) the schedule DAG of ``pp`` ranks, ``vp`` chunks per rank and
    ``num_microbatches`` microbatches; see :class:`ScheduleOrder`.

    Raises ValueError as :func:`rank_op_sequence`; RuntimeError if the order deadlocks
    (it does not for Megatron-LM's schedules).
    """
    pp, vp, m = _check_schedule(pp, vp, num_microbatches)
    n_stages = pp * vp
    # Temporary id of (kind, microbatch, stage): F ops first, then B; each rank's ops in
    # its execution order, one row a rank (:func:`_rank_sequences`).
    seq_ids = _rank_sequences(pp, vp, m)
    n = 2 * m * n_stages
    rank_of = np.empty(n, dtype=np.int64)
    rank_of[seq_ids] = np.arange(pp)[:, None]
    rank_pred_t = np.full(n, -1, dtype=np.int64)
    rank_pred_t[seq_ids[:, 1:]] = seq_ids[:, :-1]
    # Data predecessors and the link each edge uses.
    data_pred_t = np.full(n, -1, dtype=np.int64)
    link_t = np.full(n, -1, dtype=np.int64)
    mb_a = np.repeat(np.arange(m), n_stages)
    st_a = np.tile(np.arange(n_stages), m)
    f_ids = mb_a * n_stages + st_a
    b_ids = f_ids + m * n_stages
    has_prev = st_a > 0
    data_pred_t[f_ids[has_prev]] = f_ids[has_prev] - 1
    link_t[f_ids[has_prev]] = (st_a[has_prev] - 1) % pp
    has_next = st_a < n_stages - 1
    data_pred_t[b_ids[has_next]] = b_ids[has_next] + 1
    link_t[b_ids[has_next]] = pp + st_a[has_next] % pp
    last = ~has_next
    data_pred_t[b_ids[last]] = f_ids[last]

    level = _op_levels(seq_ids, data_pred_t)
    # Final numbering: by level, then rank (a rank has at most one op per level).
    perm = np.lexsort((rank_of, level))          # new index -> tmp id
    new_of = np.empty(n, dtype=np.int64)
    new_of[perm] = np.arange(n)

    def remap(pred):
        out = pred[perm]
        return np.where(out >= 0, new_of[np.maximum(out, 0)], -1)

    kind_t = np.where(np.arange(n) < m * n_stages, "F", "B")
    stage_t = np.concatenate((st_a, st_a))
    chunk_t = stage_t // pp
    mb_t = np.concatenate((mb_a, mb_a))
    rank = rank_of[perm]
    chunk = chunk_t[perm]
    kind = kind_t[perm]
    dur_index = np.where(kind == "F", 0, n_stages) + rank * vp + chunk
    rank_pred = remap(rank_pred_t)
    data_pred = remap(data_pred_t)
    link = link_t[perm]
    counts = np.bincount(level, minlength=int(level.max()) + 1)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    rank_ops = tuple(_frozen(row) for row in new_of[seq_ids])
    last_op = np.array([ops[-1] for ops in rank_ops], dtype=np.int64)
    b_l = bounds.tolist()
    rank_pred, data_pred = _frozen(rank_pred), _frozen(data_pred)
    levels = tuple((a, b, rank_pred[a:b], data_pred[a:b])      # read-only views
                   for a, b in zip(b_l[:-1], b_l[1:]))
    lists = (rank_pred.tolist(), data_pred.tolist())
    return ScheduleOrder(
        pp=pp, vp=vp, num_microbatches=m, rank=_frozen(rank), kind=_frozen(kind),
        microbatch=_frozen(mb_t[perm]), chunk=_frozen(chunk), stage=_frozen(stage_t[perm]),
        rank_pred=_frozen(rank_pred), data_pred=_frozen(data_pred), link=_frozen(link),
        dur_index=_frozen(dur_index), level_bounds=_frozen(bounds), rank_ops=rank_ops,
        last_op=_frozen(last_op), _levels=levels, _lists=lists)


@dataclass
class SimResult:
    """Outcome of :func:`simulate` for ``D`` replicas (seconds throughout).

    ``iteration_time_s`` ``[D]``: makespan, the latest rank's finish including its tail.
    Filled only with ``record=True`` (else None): ``start_s``, ``end_s`` ``[D, n_ops]`` of
    every op (indices of ``order``); ``busy_s`` ``[D, pp]`` compute time of each rank;
    ``idle_s`` ``[D, pp]`` = ``makespan - busy_s - tail_s`` (waiting, including after the
    rank's finish); ``tail_s`` ``[D, pp]`` the tails used; ``critical_path``: per replica, op
    indices from the first op (start 0) to the last op of the rank that finishes last, each
    op starting exactly when its binding predecessor (same-rank previous op, or data
    predecessor + p2p) ends; that last op's end plus its rank's tail is the makespan.
    ``extrapolated_to``: set when the schedule was too long to simulate op by op: the
    real microbatch count, ``order`` then being the schedule of the first microbatches
    (see :func:`simulate`).
    """

    iteration_time_s: np.ndarray
    start_s: np.ndarray | None
    end_s: np.ndarray | None
    busy_s: np.ndarray | None
    idle_s: np.ndarray | None
    critical_path: list[list[int]] | None
    order: ScheduleOrder
    tail_s: np.ndarray | None = None
    extrapolated_to: int | None = None


def _as_times(name: str, x, trailing: tuple[int, ...]) -> np.ndarray:
    """``x`` as float64 ``[D, *trailing]`` (D = 1 when unbatched; scalars broadcast only
    when ``trailing`` is 1-D); ValueError on a bad shape or a negative/non-finite value."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0 and len(trailing) == 1:
        a = np.broadcast_to(a, trailing)
    if a.shape == trailing:
        a = a[None]
    elif a.ndim != len(trailing) + 1 or a.shape[1:] != trailing:
        want = " or ".join(f"[{', '.join(map(str, s))}]"
                           for s in (trailing, ("D",) + trailing))
        raise ValueError(f"{name} must have shape {want}, got {list(a.shape)}")
    if a.size and not (np.isfinite(a).all() and (a >= 0).all()):
        raise ValueError(f"{name} must hold finite, non-negative seconds")
    return a


def _run_scalar(order: ScheduleOrder, dur: np.ndarray, lat: np.ndarray):
    """Plain-Python walk over the ops; ``dur``, ``lat`` ``[D, n_ops]``. Returns
    ``(start, end)`` ``[D, n_ops]``."""
    rp, dp = order._lists
    n = order.n_ops
    starts, ends = [], []
    for d in range(dur.shape[0]):
        e = [0.0] * (n + 1)           # e[-1]: the "no predecessor" sentinel, always 0
        s = [0.0] * n
        i = 0
        for r, q, la, du in zip(rp, dp, lat[d].tolist(), dur[d].tolist()):
            t0 = e[r]
            t1 = e[q] + la
            if t1 > t0:
                t0 = t1
            s[i] = t0
            e[i] = t0 + du
            i += 1
        starts.append(s)
        ends.append(e[:n])
    return np.array(starts), np.array(ends)


def _run_levels(order: ScheduleOrder, dur_t: np.ndarray, lat_t: np.ndarray):
    """Level-by-level numpy evaluation over ``[ops, D]`` (``dur_t``, ``lat_t`` are
    ``[n_ops, D]``, C-contiguous); same results as :func:`_run_scalar`. Returns
    ``(start, end)`` ``[D, n_ops]`` (transposed views)."""
    n = order.n_ops
    D = dur_t.shape[1]
    end = np.zeros((n + 1, D))          # row n (index -1): the sentinel, always 0
    start = np.empty((n, D))
    take = end.take                     # the bound method: no dispatch wrapper per call
    maximum = np.maximum
    add = np.add
    for a, b, rp, dp in order._levels:
        s = start[a:b]
        maximum(take(rp, axis=0), add(take(dp, axis=0), lat_t[a:b]), out=s)
        add(s, dur_t[a:b], out=end[a:b])
    return start.T, end[:n].T


def _critical_path(order: ScheduleOrder, start: list[float], end: list[float],
                   lat: list[float], last: int) -> list[int]:
    """Op indices from time 0 to op ``last`` following the binding predecessor (the
    same-rank one when both bind)."""
    rp, dp = order._lists
    path = [last]
    i = last
    while True:
        r, q = rp[i], dp[i]
        if r >= 0 and end[r] == start[i]:
            i = r
        elif q >= 0 and end[q] + lat[i] == start[i]:
            i = q
        else:
            break
        path.append(i)
    path.reverse()
    return path


#: Op-by-op walk (:func:`_run_scalar`) while the ops × replicas are at most this many times
#: the levels, the level-by-level one (:func:`_run_levels`) beyond: the walk costs about
#: 0.17 µs per op and replica, a numpy level about 2.5 µs whatever the replicas (CPython
#: 3.11, numpy 2; ``bench/speed/simulator.py``), so they cross near 14 ops a level.
SCALAR_OPS_PER_LEVEL = 14
#: Each rank's finish (its last op's end, tail excluded) of the last schedules simulated,
#: by the schedule's shape and the exact bytes of its durations and p2p times: a search
#: re-ranks plans that differ only in the work after the last backward (the data-parallel
#: reduction and optimizer step, ``tail_s``), and those share the walk. Least recently used
#: first out; only inputs of at most :data:`_RANK_ENDS_KEY_FLOATS` floats are kept.
_RANK_ENDS: "OrderedDict[tuple, np.ndarray]" = OrderedDict()
_RANK_ENDS_ENTRIES = 64
_RANK_ENDS_KEY_FLOATS = 1 << 12


def clear_cache() -> None:
    """Forget the rank finishes :func:`simulate` keeps (a benchmark timing the walk itself
    calls this between calls with the same inputs)."""
    _RANK_ENDS.clear()


#: Ops of one replica's schedule simulated op by op at most (the compiled order takes about
#: 500 bytes per op while it is built): beyond, the iteration is extrapolated from the
#: first microbatches (:func:`_extrapolation_base`).
MAX_OPS = 1 << 17
#: Replicas × ops walked in one pass at most (four float64 arrays of this size: 32 MiB; a
#: measured cluster of 10⁵ GPUs gives a plan 10³ distinct replicas of 10³–10⁴ ops).
MAX_CELLS = 1 << 20
#: Microbatch groups (of pp) the extrapolation steps by: 12, so that a steady state
#: repeating every 1, 2, 3, 4, 6 or 12 groups (uneven stages make the per-group increment
#: alternate) extrapolates exactly, any other period within a fraction of one group's spread.
EXTRAPOLATION_GROUPS = 12


def _extrapolation_base(pp: int, vp: int, m: int) -> tuple[int, int] | None:
    """``(m1, k)`` when ``m`` microbatches make a long schedule (more than :data:`MAX_OPS`
    ops per replica, or ``m1 + 5k`` microbatches and more): the schedule is simulated for
    ``m1`` and ``m1 + k`` microbatches (``k`` = :data:`EXTRAPOLATION_GROUPS` microbatch
    groups of ``pp``; ``m1 = 2k + (m mod k)``, past the warm-up's transient) and the
    iteration extrapolated linearly,
    ``T(m) = T(m1) + (m - m1)/k · (T(m1 + k) - T(m1))``: exact once the steady state
    repeats with a period dividing ``k`` (max-plus linear systems become periodic after a
    transient), which ``tests/test_schedule_sim.py`` checks against the full simulation.
    None when ``m`` is small enough to simulate, or no smaller base exists."""
    k = EXTRAPOLATION_GROUPS * pp
    m1 = 2 * k + m % k
    if m < m1 + 5 * k and 2 * pp * vp * m <= MAX_OPS:
        return None
    return (m1, k) if m1 < m else None


def simulate(fwd_s, bwd_s, p2p_fwd_s, p2p_bwd_s, num_microbatches: int, *, tail_s=None,
             record: bool = False, _exact: bool = False) -> SimResult:
    """Simulate the pipeline schedule of ``D`` independent data-parallel replicas.

    ``fwd_s``, ``bwd_s``: ``[pp, vp]`` or ``[D, pp, vp]`` seconds, forward / backward time of
    one microbatch through chunk ``c`` on rank ``r`` (everything the caller counts: TP/CP
    collectives, recompute, embedding, loss). ``p2p_fwd_s`` ``[pp]`` or ``[D, pp]``: index
    ``r`` the time to send one microbatch's activations from rank ``r`` to ``(r+1) % pp``
    (the wrap-around ``pp-1 → 0`` is used only when ``vp > 1``); ``p2p_bwd_s`` likewise,
    index ``r`` the gradient from ``(r+1) % pp`` back to ``r``. ``tail_s`` ``[pp]`` or
    ``[D, pp]``: work a rank still does after its last backward (default 0). Scalars are
    accepted for the p2p and tail arrays (every link/rank the same). ``vp`` and ``pp`` are
    ``fwd_s.shape[-1]`` and ``fwd_s.shape[-2]``; unbatched arrays are shared by all ``D``
    replicas, batched ones must agree on ``D``.

    Returns a :class:`SimResult`; ``record=True`` also fills per-op times, per-rank busy and
    idle time and the critical path (slower). Beyond :data:`MAX_OPS` ops per replica the
    iteration time is extrapolated from the first microbatches (:func:`_extrapolation_base`)
    and ``record=True`` records those first microbatches only (``extrapolated_to`` then
    holds the real count); many replicas are walked :data:`MAX_CELLS` cells at a time, so
    memory stays bounded whatever the batch size. Raises ValueError on bad shapes, negative
    or non-finite times, or a schedule Megatron-LM refuses (``vp > 1`` needs ``pp > 1`` and
    ``num_microbatches`` divisible by ``pp``).
    """
    f = np.asarray(fwd_s, dtype=np.float64)
    if f.ndim not in (2, 3) or 0 in f.shape:
        raise ValueError(f"fwd_s must have shape [pp, vp] or [D, pp, vp], got "
                         f"{list(f.shape)}")
    pp, vp = f.shape[-2], f.shape[-1]
    f = _as_times("fwd_s", f, (pp, vp))
    b = _as_times("bwd_s", bwd_s, (pp, vp))
    pf = _as_times("p2p_fwd_s", p2p_fwd_s, (pp,))
    pb = _as_times("p2p_bwd_s", p2p_bwd_s, (pp,))
    tl = _as_times("tail_s", 0.0 if tail_s is None else tail_s, (pp,))
    sizes = {a.shape[0] for a in (f, b, pf, pb, tl)} - {1}
    if len(sizes) > 1:
        raise ValueError(f"batched inputs disagree on the number of replicas D: "
                         f"{sorted(sizes)}")
    D = sizes.pop() if sizes else 1
    m = _check_schedule(pp, vp, num_microbatches)[2]
    base = None if _exact else _extrapolation_base(pp, vp, m)
    if base is not None:
        m1, k = base
        if record:       # the first m1 microbatches, recorded; labelled as such
            res = simulate(f, b, pf, pb, m1, tail_s=tl, record=True, _exact=True)
            res.extrapolated_to = m
            return res
        t1 = simulate(f, b, pf, pb, m1, tail_s=tl, _exact=True).iteration_time_s
        t2 = simulate(f, b, pf, pb, m1 + k, tail_s=tl, _exact=True).iteration_time_s
        return SimResult(t1 + (m - m1) // k * (t2 - t1), None, None, None, None, None,
                         schedule_order(pp, vp, m1), extrapolated_to=m)
    if not record and D * 2 * pp * vp * m > MAX_CELLS and D > 1:
        step = max(1, MAX_CELLS // (2 * pp * vp * m))     # replicas per pass: bounded memory
        parts = [simulate(f[i:i + step] if f.shape[0] > 1 else f,
                          b[i:i + step] if b.shape[0] > 1 else b,
                          pf[i:i + step] if pf.shape[0] > 1 else pf,
                          pb[i:i + step] if pb.shape[0] > 1 else pb, m,
                          tail_s=tl[i:i + step] if tl.shape[0] > 1 else tl, _exact=True)
                 for i in range(0, D, step)]
        return SimResult(np.concatenate([np.broadcast_to(r.iteration_time_s,
                                                         (min(step, D - i),))
                                         for r, i in zip(parts, range(0, D, step))]),
                         None, None, None, None, None, parts[0].order)
    order = schedule_order(pp, vp, num_microbatches)

    fb = np.broadcast_arrays(f.reshape(f.shape[0], -1), b.reshape(b.shape[0], -1))
    dur_src = np.concatenate(fb, axis=1)
    pf_, pb_ = np.broadcast_arrays(pf, pb)
    lat_src = np.concatenate((pf_, pb_, np.zeros((pf_.shape[0], 1))), axis=1)
    tail = np.broadcast_to(tl, (D, pp))
    key = None
    if not record and D * (dur_src.shape[1] + lat_src.shape[1]) <= _RANK_ENDS_KEY_FLOATS:
        key = (pp, vp, m, D, dur_src.tobytes(), lat_src.tobytes())
        ends = _RANK_ENDS.get(key)
        if ends is not None:
            _RANK_ENDS.move_to_end(key)
            return SimResult((ends + tail).max(axis=1), None, None, None, None, None, order)
    if D * order.n_ops <= SCALAR_OPS_PER_LEVEL * order.n_levels:
        dur = np.broadcast_to(dur_src[:, order.dur_index], (D, order.n_ops))
        lat = np.broadcast_to(lat_src[:, order.link], (D, order.n_ops))
        start, end = _run_scalar(order, dur, lat)
    else:                                # built as [n_ops, D] directly: no transposed copy
        dur_t = np.ascontiguousarray(np.broadcast_to(
            np.ascontiguousarray(dur_src.T)[order.dur_index], (order.n_ops, D)))
        lat_t = np.ascontiguousarray(np.broadcast_to(
            np.ascontiguousarray(lat_src.T)[order.link], (order.n_ops, D)))
        start, end = _run_levels(order, dur_t, lat_t)
        lat = lat_t.T
    ends = end[:, order.last_op]
    if key is not None:
        ends.setflags(write=False)
        _RANK_ENDS[key] = ends
        if len(_RANK_ENDS) > _RANK_ENDS_ENTRIES:
            _RANK_ENDS.popitem(last=False)
    finish = ends + tail
    makespan = finish.max(axis=1)
    if not record:
        return SimResult(makespan, None, None, None, None, None, order)
    m = order.num_microbatches
    busy = np.broadcast_to((f.sum(axis=2) + b.sum(axis=2)) * m, (D, pp)).copy()
    idle = makespan[:, None] - busy - tail
    paths = [_critical_path(order, start[d].tolist(), end[d].tolist(), lat[d].tolist(),
                            int(order.last_op[int(np.argmax(finish[d]))])) for d in range(D)]
    return SimResult(makespan, np.ascontiguousarray(start), np.ascontiguousarray(end), busy,
                     idle, paths, order, tail_s=np.array(tail))
