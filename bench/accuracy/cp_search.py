"""The search's context-parallel degree against NeMo's published one, Llama-2 7B FP8 on 8 to
1,024 DGX H100 at 8k to 1M tokens (``nemo_long_sequence_cp.csv``): the best plan's tp, pp,
cp and the published plan's predicted time over the best plan's.

Run: ``python -m bench.accuracy.cp_search`` (≈ 10 s).
"""

from __future__ import annotations

from bench.common import bench_parser, table_head
from configurator.app.inputs import JobInputs
from configurator.app.plan_jobs import SearchRequest, run_search
from configurator.core.model_presets import MODEL_PRESETS
from configurator.cost.groundtruth import nemo_cp_runs
from configurator.search.evaluate import evaluate_plan
from topology.cluster_files import load_cluster


def main(argv=None) -> None:
    bench_parser(__doc__).parse_args(argv)
    print(table_head(["sequence", "GPUs", "published tp/pp/cp", "picked tp/pp/cp",
                      "published plan over best"]))
    for r in nemo_cp_runs():
        if "LLAMA2" not in r.name or r.num_gpus < 8:
            continue
        nodes = r.num_gpus // 8
        out = run_search(SearchRequest(
            inputs=JobInputs(model=r.model, cluster=r.cluster, nodes=nodes,
                             seq_length=r.seq_length),
            global_batch_size=r.plan.global_batch_size,
            options=dict(precision="fp8", fp8_param_gather=True), top=1))
        best = out.result.plans[0]
        model = MODEL_PRESETS[r.model].with_seq_length(r.seq_length)
        published = evaluate_plan(model, load_cluster(r.cluster, nodes), r.plan)
        gap = published.iteration_time_s / best.iteration_time_s - 1
        p, b = r.plan, best.plan
        print(f"| {r.seq_length // 1024}k | {r.num_gpus} | {p.tp}/{p.pp}/{p.cp} | "
              f"{b.tp}/{b.pp}/{b.cp} | {100 * gap:+.1f} % |")


if __name__ == "__main__":
    main()
