"""Human-readable rendering of evaluations (the ranked table)."""

from __future__ import annotations

from configurator.search.evaluate import Evaluation
from configurator.core.units import GiB

COLUMNS = ("rank", "tp", "pp", "dp", "cp", "vp", "mbs", "recompute", "sp", "dist_opt",
           "iter_s", "TFLOP/s/GPU", "MFU", "tok/s/GPU", "peak_GiB")


def plan_row(rank: int, e: Evaluation) -> list[str]:
    p = e.plan
    return [str(rank), str(p.tp), str(p.pp), str(p.dp), str(p.cp), str(p.vp),
            str(p.micro_batch_size), p.recompute, "yes" if p.sequence_parallel else "no",
            "yes" if p.distributed_optimizer else "no", f"{e.iteration_time_s:.3f}",
            f"{e.model_tflops_per_gpu:.1f}", f"{100 * e.mfu:.1f}%",
            f"{e.tokens_per_s_per_gpu:.0f}", f"{e.peak_memory_bytes / GiB:.1f}"]


def format_table(evals: list[Evaluation], wide: bool = False) -> str:
    rows = [list(COLUMNS)] + [plan_row(i + 1, e) for i, e in enumerate(evals)]
    widths = [max(len(r[j]) for r in rows) for j in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_estimate(e: Evaluation) -> str:
    p = e.plan
    out = [f"plan: tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} vp={p.vp} "
           f"mbs={p.micro_batch_size} gbs={p.global_batch_size} "
           f"microbatches={p.num_microbatches} recompute={p.recompute} "
           f"sequence_parallel={p.sequence_parallel} "
           f"distributed_optimizer={p.distributed_optimizer} precision={p.precision} "
           f"attention_backend={p.attention_backend}",
           f"iteration time: {e.iteration_time_s:.3f} s   model TFLOP/s per GPU: "
           f"{e.model_tflops_per_gpu:.1f}   MFU: {100 * e.mfu:.1f} %   tokens/s per GPU: "
           f"{e.tokens_per_s_per_gpu:.0f}",
           "time breakdown (s): " + ", ".join(f"{k} {v:.3f}" for k, v in
                                              e.time_breakdown_s.items()),
           f"peak memory: {e.peak_memory_bytes / GiB:.2f} GiB of "
           f"{e.memory_capacity_bytes / GiB:.2f} GiB -> "
           + ("fits" if e.fits else "DOES NOT FIT"),
           "memory per stage (GiB): stage params grads optimizer activations other total"]
    shown = e.memory_per_stage if len(e.memory_per_stage) <= 8 else (
        e.memory_per_stage[:4] + e.memory_per_stage[-2:])
    for m in shown:
        out.append(f"  {m.stage:4d} {m.parameters_bytes / GiB:7.2f} {m.gradients_bytes / GiB:6.2f}"
                   f" {m.optimizer_bytes / GiB:9.2f} {m.activations_bytes / GiB:11.2f}"
                   f" {m.other_bytes / GiB:6.2f} {m.total_bytes / GiB:6.2f}")
    return "\n".join(out)
