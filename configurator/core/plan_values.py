"""The values plan fields take: the choices of :class:`~configurator.core.plan.ParallelPlan`'s
text fields, the recompute codes and module bits, the optimizer-state data types and their
bytes, with :func:`is_fp8` and :func:`recompute_module_list`, which read them.

Sources: Megatron-LM core_v0.16.1 ``megatron/training/arguments.py`` and
``megatron/core/transformer/transformer_config.py``, as each value's comment says.
"""

from __future__ import annotations

from configurator.core.errors import InputError

RECOMPUTE = ("none", "selective", "full")
#: Integer code of each recompute choice in candidate arrays (its index in RECOMPUTE).
RECOMPUTE_CODES = {name: i for i, name in enumerate(RECOMPUTE)}
#: Megatron's ``--recompute-modules`` choices (core_v0.16.1 ``TransformerConfig
#: .recompute_modules``, validated in ``__post_init__``; the list replaces the default
#: ``["core_attn"]`` and applies with ``--recompute-granularity selective`` only).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
#: The modules whose memory and time the model prices, as bits of a recompute code
#: (:func:`~configurator.core.plan_terms.recompute_code`): ``core_attn`` core attention;
#: ``layernorm`` the norms not fused into a Transformer Engine linear (an MoE layer's pre-MLP
#: norm, MLA's input norm:
#: ``TransformerLayer.recompute_pre_mlp_layernorm`` / ``recompute_input_layernorm``);
#: ``moe_act`` the routed experts' activation (``TEGroupedMLP``: its input checkpointed, its
#: output, fc2's input, discarded and recomputed); ``mlp`` a dense layer's whole MLP
#: (``TransformerLayer._forward_mlp`` checkpoints it on its input; MoE layers ignore it);
#: ``moe`` an MoE layer's whole MLP with the router and both all-to-alls (``MoELayer``
#: checkpoints ``custom_forward`` on its input; not applied by the all-to-all overlap's
#: schedule, which calls the pieces itself); ``shared_experts`` the shared expert
#: (``MoELayer``); ``mla_up_proj`` multi-latent attention's up projections and RoPE
#: (``CheckpointWithoutOutput``; the query, key and value storages freed after core
#: attention and rebuilt in backward). Full recompute is code 2, which no module bit shares.
RECOMPUTE_MODULE_BITS = {"core_attn": 1, "layernorm": 4, "moe_act": 8, "mlp": 16, "moe": 32,
                         "mla_up_proj": 64, "shared_experts": 128}
#: Codes of a recompute code: full recompute keeps its :data:`RECOMPUTE_CODES` value, the
#: modules are their bits.
RECOMPUTE_FULL = RECOMPUTE_CODES["full"]
(RECOMPUTE_CORE_ATTN, RECOMPUTE_LAYERNORM, RECOMPUTE_MOE_ACT, RECOMPUTE_MLP, RECOMPUTE_MOE,
 RECOMPUTE_MLA_UP_PROJ, RECOMPUTE_SHARED_EXPERTS) = (
    RECOMPUTE_MODULE_BITS[m] for m in ("core_attn", "layernorm", "moe_act", "mlp", "moe",
                                       "mla_up_proj", "shared_experts"))
#: Training precisions; also the names of a GPU's tensor-core peak rates
#: (:attr:`topology.gpus.GPUSpec.peak_flops_per_s`). ``fp8``: Transformer Engine FP8 GEMMs
#: scaled as :data:`FP8_RECIPES` says (Megatron's default delayed scaling unless the plan's
#: ``fp8_recipe`` says otherwise); ``mxfp8``: MXFP8 block scaling (Blackwell only).
PRECISION = ("bf16", "fp16", "fp8", "mxfp8")
#: Precisions whose GEMMs run in FP8 (Transformer Engine keeps an FP8 copy of the weights).
FP8_PRECISIONS = ("fp8", "mxfp8")
ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
#: Context-parallel communication of attention (Megatron ``--cp-comm-type``, passed to
#: Transformer Engine's ``attn_forward_func_with_cp``, which accepts these spellings):
#: ``p2p`` ring of K/V blocks overlapped with attention (the default), ``a2a`` all-to-all of
#: Q, K, V and the output over heads (DeepSpeed Ulysses), ``all_gather`` K/V all-gather
#: before attention, exposed. TE's hierarchical ``a2a+p2p`` needs
#: ``--hierarchical-context-parallel-sizes`` and is not offered.
CP_COMM_TYPES = ("p2p", "a2a", "all_gather")
#: The language-model loss's vocabulary-parallel cross entropy: ``none`` Megatron's default
#: eager PyTorch ops (megatron/core/tensor_parallel/cross_entropy.py), ``native`` its
#: jit-fused version (``--cross-entropy-loss-fusion``, megatron/core/fusions/
#: fused_cross_entropy.py), ``te`` Transformer Engine's Triton kernels
#: (``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``,
#: transformer_engine/pytorch/triton/cross_entropy.py).
CROSS_ENTROPY_FUSIONS = ("none", "native", "te")
#: Megatron's token dispatchers the model prices (``--moe-token-dispatcher-type``; its
#: default ``allgather`` is not offered): ``alltoall`` NCCL all-to-alls over the EP group;
#: ``flex`` DeepEP or HybridEP (``--moe-flex-dispatcher-backend``), which send a token once
#: per destination host over RDMA and spread it inside the host over NVLink
#: (megatron/core/transformer/moe/token_dispatcher.py ``MoEFlexTokenDispatcher``).
MOE_DISPATCHERS = ("alltoall", "flex")
MOE_FLEX_BACKENDS = ("deepep", "hybridep")
#: ``--fp8-recipe`` of precision ``fp8`` (Megatron-LM core_v0.16.1 ``TransformerConfig
#: .fp8_recipe``; mxfp8 is its own precision): ``delayed`` (the default; scales from an amax
#: history, all-reduced over tp·dp·cp once per microbatch forward and backward),
#: ``tensorwise`` (current scaling: each tensor's amax computed before its cast, Megatron-
#: Bridge's FP8-CS), ``blockwise`` (1×128 activation and 128×128 weight blocks, E4M3).
FP8_RECIPES = ("delayed", "tensorwise", "blockwise")
#: The scalings with one scale per tensor, whose row-wise FP8 copy a GEMM in any layout reads:
#: Transformer Engine's ``Float8Quantizer`` (delayed) and ``Float8CurrentScalingQuantizer``
#: (``tensorwise``) write the transposed copy only ``if columnwise_usage &&
#: !nvte_is_non_tn_fp8_gemm_supported()`` (transformer_engine/pytorch/csrc/quantizer.cpp,
#: ``create_tensor``, NVIDIA/TransformerEngine@0064fbd; the support check: compute
#: capability 10.x or 13+, ``transformer_engine/pytorch/utils.py``
#: ``is_non_tn_fp8_gemm_supported``). Block scales (``blockwise``, ``mxfp8``) run along the
#: reduction dimension, so the column-wise copy has scales of its own and is always written.
TENSOR_SCALINGS = ("delayed", "tensorwise")


def fp8_scaling(precision: str, fp8_recipe: str) -> str:
    """The FP8 scaling of a plan: ``mxfp8`` for that precision, else its ``fp8_recipe``."""
    return "mxfp8" if precision == "mxfp8" else fp8_recipe


def fp8_copies(scaling: str, non_tn_fp8_gemm: bool, columnwise: bool = True) -> float:
    """FP8 copies Transformer Engine writes of a quantised tensor (an activation it casts, a
    weight it caches): row-wise and column-wise, 2; one where no column-wise copy is asked for
    (``columnwise`` False: FP8 attention's inputs) or a tensor scaling
    (:data:`TENSOR_SCALINGS`) runs on a GPU with FP8 GEMMs in any layout
    (``non_tn_fp8_gemm``: Blackwell)."""
    return 1.0 if not columnwise or (non_tn_fp8_gemm and scaling in TENSOR_SCALINGS) else 2.0
#: ``--cuda-graph-impl`` (core_v0.16.1 ``TransformerConfig.cuda_graph_impl``).
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine")
#: ``--cuda-graph-scope`` values (``transformer/enums.py`` ``CudaGraphScope``; ``mamba``
#: left out): none given is the whole layer.
CUDA_GRAPH_SCOPES = ("full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess")
#: ``--offload-modules`` of fine-grained activation offloading (``TransformerConfig
#: .offload_modules``, checked in ``__post_init__``).
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                   "expert_fc1", "moe_act")
#: Optimizer-state data types of the precision-aware optimizer (``--main-grads-dtype``,
#: ``--main-params-dtype``, ``--exp-avg-dtype``, ``--exp-avg-sq-dtype``;
#: megatron/training/arguments.py ``_add_experimental_args``) and their bytes.
MAIN_GRADS_DTYPES = ("fp32", "bf16")
MAIN_PARAMS_DTYPES = ("fp32", "fp16")
MOMENT_DTYPES = ("fp32", "fp16", "bf16", "fp8")
DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}

#: Backends that materialise and store the s×s score matrix (megatron-core's own
#: DotProductAttention and the 2021–22 Megatron runs); the others are flash-style kernels.
SCORE_STORING_BACKENDS = ("unfused", "local")


def is_fp8(precision: str) -> bool:
    """Whether GEMMs of ``precision`` run in FP8 (:data:`FP8_PRECISIONS`)."""
    return precision in FP8_PRECISIONS


def mfu_peak_precision(precision: str) -> str:
    """The 16-bit peak a plan's MFU is quoted against: ``fp16`` for an fp16 plan, else
    ``bf16`` (FP8 plans included; their FP8 MFU is reported beside it)."""
    return "fp16" if precision == "fp16" else "bf16"


def recompute_module_list(value: str, name: str = "recompute_modules") -> tuple[str, ...]:
    """The modules of a ``recompute_modules`` value (names separated by commas or spaces),
    in :data:`RECOMPUTE_MODULES` order. Raises :class:`InputError` naming ``name`` for an
    empty list, a name that is not one of Megatron's choices or a repeat."""
    if not isinstance(value, str):
        raise InputError(name, value, "must be a string of module names")
    words = value.replace(",", " ").split()
    if not words:
        raise InputError(name, value, "give at least one module (" + ", ".join(
            RECOMPUTE_MODULES) + ")")
    for w in words:
        if w not in RECOMPUTE_MODULES:
            raise InputError(name, w, "not a Megatron recompute module (" + ", ".join(
                RECOMPUTE_MODULES) + ")")
        if words.count(w) > 1:
            raise InputError(name, w, "given twice")
    return tuple(m for m in RECOMPUTE_MODULES if m in words)
