"""The parallel plan: ``ParallelPlan`` and the one schema every view of a plan derives from.

Each field of :class:`ParallelPlan` carries its metadata (:class:`PlanField`): Megatron-LM's
argument name, the CLI flag, type, allowed values, help, table column, whether it varies per
candidate in the search, and the ``pretrain_gpt.py`` flags it becomes. The CLI options
(``configurator.cli``), plan JSON (:meth:`ParallelPlan.to_dict` / :func:`plan_from_dict`),
the ranked table (``configurator.report``), the search's candidate columns
(``configurator.core.plan_batch``) and the launch flags (``launchers.megatron_flags``) are
all generated from :data:`PLAN_FIELDS`. The plan's first fields, its parallel layout, are
declared in :mod:`configurator.core.plan_layout` (:class:`ParallelPlan` extends
:class:`~configurator.core.plan_layout.PlanLayout`), the others here; the values fields take
are in :mod:`configurator.core.plan_values`, the quantities derived from them in
:mod:`configurator.core.plan_terms`. Adding a field means adding it here (or, for a layout
field, in :mod:`~configurator.core.plan_layout`) plus its cost and memory formulas.

Flag sources: Megatron-LM core_v0.16.1 ``megatron/training/arguments.py`` (argument names,
``validate_args``) and ``megatron/core/transformer/transformer_config.py``
(``__post_init__``); the rules that tie fields together live in :mod:`configurator.core.rules`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.plan_layout import BRIDGE_KEEP, PlanLayout, schema_field
from configurator.core.plan_terms import fp8_weights_gathered, tp_comm_overlapped
from configurator.core.plan_values import (ATTENTION_BACKENDS, CP_COMM_TYPES,
                                           CROSS_ENTROPY_FUSIONS, CUDA_GRAPH_IMPLS,
                                           FP8_RECIPES, MAIN_GRADS_DTYPES, MAIN_PARAMS_DTYPES,
                                           MOE_DISPATCHERS, MOE_FLEX_BACKENDS, MOMENT_DTYPES,
                                           OFFLOAD_MODULES, PRECISION, SCORE_STORING_BACKENDS,
                                           is_fp8, recompute_module_list)


#: A flag value: None (left out), True (bare switch), a number, a string or a tuple (a list).
FlagValue = Union[None, bool, int, float, str, tuple]
#: ``(flag, value(model, plan))``: one Megatron-LM flag a field becomes.
FlagRule = tuple[str, Callable[[Any, "ParallelPlan"], FlagValue]]

#: ``(dotted ConfigContainer key, value(model, plan))``: one Megatron-Bridge override a field
#: becomes, e.g. ``("model.tensor_model_parallel_size", ...)``; the value is what the config
#: field takes (None: ``null``; :data:`BRIDGE_KEEP`: the recipe's own value is kept).
BridgeRule = tuple[str, Callable[[Any, "ParallelPlan"], Any]]

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
    #: where it returns False for a plan, the field has no effect on it and plan descriptions
    #: leave it out (None: always in effect)
    in_effect: Callable[[Any], bool] | None = None
    flag_group: str | None = None
    flags: tuple[FlagRule, ...] = ()
    #: Megatron-Bridge ``ConfigContainer`` overrides the field becomes (``launchers.bridge``)
    bridge: tuple[BridgeRule, ...] = ()

    @property
    def short(self) -> str:
        return self.alias or self.name


#: Each field's default (filled once the schema is collected; ``__post_init__`` reads it).
PLAN_FIELD_DEFAULTS: dict[str, Any] = {}


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


#: Megatron-Bridge 0.3.1's mixed-precision recipe (``megatron/bridge/training/
#: mixed_precision.py``, ``ConfigContainer.mixed_precision``) of each precision and FP8
#: scaling: hybrid FP8 with delayed, current (tensorwise) or sub-channel (blockwise)
#: scaling, MXFP8 (E4M3).
BRIDGE_PRECISION_RECIPES = {"bf16": "bf16_mixed", "fp16": "fp16_mixed",
                            ("fp8", "delayed"): "bf16_with_fp8_delayed_scaling_mixed",
                            ("fp8", "tensorwise"): "bf16_with_fp8_current_scaling_mixed",
                            ("fp8", "blockwise"): "bf16_with_fp8_subchannel_scaling_mixed",
                            "mxfp8": "bf16_with_mxfp8_mixed"}


def bridge_precision_recipe(p) -> str:
    """The Megatron-Bridge mixed-precision recipe name of plan ``p``'s precision
    (:data:`BRIDGE_PRECISION_RECIPES`)."""
    return BRIDGE_PRECISION_RECIPES[(p.precision, p.fp8_recipe) if p.precision == "fp8"
                                    else p.precision]


def _moe_only(value):
    """A Megatron-Bridge rule's value for MoE models, the recipe's own for dense ones."""
    return lambda m, p: value(p) if m.is_moe else BRIDGE_KEEP


_TORCH_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16",
                 "fp8": "torch.uint8"}


def _list_flag(text: str) -> tuple | None:
    """A comma-separated field as the words of an ``nargs='+'`` flag (None when empty)."""
    words = tuple(w for w in text.replace(",", " ").split())
    return words or None


@dataclass(frozen=True, kw_only=True)
class ParallelPlan(PlanLayout):
    """One Megatron-LM training configuration (Megatron's names in each field's metadata):
    its parallel layout (:class:`~configurator.core.plan_layout.PlanLayout`: sizes, batch,
    pipeline split, recompute), then the options one search shares (precision, kernels,
    communication overlaps, MoE dispatch, optimizer state, offloading).
    """

    precision: str = schema_field("bf16", bridge=(("mixed_precision", lambda m, p: bridge_precision_recipe(p)),),
                                  cli_flag="--precision", choices=PRECISION,
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
    cp_comm_type: str = schema_field(
        "p2p", bridge=(("model.cp_comm_type", lambda m, p: p.cp_comm_type if p.cp > 1 else None),),
        megatron_name="cp_comm_type", cli_flag="--cp-comm-type", choices=CP_COMM_TYPES,
        per_candidate=False,
        help="context-parallel attention communication (Megatron --cp-comm-type): p2p ring "
             "of K/V blocks overlapped with attention (default), a2a all-to-all over heads "
             "(Ulysses; heads per tp rank divisible by cp), all_gather K/V before attention "
             "(exposed); sliding-window attention needs a2a or all_gather",
        flag_group="parallelism",
        flags=(("--cp-comm-type",
                lambda m, p: p.cp_comm_type if p.cp > 1 and p.cp_comm_type != "p2p"
                else None),))
    attention_backend: str = schema_field(
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
    masked_softmax_fusion: bool = schema_field(
        True, bridge=(("model.masked_softmax_fusion", lambda m, p: p.masked_softmax_fusion),),
        megatron_name="masked_softmax_fusion", cli_flag="--masked-softmax-fusion",
        per_candidate=False,
        help="the local attention backend's fused scale-mask-softmax kernel (Megatron "
             "--no-masked-softmax-fusion turns it off, as a machine without Apex, which "
             "builds the kernel, must); off, or for shapes the kernel does not take (more "
             "than 4,096 keys, micro-batch size times heads per tensor-parallel rank not a "
             "multiple of 4), the scores go through PyTorch's masked fill and softmax "
             "(default on)",
        flag_group="precision and kernels",
        flags=(("--no-masked-softmax-fusion", lambda m, p: (not p.masked_softmax_fusion)
                or None),))
    attention_softmax_in_fp32: bool = schema_field(
        False, bridge=(("model.attention_softmax_in_fp32",
                        lambda m, p: p.attention_softmax_in_fp32),),
        megatron_name="attention_softmax_in_fp32", cli_flag="--attention-softmax-in-fp32",
        per_candidate=False,
        help="the local attention backend's masking and softmax in FP32 (Megatron "
             "--attention-softmax-in-fp32; default off, as pretrain_gpt.py has it): "
             "where the fused kernel does not run, PyTorch's softmax then casts the scores "
             "to FP32 and back",
        flag_group="precision and kernels",
        flags=(("--attention-softmax-in-fp32", lambda m, p: p.attention_softmax_in_fp32
                or None),))
    overlap_grad_reduce: bool = schema_field(
        True, bridge=(("ddp.overlap_grad_reduce", lambda m, p: p.overlap_grad_reduce),),
        megatron_name="overlap_grad_reduce", cli_flag="--overlap-grad-reduce",
        per_candidate=False,
        help="overlap the data-parallel gradient reduction with backward (default on)",
        flag_group="parallelism",
        flags=(("--overlap-grad-reduce", lambda m, p: p.overlap_grad_reduce or None),))
    overlap_param_gather: bool = schema_field(
        True, bridge=(("ddp.overlap_param_gather",
                 lambda m, p: bool(p.overlap_param_gather and p.distributed_optimizer
                                   and p.overlap_grad_reduce)),),
        megatron_name="overlap_param_gather", per_candidate=False,
        help="overlap the distributed optimizer's parameter all-gather with the next forward",
        flag_group="parallelism",
        # validate_args asserts --use-distributed-optimizer and --overlap-grad-reduce.
        flags=(("--overlap-param-gather",
                lambda m, p: (p.overlap_param_gather and p.distributed_optimizer
                              and p.overlap_grad_reduce) or None),))
    fp8_param_gather: bool = schema_field(
        True, megatron_name="fp8_param_gather", cli_flag="--fp8-param-gather",
        per_candidate=False,
        in_effect=lambda p: bool(fp8_weights_gathered(True, p.distributed_optimizer,
                                                      p.precision)),
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
    grad_reduce_in_bf16: bool = schema_field(
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
    cross_entropy_fusion: str = schema_field(
        "none", bridge=(("model.cross_entropy_loss_fusion", lambda m, p: p.cross_entropy_fusion != "none"),
                ("model.cross_entropy_fusion_impl",
                 lambda m, p: "te" if p.cross_entropy_fusion == "te" else "native")),
        cli_flag="--cross-entropy-fusion", choices=CROSS_ENTROPY_FUSIONS,
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
    megatron_fsdp: bool = schema_field(
        False, bridge=(("ddp.use_megatron_fsdp", lambda m, p: p.megatron_fsdp),
                ("ddp.data_parallel_sharding_strategy",
                 lambda m, p: "optim_grads_params" if p.megatron_fsdp else "no_shard"),
                ("model.gradient_accumulation_fusion",
                 lambda m, p: False if p.megatron_fsdp else BRIDGE_KEEP),
                ("checkpoint.ckpt_format",
                 lambda m, p: "fsdp_dtensor" if p.megatron_fsdp else BRIDGE_KEEP)),
        megatron_name="use_megatron_fsdp", cli_flag="--megatron-fsdp",
        per_candidate=False,
        help="Megatron FSDP over the dp*cp group: weights, gradients and optimizer state "
             "sharded, each layer's weights gathered before its forward and backward and its "
             "gradients reduce-scattered after every micro-batch's backward (Megatron "
             "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params, with "
             "the distributed optimizer; the launch scripts then leave "
             "CUDA_DEVICE_MAX_CONNECTIONS unset; default off)",
        flag_group="parallelism",
        # megatron-fsdp-user-guide.md's required flags (core_v0.16.1); validate_args asserts
        # --ckpt-format fsdp_dtensor, which the checkpoint rows of launchers/megatron_flags.py
        # write (one row for the format of every plan)
        flags=(("--use-megatron-fsdp", lambda m, p: p.megatron_fsdp or None),
               ("--data-parallel-sharding-strategy",
                lambda m, p: "optim_grads_params" if p.megatron_fsdp else None),
               ("--no-gradient-accumulation-fusion", lambda m, p: p.megatron_fsdp or None)))
    tp_comm_overlap: bool = schema_field(
        False, bridge=(("model.tp_comm_overlap", lambda m, p: bool(tp_comm_overlapped(
            p.tp_comm_overlap, p.tp, p.sequence_parallel, p.attention_backend))),),
        megatron_name="tp_comm_overlap", cli_flag="--tp-comm-overlap",
        per_candidate=False,
        help="overlap the tensor-parallel all-gathers and reduce-scatters with the GEMMs "
             "that consume or produce them (Megatron --tp-comm-overlap, Transformer "
             "Engine userbuffers; plans with tp > 1, sequence parallelism and Transformer "
             "Engine layers, the tp group inside one NVLink domain; default off)",
        flag_group="parallelism",
        # validate_args asserts sequence parallelism with it
        flags=(("--tp-comm-overlap", lambda m, p: tp_comm_overlapped(
            p.tp_comm_overlap, p.tp, p.sequence_parallel, p.attention_backend) or None),))

    async_tensor_model_parallel_allreduce: bool = schema_field(
        True, megatron_name="async_tensor_model_parallel_allreduce",
        cli_flag="--async-tensor-model-parallel-allreduce", per_candidate=False, quiet=True,
        help="the backward's tensor-parallel all-reduce of a column-parallel layer's input "
             "gradient runs under its weight-gradient GEMM (Megatron-LM since September "
             "2021, NVIDIA/Megatron-LM cf7efd4 and 3f65246, and always in megatron-core "
             "after 0.8; --no-async-tensor-model-parallel-allreduce: after it, exposed, as "
             "Megatron-LM ran before, e.g. the SC'21 runs: estimate prices it, launch "
             "scripts refuse it; it matters at tp > 1 without sequence parallelism; "
             "default on)",
        flag_group="parallelism")

    overlap_moe_expert_parallel_comm: bool = schema_field(
        False, bridge=(("model.overlap_moe_expert_parallel_comm",
                 lambda m, p: p.overlap_moe_expert_parallel_comm),),
        megatron_name="overlap_moe_expert_parallel_comm",
        cli_flag="--overlap-moe-expert-parallel-comm", alias="a2a_overlap", column="a2a-ovl",
        help="hide one microbatch's expert-parallel all-to-alls behind another's attention "
             "and expert compute (Megatron --overlap-moe-expert-parallel-comm: the combined "
             "1F1B schedule; MoE with ep > 1, interleaving when pp > 1, no full recompute, at "
             "most one MTP layer; default off, searched)",
        flag_group="parallelism",
        flags=(("--overlap-moe-expert-parallel-comm",
                lambda m, p: p.overlap_moe_expert_parallel_comm or None),))
    delay_wgrad_compute: bool = schema_field(
        False, bridge=(("model.delay_wgrad_compute",
                 lambda m, p: p.delay_wgrad_compute and p.overlap_moe_expert_parallel_comm),),
        megatron_name="delay_wgrad_compute", cli_flag="--delay-wgrad-compute",
        per_candidate=False, quiet=True,
        help="with the all-to-all overlap, run the experts' weight-gradient GEMMs while the "
             "dispatch's backward all-to-all travels (Megatron --delay-wgrad-compute; "
             "applies only to plans with overlap_moe_expert_parallel_comm; default off)",
        flag_group="parallelism",
        flags=(("--delay-wgrad-compute",
                lambda m, p: (p.delay_wgrad_compute and p.overlap_moe_expert_parallel_comm)
                or None),))
    moe_token_dispatcher_type: str = schema_field(
        "alltoall", bridge=(("model.moe_token_dispatcher_type", _moe_only(lambda p: p.moe_token_dispatcher_type)),
                ("model.moe_router_dtype", _moe_only(
                    lambda p: "fp32" if p.moe_token_dispatcher_type == "flex" else BRIDGE_KEEP))),
        megatron_name="moe_token_dispatcher_type",
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
    moe_flex_dispatcher_backend: str = schema_field(
        "deepep", bridge=(("model.moe_flex_dispatcher_backend",
                 _moe_only(lambda p: p.moe_flex_dispatcher_backend)),),
        megatron_name="moe_flex_dispatcher_backend",
        cli_flag="--moe-flex-dispatcher-backend", choices=MOE_FLEX_BACKENDS,
        per_candidate=False, quiet=True,
        help="backend of the flex dispatcher: deepep (default) or hybridep",
        flag_group="precision and kernels",
        flags=(("--moe-flex-dispatcher-backend",
                lambda m, p: p.moe_flex_dispatcher_backend
                if m.is_moe and p.moe_token_dispatcher_type == "flex" else None),))
    moe_permute_fusion: bool = schema_field(
        False, bridge=(("model.moe_permute_fusion", _moe_only(lambda p: p.moe_permute_fusion)),),
        megatron_name="moe_permute_fusion", cli_flag="--moe-permute-fusion",
        per_candidate=False, quiet=True,
        help="Transformer Engine's fused token permutation (Megatron --moe-permute-fusion; "
             "default off)",
        flag_group="precision and kernels",
        flags=(("--moe-permute-fusion", lambda m, p: (m.is_moe and p.moe_permute_fusion)
                or None),))
    moe_router_fusion: bool = schema_field(
        False, bridge=(("model.moe_router_fusion", _moe_only(lambda p: p.moe_router_fusion)),),
        megatron_name="moe_router_fusion", cli_flag="--moe-router-fusion",
        per_candidate=False, quiet=True,
        help="Transformer Engine's fused top-k routing and auxiliary loss (Megatron "
             "--moe-router-fusion; default off)",
        flag_group="precision and kernels",
        flags=(("--moe-router-fusion", lambda m, p: (m.is_moe and p.moe_router_fusion)
                or None),))
    moe_expert_capacity_factor: float = schema_field(
        0.0, bridge=(("model.moe_expert_capacity_factor",
                 _moe_only(lambda p: p.moe_expert_capacity_factor or None)),),
        megatron_name="moe_expert_capacity_factor",
        cli_flag="--moe-expert-capacity-factor", per_candidate=False, quiet=True,
        help="tokens an expert takes per rank, as a multiple of the even share "
             "ceil(tokens*topk/experts*factor); beyond it tokens are dropped (Megatron "
             "--moe-expert-capacity-factor; 0: dropless, the default)",
        flag_group="precision and kernels",
        flags=(("--moe-expert-capacity-factor",
                lambda m, p: p.moe_expert_capacity_factor
                if m.is_moe and p.moe_expert_capacity_factor > 0 else None),))
    moe_pad_expert_input_to_capacity: bool = schema_field(
        False, bridge=(("model.moe_pad_expert_input_to_capacity",
                 _moe_only(lambda p: p.moe_pad_expert_input_to_capacity)),),
        megatron_name="moe_pad_expert_input_to_capacity",
        cli_flag="--moe-pad-expert-input-to-capacity", per_candidate=False, quiet=True,
        help="pad every expert's input to its capacity (static shapes; Megatron "
             "--moe-pad-expert-input-to-capacity; needs a capacity factor)",
        flag_group="precision and kernels",
        flags=(("--moe-pad-expert-input-to-capacity",
                lambda m, p: (m.is_moe and p.moe_pad_expert_input_to_capacity) or None),))
    moe_router_force_load_balancing: bool = schema_field(
        False, bridge=(("model.moe_router_force_load_balancing",
                 _moe_only(lambda p: p.moe_router_force_load_balancing)),),
        megatron_name="moe_router_force_load_balancing",
        cli_flag="--moe-router-force-load-balancing", per_candidate=False, quiet=True,
        help="route on random scores, so every expert gets its even share of tokens (Megatron "
             "--moe-router-force-load-balancing, a benchmarking switch: Megatron-Bridge's "
             "MoE performance recipes set it; default off: trained routing, whose busiest "
             "expert-parallel rank gets more than the even share and sets the pace)",
        flag_group="precision and kernels",
        flags=(("--moe-router-force-load-balancing",
                lambda m, p: (m.is_moe and p.moe_router_force_load_balancing) or None),))
    fp8_recipe: str = schema_field(
        "delayed", megatron_name="fp8_recipe", cli_flag="--fp8-recipe", choices=FP8_RECIPES,
        per_candidate=False, quiet=True,
        help="scaling of precision fp8: delayed (Megatron's default), tensorwise (current "
             "scaling, Megatron-Bridge's FP8-CS) or blockwise (1x128/128x128 blocks)",
        flag_group="precision and kernels")
    fp8_dot_product_attention: bool = schema_field(
        False, megatron_name="fp8_dot_product_attention",
        cli_flag="--fp8-dot-product-attention", per_candidate=False, quiet=True,
        help="core attention in FP8 (cuDNN fused attention; TransformerConfig "
             "fp8_dot_product_attention, set by Megatron-Bridge's configs; core_v0.16.1's "
             "pretrain_gpt.py has no flag for it, so launch scripts refuse it; fp8 with "
             "delayed or tensorwise scaling)",
        flag_group="precision and kernels")
    moe_fused_grouped_mlp: bool = schema_field(
        False, megatron_name="use_transformer_engine_op_fuser",
        cli_flag="--moe-fused-grouped-mlp", per_candidate=False, quiet=True,
        help="the routed experts' MLP fused by Transformer Engine's op fuser: fc1, the "
             "activation with its clamp, the routing probabilities and fc2's bias in the "
             "grouped GEMMs (Megatron-Bridge's 26.06 MoE recipes, on Megatron-Core after "
             "core_v0.16.1: estimate prices it, launch scripts refuse it)",
        flag_group="precision and kernels")
    cuda_graph_impl: str = schema_field(
        "none", bridge=(("model.cuda_graph_impl", lambda m, p: p.cuda_graph_impl),
                ("model.cuda_graph_scope",
                 lambda m, p: list(_list_flag(p.cuda_graph_scope)) if p.cuda_graph_scope
                 else BRIDGE_KEEP)),
        megatron_name="cuda_graph_impl", cli_flag="--cuda-graph-impl",
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
    cuda_graph_scope: str = schema_field(
        "", megatron_name="cuda_graph_scope", cli_flag="--cuda-graph-scope",
        per_candidate=False, quiet=True,
        help="what the graphs capture, comma-separated (Megatron --cuda-graph-scope): "
             "full_iteration (local), or attn, mlp, moe, moe_router, moe_preprocess "
             "(transformer_engine); empty: whole layers",
        flag_group="precision and kernels")
    use_precision_aware_optimizer: bool = schema_field(
        False, bridge=(("optimizer.use_precision_aware_optimizer",
                 lambda m, p: p.use_precision_aware_optimizer),
                *((f"optimizer.{name}", lambda m, p, name=name: _TORCH_DTYPES[getattr(p, name)])
                  for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                               "exp_avg_sq_dtype"))),
        megatron_name="use_precision_aware_optimizer",
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
    main_grads_dtype: str = schema_field(
        "fp32", megatron_name="main_grads_dtype", cli_flag="--main-grads-dtype",
        choices=MAIN_GRADS_DTYPES, per_candidate=False, quiet=True,
        help="main gradients (the DDP buffer, what the data-parallel reduction moves) with "
             "the precision-aware optimizer: fp32 (default) or bf16",
        flag_group="precision and kernels")
    main_params_dtype: str = schema_field(
        "fp32", megatron_name="main_params_dtype", cli_flag="--main-params-dtype",
        choices=MAIN_PARAMS_DTYPES, per_candidate=False, quiet=True,
        help="master weights with the precision-aware optimizer: fp32 (default; with BF16 "
             "weights FusedAdam keeps only their low 16 bits) or fp16",
        flag_group="precision and kernels")
    exp_avg_dtype: str = schema_field(
        "fp32", megatron_name="exp_avg_dtype", cli_flag="--exp-avg-dtype",
        choices=MOMENT_DTYPES, per_candidate=False, quiet=True,
        help="Adam's first moment with the precision-aware optimizer (default fp32)",
        flag_group="precision and kernels")
    exp_avg_sq_dtype: str = schema_field(
        "fp32", megatron_name="exp_avg_sq_dtype", cli_flag="--exp-avg-sq-dtype",
        choices=MOMENT_DTYPES, per_candidate=False, quiet=True,
        help="Adam's second moment with the precision-aware optimizer (default fp32)",
        flag_group="precision and kernels")
    offload_modules: str = schema_field(
        "", bridge=(("model.fine_grained_activation_offloading",
                 lambda m, p: bool(p.offload_modules)),
                ("model.offload_modules",
                 lambda m, p: list(_list_flag(p.offload_modules)) if p.offload_modules
                 else None)),
        megatron_name="offload_modules", cli_flag="--offload-modules",
        per_candidate=False, quiet=True,
        help="fine-grained activation offloading: the modules whose saved activations wait "
             "in host memory between forward and backward, comma-separated, of "
             + ", ".join(OFFLOAD_MODULES) + " (Megatron --fine-grained-activation-offloading "
             "--offload-modules; empty: none, the default)",
        flag_group="recompute",
        flags=(("--fine-grained-activation-offloading",
                lambda m, p: bool(p.offload_modules) or None),
               ("--offload-modules", lambda m, p: _list_flag(p.offload_modules))))
    cpu_offloading_num_layers: int = schema_field(
        0, bridge=(("model.cpu_offloading", lambda m, p: p.cpu_offloading_num_layers > 0),
                   ("model.cpu_offloading_num_layers",
                    lambda m, p: p.cpu_offloading_num_layers)),
        megatron_name="cpu_offloading_num_layers", cli_flag="--cpu-offloading-num-layers",
        column="cpu-off", per_candidate=False, quiet=True,
        help="CPU offloading of whole layers: the activations of the model's first N layers "
             "wait in host memory between forward and backward, copied on side streams "
             "beside the next layers' compute (Megatron --cpu-offloading-num-layers, "
             "Transformer Engine's CPU offload context; pp 1, no recompute; 0: none, the "
             "default)",
        flag_group="recompute",
        flags=(("--cpu-offloading-num-layers",
                lambda m, p: p.cpu_offloading_num_layers or None),))


    def __post_init__(self):
        # a whole-number field holds an int: a float (4.0) would reach the scripts as
        # "--num-layers-per-virtual-pipeline-stage 4.0", which Megatron's integer flags
        # refuse; a NumPy integer (a PlanBatch column's) becomes the int it is
        for name in _INT_FIELD_NAMES:
            value = getattr(self, name)
            if type(value) is not int:
                object.__setattr__(self, name, v.whole_number(f"plan.{name}", value))
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
#: The whole-number fields (:meth:`ParallelPlan.__post_init__` holds each to an int).
_INT_FIELD_NAMES = tuple(f.name for f in PLAN_FIELDS if f.type is int)
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
                      "moe_pad_expert_input_to_capacity",
                      "moe_router_force_load_balancing", "fp8_recipe",
                      "fp8_dot_product_attention", "moe_fused_grouped_mlp", "cuda_graph_impl",
                      "cuda_graph_scope", "use_precision_aware_optimizer", "main_grads_dtype",
                      "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                      "offload_modules", "masked_softmax_fusion", "attention_softmax_in_fp32",
                      "cpu_offloading_num_layers", "async_tensor_model_parallel_allreduce")
#: Plan fields one value of which serves a whole search (``search`` takes each as an option
#: and every plan it ranks carries it; ``estimate`` takes them as any field).
SEARCH_OPTIONS = ("precision", "attention_backend", "masked_softmax_fusion",
                  "attention_softmax_in_fp32", "fp8_param_gather", "cp_comm_type",
                  "grad_reduce_in_bf16", "tp_comm_overlap", "cross_entropy_fusion",
                  "megatron_fsdp", "recompute_modules", "delay_wgrad_compute",
                  "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                  "moe_permute_fusion", "moe_router_fusion", "moe_expert_capacity_factor",
                  "moe_pad_expert_input_to_capacity",
                  "moe_router_force_load_balancing", "fp8_recipe",
                  "fp8_dot_product_attention", "moe_fused_grouped_mlp", "cuda_graph_impl",
                  "cuda_graph_scope", "use_precision_aware_optimizer", "main_grads_dtype",
                  "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "offload_modules",
                  "cpu_offloading_num_layers", "async_tensor_model_parallel_allreduce")
#: Keys :meth:`ParallelPlan.to_dict` adds that are not fields (ignored on reading).
DERIVED_KEYS = ("num_microbatches",) + tuple(f.alias for f in PLAN_FIELDS if f.alias)




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


def search_option_words(given: Mapping[str, Any]) -> list[str]:
    """The command-line words (``search``, ``trial``, ``estimate``) that set each option of
    ``given`` not ``None``, in :data:`SEARCH_OPTIONS` order: ``--flag value``, a boolean
    ``--flag`` or ``--no-flag``."""
    words: list[str] = []
    for name in SEARCH_OPTIONS:
        value = given.get(name)
        if value is not None and PLAN_FIELD[name].cli_flag is not None:
            words += field_words(name, value)
    return words


def field_words(name: str, value) -> list[str]:
    """The command-line words that set plan field ``name`` to ``value``: a boolean's
    ``--flag`` or ``--no-flag``, else ``--flag value`` (a tuple: ``--flag v1 v2 …``, as a
    search restriction takes it); the flag is the field's ``cli_flag``, else ``--name``."""
    flag = PLAN_FIELD[name].cli_flag or f"--{name}"
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    return [flag, *(str(x) for x in (value if isinstance(value, tuple | list) else (value,)))]


def describe_plan(plan: ParallelPlan) -> list[str]:
    """``name=value`` words of every field (aliases where declared) in schema order, a text
    field left empty (no pipeline layout), a quiet field at its default (the MoE
    communication, kernel and optimizer options) and a field without effect on the plan
    (:attr:`PlanField.in_effect`: ``fp8_param_gather`` outside FP8 with the distributed
    optimizer) left out, then
    ``microbatches=m``: the plan as the estimate text and the script header show it."""
    return [f"{f.short}={getattr(plan, f.name)}" for f in PLAN_FIELDS
            if getattr(plan, f.name) != ""
            and not (f.quiet and getattr(plan, f.name) == f.default)
            and (f.in_effect is None or f.in_effect(plan))] + [
        f"microbatches={plan.num_microbatches}"]


def check_field(f: PlanField, value: Any, where: str = "") -> Any:
    """Validate one value against its field's type and choices; return it.

    Integers must lie in their documented range (:data:`configurator.core.limits.INT_RANGES`;
    bools rejected); booleans must be real booleans; strings must be one of ``choices``.
    Raises :class:`InputError` naming ``where + name``.
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
