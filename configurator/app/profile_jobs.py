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
activations); ``fp8`` needs CUDA and Transformer Engine: the four GEMMs become
``transformer_engine.pytorch.Linear`` under ``fp8_autocast`` (hybrid format, delayed
scaling, Megatron's default recipe).

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

DEVICES = ("auto", "cuda", "cpu")
DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 10
MAX_WARMUP = 1000
MAX_REPEATS = 10_000
#: Distinct values of each of --tp, --cp, --mbs.
MAX_VALUES = 64
#: CUDA device-name words → GPU preset, first match wins (GB200 before B200, GB300 before
#: B300). PCIe and NVL boards run at other clocks than the presets' SXM parts: no guess
#: for them.
GPU_NAME_PRESETS = (("GB300", "gb300-288gb"), ("GB200", "gb200-186gb"),
                    ("B300", "b300-288gb"), ("B200", "b200-180gb"), ("H200", "h200-141gb"),
                    ("H100", "h100-80gb"), ("A100", "a100-80gb"))
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


def _device(torch, device: str):
    v.choice("device", device, DEVICES)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device", "cuda", "torch sees no CUDA device")
    return torch.device(device)


def _transformer_engine(device, precision: str):
    """``transformer_engine.pytorch`` for fp8 (None for bf16); InputError without CUDA or
    without Transformer Engine."""
    if precision != "fp8":
        return None
    if device.type != "cuda":
        raise InputError("precision", "fp8", "needs a CUDA device and Transformer Engine "
                                             "(profiling on the CPU)")
    try:
        import transformer_engine.pytorch as te
    except ImportError:
        raise InputError("precision", "fp8", "needs Transformer Engine "
                                             "(transformer_engine is not installed)") from None
    return te


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
    te = _transformer_engine(device, req.precision)
    entries = []
    for shape in (progress(shapes) if progress else shapes):
        fwd, bwd = _time_layer(torch, te, model, shape, device, warmup=warmup,
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
                         entries=tuple(entries), note=moe_note(model))
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
    bwd = np.broadcast_to(np.asarray(costs["bwd"], dtype=float), (n,))
    return tuple(Comparison(entry=e, analytic_forward_s=float(fwd[i]),
                            analytic_backward_s=float(bwd[i]))
                 for i, e in enumerate(layer.entries)), None


# --- torch: build and time one layer -------------------------------------------------------

def _time_layer(torch, te, model: ModelSpec, shape: LayerShapes, device, *, warmup: int,
                repeats: int, seed: int) -> tuple[float, float]:
    """Median forward and backward seconds of one layer at ``shape`` on ``device``."""
    cuda = device.type == "cuda"
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError) if cuda else MemoryError
    try:
        torch.manual_seed(seed)
        forward, params, x, grad = _build_layer(torch, te, model, shape, device)
        fwd_s, bwd_s = [], []
        for i in range(warmup + repeats):
            for p in params:
                p.grad = None
            x.grad = None
            if cuda:
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                ev[0].record()
                out = forward(x)
                ev[1].record()
                out.backward(grad)
                ev[2].record()
                torch.cuda.synchronize(device)
                f, b = ev[0].elapsed_time(ev[1]) / 1e3, ev[1].elapsed_time(ev[2]) / 1e3
            else:
                t0 = time.perf_counter()
                out = forward(x)
                t1 = time.perf_counter()
                out.backward(grad)
                t2 = time.perf_counter()
                f, b = t1 - t0, t2 - t1
            del out
            if i >= warmup:
                fwd_s.append(f)
                bwd_s.append(b)
    except oom:
        raise InputError("tp", shape.tp, f"one layer at cp {shape.cp}, mbs {shape.batch} "
                         f"does not fit in the memory of {device.type}") from None
    finally:
        if cuda:
            torch.cuda.empty_cache()
    # a timer's resolution can read 0 for a tiny layer: the profile holds positive times
    tiny = 1e-9
    return max(statistics.median(fwd_s), tiny), max(statistics.median(bwd_s), tiny)


def _build_layer(torch, te, model: ModelSpec, s: LayerShapes, device):
    """``(forward, parameters, input, output gradient)`` of one decoder layer at ``s``."""
    import torch.nn.functional as F

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
