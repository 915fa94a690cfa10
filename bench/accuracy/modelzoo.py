"""Held-out runs of the Megatron MoE Model Zoo (Qwen3-235B-A22B on 256 H100, 128-256 GB200 and
64 GB300; ``tests/data/modelzoo_qwen3.csv``, sources in its header), which no fit has seen:
each run's predicted against measured iteration time, MAPE and mean signed error overall and by
GPU and precision, then ``calibrate`` on 2 runs of the H100 BF16 group and ``validate`` on the
rest of it over seeded draws (refused, presets kept, the rest's MAPE before and after); last,
the MoE rows of every Megatron-Bridge release (``validate`` prices the newest of each recipe
only) by CUDA graph scope: their mean and median error and the time missing per MoE layer
pass (measured less predicted, over the microbatches times the MoE layers a rank runs),
and, of the eager rows priced too fast, how many are GPU-bound in the forward, in how many
the backward's GPU time exceeds its host time by more than the missing time, and the
forward's host time that would close each gap alone (:func:`eager_regimes`);
and the plans measured both with and without the expert all-to-all overlap (all other plan
fields equal), the time change measured against predicted; and the forced and dropless twins
(the long-context table's four and Mixtral 8x22B's pair, ``tests/data/modelzoo_mixtral.csv``):
the dropless run's extra seconds, measured and predicted, and the router's spread each
implies, whose medians are :data:`configurator.core.plan_terms.ROUTER_LOAD_CV`.
After the first, the Megatron FSDP row's measured time against the seconds its NICs need in
NCCL's rings for the weights and gradients each micro-batch moves, with the gradients reduced
in FP32 and in BF16 (:func:`fsdp_nic_floor`). Then the long-context rows under either FLOP
count (causal scores at half, or all ``s²`` pairs): what each implies of the attention's
attained fraction of the peak and of the rest of the microbatch
(:func:`long_context_counting`).

Then the optimisation history of one DeepSeek-V3 plan on 256 GB200
(``tests/data/dsv3_gb200_history.csv``, sources in its header; held out too): each step's
measured and predicted TFLOP/s, the error, and the step's change of the iteration time as
measured and as predicted (a step that changes software only is the same plan to the model:
0 %), then the time the plan changes took off as measured against as predicted.

Run: ``python -m bench.accuracy.modelzoo [--draws 20] [--seed 0]`` (about 25 s on a 2-core
machine).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bench.accuracy.calibrate_pairs import PairDraws, draws_parser
from bench.common import table_head
from configurator.app.validate_jobs import validate_runs
from configurator.core import plan_terms
from configurator.core.runs import load_runs

#: The run files (tests/data/modelzoo_qwen3.csv, tests/data/dsv3_gb200_history.csv).
RUNS = Path(__file__).resolve().parents[2] / "tests" / "data" / "modelzoo_qwen3.csv"
HISTORY = RUNS.with_name("dsv3_gb200_history.csv")
#: Mixtral 8x22B's forced and dropless twins (tests/data/modelzoo_mixtral.csv).
MIXTRAL = RUNS.with_name("modelzoo_mixtral.csv")


def held_out(runs) -> None:
    """Print each run's error and the summaries by group and overall."""
    report = validate_runs(runs)
    print(table_head(["run", "group", "measured s", "predicted s", "error"],
                     ["---", "---", "---:", "---:", "---:"]))
    by = defaultdict(list)
    for c in report.checks:
        if c.problem is not None:
            print(f"| {c.run.name} | {c.group} | - | - | {c.problem} |")
            continue
        by[c.group].append(c.error)
        by["all"].append(c.error)
        print(f"| {c.run.name} | {c.group} | {c.measured_iteration_time_s:.2f} | "
              f"{c.predicted_iteration_time_s:.2f} | {100 * c.error:+.1f} % |")
    print("\n" + table_head(["group", "runs", "MAPE", "mean signed"],
                            ["---", "---:", "---:", "---:"]))
    for g, errs in by.items():
        print(f"| {g} | {len(errs)} | {100 * statistics.mean(map(abs, errs)):.1f} % | "
              f"{100 * statistics.mean(errs):+.1f} % |")


def pairs(runs, n_draws: int, seed: int) -> None:
    """``calibrate`` on 2 runs of the H100 BF16 group, ``validate`` on the rest, per draw."""
    group = [r for r in runs if r.cluster == "dgx-h100-80gb" and r.plan.precision == "bf16"]
    rng = np.random.default_rng(seed)
    print("\n" + table_head(["draw", "calibrated on", "rest MAPE presets", "after",
                             "fitted"]))
    tally = PairDraws()
    for d in range(n_draws):
        pick = set(rng.choice(len(group), size=2, replace=False).tolist())
        train = [r for i, r in enumerate(group) if i in pick]
        test = [r for i, r in enumerate(group) if i not in pick]
        before, after, fitted = tally.run(train, test)
        print(f"| {d} | {'; '.join(r.name for r in train)} | {before} | {after} | {fitted} |")
    print("\n" + tally.summary())


def bridge_moe_by_graphs() -> None:
    """Every Megatron-Bridge release's MoE rows, grouped by what their CUDA graphs capture."""
    from configurator.app.validate_jobs import check_run, priced_run
    from configurator.cost.groundtruth import bridge_runs

    by, eager = defaultdict(list), []
    for run in bridge_runs(newest_only=False)[0]:
        model, cluster, priced = priced_run(run)
        if not model.is_moe:
            continue
        c = check_run(run)
        if c.error is None:
            continue
        p = priced.plan
        scope = ("none" if p.cuda_graph_impl == "none"
                 else p.cuda_graph_scope or "whole layers")
        passes = (p.global_batch_size / (p.micro_batch_size * p.dp)
                  * sum(model.moe_layer_pattern) / p.pp)
        missing = (c.measured_iteration_time_s - c.predicted_iteration_time_s) / passes
        by[scope].append((c.error, missing))
        if scope == "none":
            eager.append({"missing": missing, **moe_layer_regime(model, cluster, p)})
    print("\n" + table_head(["CUDA graphs", "runs", "mean error", "median error",
                             "median missing ms per MoE layer pass"],
                            ["---", "---:", "---:", "---:", "---:"]))
    for scope, rows in sorted(by.items()):
        errs = [e for e, _ in rows]
        print(f"| {scope} | {len(rows)} | {100 * statistics.mean(errs):+.1f} % | "
              f"{100 * statistics.median(errs):+.1f} % | "
              f"{1e3 * statistics.median(m for _, m in rows):+.2f} |")
    eager_regimes(eager)


def moe_layer_regime(model, cluster, plan) -> dict:
    """Seconds of one MoE layer pass of ``plan`` as the model prices it: the forward's host
    issue time (``host_fwd``), that less the forward's GPU time (``host_over_gpu_fwd``, > 0
    host-bound) and the backward's GPU
    time less its host time (``gpu_over_host_bwd``, > 0 GPU-bound; the re-run forward of a
    recompute included; :func:`configurator.cost.iteration.host_bound`)."""
    from configurator.core.plan_batch import PlanBatch
    from configurator.cost.communication import comm_figures, expert_comm_figures
    from configurator.cost.compute import layer_costs
    from configurator.cost.iteration import layer_type_times

    c = PlanBatch.from_plan(plan)
    comm = {**comm_figures(cluster, c), **expert_comm_figures(cluster, c)}
    lc = layer_costs(model, c, cluster.gpu)
    moe = layer_type_times(model, c, lc, comm)["moe"]

    def one(x):
        return float(np.asarray(x).ravel()[0])
    return {"host_fwd": one(lc["moe_host"]),
            "host_over_gpu_fwd": one(lc["moe_host"]) - one(lc["moe_fwd"]),
            "gpu_over_host_bwd": one(moe["hb_gpu"]) - one(moe["hb_host"])}


def eager_regimes(rows) -> None:
    """Of the eager (no CUDA graph) MoE rows the model prices too fast: how many it prices
    GPU-bound in the forward, and in how many the backward's GPU time exceeds its host time
    by more than the time missing per MoE layer pass, where no host work added to the
    backward alone could close the gap; and the forward's host time that would close it
    alone, over the priced one (the missing time, plus the GPU's lead where it leads)."""
    fast = [r for r in rows if r["missing"] > 0]
    needed = [(r["host_fwd"] + r["missing"] + max(-r["host_over_gpu_fwd"], 0.0))
              / r["host_fwd"] for r in fast]
    print(f"\neager MoE rows priced too fast: {len(fast)} of {len(rows)}; "
          f"GPU-bound in the forward: {sum(r['host_over_gpu_fwd'] <= 0 for r in fast)}; "
          f"the backward's GPU time over its host time larger than the missing time: "
          f"{sum(r['gpu_over_host_bwd'] >= r['missing'] for r in fast)} (median "
          f"{1e3 * statistics.median(r['gpu_over_host_bwd'] for r in fast):.2f} ms against "
          f"{1e3 * statistics.median(r['missing'] for r in fast):.2f} ms missing); "
          f"the forward's host time that would close each alone: {min(needed):.2f} to "
          f"{max(needed):.2f} times the priced (median {statistics.median(needed):.2f})")


#: The plan fields the expert all-to-all overlap sets (everything else must match in a pair).
OVERLAP_FIELDS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")


def overlap_pairs(zoo) -> None:
    """The same plan measured with and without the expert all-to-all overlap (every field
    but :data:`OVERLAP_FIELDS` equal; the Model Zoo's H100 rows and every Megatron-Bridge
    release's MoE rows, the newest run of each side): the time change as measured and as
    predicted."""
    from configurator.app.validate_jobs import check_run, priced_run
    from configurator.cost.groundtruth import bridge_runs

    sides: dict = defaultdict(dict)
    # releases are named YY.MM[.patch]: their names sort in time, the newest first here
    bridge = sorted(bridge_runs(newest_only=False)[0], key=lambda r: r.name.split()[1],
                    reverse=True)
    for run in list(zoo) + bridge:
        model, _, priced = priced_run(run)
        if not model.is_moe:
            continue
        fields = priced.plan.to_dict()
        key = (model.name, run.cluster, repr(sorted(
            (k, v) for k, v in fields.items() if k not in OVERLAP_FIELDS and k != "a2a_overlap")))
        on = bool(fields["overlap_moe_expert_parallel_comm"])
        if on not in sides[key]:
            sides[key][on] = (run, check_run(run))
    print("\n" + table_head(["plan", "without", "with the overlap", "measured change",
                             "predicted change"], ["---", "---", "---", "---:", "---:"]))
    for key, side in sides.items():
        if len(side) < 2 or any(c.error is None for _, c in side.values()):
            continue
        (r0, c0), (r1, c1) = side[False], side[True]
        p = r0.plan
        measured = c1.measured_iteration_time_s / c0.measured_iteration_time_s - 1
        predicted = c1.predicted_iteration_time_s / c0.predicted_iteration_time_s - 1
        print(f"| {key[0]} {key[1]} {p.precision} tp{p.tp} pp{p.pp} vp{p.vp} ep{p.ep} "
              f"mbs{p.micro_batch_size} | {r0.name} | {r1.name} | {100 * measured:+.1f} % | "
              f"{100 * predicted:+.1f} % |")


@contextmanager
def _router_load_cv(balance: str, cv: float):
    """:data:`~configurator.core.plan_terms.ROUTER_LOAD_CV` with ``balance`` set to ``cv``
    for the block (the twins' spread is solved for, so it is varied here alone)."""
    old = plan_terms.ROUTER_LOAD_CV[balance]
    plan_terms.ROUTER_LOAD_CV[balance] = cv
    try:
        yield
    finally:
        plan_terms.ROUTER_LOAD_CV[balance] = old


def twin_extra_s(forced, dropless, balance=None, cv=None) -> float:
    """Predicted seconds the dropless twin takes beyond the forced one (with ``balance``'s
    spread set to ``cv`` where given)."""
    if balance is None:
        checks = validate_runs([forced, dropless]).checks
    else:
        with _router_load_cv(balance, cv):
            checks = validate_runs([forced, dropless]).checks
    return checks[1].predicted_iteration_time_s - checks[0].predicted_iteration_time_s


def twin_pairs(runs) -> list:
    """``(forced, dropless)`` runs one plan apart, ``moe_router_force_load_balancing``
    alone differing (same model, cluster, GPUs and sequence length)."""
    forced = [r for r in runs if r.plan.moe_router_force_load_balancing]
    out = []
    for f in forced:
        twin = dataclasses.replace(f.plan, moe_router_force_load_balancing=False)
        for d in runs:
            if (d.plan == twin and d.model == f.model and d.cluster == f.cluster
                    and d.num_gpus == f.num_gpus and d.seq_length == f.seq_length):
                out.append((f, d))
    return out


def twins(runs) -> dict:
    """The forced and dropless twins: the seconds the dropless run takes beyond its forced
    twin, measured and predicted, and the spread ``c`` of
    :data:`~configurator.core.plan_terms.ROUTER_LOAD_CV` each implies (the ``c`` whose
    predicted extra seconds are the measured ones; 0 where balanced routing already gives
    them). The extra time, not the ratio: the imbalance adds to the experts' part alone, so
    an error elsewhere in the plan (the long-context rows' attention) does not move it.
    Returns the median implied ``c`` per router balance."""
    from scipy.optimize import brentq

    from configurator.app.validate_jobs import run_model

    print("\n" + table_head(["twins", "router balance", "measured extra s", "predicted",
                             "implied c"], ["---", "---", "---:", "---:", "---:"]))
    implied = defaultdict(list)
    for f, d in twin_pairs(runs):
        balance = plan_terms.router_balance(run_model(f))
        cf, cd = validate_runs([f, d]).checks
        measured = cd.measured_iteration_time_s - cf.measured_iteration_time_s
        if twin_extra_s(f, d, balance, 0.0) >= measured:
            c = 0.0
        else:
            c = brentq(lambda x: twin_extra_s(f, d, balance, x) - measured, 0.0, 10.0,
                       xtol=1e-4)
        implied[balance].append(c)
        print(f"| {d.name} | {balance} | {measured:.2f} | {twin_extra_s(f, d):.2f} | "
              f"{c:.3f} |")
    medians = {b: statistics.median(cs) for b, cs in implied.items()}
    print("\nmedian implied c: " + ", ".join(
        f"{b} {m:.3f} (ROUTER_LOAD_CV {plan_terms.ROUTER_LOAD_CV[b]:g})"
        for b, m in sorted(medians.items())))
    return medians


def _two_term_fit(plans, times):
    """Least squares, relative, of ``T = (m + (pp - 1)/vp)·(α + β·cp)`` over one table's rows
    (``m`` microbatches; ``α`` a microbatch's work at the table's fixed tokens per rank, the
    same at every cp; ``β·cp`` its attention, which grows with the keys): ``(α, β)``, seconds
    per microbatch."""
    rows = np.array([[(p.num_microbatches + (p.pp - 1) / p.vp) * x for x in (1.0, p.cp)]
                     for p in plans]) / np.asarray(times)[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(rows, np.ones(len(times)), rcond=None)
    return alpha, beta


def long_context_split(rows, formula: str) -> dict:
    """One routing's long-context rows (the same plan at cp 1, 2, 4, 8 with the tokens per
    rank fixed) read with FLOP count ``formula``: their ``errors``, the two-term fit of
    :func:`_two_term_fit` to the measured times (``fitted``: its times) and to the predicted
    ones, and what it gives: the attention's attained fraction of the BF16 peak
    (``attained``, in the first row: its kernel FLOPs, Megatron's causal score count with the
    backward at 2.5 times the forward's, over ``β``'s seconds), the preset's and the kernel's own figure at
    those keys (``preset``; ``kernel``, the prior before the in-training factor) and the rest
    of the microbatch measured over priced (``rest``)."""
    from configurator.app.validate_jobs import run_cluster, run_model
    from configurator.cost.compute import cp_causal_share, cp_key_tokens, flash_efficiency
    from configurator.cost.flops import megatron_model_flops
    from topology.gpus import RUN_FITTED

    checks = validate_runs([dataclasses.replace(r, flops_formula=formula)
                            for r in rows]).checks
    plans = [c.run.plan for c in checks]          # each run as validate priced it
    measured = [c.measured_iteration_time_s for c in checks]
    alpha, beta = _two_term_fit(plans, measured)
    alpha_p, _ = _two_term_fit(plans, [c.predicted_iteration_time_s for c in checks])
    run = checks[0].run
    model, cluster, p = run_model(run), run_cluster(run), run.plan
    # the causal score FLOPs Megatron counts (fwd + bwd as 3 forwards) -> the kernels'
    score = (megatron_model_flops(model, p.global_batch_size, causal=False)
             - megatron_model_flops(model, p.global_batch_size)) * 3.5 / 3.0
    seconds = (p.num_microbatches + (p.pp - 1) / p.vp) * beta * p.cp
    keys = cp_key_tokens(model.seq_length, p.cp, p.cp_comm_type)
    share = cp_causal_share(p.cp, p.cp_comm_type)
    return {"errors": [c.error for c in checks], "measured": measured,
            "fitted": [(q.num_microbatches + (q.pp - 1) / q.vp) * (alpha + beta * q.cp)
                       for q in plans],
            "attained": score / run.num_gpus / seconds / cluster.gpu.peak("bf16"),
            "preset": float(flash_efficiency(cluster.gpu.efficiency.flash_attention, keys,
                                             share)),
            "kernel": float(flash_efficiency(
                RUN_FITTED[cluster.gpu.name]["flash_attention"].value, keys, share)),
            "rest": alpha / alpha_p}


def long_context_rows(runs, forced: bool) -> list:
    """The long-context table's rows of one routing (the H100 rows that give TFLOP/s), by cp."""
    return sorted((r for r in runs if r.tflops_per_gpu is not None
                   and r.cluster == "dgx-h100-80gb"
                   and r.plan.moe_router_force_load_balancing == forced),
                  key=lambda r: r.plan.cp)


def long_context_counting(runs) -> None:
    """The long-context table under either FLOP count. Its rows give TFLOP/s only, and at
    16k-128k tokens the attention's share of the FLOPs, so of the time derived from them,
    depends on whether the causal scores count at half (Megatron-LM since March 2025, and
    the same README's 4k table: its Per GPU TF is the causal count's) or in full. Per
    router balance and count, :func:`long_context_split`: each row's error, the attention's
    attained fraction of the peak against the preset's and the kernel's own, the rest's
    time against its price."""
    print("\n" + table_head(["router balance", "TFLOP/s counted", "errors, cp 1, 2, 4, 8",
                             "attention, fraction of peak", "preset", "kernel alone",
                             "rest, measured over priced"],
                            ["---", "---", "---", "---:", "---:", "---:", "---:"]))
    for forced in (True, False):
        rows = long_context_rows(runs, forced)
        for formula in ("megatron", "megatron-full-attention"):
            x = long_context_split(rows, formula)
            errs = ", ".join(f"{100 * e:+.0f}" for e in x["errors"])
            print(f"| {'forced' if forced else 'dropless'} | "
                  f"{'causal at half' if formula == 'megatron' else 'all s² pairs'} | "
                  f"{errs} % | {x['attained']:.2f} | {x['preset']:.2f} | {x['kernel']:.2f} | "
                  f"{x['rest']:.2f} |")


def history(runs) -> None:
    """One plan's optimisation history: each step against its predecessor, measured and
    predicted, and what the steps that change the plan took off."""
    checks = validate_runs(runs).checks
    print("\n" + table_head(["step", "plan changed", "measured TFLOP/s", "predicted TFLOP/s",
                             "error", "time change measured", "predicted"],
                            ["---", "---", "---:", "---:", "---:", "---:", "---:"]))
    plan_steps = [0.0, 0.0]          # log time ratios summed over the plan's own changes
    prev = None
    for c in checks:
        run = c.run
        fields = run.plan.to_dict()
        before = prev.run.plan.to_dict() if prev is not None else fields
        changed = ", ".join(k for k, v in fields.items() if before[k] != v)
        if prev is None:
            dm = dp = ""
        else:
            rm = c.measured_iteration_time_s / prev.measured_iteration_time_s
            rp = c.predicted_iteration_time_s / prev.predicted_iteration_time_s
            dm, dp = f"{100 * (rm - 1):+.1f} %", f"{100 * (rp - 1):+.1f} %"
            if changed:
                plan_steps[0] += np.log(rm)
                plan_steps[1] += np.log(rp)
        predicted_tflops = run.tflops_per_gpu * (c.measured_iteration_time_s
                                                 / c.predicted_iteration_time_s)
        print(f"| {run.name.split(': ', 1)[1]} | {changed or '-'} | {run.tflops_per_gpu:.0f} | "
              f"{predicted_tflops:.0f} | {100 * c.error:+.1f} % | {dm} | {dp} |")
        prev = c
    print(f"\nthe plan's own changes: time {100 * (np.exp(plan_steps[0]) - 1):+.1f} % measured, "
          f"{100 * (np.exp(plan_steps[1]) - 1):+.1f} % predicted; first step "
          f"{100 * checks[0].error:+.1f} %, last {100 * checks[-1].error:+.1f} %")


def fsdp_nic_floor(run) -> dict:
    """What NCCL's rings allow a Megatron FSDP run (``megatron_fsdp``, pp 1) of its links:
    the seconds per iteration one GPU's NIC needs, at its line rate and with every byte of
    compute hidden, for the weights each micro-batch gathers (BF16, forward and again
    backward) and the gradients it reduce-scatters, each direction carrying all three (in a
    ring, and any collective without in-network reduction or multicast, every GPU sends as
    much as it receives; InfiniBand SHARP would need less), with the reduction in FP32
    (Megatron's default for BF16, ``grad_reduce_in_fp32``) and in BF16
    (``--grad-reduce-in-bf16``); and the model's price of the run with each reduction.
    ``{"fp32_floor_s", "bf16_floor_s", "predicted_fp32_s", "predicted_bf16_s",
    "expert_params", "non_expert_params"}`` (seconds, parameters per GPU). Raises
    ValueError for a run without Megatron FSDP or with pp > 1.

    Every micro-batch gathers each unit's weights before its forward and before its
    backward and reduce-scatters its gradients (megatron-core 0.16.1 megatron_fsdp.py:
    ``optim_grads_params`` reduces on every backward, ``grad_reduce_every_bprop``). A ring
    collective of ``B`` bytes over ``n`` ranks, ``k`` of them in a node, moves ``B(1 − k/n)``
    bytes each way through that node's NICs for the group, and each of a node's GPUs belongs
    to one such group with its own NIC: ``B(1 − k/n)/k`` per NIC each way
    (:func:`topology.group_figures.uniform_group_shape` gives ``k``). Non-expert weights
    are sharded over ``dp·cp`` (stride ``tp``), expert ones over the expert-data-parallel
    group (stride ``etp·ep``)."""
    from configurator.app.validate_jobs import run_cluster, run_model
    from configurator.core.plan_batch import PlanBatch
    from configurator.cost.iteration import expert_data_parallel_size
    from configurator.search.evaluate import evaluate_plan
    from memory_model.params import stage_parameter_split
    from topology.group_figures import uniform_group_shape

    plan = run.plan
    if not plan.megatron_fsdp or plan.pp != 1:
        raise ValueError(f"{run.name}: not a Megatron FSDP run with pp 1")
    model, cluster = run_model(run), run_cluster(run)
    G, world = cluster.gpus_per_node, run.num_gpus
    ne, ex = (float(np.ravel(x)[0]) for x in stage_parameter_split(
        model, plan.tp, 1, 0, ep=plan.ep, etp=plan.etp))
    c = PlanBatch.from_plan(plan)
    groups = [(ne, plan.tp, plan.dp * plan.cp)]
    if model.is_moe:
        edp = int(np.ravel(expert_data_parallel_size(c))[0])
        groups.append((ex, plan.etp * plan.ep, edp))

    def per_nic_bytes(grad_bytes):
        total = 0.0
        for params, stride, n in groups:
            _, inter, k = uniform_group_shape(stride, n, world, G)
            if n > 1 and inter:
                total += params * (2 + 2 + grad_bytes) * (1 - k / n) / k
        return total

    m = int(np.ravel(c.num_microbatches)[0])
    line = cluster.spec["inter_bandwidth_Bps"]
    return {"fp32_floor_s": m * per_nic_bytes(4) / line,
            "bf16_floor_s": m * per_nic_bytes(2) / line,
            "predicted_fp32_s": evaluate_plan(model, cluster, dataclasses.replace(
                plan, grad_reduce_in_bf16=False)).iteration_time_s,
            "predicted_bf16_s": evaluate_plan(model, cluster, dataclasses.replace(
                plan, grad_reduce_in_bf16=True)).iteration_time_s,
            "expert_params": ex, "non_expert_params": ne}


def fsdp_rows(runs) -> None:
    """Print, for each Megatron FSDP run, its measured time against what rings allow its links
    with the gradients reduced in FP32 and in BF16 (:func:`fsdp_nic_floor`)."""
    print("\n" + table_head(["run", "measured s", "NIC floor, FP32 reduction", "predicted",
                             "NIC floor, BF16 reduction", "predicted"],
                            ["---", "---:", "---:", "---:", "---:", "---:"]))
    for r in runs:
        if r.plan.megatron_fsdp and r.plan.pp == 1:
            f = fsdp_nic_floor(r)
            print(f"| {r.name} | {r.iteration_time_s:.2f} | {f['fp32_floor_s']:.2f} | "
                  f"{f['predicted_fp32_s']:.2f} | {f['bf16_floor_s']:.2f} | "
                  f"{f['predicted_bf16_s']:.2f} |")


def main(argv=None) -> None:
    args = draws_parser(__doc__).parse_args(argv)
    runs = load_runs(str(RUNS))
    held_out(runs)
    fsdp_rows(runs)
    long_context_counting(runs)
    pairs(runs, args.draws, args.seed)
    bridge_moe_by_graphs()
    overlap_pairs(runs)
    twins(runs + load_runs(str(MIXTRAL)))
    history(load_runs(str(HISTORY)))


if __name__ == "__main__":
    main()
