"""Time, cost and energy to train a number of tokens with a plan, failures and checkpoints
included.

The process (one job of ``N`` nodes):

* **Failures** arrive as a Poisson process, ``r`` per node-day on every node, so the job
  fails at rate ``λ = N·r`` (Kokolis et al., "Revisiting Reliability in Large-Scale Machine
  Learning Research Clusters", HPCA 2025, arXiv:2410.21680, §V: failures per node-day,
  6.50 and 2.34 per 1,000 node-days on their two clusters; Llama 3, arXiv:2407.21783
  §3.3.4: 466 interruptions in 54 days on 16,384 H100, i.e. 4.2 per 1,000 node-days).
* **Checkpoints**: every ``Δt`` seconds of useful work the job saves; a synchronous save
  stalls every rank for ``w`` (the largest node's bytes over its write bandwidth, bounded by
  the aggregate: :func:`save_stall_s`); an asynchronous one (Megatron's ``--async-save``)
  stalls for the GPU→host copy only and persists in the background, which must finish
  within the next interval; a failure inside the persist window loses one more interval,
  ``persist_s`` of work per failure on average (added to the restart overhead).
* **A failure** costs the restart overhead ``u₀`` (detection, re-queue, NCCL init: a fixed
  part, plus the checkpoint load: the largest node's bytes over its read bandwidth,
  bounded by the aggregate) and the work since the last checkpoint.

ETTR (effective training time ratio, useful work over wall time) of that process:

* Kokolis et al.'s closed form (their Eq. for E[ETTR], small-loss): ``(1 − λ·(u₀ + Δt/2)) /
  (1 + w/Δt)`` (:func:`ettr_closed_form`), good while ``λ·(Δt + u₀)`` is small;
* the exact expectation with exponential failures (renewal-reward over segments of
  ``τ = Δt + w``; failures also during the save, none during the restart): the expected time
  to finish one segment is ``E[T] = (1/λ + u₀)·(e^{λτ} − 1)`` (the geometric number of failed
  attempts, each lasting a truncated exponential plus ``u₀``), so ``ETTR = Δt / E[T]``
  (:func:`ettr_exact`; Daly, "A higher order estimate of the optimum checkpoint interval for
  restart dumps", FGCS 22(3), 2006, Eq. 13 with failures not striking the restart);
* a seeded Monte-Carlo of the same process, attempt by attempt (:func:`ettr_monte_carlo`),
  which checks the exact form.

The figures use the exact expectation; the closed form is reported beside it with whether it
holds (:func:`closed_form_holds`).

Intervals: Young ("A first order approximation to the optimum checkpoint interval", CACM
17(9), 1974) ``√(2·δ·M)``; Daly (2006, Eq. 37) ``√(2δM)·[1 + ⅓·√(δ/2M) + ⅑·(δ/2M)] − δ`` for
``δ < 2M``, else ``M`` (``δ`` the save stall, ``M = 1/λ``). The interval the tool picks is
the whole number of iterations maximising the exact ETTR (the Young and Daly ones are
reported beside it).

Checkpoint size (:func:`checkpoint_bytes`): Megatron's ``torch_dist`` format saves each
parameter in its training dtype (2 bytes, BF16/FP16; FP8 plans keep BF16 weights) and the
optimizer's state (FP32 main parameter and Adam's two moments, 12 bytes:
:func:`configurator.core.plan_terms.optimizer_state_bytes`, less with the precision-aware
optimizer): 14 bytes a parameter (BLOOM-176B's 2.3 TB checkpoint, BigScience's
tr11-176B-ml README: ≈ 13 bytes). The fully parallel save
(``megatron/core/dist_checkpointing/strategies/fully_parallel.py``, on by default) spreads
each replicated tensor over its data-parallel replicas, so a rank writes its model-parallel
rank's state over ``dp·cp`` (expert state over the expert-data-parallel group).

Energy: GPUs at ``gpu_power_fraction`` of their rated power (:data:`topology.gpus.RATED_POWER_W`)
plus a node overhead, times the PUE, over the wall time.

Units: SI (seconds, bytes, bytes/s, watts, joules); ``*_GBps`` and ``*_per_node_day`` at the
edges only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.layers import rank_layer_counts
from configurator.core.units import GB
from configurator.cost.iteration import expert_data_parallel_size
from memory_model.params import stage_parameter_split

#: Seconds per day and per hour (unit conversions).
DAY_S = 86400.0
HOUR_S = 3600.0

#: λ·(Δt + u₀) up to which Kokolis et al.'s small-loss closed form is said to hold (its
#: error grows with the square of that product), together with λ·w ≤
#: :data:`CLOSED_FORM_SAVE_LIMIT` (it does not price failures during the save, which lose the
#: whole segment): there it is within 1 % of the exact expectation (a sweep of 200,000 random
#: cases: at most 0.7 %).
CLOSED_FORM_LIMIT = 0.08
CLOSED_FORM_SAVE_LIMIT = 0.005


def closed_form_holds(rate_per_s: float, restart_s: float, interval_s: float,
                      save_s: float) -> bool:
    """Whether :func:`ettr_closed_form` holds for these inputs (:data:`CLOSED_FORM_LIMIT`)."""
    return (rate_per_s * (interval_s + restart_s) <= CLOSED_FORM_LIMIT
            and rate_per_s * save_s <= CLOSED_FORM_SAVE_LIMIT)

#: Failures per node-day when none is given: Llama 3's 466 job interruptions in a 54-day
#: snapshot on 16,384 H100 GPUs (2,048 nodes of 8) (arXiv:2407.21783 §3.3.4, Table 5): 4.2
#: per 1,000 node-days. (Kokolis et al.'s A100 clusters: 6.50 and 2.34.)
DEFAULT_FAILURE_RATE_PER_NODE_DAY = 466 / (54 * 2048)
#: Fixed part of a restart (detection, re-queue, process and NCCL start-up), before the
#: checkpoint load: 5 minutes, the restart overhead that reproduces Kokolis et al.'s 16k-GPU
#: examples (0.70 at a 60-minute interval, 0.93 at 5 minutes; docs/training_time.md says
#: which inputs the paper gives and which this is).
DEFAULT_RESTART_OVERHEAD_S = 300.0
#: Storage bandwidth when none is given: Llama 3's Tectonic file system sustains 2 TB/s
#: (arXiv:2407.21783 §3.3.1) for 2,048 nodes, about 1 GB/s a node; write and read alike.
DEFAULT_AGGREGATE_STORAGE_BPS = 2e12
DEFAULT_NODE_STORAGE_BPS = DEFAULT_AGGREGATE_STORAGE_BPS / 2048
#: GPU draw while training as a fraction of the rated power: 1 (Meta's Llama 2 and Llama 3
#: model cards price training energy at the GPUs' peak power, 400 W and 700 W TDP: an upper
#: bound).
DEFAULT_GPU_POWER_FRACTION = 1.0
#: Power of a node beyond its GPUs (CPUs, memory, NICs, fans), W: NVIDIA DGX data sheets'
#: maximum system power less eight GPUs' rated power (DGX A100 6.5 kW, DGX H100/H200
#: 10.2 kW, DGX B200 14.3 kW); None for other GPUs (then 0, stated in the output).
DEFAULT_NODE_OVERHEAD_W = {"a100-80gb": 6500.0 - 8 * 400, "h100-80gb": 10200.0 - 8 * 700,
                           "h200-141gb": 10200.0 - 8 * 700, "b200-180gb": 14300.0 - 8 * 1000}
#: Power usage effectiveness: 1.2, the Jean Zay data centre's BLOOM was trained in
#: (Luccioni et al., "Estimating the Carbon Footprint of BLOOM", JMLR 24, 2023, §4).
DEFAULT_PUE = 1.2
#: Bytes a parameter's saved weight takes (BF16/FP16; FP8 plans save BF16 weights).
SAVED_WEIGHT_BYTES = 2.0


def young_interval_s(save_s: float, mtbf_s: float) -> float:
    """Young (CACM 1974): the interval between checkpoints minimising the expected loss to
    first order, ``√(2·δ·M)`` (``δ`` save time, ``M`` mean time between failures; seconds)."""
    return math.sqrt(2.0 * save_s * mtbf_s)


def daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Daly (FGCS 2006, Eq. 37): the higher-order optimum interval,
    ``√(2δM)·[1 + ⅓·√(δ/(2M)) + ⅑·δ/(2M)] − δ`` for ``δ < 2M``, else ``M`` (seconds)."""
    if save_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = save_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def ettr_closed_form(rate_per_s: float, restart_s: float, interval_s: float,
                     save_s: float) -> float:
    """Kokolis et al. (HPCA 2025, §V): ``E[ETTR] ≈ (1 − λ·(u₀ + Δt/2)) / (1 + w/Δt)``,
    ``λ`` the job's failure rate (1/s), ``u₀`` restart overhead, ``Δt`` interval, ``w``
    save stall (s). Small-loss approximation; may go below 0 far outside it."""
    return (1.0 - rate_per_s * (restart_s + interval_s / 2.0)) / (1.0 + save_s / interval_s)


def ettr_exact(rate_per_s: float, restart_s: float, interval_s: float, save_s: float) -> float:
    """Exact expected ETTR of the renewal process (module docstring): ``Δt / E[T]`` with
    ``E[T] = (1/λ + u₀)·(e^{λ(Δt+w)} − 1)``; ``Δt/(Δt + w)`` at ``λ = 0``."""
    tau = interval_s + save_s
    x = rate_per_s * tau
    if x < 1e-12:
        return interval_s / tau
    if x > 700:
        return 0.0
    # (1/λ + u0)(e^x - 1) = τ (1 + λ u0) expm1(x)/x
    return interval_s / (tau * (1.0 + rate_per_s * restart_s) * math.expm1(x) / x)


def ettr_monte_carlo(rate_per_s: float, restart_s: float, interval_s: float, save_s: float,
                     *, segments: int = 200_000, seed: int = 0) -> float:
    """ETTR of the same process simulated: ``segments`` segments of ``Δt + w`` each retried
    until one attempt sees no failure (exponential times to failure, each failed attempt
    costing its time plus ``u₀``); useful work over total time. Seeded, reproducible.
    Raises ValueError where a segment would need more than about e²⁰ attempts
    (``λ·(Δt + w) > 20``): the exact form holds there, a simulation cannot finish."""
    rng = np.random.default_rng(seed)
    tau = interval_s + save_s
    if rate_per_s * tau > 20:
        raise ValueError(f"lambda*(interval+save) = {rate_per_s * tau:.3g} > 20: a segment "
                         "almost never completes; use ettr_exact")
    total = np.full(segments, float(tau))
    active = np.arange(segments)
    if rate_per_s <= 0:
        return interval_s / tau
    for _ in range(100_000):
        if active.size == 0:
            break
        x = rng.exponential(1.0 / rate_per_s, active.size)
        failed = x < tau
        total[active[failed]] += x[failed] + restart_s
        active = active[failed]
    return interval_s * segments / float(total.sum())


@dataclass(frozen=True, kw_only=True)
class TrainingInputs:
    """What the time to train needs beyond the plan (SI units). ``train_tokens`` tokens;
    ``failure_rate_per_node_day``; ``restart_overhead_s`` the fixed part of a restart (the
    checkpoint load is added per plan); storage bandwidths per node and in aggregate,
    bytes/s; ``gpu_hour_price`` (None: no cost, GPU-hours only); ``async_save``;
    ``gpu_power_fraction`` of the rated power; ``node_overhead_W`` (None: the DGX figure of
    :data:`DEFAULT_NODE_OVERHEAD_W`); ``pue``. Defaults: the module's, each cited."""

    train_tokens: float
    failure_rate_per_node_day: float = DEFAULT_FAILURE_RATE_PER_NODE_DAY
    restart_overhead_s: float = DEFAULT_RESTART_OVERHEAD_S
    node_write_Bps: float = DEFAULT_NODE_STORAGE_BPS
    aggregate_write_Bps: float = DEFAULT_AGGREGATE_STORAGE_BPS
    node_read_Bps: float = DEFAULT_NODE_STORAGE_BPS
    aggregate_read_Bps: float = DEFAULT_AGGREGATE_STORAGE_BPS
    gpu_hour_price: float | None = None
    async_save: bool = False
    gpu_power_fraction: float = DEFAULT_GPU_POWER_FRACTION
    node_overhead_W: float | None = None
    pue: float = DEFAULT_PUE

    def to_dict(self) -> dict:
        return asdict(self)


#: Keys of a cluster file's ``training`` section
#: (:data:`topology.cluster_files.TRAINING_KEYS`) → field of :class:`TrainingInputs` and
#: the factor from the file's unit to SI.
TRAINING_FIELDS = {
    "failure_rate_per_node_day": ("failure_rate_per_node_day", 1.0),
    "restart_overhead_s": ("restart_overhead_s", 1.0),
    "storage_write_GBps_per_node": ("node_write_Bps", GB),
    "storage_write_GBps_aggregate": ("aggregate_write_Bps", GB),
    "storage_read_GBps_per_node": ("node_read_Bps", GB),
    "storage_read_GBps_aggregate": ("aggregate_read_Bps", GB),
    "gpu_hour_price": ("gpu_hour_price", 1.0),
    "gpu_power_fraction": ("gpu_power_fraction", 1.0),
    "node_overhead_W": ("node_overhead_W", 1.0),
    "pue": ("pue", 1.0),
}


def training_settings(section: Mapping[str, float]) -> dict:
    """A checked cluster-file ``training`` section
    (:func:`topology.cluster_files.training_section`) as :class:`TrainingInputs` fields (SI
    units)."""
    return {TRAINING_FIELDS[k][0]: val * TRAINING_FIELDS[k][1] for k, val in section.items()}


def check_value(field: str, value: Any, key: str) -> float:
    """``value`` as float within the range of ``key`` (:data:`configurator.core.limits
    .FLOAT_RANGES`); InputError naming ``field`` otherwise."""
    return v.float_in_range(field, value, key=key)


_TOKEN_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_tokens(text: Any) -> float:
    """``"15T"``, ``"300B"``, ``"2e12"``, ``"1_000_000"`` → tokens (float). Raises
    :class:`InputError` (field ``train_tokens``)."""
    s = str(text).strip().replace("_", "").replace(",", "")
    factor = 1.0
    if s and s[-1].upper() in _TOKEN_SUFFIX:
        factor, s = _TOKEN_SUFFIX[s[-1].upper()], s[:-1]
    try:
        value = float(s) * factor
    except ValueError:
        raise InputError("train_tokens", text, "must be a token count such as 15T, 300B, "
                         "2e12 (suffixes K, M, B, T)") from None
    return check_value("train_tokens", value, "train_tokens")


def format_tokens(tokens: float) -> str:
    """``15e12`` → ``15T``, ``3e11`` → ``300B``, ``1234`` → ``1234`` (3 significant digits
    with the largest suffix that keeps the number at least 1)."""
    for suffix, factor in (("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if tokens >= factor:
            return f"{tokens / factor:.3g}{suffix}"
    return f"{tokens:.3g}"


@dataclass(frozen=True, kw_only=True)
class CheckpointSize:
    """A plan's checkpoint: ``total_bytes`` (every rank's shards), ``rank_bytes`` (the
    largest rank's shard) and ``node_bytes`` (what the busiest node writes: its GPUs'
    shards at the largest)."""

    total_bytes: float
    rank_bytes: float
    node_bytes: float


def checkpoint_bytes(model, plans, gpus_per_node: int) -> CheckpointSize:
    """Checkpoint of one plan (``plans``, a :class:`~configurator.core.plan_batch.PlanBatch`
    of one) in Megatron's ``torch_dist`` format (module docstring): per parameter the saved
    weight (:data:`SAVED_WEIGHT_BYTES`) and the optimizer state
    (:attr:`~configurator.core.plan_batch.PlanBatch.optimizer_bytes_per_parameter`), each
    model-parallel rank's state spread over its ``dp·cp`` replicas (experts' over the
    expert-data-parallel group)."""
    per_param = SAVED_WEIGHT_BYTES + plans.optimizer_bytes_per_parameter
    tp, pp, dp, cp, ep, etp = (int(getattr(plans, k).item())
                               for k in ("tp", "pp", "dp", "cp", "ep", "etp"))
    counts = rank_layer_counts(model, *plans.layer_split(0))
    stages = np.arange(pp)
    ne, ex = stage_parameter_split(model, tp, pp, stages, layers=counts[:, 0],
                                   moe_layers=counts[:, 1], ep=ep, etp=etp)
    ne = np.broadcast_to(np.asarray(ne, float), stages.shape)
    ex = np.broadcast_to(np.asarray(ex, float), stages.shape)
    replicas = dp * cp
    expert_replicas = float(expert_data_parallel_size(plans)[0])
    rank = (ne / replicas + ex / expert_replicas) * per_param
    total = float(np.sum(ne * tp + ex * ep * etp)) * per_param
    largest = float(rank.max())
    return CheckpointSize(total_bytes=total, rank_bytes=largest,
                          node_bytes=largest * min(gpus_per_node, tp * pp * dp * cp))


def transfer_s(node_bytes: float, total_bytes: float, node_Bps: float,
               aggregate_Bps: float) -> float:
    """Seconds to move a checkpoint through storage: the busiest node's bytes at its
    bandwidth, or all bytes at the aggregate bandwidth, whichever is slower (0 at infinite
    bandwidths)."""
    return max(node_bytes / node_Bps, total_bytes / aggregate_Bps)


def save_stall_s(size: CheckpointSize, inputs: TrainingInputs,
                 host_link_Bps: float) -> tuple[float, float]:
    """``(stall, persist)`` seconds of one save. Synchronous: the ranks stall while the
    checkpoint is written (:func:`transfer_s`), nothing persists afterwards. Asynchronous:
    they stall for the GPU→host copy of their shard (``rank_bytes / host_link_Bps``), and
    the write persists in the background for the synchronous time."""
    write = transfer_s(size.node_bytes, size.total_bytes, inputs.node_write_Bps,
                       inputs.aggregate_write_Bps)
    if not inputs.async_save:
        return write, 0.0
    return size.rank_bytes / host_link_Bps, write


@dataclass(frozen=True, kw_only=True)
class TrainingEstimate:
    """Time, cost and energy to train one plan (SI units, module docstring)."""

    tokens: float
    iterations: int
    checkpoint_bytes: float
    checkpoint_rank_bytes: float
    save_stall_s: float
    persist_s: float
    load_s: float
    restart_s: float
    interval_s: float
    interval_iterations: int
    young_interval_s: float
    daly_interval_s: float
    failure_rate_per_s: float
    expected_interruptions: float
    ettr: float
    ettr_closed_form: float
    closed_form_holds: bool
    ettr_method: str
    goodput_tokens_per_s: float
    goodput_tokens_per_s_per_gpu: float
    wall_time_s: float
    days: float
    gpu_hours: float
    cost: float | None
    energy_J: float
    energy_MWh: float
    power_W: float
    node_overhead_W: float
    async_save: bool

    def to_dict(self) -> dict:
        return asdict(self)


def best_interval(rate_per_s: float, restart_s: float, save_s: float, iteration_s: float,
                  min_interval_s: float = 0.0, max_iterations: int | None = None) -> int:
    """Whole iterations between saves maximising :func:`ettr_exact`, at least
    ``min_interval_s`` (an asynchronous save must persist before the next) and at most
    ``max_iterations`` (the run); ternary search (the exact ETTR is unimodal in the
    interval). Without failures the whole run; with a free save one iteration."""
    lo = max(1, math.ceil(min_interval_s / iteration_s - 1e-9))
    hi = max_iterations if max_iterations is not None else 10**12
    hi = max(hi, lo)
    if rate_per_s <= 0:
        return hi
    if save_s <= 0:
        return lo

    def f(k: int) -> float:
        return ettr_exact(rate_per_s, restart_s, k * iteration_s, save_s)

    a, b = lo, hi
    while b - a > 3:       # ternary search on the integers
        m1 = a + (b - a) // 3
        m2 = b - (b - a) // 3
        if f(m1) < f(m2):
            a = m1
        else:
            b = m2
    return max(range(a, b + 1), key=f)


def estimate_training(model, plans, *, iteration_time_s: float, global_batch_size: int,
                      gpus_per_node: int, gpu, inputs: TrainingInputs,
                      interval_iterations: int | None = None) -> TrainingEstimate:
    """Time, cost and energy to train ``inputs.train_tokens`` with one plan (``plans``, a
    :class:`~configurator.core.plan_batch.PlanBatch` of one; its iteration time, global batch
    in sequences of ``model.seq_length``) on ``world_size /
    gpus_per_node`` nodes of ``gpu`` (:class:`topology.gpus.GPUSpec`: the GPU→host link and
    rated power). ``interval_iterations``: the save interval to price (default: the best,
    :func:`best_interval`)."""
    tokens_per_iter = global_batch_size * model.seq_length
    iterations = max(1, math.ceil(inputs.train_tokens / tokens_per_iter))
    gpus = int(plans.world_size.item())
    nodes = max(1, math.ceil(gpus / gpus_per_node))
    size = checkpoint_bytes(model, plans, gpus_per_node)
    stall, persist = save_stall_s(size, inputs, gpu.host_link_Bps)
    load = transfer_s(size.node_bytes, size.total_bytes, inputs.node_read_Bps,
                      inputs.aggregate_read_Bps)
    restart = inputs.restart_overhead_s + load + persist
    rate = nodes * inputs.failure_rate_per_node_day / DAY_S
    k = interval_iterations or best_interval(rate, restart, stall, iteration_time_s,
                                             min_interval_s=persist, max_iterations=iterations)
    interval = k * iteration_time_s
    ettr = ettr_exact(rate, restart, interval, stall)
    approx = ettr_closed_form(rate, restart, interval, stall)
    holds = closed_form_holds(rate, restart, interval, stall)
    compute_s = iterations * iteration_time_s
    wall = compute_s / ettr if ettr > 0 else math.inf
    mtbf = 1.0 / rate if rate > 0 else math.inf
    overhead = inputs.node_overhead_W
    if overhead is None:
        overhead = DEFAULT_NODE_OVERHEAD_W.get(gpu.name, 0.0)
    gpu_w = (gpu.rated_power_W or 0.0) * inputs.gpu_power_fraction
    power = (gpus * gpu_w + nodes * overhead) * inputs.pue
    gpu_hours = gpus * wall / HOUR_S
    return TrainingEstimate(
        tokens=float(inputs.train_tokens), iterations=iterations,
        checkpoint_bytes=size.total_bytes, checkpoint_rank_bytes=size.rank_bytes,
        save_stall_s=stall, persist_s=persist, load_s=load, restart_s=restart,
        interval_s=interval, interval_iterations=k,
        young_interval_s=young_interval_s(stall, mtbf) if stall > 0 else 0.0,
        daly_interval_s=daly_interval_s(stall, mtbf) if stall > 0 else 0.0,
        failure_rate_per_s=rate, expected_interruptions=rate * wall, ettr=ettr,
        ettr_closed_form=approx, closed_form_holds=holds,
        ettr_method="exact renewal expectation (exponential failures)",
        goodput_tokens_per_s=inputs.train_tokens / wall,
        goodput_tokens_per_s_per_gpu=inputs.train_tokens / wall / gpus,
        wall_time_s=wall, days=wall / DAY_S, gpu_hours=gpu_hours,
        cost=None if inputs.gpu_hour_price is None else gpu_hours * inputs.gpu_hour_price,
        energy_J=power * wall, energy_MWh=power * wall / 3.6e9, power_W=power,
        node_overhead_W=overhead, async_save=inputs.async_save)


#: ``--objective`` values: what ranks plans (``iteration``: the plain search's order).
OBJECTIVES = ("iteration", "time-to-train", "cost", "energy")


def objective_key(objective: str, t: TrainingEstimate) -> float:
    """The figure ``objective`` minimises for one plan: days, cost (GPU-hours without a
    price), or energy."""
    if objective == "time-to-train":
        return t.wall_time_s
    if objective == "cost":
        return t.cost if t.cost is not None else t.gpu_hours
    if objective == "energy":
        return t.energy_J
    raise InputError("objective", objective, "must be one of " + ", ".join(OBJECTIVES[1:]))


def merged_inputs(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict:
    """``base`` (a cluster file's :func:`training_settings`) with the non-None
    ``overrides`` (command-line options) on top."""
    out = dict(base)
    out.update({k: val for k, val in overrides.items() if val is not None})
    return out
