"""Fused attention with and without the causal mask over a sweep of key lengths, timed on the
local CUDA GPU against the shapes of :func:`configurator.cost.compute.flash_efficiency`.

Context parallelism's ``p2p`` ring runs its first step causal and the others unmasked
(:func:`configurator.cost.compute.cp_causal_share`); the model prices the two with one
long-sequence efficiency and two half-efficiency key lengths (:data:`compute.FLASH_HALF_TOKENS`
for causal calls, :data:`compute.FLASH_HALF_TOKENS_NO_MASK` for unmasked ones). This times
torch's ``scaled_dot_product_attention`` with the cuDNN backend (the fused attention
Transformer Engine calls) and the FlashAttention-2 backend, forward and backward, at a fixed
number of tokens per call (``batch · s``, as FlashAttention-3's Fig. 5), and prints TFLOP/s
(useful pairs only: half of ``s²`` causal), each over the longest unmasked run's, next to
the model's ratio; then the half-efficiency key lengths fitted to the measurements
(least squares on the log ratio, scipy), per backend, mask and pass, and for both passes
at one rate as the model prices them (``--csv FILE`` keeps the rates:
``tests/data/attention_masks.csv``).

Causal calls are also timed with attention dropout (``--dropout``, 0.1), which the kernel draws
for every score it visits: the extra time per visited score against
:data:`compute.ATTENTION_DROPOUT_SCORES_PER_SM_S`.

Run (needs CUDA; torch ≥ 2.5): ``python -m bench.kernels.attention_masks [--heads 32]
[--head-dim 128] [--tokens 65536] [--lengths 512,1024,…] [--dropout 0.1] [--csv FILE]``;
``--dry-run`` runs the smallest shapes on the CPU (the code path, not timings).
"""

from __future__ import annotations

import argparse
import math

from bench.common import bench_parser, run_cuda_bench
from configurator.cost import compute
from configurator.profiler.timing import bench_torch, time_forward_backward

DEFAULT_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
#: Key lengths past which the dropout variant is not timed (training lengths with dropout).
DROPOUT_MAX_KEYS = 8192


def _lengths(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--lengths {text!r}: comma-separated key lengths expected") from None
    if not out or min(out) < 16:
        raise argparse.ArgumentTypeError(f"--lengths {text!r}: each at least 16 keys")
    return out


def _fit_half_tokens(points) -> float | None:
    """Half-efficiency key length ``k0`` whose ``s/(s+k0)`` over the longest point's best
    matches the measured rate ratios (least squares on the log ratio)."""
    from scipy.optimize import minimize_scalar

    if len(points) < 3:
        return None
    s_max, r_max = max(points)

    def loss(k0):
        return sum((math.log(r / r_max) - math.log(s / (s + k0) * (s_max + k0) / s_max)) ** 2
                   for s, r in points)
    return float(minimize_scalar(loss, bounds=(1.0, 20000.0), method="bounded").x)


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=65536,
                    help="query tokens per call, batch × sequence (default 65536)")
    ap.add_argument("--lengths", type=_lengths, default=DEFAULT_LENGTHS,
                    help="key lengths, comma-separated (each divides --tokens)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--dropout", type=float, default=0.1,
                    help="attention dropout also timed on causal calls up to 8k keys "
                         "(default 0.1)")
    ap.add_argument("--csv", metavar="FILE",
                    help="also write the measured rates (TFLOP/s) to FILE")
    ap.add_argument("--dry-run", action="store_true",
                    help="without CUDA, run the smallest shapes on the CPU (no timings)")
    args = ap.parse_args(argv)
    if not 0.0 < args.dropout < 1.0:
        ap.error(f"--dropout {args.dropout}: a probability strictly between 0 and 1")
    for s in args.lengths:
        if args.tokens % s:
            ap.error(f"--lengths: {s} does not divide --tokens {args.tokens}")
    torch, cuda = bench_torch(args.dry_run)     # InputError: the entry point below
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dev = torch.device("cuda" if cuda else "cpu")
    lengths = args.lengths if cuda else (64, 128)
    tokens = args.tokens if cuda else 256
    heads, d = args.heads, args.head_dim
    backends = ((("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))
                if cuda else (("math", SDPBackend.MATH),))
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{name}: {heads} heads, head dim {d}, {tokens} query tokens per call; TFLOP/s "
          f"(useful pairs), median of {args.repeats} after {args.warmup} warm-up")
    print(f"{'backend':<6} {'mask':<7} {'keys':>6} {'fwd':>7} {'bwd':>7} {'fwd/best':>9} "
          f"{'bwd/best':>9} {'model':>7}")
    results, seconds, dropped = {}, {}, {}
    variants = ((True, 0.0), (False, 0.0), (True, args.dropout))
    for label, backend in backends:
        for causal, p in variants:
            for s in lengths:
                if p and s > DROPOUT_MAX_KEYS:
                    continue
                b = tokens // s
                q, k, v = (torch.randn(b, heads, s, d, dtype=torch.bfloat16, device=dev,
                                       requires_grad=True) for _ in range(3))
                go = torch.randn(b, heads, s, d, dtype=torch.bfloat16, device=dev)
                try:
                    with sdpa_kernel([backend]):
                        f, bw = time_forward_backward(
                            torch, lambda: F.scaled_dot_product_attention(
                                q, k, v, is_causal=causal, dropout_p=p),
                            lambda o: o.backward(go), warmup=args.warmup,
                            repeats=args.repeats, cuda=cuda)
                except RuntimeError as err:
                    print(f"{label} {'causal' if causal else 'none'} dropout {p} {s}: "
                          f"{str(err).splitlines()[0][:90]}")
                    continue
                flops = 4.0 * b * heads * s * s * d * (0.5 if causal else 1.0)
                if p:
                    dropped[(label, s)] = (f, bw, b * heads * s * s * 0.5)
                else:
                    results[(label, causal, s)] = (flops / f, 2.5 * flops / bw)
                    seconds[(label, causal, s)] = (f, bw)
    for label, _ in backends:
        best = [results[(label, False, s)] for s in lengths if (label, False, s) in results]
        if not best:
            continue
        s_max = max(s for s in lengths if (label, False, s) in results)
        ref_f, ref_b = results[(label, False, s_max)]
        for causal in (True, False):
            share = 1.0 if causal else 0.0
            model_ref = compute.flash_efficiency(1.0, s_max, 0.0)
            for s in lengths:
                if (label, causal, s) not in results:
                    continue
                rf, rb = results[(label, causal, s)]
                model = float(compute.flash_efficiency(1.0, s, share) / model_ref)
                print(f"{label:<6} {'causal' if causal else 'none':<7} {s:>6} {rf / 1e12:7.1f} "
                      f"{rb / 1e12:7.1f} {rf / ref_f:9.3f} {rb / ref_b:9.3f} {model:7.3f}")
    print("\nfitted half-efficiency key lengths (model: causal "
          f"{compute.FLASH_HALF_TOKENS:.0f}, unmasked {compute.FLASH_HALF_TOKENS_NO_MASK:.0f}; "
          "combined: the forward and 2.5x the backward at one rate, as the model prices them):")
    for label, _ in backends:
        for causal in (True, False):
            fits = []
            for pass_name in ("forward", "backward", "combined"):
                pts = [(s, _rate(results[(label, causal, s)], pass_name)) for s in lengths
                       if (label, causal, s) in results]
                k0 = _fit_half_tokens(pts)
                if k0 is not None:
                    fits.append(f"{pass_name} {k0:.0f}")
            if fits:
                print(f"  {label} {'causal' if causal else 'unmasked'}: {', '.join(fits)}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 1
    model_ps = [1e12 / (r * sms) for r in compute.ATTENTION_DROPOUT_SCORES_PER_SM_S]
    print(f"\nattention dropout {args.dropout} (causal): extra ps per visited score, forward / "
          f"backward (model {model_ps[0]:.2f} / {model_ps[1]:.2f} on {sms} SMs):")
    for (label, s), (f, bw, visited) in dropped.items():
        if (label, True, s) in seconds:
            f0, b0 = seconds[(label, True, s)]
            print(f"  {label} {s}: {1e12 * (f - f0) / visited:.2f} / "
                  f"{1e12 * (bw - b0) / visited:.2f} (forward {f / f0:.2f}x, backward "
                  f"{bw / b0:.2f}x)")
    if args.csv:
        with open(args.csv, "w", encoding="utf-8") as fh:
            fh.write("device,sms,backend,heads,head_dim,mask,keys,dropout,forward_tflops,"
                     "backward_tflops\n")
            for (label, causal, s), (rf, rb) in results.items():
                fh.write(f"{name},{sms},{label},{heads},{d},{'causal' if causal else 'none'},"
                         f"{s},0,{rf / 1e12:.1f},{rb / 1e12:.1f}\n")
            for (label, s), (f, bw, visited) in dropped.items():
                flops = 4.0 * visited * d
                fh.write(f"{name},{sms},{label},{heads},{d},causal,{s},{args.dropout},"
                         f"{flops / f / 1e12:.1f},{2.5 * flops / bw / 1e12:.1f}\n")
    return 0


def _rate(rates: tuple[float, float], pass_name: str) -> float:
    """The forward or backward rate, or both passes' (forward plus 2.5× its FLOPs
    backward) at one rate."""
    forward, backward = rates
    if pass_name == "combined":
        return 3.5 / (1.0 / forward + 2.5 / backward)
    return forward if pass_name == "forward" else backward


if __name__ == "__main__":
    run_cuda_bench(main, "attention_masks")
