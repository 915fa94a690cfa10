"""Reproduce the GPU efficiencies that topology/gpus.py fits on published runs.

* H100 ``gemm_fp8`` and ``flash_attention``: ``configurator calibrate`` on the ten dense
  H100 FP8 runs (NeMo's nine Llama-2 7B long-context runs, Megatron-Bridge 25.11's
  Llama-3 8B run).
* B200 ``gemm_fp8`` and ``flash_attention``: on NeMo's eight Llama-3 8B long-context runs.
* Blackwell ``gemm_mxfp8``: one value for B200, GB200 and GB300 (the same tensor cores), on
  Megatron-Bridge 25.11's three dense MXFP8 runs (the ``FP8-CS (FP8-MX)`` rows), by least
  squares on the log time ratio; each run left out in turn is predicted from the other two.

The fitted numbers are written by hand into ``GPU_PRESETS``; this prints them next to the
presets' values. Run: ``python bench/preset_fits.py`` (≈ 3 s).
"""

from __future__ import annotations

import math

from scipy.optimize import minimize_scalar

from configurator.app.calibrate_jobs import calibrate_runs
from configurator.app.validate_jobs import check_run
from configurator.cost.groundtruth import published_runs
from topology.calibration import Calibration
from topology.gpus import GPU_PRESETS

BLACKWELL = ("b200-180gb", "b300-288gb", "gb200-186gb", "gb300-288gb")


def _pair(title: str, runs, gpu: str) -> None:
    _, fits = calibrate_runs(runs, ("gemm_fp8", "flash_attention"))
    f = fits[0]
    eff = GPU_PRESETS[gpu].efficiency
    print(f"{title} ({len(runs)} runs): gemm_fp8 {f.parameters['gemm_fp8']:.3f} "
          f"(preset {eff.gemm_fp8}), flash_attention {f.parameters['flash_attention']:.3f} "
          f"(preset {eff.flash_attention}); MAPE {100 * f.mape_after:.1f} %, "
          f"leave-one-out {100 * f.loo_mape:.1f} %")


def _mxfp8_errors(value: float, runs) -> list[float]:
    cal = Calibration({g: {"mxfp8": {"gemm_mxfp8": value}} for g in BLACKWELL})
    return [math.log1p(check_run(r, cal).error) for r in runs]


def _fit_mxfp8(runs) -> float:
    return minimize_scalar(lambda x: sum(e * e for e in _mxfp8_errors(x, runs)),
                           bounds=(0.2, 1.0), method="bounded").x


def main() -> None:
    runs, _ = published_runs()
    h100 = [r for r in runs if r.cluster == "dgx-h100-80gb" and r.plan.precision == "fp8"
            and ("LLAMA2" in r.name or "llama3" in r.name)]
    b200 = [r for r in runs if r.name.startswith("nemo LLAMA3-8B")]
    _pair("H100 FP8", h100, "h100-80gb")
    _pair("B200 FP8", b200, "b200-180gb")
    mx = [r for r in runs if "llama3" in r.name and r.plan.precision == "mxfp8"]
    value = _fit_mxfp8(mx)
    errs = [math.expm1(e) for e in _mxfp8_errors(value, mx)]
    loo = [math.expm1(_mxfp8_errors(_fit_mxfp8(mx[:i] + mx[i + 1:]), [r])[0])
           for i, r in enumerate(mx)]
    print(f"Blackwell MXFP8 ({len(mx)} dense runs): gemm_mxfp8 {value:.3f} "
          f"(preset {GPU_PRESETS['b200-180gb'].efficiency.gemm_mxfp8}); MAPE "
          f"{100 * sum(map(abs, errs)) / len(errs):.1f} %, leave-one-out "
          f"{100 * sum(map(abs, loo)) / len(loo):.1f} %")
    for r, e, le in zip(mx, errs, loo):
        print(f"  {r.name:45s} {100 * e:+5.1f} %  (left out {100 * le:+5.1f} %)")


if __name__ == "__main__":
    main()
