"""Achieved-throughput parameters, one set per GPU type, and where each comes from.

* ``gemm``: fraction of dense peak a large, well-shaped GEMM attains. A100: calibrated once
  on all ten rows of Narayanan et al. SC'21 Table 1 together (``bench/calibrate.py`` prints
  the fit; it is the only fitted number). H100/H200: cuBLAS BF16 GEMM at large square sizes
  reaches ≈ 700–750 of 989 TFLOP/s (NVIDIA "H100 Tensor Core GPU Architecture" whitepaper
  and Transformer Engine benchmarks), i.e. ≈ 0.72; FP8 GEMMs reach a lower fraction of
  their doubled peak (≈ 0.60, same sources).
* ``hbm``: fraction of HBM bandwidth that memory-bound element-wise kernels attain: A100
  80GB ≈ 1.7 of 2.04 TB/s, H100 ≈ 2.9 of 3.35 TB/s, H200 ≈ 4.1 of 4.8 TB/s (BabelStream
  Triad results reported for these parts).
* ``flash_attention``: fraction of dense peak of fused attention kernels (forward;
  backward does 2.5× the forward FLOPs at the same rate): FlashAttention-2 on A100 reaches
  50–73 % (Dao 2023, §4.1); on H100, cuDNN/FA3-class kernels ≈ 50–75 % (Shah et al. 2024,
  FlashAttention-3, Fig. 5), 0.55 taken.
* ``kernel_overhead_s``: launch and tail per kernel (≈ 4 µs on CUDA 11/12, Nsight traces).
* ``num_sms`` and the 256×128 output tile set wave quantisation of GEMMs (cuBLAS' large
  tile; A100 108 SMs, H100/H200 SXM 132 SMs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    gemm: float
    gemm_fp8: float
    hbm: float
    flash_attention: float
    kernel_overhead_s: float
    num_sms: int
    source: str


EFFICIENCY: dict[str, Efficiency] = {
    "a100-80gb": Efficiency(gemm=0.69, gemm_fp8=0.80, hbm=0.83, flash_attention=0.55,
                            kernel_overhead_s=4e-6, num_sms=108,
                            source="gemm fitted on SC'21 Table 1; others from literature"),
    "h100-80gb": Efficiency(gemm=0.72, gemm_fp8=0.60, hbm=0.87, flash_attention=0.55,
                            kernel_overhead_s=4e-6, num_sms=132, source="literature"),
    "h200-141gb": Efficiency(gemm=0.72, gemm_fp8=0.60, hbm=0.85, flash_attention=0.55,
                             kernel_overhead_s=4e-6, num_sms=132, source="literature"),
}

#: Used for a GPU given in a cluster file without its own entry (H100-class figures).
DEFAULT_EFFICIENCY = Efficiency(gemm=0.72, gemm_fp8=0.60, hbm=0.85, flash_attention=0.55,
                                kernel_overhead_s=4e-6, num_sms=132,
                                source="default (H100-class literature values)")


def efficiency_for(gpu_name: str) -> Efficiency:
    return EFFICIENCY.get(gpu_name, DEFAULT_EFFICIENCY)
