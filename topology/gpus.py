"""GPU specifications (dense peak rates, memory, HBM bandwidth).

Peak rates are *dense* (no 2:4 sparsity) tensor-core FLOP/s from NVIDIA's data sheets:
A100: "NVIDIA A100 Tensor Core GPU" data sheet (312 TFLOP/s BF16/FP16, 2039 GB/s HBM2e, 80GB).
H100 SXM: "NVIDIA H100 Tensor Core GPU" data sheet (989.4 TFLOP/s BF16/FP16 and 1978.9 FP8
dense, i.e. half the with-sparsity figures; 3.35 TB/s HBM3). H200 SXM: "NVIDIA H200" data
sheet (same tensor cores as H100, 141 GB HBM3e at 4.8 TB/s).
Usable memory is what ``nvidia-smi`` reports as total: 81920 MiB (A100 80GB), 81559 MiB
(H100 80GB), 143771 MiB (H200).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from configurator import validate as v
from configurator.errors import InputError
from configurator.units import GB, GiB, MiB, TFLOP

PRECISIONS = ("bf16", "fp16", "fp8")


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU type. ``peak_flops_per_s`` maps precision → dense FLOP/s (``fp8`` may be absent)."""

    name: str
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    memory_bytes: float
    hbm_bandwidth_Bps: float

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``; InputError if the GPU has no such rate."""
        rate = self.peak_flops_per_s.get(precision)
        if not rate:
            raise InputError("precision", precision,
                             f"GPU {self.name} has no {precision} tensor-core rate "
                             f"(has: {', '.join(k for k, r in self.peak_flops_per_s.items() if r)})")
        return rate


GPU_PRESETS: dict[str, GPUSpec] = {
    "a100-80gb": GPUSpec(name="a100-80gb",
                         peak_flops_per_s={"bf16": 312 * TFLOP, "fp16": 312 * TFLOP},
                         memory_bytes=81920 * MiB, hbm_bandwidth_Bps=2039 * GB),
    "h100-80gb": GPUSpec(name="h100-80gb",
                         peak_flops_per_s={"bf16": 989.4 * TFLOP, "fp16": 989.4 * TFLOP,
                                           "fp8": 1978.9 * TFLOP},
                         memory_bytes=81559 * MiB, hbm_bandwidth_Bps=3350 * GB),
    "h200-141gb": GPUSpec(name="h200-141gb",
                          peak_flops_per_s={"bf16": 989.4 * TFLOP, "fp16": 989.4 * TFLOP,
                                            "fp8": 1978.9 * TFLOP},
                          memory_bytes=143771 * MiB, hbm_bandwidth_Bps=4800 * GB),
}


def gpu_from_config(data: Any) -> GPUSpec:
    """A GPU from a preset name or a mapping ``name, peak_tflops: {bf16, fp16, fp8},
    memory_GiB, hbm_bandwidth_GBps`` (units at the edge: TFLOP/s, GiB, GB/s)."""
    if isinstance(data, str):
        if data not in GPU_PRESETS:
            raise InputError("gpu", data, "unknown GPU preset; known: " + ", ".join(GPU_PRESETS))
        return GPU_PRESETS[data]
    v.exact_keys("gpu", data, ("name", "peak_tflops", "memory_GiB", "hbm_bandwidth_GBps"), ())
    peaks = data["peak_tflops"]
    if not isinstance(peaks, Mapping) or not peaks:
        raise InputError("gpu.peak_tflops", peaks, "must map precision (bf16, fp16, fp8) to TFLOP/s")
    rates = {}
    for prec, val in peaks.items():
        if prec not in PRECISIONS:
            raise InputError(f"gpu.peak_tflops.{prec}", val,
                             f"unknown precision; allowed: {', '.join(PRECISIONS)}")
        rates[prec] = v.positive_float(f"gpu.peak_tflops.{prec}", val) * TFLOP
    name = data["name"]
    if not isinstance(name, str) or not name:
        raise InputError("gpu.name", name, "must be a non-empty string")
    return GPUSpec(name=name, peak_flops_per_s=rates,
                   memory_bytes=v.positive_float("gpu.memory_GiB", data["memory_GiB"]) * GiB,
                   hbm_bandwidth_Bps=v.positive_float("gpu.hbm_bandwidth_GBps",
                                                      data["hbm_bandwidth_GBps"]) * GB)
