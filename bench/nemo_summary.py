"""NeMo's own pre-training table (NeMo 24.07 container, DGX H100, FP8): a check of the
presets on a release outside the published runs that ship with the tool, priced as
``estimate`` prices a plan given only the table's columns (the plan fields' defaults: the distributed optimizer,
``fp8_param_gather`` as NeMo's FP8 presets set it, no recompute, the split ``estimate``
chooses where pp does not divide the layers).

Reads the "Pretraining" table of a NeMo checkout's
``docs/source/performance/performance_summary.md`` (tags v2.0.0 and v2.1.0 hold the 24.07
table; e.g. ``git show v2.1.0:docs/source/performance/performance_summary.md > p.md``).
GPT3-5B and GPT3-20B are the GPT-3 175B preset at NeMo's 5B and 20B shapes (24 layers of
4,096 and 44 layers of 6,144; the table's model TFLOP/s over its tokens/s gives Megatron's
FLOPs per token of exactly these shapes: ``--rows`` prints the ratio for every row). The
Nemotron rows (squared-ReLU models without a preset) are skipped and counted.

Run: ``python bench/nemo_summary.py p.md [--rows]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from configurator.app.validate_jobs import validate_runs
from configurator.core.model import MODEL_PRESETS
from configurator.core.runs import run_from_mapping
from configurator.cost.flops import megatron_model_flops

GPT3 = MODEL_PRESETS["gpt3-175b"]
#: NeMo's GPT-3 shapes (NeMo-Megatron-Launcher ``conf/training/gpt3/{5b,20b}.yaml``).
MODELS = {
    "GPT3-5B": dataclasses.replace(GPT3, name="gpt3-5b", num_layers=24, hidden_size=4096,
                                   ffn_hidden_size=16384, num_attention_heads=32,
                                   num_query_groups=32, kv_channels=128),
    "GPT3-20B": dataclasses.replace(GPT3, name="gpt3-20b", num_layers=44, hidden_size=6144,
                                    ffn_hidden_size=24576, num_attention_heads=48,
                                    num_query_groups=48, kv_channels=128),
    "GPT3-175B": GPT3,
    "LLAMA2-7B": MODEL_PRESETS["llama2-7b"], "LLAMA2-13B": MODEL_PRESETS["llama2-13b"],
    "LLAMA2-70B": MODEL_PRESETS["llama2-70b"], "LLAMA3-8B": MODEL_PRESETS["llama3-8b"],
    "LLAMA3-70B": MODEL_PRESETS["llama3-70b"],
}


def table_rows(path: Path) -> list[dict]:
    """The rows of the page's first table after a "Pretraining" heading, by column name."""
    rows, header, inside = [], None, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            inside = "pretraining" in line.lower().replace("-", "")
            header = None
        elif inside and line.startswith("|"):
            cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(line) <= set("|- "):
                rows.append(dict(zip(header, cells)))
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("page", type=Path)
    p.add_argument("--rows", action="store_true", help="print every run")
    args = p.parse_args(argv)
    runs, skipped = [], []
    for r in table_rows(args.page):
        name = r["Model"]
        if name not in MODELS:
            skipped.append(name)
            continue
        model = MODELS[name].with_seq_length(int(r["Sequence Length"]))
        tokens = float(r["Tokens / sec / GPU"])
        tflops = float(re.sub(r"\[([0-9.]+)\]\(.*\)", r"\1", r["Model TFLOP / sec / GPU"]))
        # NeMo 24.07 counts the attention scores over all s² pairs (README, "Validate")
        per_token = megatron_model_flops(model, 1, causal=False) / model.seq_length
        flops_ratio = tflops * 1e12 / tokens / float(per_token)
        runs.append(dataclasses.replace(run_from_mapping(dict(
            name=f"nemo 24.07 {name} {r['#-GPUs']} GPUs", model=model.name,
            cluster="dgx-h100-80gb", num_gpus=r["#-GPUs"], tp=r["TP"], pp=r["PP"], cp=r["CP"],
            vp=r["VP"], mbs=r["MBS"], gbs=r["GBS"], precision="fp8",
            seq_length=r["Sequence Length"], tokens_per_s_per_gpu=r["Tokens / sec / GPU"],
            source=f"{args.page.name} (FLOPs/token ratio {flops_ratio:.3f})")), model=model))
    report = validate_runs(runs)
    for g in report.groups + [report.overall]:
        print(f"{g.group:<16} {g.rows:>3} runs  MAPE {100 * g.mape:5.1f} %  "
              f"worst {100 * g.worst_error:+6.1f} %")
    misfits = [c for c in report.checks if c.problem is None and not c.fits]
    print(f"{len(misfits)} of {len(report.checks)} predicted not to fit"
          + "".join(f"\n  {c.run.name}: {c.predicted_peak_memory_bytes / 2**30:.1f} GiB"
                    for c in misfits))
    print(f"skipped (no preset): {', '.join(skipped) or 'none'}")
    if args.rows:
        for c in report.checks:
            if c.problem is not None:
                print(f"  {c.run.name:<32} not priced: {c.problem}")
                continue
            print(f"  {c.run.name:<32} error {100 * c.error:+6.1f} %  "
                  f"{c.predicted_peak_memory_bytes / 2**30:5.1f} GiB  [{c.run.source}]")


if __name__ == "__main__":
    main()
