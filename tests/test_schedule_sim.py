"""The pipeline-schedule simulator against Megatron's order, the closed forms of
:mod:`configurator.core.schedule` and hand-computed cases."""

import numpy as np
import pytest

from configurator.core.schedule import bubble_stage_times, p2p_transfers
from configurator.cost.schedule_sim import rank_op_sequence, schedule_order, simulate
from configurator.report.gantt import gantt_png

GRID = [(pp, vp, k * pp) for pp in (1, 2, 3, 4, 8) for vp in (1, 2, 3, 4)
        for k in (1, 2, 8, 16) if not (vp > 1 and pp == 1)]


def _uniform(pp, vp, f=1.0, b=2.0):
    return np.full((pp, vp), f / vp), np.full((pp, vp), b / vp)


@pytest.mark.parametrize("pp,vp,m", GRID)
def test_uniform_stages_without_p2p_match_the_bubble_closed_form(pp, vp, m):
    """(m + (pp-1)/vp)·(f + b): SC'21 §2.2 for 1F1B and the interleaved schedule."""
    f, b = _uniform(pp, vp)
    t = simulate(f, b, 0.0, 0.0, m).iteration_time_s[0]
    want = (m + float(bubble_stage_times(pp, vp))) * 3.0
    assert t == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("pp,vp,m", [g for g in GRID if g[1] > 1])
def test_interleaved_exposes_one_round_trip_of_sends(pp, vp, m):
    """Non-blocking sends (Megatron's overlap_p2p_comm with interleaving): the steady
    state hides them; what remains is the first microbatch's way through all pp·vp virtual
    stages and back, 2·(pp·vp - 1) sends (core.schedule.p2p_transfers)."""
    f, b = _uniform(pp, vp)
    c = 1e-3
    base = simulate(f, b, 0.0, 0.0, m).iteration_time_s[0]
    t = simulate(f, b, c, c, m).iteration_time_s[0]
    assert (t - base) / c == pytest.approx(float(p2p_transfers(pp, vp, m)), rel=1e-6)


@pytest.mark.parametrize("pp,m", [(2, 8), (3, 12), (4, 16), (8, 64)])
def test_blocking_1f1b_sends_with_end_stage_extras(pp, m):
    """1F1B as the time model runs it (each send occupies its sender) with the loss on the
    last stage longer than a send: the closed form m + 2(pp - 1) sends is within 1 % from
    four microbatches per stage on (with fewer the fill and drain weigh more)."""
    f, b = _uniform(pp, 1)
    c, extra = 0.05, 0.3
    f[-1, 0] += extra / 3
    b[-1, 0] += 2 * extra / 3
    f[:pp - 1, 0] += c
    b[1:, 0] += c
    t = simulate(f, b, 0.0, 0.0, m).iteration_time_s[0]
    closed = (m * (3.0 + extra) + (pp - 1) * (3.0 + extra / pp)
              + float(p2p_transfers(pp, 1, m)) * c)
    assert t == pytest.approx(closed, rel=0.01)


def test_order_matches_megatron_for_a_small_interleaved_case():
    """pp=2, vp=2, m=4 (megatron/core/pipeline_parallel/schedules.py, schedule table with
    microbatch groups of pp): rank 0 warms up with 2·(pp-1) + (vp-1)·pp = 4 forwards."""
    F, B = "F", "B"
    r0 = rank_op_sequence(2, 2, 4, 0)
    assert r0[:4] == [(F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1)]
    assert r0[4:8] == [(F, 2, 0), (B, 0, 1), (F, 3, 0), (B, 1, 1)]
    r1 = rank_op_sequence(2, 2, 4, 1)
    assert r1[:3] == [(F, 0, 0), (F, 1, 0), (F, 0, 1)]
    assert r1[3:5] == [(B, 0, 1), (F, 1, 1)]


@pytest.mark.parametrize("pp,vp,m", [(4, 1, 8), (4, 2, 8), (3, 3, 6), (1, 1, 3)])
def test_every_op_once_and_1f1b_warmup(pp, vp, m):
    for r in range(pp):
        seq = rank_op_sequence(pp, vp, m, r)
        assert sorted(seq) == sorted([(k, mb, c) for k in "FB" for mb in range(m)
                                      for c in range(vp)])
        if vp == 1:
            warm = min(pp - r - 1, m)
            assert [k for k, _, _ in seq[:warm + 1]] == ["F"] * (warm + 1)
            if warm + 1 < len(seq):
                assert seq[warm + 1][0] == "B"
        # a backward never precedes its own forward on the same rank
        done = set()
        for k, mb, c in seq:
            if k == "F":
                done.add((mb, c))
            else:
                assert (mb, c) in done


def test_hand_computed_heterogeneous_two_stage_case():
    """pp=2, m=2. Rank 0: F0 F1 B0 B1 (warm-up 1, then 1F1B); rank 1: F0 B0 F1 B1.
    f = (1, 2), b = (3, 4), sends 0.5 forward, 0.25 backward.
    r0: F0 0-1, F1 1-2; r1: F0 1.5-3.5, B0 3.5-7.5; F1 needs 2+0.5 and r1 free: 7.5-9.5,
    B1 9.5-13.5; r0: B0 needs 7.5+0.25: 7.75-10.75, B1 needs 13.75: 13.75-16.75."""
    res = simulate(np.array([[1.0], [2.0]]), np.array([[3.0], [4.0]]), [0.5, 0.0],
                   [0.25, 0.0], 2, record=True)
    assert res.iteration_time_s[0] == pytest.approx(16.75)
    order = res.order
    got = {(int(order.rank[i]), str(order.kind[i]), int(order.microbatch[i])):
           (res.start_s[0, i], res.end_s[0, i]) for i in range(order.n_ops)}
    assert got[(1, "F", 1)] == pytest.approx((7.5, 9.5))
    assert got[(0, "B", 0)] == pytest.approx((7.75, 10.75))
    assert got[(0, "B", 1)] == pytest.approx((13.75, 16.75))
    assert res.busy_s[0].tolist() == pytest.approx([8.0, 12.0])


@pytest.mark.parametrize("pp,vp,m", [(4, 1, 8), (4, 2, 8), (3, 2, 6), (1, 1, 4)])
def test_critical_path_is_contiguous_and_spans_the_makespan(pp, vp, m):
    """The path runs back from the last op to one that starts at 0, each step to the op it
    waited for; at pp 1 every step is the same rank's previous op, down to the first
    (index 0)."""
    rng = np.random.default_rng(pp * 10 + vp)
    f = rng.uniform(0.5, 1.5, (pp, vp))
    b = rng.uniform(1.0, 3.0, (pp, vp))
    pf, pb, tail = rng.uniform(0, 0.2, pp), rng.uniform(0, 0.2, pp), rng.uniform(0, 1, pp)
    res = simulate(f, b, pf, pb, m, tail_s=tail, record=True)
    o, start, end = res.order, res.start_s[0], res.end_s[0]
    path = res.critical_path[0]
    assert start[path[0]] == 0.0
    lat = np.concatenate([pf, pb, [0.0]])[o.link]
    for a, nxt in zip(path, path[1:]):
        same_rank = o.rank_pred[nxt] == a and start[nxt] == pytest.approx(end[a])
        data = o.data_pred[nxt] == a and start[nxt] == pytest.approx(end[a] + lat[nxt])
        assert same_rank or data
    last_rank = int(o.rank[path[-1]])
    assert end[path[-1]] + tail[last_rank] == pytest.approx(res.iteration_time_s[0])
    assert np.allclose(res.busy_s[0] + res.idle_s[0] + tail, res.iteration_time_s[0])


def test_a_slow_first_stage_puts_its_own_ops_on_the_critical_path_from_time_0():
    """Stage 0 fifty times slower than stage 1: every later op waits for stage 0, so the
    path starts with stage 0's first two forwards, the second waiting on the first by rank
    (op 0, which starts at 0)."""
    f = np.array([[5.0], [0.1]])
    res = simulate(f, f, np.zeros(2), np.zeros(2), 4, tail_s=np.zeros(2), record=True)
    o, path = res.order, res.critical_path[0]
    assert path[:2] == [0, 1] and res.start_s[0][path[0]] == 0.0
    assert [int(o.rank[i]) for i in path[:2]] == [0, 0]
    assert int(o.rank_pred[1]) == 0 and int(o.data_pred[1]) == -1


def test_batched_equals_separate_runs_and_bad_input_is_refused():
    rng = np.random.default_rng(1)
    f = rng.uniform(0.5, 1.5, (5, 4, 2))
    b = rng.uniform(1.0, 3.0, (5, 4, 2))
    pf, pb = rng.uniform(0, 0.1, (5, 4)), rng.uniform(0, 0.1, (5, 4))
    batch = simulate(f, b, pf, pb, 8).iteration_time_s
    one = [simulate(f[d], b[d], pf[d], pb[d], 8).iteration_time_s[0] for d in range(5)]
    assert batch.tolist() == pytest.approx(one, rel=1e-12)
    # many replicas take the numpy level-by-level path: same figures
    big = simulate(np.repeat(f, 40, axis=0), np.repeat(b, 40, axis=0),
                   np.repeat(pf, 40, axis=0), np.repeat(pb, 40, axis=0), 8).iteration_time_s
    assert big[::40].tolist() == pytest.approx(one, rel=1e-12)
    with pytest.raises(ValueError):
        simulate(f[0], -b[0], pf[0], pb[0], 8)
    # batched, with the right number of dimensions but another stage shape
    with pytest.raises(ValueError, match=r"bwd_s must have shape \[4, 2\] or \[D, 4, 2\], "
                                         r"got \[5, 4, 3\]"):
        simulate(f, rng.uniform(1.0, 3.0, (5, 4, 3)), pf, pb, 8)
    with pytest.raises(ValueError):
        simulate(f[0], b[0], pf[0], pb[0], 7)          # vp > 1 needs m % pp == 0
    with pytest.raises(ValueError):
        schedule_order(1, 2, 4)


def test_unbatched_inputs_are_shared_by_every_replica():
    """Unbatched p2p and tail arrays (and scalars) are shared by all D replicas of batched
    compute times (simulate's docstring): the same times as each replica run alone with
    them; batched inputs that disagree on D are refused, naming both."""
    rng = np.random.default_rng(2)
    f = rng.uniform(0.5, 1.5, (3, 4, 2))
    b = rng.uniform(1.0, 3.0, (3, 4, 2))
    pf, tail = rng.uniform(0, 0.1, 4), rng.uniform(0, 0.3, 4)
    batch = simulate(f, b, pf, 0.05, 8, tail_s=tail).iteration_time_s
    one = [simulate(f[d], b[d], pf, 0.05, 8, tail_s=tail).iteration_time_s[0] for d in range(3)]
    assert batch.tolist() == pytest.approx(one, rel=1e-12)
    with pytest.raises(ValueError, match=r"disagree on the number of replicas D: \[2, 3\]"):
        simulate(f, b, rng.uniform(0, 0.1, (2, 4)), 0.05, 8)


def test_gantt_renders_a_recorded_schedule():
    f, b = _uniform(4, 2)
    res = simulate(f, b, 0.01, 0.01, 8, tail_s=0.2, record=True)
    png = gantt_png(res, title="pp 4, vp 2")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    with pytest.raises(ValueError):
        gantt_png(simulate(f, b, 0.0, 0.0, 8))


# --- exact order, exposure and evaluation-path checks ---------------------------------

def test_full_interleaved_order_pp2_vp2_m4_written_out():
    """Every op of pp=2, vp=2, m=4, derived by hand from core_v0.16.1 schedules.py: schedule
    table (mb, chunk) = (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); backward j runs table
    entry j's microbatch on chunk vp-1-chunk; warm-up rank 0: 2·1 + 1·2 = 4, rank 1: 2."""
    F, B = "F", "B"
    assert rank_op_sequence(2, 2, 4, 0) == [
        (F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1),
        (F, 2, 0), (B, 0, 1), (F, 3, 0), (B, 1, 1), (F, 2, 1), (B, 0, 0), (F, 3, 1), (B, 1, 0),
        (B, 2, 1), (B, 3, 1), (B, 2, 0), (B, 3, 0)]
    assert rank_op_sequence(2, 2, 4, 1) == [
        (F, 0, 0), (F, 1, 0),
        (F, 0, 1), (B, 0, 1), (F, 1, 1), (B, 1, 1), (F, 2, 0), (B, 0, 0), (F, 3, 0), (B, 1, 0),
        (F, 2, 1), (B, 2, 1), (F, 3, 1), (B, 3, 1),
        (B, 2, 0), (B, 3, 0)]


@pytest.mark.parametrize("pp,vp,m", [(4, 2, 4), (8, 4, 8), (3, 3, 3)])
def test_interleaved_warmup_counts_when_m_equals_pp(pp, vp, m):
    """core_v0.16.1 caps the warm-up at m·vp per rank; it no longer sends every rank
    all-forward when m == pp (older releases did)."""
    for r in range(pp):
        seq = rank_op_sequence(pp, vp, m, r)
        warm = min(2 * (pp - r - 1) + (vp - 1) * pp, m * vp)
        assert [k for k, _, _ in seq[:warm]] == ["F"] * warm
        if warm < m * vp:
            assert seq[warm + 1][0] == "B"
    assert rank_op_sequence(pp, vp, m, pp - 1)[(vp - 1) * pp + 1][0] == "B"


def test_hand_computed_interleaved_case_with_wraparound_links():
    """pp=2, vp=2, m=2; stages 0 (r0 c0), 1 (r1 c0), 2 (r0 c1), 3 (r1 c1).
    fwd r0 (1, 2), r1 (1.5, 1); bwd r0 (2, 3.5), r1 (2.5, 2); p2p_fwd 0→1 0.1, 1→0 0.2;
    p2p_bwd 1→0 0.3, 0→1 0.4. Rank 0: F00 F10 F01 F11 B01 B11 B00 B10 (warm-up 4 = all);
    rank 1: F00 F10 F01 B01 F11 B11 B00 B10 (warm-up 2). By hand:
    r0 F(0,0) 0-1, F(1,0) 1-2; r1 F(0,0) 1.1-2.6, F(1,0) 2.6-4.1;
    r0 F(0,1) 2.6+0.2 → 2.8-4.8, F(1,1) 4.8-6.8; r1 F(0,1) 4.8+0.1 → 4.9-5.9, B(0,1) 5.9-7.9,
    F(1,1) 6.8+0.1 → 7.9-8.9 (rank busy till 7.9), B(1,1) 8.9-10.9;
    r0 B(0,1) 7.9+0.3 → 8.2-11.7, B(1,1) 11.7-15.2 (rank-bound; input at 11.2);
    r1 B(0,0) 11.7+0.4 → 12.1-14.6, B(1,0) 15.2+0.4 → 15.6-18.1;
    r0 B(0,0) 15.2-17.2 (rank-bound; input at 14.9), B(1,0) 18.1+0.3 → 18.4-20.4.
    Critical path: r0 F(0,0) → r1 F(0,0) → r0 F(0,1) → r1 F(0,1) → r1 B(0,1) → r0 B(0,1)
    → r0 B(1,1) → r1 B(1,0) → r0 B(1,0)."""
    fwd = np.array([[1.0, 2.0], [1.5, 1.0]])
    bwd = np.array([[2.0, 3.5], [2.5, 2.0]])
    res = simulate(fwd, bwd, [0.1, 0.2], [0.3, 0.4], 2, record=True)
    o = res.order
    got = {(int(o.rank[i]), str(o.kind[i]), int(o.microbatch[i]), int(o.chunk[i])):
           (res.start_s[0, i], res.end_s[0, i]) for i in range(o.n_ops)}
    want = {
        (0, "F", 0, 0): (0, 1), (0, "F", 1, 0): (1, 2), (1, "F", 0, 0): (1.1, 2.6),
        (1, "F", 1, 0): (2.6, 4.1), (0, "F", 0, 1): (2.8, 4.8), (0, "F", 1, 1): (4.8, 6.8),
        (1, "F", 0, 1): (4.9, 5.9), (1, "B", 0, 1): (5.9, 7.9), (1, "F", 1, 1): (7.9, 8.9),
        (1, "B", 1, 1): (8.9, 10.9), (0, "B", 0, 1): (8.2, 11.7), (0, "B", 1, 1): (11.7, 15.2),
        (1, "B", 0, 0): (12.1, 14.6), (1, "B", 1, 0): (15.6, 18.1),
        (0, "B", 0, 0): (15.2, 17.2), (0, "B", 1, 0): (18.4, 20.4)}
    assert set(got) == set(want)
    for key, (s, e) in want.items():
        assert got[key] == pytest.approx((s, e), abs=1e-12), key
    assert res.iteration_time_s[0] == pytest.approx(20.4, abs=1e-12)
    path = [(int(o.rank[i]), str(o.kind[i]), int(o.microbatch[i]), int(o.chunk[i]))
            for i in res.critical_path[0]]
    assert path == [(0, "F", 0, 0), (1, "F", 0, 0), (0, "F", 0, 1), (1, "F", 0, 1),
                    (1, "B", 0, 1), (0, "B", 0, 1), (0, "B", 1, 1), (1, "B", 1, 0),
                    (0, "B", 1, 0)]
    assert res.busy_s[0].tolist() == pytest.approx([17.0, 14.0])
    assert res.idle_s[0].tolist() == pytest.approx([3.4, 6.4])


def test_hand_computed_case_with_tails_and_idle_time():
    """pp=2, m=2, f (1, 3), b (2, 4), p2p 0.5 forward, 0.25 backward, tails (0.5, 3):
    r0 F0 0-1, F1 1-2, B0 8.75-10.75, B1 15.75-17.75 (+0.5 = 18.25);
    r1 F0 1.5-4.5, B0 4.5-8.5, F1 8.5-11.5, B1 11.5-15.5 (+3 = 18.5, the makespan)."""
    res = simulate(np.array([[1.0], [3.0]]), np.array([[2.0], [4.0]]), [0.5, 7.0],
                   [0.25, 9.0], 2, tail_s=[0.5, 3.0], record=True)
    o = res.order
    assert res.iteration_time_s[0] == pytest.approx(18.5)
    path = res.critical_path[0]
    assert [(int(o.rank[i]), str(o.kind[i]), int(o.microbatch[i])) for i in path] == [
        (0, "F", 0), (1, "F", 0), (1, "B", 0), (1, "F", 1), (1, "B", 1)]
    assert res.start_s[0, path].tolist() == pytest.approx([0.0, 1.5, 4.5, 8.5, 11.5])
    assert res.end_s[0, path].tolist() == pytest.approx([1.0, 4.5, 8.5, 11.5, 15.5])
    r0 = o.rank_ops[0]
    assert res.start_s[0, r0].tolist() == pytest.approx([0.0, 1.0, 8.75, 15.75])
    assert res.end_s[0, r0].tolist() == pytest.approx([1.0, 2.0, 10.75, 17.75])
    assert res.busy_s[0].tolist() == pytest.approx([6.0, 14.0])
    assert res.idle_s[0].tolist() == pytest.approx([12.0, 1.5])


@pytest.mark.parametrize("pp,k", [(2, 1), (2, 16), (3, 2), (4, 8), (8, 1), (8, 8)])
def test_nonblocking_1f1b_exposes_2_pp_minus_1_over_pp_sends_per_microbatch(pp, k):
    """With non-blocking sends (c = 1 % of f) the steady state of 1F1B is paced by the
    cycle rank 0 → pp-1 → 0 (pp microbatches, 2·(pp-1) sends): exposed sends
    2·(pp-1)/pp·m + 2·(pp-2) for m a multiple of pp. Against the textbook
    2·(m·vp + pp - 1) sends (iteration.py before the blocking-send model) the simulated
    makespan is at most 0.95 % shorter over GRID with f:b = 1:1, 1:2, 1:3 (worst pp=2, vp=2,
    m=32, f=b: the interleaved steady state hides every send); against
    core.schedule.p2p_transfers it is at most 0.35 % longer (pp=8, m=128, f=b)."""
    m = k * pp
    f, b = _uniform(pp, 1)
    c = 0.01
    base = simulate(f, b, 0.0, 0.0, m).iteration_time_s[0]
    t = simulate(f, b, c, c, m).iteration_time_s[0]
    assert (t - base) / c == pytest.approx(2 * (pp - 1) / pp * m + 2 * (pp - 2), rel=1e-9)


def test_worst_gaps_against_the_closed_forms_over_the_grid():
    """The figures quoted above, recomputed: |gap| ≤ 0.95 % against 2·(m·vp + pp - 1)
    sends, ≤ 0.35 % against p2p_transfers, exact (≤ 1e-12) without sends."""
    worst_text, worst_now, worst_zero = 0.0, 0.0, 0.0
    for pp, vp, m in GRID:
        for fb in (1.0, 2.0, 3.0):
            f, b = _uniform(pp, vp, 1.0, fb)
            c = 0.01 / vp
            base = (m + float(bubble_stage_times(pp, vp))) * (1.0 + fb)
            t0 = simulate(f, b, 0.0, 0.0, m).iteration_time_s[0]
            t = simulate(f, b, c, c, m).iteration_time_s[0]
            text = base + (2 * (m * vp + pp - 1) * c if pp > 1 else 0.0)
            now = base + float(p2p_transfers(pp, vp, m)) * c
            worst_zero = max(worst_zero, abs(t0 - base) / base)
            worst_text = max(worst_text, abs(t - text) / text)
            worst_now = max(worst_now, abs(t - now) / now)
    assert worst_zero <= 1e-12
    assert 0.009 < worst_text <= 0.0095
    assert worst_now <= 0.0035


@pytest.mark.parametrize("pp,vp,m", [(4, 1, 8), (4, 2, 8), (8, 4, 16), (1, 1, 3)])
def test_python_and_numpy_level_paths_agree_bit_for_bit(pp, vp, m):
    from configurator.cost.schedule_sim import _run_levels, _run_scalar
    rng = np.random.default_rng(7)
    o = schedule_order(pp, vp, m)
    dur = rng.uniform(0.5, 2.0, (3, o.n_ops))
    lat = np.where(o.link >= 0, rng.uniform(0.0, 0.3, (3, o.n_ops)), 0.0)
    s1, e1 = _run_scalar(o, dur, lat)
    s2, e2 = _run_levels(o, np.ascontiguousarray(dur.T), np.ascontiguousarray(lat.T))
    assert np.array_equal(s1, s2) and np.array_equal(e1, e2)
    # topological and levelled: every predecessor sits in an earlier level
    lvl = np.searchsorted(o.level_bounds, np.arange(o.n_ops), side="right") - 1
    for pred in (o.rank_pred, o.data_pred):
        has = pred >= 0
        assert (lvl[pred[has]] < lvl[has]).all()


def test_idle_time_is_the_gaps_on_each_rank():
    rng = np.random.default_rng(3)
    pp, vp, m = 4, 2, 8
    f, b = rng.uniform(0.5, 1.5, (pp, vp)), rng.uniform(1.0, 3.0, (pp, vp))
    tail = rng.uniform(0, 1, pp)
    res = simulate(f, b, rng.uniform(0, .2, pp), rng.uniform(0, .2, pp), m, tail_s=tail,
                   record=True)
    o, s, e = res.order, res.start_s[0], res.end_s[0]
    for r in range(pp):
        ops = o.rank_ops[r]
        gaps = s[ops[0]] + (s[ops[1:]] - e[ops[:-1]]).sum()
        trailing = res.iteration_time_s[0] - (e[ops[-1]] + tail[r])
        assert (s[ops[1:]] >= e[ops[:-1]]).all()
        assert res.idle_s[0, r] == pytest.approx(gaps + trailing)
        assert res.busy_s[0, r] == pytest.approx((e[ops] - s[ops]).sum())


def test_single_stage_and_input_errors():
    res = simulate([[1.0]], [[2.0]], [0.0], [0.0], 5, tail_s=[0.5], record=True)
    assert res.iteration_time_s[0] == pytest.approx(15.5)
    assert rank_op_sequence(1, 1, 2, 0) == [("F", 0, 0), ("B", 0, 0), ("F", 1, 0),
                                              ("B", 1, 0)]
    f, b = _uniform(4, 1)
    # the message names both shapes it takes, unbatched and batched over D replicas
    with pytest.raises(ValueError, match=r"^p2p_fwd_s must have shape \[4\] or \[D, 4\], "
                                         r"got \[3\]$"):
        simulate(f, b, np.zeros(3), np.zeros(4), 8)
    with pytest.raises(ValueError, match="bwd_s"):
        simulate(f, b[:3], np.zeros(4), np.zeros(4), 8)
    with pytest.raises(ValueError, match="replicas"):
        simulate(np.stack([f, f]), b, np.zeros((3, 4)), np.zeros(4), 8)
    with pytest.raises(ValueError, match="tail_s"):
        simulate(f, b, 0.0, 0.0, 8, tail_s=[0, 0, float("nan"), 0])
    with pytest.raises(ValueError, match="num_microbatches"):
        simulate(f, b, 0.0, 0.0, 0)
    with pytest.raises(ValueError, match="rank"):
        rank_op_sequence(4, 1, 8, 4)


def test_gantt_refuses_a_replica_out_of_range():
    f, b = _uniform(4, 2)
    res = simulate(np.stack([f, f]), b, 0.01, 0.01, 8, record=True)
    assert gantt_png(res, 1)[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="replica"):
        gantt_png(res, 2)


# --- long schedules: extrapolation and bounded memory -----------------------------------

def test_long_schedule_is_extrapolated_exactly_for_uniform_stages():
    """16 million microbatches (far beyond MAX_OPS): the result still equals the bubble
    closed form (m + (pp-1)/vp)·(f + b), and says it was extrapolated."""
    import configurator.cost.schedule_sim as ss

    for pp, vp in ((8, 1), (4, 2)):
        m = 1 << 24
        f, b = _uniform(pp, vp)
        res = simulate(f, b, 0.0, 0.0, m)
        assert 2 * pp * vp * m > ss.MAX_OPS and res.extrapolated_to == m
        want = (m + float(bubble_stage_times(pp, vp))) * 3.0
        assert res.iteration_time_s[0] == pytest.approx(want, rel=1e-12)


def test_extrapolation_matches_the_full_simulation_on_uneven_stages(monkeypatch):
    """Random uneven stages, sends and tails (steady states that alternate between groups):
    with a small op budget, the extrapolated iteration equals the full simulation."""
    import configurator.cost.schedule_sim as ss

    rng = np.random.default_rng(1)
    worst, extrapolated = 0.0, 0
    for _ in range(60):
        pp = int(rng.choice([2, 3, 4, 8]))
        vp = int(rng.choice([1, 2, 3]))
        m = pp * int(rng.integers(60, 150))
        f, b = rng.uniform(0.5, 2, (3, pp, vp)), rng.uniform(1, 4, (3, pp, vp))
        pf, pb = rng.uniform(0, 0.5, (3, pp)), rng.uniform(0, 0.5, (3, pp))
        tl = rng.uniform(0, 3, (3, pp))
        full = simulate(f, b, pf, pb, m, tail_s=tl).iteration_time_s
        monkeypatch.setattr(ss, "MAX_OPS", 2 * pp * vp * 30 * pp)
        res = simulate(f, b, pf, pb, m, tail_s=tl)
        monkeypatch.undo()
        extrapolated += res.extrapolated_to == m
        worst = max(worst, float(np.max(np.abs(res.iteration_time_s / full - 1))))
    assert extrapolated == 60 and worst <= 1e-9


def test_recorded_long_schedule_holds_its_first_microbatches(monkeypatch):
    import configurator.cost.schedule_sim as ss

    monkeypatch.setattr(ss, "MAX_OPS", 2 * 4 * 1 * 40 * 4)
    f, b = _uniform(4, 1)
    res = simulate(f, b, 0.01, 0.01, 4000, record=True)
    assert res.extrapolated_to == 4000 and res.order.num_microbatches < 4000
    assert res.critical_path and res.start_s.shape[1] == res.order.n_ops


def test_many_replicas_are_walked_in_bounded_passes(monkeypatch):
    """A batch larger than MAX_CELLS allows is split into passes: same floats."""
    import configurator.cost.schedule_sim as ss

    rng = np.random.default_rng(3)
    f, b = rng.uniform(1, 2, (40, 4, 2)), rng.uniform(2, 4, (40, 4, 2))
    pf, pb = rng.uniform(0, .1, (40, 4)), rng.uniform(0, .1, (40, 4))
    whole = simulate(f, b, pf, pb, 16).iteration_time_s
    monkeypatch.setattr(ss, "MAX_CELLS", 3 * 2 * 4 * 2 * 16)
    parts = simulate(f, b, pf, pb, 16).iteration_time_s
    assert parts.shape == (40,) and np.array_equal(parts, whole)


def test_gantt_of_a_long_schedule_renders(monkeypatch):
    import configurator.cost.schedule_sim as ss

    monkeypatch.setattr(ss, "MAX_OPS", 2 * 4 * 2 * 40 * 4)
    f, b = _uniform(4, 2)
    res = simulate(f, b, 0.01, 0.01, 4000, record=True)
    assert gantt_png(res)[:8] == b"\x89PNG\r\n\x1a\n"


def test_plans_differing_only_in_tails_share_one_walk(monkeypatch):
    """The second schedule with the same durations and sends but other tails is not walked
    again, and gives the same float the walk gives; other durations are walked."""
    import configurator.cost.schedule_sim as sim
    rng = np.random.default_rng(11)
    f, b = rng.uniform(1, 2, (4, 2)), rng.uniform(2, 4, (4, 2))
    pf, pb = rng.uniform(0, .1, 4), rng.uniform(0, .1, 4)
    tail_a, tail_b = rng.uniform(0, 5, 4), rng.uniform(0, 5, 4)
    sim.clear_cache()
    walks = []
    real = sim._run_scalar
    monkeypatch.setattr(sim, "_run_scalar", lambda *a: walks.append(1) or real(*a))
    simulate(f, b, pf, pb, 8, tail_s=tail_a)
    cached = simulate(f, b, pf, pb, 8, tail_s=tail_b).iteration_time_s
    assert len(walks) == 1
    sim.clear_cache()
    fresh = simulate(f, b, pf, pb, 8, tail_s=tail_b).iteration_time_s
    assert len(walks) == 2 and np.array_equal(cached, fresh)
    simulate(f * 1.5, b, pf, pb, 8, tail_s=tail_b)       # other durations: walked
    assert len(walks) == 3
    # a recorded simulation always walks (it returns every op's times)
    rec = simulate(f, b, pf, pb, 8, tail_s=tail_b, record=True)
    assert len(walks) == 4 and np.array_equal(rec.iteration_time_s, fresh)


def test_simulation_cache_stays_bounded():
    import configurator.cost.schedule_sim as sim
    sim.clear_cache()
    for i in range(sim._RANK_ENDS_ENTRIES + 10):
        simulate(np.full((2, 1), 1.0 + i), np.full((2, 1), 2.0), 0.0, 0.0, 4)
    assert len(sim._RANK_ENDS) == sim._RANK_ENDS_ENTRIES
    sim.clear_cache()
    assert not sim._RANK_ENDS


SHAPES_BOTH_PATHS = [(1, 1, 5), (2, 1, 1), (3, 1, 7), (4, 2, 8), (5, 3, 10), (16, 1, 3),
                     (16, 1, 40), (17, 3, 34), (16, 4, 32), (24, 2, 48), (32, 1, 64)]


@pytest.mark.parametrize("pp,vp,m", SHAPES_BOTH_PATHS)
def test_rank_sequences_are_the_rank_op_sequences(pp, vp, m):
    """The compiled order's array of each rank's op ids holds :func:`rank_op_sequence`'s
    ops, forward ``mb·pp·vp + stage`` and backward that plus ``m·pp·vp``."""
    from configurator.cost.schedule_sim import _rank_sequences
    seq = _rank_sequences(pp, vp, m)
    stages = pp * vp
    assert seq.shape == (pp, 2 * m * vp)
    for r in range(pp):
        want = [(0 if kind == "F" else m * stages) + mb * stages + c * pp + r
                for kind, mb, c in rank_op_sequence(pp, vp, m, r)]
        assert seq[r].tolist() == want


@pytest.mark.parametrize("pp,vp,m", SHAPES_BOTH_PATHS)
def test_op_levels_agree_on_both_paths_and_are_longest_paths(pp, vp, m, monkeypatch):
    """The level of every op is one past the later of its rank's previous op and its input
    (0 for neither), whether the levels are placed op by op in Python or level by level with
    arrays, and the compiled order is the same either way."""
    from configurator.cost import schedule_sim as ss
    order = schedule_order(pp, vp, m)
    level = np.repeat(np.arange(order.n_levels), np.diff(order.level_bounds))
    for pred in (order.rank_pred, order.data_pred):      # each op after its predecessors
        has = pred >= 0
        assert np.all(level[pred[has]] < level[has])
    prev = np.where(order.rank_pred >= 0, level[np.maximum(order.rank_pred, 0)], -1)
    inp = np.where(order.data_pred >= 0, level[np.maximum(order.data_pred, 0)], -1)
    assert np.array_equal(level, np.maximum(prev, inp) + 1)          # and no later
    for threshold in (1, 10 ** 6):                    # every pp on the arrays, then on Python
        monkeypatch.setattr(ss, "ARRAY_LEVELS_MIN_PP", threshold)
        other = ss.schedule_order.__wrapped__(pp, vp, m)
        for name in ("rank", "kind", "microbatch", "chunk", "rank_pred", "data_pred", "link",
                     "dur_index", "level_bounds", "last_op"):
            assert np.array_equal(getattr(other, name), getattr(order, name)), name
        assert all(np.array_equal(a, b) for a, b in zip(other.rank_ops, order.rank_ops))


@pytest.mark.parametrize("threshold", [1, 10 ** 6])
def test_op_levels_refuse_a_cycle_on_both_paths(threshold, monkeypatch):
    """Two ranks each waiting first for the other's second op can never start: both paths
    raise rather than loop."""
    from configurator.cost import schedule_sim as ss
    monkeypatch.setattr(ss, "ARRAY_LEVELS_MIN_PP", threshold)
    seq = np.array([[0, 1], [2, 3]])
    data_pred = np.array([3, -1, 1, -1])
    with pytest.raises(RuntimeError, match="deadlocks"):
        ss._op_levels(seq, data_pred)


@pytest.mark.parametrize("pp,vp,m", [(4, 1, 6), (3, 2, 6), (4, 3, 8)])
def test_each_edge_names_the_link_it_crosses(pp, vp, m):
    """A forward of virtual stage k > 0 waits for the send ``(k − 1) mod pp → k mod pp``
    (``p2p_fwd_s`` index ``(k − 1) mod pp``, the wrap-around ``pp − 1 → 0`` between chunks);
    a backward of stage k below the last for the send back from stage k + 1 (``p2p_bwd_s``
    index ``k mod pp``, offset by pp in ``link``); the first stage's forwards and the last
    stage's backwards cross none. One slow link delays the iteration by its own time once
    on the way forward."""
    order = schedule_order(pp, vp, m)
    stages = pp * vp
    fwd, k = order.kind == "F", order.stage
    want = np.where(fwd, np.where(k > 0, (k - 1) % pp, -1),
                    np.where(k < stages - 1, pp + k % pp, -1))
    assert np.array_equal(order.link, want)
    slow = np.zeros(pp)
    slow[0] = 0.5                     # rank 0 → 1 only
    base = simulate(np.ones((pp, vp)), np.ones((pp, vp)), 0.0, 0.0, m).iteration_time_s
    late = simulate(np.ones((pp, vp)), np.ones((pp, vp)), slow, 0.0, m).iteration_time_s
    assert late[0] > base[0]
