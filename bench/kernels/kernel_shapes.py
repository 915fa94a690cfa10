"""The kernels of one MoE decoder layer at a plan's per-rank shapes, timed on the local CUDA
GPU against the analytic time model (:mod:`configurator.cost.compute`) of its GPU preset.

Where ``configurator profile`` times a whole dense layer, this times the pieces the analytic
model prices one by one, so a gap can be traced to one term: the attention GEMMs, core
attention (full causal, and a sliding window where the model has one), YaRN's unfused RoPE,
the experts' grouped GEMMs, and megatron-core's MoE operations around them (the biased
experts' ``_apply_bias``, the clamped quick-GEGLU, the weighted SwiGLU), with
megatron-core's own functions where it is importable (multi-latent attention: the expert
pieces only). bf16 throughout; each time is the median of ``--repeats`` CUDA-event timings
after ``--warmup`` runs; forward and backward are timed apart.

Balanced routing (as the published MoE runs force): each of the ``E/ep`` local experts gets
``R/(E/ep)`` of the rank's ``R = topk · mbs · seq/tp · etp`` routed rows (as
:func:`configurator.cost.moe_compute.moe_mlp_costs`).

Run (needs CUDA; torch ≥ 2.5): ``python -m bench.kernels.kernel_shapes --model gpt-oss-120b
--tp 1 --ep 8 --mbs 1``; ``--dry-run`` runs every piece on the CPU (the code path, not timings).
Prints one table: piece, measured forward/backward ms, analytic forward/backward ms,
measured / analytic.
"""

from __future__ import annotations

import sys

import numpy as np

from bench.common import bench_parser, run_cuda_bench, time_passes
from configurator.core.model_presets import load_model
from configurator.cost import compute, gemm, host_ops, moe_compute
from configurator.profiler.timing import bench_torch
from topology.gpus import gpu_from_config, guess_gpu_preset


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", default="gpt-oss-120b")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=8)
    ap.add_argument("--etp", type=int, default=1)
    ap.add_argument("--mbs", type=int, default=1)
    ap.add_argument("--seq-length", type=int)
    ap.add_argument("--gpu", help="GPU preset (default: guessed from the device name)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--no-flex", action="store_true",
                    help="skip the sliding-window attention (FlexAttention compiles first)")
    ap.add_argument("--dry-run", action="store_true",
                    help="without CUDA, run every piece on the CPU (the code path, not timings)")
    args = ap.parse_args(argv)
    torch, cuda = bench_torch(args.dry_run)     # InputError: the entry point below
    import torch.nn.functional as F
    model = load_model(args.model)
    if args.seq_length:
        model = model.with_seq_length(args.seq_length)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    preset = args.gpu or guess_gpu_preset(name)
    if preset is None:
        print(f"kernel_shapes: no GPU preset for {name!r}: give --gpu", file=sys.stderr)
        return 2
    gpu = gpu_from_config(preset)
    eff = gpu.efficiency
    peak, hbm = gpu.peak("bf16"), gpu.hbm_bandwidth_Bps * eff.hbm
    dev, bf16 = torch.device("cuda" if cuda else "cpu"), torch.bfloat16
    torch.manual_seed(0)
    w, r = args.warmup, args.repeats

    tp, ep, etp, b = args.tp, args.ep, args.etp, args.mbs
    s, h = model.seq_length, model.hidden_size
    a, g, d = model.num_attention_heads, model.num_query_groups, model.kv_channels
    T = b * s
    kw = dict(batch=1.0, peak=peak, gpu=gpu, in_bytes=2.0, gemm_eff=eff.gemm)
    rows = []

    def add(piece, measured, analytic_f, analytic_b):
        f, bw = measured
        rows.append((piece, f, bw, float(analytic_f), float(analytic_b)))
        print(f"{piece:<44} {1e3 * f:9.3f} {1e3 * bw:9.3f} {1e3 * float(analytic_f):9.3f} "
              f"{1e3 * float(analytic_b):9.3f} {f / float(analytic_f):6.2f} "
              f"{bw / float(analytic_b):6.2f}", flush=True)

    print(f"{model.name} on {name} (analytic: {preset}), tp {tp}, ep {ep}, etp {etp}, mbs {b}, "
          f"seq {s}; ms, median of {r} after {w} warm-up")
    print(f"{'piece':<44} {'fwd':>9} {'bwd':>9} {'an. fwd':>9} {'an. bwd':>9} "
          f"{'f/an':>6} {'b/an':>6}")

    def linear_piece(label, M, N, K):
        x = torch.randn(M, K, dtype=bf16, device=dev, requires_grad=True)
        wt = (0.02 * torch.randn(N, K, dtype=bf16, device=dev)).requires_grad_(True)
        gr = torch.randn(M, N, dtype=bf16, device=dev)
        an = gemm.gemm_time_s(M, N, K, **kw)
        add(label, time_passes(torch, lambda: F.linear(x, wt), lambda o: o.backward(gr), w, r),
            an, 2 * an)

    if model.multi_latent_attention:
        print("multi-latent attention: the attention pieces are not built here")
        return moe_pieces(torch, model, args, dev, kw, add, eff, hbm, gpu, T)
    heads, kv = a // tp, max(g // tp, 1)
    linear_piece(f"QKV GEMM {T}x{(heads + 2 * kv) * d}x{h}", T, (heads + 2 * kv) * d, h)
    linear_piece(f"projection GEMM {T}x{h}x{heads * d}", T, h, heads * d)

    # core attention, full causal: SDPA over [b, heads, s, d] with GQA
    q = torch.randn(b, heads, s, d, dtype=bf16, device=dev, requires_grad=True)
    k = torch.randn(b, kv, s, d, dtype=bf16, device=dev, requires_grad=True)
    v = torch.randn(b, kv, s, d, dtype=bf16, device=dev, requires_grad=True)
    go = torch.randn(b, heads, s, d, dtype=bf16, device=dev)
    pairs = 2.0 * b * s * s * heads * (2 * d)
    full_f = pairs * 0.5 / (peak * compute.flash_efficiency(eff.flash_attention, s))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = ((("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))
                if cuda else (("math", SDPBackend.MATH),))
    for label, backend in backends:
        try:
            with sdpa_kernel([backend]):
                t = time_passes(torch, lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=kv != heads),
                    lambda o: o.backward(go), w, r)
            add(f"attention causal {s} ({label}, d {d})", t, full_f, 2.5 * full_f)
        except RuntimeError as err:
            print(f"attention {label}: {str(err).splitlines()[0][:100]}")
    if model.rope_unfused:
        rope_piece(torch, model, dev, b, s, heads, kv, d, gpu, add, w, r)
    window = model.window_size
    if window and not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            def mask(_b, _h, qi, ki):
                return (qi >= ki) & (qi - ki < window)

            bm = create_block_mask(mask, None, None, s, s, device=dev.type)
            flex = torch.compile(flex_attention) if cuda else flex_attention
            win = float(min(window, s))
            frac = next(f for _, f, wnd in model.attention_layer_kinds if wnd)
            an = pairs * frac / (peak * compute.flash_efficiency(eff.flash_attention, win))
            t = time_passes(torch, lambda: flex(q, k, v, block_mask=bm, enable_gqa=kv != heads),
                            lambda o: o.backward(go), w, r)
            add(f"attention window {window} (flex, d {d})", t, an, 2.5 * an)
        except Exception as err:  # noqa: BLE001 - a benchmark reports and goes on
            print(f"attention window: {type(err).__name__}: {str(err).splitlines()[0][:100]}")
    return moe_pieces(torch, model, args, dev, kw, add, eff, hbm, gpu, T)


def rope_piece(torch, model, dev, b, s, heads, kv, d, gpu, add, w, r) -> None:
    """YaRN's unfused RoPE on q and k, with megatron-core's own ``_apply_rotary_pos_emb_bshd``
    (what ``apply_rotary_pos_emb`` falls back to when mscale ≠ 1), against
    :data:`configurator.cost.host_ops.UNFUSED_ROPE_BYTES` at :func:`host_ops.eager_s`."""
    try:
        from megatron.core.models.common.embeddings.rope_utils import (
            _apply_rotary_pos_emb_bshd)
    except Exception as err:  # noqa: BLE001 - a benchmark reports and goes on
        print(f"megatron-core not importable ({type(err).__name__}): unfused RoPE skipped")
        return
    bf16 = torch.bfloat16
    freqs = torch.randn(s, 1, 1, d, device=dev)
    q = torch.randn(s, b, heads, d, dtype=bf16, device=dev, requires_grad=True)
    k = torch.randn(s, b, kv, d, dtype=bf16, device=dev, requires_grad=True)
    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def fwd():
        return (_apply_rotary_pos_emb_bshd(q, freqs, mscale=model.rope_mscale),
                _apply_rotary_pos_emb_bshd(k, freqs, mscale=model.rope_mscale))

    qk = q.numel() + k.numel()
    an_f, an_b = (host_ops.eager_s(by * qk, 2 * kn, gpu) for by, kn in zip(
        host_ops.UNFUSED_ROPE_BYTES, host_ops.UNFUSED_ROPE_KERNELS))
    add(f"YaRN RoPE q+k unfused (mscale {model.rope_mscale:.3f})",
        time_passes(torch, fwd, lambda o: torch.autograd.backward(o, (gq, gk)), w, r), an_f, an_b)


def moe_pieces(torch, model, args, dev, kw, add, eff, hbm, gpu, T) -> int:
    """The experts' GEMMs and megatron-core's eager MoE operations (module docstring)."""
    import torch.nn.functional as F

    if not model.is_moe:
        return 0
    bf16, w, r = torch.bfloat16, args.warmup, args.repeats
    tp, ep, etp, h = args.tp, args.ep, args.etp, model.hidden_size
    E, fe, topk = model.num_experts, model.moe_ffn_hidden_size, model.moe_router_topk
    local = E // ep
    R = topk * (T // tp) * etp
    per = R // local
    gate = 2 if model.swiglu else 1
    n1, k2 = gate * fe // etp, fe // etp
    x = torch.randn(local, per, h, dtype=bf16, device=dev, requires_grad=True)
    w1 = (0.02 * torch.randn(local, n1, h, dtype=bf16, device=dev)).requires_grad_(True)
    w2 = (0.02 * torch.randn(local, h, k2, dtype=bf16, device=dev)).requires_grad_(True)
    an1 = gemm.gemm_time_s(per, n1, h, **dict(kw, batch=local))
    an2 = gemm.gemm_time_s(per, h, k2, **dict(kw, batch=local))
    g1 = torch.randn(local, per, n1, dtype=bf16, device=dev)
    add(f"expert fc1 {local}x({per}x{n1}x{h}) bmm",
        time_passes(torch, lambda: torch.bmm(x, w1.transpose(1, 2)), lambda o: o.backward(g1),
                    w, r),
        an1, 2 * an1)
    xs = [x[i].detach().clone().requires_grad_(True) for i in range(local)]
    ws = [w1[i].detach().clone().requires_grad_(True) for i in range(local)]

    def looped():
        return torch.cat([F.linear(xi, wi) for xi, wi in zip(xs, ws)])

    g1c = g1.reshape(-1, n1)
    add(f"expert fc1 {local} GEMMs one by one",
        time_passes(torch, looped, lambda o: o.backward(g1c), w, r),
        an1, 2 * an1)
    if hasattr(torch, "_grouped_mm"):
        flat = x.detach().reshape(-1, h).clone().requires_grad_(True)
        offs = torch.arange(per, R + 1, per, device=dev, dtype=torch.int32)
        wt1 = w1.detach().transpose(1, 2).clone().requires_grad_(True)   # [E, K, N]
        try:
            add("expert fc1 torch._grouped_mm",
                time_passes(torch, lambda: torch._grouped_mm(flat, wt1, offs=offs),
                            lambda o: o.backward(g1c), w, r), an1, 2 * an1)
        except RuntimeError as err:
            print(f"_grouped_mm: {str(err).splitlines()[0][:100]}")
    g2 = torch.randn(local, per, h, dtype=bf16, device=dev)
    y = torch.randn(local, per, k2, dtype=bf16, device=dev, requires_grad=True)
    add(f"expert fc2 {local}x({per}x{h}x{k2}) bmm",
        time_passes(torch, lambda: torch.bmm(y, w2.transpose(1, 2)), lambda o: o.backward(g2),
                    w, r),
        an2, 2 * an2)

    # megatron-core's eager MoE operations, with its own functions
    try:
        from megatron.core.fusions.fused_bias_geglu import weighted_bias_quick_geglu_impl
        from megatron.core.fusions.fused_bias_swiglu import weighted_bias_swiglu_impl
        from megatron.core.transformer.moe.experts import TEGroupedMLP
    except Exception as err:  # noqa: BLE001
        print(f"megatron-core not importable ({type(err).__name__}): eager ops skipped")
        return 0
    counts = [per] * local
    probs = torch.rand(R, 1, dtype=torch.float32, device=dev, requires_grad=True)
    inter = torch.randn(R, h, dtype=bf16, device=dev, requires_grad=True)
    biases = [torch.zeros(h, dtype=bf16, device=dev, requires_grad=True) for _ in range(local)]
    go = torch.randn(R, h, dtype=bf16, device=dev)
    if model.add_bias_linear:
        bf_, bb_ = (host_ops.eager_s(bytes_ * R * h, kk[0] * local + kk[1], gpu)
                    for bytes_, kk in zip(host_ops.EXPERT_BIAS_BYTES,
                                          host_ops.EXPERT_BIAS_KERNELS))
        add("expert fc2 bias (TEGroupedMLP._apply_bias)",
            time_passes(torch, lambda: TEGroupedMLP._apply_bias(inter, biases, counts, probs),
                        lambda o: o.backward(go), w, r), bf_, bb_)
    fc1_out = torch.randn(R, gate * fe // etp, dtype=bf16, device=dev, requires_grad=True)
    wts = torch.rand(R, 1, dtype=torch.float32, device=dev)
    gact = torch.randn(R, fe // etp, dtype=bf16, device=dev)
    # the model's activation term (moe_mlp_costs' act_fwd holds the clamp too)
    from configurator.core.plan_batch import PlanBatch
    from configurator.core.plan import ParallelPlan

    c = PlanBatch.from_plan(ParallelPlan(tp=tp, ep=ep, etp=etp, micro_batch_size=args.mbs))
    act = float(np.asarray(moe_compute.moe_mlp_costs(model, c, gpu, T, kw)["act_fwd"]).ravel()[0]
                - host_ops.clamp_s(model, R * gate * fe / etp, gpu)[0])
    clamp = model.activation_func_clamp_value
    if model.swiglu and not clamp:
        add("weighted SwiGLU (megatron-core)",
            time_passes(torch, lambda: weighted_bias_swiglu_impl(fc1_out, None, wts),
                        lambda o: o.backward(gact), w, r), act, 2 * act)
        return 0
    for cv in ((None, clamp) if clamp else (None,)):
        label = "quick-GEGLU " + ("clamped" if cv else "unclamped")
        try:
            t = time_passes(torch, lambda: weighted_bias_quick_geglu_impl(
                fc1_out, None, wts, False, 1.0, cv), lambda o: o.backward(gact), w, r)
        except Exception as err:  # noqa: BLE001
            print(f"{label}: {type(err).__name__}: {str(err).splitlines()[0][:100]}")
            continue
        cf, cb = host_ops.clamp_s(model, R * gate * fe / etp, gpu) if cv else (0.0, 0.0)
        add(f"{label} (megatron-core)", t, act + cf, 2 * act + cb)
    return 0


if __name__ == "__main__":
    run_cuda_bench(main, "kernel_shapes")
