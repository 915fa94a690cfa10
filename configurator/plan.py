"""The parallel plan and Megatron-LM's validation rules for it.

Sources for the rules: Megatron-LM core_v0.16 megatron/training/arguments.py
(``validate_args``), megatron/core/model_parallel_config.py and
megatron/core/transformer/transformer_config.py (``__post_init__``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from configurator.errors import InputError
from configurator.model import ModelSpec

RECOMPUTE = ("none", "selective", "full")
PRECISION = ("bf16", "fp16", "fp8")
ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
#: Backends that materialise and store the s×s score matrix (megatron-core's own
#: DotProductAttention and the 2021–22 Megatron runs); the others are flash-style kernels.
SCORE_STORING_BACKENDS = ("unfused", "local")


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """One Megatron-LM training configuration (Megatron's names).

    ``vp`` is virtual stages per pipeline rank (``--num-virtual-stages-per-pipeline-rank``;
    1 = no interleaving). Recompute ``full`` means ``--recompute-granularity full
    --recompute-method uniform --recompute-num-layers 1``.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    vp: int = 1
    micro_batch_size: int = 1
    global_batch_size: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    precision: str = "bf16"
    attention_backend: str = "auto"
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def stores_attention_scores(self) -> bool:
        return self.attention_backend in SCORE_STORING_BACKENDS

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["num_microbatches"] = self.num_microbatches
        d["mbs"] = self.micro_batch_size
        d["gbs"] = self.global_batch_size
        return d


def check_plan(model: ModelSpec, plan: ParallelPlan, world_size: int) -> None:
    """Raise :class:`InputError` naming the first Megatron rule ``plan`` breaks.

    Mirrors the vectorised predicates of :mod:`configurator.space` for a single plan.
    """
    p = plan
    for name in ("tp", "pp", "dp", "cp", "vp", "micro_batch_size", "global_batch_size"):
        val = getattr(p, name)
        if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
            raise InputError(name, val, "must be a positive integer")
    if p.recompute not in RECOMPUTE:
        raise InputError("recompute", p.recompute, "must be one of " + ", ".join(RECOMPUTE))
    if p.precision not in PRECISION:
        raise InputError("precision", p.precision, "must be one of " + ", ".join(PRECISION))
    if p.attention_backend not in ATTENTION_BACKENDS:
        raise InputError("attention_backend", p.attention_backend,
                         "must be one of " + ", ".join(ATTENTION_BACKENDS))
    mp = p.tp * p.pp * p.cp
    if world_size % mp:
        raise InputError("tp*pp*cp", mp, f"tp({p.tp}) * pp({p.pp}) * cp({p.cp}) = {mp} does "
                         f"not divide {world_size} GPUs")
    if p.tp * p.pp * p.cp * p.dp != world_size:
        raise InputError("dp", p.dp, f"must be world_size / (tp*pp*cp) = {world_size // mp}")
    a, g = model.num_attention_heads, model.num_query_groups
    if a % p.tp:
        raise InputError("tp", p.tp, f"must divide num_attention_heads ({a})")
    if g % p.tp and p.tp % g:
        raise InputError("tp", p.tp, f"num_query_groups ({g}) must be a multiple or divisor of tp")
    if model.num_layers % p.pp:
        raise InputError("pp", p.pp, f"must divide num_layers ({model.num_layers})")
    if p.vp > 1:
        per_rank = model.num_layers // p.pp
        if p.pp == 1:
            raise InputError("vp", p.vp, "interleaved schedule needs pp > 1")
        if per_rank % p.vp:
            raise InputError("vp", p.vp, f"must divide layers per pipeline rank ({per_rank})")
    if p.cp > 1 and model.seq_length % (2 * p.cp):
        raise InputError("cp", p.cp, f"seq_length ({model.seq_length}) must be divisible by "
                         f"2*cp ({2 * p.cp})")
    if p.cp > 1 and p.stores_attention_scores:
        raise InputError("cp", p.cp, f"context parallelism needs a flash/fused attention "
                         f"backend (Transformer Engine), not {p.attention_backend!r}")
    if p.global_batch_size % (p.micro_batch_size * p.dp):
        raise InputError("global_batch_size", p.global_batch_size,
                         f"must be divisible by micro_batch_size ({p.micro_batch_size}) * "
                         f"dp ({p.dp}) = {p.micro_batch_size * p.dp}")
    m = p.num_microbatches
    if p.vp > 1 and m % p.pp:
        raise InputError("global_batch_size", p.global_batch_size,
                         f"interleaved schedule needs num_microbatches ({m}) divisible by pp "
                         f"({p.pp})")
    if p.sequence_parallel and p.tp == 1:
        raise InputError("sequence_parallel", True, "needs tp > 1")
    if p.overlap_param_gather and p.distributed_optimizer and not p.overlap_grad_reduce:
        raise InputError("overlap_param_gather", True, "needs overlap_grad_reduce")
