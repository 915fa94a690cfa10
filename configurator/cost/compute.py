"""Compute time of one transformer layer for one microbatch, vectorised over plans.

Per layer and microbatch on one GPU (tokens per rank ``T = b·s/cp``):

* GEMMs (QKV, attention output, fc1, fc2; logits on the last stage) timed by a roofline —
  ``max(FLOPs / (η_gemm·peak·wave_quantisation), bytes / (η_hbm·HBM))`` — so thin or small
  GEMMs lose efficiency; backward runs the dgrad and wgrad GEMMs (2× forward).
  (Williams et al. 2009 roofline; wave quantisation per NVIDIA "Matrix Multiplication
  Background" user guide.)
* core attention: score-storing backends (``local``/``unfused``) run two batched GEMMs per
  head plus softmax (and dropout) over ``a·s²`` scores from HBM; flash-style kernels do
  ``4·b·s_q·s_k·h/t`` FLOPs, halved for the causal mask, at η_flash (backward 2.5×).
* memory-bound ops (norms, bias-dropout-add, GeLU/SwiGLU, RoPE, copies) from bytes moved
  and attained HBM bandwidth; backward moves ≈ 2× the forward bytes.
* recompute: ``full`` repeats the layer's forward (and its tensor-parallel collectives);
  ``selective`` repeats core attention only (Korthikanti et al. 2022 §5).
"""

from __future__ import annotations

import numpy as np

from configurator.core.candidates import Candidates
from configurator.core.model import ModelSpec
from configurator.core.plan import is_fp8
from topology.gpus import GPUSpec


def gemm_time_s(M, N, K, *, batch, peak, gpu: GPUSpec, in_bytes, gemm_eff):
    """Roofline time (s) of ``batch`` GEMMs of ``M×K · K×N`` with wave quantisation on
    ``gpu`` (``peak`` FLOP/s, attained fraction ``gemm_eff``, operands of ``in_bytes``)."""
    eff = gpu.efficiency
    flops = 2.0 * M * N * K * batch
    tiles = np.ceil(M / 256.0) * np.ceil(N / 128.0) * batch
    waves = np.ceil(tiles / gpu.num_sms)
    quant = tiles / (waves * gpu.num_sms)
    t_compute = flops / (peak * gemm_eff * quant)
    t_memory = batch * (in_bytes * (M * K + K * N) + 2.0 * M * N) / (
        gpu.hbm_bandwidth_Bps * eff.hbm)
    return np.maximum(t_compute, t_memory) + eff.kernel_overhead_s


def layer_costs(model: ModelSpec, c: Candidates, gpu: GPUSpec) -> dict:
    """Forward/backward/recompute times (s) of one layer for one microbatch, per plan."""
    eff = gpu.efficiency
    h, a, g, f, d = (model.hidden_size, model.num_attention_heads, model.num_query_groups,
                     model.ffn_hidden_size, model.kv_channels)
    tp = c.tp.astype(float)
    s_q = model.seq_length / c.cp
    s_k = float(model.seq_length)
    T = c.mbs * s_q
    fp8 = is_fp8(c.precision)
    peak16 = gpu.peak("fp16" if c.precision == "fp16" else "bf16")
    gemm_peak, gemm_eff = gpu.gemm_rate(c.precision) if fp8 else (peak16, eff.gemm)
    hbm = gpu.hbm_bandwidth_Bps
    kw = dict(batch=1.0, peak=gemm_peak, gpu=gpu, in_bytes=1.0 if fp8 else 2.0,
              gemm_eff=gemm_eff)
    fc1_n = f * (2 if model.swiglu else 1)
    gemm_qkv = gemm_time_s(T, (a + 2 * g) * d / tp, h, **kw)
    gemm_fc1 = gemm_time_s(T, fc1_n / tp, h, **kw)
    gemm_fwd = (gemm_qkv + gemm_time_s(T, h, a * d / tp, **kw) + gemm_fc1
                + gemm_time_s(T, h, f / tp, **kw))
    rep = T * h / np.where(c.sequence_parallel, tp, 1.0)  # elements of replicated-or-SP activations
    drop = model.hidden_dropout > 0
    elem = (2 * 4 * rep + 2 * (6 + drop) * rep
            + (6 if model.swiglu else 4) * T * f / tp
            + (4 * T * (a + g) * d / tp if model.position_embedding_type == "rope" else 0.0))
    n_kernels = 10
    if c.stores_scores:
        heads = c.mbs * a / tp
        kw16 = dict(kw, peak=peak16, gemm_eff=eff.gemm, in_bytes=2.0, batch=heads)
        scores = s_q * s_k * heads
        attn_fwd = (gemm_time_s(s_q, s_k, d, **kw16) + gemm_time_s(s_q, d, s_k, **kw16)
                    + (4 + 5 * (model.attention_dropout > 0)) * scores / (hbm * eff.hbm)
                    + 4 * T * h / tp / (hbm * eff.hbm) + 3 * eff.kernel_overhead_s)
        attn_bwd = 2 * attn_fwd
    else:
        flops = 4.0 * c.mbs * s_q * s_k * h / tp * 0.5  # causal
        attn_fwd = flops / (peak16 * eff.flash_attention) + eff.kernel_overhead_s
        attn_bwd = 2.5 * attn_fwd
    elem_fwd = elem / (hbm * eff.hbm) + n_kernels * eff.kernel_overhead_s
    fwd = gemm_fwd + attn_fwd + elem_fwd
    bwd = 2 * gemm_fwd + attn_bwd + 2 * elem_fwd
    recompute = np.select([c.recompute == 2, c.recompute == 1], [fwd, attn_fwd], 0.0)
    return {"fwd": fwd, "bwd": bwd, "recompute": recompute, "attn": attn_fwd + attn_bwd,
            "wgrad_overlap": gemm_qkv + gemm_fc1,
            "tokens": T, "gemm_kw": kw}
