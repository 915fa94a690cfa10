"""Column store of plans: one numpy array per ParallelPlan field, evaluated all at once."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from configurator.plan import RECOMPUTE, ParallelPlan
from memory_model.activations import RECOMPUTE_CODES


@dataclass(kw_only=True)
class Candidates:
    """Plans as parallel arrays (all the same length). Scalars shared by every plan:
    ``global_batch_size``, ``precision``, ``attention_backend``, overlap flags."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    vp: np.ndarray
    mbs: np.ndarray
    recompute: np.ndarray          # codes: 0 none, 1 selective, 2 full
    sp: np.ndarray                 # bool
    distributed_optimizer: np.ndarray  # bool
    global_batch_size: int
    precision: str
    attention_backend: str
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    #: Optional: index into ``group_keys`` (rows of tp, cp, dp, pp) per plan, so collective
    #: figures are looked up once per parallel layout instead of per plan.
    group: np.ndarray | None = None
    group_keys: np.ndarray | None = None

    @property
    def num_microbatches(self) -> np.ndarray:
        return self.global_batch_size // (self.mbs * self.dp)

    @property
    def stores_scores(self) -> bool:
        return ParallelPlan(attention_backend=self.attention_backend).stores_attention_scores

    def __len__(self) -> int:
        return len(self.tp)

    def take(self, idx) -> "Candidates":
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("tp", "pp", "dp", "cp", "vp", "mbs", "recompute", "sp",
                     "distributed_optimizer"):
            kw[name] = kw[name][idx]
        if self.group is not None:
            kw["group"] = self.group[idx]
        return Candidates(**kw)

    def plan(self, i: int) -> ParallelPlan:
        return ParallelPlan(
            tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]), cp=int(self.cp[i]),
            vp=int(self.vp[i]), micro_batch_size=int(self.mbs[i]),
            global_batch_size=int(self.global_batch_size),
            recompute=RECOMPUTE[int(self.recompute[i])], sequence_parallel=bool(self.sp[i]),
            distributed_optimizer=bool(self.distributed_optimizer[i]),
            precision=self.precision, attention_backend=self.attention_backend,
            overlap_grad_reduce=self.overlap_grad_reduce,
            overlap_param_gather=bool(self.overlap_param_gather
                                      and self.distributed_optimizer[i]))

    @classmethod
    def from_plan(cls, plan: ParallelPlan) -> "Candidates":
        one = lambda x, dt=np.int64: np.array([x], dtype=dt)  # noqa: E731
        return cls(tp=one(plan.tp), pp=one(plan.pp), dp=one(plan.dp), cp=one(plan.cp),
                   vp=one(plan.vp), mbs=one(plan.micro_batch_size),
                   recompute=one(RECOMPUTE_CODES[plan.recompute]),
                   sp=one(plan.sequence_parallel, bool),
                   distributed_optimizer=one(plan.distributed_optimizer, bool),
                   global_batch_size=plan.global_batch_size, precision=plan.precision,
                   attention_backend=plan.attention_backend,
                   overlap_grad_reduce=plan.overlap_grad_reduce,
                   overlap_param_gather=plan.overlap_param_gather)
