"""Reference measurement: bytes megatron-core's GPTModel saves for backward, on CPU.

A test helper (not collected: no ``test_`` prefix). It builds megatron-core 0.16.1's
``GPTModel`` with ``get_gpt_layer_local_spec()`` (megatron-core's own ``DotProductAttention``,
which materialises the s×s scores: the configurator's ``attention_backend="local"``) in bf16 on
CPU, runs one forward and backward of a microbatch under
``torch.autograd.graph.saved_tensors_hooks`` and records every tensor autograd keeps, once per
storage (``untyped_storage().data_ptr()``, bytes = ``untyped_storage().nbytes()``), skipping
parameters and the model's inputs (token ids, position ids, labels, the causal mask: they are
held by the data path whether or not anything is saved). A packed tensor counts as live until
autograd drops it, so the tracker also gives the peak over forward *and* backward (which is
where full and selective recompute peak: the recomputed layer's tensors exist then).

What is measured is the real megatron-core code, not a re-implementation: the layer's
structure (which views keep which storages, what the checkpoints keep, where dropout and
the fused activation functions sit) is what the memory model must get right. Where the CPU fallback of an op keeps
different tensors than the GPU kernel Megatron runs in training, the op is configured or
replaced so that it keeps what the GPU kernel keeps (the memory model predicts GPU memory):

* softmax: ``masked_softmax_fusion=False`` and ``attention_softmax_in_fp32=False``, so
  ``FusedScaleMaskSoftmax.forward_torch_softmax`` (megatron/core/fusions/fused_softmax.py)
  saves a bf16 softmax output, as the fused kernel ``ScaledUpperTriangMaskedSoftmax`` saves its
  16-bit ``softmax_results``; with the fp32 default the CPU path would save an fp32 copy (2×).
  The causal mask is passed in (``get_default_causal_mask`` allocates on "cuda"); the
  ``masked_fill_`` that keeps it is a model input, not counted (the fused kernel keeps none).
* dropout: ``torch.nn.functional.dropout`` with ``0 < p < 1`` in training is routed to
  ``torch.native_dropout``, which is what ATen's ``dropout`` dispatches to on CUDA
  (aten/src/ATen/native/Dropout.cpp, ``is_fused_kernel_acceptable``); it keeps a 1-byte bool
  mask, while the CPU fallback keeps a mask in the input dtype (2 bytes). ``p == 0`` is left
  alone (ATen returns the input and keeps nothing, on either device).
* RMSNorm: ``torch.nn.RMSNorm`` (megatron-core's ``WrappedTorchNorm`` for the local spec) is
  replaced by an autograd function keeping the bf16 input and the fp32 ``rstd``, as the CUDA
  ``_fused_rms_norm`` kernel (torch ≥ 2.8), Apex and Transformer Engine RMSNorm do; torch's
  CPU composite keeps fp32 copies of the input and of the normalised input.
* megatron's ``jit_fuser`` (``torch.compile``) is disabled, so the fused bias-GeLU /
  SwiGLU autograd functions and bias-dropout-add run eagerly and keep the tensors their
  eager code saves (the activation input; the dropout mask).
* RoPE: megatron-core's unfused path (``rope_utils._apply_rotary_pos_emb_bshd``) keeps
  per-call ``cos``/``sin`` factors (4 × s·d per layer); Megatron trains with
  ``apply_rope_fusion`` (``--rope-fusion``, the default), whose Transformer Engine kernel
  keeps only the shared frequencies, so those tensors are tallied apart, not counted.
* CUDA-only helpers: ``GlobalMemoryBuffer.get_tensor``,
  ``CudaRNGStatesTracker.fork``, ``_get_cuda_rng_state``/``_set_cuda_rng_state``, and
  ``torch.cuda.current_device`` (``RotaryEmbedding.get_emb`` moves ``inv_freq`` to it).

Mixture of experts (:data:`MOE_CONFIGS`): megatron-core's ``MoELayer`` with the local spec
(``TopKRouter``, ``MoEAlltoAllTokenDispatcher``, ``SequentialMLP`` of ``ColumnParallelLinear``/
``RowParallelLinear`` experts; ``get_gpt_decoder_block_spec`` for a dense/MoE mix), ep = etp
= 1, dropless, default ``aux_loss`` load balancing (coefficient 1e-2), no router or permute
fusion (those are Transformer Engine kernels). The experts' GEMMs, the SwiGLU with per-token
probabilities (``weighted_bias_swiglu_impl``), the permutation (``moe_utils.permute``: index
select, keeps ``sorted_indices``) and the router run the same eager code on CPU as on GPU. CPU
needs: ``moe_utils``' Transformer Engine names (``te_general_gemm``, ``fused_*``) set to None
(its ``try: import`` leaves them undefined), ``torch.cuda.Stream``/``current_stream``/
``stream`` stubs (the all-to-all dispatcher's device-to-host copy of the token counts), and
the aux-loss logging tracker cleared between models (it is sized by the first model's
layers).

These patches are global, so the measurement runs in a subprocess (:func:`run_reference`),
which also initialises the gloo process group (world size 1) only once for all configs.

Run ``python tests/megatron_reference.py --show gpt`` to print the tensors one layer keeps,
``--table`` for measured vs model bytes of every config (dense and MoE; name configs to
pick, e.g. ``--table moe moe-shared moe-mixed``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

#: Sequence length and micro-batch size of every reference run.
SEQ, MBS = 128, 2

_GPT = dict(hidden_size=256, num_attention_heads=8, vocab_size=1024, seq_length=SEQ)
_LLAMA = dict(_GPT, swiglu=True, normalization="RMSNorm", add_bias_linear=False,
              hidden_dropout=0.0, attention_dropout=0.0, position_embedding_type="rope",
              untie_embeddings_and_output_weights=True)

#: Reference configurations: ModelSpec keyword arguments plus ``recompute``.
CONFIGS: dict[str, dict] = {
    "gpt": dict(_GPT, recompute="none"),
    "gpt-selective": dict(_GPT, recompute="selective"),
    # 32 heads of 8 channels: the recomputed scores outgrow the output-layer terms, so the
    # selective-recompute peak falls in backward.
    "gpt-selective-32heads": dict(_GPT, num_attention_heads=32, recompute="selective"),
    "gpt-full": dict(_GPT, recompute="full"),
    "gpt-gqa": dict(_GPT, num_query_groups=2, recompute="none"),
    "gpt-gqa-selective": dict(_GPT, num_query_groups=2, recompute="selective"),
    "gpt-rope-selective": dict(_GPT, position_embedding_type="rope", recompute="selective"),
    "llama": dict(_LLAMA, recompute="none"),
    "llama-gqa": dict(_LLAMA, num_query_groups=2, recompute="none"),
    "llama-gqa-selective": dict(_LLAMA, num_query_groups=2, recompute="selective"),
    "llama-gqa-full": dict(_LLAMA, num_query_groups=2, recompute="full"),
    # selective recompute of the dense MLP alone (TransformerLayer._forward_mlp)
    "llama-mlp": dict(_LLAMA, num_query_groups=2, recompute="selective",
                      recompute_modules="mlp"),
    # heads wider than the hidden size (8 heads of 64 channels = 512 > 256, as Qwen3's 64 of
    # 128 over 4,096): linear_proj's input is a·d wide, not h
    "llama-wide-heads": dict(_LLAMA, num_query_groups=2, kv_channels=64, recompute="none"),
}

#: Mixture-of-experts layers (Llama-style attention, 4 query groups): 4 experts of 384, top-2,
#: all-to-all dispatcher, ep = etp = 1, SequentialMLP (``moe_grouped_gemm=False``), dropless,
#: the default ``aux_loss`` load balancing with ``moe_aux_loss_coeff`` 1e-2 (its fp32
#: softmax scores are kept), unfused router and permutation (Transformer Engine only).
_MOE = dict(_LLAMA, num_query_groups=4, num_experts=4, moe_router_topk=2,
            moe_ffn_hidden_size=384)

#: MoE reference configurations (ModelSpec keywords, ``recompute``, ``num_layers``: the
#: measured model; its per-layer figure is that model minus its last layer).
MOE_CONFIGS: dict[str, dict] = {
    "moe": dict(_MOE, num_layers=2, recompute="none"),
    "moe-shared": dict(_MOE, num_layers=2, moe_shared_expert_intermediate_size=256,
                       recompute="none"),
    # layer 0 dense (ffn 1024), layers 1-2 MoE: megatron's get_gpt_decoder_block_spec
    "moe-mixed": dict(_MOE, num_layers=3, ffn_hidden_size=1024, moe_layer_freq=(0, 1, 1),
                      recompute="none"),
    "moe-selective": dict(_MOE, num_layers=2, recompute="selective"),
    # the whole MoE layer (router, dispatch, experts) is recomputed in backward
    "moe-full": dict(_MOE, num_layers=2, recompute="full"),
    # selective recompute of the MoE MLP (MoELayer's custom_forward) and of the shared expert
    "moe-recompute-moe": dict(_MOE, num_layers=2, recompute="selective",
                              recompute_modules="moe"),
    "moe-shared-recompute": dict(_MOE, num_layers=2, moe_shared_expert_intermediate_size=256,
                                 recompute="selective", recompute_modules="shared_experts"),
    # drop-and-pad: every expert takes ceil(T*k/E*1.5) tokens, padded
    "moe-capacity-pad": dict(_MOE, num_layers=2, recompute="none", capacity=(1.5, True)),
}

#: Every reference configuration, dense and MoE.
ALL_CONFIGS: dict[str, dict] = {**CONFIGS, **MOE_CONFIGS}

#: Megatron-side settings of the MoE configs that the ModelSpec does not carry.
MOE_DISPATCHER, MOE_AUX_LOSS_COEFF = "alltoall", 1e-2

#: Keys of a config that are not ModelSpec keywords: the recompute (and its
#: ``recompute_modules``), the measured model's layers and the MoE capacity factor with its
#: padding.
_NOT_SPEC = ("recompute", "num_layers", "recompute_modules", "capacity")


def recompute_of(name: str) -> int:
    """The recompute code of config ``name`` (its modules' bits with selective)."""
    from configurator.core.plan_terms import recompute_code
    c = ALL_CONFIGS[name]
    return int(recompute_code(c["recompute"], c.get("recompute_modules", "core_attn")))


def capacity_of(name: str) -> float:
    """The routed copies' share of config ``name`` (``capacity_share`` of its factor)."""
    from types import SimpleNamespace

    from configurator.core.plan_terms import capacity_share
    cf, pad = ALL_CONFIGS[name].get("capacity", (0.0, False))
    return capacity_share(SimpleNamespace(moe_expert_capacity_factor=cf,
                                          moe_pad_expert_input_to_capacity=pad))


def num_layers(name: str) -> int:
    """Decoder layers of the measured model of config ``name`` (2 unless the config says)."""
    return ALL_CONFIGS[name].get("num_layers", 2)


def model_spec(name: str, num_layers: int | None = None):
    """The configurator's ModelSpec of reference config ``name`` (``num_layers``: default
    the config's; fewer cut a ``moe_layer_freq`` list to its first layers)."""
    from configurator.core.model import make_model
    kw = {k: v for k, v in ALL_CONFIGS[name].items() if k not in _NOT_SPEC}
    n = num_layers or ALL_CONFIGS[name].get("num_layers", 2)
    if isinstance(kw.get("moe_layer_freq"), (list, tuple)):
        kw["moe_layer_freq"] = list(kw["moe_layer_freq"])[:n]
    return make_model(name=name, num_layers=n, **kw)


def run_reference(names=None, timeout_s: float = 300.0) -> dict:
    """Measure ``names`` (default: the dense :data:`CONFIGS`; any of :data:`ALL_CONFIGS`)
    in one subprocess.

    Returns ``{name: {...}}`` with, in bytes unless said: ``layer_bytes`` (kept at the end of
    the forward with the config's layers, 2 by default, minus with one fewer),
    ``forward_end_bytes``, ``recompute_peak_bytes`` (peak from the first tensor saved in
    backward on; 0 without recompute), ``stage_peak_bytes`` (peak over forward and backward;
    all three with all the config's layers), ``parameters`` (count), ``input_bytes`` and
    ``unfused_rope_bytes`` (seen, not counted), ``layer_items`` (the tensors the last layer
    keeps: bytes, shape, dtype, site, submodule, live at the forward's end or not). MoE
    configs add ``expert_parameters`` (names with ``.experts.``: the routed experts, not the
    shared one), ``active_parameters`` (non-expert plus ``k/E`` of the expert ones) and,
    without full recompute, ``moe_block_bytes`` (live at the forward's end, first saved inside
    the last layer's ``mlp``). Raises RuntimeError with the child's stderr if it fails.
    """
    names = list(names or CONFIGS)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--json", *names],
                          capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode:
        raise RuntimeError(f"reference measurement failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def model_bytes(name: str) -> dict:
    """The memory model's figures for reference config ``name`` (pp = tp = cp = 1, one
    microbatch, local attention): ``layer_bytes`` (the model's last layer; the checkpoint
    with full recompute), ``forward_end_bytes``, ``recompute_peak_bytes``, ``stage_bytes``,
    ``stage_parameters``, ``total_parameters``; for MoE configs (ep = etp = 1) also
    ``expert_parameters`` (the expert part of ``stage_parameter_split``),
    ``active_parameters`` and ``moe_block_bytes`` (what the MoE layer's ``mlp`` keeps:
    its input plus the dense MLP's terms plus :func:`moe_mlp_activation_delta`)."""
    from memory_model import activations as act
    from memory_model.params import (active_parameters, stage_parameter_split,
                                     total_parameters)
    spec = model_spec(name)
    rc = recompute_of(name)
    cap = capacity_of(name)
    kw = dict(mbs=MBS, seq=SEQ, tp=1, sp=False)
    x = act.LayerInputs(**kw, recompute=rc, stores_scores=True)
    at = act.StagePosition(pp=1, vp=1, num_microbatches=1, stage=0)
    if spec.is_moe:   # the rank builds every layer; experts not split (ep = etp = 1)
        x = x.replace(etp=1, capacity=cap)
        at = act.StagePosition(pp=1, vp=1, num_microbatches=1, stage=0,
                               rank_layers=spec.num_layers, rank_moe_layers=spec.num_moe_layers)
    layer = (act.checkpoint_bytes(spec, **kw) if rc == 2 else
             act.layer_activation_bytes(spec, recompute=rc, stores_scores=True, **kw))
    delta = float(act.moe_mlp_activation_delta(spec, act.LayerInputs(
        mbs=MBS, seq=SEQ, tp=1, sp=True, etp=1, recompute=rc, capacity=cap,
        stores_scores=True)))
    if spec.is_moe and spec.moe_layer_pattern[-1] and rc != 2:
        layer = layer + delta   # the measured layer (the last) is an MoE layer
    fwd, rec = act.stage_activation_phases(spec, x, at)
    split = stage_parameter_split(
        spec, 1, 1, 0, **(dict(layers=spec.num_layers, moe_layers=spec.num_moe_layers,
                              ep=1, etp=1) if spec.is_moe else {}))
    out = dict(layer_bytes=float(layer), forward_end_bytes=float(fwd),
               recompute_peak_bytes=float(rec),
               stage_bytes=float(act.stage_activation_bytes(spec, x, at)),
               stage_parameters=float(split[0] + split[1]),
               total_parameters=total_parameters(spec))
    if spec.is_moe and rc != 2:
        # the tensors first saved inside the MoE layer (``mlp.*``): its input (the pre-MLP
        # norm's output, fc1's input ``2Xh`` of the dense layer) plus the dense MLP's
        # fc1 output and fc2 input, which the MoE layer keeps ``moe_mlp_activation_delta``
        # more than.
        x, gate = MBS * SEQ, 2 if spec.swiglu else 1
        dense_mlp = 2 * x * spec.ffn_hidden_size * (gate + 1)
        out.update(moe_block_bytes=2 * x * spec.hidden_size + dense_mlp + delta)
    if spec.is_moe:
        out.update(expert_parameters=float(split[1]),
                   active_parameters=active_parameters(spec))
    return out


def comparison_table(results: dict) -> str:
    """Markdown table: measured vs model bytes per reference config."""
    def err(model, measured):
        return f"{100 * (model - measured) / measured:+.2f} %" if measured else "n/a"
    lines = ["| config | quantity | measured | model | error |", "|---|---|---|---|---|"]
    for name, r in results.items():
        m = model_bytes(name)
        layer_label = ("per-layer checkpoint B" if ALL_CONFIGS[name]["recompute"] == "full"
                       else "per-layer activations B")
        if "moe_block_bytes" in m:
            layer_label = "per-layer activations (MoE layer) B"
        rows = [(layer_label, r["layer_bytes"], m["layer_bytes"])]
        if "moe_block_bytes" in m:
            rows.append(("  of which the MoE block (mlp.*) B", r["moe_block_bytes"],
                         m["moe_block_bytes"]))
        rows += [("stage activations (peak) B", r["stage_peak_bytes"], m["stage_bytes"]),
                 ("  at forward end B", r["forward_end_bytes"], m["forward_end_bytes"]),
                 ("  during recompute B", r["recompute_peak_bytes"],
                  m["recompute_peak_bytes"]),
                 ("parameters", r["parameters"], m["total_parameters"])]
        if "expert_parameters" in r:
            rows += [("  expert parameters", r["expert_parameters"], m["expert_parameters"]),
                     ("  active parameters (top-k of E experts)", r["active_parameters"],
                      m["active_parameters"])]
        for label, meas, mod in rows:
            if label.strip().startswith("during") and not meas and not mod:
                continue
            lines.append(f"| {name} | {label} | {meas:,.0f} | {mod:,.0f} | {err(mod, meas)} |")
    return "\n".join(lines)


# --- everything below runs in the child process --------------------------------------------

def _patch_for_cpu():
    import contextlib

    import torch
    from megatron.core import utils as mutils
    from megatron.core.tensor_parallel import random as mrandom

    torch._dynamo.config.disable = True
    mutils.GlobalMemoryBuffer.get_tensor = (
        lambda self, shape, dtype, name, mem_alloc_context=None: torch.empty(shape, dtype=dtype))
    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.zeros(1, dtype=torch.uint8)
    mrandom._set_cuda_rng_state = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"

    cpu_dropout = torch.nn.functional.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0 < p < 1:
            return torch.native_dropout(input, p, True)[0]
        return cpu_dropout(input, p, training, inplace)
    torch.nn.functional.dropout = dropout

    class FusedRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            xf = x.float()
            rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(x, weight, rstd)
            return (xf * rstd * weight.float()).to(x.dtype)

        @staticmethod
        def backward(ctx, grad):
            x, weight, rstd = ctx.saved_tensors
            xhat = x.float() * rstd
            gw = grad.float() * weight.float()
            gx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
            gweight = (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
            return gx.to(x.dtype), gweight.to(weight.dtype), None

    torch.nn.RMSNorm.forward = lambda self, x: FusedRMSNorm.apply(x, self.weight,
                                                                  self.eps or 1e-6)

    # MoE without Transformer Engine: moe_utils imports te_general_gemm and the fused_*
    # kernels in a try/except ImportError that leaves the names undefined, and tests them
    # against None (RouterGatingLinearFunction, permute, unpermute, topk, aux loss).
    from megatron.core.transformer.moe import moe_utils
    for attr in ("te_general_gemm", "fused_permute", "fused_permute_with_probs",
                 "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs",
                 "fused_unpermute", "fused_topk_with_score_function",
                 "fused_compute_score_for_moe_aux_loss", "fused_moe_aux_loss"):
        if not hasattr(moe_utils, attr):
            setattr(moe_utils, attr, None)

    # MoEAlltoAllTokenDispatcher: a side torch.cuda.Stream for the device-to-host copy of
    # the token counts, current_stream / stream / record_event / synchronize.
    class _Event:
        def synchronize(self):
            pass

    class _Stream:
        def wait_stream(self, other):
            pass

        def record_event(self, *a):
            return _Event()

    stream = _Stream()
    torch.cuda.Stream = lambda *a, **k: _Stream()
    torch.cuda.current_stream = lambda *a, **k: stream
    torch.cuda.stream = lambda s: contextlib.nullcontext()


def _init_distributed():
    import socket

    import torch.distributed as dist
    from megatron.core import parallel_state
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=1,
                                             expert_tensor_parallel_size=1)


def _build(spec, recompute: str, modules: str | None = None, capacity=(0.0, False)):
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw = dict(
        num_layers=spec.num_layers, hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads, num_query_groups=spec.num_query_groups,
        kv_channels=spec.kv_channels, ffn_hidden_size=spec.ffn_hidden_size,
        hidden_dropout=spec.hidden_dropout, attention_dropout=spec.attention_dropout,
        add_bias_linear=spec.add_bias_linear, gated_linear_unit=spec.swiglu,
        activation_func=F.silu if spec.swiglu else F.gelu, normalization=spec.normalization,
        # Megatron's training defaults (--bias-gelu-fusion / --bias-swiglu-fusion,
        # --bias-dropout-fusion); bias-GeLU fusion needs a bias.
        bias_activation_fusion=spec.swiglu or spec.add_bias_linear, bias_dropout_fusion=True,
        masked_softmax_fusion=False, attention_softmax_in_fp32=False,
        gradient_accumulation_fusion=False, params_dtype=torch.bfloat16, bf16=True,
        use_cpu_initialization=True)
    if recompute == "selective":
        kw.update(recompute_granularity="selective")
        if modules:
            kw.update(recompute_modules=modules.split(","))
    elif recompute == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform",
                  recompute_num_layers=1)
    norm = "RMSNorm" if spec.normalization == "RMSNorm" else None
    if spec.is_moe:
        pattern = spec.moe_layer_pattern
        kw.update(num_moe_experts=spec.num_experts, moe_router_topk=spec.moe_router_topk,
                  moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
                  moe_shared_expert_intermediate_size=spec.moe_shared_expert_intermediate_size,
                  moe_layer_freq=1 if all(pattern) else list(pattern),
                  moe_token_dispatcher_type=MOE_DISPATCHER, moe_grouped_gemm=False,
                  moe_router_load_balancing_type="aux_loss",
                  moe_aux_loss_coeff=MOE_AUX_LOSS_COEFF)
        if capacity[0] > 0:
            kw.update(moe_expert_capacity_factor=capacity[0],
                      moe_pad_expert_input_to_capacity=capacity[1])
    config = TransformerConfig(**kw)
    if spec.is_moe and not all(spec.moe_layer_pattern):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
        layer_spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                                normalization=norm)
    elif spec.is_moe:
        layer_spec = get_gpt_layer_local_spec(num_experts=spec.num_experts,
                                              moe_grouped_gemm=False, normalization=norm)
    else:
        layer_spec = get_gpt_layer_local_spec(normalization=norm)
    model = GPTModel(
        config=config, transformer_layer_spec=layer_spec, vocab_size=spec.vocab_size,
        max_sequence_length=spec.seq_length,
        position_embedding_type=spec.position_embedding_type,
        share_embeddings_and_output_weights=not spec.untie_embeddings_and_output_weights)
    return model.to(torch.bfloat16)


#: Saved by megatron-core's unfused RoPE (rope_utils.py ``_apply_rotary_pos_emb_bshd``: the
#: per-call ``cos_``/``sin_`` factors, 4 × s·d per layer). Megatron trains with
#: ``--rope-fusion`` on by default (``apply_rope_fusion``, Transformer Engine's
#: ``FusedRoPEFunc``, which keeps only the shared ``freqs``), so these are tallied apart.
UNFUSED_ROPE_SITE = "rope_utils.py:_apply_rotary_pos_emb_bshd"


class _Tracker:
    """Live bytes of saved storages: a storage counts from its first pack until autograd
    drops its last packed handle. ``recompute_peak`` is the peak from the first tensor saved
    during backward (a recomputation) onwards."""

    def __init__(self, skip_ptrs, input_ptrs, module_stack):
        self.skip, self.inputs, self.stack = skip_ptrs, input_ptrs, module_stack
        self.refs, self.entry, self.items = {}, {}, []
        self.live = self.peak = self.recompute_peak = self.input_bytes = 0
        self.rope_bytes = 0
        self.phase = "forward"
        self.recomputing = False

    def pack(self, t):
        import traceback
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.skip or ptr == 0:
            return t
        if ptr in self.inputs:
            self.input_bytes += 0 if self.inputs[ptr] else storage.nbytes()
            self.inputs[ptr] = True
            return t
        if ptr not in self.refs:
            frames = [f for f in traceback.extract_stack()[:-1]
                      if "megatron" in f.filename or "torch/nn" in f.filename
                      or "megatron_reference" in f.filename]
            site = " < ".join(f"{os.path.basename(f.filename)}:{f.name}:{f.lineno}"
                              for f in frames[-2:][::-1])
            counted = UNFUSED_ROPE_SITE not in site
            self.refs[ptr] = 0
            self.entry[ptr] = (storage.nbytes(), counted, len(self.items))
            if counted:
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                self.recomputing |= self.phase == "backward"
                if self.recomputing:
                    self.recompute_peak = max(self.recompute_peak, self.live)
            elif self.phase == "forward":
                self.rope_bytes += storage.nbytes()
            deepest = self.stack[-1] if self.stack else ""
            self.items.append(dict(bytes=storage.nbytes(), shape=list(t.shape),
                                   dtype=str(t.dtype).replace("torch.", ""), site=site,
                                   module=".".join(deepest.split(".")[:3]),
                                   submodule=deepest,
                                   phase=self.phase, counted=counted))
        self.refs[ptr] += 1
        return _Handle(self, ptr, t)

    def release(self, ptr):
        self.refs[ptr] -= 1
        if not self.refs[ptr]:
            del self.refs[ptr]
            nbytes, counted, _ = self.entry.pop(ptr)
            self.live -= nbytes if counted else 0


class _Handle:
    __slots__ = ("tracker", "ptr", "tensor")

    def __init__(self, tracker, ptr, tensor):
        self.tracker, self.ptr, self.tensor = tracker, ptr, tensor

    def __del__(self):
        self.tracker.release(self.ptr)


def _measure_once(name: str, num_layers: int) -> dict:
    import torch
    spec = model_spec(name, num_layers)
    torch.manual_seed(0)
    model = _build(spec, ALL_CONFIGS[name]["recompute"],
                   ALL_CONFIGS[name].get("recompute_modules"),
                   ALL_CONFIGS[name].get("capacity", (0.0, False)))
    model.train()
    if spec.is_moe:   # the aux-loss logging tracker is sized by the first model's layers
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker
        get_moe_layer_wise_logging_tracker().clear()
    stack: list[str] = []   # the modules being run; an item's ``module`` is the deepest
    for mname, module in model.named_modules():   # cut to decoder.layers.N, embedding.*, ...
        module.register_forward_pre_hook(lambda m, a, n=mname: stack.append(n))
        module.register_forward_hook(lambda m, a, o: (stack.pop(), None)[1])
    ids = torch.randint(0, spec.vocab_size, (MBS, SEQ))
    labels = torch.randint(0, spec.vocab_size, (MBS, SEQ))
    pos = torch.arange(SEQ).unsqueeze(0).expand(MBS, SEQ)
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    inputs = {t.untyped_storage().data_ptr(): False for t in (ids, labels, pos, mask)}
    tracker = _Tracker(params, inputs, stack)
    with torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda h: h.tensor
                                                  if isinstance(h, _Handle) else h):
        loss = model(ids, pos, mask, labels=labels)
        forward_end = tracker.live
        # items by index: a freed storage's address can be reused by a later one
        live_at_forward_end = {tracker.entry[ptr][2] for ptr in tracker.refs}
        tracker.phase = "backward"
        loss.sum().backward()
    return dict(forward_end_bytes=forward_end, stage_peak_bytes=tracker.peak,
                recompute_peak_bytes=tracker.recompute_peak, input_bytes=tracker.input_bytes,
                unfused_rope_bytes=tracker.rope_bytes,
                parameters=sum(p.numel() for p in model.parameters()),
                expert_parameters=sum(p.numel() for n, p in model.named_parameters()
                                      if ".experts." in n),   # not shared_experts
                items=[dict(i, live_at_forward_end=n in live_at_forward_end)
                       for n, i in enumerate(tracker.items)])


def _measure(name: str) -> dict:
    n = num_layers(name)
    one, two = _measure_once(name, n - 1), _measure_once(name, n)
    last = f"decoder.layers.{n - 1}"
    layer_items = [i for i in two["items"] if i["module"] == last and i["phase"] == "forward"]
    out = dict(layer_bytes=two["forward_end_bytes"] - one["forward_end_bytes"],
               stage_peak_bytes=two["stage_peak_bytes"],
               forward_end_bytes=two["forward_end_bytes"],
               recompute_peak_bytes=two["recompute_peak_bytes"],
               parameters=two["parameters"], input_bytes=two["input_bytes"],
               unfused_rope_bytes=two["unfused_rope_bytes"], layer_items=layer_items,
               items=two["items"])
    if two["expert_parameters"] and ALL_CONFIGS[name]["recompute"] != "full":
        out.update(  # kept at the end of the forward, first saved inside the last layer's MoE
            moe_block_bytes=sum(i["bytes"] for i in layer_items if i["counted"]
                                and i["live_at_forward_end"]
                                and i["submodule"].startswith(last + ".mlp")))
    if two["expert_parameters"]:
        spec = model_spec(name)
        k_of_e = spec.moe_router_topk / spec.num_experts
        out.update(expert_parameters=two["expert_parameters"],
                   # what one token passes through: the routed experts counted k/E times
                   active_parameters=two["parameters"] - two["expert_parameters"] * (1 - k_of_e))
    return out


def _show(name: str, result: dict) -> None:
    sbh = SEQ * MBS * ALL_CONFIGS[name]["hidden_size"]
    last = f"decoder.layers.{num_layers(name) - 1}"
    print(f"== {name}: tensors saved by decoder layer {num_layers(name)} in forward "
          f"(sbh = {sbh} elements; - = freed before the forward ends)")
    for i in result["items"]:
        if i["module"] in (last, "decoder") or not i["module"].startswith("decoder.layers"):
            mark = (" " if i["live_at_forward_end"] or i["phase"] != "forward" else "-") \
                if i["counted"] else "x"
            where = i["submodule"][len(last) + 1:] if i["module"] == last else i["module"]
            print(f"{mark}{i['bytes']:>9} B {i['bytes'] / sbh:7.3f} sbh  {i['phase']:8} "
                  f"{where:30} {str(i['shape']):22} {i['dtype']:8} {i['site']}")
    print(f"per layer {result['layer_bytes']} B = {result['layer_bytes'] / sbh:.3f} sbh; "
          f"forward end {result['forward_end_bytes']} B; peak {result['stage_peak_bytes']} B "
          f"(during recompute {result['recompute_peak_bytes']} B); not counted: inputs "
          f"{result['input_bytes']} B, unfused RoPE (x) {result['unfused_rope_bytes']} B; "
          f"parameters {result['parameters']}")


def main(argv) -> int:
    import warnings
    warnings.filterwarnings("ignore")
    as_json, show, table = ("--json" in argv), ("--show" in argv), ("--table" in argv)
    names = [a for a in argv if not a.startswith("--")] or list(ALL_CONFIGS)
    _patch_for_cpu()
    _init_distributed()
    results = {n: _measure(n) for n in names}
    if show:
        for n in names:
            _show(n, results[n])
    if table:
        print(comparison_table(results))
    if as_json:
        for r in results.values():
            del r["items"]
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main(sys.argv[1:]))
