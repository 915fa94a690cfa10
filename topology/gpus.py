"""GPU types: dense peak rates, memory, HBM bandwidth, SM count *and* achieved efficiencies.

Everything the cost model knows about a GPU lives here, one :class:`GPUSpec` per type.

Peaks are *dense* (no 2:4 sparsity) tensor-core FLOP/s from NVIDIA's data sheets:
A100: "NVIDIA A100 Tensor Core GPU" data sheet (312 TFLOP/s BF16/FP16, 2039 GB/s HBM2e, 80GB).
H100 SXM: "NVIDIA H100 Tensor Core GPU" data sheet (989.4 TFLOP/s BF16/FP16 and 1978.9 FP8
dense, i.e. half the with-sparsity figures; 3.35 TB/s HBM3). H200 SXM: "NVIDIA H200" data
sheet (same tensor cores as H100, 141 GB HBM3e at 4.8 TB/s). H800 SXM: "NVIDIA H800 Tensor
Core GPU" data sheet (the H100 SXM's tensor cores, 80 GB HBM3 at 3.35 TB/s, 132 SMs; its
NVLink 400 GB/s, both directions, instead of 900: a cluster figure, presets.yaml).
Usable memory is what ``nvidia-smi`` reports as total: 81920 MiB (A100 80GB), 81559 MiB
(H100 80GB; H800 80GB taken the same, one HBM3 part), 143771 MiB (H200). SMs: A100 108, H100/H200 SXM 132 (the data sheets).

Blackwell. NVIDIA prints these peaks *with sparsity*; the figures below are those halved
(the data sheets' footnote: "with sparsity"; dense is one-half):

* B200 (DGX B200 / HGX B200, 1,000 W): "NVIDIA DGX B200" data sheet (72 PFLOPS FP8 and
  1,440 GB HBM3e, 64 TB/s for 8 GPUs) and the HGX B200 column of NVIDIA's "GB200 NVL72"
  specifications (per GPU: FP16/BF16 4.5 PFLOPS, FP8/FP6 9 PFLOPS, 180 GB HBM3e): dense
  2.25 PFLOP/s BF16/FP16, 4.5 PFLOP/s FP8; 8 TB/s HBM3e (64 TB/s / 8; the HGX table
  prints 7.7 TB/s). 148 SMs (CUDA ``multiProcessorCount``; Chips and Cheese, "Nvidia's
  B200": 74 of 80 SMs enabled per die, two dies). Usable memory: ``nvidia-smi`` total
  183359 MiB (the data sheet's "180 GB").
* GB200 (in GB200 NVL72, up to 1,200 W): NVIDIA "GB200 NVL72" specifications, per GPU
  FP16/BF16 5 PFLOPS and FP8/FP6 10 PFLOPS with sparsity, 186 GB HBM3e, 8 TB/s: dense
  2.5 PFLOP/s BF16/FP16, 5 PFLOP/s FP8. 152 SMs (CUDA ``multiProcessorCount`` reported on
  GB200). Usable memory: ``nvidia-smi`` total 189471 MiB (the data sheet's "186 GB").
* GB300 (Blackwell Ultra in GB300 NVL72, up to 1,400 W): NVIDIA "GB300 NVL72"
  specifications, 72 GPUs: FP8/FP6 720 PFLOPS and FP16/BF16 360 PFLOPS with sparsity, i.e.
  per GPU dense 5 PFLOP/s FP8 and 2.5 PFLOP/s BF16/FP16; up to 288 GB HBM3e per GPU at
  8 TB/s and 160 SMs (NVIDIA technical blog "Inside NVIDIA Blackwell Ultra: The Chip
  Powering the AI Factory Era", 2025). Usable memory: ``nvidia-smi`` total 284208 MiB.
* B300 (Blackwell Ultra in DGX B300 / HGX B300, 1,100 W): the HGX B300 column of NVIDIA's
  HGX specifications, per GPU FP16/BF16 4.5 PFLOPS and FP8 9 PFLOPS with sparsity, 288 GB
  HBM3e at 8 TB/s: dense 2.25 PFLOP/s BF16/FP16, 4.5 PFLOP/s FP8. The DGX B300 part
  ("NVIDIA B300 SXM6 AC", compute capability 10.3) reports 148 SMs
  (``multiProcessorCount``) and an ``nvidia-smi`` total of 275040 MiB (a B300 SXM6 AC
  characterisation, 2026; AWS p6-b300 lists 275 GB per GPU). Its efficiencies are GB300's
  (the same Blackwell Ultra SM and its doubled exponential rate).
* ``mxfp8``: MXFP8 (OCP microscaling, one E8M0 scale per 32 FP8 elements) is executed by
  Blackwell's fifth-generation tensor cores at the FP8 rate (NVIDIA technical blog
  "Boosting Matrix Multiplication Speed and Flexibility with NVIDIA cuBLAS 12.9":
  block-scaled FP8 matmuls on Blackwell), so its peak equals the FP8 one; Hopper and Ampere
  have no such rate (Megatron-LM core_v0.16.1 ``TransformerConfig.fp8_recipe``: "'mxfp8' for
  Blackwell architecture only").

Efficiencies (:class:`Efficiency`), one set per GPU type and precision, each with its source:

* ``gemm``: fraction of dense 16-bit peak a large, well-shaped GEMM attains. A100:
  run-fitted (below) from FlashAttention-2's "optimised GEMMs reach 80-90 %" (0.80 × the
  GEMM factor: 0.70). H100/H200: cuBLAS BF16 GEMM at large square sizes reaches ≈ 700–750 of
  989 TFLOP/s (NVIDIA "H100 Tensor Core GPU Architecture" whitepaper and Transformer Engine
  benchmarks), i.e. ≈ 0.72; with :data:`configurator.cost.gemm.GEMM_FIXED_S` the 110
  BF16 GEMMs ``bench/kernels/gemm_shapes.py`` timed on an H100 and an H200 (torch 2.11) fit
  0.714, and with the loops of 16 expert GEMMs that tell the fixed time from the launch 0.71.
  B200 and GB200 (sm_100): run-fitted (below) from OpenXLA's measured matmul table for
  sm_100 (``xla/backends/gpu/cost_model/matmul_interpolator_data.h``, 2025), 1.417 PFLOP/s
  for a 4096³ BF16 GEMM, 0.63 of 2.25 PFLOP/s: the large square GEMM alone, as the FP8
  figures below (0.63 × the GEMM factor: 0.55). GB300 (sm_103): run-fitted from a cuBLASLt
  BF16 burn-in (brrr, luccabb/brrr README, cuBLASLt 13.8 on 4 GB300) that sustains
  1716–1763 TFLOP/s, 0.69–0.71 of 2.5 PFLOP/s: 0.70 × the GEMM factor, 0.62 (B300 the
  same). (A hand-set 0.73 for sm_100 and 0.70 for sm_103, kernel figures without the
  factor, priced every Blackwell BF16 run of Megatron-Bridge but one too fast, by 10.7 %
  on average.)
* ``gemm_fp8``: the same for FP8 GEMMs against the FP8 peak; ``None`` for a GPU without
  FP8 tensor cores (A100). H100/H200: the FP8 weight gradients ``bench/kernels/gemm_shapes.py``
  timed on an H100 and an H200 fit 0.66 with the fixed cost. Blackwell: run-fitted (below)
  from OpenXLA's sm_100 table (4096³ E4M3: 2.765–2.785 of 4.5 PFLOP/s, 0.617 × the GEMM
  factor: 0.54), the same for B300/GB300 (the same tensor cores).
* ``gemm_mxfp8``: the same for MXFP8 GEMMs against the MXFP8 peak; ``None`` for a GPU
  without an MXFP8 rate. Block-scaled and per-tensor-scaled FP8 run the same tensor-core
  instruction (NVIDIA's cuBLAS 12.9 blog above), so it is ``gemm_fp8``'s, run-fitted the
  same way; MXFP8 trains a little slower by the block scales its casts write
  (:data:`configurator.cost.gemm.FP8_SCALE_BYTES`).
* ``hbm``: fraction of HBM bandwidth that memory-bound element-wise kernels attain: A100
  80GB ≈ 1.7 of 2.04 TB/s, H100 ≈ 2.9 of 3.35 TB/s, H200 ≈ 4.1 of 4.8 TB/s (BabelStream
  Triad results reported for these parts). Blackwell (8 TB/s HBM3e): a streaming MXFP8
  quantiser (read BF16, write FP8 and scales) moves 6+ TB/s on B200 (fal.ai, "Chasing
  6+ TB/s: an MXFP8 quantizer on Blackwell", 2026): 0.75.
* ``flash_attention``: fraction of the dense 16-bit peak fused attention kernels attain on
  long sequences (forward; backward does 2.5× the forward FLOPs at the same rate); the
  fraction at ``s`` keys is ``flash_attention · s / (s + 1024)`` for causal calls and
  ``flash_attention · s / (s + 384)`` for unmasked ones (context parallelism's ring steps
  after the first) (:func:`configurator.cost.compute.flash_efficiency`; the causal shape
  from FlashAttention-3, Shah et al. 2024, Fig. 5, the unmasked one measured with
  ``bench/kernels/attention_masks.py``). Run-fitted (below) on every GPU from its kernel's figure:
  cuDNN's on an H200 (0.55, H100 and H200), FlashAttention-4's forward on B200 (0.71,
  B200 and GB200), twice that for Blackwell Ultra, which doubles the SFU throughput of the
  exponential that bounds softmax in attention on Blackwell ("2x attention-layer
  acceleration", NVIDIA "Inside NVIDIA Blackwell Ultra", 2025; FlashAttention-4 §3), capped
  at the peak. A100: FlashAttention-2 reaches 50–73 % (Dao 2023, §4.1), ≈ 0.62 at 16k
  causal: 0.64 (no published long-context A100 run to check it on).
* ``kernel_overhead_s``: launch and tail per kernel (≈ 4 µs on CUDA 11/12, Nsight traces;
  Blackwell kept at 4 µs, same launch path).
* ``host_op_s``: host (CPU) time to issue one PyTorch operation of a training step in eager
  mode: Python, autograd and dispatcher work before the kernel launch; run-fitted (below)
  from PyTorch's eager dispatch with autograd, about 3–10 µs of CPU time per operation on a
  current x86 host (:data:`EAGER_DISPATCH_US`; the middle, 6.5 µs, × the host factor: 22.1
  µs), the same on every GPU. Used only where a layer's kernels are shorter than issuing
  them (:func:`configurator.cost.host_ops.host_layer_s`).

Fitted on published runs (:data:`RUN_FITTED`, :data:`IN_TRAINING`). A training step
attains less of a GEMM's, a fused attention kernel's and the host's figures than the kernel
or the dispatch does alone (thinner GEMMs and clocks under a full node's power; the
attention kernels Transformer Engine runs inside Megatron; the host's mix of operations):
one factor per kind of figure, the same on every GPU, scales each run-fitted efficiency's
microbenchmark figure (:func:`run_fitted`). The three factors are fitted together, by least
squares on the log time with every published source weighted alike, on the published runs
(``configurator validate --by-source``, "in sample": SC'21 Table 1, Korthikanti et al.
Table 5, Megatron-LM's H100 table, NeMo's long-context and performance-summary tables,
Megatron-Bridge's newest release of each recipe): GEMM 0.88, attention 0.60, host 3.40 (a
training step's operation takes longer to issue than the bare dispatch: megatron-core's own
layer issues a forward operation at 3.1-3.4 times the bare dispatch's time on the same CPU,
``python -m bench.kernels.host_layer``). Leaving one source out at a time moves them by at
most 0.01, 0.01 and 0.09 and, where Megatron-Bridge (whose MoE rows at micro-batch 1 are the
only host-bound ones) is left out, the host's to the bottom of its range (0.156: the
other sources want no host floor; ``configurator.app.calibrate_jobs.fit_factors``). Those
NeMo long-context TFLOP/s count the attention scores over all ``s²`` pairs
(NeMo's ``flops_formulas`` before commit 6251117, "Discount FLOPs in dot-product att",
2025-08-09: NeMo 24.07's Llama-2 7B row, 16,634 tokens/s/GPU at 767 TFLOP/s, is 4.611e10
FLOP per token, the full-score count 4.608e10, not the causal 4.286e10).

A GPU not in :data:`GPU_PRESETS` is given in the cluster file with all of these figures
(:func:`gpu_from_config`); there is no fallback to another GPU's numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.plan_values import PRECISION
from configurator.core.units import GB, GiB, MiB, TFLOP, US

@dataclass(frozen=True)
class Prior:
    """A run-fitted efficiency's value before any end-to-end run was fitted: ``value`` (a
    fraction of a peak, which a multiple of another GPU's figure may exceed before the factor
    applies, or microseconds for ``host_op_us``), where it comes from (a kernel
    microbenchmark or a paper) and its ``kind``, the :data:`IN_TRAINING` factor that turns
    it into the preset."""

    value: float
    source: str
    kind: str


_FA4 = "FlashAttention-4 forward on B200, 0.71 of the dense BF16 peak"
_CUDNN_H200 = ("cuDNN fused attention on an H200 (bench/kernels/attention_masks.py, "
               "tests/data/attention_masks.csv): 608.9 forward and 524.1 backward TFLOP/s at "
               "64k causal keys, 0.55 of 989 TFLOP/s with the backward's 2.5x work")
#: CPU time to issue one eager PyTorch operation on a current x86 host (µs), low and high:
#: "about 3-10 us" (PyTorch's Performance Tuning Guide; Lumos, MLSys 2025, per-kernel CPU
#: launch gaps). ``configurator profile``'s own loop (``configurator.profiler.host_ops``) on
#: a CPU device, which pays no CUDA launch, takes 3.4 µs (AMD EPYC, torch 2.13.0+cpu;
#: ``python -m bench.kernels.host_dispatch``), the range's low end.
EAGER_DISPATCH_US = (3.0, 10.0)
_EAGER = (f"PyTorch eager dispatch with autograd, about {EAGER_DISPATCH_US[0]:g}-"
          f"{EAGER_DISPATCH_US[1]:g} us of CPU time per operation on a current x86 host "
          f"(PyTorch's Performance Tuning Guide; Lumos, MLSys 2025): the middle, "
          f"{sum(EAGER_DISPATCH_US) / 2:g} us")
_XLA_SM100 = "OpenXLA sm_100 matmul table, 4096^3 E4M3: 2.78 of 4.5 PFLOP/s"
_XLA_SM100_BF16 = "OpenXLA sm_100 matmul table, 4096^3 BF16: 1.417 of 2.25 PFLOP/s"
_BRRR_GB300 = ("cuBLASLt BF16 burn-in on 4 GB300 (luccabb/brrr README, cuBLASLt 13.8): "
               "1716-1763 of 2500 TFLOP/s")
#: FP8 and MXFP8 GEMMs on sm_100 and sm_103 alike (the same tensor cores).
_SM100_FP8 = {"gemm_fp8": Prior(0.617, _XLA_SM100, "gemm"),
              "gemm_mxfp8": Prior(0.617, _XLA_SM100 + " (block scaling runs the same "
                                                       "instruction)", "gemm")}
#: The presets' efficiencies that rest on published end-to-end runs, each with its value
#: before any run (a microbenchmark's or a paper's figure of the kernel alone): the preset
#: is that value times the :data:`IN_TRAINING` factor of its kind (:func:`run_fitted`).
#: ``configurator validate --by-source`` fits the factors again without the source it
#: predicts. Every other efficiency comes from a microbenchmark or a paper.
RUN_FITTED: dict[str, dict[str, Prior]] = {
    "a100-80gb": {"gemm": Prior(0.80, "FlashAttention-2 (Dao 2023, §1): optimised GEMMs "
                                      "reach 80-90 % of the A100's peak", "gemm")},
    **{g: {"flash_attention": Prior(0.55, _CUDNN_H200, "attention")}
       for g in ("h100-80gb", "h200-141gb")},
    **{g: {"gemm": Prior(0.63, _XLA_SM100_BF16, "gemm"), **_SM100_FP8,
           "flash_attention": Prior(0.71, _FA4, "attention")}
       for g in ("b200-180gb", "gb200-186gb")},
    **{g: {"gemm": Prior(0.70, _BRRR_GB300, "gemm"), **_SM100_FP8,
           "flash_attention": Prior(1.42, "twice B200's figure (" + _FA4 + "): Blackwell "
                                    "Ultra runs the exponential that bounds it at twice the "
                                    "rate (NVIDIA 'Inside NVIDIA Blackwell Ultra', 2025)",
                                    "attention")}
       for g in ("b300-288gb", "gb300-288gb")},
}
#: The host's time per operation (:data:`HOST_OP_S`) before any run, shared by every GPU.
HOST_OP_PRIOR = Prior(sum(EAGER_DISPATCH_US) / 2, _EAGER, "host")
#: What a training step attains of the figure its kernel reaches alone, one factor per kind
#: of figure and the same on every GPU: ``gemm`` (a large square GEMM's fraction of the peak
#: against the GEMMs of a training step: thinner shapes, clocks under a full node's power),
#: ``attention`` (a fused-attention microbenchmark against Transformer Engine's attention in
#: training) and ``host`` (eager dispatch per operation against a training step's).
#: Fitted together on every published run (``configurator validate --by-source``, "in
#: sample"; leave one source out, each source is predicted from the others' fit).
IN_TRAINING = {"gemm": 0.88, "attention": 0.60, "host": 3.40}


def host_op_in_training_us(dispatch_us: float, factors=None) -> float:
    """Host time per operation of a training step (µs) from the eager dispatch time of one
    operation (µs: :data:`HOST_OP_PRIOR`, or what ``configurator profile`` measures on the
    user's host): times the ``host`` factor of ``factors`` (default :data:`IN_TRAINING`)."""
    factors = IN_TRAINING if factors is None else factors
    return dispatch_us * factors["host"]


def run_fitted(gpu: str, name: str, factors=None) -> float:
    """The preset value of a :data:`RUN_FITTED` efficiency (``host_op_us``:
    :data:`HOST_OP_PRIOR`): its prior times the factor of its kind in ``factors`` (default
    :data:`IN_TRAINING`), a fraction capped at 1."""
    factors = IN_TRAINING if factors is None else factors
    if name == "host_op_us":
        return host_op_in_training_us(HOST_OP_PRIOR.value, factors)
    prior = RUN_FITTED[gpu][name]
    return min(1.0, prior.value * factors[prior.kind])


#: Why a GPU may lack a precision's tensor-core rate (appended to :meth:`GPUSpec.peak`'s error).
_RATE_NOTES = {"fp8": "FP8 tensor cores start with Hopper",
               "mxfp8": "mxfp8 on Blackwell only (B200, B300, GB200, GB300): MXFP8 block scaling "
                        "runs on fifth-generation tensor cores"}


#: Host time per PyTorch operation of a training step in eager mode (s): see the module
#: docstring, ``host_op_s``.
HOST_OP_S = run_fitted("", "host_op_us") * US


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Achieved fractions of a GPU's peaks (see the module docstring for each source).
    ``gemm_fp8`` / ``gemm_mxfp8``: None where the GPU has no such rate."""

    gemm: float
    gemm_fp8: float | None
    gemm_mxfp8: float | None = None
    hbm: float
    flash_attention: float
    kernel_overhead_s: float
    host_op_s: float = HOST_OP_S
    source: str


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU type. ``peak_flops_per_s`` maps precision → dense FLOP/s (``fp8``, ``mxfp8``
    may be absent); ``memory_bytes`` usable HBM; ``hbm_bandwidth_Bps`` bytes/s; ``num_sms``
    streaming multiprocessors (per-SM rates of eager kernels, attention dropout, SMs taken by
    overlapped communication); ``non_tn_fp8_gemm``: FP8 GEMMs run in
    any operand layout, so Transformer Engine keeps no FP8 transpose of a weight and writes
    none when it quantises a tensor-scaled input (:func:`configurator.cost.gemm.fp8_cast_bytes`)
    (``transformer_engine/pytorch/utils.py`` ``is_non_tn_fp8_gemm_supported``: compute
    capability 10.x or 13+, i.e. B200, B300, GB200, GB300; Hopper runs TN only);
    ``host_link_Bps``: bytes/s each way between the GPU and host memory, what offloaded
    activations cross (:data:`PCIE5_X16_BPS`, :data:`NVLINK_C2C_BPS`); ``rated_power_W``: the
    GPU's rated board power (TDP, watts; :data:`RATED_POWER_W`), what the energy to train is
    priced from, or None where unknown."""

    name: str
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    memory_bytes: float
    hbm_bandwidth_Bps: float
    num_sms: int
    efficiency: Efficiency
    non_tn_fp8_gemm: bool = False
    host_link_Bps: float = 64 * GB
    rated_power_W: float | None = None

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``; InputError if the GPU has no such rate."""
        rate = self.peak_flops_per_s.get(precision)
        if not rate:
            note = f"; {_RATE_NOTES[precision]}" if precision in _RATE_NOTES else ""
            raise InputError("precision", precision,
                             f"GPU {self.name} has no {precision} tensor-core rate "
                             f"(has: {', '.join(k for k, r in self.peak_flops_per_s.items() if r)})"
                             + note)
        return rate

    def gemm_rate(self, precision: str) -> tuple[float, float]:
        """``(peak FLOP/s, attained fraction)`` of a large GEMM of a plan in ``precision``:
        fp8 and mxfp8 GEMMs run at their own peak and efficiency, bf16/fp16 at the 16-bit
        ones. InputError (from :meth:`peak`) if the GPU has no such rate."""
        peak = self.peak(precision)
        eff = self.efficiency
        fraction = {"fp8": eff.gemm_fp8, "mxfp8": eff.gemm_mxfp8}.get(precision, eff.gemm)
        if fraction is None:
            raise InputError(f"gpu.efficiency.gemm_{precision}", None,
                             f"missing: GPU {self.name} has a {precision} peak")
        return peak, fraction


_LITERATURE = "literature (see topology/gpus.py)"
# Blackwell efficiencies (module docstring): sm_100 GEMM fractions from OpenXLA's measured
# matmul table, GB300's BF16 one from a cuBLASLt burn-in, and fused attention from
# FlashAttention-4 (GB300's doubled), each times the in-training factor; HBM from a
# streaming kernel on B200.
_RUN_FITTED = "x the in-training factor fitted on the published runs"
_BLACKWELL = ("gemm (OpenXLA's 4096^3 BF16), gemm_fp8, gemm_mxfp8 (OpenXLA's 4096^3 E4M3) and "
              "flash_attention (FlashAttention-4) " + _RUN_FITTED + "; fal.ai B200 streaming "
              "(see topology/gpus.py)")
_BLACKWELL_ULTRA = ("gemm (brrr cuBLASLt BF16 burn-in on GB300), FP8 and MXFP8 as B200, "
                    "flash_attention twice B200's kernel figure (doubled SFU exponential) "
                    + _RUN_FITTED + "; fal.ai B200 streaming (see topology/gpus.py)")
_HOPPER = ("gemm, gemm_fp8 (bench/kernels/gemm_shapes.py) and hbm " + _LITERATURE + "; "
           "flash_attention (cuDNN on an H200) " + _RUN_FITTED)

def _blackwell_peaks(bf16_tflops: float) -> dict[str, float]:
    """Dense peaks of a Blackwell GPU from its dense BF16 TFLOP/s: FP16 the same, FP8 and
    MXFP8 (the same tensor-core instruction) twice that."""
    return {"bf16": bf16_tflops * TFLOP, "fp16": bf16_tflops * TFLOP,
            "fp8": 2 * bf16_tflops * TFLOP, "mxfp8": 2 * bf16_tflops * TFLOP}


#: H100 (H200: the same tensor cores, its own HBM fraction).
_HOPPER_EFFICIENCY = Efficiency(gemm=0.72, gemm_fp8=0.66, hbm=0.87,
                                flash_attention=run_fitted("h100-80gb", "flash_attention"),
                                kernel_overhead_s=4e-6, source=_HOPPER)
#: sm_100 (B200, GB200): one set, the GEMM fractions shared by sm_103 below.
_BLACKWELL_EFFICIENCY = Efficiency(gemm=run_fitted("b200-180gb", "gemm"),
                                   gemm_fp8=run_fitted("b200-180gb", "gemm_fp8"),
                                   gemm_mxfp8=run_fitted("b200-180gb", "gemm_mxfp8"),
                                   hbm=0.75,
                                   flash_attention=run_fitted("b200-180gb", "flash_attention"),
                                   kernel_overhead_s=4e-6, source=_BLACKWELL)
#: sm_103 (B300, GB300): its own BF16 GEMM and doubled attention, sm_100's FP8/MXFP8 GEMMs.
_BLACKWELL_ULTRA_EFFICIENCY = dataclasses.replace(
    _BLACKWELL_EFFICIENCY, gemm=run_fitted("gb300-288gb", "gemm"),
    flash_attention=run_fitted("gb300-288gb", "flash_attention"), source=_BLACKWELL_ULTRA)

#: GPU-host links, each way: PCIe Gen4 x16 (A100: "PCIe Gen4 64 GB/s", NVIDIA A100 data
#: sheet, both ways), PCIe Gen5 x16 (H100 SXM and H200: "PCIe Gen5 128 GB/s", their data
#: sheets; HGX B200 and B300 boards), NVLink-C2C between Grace and a Blackwell GPU in GB200
#: and GB300 (900 GB/s both ways, NVIDIA GB200 NVL72 specifications).
PCIE4_X16_BPS, PCIE5_X16_BPS, NVLINK_C2C_BPS = 32 * GB, 64 * GB, 450 * GB

#: Rated board power (TDP, W) of each preset's part: A100 SXM 400 W (NVIDIA A100 data sheet),
#: H100 SXM, H800 SXM and H200 SXM "up to 700 W" (their data sheets), B200 1,000 W (HGX/DGX B200),
#: GB200 up to 1,200 W (GB200 NVL72), B300 1,100 W (HGX B300), GB300 up to 1,400 W (GB300
#: NVL72) (the Blackwell figures as in the module docstring).
RATED_POWER_W = {"a100-80gb": 400.0, "h100-80gb": 700.0, "h800-80gb": 700.0,
                 "h200-141gb": 700.0,
                 "b200-180gb": 1000.0, "gb200-186gb": 1200.0, "b300-288gb": 1100.0,
                 "gb300-288gb": 1400.0}

GPU_PRESETS: dict[str, GPUSpec] = {
    "a100-80gb": GPUSpec(
        name="a100-80gb", peak_flops_per_s={"bf16": 312 * TFLOP, "fp16": 312 * TFLOP},
        memory_bytes=81920 * MiB, hbm_bandwidth_Bps=2039 * GB, num_sms=108,
        efficiency=Efficiency(gemm=run_fitted("a100-80gb", "gemm"), gemm_fp8=None, hbm=0.83,
                              flash_attention=0.64,
                              kernel_overhead_s=4e-6,
                              source="gemm (FlashAttention-2's GEMM figure) " + _RUN_FITTED
                              + "; others " + _LITERATURE),
        host_link_Bps=PCIE4_X16_BPS),
    "h100-80gb": GPUSpec(
        name="h100-80gb", peak_flops_per_s={"bf16": 989.4 * TFLOP, "fp16": 989.4 * TFLOP,
                                            "fp8": 1978.9 * TFLOP},
        memory_bytes=81559 * MiB, hbm_bandwidth_Bps=3350 * GB, num_sms=132,
        efficiency=_HOPPER_EFFICIENCY),
    # H800 SXM: the H100 SXM's compute, memory and efficiencies (one die, one set of
    # kernels); only its NVLink differs, which the cluster preset carries.
    "h800-80gb": GPUSpec(
        name="h800-80gb", peak_flops_per_s={"bf16": 989.4 * TFLOP, "fp16": 989.4 * TFLOP,
                                            "fp8": 1978.9 * TFLOP},
        memory_bytes=81559 * MiB, hbm_bandwidth_Bps=3350 * GB, num_sms=132,
        efficiency=_HOPPER_EFFICIENCY),
    "h200-141gb": GPUSpec(
        name="h200-141gb", peak_flops_per_s={"bf16": 989.4 * TFLOP, "fp16": 989.4 * TFLOP,
                                             "fp8": 1978.9 * TFLOP},
        memory_bytes=143771 * MiB, hbm_bandwidth_Bps=4800 * GB, num_sms=132,
        efficiency=dataclasses.replace(_HOPPER_EFFICIENCY, hbm=0.85)),
    # DGX B200 data sheet / HGX B200 table: 4.5 (BF16) and 9 (FP8) PFLOPS with sparsity,
    # halved; 180 GB HBM3e at 64 TB/s per 8 GPUs; nvidia-smi 183359 MiB; 148 SMs.
    "b200-180gb": GPUSpec(
        name="b200-180gb", peak_flops_per_s=_blackwell_peaks(2250),
        memory_bytes=183359 * MiB, hbm_bandwidth_Bps=8000 * GB, num_sms=148,
        efficiency=_BLACKWELL_EFFICIENCY, non_tn_fp8_gemm=True),
    # GB200 NVL72 specifications, per GPU: 5 (BF16) and 10 (FP8) PFLOPS with sparsity,
    # halved; 186 GB HBM3e at 8 TB/s; nvidia-smi 189471 MiB; 152 SMs.
    "gb200-186gb": GPUSpec(
        name="gb200-186gb", peak_flops_per_s=_blackwell_peaks(2500),
        memory_bytes=189471 * MiB, hbm_bandwidth_Bps=8000 * GB, num_sms=152,
        efficiency=_BLACKWELL_EFFICIENCY, non_tn_fp8_gemm=True,
        host_link_Bps=NVLINK_C2C_BPS),
    # HGX B300: 4.5 (BF16) and 9 (FP8) PFLOPS with sparsity per GPU, halved; 288 GB HBM3e at
    # 8 TB/s; DGX B300's "B300 SXM6 AC": 275040 MiB, 148 SMs (module docstring).
    "b300-288gb": GPUSpec(
        name="b300-288gb", peak_flops_per_s=_blackwell_peaks(2250),
        memory_bytes=275040 * MiB, hbm_bandwidth_Bps=8000 * GB, num_sms=148,
        efficiency=_BLACKWELL_ULTRA_EFFICIENCY, non_tn_fp8_gemm=True),
    # GB300 NVL72 specifications: 360 (BF16) and 720 (FP8) PFLOPS with sparsity per 72 GPUs,
    # halved; 288 GB HBM3e at 8 TB/s and 160 SMs ("Inside NVIDIA Blackwell Ultra");
    # nvidia-smi 284208 MiB.
    "gb300-288gb": GPUSpec(
        name="gb300-288gb", peak_flops_per_s=_blackwell_peaks(2500),
        memory_bytes=284208 * MiB, hbm_bandwidth_Bps=8000 * GB, num_sms=160,
        efficiency=_BLACKWELL_ULTRA_EFFICIENCY, non_tn_fp8_gemm=True,
        host_link_Bps=NVLINK_C2C_BPS),
}

GPU_PRESETS = {name: dataclasses.replace(g, rated_power_W=RATED_POWER_W[name])
               for name, g in GPU_PRESETS.items()}

GPU_KEYS_REQUIRED = ("name", "peak_tflops", "memory_GiB", "hbm_bandwidth_GBps", "num_sms",
                     "efficiency")
GPU_KEYS_OPTIONAL = ("non_tn_fp8_gemm", "host_link_bandwidth_GBps", "rated_power_W")
EFFICIENCY_KEYS_REQUIRED = ("gemm", "hbm", "flash_attention")
EFFICIENCY_KEYS_OPTIONAL = ("gemm_fp8", "gemm_mxfp8", "kernel_overhead_us", "host_op_us",
                            "source")


def _fraction(field_name: str, value: Any) -> float:
    return v.efficiency(field_name, value)


def efficiency_from_config(data: Any, precisions: Any = ()) -> Efficiency:
    """Efficiencies of a GPU given in a cluster file: ``gemm, hbm, flash_attention`` (fractions
    in (0, 1]), ``gemm_fp8`` / ``gemm_mxfp8`` (required when ``precisions``, the GPU's peak
    rates, include fp8 / mxfp8; ignored otherwise), optional ``kernel_overhead_us``
    (default 4) and ``source`` (where the figures come from)."""
    v.exact_keys("gpu.efficiency", data, EFFICIENCY_KEYS_REQUIRED, EFFICIENCY_KEYS_OPTIONAL)
    low = {}
    for prec in ("fp8", "mxfp8"):
        key = f"gemm_{prec}"
        if prec in precisions and key not in data:
            raise InputError(f"gpu.efficiency.{key}", None,
                             f"missing: required when peak_tflops has {prec}")
        low[key] = _fraction(f"gpu.efficiency.{key}", data[key]) if prec in precisions else None
    source = v.display_name("gpu.efficiency.source", data.get("source", "cluster file"))
    micros = {}
    for key, default in (("kernel_overhead_us", 4.0), ("host_op_us", HOST_OP_S / US)):
        val = data.get(key, default)
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not (
                0 <= val <= 1000):
            raise InputError(f"gpu.efficiency.{key}", val,
                             "must be a number of microseconds in [0, 1000]")
        micros[key] = float(val) * US
    return Efficiency(
        gemm=_fraction("gpu.efficiency.gemm", data["gemm"]), **low,
        hbm=_fraction("gpu.efficiency.hbm", data["hbm"]),
        flash_attention=_fraction("gpu.efficiency.flash_attention", data["flash_attention"]),
        kernel_overhead_s=micros["kernel_overhead_us"], host_op_s=micros["host_op_us"],
        source=source)


def gpu_from_config(data: Any) -> GPUSpec:
    """A GPU from a preset name or a mapping with every figure the cost model needs:
    ``name, peak_tflops: {bf16, fp16, fp8, mxfp8}, memory_GiB, hbm_bandwidth_GBps, num_sms,
    efficiency: {gemm, gemm_fp8, gemm_mxfp8, hbm, flash_attention, kernel_overhead_us,
    source}`` and optionally ``non_tn_fp8_gemm`` (default false) and
    ``host_link_bandwidth_GBps`` (default PCIe Gen5 x16's 64) (units at the edge:
    TFLOP/s, GiB, GB/s, µs). Raises :class:`InputError`
    naming the field; an unknown preset name (compared in any case) names the closest
    presets and says how to describe a new GPU."""
    if isinstance(data, str):
        preset = v.preset_name(data, GPU_PRESETS)
        if preset is None:
            raise InputError("gpu", data, "unknown GPU preset" + (
                v.did_you_mean(data, GPU_PRESETS) or "; known: " + ", ".join(GPU_PRESETS))
                + "; or describe the GPU as a mapping with " + ", ".join(GPU_KEYS_REQUIRED))
        return GPU_PRESETS[preset]
    v.exact_keys("gpu", data, GPU_KEYS_REQUIRED, GPU_KEYS_OPTIONAL)
    peaks = data["peak_tflops"]
    if not isinstance(peaks, Mapping) or not peaks:
        raise InputError("gpu.peak_tflops", peaks, "must map precision ("
                         + ", ".join(PRECISION) + ") to TFLOP/s")
    rates = {}
    for prec, val in peaks.items():
        if prec not in PRECISION:
            raise InputError(f"gpu.peak_tflops.{prec}", val,
                             f"unknown precision; allowed: {', '.join(PRECISION)}")
        rates[prec] = v.float_in_range(f"gpu.peak_tflops.{prec}", val, key="gpu.peak_tflops") * TFLOP
    name = v.display_name("gpu.name", data["name"])
    return GPUSpec(name=name, peak_flops_per_s=rates,
                   memory_bytes=v.float_in_range("gpu.memory_GiB", data["memory_GiB"]) * GiB,
                   hbm_bandwidth_Bps=v.float_in_range("gpu.hbm_bandwidth_GBps",
                                                      data["hbm_bandwidth_GBps"]) * GB,
                   num_sms=v.int_in_range("gpu.num_sms", data["num_sms"]),
                   efficiency=efficiency_from_config(data["efficiency"], rates),
                   non_tn_fp8_gemm=v.boolean("gpu.non_tn_fp8_gemm",
                                             data.get("non_tn_fp8_gemm", False)),
                   host_link_Bps=v.float_in_range(
                       "gpu.host_link_bandwidth_GBps",
                       data.get("host_link_bandwidth_GBps", PCIE5_X16_BPS / GB),
                       key="gpu.hbm_bandwidth_GBps") * GB,
                   rated_power_W=None if data.get("rated_power_W") is None else
                   v.float_in_range("gpu.rated_power_W", data["rated_power_W"],
                                    key="gpu.rated_power_W"))


#: CUDA device-name words → GPU preset, first match wins (GB200 before B200, GB300 before
#: B300). PCIe and NVL boards run at other clocks than the presets' SXM parts: no guess
#: for them.
GPU_NAME_PRESETS = (("GB300", "gb300-288gb"), ("GB200", "gb200-186gb"),
                    ("B300", "b300-288gb"), ("B200", "b200-180gb"), ("H200", "h200-141gb"),
                    ("H100", "h100-80gb"), ("H800", "h800-80gb"), ("A100", "a100-80gb"))
_NO_GUESS_WORDS = ("PCIE", "NVL")


def guess_gpu_preset(device_name: str) -> str | None:
    """The GPU preset of a CUDA device name (``"NVIDIA H100 80GB HBM3"`` → ``h100-80gb``),
    or None when no preset describes it."""
    name = device_name.upper()
    if any(w in name for w in _NO_GUESS_WORDS):
        return None
    for word, preset in GPU_NAME_PRESETS:
        if word in name:
            return preset
    return None
