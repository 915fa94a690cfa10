"""Time, cost and energy to train, for the plans a search, a node-count sweep or
``configurator plan`` found: the inputs (command line over the cluster file's ``training``
section over the cited defaults), each plan priced
(:func:`configurator.cost.training_time.estimate_training`), ranked by ``--objective`` and
kept within ``--deadline``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from configurator.core.errors import InputError, NoFeasiblePlanError
from configurator.cost.training_time import (OBJECTIVES, TrainingInputs, check_value,
                                             estimate_training, format_tokens,
                                             merged_inputs,
                                             objective_key, parse_tokens, training_settings)
from configurator.core.units import GB
from configurator.core.plan_batch import PlanBatch

#: Command-line options of the time to train → (TrainingInputs field, limits key, factor to SI).
OPTION_FIELDS = {
    "failure_rate_per_node_day": ("failure_rate_per_node_day", "failure_rate_per_node_day", 1.0),
    "restart_overhead_s": ("restart_overhead_s", "restart_overhead_s", 1.0),
    "storage_write_GBps": ("node_write_Bps", "storage_GBps", GB),
    "storage_write_aggregate_GBps": ("aggregate_write_Bps", "storage_GBps", GB),
    "storage_read_GBps": ("node_read_Bps", "storage_GBps", GB),
    "storage_read_aggregate_GBps": ("aggregate_read_Bps", "storage_GBps", GB),
    "gpu_hour_price": ("gpu_hour_price", "gpu_hour_price", 1.0),
    "gpu_power_fraction": ("gpu_power_fraction", "gpu_power_fraction", 1.0),
    "node_overhead_W": ("node_overhead_W", "node_overhead_W", 1.0),
    "pue": ("pue", "pue", 1.0),
}


@dataclass(frozen=True, kw_only=True)
class TrainingRequest:
    """The time-to-train options as given: ``train_tokens`` (text such as ``15T``, or
    None), ``options`` (:data:`OPTION_FIELDS` → value or None: not given), ``async_save``,
    ``objective`` (:data:`~configurator.cost.training_time.OBJECTIVES`) and
    ``deadline_days`` (or None)."""

    train_tokens: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    async_save: bool = False
    objective: str = "iteration"
    deadline_days: float | None = None

    @property
    def given(self) -> bool:
        """Whether anything of the time to train was asked for."""
        return (self.train_tokens is not None or self.async_save or self.objective != "iteration"
                or self.deadline_days is not None
                or any(val is not None for val in self.options.values()))


def training_inputs(req: TrainingRequest | None,
                    cluster_training: Mapping[str, float]) -> TrainingInputs | None:
    """The :class:`TrainingInputs` of ``req`` (None when it asks for nothing): the cluster
    file's checked ``training`` section ``cluster_training`` (read with the cluster:
    :attr:`configurator.app.inputs.ResolvedJob.training`) under the command line's options.
    Raises :class:`InputError` naming the option, the value and the rule; every option but
    ``--train-tokens`` needs ``--train-tokens``."""
    if req is None or not req.given:
        return None
    if req.objective not in OBJECTIVES:
        raise InputError("objective", req.objective, "must be one of " + ", ".join(OBJECTIVES))
    if req.train_tokens is None:
        given = [(k, val) for k, val in req.options.items() if val is not None]
        given += [("async_save", True)] if req.async_save else []
        given += [("deadline", req.deadline_days)] if req.deadline_days is not None else []
        given += [("objective", req.objective)] if req.objective != "iteration" else []
        name, value = given[0]
        raise InputError(name, value, "needs --train-tokens (the tokens to train)")
    tokens = parse_tokens(req.train_tokens)
    if req.deadline_days is not None:
        check_value("deadline", req.deadline_days, "deadline_days")
    base = training_settings(cluster_training)
    over = {}
    for opt, val in req.options.items():
        if val is None:
            continue
        name, key, factor = OPTION_FIELDS[opt]
        over[name] = check_value(opt, val, key) * factor
    fields = merged_inputs(base, over)
    return TrainingInputs(train_tokens=tokens, async_save=req.async_save, **fields)


def price_evaluation(model, cluster, e, inputs: TrainingInputs, global_batch_size: int):
    """``e`` (an :class:`~configurator.search.evaluate.Evaluation`) with its ``training``
    figures."""
    t = estimate_training(model, PlanBatch.from_plan(e.plan), iteration_time_s=e.iteration_time_s,
                          global_batch_size=global_batch_size,
                          gpus_per_node=cluster.gpus_per_node, gpu=cluster.gpu, inputs=inputs)
    return dataclasses.replace(e, training=t)


def rank_plans(plans: list, objective: str, deadline_days: float | None) -> list:
    """``plans`` (priced) ordered by ``objective`` (``iteration``: as given), those within
    ``deadline_days`` only, then cheapest first (cost, else GPU-hours). Raises
    :class:`NoFeasiblePlanError` naming the fastest time when none meets the deadline."""
    out = list(plans)
    if deadline_days is not None:
        fastest = min(out, key=lambda e: e.training.wall_time_s)
        out = [e for e in out if e.training.days <= deadline_days]
        if not out:
            raise NoFeasiblePlanError(
                f"no plan trains within the deadline of {deadline_days:g} days: the fastest "
                f"takes {fastest.training.days:.1f} days ({_plan_words(fastest)} on "
                f"{fastest.plan.world_size} GPUs)")
        return sorted(out, key=lambda e: objective_key("cost", e.training))
    if objective == "iteration":
        return out
    return sorted(out, key=lambda e: objective_key(objective, e.training))


def _plan_words(e) -> str:
    p = e.plan
    return f"tp {p.tp} pp {p.pp} dp {p.dp}" + (f" cp {p.cp}" if p.cp > 1 else "")


def objective_note(inputs: TrainingInputs, req: TrainingRequest) -> str:
    """One line on what the ranking minimises (and that cost without a price is
    GPU-hours)."""
    if req.deadline_days is not None:
        what = "cost" if inputs.gpu_hour_price is not None else "GPU-hours (no --gpu-hour-price)"
        return f"objective: {what} among plans within {req.deadline_days:g} days"
    if req.objective == "cost" and inputs.gpu_hour_price is None:
        return "objective: cost without --gpu-hour-price: ranked by GPU-hours"
    return f"objective: {req.objective}"


def training_line(e) -> str:
    """One line of ``e``'s time to train: days, GPU-hours (cost), ETTR and how it was
    computed, the chosen interval, expected interruptions, checkpoint and energy."""
    t = e.training
    cost = f", cost {t.cost:,.0f}" if t.cost is not None else ""
    mins = t.interval_s / 60
    return (f"time to train {format_tokens(t.tokens)} tokens: {t.days:.1f} days, {t.gpu_hours:,.0f} "
            f"GPU-hours{cost}, ETTR {t.ettr:.3f} ({t.ettr_method}; closed form "
            f"{t.ettr_closed_form:.3f}{'' if t.closed_form_holds else ', not valid here'}), "
            f"checkpoint every {t.interval_iterations} iterations ({mins:.1f} min; Young "
            f"{t.young_interval_s / 60:.1f}, Daly {t.daly_interval_s / 60:.1f} min), "
            f"{t.expected_interruptions:.0f} interruptions expected, checkpoint "
            f"{t.checkpoint_bytes / 1e12:.2f} TB ({t.checkpoint_rank_bytes / 1e9:.2f} GB a "
            f"rank), save stall {t.save_stall_s:.1f} s"
            + (f" (async; persists in {t.persist_s:.1f} s)" if t.async_save else "")
            + f", restart {t.restart_s / 60:.1f} min, energy {t.energy_MWh:,.0f} MWh")


def scaling_summary(rows: list[dict]) -> dict:
    """Where adding nodes stops paying, from the priced rows of a node-count sweep: the
    count with the most goodput per GPU, and the first count past which total goodput no
    longer rises (None when it rises to the end)."""
    priced = [r for r in rows if r.get("training")]
    if not priced:
        return {}
    best_per_gpu = max(priced, key=lambda r: r["training"]["goodput_tokens_per_s_per_gpu"])
    stops = None
    for a, b in zip(priced, priced[1:]):
        if b["training"]["goodput_tokens_per_s"] <= a["training"]["goodput_tokens_per_s"]:
            stops = a["nodes"]
            break
    return {"best_goodput_per_gpu_nodes": best_per_gpu["nodes"],
            "goodput_stops_rising_after_nodes": stops}


def pick_scaling_row(rows: list[dict], objective: str, deadline_days: float | None,
                     price_given: bool) -> dict | None:
    """The row of a priced sweep the objective (and deadline) chooses, or None without a
    priced row; :class:`NoFeasiblePlanError` when none meets the deadline."""
    priced = [r for r in rows if r.get("training")]
    if not priced:
        return None

    def key(r, what):
        t = r["training"]
        if what == "time-to-train":
            return t["wall_time_s"]
        if what == "energy":
            return t["energy_J"]
        if what == "cost":
            return t["cost"] if price_given else t["gpu_hours"]
        return r["iteration_time_s"] * r["training"]["iterations"]

    if deadline_days is not None:
        fastest = min(priced, key=lambda r: r["training"]["days"])
        ok = [r for r in priced if r["training"]["days"] <= deadline_days]
        if not ok:
            raise NoFeasiblePlanError(
                f"no plan trains within the deadline of {deadline_days:g} days: the fastest "
                f"takes {fastest['training']['days']:.1f} days (on {fastest['nodes']} nodes)")
        return min(ok, key=lambda r: key(r, "cost"))
    return min(priced, key=lambda r: key(r, objective if objective != "iteration"
                                         else "time-to-train"))
