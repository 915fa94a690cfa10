"""Megatron-LM's own A100 figures outside SC'21 Table 1: an independent check of the A100
preset on selective recompute with sequence parallelism and on GPT-3 175B at scale.

* Korthikanti et al. 2022 (arXiv:2205.05198) configurations (the shipped table
  ``configurator/data/published/korthikanti_table3.csv``: 22B, 175B, 530B, 1T on 8–512 A100,
  no data parallelism) with the model FLOPs utilisation Megatron-LM's README reports for them with
  selective recompute and sequence parallelism (README of core_r0.4.0 to core_v0.7.0: 41.5,
  51.4, 56.0 and 56.3 % of 312 TFLOP/s). The paper's model FLOPs are
  ``72·B·s·l·h²·(1 + s/6h + V/12lh)``, Megatron's count over all ``s²`` attention scores
  (``flops_formula: megatron-full-attention``); 2022 Megatron stored the attention scores
  (``attention_backend: local``), fp16, no distributed optimizer (dp = 1).
* GPT-3 175B on 1,024 A100 (README v2.5 to core_v0.7.0, ``examples/pretrain_gpt3_175B.sh``:
  tp 8, pp 16, mbs 1, gbs 1536, fp16, ``--checkpoint-activations``): "each iteration takes
  around 32 seconds resulting in 138 teraFLOPs per GPU", the SC'21 count (with the recompute
  forward).

The 22B and 530B shapes are the configurations' (GPT: 4h GeLU MLP with biases, LayerNorm,
learned positions, dropout 0.1, tied embeddings, vocabulary 51,200, sequence 2048).

Run: ``python bench/megatron_a100.py``.
"""

from __future__ import annotations

import dataclasses

from configurator.app.validate_jobs import validate_runs
from configurator.core.model import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.runs import MeasuredRun
from configurator.cost.groundtruth import KORTHIKANTI_TABLE, published_path, read_table

#: Model FLOPs utilisation (%) with selective recompute and sequence parallelism, per model
#: size (Megatron-LM README, core_r0.4.0 to core_v0.7.0).
MFU_PERCENT = {"22B": 41.5, "175B (GPT-3)": 51.4, "530B (MT-NLG)": 56.0, "1T": 56.3}
A100_PEAK_TFLOPS = 312.0


def _model(size: str, heads: int, hidden: int, layers: int):
    gpt3 = MODEL_PRESETS["gpt3-175b"]
    return dataclasses.replace(gpt3, name=f"gpt-{size.split()[0].lower()}", num_layers=layers,
                               hidden_size=hidden, ffn_hidden_size=4 * hidden,
                               num_attention_heads=heads, num_query_groups=heads,
                               kv_channels=hidden // heads)


def runs() -> list[MeasuredRun]:
    rows = read_table(published_path(KORTHIKANTI_TABLE))
    out = []
    for r in rows:
        tp, pp, gpus = int(r["tp"]), int(r["pp"]), int(r["num_gpus"])
        plan = ParallelPlan(tp=tp, pp=pp, dp=gpus // (tp * pp),
                            vp=int(r["interleave_chunks"] or 1),
                            micro_batch_size=int(r["micro_batch_size"]),
                            global_batch_size=int(r["global_batch_size"]), precision="fp16",
                            recompute="selective", sequence_parallel=True,
                            attention_backend="local", distributed_optimizer=False)
        out.append(MeasuredRun(
            name=f"korthikanti {r['model_size'].split()[0]} {gpus} A100",
            group="A100 (Megatron-LM README)",
            source="Korthikanti et al. 2022; Megatron-LM README", seq_length=None,
            model=_model(r["model_size"], int(r["attention_heads"]), int(r["hidden_size"]),
                         int(r["num_layers"])),
            cluster="dgx-a100-80gb", num_gpus=gpus, plan=plan,
            tflops_per_gpu=MFU_PERCENT[r["model_size"]] / 100 * A100_PEAK_TFLOPS,
            flops_formula="megatron-full-attention"))
    out.append(MeasuredRun(
        name="gpt3-175b 1024 A100 (README example)", group="A100 (Megatron-LM README)",
        source="Megatron-LM README, examples/pretrain_gpt3_175B.sh", seq_length=None,
        model="gpt3-175b", cluster="dgx-a100-80gb", num_gpus=1024,
        plan=ParallelPlan(tp=8, pp=16, dp=8, micro_batch_size=1, global_batch_size=1536,
                          precision="fp16", recompute="full", attention_backend="local",
                          distributed_optimizer=False),
        tflops_per_gpu=138.0, flops_formula="sc21"))
    return out


def main() -> None:
    report = validate_runs(runs())
    print("| run | tp/pp/vp | measured s | predicted s | error |")
    print("|---|---|---|---|---|")
    for c in report.checks:
        p = c.run.plan
        print(f"| {c.run.name} | {p.tp}/{p.pp}/{p.vp} | {c.measured_iteration_time_s:.2f} | "
              f"{c.predicted_iteration_time_s:.2f} | {100 * c.error:+.1f} % |")
    g = report.overall
    print(f"\nMAPE {100 * g.mape:.1f} % over {g.rows} runs, worst {100 * g.worst_error:+.1f} % "
          f"({g.worst_name})")


if __name__ == "__main__":
    main()
