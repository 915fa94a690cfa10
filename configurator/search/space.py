"""Every plan Megatron-LM would accept for a model, world size and global batch size.

One flat enumerator used everywhere (search, published-choice analysis, tests). Values are
generated level by level (tp, then cp, then pp with dp derived, then a numpy grid of micro
batch size, vp, recompute, sequence parallelism and distributed optimizer) and filtered by
:data:`configurator.core.rules.RULES`, each applied at the first level where the fields it
reads are known: the very predicates ``estimate`` checks one plan with.

Beyond Megatron's rules the search leaves out one kind of duplicate: the distributed
optimizer where dp·cp = 1 (with one data-parallel rank it is the plain optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from configurator.core.model import ModelSpec
from configurator.core.plan import RECOMPUTE, RECOMPUTE_CODES
from configurator.core.rules import rules_for, rules_mask
from configurator.core.candidates import COLUMN_FIELDS, Candidates


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


#: Fields varied together in one numpy grid per (tp, cp, pp) layout.
_GRID = ("micro_batch_size", "vp", "recompute", "sequence_parallel", "distributed_optimizer")


def enumerate_plans(model: ModelSpec, world_size: int, global_batch_size: int, *,
                    precision: str = "bf16", attention_backend: str = "auto",
                    overlap_grad_reduce: bool = True, overlap_param_gather: bool = True,
                    space: SearchSpace = SearchSpace()) -> Candidates:
    """All legal plans as a :class:`Candidates` column store (may be empty)."""
    shared = dict(global_batch_size=global_batch_size, precision=precision,
                  attention_backend=attention_backend, overlap_grad_reduce=overlap_grad_reduce,
                  overlap_param_gather=overlap_param_gather)
    # Fields known at each level; overlap_param_gather is decided per plan (only with the
    # distributed optimizer), so rules reading it wait for the grid.
    base = set(shared) - {"overlap_param_gather"}
    levels = [base | {"tp"}, base | {"tp", "cp"}, base | {"tp", "cp", "pp", "dp"},
              set(shared) | {"tp", "cp", "pp", "dp", *_GRID}]
    stage = [rules_for(levels[i], levels[i - 1] if i else ()) for i in range(4)]
    allow = lambda values, chosen: [x for x in values if chosen is None or x in chosen]  # noqa
    rc_codes = np.array([RECOMPUTE_CODES[r] for r in space.recompute], dtype=np.int64)
    world = world_size
    cols: dict[str, list[np.ndarray]] = {f.name: [] for f in COLUMN_FIELDS}
    groups: list[np.ndarray] = []
    keys = []
    for tp in allow(divisors(world), space.tp):
        f1 = dict(shared, tp=tp)
        if not rules_mask(model, f1, world, stage[0]):
            continue
        for cp in allow(divisors(world // tp), space.cp):
            f2 = dict(f1, cp=cp)
            if not rules_mask(model, f2, world, stage[1]):
                continue
            for pp in allow(divisors(world // (tp * cp)), space.pp):
                dp = world // (tp * cp * pp)
                f3 = dict(f2, pp=pp, dp=dp)
                if not rules_mask(model, f3, world, stage[2]):
                    continue
                mbs = allow(divisors(global_batch_size), space.mbs)
                vps = allow(divisors(model.num_layers // pp), space.vp)
                dos = [x for x in space.distributed_optimizer if not x or dp * cp > 1]
                if not mbs or not vps or not dos or not len(rc_codes):
                    continue
                M, V, R, S, D = np.meshgrid(np.array(mbs, dtype=np.int64),
                                            np.array(vps, dtype=np.int64), rc_codes,
                                            np.array(space.sequence_parallel, dtype=bool),
                                            np.array(dos, dtype=bool), indexing="ij")
                grid = dict(micro_batch_size=M.ravel(), vp=V.ravel(), recompute=R.ravel(),
                            sequence_parallel=S.ravel(), distributed_optimizer=D.ravel())
                f4 = dict(f3, **grid,
                          overlap_param_gather=overlap_param_gather & grid["distributed_optimizer"])
                ok = np.broadcast_to(rules_mask(model, f4, world, stage[3]), M.size)
                n = int(ok.sum())
                if not n:
                    continue
                keys.append((tp, cp, dp, pp))
                for name, arr in grid.items():
                    cols[name].append(arr[ok])
                for name, val in (("tp", tp), ("pp", pp), ("dp", dp), ("cp", cp)):
                    cols[name].append(np.full(n, val, dtype=np.int64))
                groups.append(np.full(n, len(keys) - 1, dtype=np.int64))
    cat = lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt)  # noqa
    columns = {f.name: cat(cols[f.name], bool if f.type is bool else np.int64)
               for f in COLUMN_FIELDS}
    return Candidates(columns, shared, group=cat(groups, np.int64),
                      group_keys=np.array(keys, dtype=np.int64).reshape(-1, 4))
