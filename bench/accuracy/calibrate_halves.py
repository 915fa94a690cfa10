"""``configurator calibrate`` on half the published runs of each (GPU, precision) group with
at least four runs (``--min-runs``; every other run), ``validate`` on the other half: test
MAPE with the preset efficiencies and with the calibration, and what was fitted.

The presets of H100 and B200 FP8 are themselves fitted on these runs (topology/gpus.py), so
the table is printed twice: from the presets, and from the kernel-literature values a user
starts from on a GPU nobody has fitted yet (:data:`LITERATURE`: FlashAttention-3/-4 and
cuBLAS microbenchmark figures).

Run: ``python -m bench.accuracy.calibrate_halves`` (about a minute on a 2-core machine).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from unittest import mock

from bench.common import bench_parser, table_head
from configurator.app.calibrate_jobs import calibrate_runs
from configurator.app.validate_jobs import run_cluster, validate_runs
from configurator.core.errors import InputError
from configurator.cost.groundtruth import published_runs
from topology import gpus

#: Efficiencies from kernel papers and GEMM microbenchmarks alone (topology/gpus.py cites
#: them): FlashAttention-3 on H100, FlashAttention-4 over cuDNN on B200, cuBLAS FP8 GEMMs.
LITERATURE = {"h100-80gb": dict(gemm_fp8=0.50, flash_attention=0.69),
              "b200-180gb": dict(gemm_fp8=0.71, flash_attention=0.59)}


def _literature_presets() -> dict:
    out = dict(gpus.GPU_PRESETS)
    for name, values in LITERATURE.items():
        spec = out[name]
        out[name] = dataclasses.replace(
            spec, efficiency=dataclasses.replace(spec.efficiency, **values))
    return out


def table(title: str, min_runs: int = 4) -> None:
    runs, _ = published_runs()
    by = defaultdict(list)
    for r in runs:
        by[(run_cluster(r).gpu.name, r.plan.precision)].append(r)
    print(f"\n{title}\n")
    print(table_head(["GPU", "precision", "train / test rows", "test MAPE before", "after",
                      "fitted"]))
    for (gpu, precision), group in by.items():
        if len(group) < min_runs:
            continue
        train, test = group[0::2], group[1::2]
        before = validate_runs(test).overall.mape
        head = f"| {gpu} | {precision} | {len(train)} / {len(test)} | {100 * before:.1f} % "
        try:
            cal, fits = calibrate_runs(train)
        except InputError:      # nothing determined: the presets stay
            print(head + f"| {100 * before:.1f} % | nothing: nothing determined |")
            continue
        if not cal.values:      # the presets kept
            print(head + f"| {100 * before:.1f} % | nothing: determined, but no better than "
                         f"the presets on the runs left out |")
            continue
        after = validate_runs(test, cal).overall.mape
        fitted = ", ".join(f"{k} {v:.3g}" for f in fits for k, v in f.parameters.items())
        print(head + f"| {100 * after:.1f} % | {fitted} |")


def main(argv=None) -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--min-runs", type=int, default=4,
                    help="groups with fewer published runs are left out (default 4)")
    args = ap.parse_args(argv)
    table("From the presets", args.min_runs)
    with mock.patch.dict(gpus.GPU_PRESETS, _literature_presets()):
        table("From the kernel-literature values " + ", ".join(
            f"{gpu} {values}" for gpu, values in LITERATURE.items()), args.min_runs)


if __name__ == "__main__":
    main()
