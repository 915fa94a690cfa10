"""Forward, data-gradient and weight-gradient GEMMs timed apart on the local CUDA GPU, against
:func:`configurator.cost.gemm.gemm_time_s` of its GPU preset.

A layer's backward runs two GEMMs per forward GEMM ``Y[M×N] = X[M×K]·Wᵀ``: the data gradient
``dX[M×K] = dY·W`` (reduces over ``N``) and the weight gradient ``dW[N×K] = dYᵀ·X``, which
reduces over the ``M`` tokens. A dense layer's ``M`` is ``mbs·seq`` (thousands); a routed
expert's is only the tokens it receives (``topk·mbs·seq/(E/ep)``, 256–8,192 in published
MoE runs), so its weight-gradient GEMM is a short reduction into a large output. Megatron
accumulates that gradient into the parameter's ``main_grad`` (``gradient_accumulation_fusion``,
Transformer Engine ``fuse_wgrad_accumulation``: a GEMM with ``beta = 1`` into an FP32 buffer,
or BF16 with ``grad_reduce_in_fp32 = False``), so the output is read and written.

Two sweeps, BF16 operands, each time the median of ``--repeats`` CUDA-event timings after
``--warmup`` runs:

* ``dense``: one ``N×K`` output (default 8192×8192), reduction depth ``M`` from 128 to 16,384,
  plain and accumulated into FP32 (and ``torch._scaled_mm`` FP8 where the device has it).
* ``experts``: a model's local experts (``E/ep`` GEMMs of ``rows`` rows) at a sweep of rows per
  expert: fc1 and fc2, each forward, data gradient, weight gradient (plain, into BF16, into
  FP32), as one ``torch.mm`` per expert (Transformer Engine ``GroupedLinear``'s route) and as
  ``torch._grouped_mm``.

Run (needs CUDA): ``python -m bench.kernels.gemm_shapes --json out.json``; ``--dry-run`` runs
the code path on the CPU with small shapes. Prints one row per GEMM: measured ms, analytic ms,
ratio, attained TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.common import bench_parser, run_cuda_bench, time_passes
from configurator.core.model_presets import load_model
from configurator.cost import gemm
from configurator.profiler.timing import bench_torch
from topology.gpus import gpu_from_config, guess_gpu_preset


def timed(torch, fn, warmup, repeats):
    """Median seconds of ``fn()`` (:func:`bench.common.time_passes` with nothing to time
    backward)."""
    return time_passes(torch, fn, lambda out: None, warmup, repeats)[0]


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    def model_ep(text: str) -> tuple[str, int]:
        name, _, ep = text.rpartition(":")
        if not name or not ep.isdigit() or int(ep) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: give MODEL:EP, e.g. gpt-oss-120b:8")
        return name, int(ep)

    ap.add_argument("--models", nargs="*", type=model_ep,
                    default=[("gpt-oss-120b", 8), ("qwen3-30b-a3b", 16)],
                    help="MODEL:EP pairs for the expert sweep (none: the dense sweep only)")
    ap.add_argument("--rows", type=int, nargs="+",
                    default=[128, 256, 512, 1024, 2048, 4096, 8192])
    def shape(text: str) -> tuple[int, int]:
        try:
            n, k = (int(x) for x in text.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give NxK, e.g. 8192x8192") from None
        if n < 1 or k < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: sizes must be positive")
        return n, k

    ap.add_argument("--dense-nk", nargs="+", type=shape, default=[(8192, 8192)],
                    help="weight shapes NxK of the dense sweep")
    ap.add_argument("--dense-m", type=int, nargs="+",
                    default=[128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--gpu", help="GPU preset (default: guessed from the device name)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json", help="write the rows to this JSON file")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    experts = [(load_model(name), ep) for name, ep in args.models]
    for model, ep in experts:
        if not model.is_moe or model.num_experts % ep:
            print(f"gemm_shapes: {model.name}: ep {ep} must divide its experts",
                  file=sys.stderr)
            return 2
    torch, cuda = bench_torch(args.dry_run)     # InputError: the entry point below
    name = torch.cuda.get_device_name() if cuda else "cpu"
    preset = args.gpu or guess_gpu_preset(name) or "h100-80gb"
    gpu = gpu_from_config(preset)
    eff = gpu.efficiency
    kw = dict(peak=gpu.peak("bf16"), gpu=gpu, in_bytes=2.0, gemm_eff=eff.gemm)
    dev, bf16, f32 = torch.device("cuda" if cuda else "cpu"), torch.bfloat16, torch.float32
    if args.dry_run and not cuda:
        args.rows, args.dense_m, args.dense_nk = [16, 64], [32, 64], [(64, 96)]
        args.warmup, args.repeats = 0, 1
    w, r = args.warmup, args.repeats
    rows_out = []
    print(f"{name} (analytic: {preset}); ms, median of {r} after {w}")
    print(f"{'what':<52} {'ms':>9} {'an. ms':>9} {'ratio':>6} {'TF/s':>6}")

    def add(label, sweep, op, impl, batch, M, N, K, t, an):
        tf = 2.0 * batch * M * N * K / t / 1e12
        rows_out.append(dict(sweep=sweep, what=label, op=op, impl=impl, batch=batch, M=M, N=N,
                             K=K, measured_s=t, analytic_s=an, tflops=tf))
        print(f"{label:<52} {1e3 * t:9.4f} {1e3 * an:9.4f} {t / an:6.2f} {tf:6.0f}", flush=True)

    def mm_out32(a, b):
        return torch.mm(a, b, out_dtype=f32)

    def addmm32(c, a, b):
        """``c += a·b`` with an FP32 ``c`` (cuBLAS beta = 1 where torch has ``out_dtype``)."""
        try:
            return torch.addmm(c, a, b, out_dtype=f32, out=c)
        except (RuntimeError, TypeError):
            return c.add_(torch.mm(a, b).float())

    # dense: output N×K, reduction over M
    for N, K, M in ((n, k, M) for n, k in args.dense_nk for M in args.dense_m):
        wt = torch.randn(N, K, dtype=bf16, device=dev)
        dy = torch.randn(M, N, dtype=bf16, device=dev)
        x = torch.randn(M, K, dtype=bf16, device=dev)
        an = float(gemm.gemm_time_s(N, K, M, batch=1.0, **kw))
        add(f"dense wgrad {N}x{K} over {M}", "dense", "wgrad", "mm", 1, N, K, M,
            timed(torch, lambda: torch.mm(dy.t(), x), w, r), an)
        c32 = torch.zeros(N, K, dtype=f32, device=dev)
        try:
            add(f"dense wgrad {N}x{K} over {M} +=fp32", "dense", "wgrad_acc32", "mm", 1, N, K,
                M, timed(torch, lambda: addmm32(c32, dy.t(), x), w, r), an)
        except (RuntimeError, TypeError) as err:
            print(f"addmm out_dtype: {str(err).splitlines()[0][:90]}")
        c16 = torch.zeros(N, K, dtype=bf16, device=dev)
        add(f"dense wgrad {N}x{K} over {M} +=bf16", "dense", "wgrad_acc16", "mm", 1, N, K,
            M, timed(torch, lambda: c16.addmm_(dy.t(), x), w, r), an)
        add(f"dense fwd {M}x{N}x{K}", "dense", "fwd", "mm", 1, M, N, K,
            timed(torch, lambda: torch.mm(x, wt.t()), w, r),
            float(gemm.gemm_time_s(M, N, K, batch=1.0, **kw)))
        if cuda and hasattr(torch, "_scaled_mm") and torch.cuda.get_device_capability()[0] >= 9:
            a8 = dy.t().contiguous().to(torch.float8_e5m2)
            b8 = x.t().contiguous().to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)
            try:
                an8 = float(gemm.gemm_time_s(N, K, M, batch=1.0, **dict(
                    kw, peak=gpu.peak("fp8"), in_bytes=1.0, gemm_eff=eff.gemm_fp8)))
                add(f"dense fp8 wgrad {N}x{K} over {M}", "dense", "wgrad_fp8", "scaled_mm", 1,
                    N, K, M, timed(torch, lambda: torch._scaled_mm(
                        a8, b8, scale_a=one, scale_b=one, out_dtype=bf16), w, r), an8)
            except RuntimeError as err:
                print(f"_scaled_mm: {str(err).splitlines()[0][:90]}")

    for model, ep in experts:
        mname = model.name
        local = model.num_experts // ep
        h, fe = model.hidden_size, model.moe_ffn_hidden_size
        gate = 2 if model.swiglu else 1
        if args.dry_run and not cuda:
            local, h, fe = 2, 64, 32
        for fc, (n, k) in (("fc1", (gate * fe, h)), ("fc2", (h, fe))):
            wts = [torch.randn(n, k, dtype=bf16, device=dev) * 0.02 for _ in range(local)]
            w_grouped = torch.stack(wts).transpose(1, 2).contiguous()          # [E, K, N]
            mg16 = [torch.zeros(n, k, dtype=bf16, device=dev) for _ in range(local)]
            mg32 = [torch.zeros(n, k, dtype=f32, device=dev) for _ in range(local)]
            for M in args.rows:
                xs = [torch.randn(M, k, dtype=bf16, device=dev) for _ in range(local)]
                dys = [torch.randn(M, n, dtype=bf16, device=dev) for _ in range(local)]
                tag = f"{mname} {fc} {local}x"
                an_f = float(gemm.gemm_time_s(M, n, k, batch=local, **kw))
                an_d = float(gemm.gemm_time_s(M, k, n, batch=local, **kw))
                an_w = float(gemm.gemm_time_s(n, k, M, batch=local, **kw))
                add(f"{tag}({M}x{n}x{k}) fwd", mname, f"{fc}_fwd", "mm", local, M, n, k,
                    timed(torch, lambda: [torch.mm(x, wt.t()) for x, wt in zip(xs, wts)], w, r),
                    an_f)
                add(f"{tag} dgrad", mname, f"{fc}_dgrad", "mm", local, M, k, n,
                    timed(torch, lambda: [torch.mm(d, wt) for d, wt in zip(dys, wts)], w, r),
                    an_d)
                add(f"{tag} wgrad", mname, f"{fc}_wgrad", "mm", local, n, k, M,
                    timed(torch, lambda: [torch.mm(d.t(), x) for d, x in zip(dys, xs)], w, r),
                    an_w)
                add(f"{tag} wgrad +=bf16", mname, f"{fc}_wgrad_acc16", "mm", local, n, k, M,
                    timed(torch, lambda: [c.addmm_(d.t(), x) for c, d, x in zip(mg16, dys, xs)],
                          w, r), an_w)
                try:
                    add(f"{tag} wgrad +=fp32", mname, f"{fc}_wgrad_acc32", "mm", local, n, k, M,
                        timed(torch, lambda: [addmm32(c, d.t(), x)
                                              for c, d, x in zip(mg32, dys, xs)], w, r), an_w)
                except (RuntimeError, TypeError) as err:
                    print(f"addmm out_dtype: {str(err).splitlines()[0][:90]}")
                if cuda and hasattr(torch, "_grouped_mm"):
                    flat_x = torch.cat(xs)
                    flat_dy = torch.cat(dys)
                    offs = torch.arange(M, M * local + 1, M, device=dev, dtype=torch.int32)
                    try:
                        add(f"{tag} fwd grouped_mm", mname, f"{fc}_fwd", "grouped", local, M,
                            n, k, timed(torch, lambda: torch._grouped_mm(
                                flat_x, w_grouped, offs=offs), w, r), an_f)
                        wt_t = w_grouped.transpose(1, 2)                        # [E, N, K]
                        add(f"{tag} dgrad grouped_mm", mname, f"{fc}_dgrad", "grouped", local,
                            M, k, n, timed(torch, lambda: torch._grouped_mm(
                                flat_dy, wt_t, offs=offs), w, r), an_d)
                    except RuntimeError as err:
                        print(f"_grouped_mm: {str(err).splitlines()[0][:90]}")
                    # forward + both gradients as autograd runs them
                    xg = flat_x.clone().requires_grad_(True)
                    wg = w_grouped.clone().requires_grad_(True)
                    try:
                        out = torch._grouped_mm(xg, wg, offs=offs)
                        add(f"{tag} dgrad+wgrad grouped_mm (autograd)", mname,
                            f"{fc}_bwd", "grouped", local, M, n, k,
                            timed(torch, lambda: torch.autograd.grad(
                                out, (xg, wg), flat_dy, retain_graph=True), w, r),
                            an_d + an_w)
                    except RuntimeError as err:
                        print(f"_grouped_mm backward: {str(err).splitlines()[0][:90]}")
    if cuda:
        try:   # which kernels cuBLAS picks for an expert's weight gradient
            from torch.profiler import ProfilerActivity, profile

            d = torch.randn(1024, 5760, dtype=bf16, device=dev)
            x = torch.randn(1024, 2880, dtype=bf16, device=dev)
            c = torch.zeros(5760, 2880, dtype=f32, device=dev)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.mm(d.t(), x)
                torch.mm(x, torch.randn(2880, 5760, dtype=bf16, device=dev))
                addmm32(c, d.t(), x)
                torch.cuda.synchronize()
            for ev in prof.key_averages():
                if ev.device_type.name == "CUDA" or "gemm" in ev.key.lower():
                    print(f"kernel {ev.key[:140]} {ev.device_time_total:.0f} us")
        except Exception as err:  # noqa: BLE001 - a benchmark reports and goes on
            print(f"profiler: {type(err).__name__}: {str(err)[:90]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(dict(device=name, preset=preset, rows=rows_out), fh, indent=1)
    return 0


if __name__ == "__main__":
    run_cuda_bench(main, "gemm_shapes")
