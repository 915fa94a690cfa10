"""The parallel plan: ``ParallelPlan`` and the one schema every view of a plan derives from.

Each field of :class:`ParallelPlan` carries its metadata (:class:`PlanField`): Megatron-LM's
argument name, the CLI flag, type, allowed values, help, table column, whether it varies per
candidate in the search, and the ``pretrain_gpt.py`` flags it becomes. The CLI options
(``configurator.cli``), plan JSON (:meth:`ParallelPlan.to_dict` / :func:`plan_from_dict`),
the ranked table (``configurator.report``), the search's candidate columns
(``configurator.core.candidates``) and the launch flags (``launchers.megatron_flags``) are
all generated from :data:`PLAN_FIELDS`. Adding a field means adding it here plus its cost
and memory formulas.

Flag sources: Megatron-LM core_v0.16.1 ``megatron/training/arguments.py`` (argument names,
``validate_args``) and ``megatron/core/transformer/transformer_config.py``
(``__post_init__``); the rules that tie fields together live in :mod:`configurator.core.rules`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

import numpy as np

from configurator.core import validate as v
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
#: (:func:`recompute_code`): ``core_attn`` core attention; ``layernorm`` the norms not fused
#: into a Transformer Engine linear (an MoE layer's pre-MLP norm, MLA's input norm:
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

#: A flag value: None (left out), True (bare switch), a number, a string or a tuple (a list).
FlagValue = Union[None, bool, int, float, str, tuple]
#: ``(flag, value(model, plan))``: one Megatron-LM flag a field becomes.
FlagRule = tuple[str, Callable[[Any, "ParallelPlan"], FlagValue]]

#: Megatron flag groups in the order the launch script lists them; ``model`` and
#: ``training`` rows come from the model spec and the training arguments.
FLAG_GROUPS = ("parallelism", "recompute", "batch", "model", "precision and kernels",
               "training")


@dataclass(frozen=True, kw_only=True)
class PlanField:
    """Metadata of one plan field (see the module docstring)."""

    name: str
    type: type
    default: Any
    help: str
    megatron_name: str | None = None     # Megatron's argument (dest) name
    cli_flag: str | None = None          # e.g. "--tp"; None: not a CLI option of estimate
    alias: str | None = None             # short name: JSON alias, candidate attribute
    column: str | None = None            # ranked-table header; None: not a column
    choices: tuple[str, ...] | None = None
    per_candidate: bool = True           # a column of the search (else shared by all plans)
    quiet: bool = False                  # left out of plan descriptions at its default
    flag_group: str | None = None
    flags: tuple[FlagRule, ...] = ()

    @property
    def short(self) -> str:
        return self.alias or self.name


#: Each field's default (filled once the schema is collected; ``__post_init__`` reads it).
PLAN_FIELD_DEFAULTS: dict[str, Any] = {}


def _field(default: Any, **meta: Any):
    return dataclasses.field(default=default, metadata={"plan": meta})


def _full(p: "ParallelPlan") -> bool:
    return p.recompute == "full"


def is_fp8(precision: str) -> bool:
    """Whether GEMMs of ``precision`` run in FP8 (:data:`FP8_PRECISIONS`)."""
    return precision in FP8_PRECISIONS


#: ``--fp8-format`` / ``--fp8-recipe`` of each FP8 precision (Megatron-LM core_v0.16.1
#: ``TransformerConfig.fp8`` choices e4m3/hybrid and ``fp8_recipe`` choices tensorwise,
#: delayed, mxfp8, blockwise, custom; recipe default delayed). fp8: hybrid (E4M3 forward,
#: E5M2 gradients) with the default recipe. mxfp8: E4M3 with the mxfp8 recipe, as
#: megatron/core/transformer/moe/README.md ("MXFP8 on Blackwell": ``--fp8-format e4m3
#: --fp8-recipe mxfp8``); both with ``--bf16`` (parameters and non-FP8 ops in BF16).
def _fp8_format(p) -> str | None:
    """``--fp8-format``: hybrid (E4M3 forward, E5M2 gradients) for fp8, E4M3 for blockwise
    scaling (Transformer Engine ``Float8BlockScaling`` takes E4M3 only) and mxfp8."""
    if not is_fp8(p.precision):
        return None
    return "hybrid" if p.precision == "fp8" and p.fp8_recipe != "blockwise" else "e4m3"


def _fp8_recipe_flag(p) -> str | None:
    """``--fp8-recipe``: mxfp8's own, fp8's where it is not Megatron's default ``delayed``."""
    if p.precision == "mxfp8":
        return "mxfp8"
    return p.fp8_recipe if p.precision == "fp8" and p.fp8_recipe != "delayed" else None


def _list_flag(text: str) -> tuple | None:
    """A comma-separated field as the words of an ``nargs='+'`` flag (None when empty)."""
    words = tuple(w for w in text.replace(",", " ").split())
    return words or None


@dataclass(frozen=True, kw_only=True)
class ParallelPlan:
    """One Megatron-LM training configuration (Megatron's names in each field's metadata).

    ``vp`` is virtual stages per pipeline rank (1 = no interleaving). Recompute ``full``
    means ``--recompute-granularity full --recompute-method uniform --recompute-num-layers
    1``. Sizes are counts; ``global_batch_size`` and ``micro_batch_size`` are sequences.
    """

    tp: int = _field(1, megatron_name="tensor_model_parallel_size", cli_flag="--tp",
                     column="tp", help="tensor_model_parallel_size",
                     flag_group="parallelism",
                     flags=(("--tensor-model-parallel-size", lambda m, p: p.tp),))
    pp: int = _field(1, megatron_name="pipeline_model_parallel_size", cli_flag="--pp",
                     column="pp", help="pipeline_model_parallel_size",
                     flag_group="parallelism",
                     flags=(("--pipeline-model-parallel-size", lambda m, p: p.pp),))
    dp: int = _field(1, megatron_name="data_parallel_size", column="dp",
                     help="data-parallel size, derived: GPUs / (tp*pp*cp)")
    cp: int = _field(1, megatron_name="context_parallel_size", cli_flag="--cp", column="cp",
                     help="context_parallel_size (default 1)", flag_group="parallelism",
                     flags=(("--context-parallel-size", lambda m, p: p.cp),))
    vp: int = _field(1, megatron_name="virtual_pipeline_model_parallel_size",
                     cli_flag="--vp", column="vp",
                     help="virtual stages per pipeline rank (1 = no interleaving)",
                     flag_group="parallelism",
                     flags=(("--num-layers-per-virtual-pipeline-stage",
                             lambda m, p: m.num_layers // p.pp // p.vp
                             if p.vp > 1 and not p.custom_layer_split else None),
                            ("--num-virtual-stages-per-pipeline-rank",
                             lambda m, p: p.vp if p.vp > 1 and p.custom_layer_split
                             and not p.pipeline_model_parallel_layout else None)))
    micro_batch_size: int = _field(1, megatron_name="micro_batch_size", cli_flag="--mbs",
                                   alias="mbs", column="mbs", help="micro_batch_size",
                                   flag_group="batch",
                                   flags=(("--micro-batch-size",
                                           lambda m, p: p.micro_batch_size),))
    global_batch_size: int = _field(1, megatron_name="global_batch_size", alias="gbs",
                                    per_candidate=False,
                                    help="global batch size (sequences)", flag_group="batch",
                                    flags=(("--global-batch-size",
                                            lambda m, p: p.global_batch_size),))
    ep: int = _field(1, megatron_name="expert_model_parallel_size", cli_flag="--ep",
                     column="ep", help="expert_model_parallel_size (MoE models; default 1)",
                     flag_group="parallelism",
                     flags=(("--expert-model-parallel-size",
                             lambda m, p: p.ep if m.is_moe else None),))
    etp: int = _field(1, megatron_name="expert_tensor_parallel_size", cli_flag="--etp",
                      column="etp", help="expert_tensor_parallel_size (MoE models; default 1)",
                      flag_group="parallelism",
                      flags=(("--expert-tensor-parallel-size",
                              lambda m, p: p.etp if m.is_moe else None),))
    decoder_first_pipeline_num_layers: int = _field(
        0, megatron_name="decoder_first_pipeline_num_layers",
        cli_flag="--decoder-first-pipeline-num-layers", alias="first", column="first",
        help="layers on the first pipeline rank (0 = even split)", flag_group="parallelism",
        flags=(("--decoder-first-pipeline-num-layers",
                lambda m, p: p.decoder_first_pipeline_num_layers or None),))
    decoder_last_pipeline_num_layers: int = _field(
        0, megatron_name="decoder_last_pipeline_num_layers",
        cli_flag="--decoder-last-pipeline-num-layers", alias="last", column="last",
        help="layers on the last pipeline rank (0 = even split)", flag_group="parallelism",
        flags=(("--decoder-last-pipeline-num-layers",
                lambda m, p: p.decoder_last_pipeline_num_layers or None),))
    account_for_embedding_in_pipeline_split: bool = _field(
        False, megatron_name="account_for_embedding_in_pipeline_split",
        cli_flag="--account-for-embedding-in-pipeline-split", alias="acct_emb", column="+emb",
        help="count the embedding as one layer when splitting the pipeline",
        flag_group="parallelism",
        flags=(("--account-for-embedding-in-pipeline-split",
                lambda m, p: p.account_for_embedding_in_pipeline_split or None),))
    account_for_loss_in_pipeline_split: bool = _field(
        False, megatron_name="account_for_loss_in_pipeline_split",
        cli_flag="--account-for-loss-in-pipeline-split", alias="acct_loss", column="+loss",
        help="count the loss (output layer) as one layer when splitting the pipeline",
        flag_group="parallelism",
        flags=(("--account-for-loss-in-pipeline-split",
                lambda m, p: p.account_for_loss_in_pipeline_split or None),))
    pipeline_model_parallel_layout: str = _field(
        "", megatron_name="pipeline_model_parallel_layout",
        cli_flag="--pipeline-model-parallel-layout", alias="layout", column="layout",
        help="decoder layers per virtual pipeline stage, e.g. 'Et*4|(t*4|)*14tmL': stages "
             "split by '|', E embedding, t decoder layer, m MTP layer, L loss, '(...)*n' and "
             "'x*n' repeat; vp = stages / pp (empty: the split the other fields give)",
        flag_group="parallelism",
        flags=(("--pipeline-model-parallel-layout",
                lambda m, p: p.pipeline_model_parallel_layout or None),))
    recompute: str = _field("none", megatron_name="recompute_granularity",
                            cli_flag="--recompute", column="recompute", choices=RECOMPUTE,
                            help="activation recompute: none, selective (core attention) or "
                                 "full", flag_group="recompute",
                            flags=(("--recompute-granularity",
                                    lambda m, p: p.recompute if p.recompute != "none" else None),
                                   ("--recompute-method",
                                    lambda m, p: "uniform" if _full(p) else None),
                                   ("--recompute-num-layers",
                                    lambda m, p: 1 if _full(p) else None)))
    recompute_modules: str = _field(
        "core_attn", megatron_name="recompute_modules", cli_flag="--recompute-modules",
        per_candidate=False,
        help="what selective recompute re-runs, comma-separated (Megatron "
             "--recompute-modules): core_attn (core attention, the default), layernorm (the "
             "norms not fused into a linear: an MoE layer's pre-MLP norm, MLA's input norm), "
             "moe_act (the routed experts' activation), mlp (a dense layer's MLP), moe (an "
             "MoE layer's MLP with its router and all-to-alls), shared_experts, mla_up_proj "
             "(MLA's up projections)",
        flag_group="recompute",
        flags=(("--recompute-modules",
                lambda m, p: tuple(recompute_module_list(p.recompute_modules))
                if p.recompute == "selective" and p.recompute_modules != "core_attn"
                else None),))
    sequence_parallel: bool = _field(False, megatron_name="sequence_parallel",
                                     cli_flag="--sequence-parallel", column="sp",
                                     help="sequence parallelism (default: on when tp > 1)",
                                     flag_group="parallelism",
                                     flags=(("--sequence-parallel",
                                             lambda m, p: p.sequence_parallel and p.tp > 1
                                             or None),))
    distributed_optimizer: bool = _field(
        False, megatron_name="use_distributed_optimizer", cli_flag="--distributed-optimizer",
        column="dist-opt",
        help="shard optimizer state over data parallel (default: on when dp*cp > 1)",
        flag_group="parallelism",
        flags=(("--use-distributed-optimizer", lambda m, p: p.distributed_optimizer or None),))
    precision: str = _field("bf16", cli_flag="--precision", choices=PRECISION,
                            per_candidate=False,
                            help="bf16 (default), fp16, fp8 (Transformer Engine FP8 GEMMs, "
                                 "scaled as fp8_recipe says: delayed by default) or mxfp8 "
                                 "(MXFP8 block-scaled FP8 GEMMs, Blackwell GPUs only)",
                            flag_group="precision and kernels",
                            flags=(("--bf16", lambda m, p: (p.precision == "bf16"
                                                            or is_fp8(p.precision)) or None),
                                   ("--fp16", lambda m, p: p.precision == "fp16" or None),
                                   ("--fp8-format", lambda m, p: _fp8_format(p)),
                                   ("--fp8-recipe", lambda m, p: _fp8_recipe_flag(p))))
    cp_comm_type: str = _field(
        "p2p", megatron_name="cp_comm_type", cli_flag="--cp-comm-type", choices=CP_COMM_TYPES,
        per_candidate=False,
        help="context-parallel attention communication (Megatron --cp-comm-type): p2p ring "
             "of K/V blocks overlapped with attention (default), a2a all-to-all over heads "
             "(Ulysses; heads per tp rank divisible by cp), all_gather K/V before attention "
             "(exposed); sliding-window attention needs a2a or all_gather",
        flag_group="parallelism",
        flags=(("--cp-comm-type",
                lambda m, p: p.cp_comm_type if p.cp > 1 and p.cp_comm_type != "p2p"
                else None),))
    attention_backend: str = _field(
        "auto", megatron_name="attention_backend", cli_flag="--attention-backend",
        choices=ATTENTION_BACKENDS, per_candidate=False,
        help="Megatron --attention-backend; local/unfused store the s*s scores",
        flag_group="precision and kernels",
        # --attention-backend local needs --spec local, which pretrain_gpt.py cannot build;
        # megatron-core's own DotProductAttention is selected by --transformer-impl local.
        flags=(("--attention-backend", lambda m, p: p.attention_backend
                if p.attention_backend != "local" else None),
               ("--transformer-impl", lambda m, p: "local"
                if p.attention_backend == "local" else None)))
    overlap_grad_reduce: bool = _field(
        True, megatron_name="overlap_grad_reduce", cli_flag="--overlap-grad-reduce",
        per_candidate=False,
        help="overlap the data-parallel gradient reduction with backward (default on)",
        flag_group="parallelism",
        flags=(("--overlap-grad-reduce", lambda m, p: p.overlap_grad_reduce or None),))
    overlap_param_gather: bool = _field(
        True, megatron_name="overlap_param_gather", per_candidate=False,
        help="overlap the distributed optimizer's parameter all-gather with the next forward",
        flag_group="parallelism",
        # validate_args asserts --use-distributed-optimizer and --overlap-grad-reduce.
        flags=(("--overlap-param-gather",
                lambda m, p: (p.overlap_param_gather and p.distributed_optimizer
                              and p.overlap_grad_reduce) or None),))
    fp8_param_gather: bool = _field(
        True, megatron_name="fp8_param_gather", cli_flag="--fp8-param-gather",
        per_candidate=False,
        help="FP8 plans with the distributed optimizer keep their GEMM weights in FP8 only (no "
             "16-bit copy) and all-gather them in FP8 (Megatron --fp8-param-gather; default "
             "on, as NeMo's FP8 presets set fp8_params since NeMo 2.0 and Megatron-Bridge's "
             "FP8 and MXFP8 presets fp8_param_gather; Megatron-LM's own default is off, and "
             "launch scripts pass the flag)",
        flag_group="precision and kernels",
        # validate_args: "--fp8-param-gather only supported with distributed optimizer"
        flags=(("--fp8-param-gather",
                lambda m, p: bool(fp8_weights_gathered(p.fp8_param_gather,
                                                       p.distributed_optimizer,
                                                       p.precision)) or None),))
    grad_reduce_in_bf16: bool = _field(
        False, megatron_name="grad_reduce_in_bf16", cli_flag="--grad-reduce-in-bf16",
        per_candidate=False,
        help="keep, accumulate and reduce the main gradients in BF16, 2 bytes per parameter "
             "instead of 4 (Megatron --grad-reduce-in-bf16, Megatron-Bridge's benchmark "
             "recipes' grad_reduce_in_fp32=False; BF16 parameters only: bf16, fp8, mxfp8; "
             "default off)",
        flag_group="precision and kernels",
        # validate_args reads it only with --bf16 (fp16 grads are 16-bit already)
        flags=(("--grad-reduce-in-bf16",
                lambda m, p: (p.grad_reduce_in_bf16 and p.precision != "fp16") or None),))
    cross_entropy_fusion: str = _field(
        "none", cli_flag="--cross-entropy-fusion", choices=CROSS_ENTROPY_FUSIONS,
        per_candidate=False,
        help="the loss's cross entropy over the vocabulary: none (Megatron's default eager "
             "ops), native (--cross-entropy-loss-fusion) or te (--cross-entropy-loss-fusion "
             "--cross-entropy-fusion-impl te, Megatron-Bridge's benchmark setting); "
             "default none",
        flag_group="precision and kernels",
        flags=(("--cross-entropy-loss-fusion",
                lambda m, p: p.cross_entropy_fusion != "none" or None),
               ("--cross-entropy-fusion-impl",
                lambda m, p: "te" if p.cross_entropy_fusion == "te" else None)))
    megatron_fsdp: bool = _field(
        False, megatron_name="use_megatron_fsdp", cli_flag="--megatron-fsdp",
        per_candidate=False,
        help="Megatron FSDP over the dp*cp group: weights, gradients and optimizer state "
             "sharded, each layer's weights gathered before its forward and backward and its "
             "gradients reduce-scattered after every micro-batch's backward (Megatron "
             "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params, with "
             "the distributed optimizer; the launch scripts then leave "
             "CUDA_DEVICE_MAX_CONNECTIONS unset; default off)",
        flag_group="parallelism",
        # megatron-fsdp-user-guide.md's required flags (core_v0.16.1); validate_args asserts
        # --ckpt-format fsdp_dtensor
        flags=(("--use-megatron-fsdp", lambda m, p: p.megatron_fsdp or None),
               ("--data-parallel-sharding-strategy",
                lambda m, p: "optim_grads_params" if p.megatron_fsdp else None),
               ("--no-gradient-accumulation-fusion", lambda m, p: p.megatron_fsdp or None),
               ("--ckpt-format", lambda m, p: "fsdp_dtensor" if p.megatron_fsdp else None)))
    tp_comm_overlap: bool = _field(
        False, megatron_name="tp_comm_overlap", cli_flag="--tp-comm-overlap",
        per_candidate=False,
        help="overlap the tensor-parallel all-gathers and reduce-scatters with the GEMMs "
             "that consume or produce them (Megatron --tp-comm-overlap, Transformer "
             "Engine userbuffers; plans with tp > 1, sequence parallelism and Transformer "
             "Engine layers, the tp group inside one NVLink domain; default off)",
        flag_group="parallelism",
        # validate_args asserts sequence parallelism with it
        flags=(("--tp-comm-overlap", lambda m, p: tp_comm_overlapped(
            p.tp_comm_overlap, p.tp, p.sequence_parallel, p.attention_backend) or None),))

    overlap_moe_expert_parallel_comm: bool = _field(
        False, megatron_name="overlap_moe_expert_parallel_comm",
        cli_flag="--overlap-moe-expert-parallel-comm", alias="a2a_overlap", column="a2a-ovl",
        help="hide one microbatch's expert-parallel all-to-alls behind another's attention "
             "and expert compute (Megatron --overlap-moe-expert-parallel-comm: the combined "
             "1F1B schedule; MoE with ep > 1, interleaving when pp > 1, no full recompute, at "
             "most one MTP layer; default off, searched)",
        flag_group="parallelism",
        flags=(("--overlap-moe-expert-parallel-comm",
                lambda m, p: p.overlap_moe_expert_parallel_comm or None),))
    delay_wgrad_compute: bool = _field(
        False, megatron_name="delay_wgrad_compute", cli_flag="--delay-wgrad-compute",
        per_candidate=False, quiet=True,
        help="with the all-to-all overlap, run the experts' weight-gradient GEMMs while the "
             "dispatch's backward all-to-all travels (Megatron --delay-wgrad-compute; "
             "applies only to plans with overlap_moe_expert_parallel_comm; default off)",
        flag_group="parallelism",
        flags=(("--delay-wgrad-compute",
                lambda m, p: (p.delay_wgrad_compute and p.overlap_moe_expert_parallel_comm)
                or None),))
    moe_token_dispatcher_type: str = _field(
        "alltoall", megatron_name="moe_token_dispatcher_type",
        cli_flag="--moe-token-dispatcher-type", choices=MOE_DISPATCHERS, per_candidate=False,
        quiet=True,
        help="MoE token dispatcher: alltoall (NCCL all-to-alls, the default here) or flex "
             "(DeepEP/HybridEP: a token crosses the network once per destination host, then "
             "NVLink; needs the backend installed)",
        flag_group="precision and kernels",
        flags=(("--moe-token-dispatcher-type",
                lambda m, p: p.moe_token_dispatcher_type if m.is_moe else None),
               # both flex backends want fp32 routing probabilities (token_dispatcher.py)
               ("--moe-router-dtype",
                lambda m, p: "fp32" if m.is_moe and p.moe_token_dispatcher_type == "flex"
                else None)))
    moe_flex_dispatcher_backend: str = _field(
        "deepep", megatron_name="moe_flex_dispatcher_backend",
        cli_flag="--moe-flex-dispatcher-backend", choices=MOE_FLEX_BACKENDS,
        per_candidate=False, quiet=True,
        help="backend of the flex dispatcher: deepep (default) or hybridep",
        flag_group="precision and kernels",
        flags=(("--moe-flex-dispatcher-backend",
                lambda m, p: p.moe_flex_dispatcher_backend
                if m.is_moe and p.moe_token_dispatcher_type == "flex" else None),))
    moe_permute_fusion: bool = _field(
        False, megatron_name="moe_permute_fusion", cli_flag="--moe-permute-fusion",
        per_candidate=False, quiet=True,
        help="Transformer Engine's fused token permutation (Megatron --moe-permute-fusion; "
             "default off)",
        flag_group="precision and kernels",
        flags=(("--moe-permute-fusion", lambda m, p: (m.is_moe and p.moe_permute_fusion)
                or None),))
    moe_router_fusion: bool = _field(
        False, megatron_name="moe_router_fusion", cli_flag="--moe-router-fusion",
        per_candidate=False, quiet=True,
        help="Transformer Engine's fused top-k routing and auxiliary loss (Megatron "
             "--moe-router-fusion; default off)",
        flag_group="precision and kernels",
        flags=(("--moe-router-fusion", lambda m, p: (m.is_moe and p.moe_router_fusion)
                or None),))
    moe_expert_capacity_factor: float = _field(
        0.0, megatron_name="moe_expert_capacity_factor",
        cli_flag="--moe-expert-capacity-factor", per_candidate=False, quiet=True,
        help="tokens an expert takes per rank, as a multiple of the even share "
             "ceil(tokens*topk/experts*factor); beyond it tokens are dropped (Megatron "
             "--moe-expert-capacity-factor; 0: dropless, the default)",
        flag_group="precision and kernels",
        flags=(("--moe-expert-capacity-factor",
                lambda m, p: p.moe_expert_capacity_factor
                if m.is_moe and p.moe_expert_capacity_factor > 0 else None),))
    moe_pad_expert_input_to_capacity: bool = _field(
        False, megatron_name="moe_pad_expert_input_to_capacity",
        cli_flag="--moe-pad-expert-input-to-capacity", per_candidate=False, quiet=True,
        help="pad every expert's input to its capacity (static shapes; Megatron "
             "--moe-pad-expert-input-to-capacity; needs a capacity factor)",
        flag_group="precision and kernels",
        flags=(("--moe-pad-expert-input-to-capacity",
                lambda m, p: (m.is_moe and p.moe_pad_expert_input_to_capacity) or None),))
    fp8_recipe: str = _field(
        "delayed", megatron_name="fp8_recipe", cli_flag="--fp8-recipe", choices=FP8_RECIPES,
        per_candidate=False, quiet=True,
        help="scaling of precision fp8: delayed (Megatron's default), tensorwise (current "
             "scaling, Megatron-Bridge's FP8-CS) or blockwise (1x128/128x128 blocks)",
        flag_group="precision and kernels")
    fp8_dot_product_attention: bool = _field(
        False, megatron_name="fp8_dot_product_attention",
        cli_flag="--fp8-dot-product-attention", per_candidate=False, quiet=True,
        help="core attention in FP8 (cuDNN fused attention; TransformerConfig "
             "fp8_dot_product_attention, set by Megatron-Bridge's configs; core_v0.16.1's "
             "pretrain_gpt.py has no flag for it, so launch scripts refuse it; fp8 with "
             "delayed or tensorwise scaling)",
        flag_group="precision and kernels")
    moe_fused_grouped_mlp: bool = _field(
        False, megatron_name="use_transformer_engine_op_fuser",
        cli_flag="--moe-fused-grouped-mlp", per_candidate=False, quiet=True,
        help="the routed experts' MLP fused by Transformer Engine's op fuser: fc1, the "
             "activation with its clamp, the routing probabilities and fc2's bias in the "
             "grouped GEMMs (Megatron-Bridge's 26.06 MoE recipes, on Megatron-Core after "
             "core_v0.16.1: estimate prices it, launch scripts refuse it)",
        flag_group="precision and kernels")
    cuda_graph_impl: str = _field(
        "none", megatron_name="cuda_graph_impl", cli_flag="--cuda-graph-impl",
        choices=CUDA_GRAPH_IMPLS, per_candidate=False, quiet=True,
        help="CUDA graphs (Megatron --cuda-graph-impl): none (default), transformer_engine "
             "(per layer or the scopes of cuda_graph_scope) or local (full_iteration)",
        flag_group="precision and kernels",
        flags=(("--cuda-graph-impl",
                lambda m, p: p.cuda_graph_impl if p.cuda_graph_impl != "none" else None),
               ("--cuda-graph-scope", lambda m, p: _list_flag(p.cuda_graph_scope)),
               # validate_args: the local implementation with ep > 1 asserts this flag;
               # full_iteration asserts the NaN check off
               ("--moe-pad-experts-for-cuda-graph-inference",
                lambda m, p: (p.cuda_graph_impl == "local" and p.ep > 1) or None),
               ("--no-check-for-nan-in-loss-and-grad",
                lambda m, p: "full_iteration" in p.cuda_graph_scope or None)))
    cuda_graph_scope: str = _field(
        "", megatron_name="cuda_graph_scope", cli_flag="--cuda-graph-scope",
        per_candidate=False, quiet=True,
        help="what the graphs capture, comma-separated (Megatron --cuda-graph-scope): "
             "full_iteration (local), or attn, mlp, moe, moe_router, moe_preprocess "
             "(transformer_engine); empty: whole layers",
        flag_group="precision and kernels")
    use_precision_aware_optimizer: bool = _field(
        False, megatron_name="use_precision_aware_optimizer",
        cli_flag="--use-precision-aware-optimizer", per_candidate=False, quiet=True,
        help="Transformer Engine's FusedAdam holds the master weights and the moments in the "
             "dtypes below (Megatron --use-precision-aware-optimizer; Adam with the "
             "distributed optimizer)",
        flag_group="precision and kernels",
        flags=(("--use-precision-aware-optimizer",
                lambda m, p: p.use_precision_aware_optimizer or None),
               ("--main-grads-dtype",
                lambda m, p: p.main_grads_dtype if p.main_grads_dtype != "fp32" else None),
               ("--main-params-dtype",
                lambda m, p: p.main_params_dtype if p.main_params_dtype != "fp32" else None),
               ("--exp-avg-dtype",
                lambda m, p: p.exp_avg_dtype if p.exp_avg_dtype != "fp32" else None),
               ("--exp-avg-sq-dtype",
                lambda m, p: p.exp_avg_sq_dtype if p.exp_avg_sq_dtype != "fp32" else None)))
    main_grads_dtype: str = _field(
        "fp32", megatron_name="main_grads_dtype", cli_flag="--main-grads-dtype",
        choices=MAIN_GRADS_DTYPES, per_candidate=False, quiet=True,
        help="main gradients (the DDP buffer, what the data-parallel reduction moves) with "
             "the precision-aware optimizer: fp32 (default) or bf16",
        flag_group="precision and kernels")
    main_params_dtype: str = _field(
        "fp32", megatron_name="main_params_dtype", cli_flag="--main-params-dtype",
        choices=MAIN_PARAMS_DTYPES, per_candidate=False, quiet=True,
        help="master weights with the precision-aware optimizer: fp32 (default; with BF16 "
             "weights FusedAdam keeps only their low 16 bits) or fp16",
        flag_group="precision and kernels")
    exp_avg_dtype: str = _field(
        "fp32", megatron_name="exp_avg_dtype", cli_flag="--exp-avg-dtype",
        choices=MOMENT_DTYPES, per_candidate=False, quiet=True,
        help="Adam's first moment with the precision-aware optimizer (default fp32)",
        flag_group="precision and kernels")
    exp_avg_sq_dtype: str = _field(
        "fp32", megatron_name="exp_avg_sq_dtype", cli_flag="--exp-avg-sq-dtype",
        choices=MOMENT_DTYPES, per_candidate=False, quiet=True,
        help="Adam's second moment with the precision-aware optimizer (default fp32)",
        flag_group="precision and kernels")
    offload_modules: str = _field(
        "", megatron_name="offload_modules", cli_flag="--offload-modules",
        per_candidate=False, quiet=True,
        help="fine-grained activation offloading: the modules whose saved activations wait "
             "in host memory between forward and backward, comma-separated, of "
             + ", ".join(OFFLOAD_MODULES) + " (Megatron --fine-grained-activation-offloading "
             "--offload-modules; empty: none, the default)",
        flag_group="recompute",
        flags=(("--fine-grained-activation-offloading",
                lambda m, p: bool(p.offload_modules) or None),
               ("--offload-modules", lambda m, p: _list_flag(p.offload_modules))))

    def __post_init__(self):
        # one spelling per module list (Megatron's order), so equal plans compare equal; a bad
        # list is kept as given for the rules to name. Megatron reads the list with selective
        # recompute only: other plans carry the default.
        if self.precision != "fp8":     # the recipe of precision fp8 only
            object.__setattr__(self, "fp8_recipe", PLAN_FIELD_DEFAULTS["fp8_recipe"])
        for name in ("cuda_graph_scope", "offload_modules"):   # one spelling per list
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, ",".join(getattr(self, name).replace(
                    ",", " ").split()))
        if self.recompute in ("none", "full"):
            modules = PLAN_FIELD_DEFAULTS["recompute_modules"]
        else:
            try:
                modules = ",".join(recompute_module_list(self.recompute_modules))
            except InputError:
                return
        object.__setattr__(self, "recompute_modules", modules)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def num_microbatches(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def custom_layer_split(self) -> bool:
        """An uneven, embedding/loss-aware or laid-out pipeline split (not ``L/pp`` per
        rank)."""
        return bool(self.pipeline_model_parallel_layout
                    or self.decoder_first_pipeline_num_layers
                    or self.decoder_last_pipeline_num_layers
                    or self.account_for_embedding_in_pipeline_split
                    or self.account_for_loss_in_pipeline_split)

    @property
    def layer_split(self) -> tuple:
        """``(pp, vp, first, last, account_embedding, account_loss, layout)``: the
        arguments of :func:`configurator.core.layers.rank_layer_counts`."""
        return (self.pp, self.vp, self.decoder_first_pipeline_num_layers,
                self.decoder_last_pipeline_num_layers,
                self.account_for_embedding_in_pipeline_split,
                self.account_for_loss_in_pipeline_split, self.pipeline_model_parallel_layout)

    @property
    def stores_attention_scores(self) -> bool:
        return self.attention_backend in SCORE_STORING_BACKENDS

    def to_dict(self) -> dict:
        """Every field by name, then the derived ``num_microbatches`` and the aliases."""
        d = dataclasses.asdict(self)
        d["num_microbatches"] = self.num_microbatches
        for f in PLAN_FIELDS:
            if f.alias:
                d[f.alias] = d[f.name]
        return d


def _collect() -> tuple[PlanField, ...]:
    out = []
    for f in dataclasses.fields(ParallelPlan):
        meta = dict(f.metadata["plan"])
        out.append(PlanField(name=f.name, type={"int": int, "bool": bool, "str": str,
                                                "float": float}[
            f.type if isinstance(f.type, str) else f.type.__name__], default=f.default, **meta))
    return tuple(out)


#: THE plan schema, in field order.
PLAN_FIELDS: tuple[PlanField, ...] = _collect()
PLAN_FIELD = {f.name: f for f in PLAN_FIELDS}
PLAN_FIELD_DEFAULTS.update({f.name: f.default for f in PLAN_FIELDS})
#: Fields a plan document may leave out (their defaults: no expert parallelism, an even
#: layer split), so documents written before these fields existed still read.
OPTIONAL_PLAN_KEYS = ("ep", "etp", "decoder_first_pipeline_num_layers",
                      "decoder_last_pipeline_num_layers",
                      "account_for_embedding_in_pipeline_split",
                      "account_for_loss_in_pipeline_split", "fp8_param_gather",
                      "cp_comm_type", "grad_reduce_in_bf16", "tp_comm_overlap",
                      "cross_entropy_fusion", "megatron_fsdp",
                      "pipeline_model_parallel_layout", "recompute_modules",
                      "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
                      "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                      "moe_permute_fusion", "moe_router_fusion", "moe_expert_capacity_factor",
                      "moe_pad_expert_input_to_capacity", "fp8_recipe",
                      "fp8_dot_product_attention", "moe_fused_grouped_mlp", "cuda_graph_impl",
                      "cuda_graph_scope", "use_precision_aware_optimizer", "main_grads_dtype",
                      "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                      "offload_modules")
#: Plan fields one value of which serves a whole search (``search`` takes each as an option
#: and every plan it ranks carries it; ``estimate`` takes them as any field).
SEARCH_OPTIONS = ("precision", "attention_backend", "fp8_param_gather", "cp_comm_type",
                  "grad_reduce_in_bf16", "tp_comm_overlap", "cross_entropy_fusion",
                  "megatron_fsdp", "recompute_modules", "delay_wgrad_compute",
                  "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                  "moe_permute_fusion", "moe_router_fusion", "moe_expert_capacity_factor",
                  "moe_pad_expert_input_to_capacity", "fp8_recipe",
                  "fp8_dot_product_attention", "moe_fused_grouped_mlp", "cuda_graph_impl",
                  "cuda_graph_scope", "use_precision_aware_optimizer", "main_grads_dtype",
                  "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "offload_modules")
#: Keys :meth:`ParallelPlan.to_dict` adds that are not fields (ignored on reading).
DERIVED_KEYS = ("num_microbatches",) + tuple(f.alias for f in PLAN_FIELDS if f.alias)


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


def recompute_code(recompute, modules: str):
    """The recompute code of plans (arrays broadcast): 0 none, :data:`RECOMPUTE_FULL` full,
    and for selective the OR of the :data:`RECOMPUTE_MODULE_BITS` of ``modules`` (a bad
    ``modules`` reads as core attention alone; the rules report it). ``recompute``: a
    :data:`RECOMPUTE` name or its :data:`RECOMPUTE_CODES` code (array)."""
    try:
        bits = sum(RECOMPUTE_MODULE_BITS[m] for m in recompute_module_list(modules))
    except InputError:
        bits = RECOMPUTE_CORE_ATTN
    rc = RECOMPUTE_CODES[recompute] if isinstance(recompute, str) else np.asarray(recompute)
    return np.where(rc == RECOMPUTE_CODES["selective"], bits, rc)


def fp8_weights_gathered(requested, distributed_optimizer, precision: str):
    """Whether the plan's GEMM weights are kept and all-gathered in FP8 only
    (``--fp8-param-gather``): where it was requested, the precision is FP8 and the plan has the
    distributed optimizer (Megatron: "--fp8-param-gather only supported with distributed
    optimizer"). Broadcasts over numpy boolean arrays."""
    return requested & distributed_optimizer & is_fp8(precision)


def main_grad_bytes(precision: str, grad_reduce_in_bf16, main_grads_dtype: str = "fp32"
                    ) -> float:
    """Bytes of one main gradient (Megatron's DDP grad buffer, what the data-parallel
    reduction moves): 4 (FP32, ``accumulate_allreduce_grads_in_fp32``, Megatron's default
    with BF16 parameters), 2 with ``--grad-reduce-in-bf16``, the precision-aware optimizer's
    ``--main-grads-dtype bf16`` (which leaves the FP32 accumulation off) or FP16 parameters
    (megatron/training/arguments.py ``validate_args``)."""
    return 2.0 if (precision == "fp16" or bool(grad_reduce_in_bf16)
                   or main_grads_dtype == "bf16") else 4.0


def capacity_share(c) -> float:
    """Routed token copies an expert computes with the plan's (or candidates') capacity
    factor ``f``, over the dropless count, under balanced routing (the experts' even share
    fills every expert):
    1 dropless; ``min(1, f)`` when tokens beyond ``ceil(T·k/E·f)`` are dropped; ``f`` when
    every expert is padded to that capacity (megatron-core 0.16.1 moe_utils.py
    ``get_capacity``, ``apply_router_token_dropping``; token_dispatcher.py, drop-and-pad)."""
    f = float(c.moe_expert_capacity_factor)
    if f <= 0:
        return 1.0
    return f if c.moe_pad_expert_input_to_capacity else min(1.0, f)


def optimizer_state_bytes(p) -> float:
    """Optimizer-state bytes per parameter (before the distributed optimizer shards it) of
    plan (or candidates) ``p``: Adam's FP32 master weight and two moments, 12
    (Rajbhandari et al. 2020, ZeRO §3); with the precision-aware optimizer the moments in
    ``exp_avg_dtype``/``exp_avg_sq_dtype`` and the master weight held by Transformer
    Engine's FusedAdam, which keeps only the 16 low bits of an FP32 master beside the BF16
    weight (``store_param_remainders``) or an FP16 one: 2, except for FP8 recipes other than
    delayed scaling with an FP32 master, where megatron-core keeps its own FP32 copy: 4
    (megatron/core/optimizer/optimizer_config.py
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``; distrib_optimizer.py)."""
    if not p.use_precision_aware_optimizer:
        return 12.0
    moments = DTYPE_BYTES[p.exp_avg_dtype] + DTYPE_BYTES[p.exp_avg_sq_dtype]
    own_copy = (p.main_params_dtype == "fp32" and is_fp8(p.precision)
                and (p.precision == "mxfp8" or p.fp8_recipe != "delayed"))
    return moments + (4.0 if own_copy else 2.0)


def search_options(**given) -> dict[str, Any]:
    """Every :data:`SEARCH_OPTIONS` field, ``given`` ones over their plan defaults (a value of
    ``None`` is the default). Raises ``TypeError`` naming a name that is not one."""
    unknown = sorted(set(given) - set(SEARCH_OPTIONS))
    if unknown:
        raise TypeError(f"not a search option: {', '.join(unknown)}")
    return {name: PLAN_FIELD[name].default if given.get(name) is None else given[name]
            for name in SEARCH_OPTIONS}


def describe_search_options(options: Mapping[str, Any]) -> str:
    """``", name value"`` (a boolean: ``", name"``) for each option off its default, in
    :data:`SEARCH_OPTIONS` order, precision left out (shown on its own)."""
    out = []
    for name in SEARCH_OPTIONS[1:]:
        value, default = options[name], PLAN_FIELD[name].default
        if value != default:
            out.append(name if value is True else f"{name} {value}")
    return "".join(f", {o}" for o in out)


def tp_comm_overlapped(requested, tp, sequence_parallel, attention_backend: str):
    """Whether the plan's tensor-parallel collectives are overlapped with its GEMMs: only
    where requested, with tp > 1 and sequence parallelism (megatron/training/arguments.py
    ``validate_args``: "Tensor parallel communication/GEMM overlap can happen only when
    sequence parallelism is enabled") and Transformer Engine's layers, whose userbuffers
    run the overlap (not with ``--transformer-impl local``, which the ``local`` attention
    backend selects). Booleans or arrays."""
    return requested & (tp > 1) & sequence_parallel & (attention_backend != "local")


def param_gather_overlap(requested, distributed_optimizer):
    """Whether the parameter all-gather is overlapped: only where it was requested and the
    plan has the distributed optimizer (Megatron's ``--overlap-param-gather`` needs
    ``--use-distributed-optimizer``). Broadcasts over numpy boolean arrays."""
    return requested & distributed_optimizer


def describe_plan(plan: ParallelPlan) -> list[str]:
    """``name=value`` words of every field (aliases where declared) in schema order, a text
    field left empty (no pipeline layout) and a quiet field at its default (the MoE
    communication, kernel and optimizer options) left out, then ``microbatches=m``: the plan
    as the estimate text and the script header show it."""
    return [f"{f.short}={getattr(plan, f.name)}" for f in PLAN_FIELDS
            if getattr(plan, f.name) != "" and not (f.quiet and getattr(plan, f.name)
                                                    == f.default)] + [
        f"microbatches={plan.num_microbatches}"]


def check_field(f: PlanField, value: Any, where: str = "") -> Any:
    """Validate one value against its field's type and choices; return it.

    Integers must lie in their documented range (:data:`configurator.core.limits.INT_RANGES`;
    bools rejected); booleans must be real booleans; strings must be one of ``choices``. Raises :class:`InputError` naming ``where + name``.
    """
    name = where + f.name
    if f.type is int:
        return v.int_in_range(name, value, key=f.name)
    if f.type is bool:
        return v.boolean(name, value)
    if f.type is float:
        return v.float_in_range(name, value, key=f.name)
    if f.choices is not None:
        return v.choice(name, value, f.choices)
    if not isinstance(value, str):
        raise InputError(name, value, "must be a string")
    return value


def plan_from_dict(data: Mapping[str, Any], where: str = "plan.") -> ParallelPlan:
    """Rebuild a plan from :meth:`ParallelPlan.to_dict` output, validating every field.

    Every field is required but those of :data:`OPTIONAL_PLAN_KEYS`; derived keys are
    ignored; any other key is an error. Raises
    :class:`InputError` naming ``where + field``. Megatron's cross-field rules are checked
    separately (:func:`configurator.core.rules.check_plan`).
    """
    if not isinstance(data, Mapping):
        raise InputError(where.rstrip("."), type(data).__name__, "must be a mapping")
    required = [f.name for f in PLAN_FIELDS if f.name not in OPTIONAL_PLAN_KEYS]
    v.exact_keys(where.rstrip("."), data, required, DERIVED_KEYS + OPTIONAL_PLAN_KEYS)
    return ParallelPlan(**{f.name: check_field(f, data.get(f.name, f.default), where)
                           for f in PLAN_FIELDS})
