"""``configurator profile``: time one decoder layer with torch on the local device and write a
profile (:mod:`configurator.core.profile`) the time model can use in place of its analytic
compute; on a GPU, compare with the analytic layer time
(:func:`configurator.cost.compute.layer_costs`).

What is timed, per ``(tp, cp, mbs)`` and the precision: ONE decoder layer at the rank's
shapes (:func:`layer_shapes`), built from plain torch ops that mirror a Megatron-core layer
(``[b, s, h]`` activations, ``s = seq_length / cp`` tokens per sequence on the rank):

* input norm (RMSNorm or LayerNorm, the model's), QKV GEMM of ``(a + 2g)·d / tp`` outputs
  (GQA: ``g / tp`` key-value heads per rank, one when tp is a multiple of g), biases where
  the model has them, q/k norms (``qk_layernorm``), rotary embedding (``rope``; unfused:
  four element-wise ops per tensor);
* core attention: :func:`torch.nn.functional.scaled_dot_product_attention` with
  ``is_causal=True`` over ``a / tp`` heads (attention dropout as the model's). With
  ``cp > 1``, the load-balanced ring of Megatron's context parallelism without its
  exchanges: one causal block of the rank's ``s/cp`` queries and keys, then ``cp − 1``
  non-causal blocks of the queries against ``s/(2cp)`` keys, their outputs summed in place
  of the log-sum-exp merge (``s²/(2cp)`` query-key pairs in all, as Megatron's rank
  computes);
* output projection (``a·d / tp`` inputs), dropout, residual add; norm; fc1 (``2f / tp``
  outputs with SwiGLU, else ``f / tp``), SiLU-gate or GeLU, fc2, dropout, residual add.
* sequence parallelism: norms, dropouts and residual adds on ``s / tp`` tokens; the
  all-gather before QKV/fc1 and the reduce-scatter after the projection/fc2 are replaced by
  local copies of the same output size (a tiled copy / a slice), so no communication is
  timed (tensor- and context-parallel communication is priced separately).

Times: ``warmup`` untimed runs, then ``repeats`` runs of forward and of backward alone (the
gradient of the output is a fixed random tensor; data and weight gradients), the median of
each. On CUDA by ``torch.cuda.Event`` pairs around forward and backward, synchronised after
each run; on the CPU by :func:`time.perf_counter`. bf16 everywhere (weights and
activations). ``fp8``: the four GEMMs in FP8, hybrid format (E4M3 forward, E5M2 gradients,
Megatron's default ``--fp8-format hybrid``), by one of two backends (:func:`fp8_backend`):

* ``transformer_engine`` where it is installed (and on CUDA):
  ``transformer_engine.pytorch.Linear`` under ``fp8_autocast`` with delayed scaling,
  Megatron's default recipe;
* ``torch`` otherwise: :func:`torch._scaled_mm` GEMMs (:func:`_fp8_linear_fn`), as
  Transformer Engine's ``_Linear`` runs them: the input cast to E4M3 with a row-wise and a
  transposed (column-wise) copy for the weight-gradient GEMM, the output gradient to E5M2
  likewise; the weight's two E4M3 copies made once, outside the timed runs (Megatron casts
  weights on the first microbatch of an iteration only). Scales are unit (delayed scaling's
  scale is a number already known) and amax is not reduced: Transformer Engine fuses it
  into its cast, whereas here the cast and the transpose are two torch kernels moving
  5 bytes per element (Transformer Engine's fused cast-transpose: 4). The profile's
  ``note`` names the backend.

Mixture-of-experts models: the dense layer only (attention and a dense MLP of
``ffn_hidden_size``, the layer :func:`~configurator.cost.compute.layer_costs` calls
``fwd``/``bwd``); the profile's ``note`` says so. Multi-latent and sliding-window attention
are refused (one-line error): the layer built here would not mirror them.

torch (and Transformer Engine) are imported only inside :func:`run_profile`, never on the
tool's import path.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec, load_model
from configurator.core.plan import ParallelPlan
from configurator.core.profile import (PROFILE_PRECISIONS, LayerProfile, ProfileEntry,
                                       fingerprint_of)
from configurator.core.rules import check_plan
from topology.gpus import guess_gpu_preset

DEVICES = ("auto", "cuda", "cpu")
DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 10
MAX_WARMUP = 1000
MAX_REPEATS = 10_000
#: Distinct values of each of --tp, --cp, --mbs.
MAX_VALUES = 64
@dataclass(frozen=True, kw_only=True)
class ProfileRequest:
    """``configurator profile``: the model (preset, YAML/JSON file or HF config.json) at
    ``seq_length`` (default its own), the shapes (every combination of ``tp``, ``cp``,
    ``mbs``; ``sequence_parallel`` None: on when tp > 1), the precision, the device
    (``auto``: CUDA when torch sees one, else the CPU), the analytic GPU preset (``gpu``;
    None: guessed from the CUDA device's name), warm-up and timed runs, and the file to
    write (``out``; None: none), refused if it exists unless ``force``."""

    model: str
    tp: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)
    mbs: tuple[int, ...] = (1,)
    sequence_parallel: bool | None = None
    seq_length: int | None = None
    precision: str = "bf16"
    device: str = "auto"
    gpu: str | None = None
    warmup: int = DEFAULT_WARMUP
    repeats: int = DEFAULT_REPEATS
    out: str | None = "profile.yaml"
    force: bool = False
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Profiled against analytic per-layer times (s) of one entry."""

    entry: ProfileEntry
    analytic_forward_s: float
    analytic_backward_s: float

    def to_dict(self) -> dict:
        return {**self.entry.to_dict(), "analytic_forward_s": self.analytic_forward_s,
                "analytic_backward_s": self.analytic_backward_s}


@dataclass(frozen=True, kw_only=True)
class Profile:
    """What ``profile`` measured: the profile (as written), the analytic comparison (GPU
    preset and one row per entry; empty with the reason in ``no_comparison`` when there is
    none), the run settings and the file written (None: none)."""

    layer: LayerProfile
    analytic_gpu: str | None = None
    comparison: tuple[Comparison, ...] = ()
    no_comparison: str | None = None
    warmup: int = DEFAULT_WARMUP
    repeats: int = DEFAULT_REPEATS
    written: str | None = None


@dataclass(frozen=True, kw_only=True)
class LayerShapes:
    """Per-rank sizes of one decoder layer (counts): ``batch`` sequences of ``seq`` tokens
    (``seq_in`` outside the tensor-parallel region: ``seq / tp`` with sequence parallelism),
    ``heads`` query and ``kv_heads`` key-value heads of ``head_dim``, ``qkv_out`` QKV GEMM
    outputs, ``ffn`` MLP units (``fc1_out`` fc1 outputs), ``cp`` ring steps."""

    tp: int
    cp: int
    batch: int
    seq: int
    seq_in: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    qkv_out: int
    ffn: int
    fc1_out: int
    sequence_parallel: bool


def check_profilable(model: ModelSpec) -> None:
    """Raise :class:`InputError` for a model whose layer :func:`layer_shapes` cannot
    mirror (multi-latent or sliding-window attention)."""
    if model.multi_latent_attention:
        raise InputError("model", model.name, "multi-latent attention is not profiled (the "
                         "layer built mirrors GQA/MHA attention only)")
    if model.window_size:
        raise InputError("model", model.name, "sliding-window attention is not profiled (the "
                         "layer built runs full causal attention)")


def layer_shapes(model: ModelSpec, tp: int, cp: int, mbs: int,
                 sequence_parallel: bool) -> LayerShapes:
    """The rank's shapes of one decoder layer at ``tp``, ``cp``, ``mbs``. Raises
    :class:`InputError` where Megatron would refuse the plan (tp and heads or query groups,
    cp and the sequence, sequence parallelism with tp 1; :func:`check_plan`), where tp does
    not divide the FFN, or where sequence parallelism cannot split the rank's tokens."""
    check_profilable(model)
    plan = ParallelPlan(tp=tp, cp=cp, micro_batch_size=mbs, global_batch_size=mbs,
                        sequence_parallel=sequence_parallel)
    check_plan(model, plan, tp * cp)
    f = model.ffn_hidden_size
    if f % tp:
        raise InputError("tp", tp, f"must divide ffn_hidden_size ({f})")
    seq = model.seq_length // cp             # check_plan: cp splits it in 2·cp chunks
    if sequence_parallel and seq % tp:
        raise InputError("sequence_parallel", True, f"tp ({tp}) must divide the rank's "
                         f"{seq} tokens per sequence (seq_length / cp)")
    a, g, d = model.num_attention_heads, model.num_query_groups, model.kv_channels
    heads, kv_heads = a // tp, max(g // tp, 1)
    ffn = f // tp
    return LayerShapes(tp=tp, cp=cp, batch=mbs, seq=seq,
                       seq_in=seq // tp if sequence_parallel else seq,
                       hidden=model.hidden_size, heads=heads, kv_heads=kv_heads, head_dim=d,
                       qkv_out=(heads + 2 * kv_heads) * d, ffn=ffn,
                       fc1_out=2 * ffn if model.swiglu else ffn,
                       sequence_parallel=sequence_parallel)


def moe_note(model: ModelSpec) -> str | None:
    if not model.is_moe:
        return None
    return (f"mixture of experts: the dense layer only (attention and a dense MLP of "
            f"ffn_hidden_size {model.ffn_hidden_size}); the {model.num_moe_layers} MoE "
            f"layers' router and experts are not profiled")


def _note(model: ModelSpec, backend: str | None) -> str | None:
    """The profile's note: the FP8 backend and, for an MoE model, :func:`moe_note`."""
    parts = [moe_note(model)]
    if backend == "transformer_engine":
        parts.append("fp8: Transformer Engine Linear, delayed scaling (hybrid)")
    elif backend == "torch":
        parts.append("fp8: torch._scaled_mm GEMMs (hybrid E4M3/E5M2, unit scales; casts and "
                     "transposes as separate torch kernels; Transformer Engine not used)")
    return "; ".join(p for p in parts if p) or None


def _check_fp8_sizes(s: LayerShapes) -> None:
    """InputError unless every FP8 GEMM dimension of ``s`` is a multiple of
    :data:`FP8_GEMM_MULTIPLE` (torch._scaled_mm's rule)."""
    dims = {"tokens per microbatch": s.batch * s.seq, "hidden_size": s.hidden,
            "QKV outputs per rank": s.qkv_out, "attention width per rank": s.heads * s.head_dim,
            "fc1 outputs per rank": s.fc1_out, "ffn per rank": s.ffn}
    for what, n in dims.items():
        if n % FP8_GEMM_MULTIPLE:
            raise InputError("precision", "fp8", f"torch._scaled_mm needs GEMM sizes divisible "
                                                 f"by {FP8_GEMM_MULTIPLE}: {what} is {n} at "
                                                 f"tp {s.tp}, cp {s.cp}, mbs {s.batch}")


def _values(field_name: str, values: Iterable[int], key: str) -> tuple[int, ...]:
    vals = tuple(values)
    if not vals:
        raise InputError(field_name, vals, "give at least one value")
    if len(vals) > MAX_VALUES:
        raise InputError(field_name, len(vals), f"at most {MAX_VALUES} values")
    out = []
    for x in vals:
        x = v.int_in_range(field_name, x, key)
        if x not in out:
            out.append(x)
    return tuple(out)


def _count(field_name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(field_name, value, f"must be an integer in {lo:,}..{hi:,}")
    return value


def _write(out: str, profile: LayerProfile, force: bool) -> str:
    import yaml

    from launchers.files import write_text_file

    data = profile.to_dict()
    text = (json.dumps(data, indent=2, allow_nan=False) + "\n" if out.endswith(".json")
            else yaml.safe_dump(data, sort_keys=False))
    return write_text_file(out, text, force)


def _import_torch():
    try:
        import torch
    except ImportError:
        raise InputError("profile", "torch", "needs PyTorch (pip install torch)") from None
    return torch


def bench_torch(dry_run: bool):
    """``(torch, cuda)`` for a benchmark that times kernels on the local GPU
    (``bench/kernel_shapes.py``, ``bench/gemm_shapes.py``, ``bench/attention_masks.py``);
    ``dry_run`` lets it run its code path on the CPU. Raises :class:`InputError` without
    torch, or without a CUDA device unless ``dry_run``."""
    torch = _import_torch()
    cuda = torch.cuda.is_available()
    if not cuda and not dry_run:
        raise InputError("device", "cpu", "needs a CUDA device (--dry-run: the CPU)")
    return torch, cuda


def _device(torch, device: str):
    v.choice("device", device, DEVICES)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device", "cuda", "torch sees no CUDA device")
    return torch.device(device)


#: FP8 GEMM backends of ``profile --precision fp8`` (module docstring).
FP8_BACKENDS = ("transformer_engine", "torch")
#: torch._scaled_mm's size rule (cuBLASLt FP8): every GEMM dimension a multiple of 16.
FP8_GEMM_MULTIPLE = 16


def fp8_backend(torch, device, precision: str):
    """``(name, module)`` of the FP8 GEMM backend for ``precision`` fp8 on ``device``:
    ``("transformer_engine", transformer_engine.pytorch)`` on CUDA where it is installed,
    else ``("torch", None)`` (:func:`torch._scaled_mm`); ``(None, None)`` for bf16. Raises
    :class:`InputError` when torch has neither float8 types nor ``_scaled_mm``, or when a
    probe GEMM fails on ``device`` (e.g. a GPU before compute capability 8.9)."""
    if precision != "fp8":
        return None, None
    if device.type == "cuda":
        try:
            import transformer_engine.pytorch as te
            return "transformer_engine", te
        except ImportError:
            pass
    if not (hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")
            and hasattr(torch, "float8_e5m2")):
        raise InputError("precision", "fp8", f"needs Transformer Engine or a torch with "
                                             f"float8 and _scaled_mm (torch "
                                             f"{torch.__version__})")
    n = FP8_GEMM_MULTIPLE
    try:
        a = torch.zeros(n, n, device=device).to(torch.float8_e4m3fn)
        g = torch.zeros(n, n, device=device).to(torch.float8_e5m2)
        one = torch.ones((), device=device)
        torch._scaled_mm(g, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError, TypeError) as err:
        # what torch raises where the device has no FP8 GEMM (a GPU before compute
        # capability 8.9; a CPU build without it) or an older _scaled_mm signature
        first = (str(err).strip().splitlines() or ["failed"])[0][:200]
        raise InputError("precision", "fp8", f"torch._scaled_mm does not run on "
                                             f"{device.type}: {first}") from None
    return "torch", None


def _fp8_linear_fn(torch):
    """An autograd function ``apply(x, w, w8, w8t, bias)``: ``x @ w.T (+ bias)`` with FP8
    GEMMs (module docstring, backend ``torch``). Shapes: ``x [..., K]`` bf16, ``w [N, K]``
    the bf16 parameter (its gradient returned), ``w8 [N, K]`` and ``w8t [K, N]`` its E4M3
    copies (row-major), ``bias [N]`` or None; returns ``[..., N]`` bf16. ``_scaled_mm``
    takes its first operand row-major and its second column-major: forward ``x8 · w8ᵀ``,
    data gradient ``g8 · w8t``ᵀ, weight gradient ``g8ᵀ · x8t``ᵀ."""
    e4m3, e5m2, bf16 = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16

    class Fp8Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, w8, w8t, bias):
            one = torch.ones((), device=x.device)
            lead, k = x.shape[:-1], x.shape[-1]
            x8 = x.reshape(-1, k).to(e4m3)
            x8t = x8.t().contiguous()                   # column-wise copy for wgrad
            out = torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=bf16)
            if bias is not None:
                out = out + bias
            ctx.save_for_backward(x8t, w8t, one)
            ctx.lead, ctx.k, ctx.has_bias = lead, k, bias is not None
            return out.view(*lead, w8.shape[0])

        @staticmethod
        def backward(ctx, grad):
            x8t, w8t, one = ctx.saved_tensors
            g = grad.reshape(-1, grad.shape[-1])
            g8 = g.to(e5m2)
            g8t = g8.t().contiguous()
            dx = torch._scaled_mm(g8, w8t.t(), scale_a=one, scale_b=one, out_dtype=bf16)
            dw = torch._scaled_mm(g8t, x8t.t(), scale_a=one, scale_b=one, out_dtype=bf16)
            db = g.sum(0) if ctx.has_bias else None
            return dx.view(*ctx.lead, ctx.k), dw, None, None, db

    return Fp8Linear


def run_profile(req: ProfileRequest, progress: Callable | None = None) -> Profile:
    """Profile one decoder layer at every requested shape (see the module docstring), write
    the profile to ``req.out`` (checked before anything runs) and, on a CUDA device with a
    GPU preset, compare with the analytic layer time. ``progress`` wraps the list of shapes
    (e.g. a tqdm bar). Raises :class:`InputError` for bad input, a shape Megatron would
    refuse, fp8 without CUDA and Transformer Engine, or a layer that does not fit."""
    v.choice("precision", req.precision, PROFILE_PRECISIONS)
    warmup = _count("warmup", req.warmup, 0, MAX_WARMUP)
    repeats = _count("repeats", req.repeats, 1, MAX_REPEATS)
    tps = _values("tp", req.tp, "tp")
    cps = _values("cp", req.cp, "cp")
    mbss = _values("mbs", req.mbs, "mbs")
    if req.gpu is not None:
        from topology.gpus import gpu_from_config

        gpu_from_config(req.gpu)          # an unknown preset is an error before any run
    model = load_model(req.model)
    if req.seq_length is not None:
        model = model.with_seq_length(req.seq_length)
    sp_of = {tp: (tp > 1 if req.sequence_parallel is None else req.sequence_parallel)
             for tp in tps}
    shapes = [layer_shapes(model, tp, cp, mbs, sp_of[tp])
              for tp in tps for cp in cps for mbs in mbss]
    if req.out is not None:
        from launchers.files import check_out_file

        check_out_file(req.out, req.force)

    torch = _import_torch()
    device = _device(torch, req.device)
    backend, te = fp8_backend(torch, device, req.precision)
    if backend == "torch":
        for shape in shapes:
            _check_fp8_sizes(shape)
    entries = []
    for shape in (progress(shapes) if progress else shapes):
        fwd, bwd = _time_layer(torch, (backend, te), model, shape, device, warmup=warmup,
                               repeats=repeats, seed=req.seed)
        entries.append(ProfileEntry(tp=shape.tp, cp=shape.cp, mbs=shape.batch,
                                    sequence_parallel=shape.sequence_parallel,
                                    forward_s=fwd, backward_s=bwd))
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    preset = (req.gpu or guess_gpu_preset(name)) if cuda else None
    layer = LayerProfile(device=" ".join(name.split())[:128] or "cuda", gpu_preset=preset,
                         torch_version=str(torch.__version__)[:128] or "unknown",
                         model=model.name, model_fingerprint=fingerprint_of(model),
                         precision=req.precision, seq_length=model.seq_length,
                         entries=tuple(entries), note=_note(model, backend))
    comparison, why = (), None
    if not cuda:
        why = "the analytic comparison needs a GPU (profiled on the CPU)"
    elif preset is None:
        why = (f"no GPU preset for {name!r}: give --gpu PRESET for the analytic comparison")
    else:
        comparison, why = analytic_comparison(model, layer, preset)
    written = _write(req.out, layer, req.force) if req.out is not None else None
    return Profile(layer=layer, analytic_gpu=preset if comparison else None,
                   comparison=comparison, no_comparison=why, warmup=warmup, repeats=repeats,
                   written=written)


def analytic_comparison(model: ModelSpec, layer: LayerProfile,
                        gpu_preset: str) -> tuple[tuple[Comparison, ...], str | None]:
    """The analytic per-layer ``fwd``/``bwd`` (:func:`configurator.cost.compute.layer_costs`)
    of every entry of ``layer`` on ``gpu_preset``: ``(rows, None)``, or ``((), reason)``
    when the GPU cannot run the precision."""
    from configurator.core.candidates import Candidates
    from configurator.cost.compute import layer_costs
    from topology.gpus import gpu_from_config

    gpu = gpu_from_config(gpu_preset)
    plans = [ParallelPlan(tp=e.tp, cp=e.cp, micro_batch_size=e.mbs, global_batch_size=e.mbs,
                          sequence_parallel=e.sequence_parallel, precision=layer.precision)
             for e in layer.entries]
    try:
        costs = layer_costs(model, Candidates.from_plans(plans), gpu)
    except InputError as err:
        return (), f"no analytic comparison: {err}"
    n = len(plans)
    fwd = np.broadcast_to(np.asarray(costs["fwd"], dtype=float), (n,))
    # like for like: the profiled layer writes fresh gradients, Megatron accumulates them
    bwd = np.broadcast_to(np.asarray(costs["bwd"] - costs["main_grad_acc"], dtype=float), (n,))
    return tuple(Comparison(entry=e, analytic_forward_s=float(fwd[i]),
                            analytic_backward_s=float(bwd[i]))
                 for i, e in enumerate(layer.entries)), None


# --- torch: build and time one layer -------------------------------------------------------

def time_forward_backward(torch, forward: Callable, backward: Callable, *, warmup: int,
                          repeats: int, cuda: bool, before: Callable | None = None
                          ) -> tuple[float, float]:
    """Median seconds ``(forward, backward)`` of ``out = forward()`` then ``backward(out)``
    over ``repeats`` runs after ``warmup`` untimed ones: CUDA events on a GPU (``cuda``),
    :func:`time.perf_counter` on the CPU; ``before()`` runs ahead of each run, untimed.
    The profiler's timing, and ``bench/kernel_shapes.py``'s and ``bench/gemm_shapes.py``'s."""
    fwd_s, bwd_s = [], []
    for i in range(warmup + repeats):
        if before is not None:
            before()
        if cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record()
            out = forward()
            ev[1].record()
            backward(out)
            ev[2].record()
            torch.cuda.synchronize()
            f, b = ev[0].elapsed_time(ev[1]) / 1e3, ev[1].elapsed_time(ev[2]) / 1e3
        else:
            t0 = time.perf_counter()
            out = forward()
            t1 = time.perf_counter()
            backward(out)
            f, b = t1 - t0, time.perf_counter() - t1
        del out
        if i >= warmup:
            fwd_s.append(f)
            bwd_s.append(b)
    return statistics.median(fwd_s), statistics.median(bwd_s)


def _time_layer(torch, fp8, model: ModelSpec, shape: LayerShapes, device, *, warmup: int,
                repeats: int, seed: int) -> tuple[float, float]:
    """Median forward and backward seconds of one layer at ``shape`` on ``device``."""
    cuda = device.type == "cuda"
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError) if cuda else MemoryError
    try:
        torch.manual_seed(seed)
        forward, params, x, grad = _build_layer(torch, fp8, model, shape, device)

        def fresh_grads():
            for p in params:
                p.grad = None
            x.grad = None

        fwd, bwd = time_forward_backward(torch, lambda: forward(x),
                                         lambda out: out.backward(grad), warmup=warmup,
                                         repeats=repeats, cuda=cuda, before=fresh_grads)
    except oom:
        raise InputError("tp", shape.tp, f"one layer at cp {shape.cp}, mbs {shape.batch} "
                         f"does not fit in the memory of {device.type}") from None
    finally:
        if cuda:
            torch.cuda.empty_cache()
    # a timer's resolution can read 0 for a tiny layer: the profile holds positive times
    tiny = 1e-9
    return max(fwd, tiny), max(bwd, tiny)


def _build_layer(torch, fp8, model: ModelSpec, s: LayerShapes, device):
    """``(forward, parameters, input, output gradient)`` of one decoder layer at ``s``;
    ``fp8``: ``(backend, module)`` of :func:`fp8_backend` (``(None, None)``: bf16)."""
    import torch.nn.functional as F

    backend, te = fp8
    fp8_linear = _fp8_linear_fn(torch) if backend == "torch" else None
    dtype = torch.bfloat16
    params: list = []

    def param(*size, fill=None):
        t = (torch.full(size, fill, dtype=dtype, device=device) if fill is not None
             else torch.randn(*size, dtype=dtype, device=device) * 0.02)
        t.requires_grad_(True)
        params.append(t)
        return t

    def linear(n_in: int, n_out: int, bias: bool):
        if te is not None:
            m = te.Linear(n_in, n_out, bias=bias, params_dtype=dtype, device=device)
            params.extend(m.parameters())
            return m
        w = param(n_out, n_in)
        b = param(n_out, fill=0.0) if bias else None
        if fp8_linear is not None:
            with torch.no_grad():
                w8 = w.to(torch.float8_e4m3fn)
                w8t = w8.t().contiguous()
            return lambda t: fp8_linear.apply(t, w, w8, w8t, b)
        return lambda t: F.linear(t, w, b)

    def norm(width: int):
        w = param(width, fill=1.0)
        eps = model.norm_epsilon
        if model.normalization == "RMSNorm":
            if hasattr(F, "rms_norm"):
                return lambda t: F.rms_norm(t, (width,), w, eps)
            return lambda t: t * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True)
                                             + eps).to(t.dtype) * w
        b = param(width, fill=0.0)
        return lambda t: F.layer_norm(t, (width,), w, b, eps)

    class Gather(torch.autograd.Function):
        """Sequence parallelism's all-gather (backward: reduce-scatter), as local copies."""

        @staticmethod
        def forward(ctx, t):
            ctx.n = t.shape[1]
            return t.repeat(1, s.tp, 1)

        @staticmethod
        def backward(ctx, g):
            return g[:, :ctx.n].contiguous()

    class Scatter(torch.autograd.Function):
        """Sequence parallelism's reduce-scatter (backward: all-gather), as local copies."""

        @staticmethod
        def forward(ctx, t):
            return t[:, :s.seq_in].contiguous()

        @staticmethod
        def backward(ctx, g):
            return g.repeat(1, s.tp, 1)

    h, d = s.hidden, s.head_dim
    bias = model.add_bias_linear
    norm1, norm2 = norm(h), norm(h)
    qkv = linear(h, s.qkv_out, bias or model.add_qkv_bias)
    proj = linear(s.heads * d, h, bias)
    fc1 = linear(h, s.fc1_out, bias)
    fc2 = linear(s.ffn, h, bias)
    q_norm = k_norm = None
    if model.qk_layernorm:
        q_norm, k_norm = norm(d), norm(d)
    rope = None
    if model.position_embedding_type == "rope":
        inv = 1.0 / (model.rotary_base ** (torch.arange(0, d, 2, device=device,
                                                        dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(s.seq, device=device, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)[:, None, :]           # [s, 1, d]
        rope = (ang.cos().to(dtype), ang.sin().to(dtype))
    p_hidden, p_attn = model.hidden_dropout, model.attention_dropout
    gqa = s.kv_heads != s.heads
    # enable_gqa (torch >= 2.5) lets the kernel read each key-value head for its group;
    # older torch repeats the key-value heads (a copy Megatron does not make)
    native_gqa = tuple(int(x) for x in str(torch.__version__).split(".")[:2]) >= (2, 5)

    def rotary(t):
        cos, sin = rope
        t1, t2 = t.chunk(2, dim=-1)
        return t * cos + torch.cat([-t2, t1], dim=-1) * sin

    def attention(q, k, v):
        kw = dict(dropout_p=p_attn)
        if gqa and native_gqa:
            kw["enable_gqa"] = True
        elif gqa:
            k = k.repeat_interleave(s.heads // s.kv_heads, dim=1)
            v = v.repeat_interleave(s.heads // s.kv_heads, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
        half = s.seq // 2
        for _ in range(s.cp - 1):      # the ring's other blocks: queries vs half the keys
            o = o + F.scaled_dot_product_attention(q, k[:, :, :half], v[:, :, :half],
                                                   is_causal=False, **kw)
        return o

    def dropout(t):
        return F.dropout(t, p_hidden, training=True) if p_hidden > 0 else t

    def mlp_act(t):
        if model.swiglu:
            a, b = t.chunk(2, dim=-1)
            return F.silu(a) * b
        return F.gelu(t)

    def forward(x):
        b = x.shape[0]
        y = norm1(x)
        if s.sequence_parallel:
            y = Gather.apply(y)
        q, k, v = qkv(y).split([s.heads * d, s.kv_heads * d, s.kv_heads * d], dim=-1)
        q = q.view(b, s.seq, s.heads, d)
        k = k.view(b, s.seq, s.kv_heads, d)
        v = v.view(b, s.seq, s.kv_heads, d)
        if q_norm is not None:
            q, k = q_norm(q), k_norm(k)
        if rope is not None:
            q, k = rotary(q), rotary(k)
        o = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        o = proj(o.transpose(1, 2).reshape(b, s.seq, s.heads * d))
        if s.sequence_parallel:
            o = Scatter.apply(o)
        x = x + dropout(o)
        y = norm2(x)
        if s.sequence_parallel:
            y = Gather.apply(y)
        y = fc2(mlp_act(fc1(y)))
        if s.sequence_parallel:
            y = Scatter.apply(y)
        return x + dropout(y)

    if te is not None:
        from transformer_engine.common.recipe import DelayedScaling, Format

        recipe = DelayedScaling(fp8_format=Format.HYBRID)
        plain = forward

        def forward(x):  # noqa: F811 - the same layer, its GEMMs in FP8
            with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
                return plain(x)

    x = torch.randn(s.batch, s.seq_in, h, dtype=dtype, device=device, requires_grad=True)
    grad = torch.randn(s.batch, s.seq_in, h, dtype=dtype, device=device)
    return forward, params, x, grad
