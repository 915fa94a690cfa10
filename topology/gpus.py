"""GPU types: dense peak rates, memory, HBM bandwidth, SM count *and* achieved efficiencies.

Everything the cost model knows about a GPU lives here, one :class:`GPUSpec` per type.

Peaks are *dense* (no 2:4 sparsity) tensor-core FLOP/s from NVIDIA's data sheets:
A100: "NVIDIA A100 Tensor Core GPU" data sheet (312 TFLOP/s BF16/FP16, 2039 GB/s HBM2e, 80GB).
H100 SXM: "NVIDIA H100 Tensor Core GPU" data sheet (989.4 TFLOP/s BF16/FP16 and 1978.9 FP8
dense, i.e. half the with-sparsity figures; 3.35 TB/s HBM3). H200 SXM: "NVIDIA H200" data
sheet (same tensor cores as H100, 141 GB HBM3e at 4.8 TB/s).
Usable memory is what ``nvidia-smi`` reports as total: 81920 MiB (A100 80GB), 81559 MiB
(H100 80GB), 143771 MiB (H200). SMs: A100 108, H100/H200 SXM 132 (the data sheets).

Efficiencies (:class:`Efficiency`), one set per GPU type and precision, each with its source:

* ``gemm``: fraction of dense 16-bit peak a large, well-shaped GEMM attains. A100:
  calibrated once on all ten rows of Narayanan et al. SC'21 Table 1 together
  (``bench/calibrate.py`` prints the fit; it is the only fitted number). H100/H200: cuBLAS
  BF16 GEMM at large square sizes reaches ≈ 700–750 of 989 TFLOP/s (NVIDIA "H100 Tensor Core
  GPU Architecture" whitepaper and Transformer Engine benchmarks), i.e. ≈ 0.72.
* ``gemm_fp8``: the same for FP8 GEMMs against the FP8 peak (≈ 0.60 on H100/H200, same
  sources); ``None`` for a GPU without FP8 tensor cores (A100).
* ``hbm``: fraction of HBM bandwidth that memory-bound element-wise kernels attain: A100
  80GB ≈ 1.7 of 2.04 TB/s, H100 ≈ 2.9 of 3.35 TB/s, H200 ≈ 4.1 of 4.8 TB/s (BabelStream
  Triad results reported for these parts).
* ``flash_attention``: fraction of dense peak of fused attention kernels (forward;
  backward does 2.5× the forward FLOPs at the same rate): FlashAttention-2 on A100 reaches
  50–73 % (Dao 2023, §4.1); on H100, cuDNN/FA3-class kernels ≈ 50–75 % (Shah et al. 2024,
  FlashAttention-3, Fig. 5), 0.55 taken.
* ``kernel_overhead_s``: launch and tail per kernel (≈ 4 µs on CUDA 11/12, Nsight traces).

A GPU not in :data:`GPU_PRESETS` is given in the cluster file with all of these figures
(:func:`gpu_from_config`); there is no fallback to another GPU's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.units import GB, GiB, MiB, TFLOP, US

PRECISIONS = ("bf16", "fp16", "fp8")


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Achieved fractions of a GPU's peaks (see the module docstring for each source)."""

    gemm: float
    gemm_fp8: float | None
    hbm: float
    flash_attention: float
    kernel_overhead_s: float
    source: str


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU type. ``peak_flops_per_s`` maps precision → dense FLOP/s (``fp8`` may be absent);
    ``memory_bytes`` usable HBM; ``hbm_bandwidth_Bps`` bytes/s; ``num_sms`` streaming
    multiprocessors (GEMM wave quantisation)."""

    name: str
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    memory_bytes: float
    hbm_bandwidth_Bps: float
    num_sms: int
    efficiency: Efficiency

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``; InputError if the GPU has no such rate."""
        rate = self.peak_flops_per_s.get(precision)
        if not rate:
            raise InputError("precision", precision,
                             f"GPU {self.name} has no {precision} tensor-core rate "
                             f"(has: {', '.join(k for k, r in self.peak_flops_per_s.items() if r)})")
        return rate


_LITERATURE = "literature (see topology/gpus.py)"

GPU_PRESETS: dict[str, GPUSpec] = {
    "a100-80gb": GPUSpec(
        name="a100-80gb", peak_flops_per_s={"bf16": 312 * TFLOP, "fp16": 312 * TFLOP},
        memory_bytes=81920 * MiB, hbm_bandwidth_Bps=2039 * GB, num_sms=108,
        efficiency=Efficiency(gemm=0.69, gemm_fp8=None, hbm=0.83, flash_attention=0.55,
                              kernel_overhead_s=4e-6,
                              source="gemm fitted on SC'21 Table 1; others " + _LITERATURE)),
    "h100-80gb": GPUSpec(
        name="h100-80gb", peak_flops_per_s={"bf16": 989.4 * TFLOP, "fp16": 989.4 * TFLOP,
                                            "fp8": 1978.9 * TFLOP},
        memory_bytes=81559 * MiB, hbm_bandwidth_Bps=3350 * GB, num_sms=132,
        efficiency=Efficiency(gemm=0.72, gemm_fp8=0.60, hbm=0.87, flash_attention=0.55,
                              kernel_overhead_s=4e-6, source=_LITERATURE)),
    "h200-141gb": GPUSpec(
        name="h200-141gb", peak_flops_per_s={"bf16": 989.4 * TFLOP, "fp16": 989.4 * TFLOP,
                                             "fp8": 1978.9 * TFLOP},
        memory_bytes=143771 * MiB, hbm_bandwidth_Bps=4800 * GB, num_sms=132,
        efficiency=Efficiency(gemm=0.72, gemm_fp8=0.60, hbm=0.85, flash_attention=0.55,
                              kernel_overhead_s=4e-6, source=_LITERATURE)),
}

GPU_KEYS_REQUIRED = ("name", "peak_tflops", "memory_GiB", "hbm_bandwidth_GBps", "num_sms",
                     "efficiency")
EFFICIENCY_KEYS_REQUIRED = ("gemm", "hbm", "flash_attention")
EFFICIENCY_KEYS_OPTIONAL = ("gemm_fp8", "kernel_overhead_us", "source")


def _fraction(field_name: str, value: Any) -> float:
    val = v.positive_float(field_name, value)
    if val > 1:
        raise InputError(field_name, value, "must be a fraction in (0, 1]")
    return val


def efficiency_from_config(data: Any, has_fp8: bool) -> Efficiency:
    """Efficiencies of a GPU given in a cluster file: ``gemm, hbm, flash_attention`` (fractions
    in (0, 1]), ``gemm_fp8`` (required when the GPU has an fp8 peak), optional
    ``kernel_overhead_us`` (default 4) and ``source`` (where the figures come from)."""
    v.exact_keys("gpu.efficiency", data, EFFICIENCY_KEYS_REQUIRED, EFFICIENCY_KEYS_OPTIONAL)
    if has_fp8 and "gemm_fp8" not in data:
        raise InputError("gpu.efficiency.gemm_fp8", None,
                         "missing: required when peak_tflops has fp8")
    source = v.display_name("gpu.efficiency.source", data.get("source", "cluster file"))
    overhead_us = data.get("kernel_overhead_us", 4.0)
    if isinstance(overhead_us, bool) or not isinstance(overhead_us, (int, float)) or not (
            0 <= overhead_us <= 1000):
        raise InputError("gpu.efficiency.kernel_overhead_us", overhead_us,
                         "must be a number of microseconds in [0, 1000]")
    return Efficiency(
        gemm=_fraction("gpu.efficiency.gemm", data["gemm"]),
        gemm_fp8=_fraction("gpu.efficiency.gemm_fp8", data["gemm_fp8"]) if has_fp8 else None,
        hbm=_fraction("gpu.efficiency.hbm", data["hbm"]),
        flash_attention=_fraction("gpu.efficiency.flash_attention", data["flash_attention"]),
        kernel_overhead_s=float(overhead_us) * US, source=source)


def gpu_from_config(data: Any) -> GPUSpec:
    """A GPU from a preset name or a mapping with every figure the cost model needs:
    ``name, peak_tflops: {bf16, fp16, fp8}, memory_GiB, hbm_bandwidth_GBps, num_sms,
    efficiency: {gemm, gemm_fp8, hbm, flash_attention, kernel_overhead_us, source}`` (units
    at the edge: TFLOP/s, GiB, GB/s, µs). Raises :class:`InputError` naming the field; an
    unknown preset name lists the known ones and says how to describe a new GPU."""
    if isinstance(data, str):
        if data not in GPU_PRESETS:
            raise InputError("gpu", data, "unknown GPU preset; known: " + ", ".join(GPU_PRESETS)
                             + "; or describe the GPU as a mapping with "
                             + ", ".join(GPU_KEYS_REQUIRED))
        return GPU_PRESETS[data]
    v.exact_keys("gpu", data, GPU_KEYS_REQUIRED, ())
    peaks = data["peak_tflops"]
    if not isinstance(peaks, Mapping) or not peaks:
        raise InputError("gpu.peak_tflops", peaks, "must map precision (bf16, fp16, fp8) to TFLOP/s")
    rates = {}
    for prec, val in peaks.items():
        if prec not in PRECISIONS:
            raise InputError(f"gpu.peak_tflops.{prec}", val,
                             f"unknown precision; allowed: {', '.join(PRECISIONS)}")
        rates[prec] = v.float_in_range(f"gpu.peak_tflops.{prec}", val, key="gpu.peak_tflops") * TFLOP
    name = v.display_name("gpu.name", data["name"])
    return GPUSpec(name=name, peak_flops_per_s=rates,
                   memory_bytes=v.float_in_range("gpu.memory_GiB", data["memory_GiB"]) * GiB,
                   hbm_bandwidth_Bps=v.float_in_range("gpu.hbm_bandwidth_GBps",
                                                      data["hbm_bandwidth_GBps"]) * GB,
                   num_sms=v.int_in_range("gpu.num_sms", data["num_sms"]),
                   efficiency=efficiency_from_config(data["efficiency"], "fp8" in rates))
