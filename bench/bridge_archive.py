"""Megatron-Bridge's whole published pre-training tables, not only the subset that ships with
the tool: an independent check of the presets on the models the subset leaves out (Llama-3 70B,
Llama-3.1 405B, Qwen3-235B-A22B, DeepSeek-V3) and on every release.

Reads the performance-summary pages of a Megatron-Bridge checkout
(``docs/performance-summary.md`` and ``docs/performance-summary-archive.md``: tables under
"## <release> NeMo Container" / "### Pre-Training Performance", one per model with a
``System`` column or one per system with a ``Model`` column), turns every row into the
shipped table's CSV schema and prices it exactly as ``configurator validate`` prices
``configurator/data/published/megatron_bridge_perf.csv``
(:func:`configurator.cost.groundtruth.bridge_rows`: the newest release of each
configuration, BF16 main gradients, FP8 parameter gather with FP8).
NVFP4 rows (no such precision here), models without a preset and the recipes of
``groundtruth.BRIDGE_UNMODELLED_RECIPES`` are skipped and counted.

Run: ``python bench/bridge_archive.py BRIDGE/docs/performance-summary.md
BRIDGE/docs/performance-summary-archive.md [--all-releases] [--rows]``.
"""

from __future__ import annotations

import argparse
import csv
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from unittest import mock

from configurator.app.validate_jobs import validate_runs
from configurator.cost import groundtruth

COLUMNS = ("source,release,section,model,system,precision,num_gpus,gbs,mbs,seq_len,fsdp,tp,pp,"
           "cp,vp,ep,ga,tokens_per_sec_per_gpu,model_tflops_per_gpu").split(",")
HEADER = {"System": "system", "Model": "model", "#-GPUs": "num_gpus", "Precision": "precision",
          "GBS": "gbs", "MBS": "mbs", "Sequence Length": "seq_len", "FSDP": "fsdp", "TP": "tp",
          "PP": "pp", "CP": "cp", "VP": "vp", "EP": "ep", "GA": "ga",
          "Tokens / sec / GPU": "tokens_per_sec_per_gpu",
          "Model TFLOP / sec / GPU": "model_tflops_per_gpu"}


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def page_rows(path: Path) -> list[dict]:
    """Pre-training rows of one performance-summary page, in the shipped CSV's columns."""
    out, release, section, fixed, header = [], None, "", {}, None
    for line in path.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"## (\S+) NeMo Container", line):
            release, header = m.group(1), None
        elif line.startswith("### "):
            section, header = line[4:].strip(), None
        elif m := re.match(r"#### (Model|System): (.+)", line):
            fixed, header = {HEADER[m.group(1)]: m.group(2).strip()}, None
        elif line.startswith("| ") and line.split("|")[1].strip() in ("System", "Model"):
            header = [HEADER.get(c, c) for c in _cells(line)]
        elif (line.startswith("|") and header and release and not line.startswith("|--")
              and section.startswith("Pre-Training")):
            row = dict(fixed, **dict(zip(header, _cells(line))))
            row["model"] = row.get("model", "")   # "(w/o MTP)": groundtruth.MTP_OFF_SUFFIX
            row.setdefault("precision", "unstated")
            row["ep"] = row.get("ep", "1") if row.get("ep", "n/a") != "n/a" else "1"
            row.update(source=path.name, release=release, section=section)
            out.append({k: row.get(k, "") for k in COLUMNS})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="+", type=Path)
    ap.add_argument("--all-releases", action="store_true",
                    help="every release of a configuration, not only the newest")
    ap.add_argument("--rows", action="store_true", help="print every run")
    args = ap.parse_args()
    missing = [str(p) for p in args.pages if not p.is_file()]
    if missing:
        ap.error(f"no such page: {', '.join(missing)}")
    rows = [r for p in args.pages for r in page_rows(p)]
    nvfp4 = [r for r in rows if "NVFP4" in r["precision"].upper()]
    rows = [r for r in rows if r not in nvfp4]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bridge.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, COLUMNS)
            w.writeheader()
            w.writerows(rows)
        original = groundtruth.bridge_rows
        with mock.patch.object(groundtruth, "bridge_rows", lambda p=None: original(path)):
            runs, skipped = groundtruth.bridge_runs(newest_only=not args.all_releases)
    report = validate_runs(runs)
    by = defaultdict(list)
    problems = [c for c in report.checks if c.problem]
    for c in report.checks:
        if not c.problem:
            by[getattr(c.run.model, "name", c.run.model)].append(c)   # a spec: w/o MTP
    dropping = len([s for s in skipped if "token-dropping" in s])
    unmodelled = len([s for s in skipped if "no plan field models" in s])
    unknown = len([s for s in skipped if "superseded" not in s]) - dropping - unmodelled
    print(f"{len(rows) + len(nvfp4)} pre-training rows: {len(nvfp4)} NVFP4, {dropping} "
          f"token-dropping and {unmodelled} of recipes no plan field models "
          f"(groundtruth.BRIDGE_UNMODELLED_RECIPES) skipped, {unknown} without a preset "
          f"system or model or unreadable, "
          f"{len(problems)} not expressible as a plan here, "
          f"{len(report.checks) - len(problems)} priced")
    print("\n| model | runs | MAPE | worst | predicted not to fit |\n|---|---|---|---|---|")
    for model, checks in sorted(by.items()):
        worst = max(checks, key=lambda c: abs(c.error))
        print(f"| {model} | {len(checks)} | "
              f"{100 * sum(abs(c.error) for c in checks) / len(checks):.1f} % | "
              f"{100 * worst.error:+.1f} % ({worst.run.name.split()[1]}, {worst.run.cluster}, "
              f"{worst.run.plan.precision}) | {sum(c.fits is False for c in checks)} |")
    groups = defaultdict(list)
    for checks in by.values():
        for c in checks:
            groups[c.group].append(abs(c.error))
    print("\n| group | runs | MAPE |\n|---|---|---|")
    for g, errs in sorted(groups.items()):
        print(f"| {g} | {len(errs)} | {100 * sum(errs) / len(errs):.1f} % |")
    if args.rows:
        for c in sorted(report.checks, key=lambda c: c.run.name):
            p = c.run.plan
            what = c.problem or (f"{100 * c.error:+6.1f} %  fits={c.fits}")
            print(f"  {c.run.name:58s} tp{p.tp} pp{p.pp} cp{p.cp} vp{p.vp} ep{p.ep} "
                  f"mbs{p.micro_batch_size}  {what}")


if __name__ == "__main__":
    main()
