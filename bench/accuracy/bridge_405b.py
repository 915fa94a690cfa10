"""Llama-3.1 405B on 1,024 H100 at seq 8192: our best plan, and where Megatron-Bridge's
published pre-training configuration ranks (tp 8, pp 8, cp 2, vp 8, mbs 1, embedding and
loss accounted in the pipeline split, no recompute; ``LLAMA31_405B_PRETRAIN_CONFIG_H100_*``
in NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs, gbs 512 (V1) and 1536 (V2)).

Run: ``python -m bench.accuracy.bridge_405b [--gbs 512 1536]`` (≈ 10 s).
"""

from __future__ import annotations

import numpy as np

from bench.common import bench_parser, table_head
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.rules import check_plan, plan_for_world
from configurator.search.evaluate import evaluate_plan
from configurator.search.rank import search
from topology.cluster_files import load_cluster

PUBLISHED = dict(tp=8, pp=8, cp=2, vp=8, micro_batch_size=1, recompute="none",
                 account_for_embedding_in_pipeline_split=True,
                 account_for_loss_in_pipeline_split=True)


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--gbs", type=int, nargs="+", default=[512, 1536],
                    help="global batch sizes (default: 512 and 1536, the published V1 and V2)")
    args = ap.parse_args(argv)
    model = MODEL_PRESETS["llama3.1-405b"]
    cl = load_cluster("dgx-h100-80gb", nodes=128)
    print(table_head(["gbs", "our best plan", "its time (s)", "published time (s)",
                      "published peak (GiB)", "rank of published (closed form, all legal)",
                      "rank among plans that fit"]))
    for gbs in args.gbs:
        plan = plan_for_world(dict(PUBLISHED, global_batch_size=gbs), cl.num_gpus)
        check_plan(model, plan, cl.num_gpus)
        pub = evaluate_plan(model, cl, plan)
        res = search(model, cl, gbs, top_k=1, keep_ranking=True, max_memory_fraction=10.0)
        c, t = res.ranked, res.ranked_time_s
        hit = np.flatnonzero((c.tp == 8) & (c.pp == 8) & (c.cp == 2) & (c.vp == 8)
                             & (c.mbs == 1) & (c.recompute == 0) & c.acct_emb & c.acct_loss
                             & c.sequence_parallel & c.distributed_optimizer)
        rank_all = int(hit[0]) + 1
        fits = search(model, cl, gbs, top_k=1, keep_ranking=True)
        best = fits.plans[0]
        rank_fit = int(np.sum(fits.ranked_time_s < t[hit[0]])) + 1
        b = best.plan
        words = (f"tp {b.tp} pp {b.pp} dp {b.dp} cp {b.cp} vp {b.vp} mbs {b.micro_batch_size} "
                 f"{b.recompute}" + (" +emb+loss" if b.account_for_embedding_in_pipeline_split
                                     else f" first {b.decoder_first_pipeline_num_layers} "
                                          f"last {b.decoder_last_pipeline_num_layers}"))
        print(f"| {gbs} | {words} | {best.iteration_time_s:.2f} | {pub.iteration_time_s:.2f} "
              f"| {pub.peak_memory_bytes / 2**30:.1f} | {rank_all} of {len(t)} "
              f"| {rank_fit} of {fits.feasible} (if it fit) |")


if __name__ == "__main__":
    main()
