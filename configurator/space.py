"""Every plan Megatron-LM would accept for a model, world size and global batch size.

One flat enumerator used everywhere (search, published-choice analysis, tests). Rules
(Megatron-LM core_v0.16 megatron/training/arguments.py ``validate_args``,
megatron/core/model_parallel_config.py, transformer_config.py; shared REFERENCE §1):

* ``world % (tp·pp·cp) == 0``, ``dp = world / (tp·pp·cp)``;
* ``num_attention_heads % tp == 0``; ``num_query_groups`` a multiple or divisor of tp;
* ``num_layers % pp == 0`` (even split);
* ``cp > 1``: ``seq_length % (2·cp) == 0`` and a flash/fused attention backend;
* ``global_batch_size % (mbs·dp) == 0``;
* interleaving (vp > 1): ``pp > 1``, ``(num_layers/pp) % vp == 0``, ``m % pp == 0``;
* sequence parallelism only with tp > 1; the distributed optimizer only where dp·cp > 1
  (with one data-parallel rank it is the plain optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from configurator.candidates import Candidates
from configurator.model import ModelSpec
from configurator.plan import RECOMPUTE, SCORE_STORING_BACKENDS
from memory_model.activations import RECOMPUTE_CODES


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """Restrictions on the search (``None`` = every value Megatron accepts)."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    vp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] | None = None
    recompute: tuple[str, ...] = RECOMPUTE
    sequence_parallel: tuple[bool, ...] = (False, True)
    distributed_optimizer: tuple[bool, ...] = (False, True)


def enumerate_plans(model: ModelSpec, world_size: int, global_batch_size: int, *,
                    precision: str = "bf16", attention_backend: str = "auto",
                    overlap_grad_reduce: bool = True, overlap_param_gather: bool = True,
                    space: SearchSpace = SearchSpace()) -> Candidates:
    """All legal plans as a :class:`Candidates` column store (may be empty)."""
    L, a, g, s = (model.num_layers, model.num_attention_heads, model.num_query_groups,
                  model.seq_length)
    allow = lambda values, chosen: [x for x in values if chosen is None or x in chosen]  # noqa
    rc_codes = np.array([RECOMPUTE_CODES[r] for r in space.recompute], dtype=np.int64)
    flash = attention_backend not in SCORE_STORING_BACKENDS
    cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                         ("tp", "pp", "dp", "cp", "vp", "mbs", "rc", "sp",
                                          "do", "group")}
    keys = []
    for tp in allow(divisors(world_size), space.tp):
        if a % tp or (g % tp and tp % g):
            continue
        for cp in allow(divisors(world_size // tp), space.cp):
            if cp > 1 and (s % (2 * cp) or not flash):
                continue
            for pp in allow(divisors(world_size // (tp * cp)), space.pp):
                if L % pp:
                    continue
                dp = world_size // (tp * cp * pp)
                if global_batch_size % dp:
                    continue
                mbs = np.array(allow(divisors(global_batch_size // dp), space.mbs),
                               dtype=np.int64)
                vps = [v for v in divisors(L // pp) if v == 1 or pp > 1]
                vps = np.array(allow(vps, space.vp), dtype=np.int64)
                if not len(mbs) or not len(vps):
                    continue
                sps = [x for x in space.sequence_parallel if not x or tp > 1]
                dos = [x for x in space.distributed_optimizer if not x or dp * cp > 1]
                if not sps or not dos:
                    continue
                M, V, R, S, D = np.meshgrid(mbs, vps, rc_codes, np.array(sps, dtype=bool),
                                            np.array(dos, dtype=bool), indexing="ij")
                M, V, R, S, D = (x.ravel() for x in (M, V, R, S, D))
                m = global_batch_size // (M * dp)
                ok = (V == 1) | (m % pp == 0)
                n = int(ok.sum())
                if not n:
                    continue
                keys.append((tp, cp, dp, pp))
                for name, arr in (("mbs", M), ("vp", V), ("rc", R), ("sp", S), ("do", D)):
                    cols[name].append(arr[ok])
                for name, val in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp),
                                  ("group", len(keys) - 1)):
                    cols[name].append(np.full(n, val, dtype=np.int64))
    cat = lambda name, dt: (np.concatenate(cols[name]).astype(dt) if cols[name]  # noqa
                            else np.zeros(0, dtype=dt))
    return Candidates(tp=cat("tp", np.int64), pp=cat("pp", np.int64), dp=cat("dp", np.int64),
                      cp=cat("cp", np.int64), vp=cat("vp", np.int64), mbs=cat("mbs", np.int64),
                      recompute=cat("rc", np.int64), sp=cat("sp", bool),
                      distributed_optimizer=cat("do", bool),
                      global_batch_size=global_batch_size, precision=precision,
                      attention_backend=attention_backend,
                      overlap_grad_reduce=overlap_grad_reduce,
                      overlap_param_gather=overlap_param_gather, group=cat("group", np.int64),
                      group_keys=np.array(keys, dtype=np.int64).reshape(-1, 4))
