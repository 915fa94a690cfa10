"""GEMM kernels of a transformer layer: the time of one (batched) GEMM by a roofline plus a
fixed cost per kernel (:func:`gemm_time_s`), the accumulation of a weight gradient into its
main gradient on top of its GEMM (:func:`main_grad_accumulation_s`) and Transformer Engine's
quantisation of an FP8 GEMM's 16-bit inputs (:func:`fp8_quantize_s`).

Used by the layer model (:mod:`configurator.cost.compute`), the mixture-of-experts MLP
(:mod:`configurator.cost.moe_compute`) and the last stage's logits GEMM
(:mod:`configurator.cost.iteration`).
"""

from __future__ import annotations

import numpy as np

from configurator.core.plan_batch import PlanBatch
from configurator.core.plan_values import fp8_copies, fp8_scaling as plan_fp8_scaling
from topology.gpus import GPUSpec


#: Fixed time of one GEMM kernel in a stream the host keeps fed (s): the pipeline's fill and
#: drain, the epilogue, the gap to the next kernel. cuBLAS's Hopper kernels (nvjet, with
#: stream-K and a choice of tiles) show no wave-quantisation steps. The GEMMs of
#: ``bench/kernels/gemm_shapes.py`` are each timed alone, CUDA events around one call on an
#: idle GPU, so every timing also holds the host's launch of that call
#: (:data:`ISOLATED_CALL_LAUNCH_S`); its loops of 16 expert GEMMs back to back
#: (``tests/data/wgrad_accumulation.csv``) hold that launch once and this fixed time 16 times,
#: which separates the two: ``t = L + n·(F/(n·peak·η) + t₀)`` fitted by relative least squares
#: to the 110 BF16 forward and weight-gradient GEMMs of ``tests/data/gemm_shapes_dense.csv``
#: (weights 896–18,432 wide over 1,024–16,384 tokens) and the 51 plain weight gradients of
#: ``wgrad_accumulation.csv`` (14 of them 16-GEMM loops) on an H100 and an H200 gives
#: η 0.71, t₀ 10.7 µs and L 11.4 µs, rms 7.0 % (the loops 7.9 %); the single GEMMs alone fit
#: η 0.714 and ``L + t₀`` 22.8 µs (the 110 alone 21.5 µs, which this figure took, rounded to
#: 22 µs, before the two were told apart). In a training step the host runs ahead of the GPU
#: and the launch hides, or, where it cannot, the host's issue time is the floor
#: (:mod:`configurator.cost.host_ops`). A wave-quantised roofline (256×128 tiles) was 12.6 %
#: rms and 14 % too fast below 0.1 TFLOP.
#: The FP8 weight gradients' single timings (25–31 µs beyond their roofline at η 0.66) hold
#: a launch of their own (``torch._scaled_mm`` and its scales) that no loop separates: the
#: same figure is taken. One figure for every GPU (not measured off Hopper).
GEMM_FIXED_S = 10.7e-6
#: The host's launch of one isolated GEMM call that a timing of it alone holds (s), and a
#: training step's GEMMs do not (:data:`GEMM_FIXED_S`, the same fit): what comparisons with
#: ``bench/kernels/gemm_shapes.py``'s timings add to a priced GEMM.
ISOLATED_CALL_LAUNCH_S = 11.4e-6


def gemm_time_s(M, N, K, *, batch, peak, gpu: GPUSpec, in_bytes, gemm_eff):
    """Time (s) of ``batch`` GEMMs of ``M×K · K×N`` on ``gpu`` in one kernel: the roofline
    (``peak`` FLOP/s at the attained fraction ``gemm_eff``, or the operands of ``in_bytes``
    and the 16-bit output at attained HBM bandwidth) plus :data:`GEMM_FIXED_S`."""
    eff = gpu.efficiency
    flops = 2.0 * M * N * K * batch
    t_compute = flops / (peak * gemm_eff)
    t_memory = batch * (in_bytes * (M * K + K * N) + 2.0 * M * N) / (
        gpu.hbm_bandwidth_Bps * eff.hbm)
    return np.maximum(t_compute, t_memory) + GEMM_FIXED_S


def grouped_gemm_time_s(M, N, K, *, batch, peak, gpu: GPUSpec, in_bytes, gemm_eff):
    """Time (s) of ``batch`` GEMMs of ``M×K · K×N`` (one per local expert) issued as one
    cuBLAS GEMM each: their roofline together (:func:`gemm_time_s` of the batch) plus
    :data:`GEMM_FIXED_S` for every GEMM after the first. Transformer Engine's grouped GEMM
    (``GroupedLinear`` → ``general_grouped_gemm`` → C++ ``nvte_multi_stream_cublas_gemm``)
    puts GEMM ``i`` on compute stream ``i % 4`` (transformer_engine/common/include/
    transformer_engine/gemm.h ``constexpr int num_streams = 4``; the grouped_gemm package behind
    Megatron's non-TE ``GroupedMLP`` the same, ``NUM_STREAM 4``); 16 such GEMMs timed one
    after another on one stream take the fixed time each (:data:`GEMM_FIXED_S`'s fit), and
    how much of it the streams overlap was not measured: none is taken (priced with one fixed
    time per stream instead, each source held out came out as close or further:
    Megatron-Bridge's rows 10.1 % against 8.7 %, NeMo's long-context rows 2.3 against 1.5 %;
    docs/accuracy.md, "A GEMM's fixed time and its launch"). Same arguments as
    :func:`gemm_time_s`; broadcasts over plans."""
    return (gemm_time_s(M, N, K, batch=batch, peak=peak, gpu=gpu, in_bytes=in_bytes,
                        gemm_eff=gemm_eff)
            + (np.asarray(batch, dtype=float) - 1.0) * GEMM_FIXED_S)


#: Reduction depth (tokens) up to which a weight-gradient GEMM's main-gradient traffic is
#: fully exposed; a deeper reduction hides the fraction ``1 − depth₀/depth`` of it under the
#: other tiles' reductions (:func:`main_grad_accumulation_s`). Fitted by relative least squares
#: to the 97 accumulated weight gradients of ``bench/kernels/gemm_shapes.py`` on an H100 and an
#: H200 (``tests/data/wgrad_accumulation.csv``: dense weights 2048–16384 wide and GPT-OSS's
#: 16 local experts, into FP32 and BF16, over 1,024–16,384 tokens), each priced as what its
#: timing holds: one call's launch (:data:`ISOLATED_CALL_LAUNCH_S`), a fixed time per GEMM
#: (:func:`grouped_gemm_time_s`), the roofline and this term: 1,383 tokens, rms 8.2 %, mean
#: −1.5 % (H100 −1.9 %, H200 −0.1 %). It was 2,048 (by eye from the time the accumulation
#: adds over its extra bytes: ≈ 1.0 at 1,024 tokens, ≈ 0.85 at 2,048, ≈ 0.55 at 4,096), which
#: read the same timings −4.2 % (rms 9.2 %) once a GEMM's launch and fixed time were told
#: apart.
ACCUMULATION_EXPOSED_TOKENS = 1400.0


def main_grad_accumulation_s(weights, c: PlanBatch, gpu: GPUSpec, tokens=None):
    """Seconds per microbatch to accumulate the gradients of ``weights`` parameters (per rank;
    broadcasts over plans) into their main gradients, on top of the weight-gradient GEMM:
    ``main_grad`` is read and written once per microbatch
    (:func:`configurator.core.plan_terms.main_grad_bytes` each way) at the attained HBM bandwidth,
    the exposed fraction ``min(1, ACCUMULATION_EXPOSED_TOKENS / tokens)`` of it for a GEMM
    that reduces over ``tokens`` rows (None: an element-wise add, all of it).

    Megatron-LM's ``--gradient-accumulation-fusion`` (on by default) runs every weight-gradient
    GEMM with ``beta = 1`` into the parameter's ``main_grad``
    (megatron/core/tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication``;
    Transformer Engine ``fuse_wgrad_accumulation``), and a parameter without it (norms, the
    embedding) is added by the DDP hook (``main_grad.add_(param.grad)``,
    megatron/core/distributed/distributed_data_parallel.py ``_make_backward_post_hook``).
    Hopper's cooperative GEMM kernels read and write an output tile after its reduction, so
    where the reduction is short the traffic adds to the GEMM's time; a long one hides part
    of it under the other tiles' reductions. Measured with ``bench/kernels/gemm_shapes.py`` (torch
    2.11, cuBLAS, H100 and H200; ``tests/data/wgrad_accumulation.csv``): 97 weight gradients
    accumulated into FP32 or BF16 (dense 2048–16384-wide weights and GPT-OSS's 16 local
    experts, over 1,024–16,384 tokens) take 16 % longer than their launch, fixed times and
    roofline on average and 1.5 % less than those plus this term (rms 8.2 %,
    :data:`ACCUMULATION_EXPOSED_TOKENS`); e.g. on the H100 GPT-OSS's 16 experts' fc1 over
    1,024 tokens each: 1.01 ms plainly, 1.16 into BF16, 1.66 into FP32. It matters where a
    weight meets few tokens per microbatch: routed experts and short microbatches.

    The fit is on the accumulated GEMM's whole time, so the term also carries what a short
    reduction costs the GEMM itself, which the roofline does not see: written plainly, a
    weight gradient over 1,024 tokens runs 1.24× its roofline for dense weights and 1.33×
    for the experts (≈ 1.0 for dense weights from 4,096 tokens on). Against the plain GEMM
    alone, the accumulation's own increment is closer to ``(2·main_grad_bytes − 2)`` bytes
    with the same exposure; priced that way, with the fill cost as its own term
    (``1 + 256/tokens``), the published runs come out no closer (README, "Main-gradient
    accumulation")."""
    exposed = 1.0 if tokens is None else np.minimum(1.0, ACCUMULATION_EXPOSED_TOKENS / tokens)
    return (2.0 * c.main_grad_bytes * weights * exposed
            / (gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm))


#: Bytes per element Transformer Engine's FP8 quantisation of a 16-bit tensor reads (its
#: 16-bit input, once) and writes per FP8 copy (1): a GEMM input is written row-wise and
#: column-wise (transposed) for the weight-gradient GEMM (``Float8Quantizer`` /
#: ``MXFP8Quantizer`` with both usages), 4 bytes in all; one copy less where a single copy
#: serves (:func:`fp8_cast_bytes`, :func:`configurator.core.plan_values.fp8_copies`).
FP8_READ_BYTES = 2.0
#: Bytes per element of one FP8 copy (row-wise or column-wise), its scales apart.
FP8_COPY_BYTES = 1.0
#: Fraction of the HBM bandwidth that quantisation kernel attains: far below element-wise
#: kernels' (``Efficiency.hbm``). Measured: Transformer Engine PR #101 (H100 SXM, 3.35 TB/s):
#: the FP16 -> FP8 cast-transpose of a 4096 x 4096 tensor in 51.5 us, 67 MB at 1.30 TB/s,
#: 0.39. Check: Transformer Engine's GEMM profiling guide (docs/examples/gemm_profiling,
#: H200 NVL, 4.8 TB/s, 2026) puts current scaling's quantisation at ~17 % of 20.3 ms per
#: layer of hidden 4096, FFN 16384 over 15,872 tokens: 1.04e9 elements of 6 bytes (its amax
#: pass reads the tensor once more) at 1.8 TB/s, 0.38 of that GPU's HBM.
FP8_CAST_HBM_FRACTION = 0.39


#: Bytes per element a quantisation reads beyond its input, by scaling: current
#: (``tensorwise``) scaling reads the tensor once more for its amax before the cast ("two
#: tensor reads per quantization", Transformer Engine docs, "FP8 Delayed Scaling"); the
#: others take their amax in the cast's own pass.
FP8_AMAX_READ_BYTES = {"delayed": 0.0, "tensorwise": 2.0, "blockwise": 0.0, "mxfp8": 0.0}
#: Bytes per element of the scales written with each FP8 copy, by scaling: a 4-byte scale per
#: block of 128 (``blockwise`` 1x128) or a 1-byte E8M0 scale per block of 32 (``mxfp8``);
#: one per tensor otherwise (nothing per element).
FP8_SCALE_BYTES = {"delayed": 0.0, "tensorwise": 0.0, "blockwise": 4 / 128, "mxfp8": 1 / 32}


#: Time of FP8 GEMMs with block scales (``blockwise``: 1x128 activation and 128x128 weight
#: blocks) over per-tensor-scaled ones at the same shapes on a GPU without block scaling in
#: its tensor cores (Hopper: no MXFP8 rate), whose kernels apply each block's scales to the
#: partial sums every 128 elements of the reduction, promoted to FP32 on the CUDA cores
#: (DeepSeek-V3 technical report, arXiv:2412.19437, §3.3.2). Transformer Engine's GEMM
#: profiling guide (docs/examples/gemm_profiling/gemm_profiling.rst, TransformerEngine
#: 1609c890e, 2026-06-01) times the 12 GEMMs of a layer of hidden 4096, FFN 16384 over 15,872
#: tokens on an H200 NVL with their quantisation: 22.882 ms with block scales, 20.285 ms with
#: current per-tensor scaling, whose GEMMs alone (inputs quantised before the timed loop) take
#: 16.785 ms, so its quantisation 3.500 ms; Hopper's cuBLAS has no pre-quantised block-scaled
#: path to time. Taking the block scales' quantisation as the model prices it against current
#: scaling's on Hopper (:func:`fp8_cast_bytes`, two copies: 4.0625 bytes an element against
#: 6, of the measured 3.500 ms: 2.370 ms), the block-scaled GEMMs take 20.512 ms, 1.222 times
#: the per-tensor ones (1.155 with their quantisation as long as current scaling's, 1.363
#: with none). On Blackwell block-scaled FP8 runs on the tensor cores' block-scaled
#: instruction ("On Blackwell (SM100+), FP8 Block is emulated via MXFP8", the same guide),
#: priced as MXFP8's GEMMs are (:func:`fp8_gemm_efficiency`).
def _cast_bytes(scaling: str, non_tn_fp8_gemm: bool, columnwise: bool = True) -> float:
    """:func:`fp8_cast_bytes` for a GPU whose FP8 GEMMs do (``non_tn_fp8_gemm``) or do not
    take any operand layout."""
    copies = fp8_copies(scaling, non_tn_fp8_gemm, columnwise)
    return (FP8_READ_BYTES + FP8_AMAX_READ_BYTES[scaling]
            + copies * (FP8_COPY_BYTES + FP8_SCALE_BYTES[scaling]))


_HOPPER_CAST_BYTES = {s: _cast_bytes(s, non_tn_fp8_gemm=False)
                      for s in ("tensorwise", "blockwise")}
BLOCKWISE_GEMM_TIME_RATIO = (22.882 - 3.500 * _HOPPER_CAST_BYTES["blockwise"]
                             / _HOPPER_CAST_BYTES["tensorwise"]) / 16.785


def fp8_gemm_efficiency(gpu: GPUSpec, scaling: str, efficiency: float) -> float:
    """The attained fraction of the FP8 peak of a GEMM with ``scaling`` (``delayed``,
    ``tensorwise``, ``blockwise`` or ``mxfp8``) on ``gpu``, from the GPU's FP8 (or MXFP8)
    GEMM ``efficiency``: block scales on a GPU without an MXFP8 rate take
    :data:`BLOCKWISE_GEMM_TIME_RATIO` times as long, elsewhere the efficiency as it is."""
    if scaling == "blockwise" and not gpu.peak_flops_per_s.get("mxfp8"):
        return efficiency / BLOCKWISE_GEMM_TIME_RATIO
    return efficiency


def fp8_scaling(c) -> str:
    """The plans' FP8 scaling (:func:`configurator.core.plan_values.fp8_scaling`)."""
    return plan_fp8_scaling(c.precision, c.fp8_recipe)


def fp8_cast_bytes(gpu: GPUSpec, scaling: str = "delayed", columnwise: bool = True) -> float:
    """Bytes per element Transformer Engine's quantisation moves on ``gpu`` with ``scaling``
    (``delayed``, ``tensorwise``, ``blockwise`` or ``mxfp8``): the input read
    (:data:`FP8_READ_BYTES`, and :data:`FP8_AMAX_READ_BYTES` again for current scaling's
    amax) and each FP8 copy with its scales (:data:`FP8_COPY_BYTES`,
    :data:`FP8_SCALE_BYTES`), as many copies as
    :func:`configurator.core.plan_values.fp8_copies` says (``gpu.non_tn_fp8_gemm``). E.g.
    current scaling: 6 on an H100, 5 on a B200; MXFP8 4 + 2/32 on both."""
    return _cast_bytes(scaling, gpu.non_tn_fp8_gemm, columnwise)


def fp8_quantize_s(elements, gpu, scaling: str = "delayed", columnwise: bool = True):
    """Time (s) of Transformer Engine quantising ``elements`` 16-bit elements into the FP8
    copies its kernels read on ``gpu`` (:func:`fp8_cast_bytes` per element, at
    :data:`FP8_CAST_HBM_FRACTION` of the HBM bandwidth; arrays ok)."""
    return (elements * fp8_cast_bytes(gpu, scaling, columnwise)
            / (gpu.hbm_bandwidth_Bps * FP8_CAST_HBM_FRACTION))


def fp8_norm_cast_bytes(gpu: GPUSpec, scaling: str = "delayed") -> tuple[float, float]:
    """Bytes per element of quantising a norm's output where the norm and the GEMM reading it
    are one Transformer Engine module (``LayerNormLinear``: megatron-core's
    ``TELayerNormColumnParallelLinear``, a dense layer's QKV and fc1), on ``gpu`` with
    ``scaling``: ``(cast, saved)``, the bytes the quantisation moves at its own rate
    (:func:`fp8_quantize_s`'s) and the bytes the norm's 16-bit output write no longer moves
    (at the element-wise rate). The module hands its quantiser to the norm
    (transformer_engine/pytorch/module/layernorm_linear.py ``with_quantized_norm``;
    csrc/extensions/normalization.cpp ``layernorm_fwd``, ``rmsnorm_fwd``):

    * delayed scaling: the norm kernel writes the row-wise FP8 copy itself, 1 byte where its
      16-bit output took 2 (``saved`` 1), and the column-wise copy, where the GPU needs one
      (:func:`fp8_cast_bytes`'s copies), is a transpose of it, read 1 and write 1
      (common/normalization/rmsnorm/rmsnorm_api.cpp, "Compute FP8 transpose if required"):
      2 bytes on an H100, none on a B200;
    * current scaling: the norm writes its 16-bit output and takes the amax in the same pass
      (TransformerEngine #2013, "Fuse amax computation into normalization kernel for current
      scaling", July 2025), so the cast reads its input once, without
      :data:`FP8_AMAX_READ_BYTES`: 4 on an H100, 3 on a B200;
    * block and MXFP8 scaling: a separate quantisation, as any GEMM input (MXFP8's fused
      cuDNN norm only with ``NVTE_NORM_FWD_USE_CUDNN`` set).

    Raises ``KeyError`` for an unknown scaling."""
    copies = fp8_copies(scaling, gpu.non_tn_fp8_gemm)
    if scaling == "delayed":
        # each transpose reads the row-wise copy and writes a column-wise one
        transposes = (copies - 1.0) * (FP8_COPY_BYTES + FP8_COPY_BYTES)
        return transposes, FP8_READ_BYTES - FP8_COPY_BYTES
    amax = FP8_AMAX_READ_BYTES[scaling] if scaling == "tensorwise" else 0.0
    return fp8_cast_bytes(gpu, scaling) - amax, 0.0


def fp8_norm_quantize_s(elements, gpu: GPUSpec, scaling: str = "delayed"):
    """Time (s) of quantising ``elements`` elements of a norm's output inside its
    ``LayerNormLinear`` (:func:`fp8_norm_cast_bytes`' ``cast`` bytes each, at
    :data:`FP8_CAST_HBM_FRACTION` of the HBM bandwidth; arrays ok). The norm's own write it
    saves is the caller's: it is priced with the norm."""
    return (elements * fp8_norm_cast_bytes(gpu, scaling)[0]
            / (gpu.hbm_bandwidth_Bps * FP8_CAST_HBM_FRACTION))
