"""One decoder layer re-implemented in plain torch ops and timed on the local device, what
``configurator profile`` (:mod:`configurator.app.profile_jobs`) writes into a layer profile.

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
* ``torch`` otherwise: :func:`torch._scaled_mm` GEMMs (:func:`fp8_linear_fn`), as
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

torch and Transformer Engine are imported only inside functions (the caller passes the
torch module in, :func:`configurator.profiler.timing.import_torch`), never on the tool's
import path.
"""

from __future__ import annotations

from dataclasses import dataclass

from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from configurator.core.rules import check_plan
from configurator.profiler.timing import time_forward_backward


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


def check_fp8_sizes(s: LayerShapes) -> None:
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


def fp8_linear_fn(torch):
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


def time_layer(torch, fp8, model: ModelSpec, shape: LayerShapes, device, *, warmup: int,
               repeats: int, seed: int) -> tuple[float, float]:
    """Median forward and backward seconds of one layer at ``shape`` on ``device``."""
    cuda = device.type == "cuda"
    oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError) if cuda else MemoryError
    try:
        torch.manual_seed(seed)
        forward, params, x, grad = build_layer(torch, fp8, model, shape, device)

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


def build_layer(torch, fp8, model: ModelSpec, s: LayerShapes, device):
    """``(forward, parameters, input, output gradient)`` of one decoder layer at ``s``;
    ``fp8``: ``(backend, module)`` of :func:`fp8_backend` (``(None, None)``: bf16)."""
    import torch.nn.functional as F

    backend, te = fp8
    fp8_linear = fp8_linear_fn(torch) if backend == "torch" else None
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
