"""The parallel layout of a plan: :class:`PlanLayout`, the first fields of
:class:`~configurator.core.plan.ParallelPlan` (the parallel sizes, the batch, the pipeline's
layer split, recompute, sequence parallelism and the distributed optimizer), each with its
:class:`~configurator.core.plan.PlanField` metadata, and what is derived from them alone
(world size, microbatches, the layer split).

The search varies these fields per candidate (but ``global_batch_size`` and
``recompute_modules``); the options one search shares are the remaining fields, declared in
:mod:`configurator.core.plan`. Flag sources as there: Megatron-LM core_v0.16.1
``megatron/training/arguments.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from configurator.core.plan_values import RECOMPUTE, recompute_module_list


#: A Megatron-Bridge override value meaning "leave the recipe's own value" (a rule returning
#: None writes ``null``, which Megatron-Bridge's config takes as "unset").
BRIDGE_KEEP = type("BridgeKeep", (), {"__repr__": lambda self: "BRIDGE_KEEP"})()


def schema_field(default: Any, **meta: Any):
    """A field of the plan schema: its default and its
    :class:`~configurator.core.plan.PlanField` metadata (keyword arguments)."""
    return dataclasses.field(default=default, metadata={"plan": meta})


def _full(p: "PlanLayout") -> bool:
    return p.recompute == "full"


@dataclass(frozen=True, kw_only=True)
class PlanLayout:
    """The parallel layout of a Megatron-LM training configuration (the fields
    :class:`~configurator.core.plan.ParallelPlan` starts with).

    ``vp`` is virtual stages per pipeline rank (1 = no interleaving). Recompute ``full``
    means ``--recompute-granularity full --recompute-method uniform --recompute-num-layers
    1``. Sizes are counts; ``global_batch_size`` and ``micro_batch_size`` are sequences.
    """

    tp: int = schema_field(1, bridge=(("model.tensor_model_parallel_size", lambda m, p: p.tp),),
                           megatron_name="tensor_model_parallel_size", cli_flag="--tp",
                           column="tp", help="tensor_model_parallel_size",
                           flag_group="parallelism",
                           flags=(("--tensor-model-parallel-size", lambda m, p: p.tp),))
    pp: int = schema_field(1, bridge=(("model.pipeline_model_parallel_size", lambda m, p: p.pp),),
                           megatron_name="pipeline_model_parallel_size", cli_flag="--pp",
                           column="pp", help="pipeline_model_parallel_size",
                           flag_group="parallelism",
                           flags=(("--pipeline-model-parallel-size", lambda m, p: p.pp),))
    dp: int = schema_field(1, megatron_name="data_parallel_size", column="dp",
                           help="data-parallel size, derived: GPUs / (tp*pp*cp)")
    cp: int = schema_field(1, bridge=(("model.context_parallel_size", lambda m, p: p.cp),),
                           megatron_name="context_parallel_size", cli_flag="--cp", column="cp",
                           help="context_parallel_size (default 1)", flag_group="parallelism",
                           flags=(("--context-parallel-size", lambda m, p: p.cp),))
    vp: int = schema_field(1, bridge=(("model.virtual_pipeline_model_parallel_size",
                                    lambda m, p: p.vp if p.vp > 1 else None),),
                           megatron_name="virtual_pipeline_model_parallel_size",
                           cli_flag="--vp", column="vp",
                           help="virtual stages per pipeline rank (1 = no interleaving)",
                           flag_group="parallelism",
                           flags=(("--num-layers-per-virtual-pipeline-stage",
                                   lambda m, p: m.num_layers // p.pp // p.vp
                                   if p.vp > 1 and not p.custom_layer_split else None),
                                  ("--num-virtual-stages-per-pipeline-rank",
                                   lambda m, p: p.vp if p.vp > 1 and p.custom_layer_split
                                   and not p.pipeline_model_parallel_layout else None)))
    micro_batch_size: int = schema_field(1, bridge=(("train.micro_batch_size",
                                                  lambda m, p: p.micro_batch_size),),
                                         megatron_name="micro_batch_size", cli_flag="--mbs",
                                         alias="mbs", column="mbs", help="micro_batch_size",
                                         flag_group="batch",
                                         flags=(("--micro-batch-size",
                                                 lambda m, p: p.micro_batch_size),))
    global_batch_size: int = schema_field(1, bridge=(("train.global_batch_size",
                                                   lambda m, p: p.global_batch_size),),
                                          megatron_name="global_batch_size", alias="gbs",
                                          per_candidate=False,
                                          help="global batch size (sequences)", flag_group="batch",
                                          flags=(("--global-batch-size",
                                                  lambda m, p: p.global_batch_size),))
    ep: int = schema_field(1, bridge=(("model.expert_model_parallel_size", lambda m, p: p.ep),),
                           megatron_name="expert_model_parallel_size", cli_flag="--ep",
                           column="ep", help="expert_model_parallel_size (MoE models; default 1)",
                           flag_group="parallelism",
                           flags=(("--expert-model-parallel-size",
                                   lambda m, p: p.ep if m.is_moe else None),))
    etp: int = schema_field(1, # None: megatron-core takes tp (a dense model has no experts)
                            bridge=(("model.expert_tensor_parallel_size",
                                     lambda m, p: p.etp if m.is_moe else None),),
                            megatron_name="expert_tensor_parallel_size", cli_flag="--etp",
                            column="etp",
                            help="expert_tensor_parallel_size (MoE models; default 1)",
                            flag_group="parallelism",
                            flags=(("--expert-tensor-parallel-size",
                                    lambda m, p: p.etp if m.is_moe else None),))
    decoder_first_pipeline_num_layers: int = schema_field(
        0, bridge=(("model.num_layers_in_first_pipeline_stage",
                    lambda m, p: p.decoder_first_pipeline_num_layers or None),),
        megatron_name="decoder_first_pipeline_num_layers",
        cli_flag="--decoder-first-pipeline-num-layers", alias="first", column="first",
        help="layers on the first pipeline rank (0 = even split)", flag_group="parallelism",
        flags=(("--decoder-first-pipeline-num-layers",
                lambda m, p: p.decoder_first_pipeline_num_layers or None),))
    decoder_last_pipeline_num_layers: int = schema_field(
        0, bridge=(("model.num_layers_in_last_pipeline_stage",
                    lambda m, p: p.decoder_last_pipeline_num_layers or None),),
        megatron_name="decoder_last_pipeline_num_layers",
        cli_flag="--decoder-last-pipeline-num-layers", alias="last", column="last",
        help="layers on the last pipeline rank (0 = even split)", flag_group="parallelism",
        flags=(("--decoder-last-pipeline-num-layers",
                lambda m, p: p.decoder_last_pipeline_num_layers or None),))
    account_for_embedding_in_pipeline_split: bool = schema_field(
        False, bridge=(("model.account_for_embedding_in_pipeline_split",
                        lambda m, p: p.account_for_embedding_in_pipeline_split),),
        megatron_name="account_for_embedding_in_pipeline_split",
        cli_flag="--account-for-embedding-in-pipeline-split", alias="acct_emb", column="+emb",
        help="count the embedding as one layer when splitting the pipeline",
        flag_group="parallelism",
        flags=(("--account-for-embedding-in-pipeline-split",
                lambda m, p: p.account_for_embedding_in_pipeline_split or None),))
    account_for_loss_in_pipeline_split: bool = schema_field(
        False, bridge=(("model.account_for_loss_in_pipeline_split",
                        lambda m, p: p.account_for_loss_in_pipeline_split),),
        megatron_name="account_for_loss_in_pipeline_split",
        cli_flag="--account-for-loss-in-pipeline-split", alias="acct_loss", column="+loss",
        help="count the loss (output layer) as one layer when splitting the pipeline",
        flag_group="parallelism",
        flags=(("--account-for-loss-in-pipeline-split",
                lambda m, p: p.account_for_loss_in_pipeline_split or None),))
    pipeline_model_parallel_layout: str = schema_field(
        "", bridge=(("model.pipeline_model_parallel_layout",
             lambda m, p: p.pipeline_model_parallel_layout or None),),
        megatron_name="pipeline_model_parallel_layout",
        cli_flag="--pipeline-model-parallel-layout", alias="layout", column="layout",
        help="decoder layers per virtual pipeline stage, e.g. 'Et*4|(t*4|)*14tmL': stages "
             "split by '|', E embedding, t decoder layer, m MTP layer, L loss, '(...)*n' and "
             "'x*n' repeat; vp = stages / pp (empty: the split the other fields give)",
        flag_group="parallelism",
        flags=(("--pipeline-model-parallel-layout",
                lambda m, p: p.pipeline_model_parallel_layout or None),))
    recompute: str = schema_field("none", bridge=(("model.recompute_granularity",
                                           lambda m, p: None if p.recompute == "none"
                                           else p.recompute),
                                          ("model.recompute_method",
                                           lambda m, p: "uniform" if _full(p) else None),
                                          ("model.recompute_num_layers",
                                           lambda m, p: 1 if _full(p) else None)),
                                  megatron_name="recompute_granularity",
                                  cli_flag="--recompute", column="recompute", choices=RECOMPUTE,
                                  help="activation recompute: none, selective (core attention) or "
                                       "full", flag_group="recompute",
                                  flags=(("--recompute-granularity",
                                          lambda m, p: p.recompute if p.recompute != "none"
                                          else None),
                                         ("--recompute-method",
                                          lambda m, p: "uniform" if _full(p) else None),
                                         ("--recompute-num-layers",
                                          lambda m, p: 1 if _full(p) else None)))
    recompute_modules: str = schema_field(
        "core_attn", bridge=(("model.recompute_modules",
                      lambda m, p: list(recompute_module_list(p.recompute_modules))
                      if p.recompute == "selective" else None),),
        megatron_name="recompute_modules", cli_flag="--recompute-modules",
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
    sequence_parallel: bool = schema_field(False, bridge=(("model.sequence_parallel",
                                                    lambda m, p: p.sequence_parallel
                                                    and p.tp > 1),),
                                           megatron_name="sequence_parallel",
                                           cli_flag="--sequence-parallel", column="sp",
                                           help="sequence parallelism (default: on when tp > 1)",
                                           flag_group="parallelism",
                                           flags=(("--sequence-parallel",
                                                   lambda m, p: p.sequence_parallel and p.tp > 1
                                                   or None),))
    distributed_optimizer: bool = schema_field(
        False, bridge=(("ddp.use_distributed_optimizer", lambda m, p: p.distributed_optimizer),
                ("optimizer.use_distributed_optimizer",
                 lambda m, p: p.distributed_optimizer)),
        megatron_name="use_distributed_optimizer", cli_flag="--distributed-optimizer",
        column="dist-opt",
        help="shard optimizer state over data parallel (default: on when dp*cp > 1)",
        flag_group="parallelism",
        flags=(("--use-distributed-optimizer", lambda m, p: p.distributed_optimizer or None),))

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
