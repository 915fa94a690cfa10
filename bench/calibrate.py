"""Fit the A100 GEMM efficiency once, on all ten rows of SC'21 Table 1 together.

Prints the fitted value and each row's error. The fitted number is written by hand into
topology/gpus.py (``GPU_PRESETS["a100-80gb"].efficiency.gemm``); every other parameter comes
from the literature. Run: ``python bench/calibrate.py``.
"""

from __future__ import annotations

import dataclasses
import math
from unittest import mock

from scipy.optimize import minimize_scalar

from configurator.search.evaluate import evaluate_plan
from configurator.cost.groundtruth import sc21_rows
from topology import gpus
from topology.cluster import load_cluster


def errors(gemm: float) -> list[float]:
    a100 = gpus.GPU_PRESETS["a100-80gb"]
    gpu = dataclasses.replace(a100, efficiency=dataclasses.replace(a100.efficiency, gemm=gemm))
    out = []
    with mock.patch.dict(gpus.GPU_PRESETS, {"a100-80gb": gpu}):
        for row in sc21_rows():
            cluster = load_cluster("dgx-a100-80gb", nodes=row.num_gpus // 8)
            t = evaluate_plan(row.model, cluster, row.plan).iteration_time_s
            out.append(math.log(t / row.published_iteration_time_s))
    return out


def main() -> None:
    res = minimize_scalar(lambda g: sum(e * e for e in errors(g)), bounds=(0.3, 1.0),
                          method="bounded")
    print(f"fitted A100 gemm efficiency: {res.x:.3f}")
    for row, e in zip(sc21_rows(), errors(res.x)):
        print(f"  {row.model.name:11s} error {100 * (math.exp(e) - 1):+5.1f} %")


if __name__ == "__main__":
    main()
