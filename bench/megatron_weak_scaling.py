"""Megatron-LM's own H100 weak-scaling table: an independent check of the H100 BF16 preset
on dense GPT models from 1.7B to 462B parameters on 48 to 6,144 GPUs.

Source: NVIDIA/Megatron-LM ``README.md`` ("up to 47 % Model FLOP Utilization (MFU) on H100
clusters") and its ``images/model_table.png`` (Megatron-Core r0.8.0): per model the
attention heads, hidden size, layers, tp, pp, dp, GPUs, batch size and per-GPU TFLOP/s,
typed in below. The README states vocabulary 131,072, sequence 4,096 and the overlaps
(``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--tp-comm-overlap``). What the
table leaves out is taken as Megatron's defaults of the time and checked where it can be:
a 4h GeLU MLP and untied embeddings (the only GPT form whose parameter count gives each
row's size, asserted below), RoPE, no dropout, micro-batch 1 (``--mbs``), no interleaving, no
recompute, sequence parallelism with tp > 1, the distributed optimizer, Megatron's eager
cross entropy. TFLOP/s are Megatron r0.8.0's ``num_floating_point_operations``, which
counts the attention scores over all ``s²`` pairs (``flops_formula:
megatron-full-attention``).

Run: ``python bench/megatron_weak_scaling.py [--no-tp-comm-overlap] [--vp auto] [--mbs N]``.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

from configurator.app.validate_jobs import validate_runs
from configurator.core.model import load_model
from configurator.core.runs import load_runs
from memory_model.params import total_parameters

#: (size, attention heads, hidden, layers, tp, pp, dp, GPUs, batch, TFLOP/s per GPU)
TABLE = (
    ("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9),
)
VOCAB, SEQ = 131072, 4096


def model_yaml(heads: int, hidden: int, layers: int) -> str:
    return (f"num_layers: {layers}\nhidden_size: {hidden}\nnum_attention_heads: {heads}\n"
            f"ffn_hidden_size: {4 * hidden}\nvocab_size: {VOCAB}\nseq_length: {SEQ}\n"
            "untie_embeddings_and_output_weights: true\nposition_embedding_type: rope\n"
            "hidden_dropout: 0.0\nattention_dropout: 0.0\n")


def virtual_stages(layers: int, pp: int) -> int:
    """``--vp auto``: the most virtual stages that leave at least 2 layers each."""
    return max([v for v in range(1, layers // pp + 1)
                if layers % (pp * v) == 0 and layers // (pp * v) >= 2] or [1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-tp-comm-overlap", action="store_true",
                    help="price the tensor-parallel collectives without the overlap")
    ap.add_argument("--vp", choices=("1", "auto"), default="1",
                    help="virtual pipeline stages where pp > 1 (not in the table)")
    ap.add_argument("--mbs", type=int, default=1,
                    help="micro-batch size (not in the table; it must divide batch / dp)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for size, heads, hidden, layers, tp, pp, dp, gpus, batch, tflops in TABLE:
            (Path(tmp) / f"{size}.yaml").write_text(
                f"name: gpt-{size.lower()}\n" + model_yaml(heads, hidden, layers))
            params = total_parameters(load_model(str(Path(tmp) / f"{size}.yaml"))) / 1e9
            assert abs(params / float(size[:-1]) - 1) < 0.04, (size, params)
            assert tp * pp * dp == gpus
            rows.append(dict(
                name=f"megatron r0.8.0 {size} {gpus} H100", model=f"{size}.yaml",
                cluster="dgx-h100-80gb", num_gpus=gpus, tp=tp, pp=pp,
                vp=virtual_stages(layers, pp) if args.vp == "auto" and pp > 1 else 1,
                micro_batch_size=args.mbs, global_batch_size=batch, precision="bf16",
                tp_comm_overlap=str(not args.no_tp_comm_overlap).lower(),
                tflops_per_gpu=tflops, flops_formula="megatron-full-attention",
                group="H100 BF16 (Megatron r0.8.0)"))
        path = Path(tmp) / "runs.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        report = validate_runs(load_runs(str(path)))
    print("| model | GPUs | tp | pp | vp | measured s | predicted s | error |")
    print("|---|---|---|---|---|---|---|---|")
    for c in report.checks:
        p = c.run.plan
        print(f"| {c.run.name.split()[2]} | {c.run.num_gpus} | {p.tp} | {p.pp} | {p.vp} | "
              f"{c.measured_iteration_time_s:.3f} | {c.predicted_iteration_time_s:.3f} | "
              f"{100 * c.error:+.1f} % |")
    g = report.overall
    print(f"\nMAPE {100 * g.mape:.1f} % over {g.rows} runs, worst {100 * g.worst_error:+.1f} % "
          f"({g.worst_name}), Spearman rho {g.spearman:.3f}")


if __name__ == "__main__":
    main()
