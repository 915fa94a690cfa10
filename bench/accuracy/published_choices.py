"""Where each SC'21 Table 1 configuration ranks in our search, and the predicted gap to our best.

Two spaces per row (model, GPUs, global batch size, on dgx-a100-80gb):
* ``2021``: the features the paper's Megatron had — fp16, score-storing (``local``)
  attention, full recompute, no sequence parallelism, no distributed optimizer, no
  gradient-reduce overlap, the backward's tensor-parallel all-reduce not under the
  weight-gradient GEMM (``async_tensor_model_parallel_allreduce`` off), no context
  parallelism; tp, pp, vp, mbs free.
* ``modern``: every plan Megatron-LM core_v0.16 accepts, bf16, flash attention.
Run: ``python -m bench.accuracy.published_choices`` (≈ 10 s).
"""

from __future__ import annotations

import numpy as np

from bench.common import bench_parser, sc21_cluster, table_head
from configurator.cost.groundtruth import sc21_rows
from configurator.search.evaluate import evaluate_plan
from configurator.search.rank import search
from configurator.search.space import SearchSpace

SPACE_2021 = SearchSpace(cp=(1,), recompute=("full",), sequence_parallel=(False,),
                         distributed_optimizer=(False,))


def rank_of(res, plan) -> int | None:
    c = res.ranked
    hit = np.flatnonzero((c.tp == plan.tp) & (c.pp == plan.pp) & (c.vp == plan.vp)
                         & (c.mbs == plan.micro_batch_size) & (c.cp == 1)
                         & (c.recompute == 2) & ~c.sequence_parallel & ~c.distributed_optimizer)
    return int(hit[0]) + 1 if len(hit) else None


def main(argv=None) -> None:
    bench_parser(__doc__).parse_args(argv)
    print(table_head(["model", "GPUs", "GBS", "paper tp/pp/vp/mbs", "rank (2021 space)", "of",
                      "gap to best", "best 2021-space plan", "modern best (bf16, flash)",
                      "modern gain"]))
    for row in sc21_rows():
        cl = sc21_cluster(row)
        p = row.plan
        res = search(row.model, cl, p.global_batch_size, precision="fp16",
                     attention_backend="local", space=SPACE_2021, top_k=1,
                     overlap_grad_reduce=False, overlap_param_gather=False, keep_ranking=True,
                     async_tensor_model_parallel_allreduce=False)
        paper = evaluate_plan(row.model, cl, p)
        r = rank_of(res, p)
        b = res.plans[0]
        gap = 100 * (paper.iteration_time_s / b.iteration_time_s - 1)
        modern = search(row.model, cl, p.global_batch_size, top_k=1).plans[0]
        mgain = 100 * (paper.iteration_time_s / modern.iteration_time_s - 1)
        bp, mp = b.plan, modern.plan
        print(f"| {row.model.name} | {row.num_gpus} | {p.global_batch_size} | "
              f"{p.tp}/{p.pp}/{p.vp}/{p.micro_batch_size} | {r if r else 'not feasible'} | "
              f"{res.feasible} | {gap:.1f} % | tp{bp.tp} pp{bp.pp} vp{bp.vp} "
              f"mbs{bp.micro_batch_size} | tp{mp.tp} pp{mp.pp} cp{mp.cp} vp{mp.vp} "
              f"mbs{mp.micro_batch_size} {mp.recompute} | {mgain:.0f} % |")


if __name__ == "__main__":
    main()
