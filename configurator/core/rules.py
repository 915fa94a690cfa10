"""Megatron-LM's validation rules for a plan: one implementation, scalar and vectorised.

Each :class:`Rule` is a predicate over plan fields that broadcasts over numpy arrays, so the
same code checks one plan (:func:`check_plan`, used by ``estimate``, ``launch`` and the
launchers) and filters millions of candidates (:func:`rules_mask`, used level by level by
the search's enumerator as soon as the fields a rule reads are known).

Sources: Megatron-LM core_v0.16.1 ``megatron/training/arguments.py`` (``validate_args``),
``megatron/core/model_parallel_config.py``, ``megatron/core/transformer/transformer_config.py``
(``__post_init__``) and ``megatron/core/parallel_state.py``; shared REFERENCE §1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.layers import (LayoutError, layout_code, layout_problem, layout_text,
                                      parse_layout, split_ok)
from configurator.core.model import ModelSpec
from configurator.core.plan import PLAN_FIELD, PLAN_FIELDS, ParallelPlan, check_field
from configurator.core.plan_terms import param_gather_overlap
from configurator.core.plan_values import (CUDA_GRAPH_SCOPES, OFFLOAD_MODULES,
                                           SCORE_STORING_BACKENDS, recompute_module_list)

Fields = Mapping[str, Any]   # plan field name -> scalar or numpy array


@dataclass(frozen=True)
class Rule:
    """``ok(model, fields, world_size)`` broadcasts to a boolean (array); ``error`` builds the
    one-line :class:`InputError` for a scalar plan that breaks it."""

    name: str
    needs: frozenset[str]
    ok: Callable[[ModelSpec, Fields, int], Any]
    error: Callable[[ModelSpec, Fields, int], InputError]
    #: a limit of core_v0.16.1 that later Megatron-Core lifts: it holds for the plans the tool
    #: launches, not for runs measured elsewhere (:func:`check_plan` ``measured``)
    launch_only: bool = False


def _not(x):
    return np.logical_not(x)


def _mp(f: Fields):
    return f["tp"] * f["pp"] * f["cp"]


def _microbatches(f: Fields):
    return f["global_batch_size"] // (f["micro_batch_size"] * f["dp"])


def _rule(name: str, needs: Iterable[str], ok, error, launch_only: bool = False) -> Rule:
    return Rule(name, frozenset(needs), ok, error, launch_only)


#: The plan fields that decide which layers each pipeline rank builds.
SPLIT_FIELDS = ("pp", "vp", "decoder_first_pipeline_num_layers",
                "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout")


def _field_split(f: Fields):
    """Whether an uneven or embedding/loss-aware split is asked for (the fields a pipeline
    layout may not combine with)."""
    return ((np.asarray(f["decoder_first_pipeline_num_layers"]) > 0)
            | (np.asarray(f["decoder_last_pipeline_num_layers"]) > 0)
            | np.asarray(f["account_for_embedding_in_pipeline_split"], dtype=bool)
            | np.asarray(f["account_for_loss_in_pipeline_split"], dtype=bool))


def _layout_codes(f: Fields):
    """The plans' pipeline layouts as :func:`~configurator.core.layers.layout_code` codes
    (a plan's text, or the search's column of codes)."""
    x = f["pipeline_model_parallel_layout"]
    return layout_code(x) if isinstance(x, str) else np.asarray(x, dtype=np.int64)


def _laid_out(f: Fields):
    """Whether a pipeline layout is given (per plan)."""
    return _layout_codes(f) != 0


def _custom_split(f: Fields):
    return _field_split(f) | _laid_out(f)


def _layout_problem(m: ModelSpec, layout: str, field_split: bool, pp, vp) -> str | None:
    if field_split:
        return ("does not combine with decoder_first/last_pipeline_num_layers or accounting "
                "for the embedding/loss (Megatron TransformerConfig)")
    return layout_problem(layout, m.num_layers, m.mtp_num_layers or 0, int(pp), int(vp))


def _split_ok(m: ModelSpec, f: Fields):
    fields_ok = split_ok(m.num_layers, pp=f["pp"], vp=f["vp"],
                         first=f["decoder_first_pipeline_num_layers"],
                         last=f["decoder_last_pipeline_num_layers"],
                         account_embedding=f["account_for_embedding_in_pipeline_split"],
                         account_loss=f["account_for_loss_in_pipeline_split"])
    laid = _laid_out(f)
    if not np.any(laid):
        return fields_ok
    codes, pp, vp, fsplit, laid = np.broadcast_arrays(
        _layout_codes(f), np.asarray(f["pp"]), np.asarray(f["vp"]), _field_split(f), laid)
    ok = np.array(np.broadcast_to(fields_ok, laid.shape), dtype=bool).reshape(-1)
    idx = np.flatnonzero(laid)
    # a handful of distinct (layout, pp, vp) over many plans: each checked once
    rows = np.stack([codes.reshape(-1)[idx], pp.reshape(-1)[idx], vp.reshape(-1)[idx],
                     fsplit.reshape(-1)[idx]], axis=1).astype(np.int64)
    uniq, inverse = np.unique(rows, axis=0, return_inverse=True)
    good = np.array([_layout_problem(m, layout_text(c), bool(fs), a, b) is None
                     for c, a, b, fs in uniq], dtype=bool)
    ok[idx] = good[inverse.reshape(-1)]
    return ok.reshape(laid.shape) if laid.ndim else bool(ok[0])


def _split_error(m: ModelSpec, f: Fields) -> InputError:
    first, last = f["decoder_first_pipeline_num_layers"], f["decoder_last_pipeline_num_layers"]
    pp, vp, L = f["pp"], f["vp"], m.num_layers
    if f["pipeline_model_parallel_layout"]:
        return InputError("pipeline_model_parallel_layout", f["pipeline_model_parallel_layout"],
                          _layout_problem(m, f["pipeline_model_parallel_layout"],
                                          bool(_field_split(f)), pp, vp)
                          or "not a layout Megatron builds")
    if not bool(_custom_split(f)):
        return InputError("vp", vp, f"must divide layers per pipeline rank ({L // pp})")
    if first or last:
        if f["account_for_embedding_in_pipeline_split"] or \
                f["account_for_loss_in_pipeline_split"]:
            return InputError("decoder_first_pipeline_num_layers", first,
                              "an uneven split does not combine with accounting for the "
                              "embedding or loss")
        mid_ranks = pp - (first > 0) - (last > 0)
        return InputError("decoder_first_pipeline_num_layers", first,
                          f"with decoder_last_pipeline_num_layers={last}, pp={pp} and vp={vp}:"
                          f" first and last must be multiples of vp, and the other "
                          f"{L - first - last} layers must split evenly (at least one each) "
                          f"over {mid_ranks} ranks x {vp} virtual stages")
    extra = int(f["account_for_embedding_in_pipeline_split"]) + int(
        f["account_for_loss_in_pipeline_split"])
    return InputError("pp", pp, f"num_layers + {extra} accounted ({L + extra}) must split "
                                f"evenly over pp*vp = {pp * vp} virtual stages")


#: Checked in this order; the first broken rule names the error.
RULES: tuple[Rule, ...] = (
    _rule("model parallel divides the world", ("tp", "pp", "cp"),
          lambda m, f, w: w % _mp(f) == 0,
          lambda m, f, w: InputError(
              "tp*pp*cp", _mp(f), f"tp({f['tp']}) * pp({f['pp']}) * cp({f['cp']}) = "
              f"{_mp(f)} does not divide {w} GPUs")),
    _rule("data parallel fills the world", ("tp", "pp", "cp", "dp"),
          lambda m, f, w: _mp(f) * f["dp"] == w,
          lambda m, f, w: InputError("dp", f["dp"],
                                     f"must be world_size / (tp*pp*cp) = {w // _mp(f)}")),
    _rule("tp divides the attention heads", ("tp",),
          lambda m, f, w: m.num_attention_heads % f["tp"] == 0,
          lambda m, f, w: InputError("tp", f["tp"], f"must divide num_attention_heads "
                                                    f"({m.num_attention_heads})")),
    _rule("query groups and tp divide one another", ("tp",),
          lambda m, f, w: np.logical_or(m.num_query_groups % f["tp"] == 0,
                                        f["tp"] % m.num_query_groups == 0),
          lambda m, f, w: InputError("tp", f["tp"], f"num_query_groups ({m.num_query_groups})"
                                                    f" must be a multiple or divisor of tp")),
    _rule("interleaving needs pp > 1", ("vp", "pp"),
          lambda m, f, w: np.logical_or(f["vp"] == 1, f["pp"] > 1),
          lambda m, f, w: InputError("vp", f["vp"], "interleaved schedule needs pp > 1")),
    _rule("pp divides the layers", SPLIT_FIELDS,
          lambda m, f, w: np.logical_or(_custom_split(f), m.num_layers % f["pp"] == 0),
          lambda m, f, w: InputError("pp", f["pp"], f"must divide num_layers "
                                                    f"({m.num_layers}); or give "
                                                    f"--decoder-first/last-pipeline-num-layers, "
                                                    f"account for the embedding/loss or give "
                                                    f"--pipeline-model-parallel-layout")),
    _rule("the layer split is one Megatron builds", SPLIT_FIELDS,
          lambda m, f, w: _split_ok(m, f),
          lambda m, f, w: _split_error(m, f)),
    _rule("ep needs experts", ("ep", "etp"),
          lambda m, f, w: np.logical_or(m.is_moe, (f["ep"] == 1) & (f["etp"] == 1)),
          lambda m, f, w: InputError("ep" if f["ep"] != 1 else "etp",
                                     f["ep"] if f["ep"] != 1 else f["etp"],
                                     "expert parallelism needs a model with num_experts")),
    _rule("ep divides the experts", ("ep",),
          lambda m, f, w: (m.num_experts or 1) % f["ep"] == 0,
          lambda m, f, w: InputError("ep", f["ep"], f"must divide num_experts "
                                                    f"({m.num_experts})")),
    _rule("the expert grid etp*ep*pp divides the world", ("ep", "etp", "pp"),
          lambda m, f, w: w % (f["ep"] * f["etp"] * f["pp"]) == 0,
          lambda m, f, w: InputError(
              "ep", f["ep"], f"etp({f['etp']}) * ep({f['ep']}) * pp({f['pp']}) = "
              f"{f['ep'] * f['etp'] * f['pp']} does not divide {w} GPUs (expert-data-parallel "
              f"size must be whole)")),
    _rule("expert tp divides the expert FFN", ("etp",),
          lambda m, f, w: (m.moe_ffn_hidden_size or 1) % f["etp"] == 0,
          lambda m, f, w: InputError("etp", f["etp"], f"must divide moe_ffn_hidden_size "
                                                      f"({m.moe_ffn_hidden_size})")),
    _rule("MoE with tp needs sequence parallelism", ("tp", "sequence_parallel"),
          lambda m, f, w: np.logical_or(np.logical_or(not m.is_moe, f["tp"] == 1),
                                        f["sequence_parallel"]),
          lambda m, f, w: InputError("sequence_parallel", False,
                                     "an MoE model with tp > 1 needs sequence parallelism "
                                     "(megatron/core/transformer/moe/moe_layer.py)")),
    _rule("biased MoE experts need etp = 1", ("etp",),
          lambda m, f, w: np.logical_or(not (m.is_moe and m.add_bias_linear), f["etp"] == 1),
          lambda m, f, w: InputError("etp", f["etp"], "experts with biases (add_bias_linear) "
                                                      "need expert_tensor_parallel_size 1 "
                                                      "(TransformerConfig)")),
    _rule("cp splits the sequence in 2*cp chunks", ("cp",),
          lambda m, f, w: np.logical_or(f["cp"] == 1, m.seq_length % (2 * f["cp"]) == 0),
          lambda m, f, w: InputError("cp", f["cp"], f"seq_length ({m.seq_length}) must be "
                                                    f"divisible by 2*cp ({2 * f['cp']})")),
    _rule("cp needs a flash/fused attention backend", ("cp", "attention_backend"),
          lambda m, f, w: np.logical_or(f["cp"] == 1,
                                        f["attention_backend"] not in SCORE_STORING_BACKENDS),
          lambda m, f, w: InputError("cp", f["cp"], f"context parallelism needs a flash/fused "
                                                    f"attention backend (Transformer Engine), "
                                                    f"not {f['attention_backend']!r}")),
    _rule("cp a2a needs heads per tp rank divisible by cp", ("cp", "tp", "cp_comm_type"),
          lambda m, f, w: np.logical_or(
              np.logical_or(f["cp"] == 1, f["cp_comm_type"] != "a2a"),
              np.logical_and((m.num_attention_heads // f["tp"]) % f["cp"] == 0,
                             (m.attention_kv_heads // f["tp"]) % f["cp"] == 0)),
          lambda m, f, w: InputError(
              "cp", f["cp"], f"cp_comm_type a2a scatters the heads over cp: the "
                             f"{m.num_attention_heads // f['tp']} query and "
                             f"{m.attention_kv_heads // f['tp']} key/value heads per tp rank (tp "
                             f"{f['tp']}) must be divisible by cp (Transformer Engine "
                             f"context_parallel.py, AttnFuncWithCPAndQKVOA2A)")),
    _rule("cp with sliding-window attention needs a2a or all_gather", ("cp", "cp_comm_type"),
          lambda m, f, w: np.logical_or(np.logical_or(f["cp"] == 1, not m.window_size),
                                        f["cp_comm_type"] != "p2p"),
          lambda m, f, w: InputError(
              "cp_comm_type", f["cp_comm_type"], f"context parallelism (cp {f['cp']}) with "
                                                 f"sliding-window attention needs a2a or "
                                                 f"all_gather (Transformer Engine "
                                                 f"attn_forward_func_with_cp)")),
    _rule("global batch divisible by mbs*dp", ("global_batch_size", "micro_batch_size", "dp"),
          lambda m, f, w: f["global_batch_size"] % (f["micro_batch_size"] * f["dp"]) == 0,
          lambda m, f, w: InputError(
              "global_batch_size", f["global_batch_size"],
              f"must be divisible by micro_batch_size ({f['micro_batch_size']}) * dp "
              f"({f['dp']}) = {f['micro_batch_size'] * f['dp']}")),
    _rule("interleaving needs microbatches divisible by pp",
          ("vp", "pp", "global_batch_size", "micro_batch_size", "dp"),
          lambda m, f, w: np.logical_or(f["vp"] == 1, _microbatches(f) % f["pp"] == 0),
          lambda m, f, w: InputError(
              "global_batch_size", f["global_batch_size"],
              f"interleaved schedule needs num_microbatches ({_microbatches(f)}) divisible "
              f"by pp ({f['pp']})")),
    _rule("recompute_modules are Megatron's priced modules", ("recompute_modules",),
          lambda m, f, w: _modules_problem(m, f) is None,
          lambda m, f, w: _modules_problem(m, f)),
    _rule("layernorm and moe_act recompute do not run with FP8 delayed scaling",
          ("recompute_modules", "precision", "fp8_recipe"),
          lambda m, f, w: not (f["precision"] == "fp8" and f["fp8_recipe"] == "delayed"
                               and _modules_of(f) & {"layernorm", "moe_act"}),
          lambda m, f, w: InputError(
              "recompute_modules", f["recompute_modules"], "layernorm and moe_act recompute "
                                                           "do not support FP8 delayed scaling "
                                                           "(precision fp8; TransformerConfig): "
                                                           "use fp8_recipe tensorwise, mxfp8 or "
                                                           "bf16")),
    _rule("the all-to-all overlap needs experts over ep > 1",
          ("overlap_moe_expert_parallel_comm", "ep"),
          lambda m, f, w: _not(f["overlap_moe_expert_parallel_comm"]) | (
              bool(m.is_moe) & (np.asarray(f["ep"]) > 1)),
          lambda m, f, w: InputError("overlap_moe_expert_parallel_comm", True,
                                     "needs an MoE model with expert_model_parallel_size > 1 "
                                     "(TransformerConfig)")),
    _rule("the all-to-all overlap with pp > 1 needs interleaving",
          ("overlap_moe_expert_parallel_comm", "pp", "vp"),
          lambda m, f, w: _not(f["overlap_moe_expert_parallel_comm"]) | (
              np.asarray(f["pp"]) == 1) | (np.asarray(f["vp"]) > 1),
          lambda m, f, w: InputError("vp", f["vp"], "overlap_moe_expert_parallel_comm with "
                                                    "pp > 1 runs in the interleaved schedule "
                                                    "only: vp > 1 (TransformerConfig)")),
    _rule("the all-to-all overlap does not run with full recompute",
          ("overlap_moe_expert_parallel_comm", "recompute"),
          lambda m, f, w: _not(np.asarray(f["overlap_moe_expert_parallel_comm"])
                               & (_recompute_name(f) == "full")),
          lambda m, f, w: InputError("recompute", "full", "overlap_moe_expert_parallel_comm "
                                                          "allows no full recompute "
                                                          "(TransformerConfig)")),
    _rule("the all-to-all overlap takes at most one MTP layer, with pp > 1",
          ("overlap_moe_expert_parallel_comm", "pp"),
          lambda m, f, w: _not(f["overlap_moe_expert_parallel_comm"]) | (
              (m.mtp_num_layers or 0) == 0) | (
              ((m.mtp_num_layers or 0) == 1) & (np.asarray(f["pp"]) > 1)),
          lambda m, f, w: InputError("overlap_moe_expert_parallel_comm", True,
                                     f"with {m.mtp_num_layers} MTP layer(s) it needs at most "
                                     f"one, and pp > 1 (TransformerConfig)")),
    _rule("the flex dispatcher needs etp*ep > 1", ("moe_token_dispatcher_type", "ep", "etp"),
          lambda m, f, w: (f["moe_token_dispatcher_type"] != "flex") | (not m.is_moe) | (
              np.asarray(f["ep"]) * np.asarray(f["etp"]) > 1),
          lambda m, f, w: InputError("moe_token_dispatcher_type", "flex",
                                     "the flex dispatcher needs etp*ep > 1 "
                                     "(MoEFlexTokenDispatcher)")),
    _rule("padding to capacity needs a capacity factor",
          ("moe_pad_expert_input_to_capacity", "moe_expert_capacity_factor"),
          lambda m, f, w: not (f["moe_pad_expert_input_to_capacity"]
                               and not f["moe_expert_capacity_factor"] > 0),
          lambda m, f, w: InputError("moe_pad_expert_input_to_capacity", True,
                                     "needs moe_expert_capacity_factor > 0 "
                                     "(TransformerConfig)")),
    _rule("DeepEP does not pad to capacity",
          ("moe_pad_expert_input_to_capacity", "moe_token_dispatcher_type",
           "moe_flex_dispatcher_backend"),
          lambda m, f, w: not (f["moe_pad_expert_input_to_capacity"]
                               and f["moe_token_dispatcher_type"] == "flex"
                               and f["moe_flex_dispatcher_backend"] == "deepep"),
          lambda m, f, w: InputError("moe_pad_expert_input_to_capacity", True,
                                     "the flex dispatcher with DeepEP does not pad to capacity "
                                     "(TransformerConfig): use hybridep or alltoall")),
    _rule("CUDA graph scopes are Megatron's and fit the implementation",
          ("cuda_graph_impl", "cuda_graph_scope", "moe_expert_capacity_factor",
           "moe_pad_expert_input_to_capacity", "moe_token_dispatcher_type"),
          lambda m, f, w: _graph_problem(m, f) is None,
          lambda m, f, w: _graph_problem(m, f)),
    _rule("full recompute with CUDA graphs needs full_iteration",
          ("cuda_graph_impl", "cuda_graph_scope", "recompute"),
          lambda m, f, w: (f["cuda_graph_impl"] == "none") | (
              "full_iteration" in _words(f["cuda_graph_scope"])) | (
              _recompute_name(f) != "full"),
          lambda m, f, w: InputError("recompute", "full", "with CUDA graphs full recompute "
                                                          "needs cuda_graph_scope "
                                                          "full_iteration (TransformerConfig)")),
    _rule("the all-to-all overlap takes Transformer Engine graphs of attention and router",
          ("overlap_moe_expert_parallel_comm", "cuda_graph_impl", "cuda_graph_scope"),
          lambda m, f, w: _not(f["overlap_moe_expert_parallel_comm"]) | (
              f["cuda_graph_impl"] == "none") | (
              (f["cuda_graph_impl"] == "transformer_engine")
              and bool(_words(f["cuda_graph_scope"]))
              and not _words(f["cuda_graph_scope"]) & {"moe", "mlp"}),
          lambda m, f, w: InputError("cuda_graph_scope", f["cuda_graph_scope"],
                                     "with overlap_moe_expert_parallel_comm only "
                                     "transformer_engine graphs of attn, moe_router, "
                                     "moe_preprocess (TransformerConfig)"),
          # Megatron-Core after 0.16.1 graphs the whole iteration with the overlap
          # (cuda_graph_impl "full_iteration", Megatron-Bridge's 26.06 MoE recipes)
          launch_only=True),
    _rule("the optimizer-state dtypes need the precision-aware optimizer",
          ("use_precision_aware_optimizer", "main_grads_dtype", "main_params_dtype",
           "exp_avg_dtype", "exp_avg_sq_dtype"),
          lambda m, f, w: _pao_problem(f) is None,
          lambda m, f, w: _pao_problem(f)),
    _rule("the precision-aware optimizer needs the distributed optimizer",
          ("use_precision_aware_optimizer", "distributed_optimizer"),
          lambda m, f, w: _not(f["use_precision_aware_optimizer"])
          | np.asarray(f["distributed_optimizer"], dtype=bool),
          lambda m, f, w: InputError("use_precision_aware_optimizer", True,
                                     "needs the distributed optimizer (OptimizerConfig)")),
    _rule("offloaded modules are Megatron's", ("offload_modules",),
          lambda m, f, w: _offload_problem(m, f) is None,
          lambda m, f, w: _offload_problem(m, f)),
    # CPU offloading of whole layers (TransformerConfig.__post_init__, core_v0.16.1;
    # validate_args turns cpu_offloading on with cpu_offloading_num_layers > 0)
    _rule("CPU offloading covers fewer layers than the model's",
          ("cpu_offloading_num_layers",),
          lambda m, f, w: f["cpu_offloading_num_layers"] < m.num_layers,
          lambda m, f, w: InputError("cpu_offloading_num_layers",
                                     f["cpu_offloading_num_layers"],
                                     f"must be below the model's {m.num_layers} layers "
                                     f"(TransformerConfig)")),
    _rule("CPU offloading needs pp 1", ("cpu_offloading_num_layers", "pp"),
          lambda m, f, w: (f["cpu_offloading_num_layers"] == 0) | (np.asarray(f["pp"]) == 1),
          lambda m, f, w: InputError("cpu_offloading_num_layers",
                                     f["cpu_offloading_num_layers"],
                                     "needs pp 1: no pipeline parallelism with CPU offloading "
                                     "(TransformerConfig)")),
    _rule("CPU offloading does not run with recompute",
          ("cpu_offloading_num_layers", "recompute"),
          lambda m, f, w: (f["cpu_offloading_num_layers"] == 0) | (
              _recompute_name(f) == "none"),
          lambda m, f, w: InputError("cpu_offloading_num_layers",
                                     f["cpu_offloading_num_layers"],
                                     "needs recompute none: CPU offloading does not work with "
                                     "activation recomputation (TransformerConfig)")),
    _rule("CPU offloading excludes fine-grained offloading",
          ("cpu_offloading_num_layers", "offload_modules"),
          lambda m, f, w: not (f["cpu_offloading_num_layers"] and f["offload_modules"]),
          lambda m, f, w: InputError("cpu_offloading_num_layers",
                                     f["cpu_offloading_num_layers"],
                                     "excludes offload_modules: fine-grained activation "
                                     "offloading cannot run with CPU offloading "
                                     "(TransformerConfig)")),
    _rule("CPU offloading needs Transformer Engine",
          ("cpu_offloading_num_layers", "attention_backend"),
          lambda m, f, w: not (f["cpu_offloading_num_layers"]
                               and f["attention_backend"] == "local"),
          lambda m, f, w: InputError("cpu_offloading_num_layers",
                                     f["cpu_offloading_num_layers"],
                                     "needs Transformer Engine's layers (its CPU offload "
                                     "context; not attention_backend local)")),
    _rule("the fused grouped MLP needs experts", ("moe_fused_grouped_mlp",),
          lambda m, f, w: not f["moe_fused_grouped_mlp"] or bool(m.is_moe),
          lambda m, f, w: InputError("moe_fused_grouped_mlp", True,
                                     f"fuses the routed experts' MLP: {m.name} has none")),
    _rule("FP8 attention needs fp8 with delayed or tensorwise scaling",
          ("fp8_dot_product_attention", "precision", "fp8_recipe", "attention_backend"),
          lambda m, f, w: not f["fp8_dot_product_attention"] or (
              f["precision"] == "fp8" and f["fp8_recipe"] in ("delayed", "tensorwise")
              and f["attention_backend"] in ("auto", "fused")),
          lambda m, f, w: InputError("fp8_dot_product_attention", True,
                                     "needs precision fp8 with fp8_recipe delayed or "
                                     "tensorwise and cuDNN fused attention (attention_backend "
                                     "auto or fused; TransformerConfig, Transformer Engine)")),
    _rule("sequence parallelism needs tp > 1", ("sequence_parallel", "tp"),
          lambda m, f, w: np.logical_or(_not(f["sequence_parallel"]), f["tp"] > 1),
          lambda m, f, w: InputError("sequence_parallel", True, "needs tp > 1")),
    _rule("Megatron FSDP needs the distributed optimizer",
          ("megatron_fsdp", "distributed_optimizer"),
          lambda m, f, w: np.logical_or(_not(f["megatron_fsdp"]), f["distributed_optimizer"]),
          lambda m, f, w: InputError("megatron_fsdp", True, "needs the distributed optimizer "
                                                            "(--use-distributed-optimizer, "
                                                            "megatron-fsdp-user-guide.md)")),
    _rule("parameter-gather overlap needs grad-reduce overlap",
          ("overlap_param_gather", "distributed_optimizer", "overlap_grad_reduce"),
          lambda m, f, w: _not(np.logical_and(
              np.logical_and(f["overlap_param_gather"], f["distributed_optimizer"]),
              _not(f["overlap_grad_reduce"]))),
          lambda m, f, w: InputError("overlap_param_gather", True, "needs overlap_grad_reduce")),
)


def _words(text) -> set[str]:
    return set(str(text).replace(",", " ").split())


def _recompute_name(f: Fields):
    """The plans' recompute as names (a plan's text, or the search's codes)."""
    rc = f["recompute"]
    if isinstance(rc, str):
        return np.asarray(rc)
    return np.asarray(PLAN_FIELD["recompute"].choices)[np.asarray(rc, dtype=np.int64)]


def _graph_problem(model: ModelSpec, f: Fields) -> InputError | None:
    """Why ``cuda_graph_impl``/``cuda_graph_scope`` cannot run (core_v0.16.1
    ``TransformerConfig.__post_init__`` and ``--cuda-graph-scope``'s help), or None."""
    impl, text = f["cuda_graph_impl"], f["cuda_graph_scope"]
    scopes = _words(text)
    def err(rule):
        return InputError("cuda_graph_scope", text, rule)
    unknown = scopes - set(CUDA_GRAPH_SCOPES)
    if unknown:
        return err(f"not a Megatron CUDA graph scope: {', '.join(sorted(unknown))} (of "
                   + ", ".join(CUDA_GRAPH_SCOPES) + ")")
    if impl == "none":
        return err("needs cuda_graph_impl") if scopes else None
    if ("full_iteration" in scopes) != (impl == "local"):
        return err("full_iteration goes with cuda_graph_impl local, the other scopes (or "
                   "whole layers) with transformer_engine")
    if scopes & {"moe", "moe_router", "moe_preprocess"} and not model.is_moe:
        return err(f"the moe scopes need experts: {model.name} has none")
    if "mlp" in scopes and model.is_moe and all(model.moe_layer_pattern):
        return err("the mlp scope graphs dense layers: every layer of the model is MoE")
    if {"moe", "moe_router"} <= scopes:
        return err("moe and moe_router exclude one another")
    if "moe_preprocess" in scopes and "moe_router" not in scopes:
        return err("moe_preprocess needs moe_router")
    drop_pad = (f["moe_expert_capacity_factor"] > 0) and f["moe_pad_expert_input_to_capacity"]
    if "moe" in scopes and not drop_pad:
        return err("the moe scope needs drop-and-pad (moe_expert_capacity_factor and "
                   "moe_pad_expert_input_to_capacity)")
    if ("moe_preprocess" in scopes and f["moe_token_dispatcher_type"] == "alltoall"
            and f["moe_expert_capacity_factor"] > 0 and not drop_pad):
        return err("moe_preprocess with the alltoall dispatcher and a capacity factor needs "
                   "padding to capacity")
    return None


def _pao_problem(f: Fields) -> InputError | None:
    """Why the optimizer-state dtypes cannot run (megatron/core/optimizer/optimizer_config.py
    ``__post_init__``: without the precision-aware optimizer every dtype is fp32), or None."""
    dtypes = {k: f[k] for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                                "exp_avg_sq_dtype")}
    if not f["use_precision_aware_optimizer"]:
        for k, val in dtypes.items():
            if val != "fp32":
                return InputError(k, val, "a dtype other than fp32 needs "
                                          "use_precision_aware_optimizer")
    return None


def _offload_problem(model: ModelSpec, f: Fields) -> InputError | None:
    """Why ``offload_modules`` cannot run (``TransformerConfig.__post_init__``), or None."""
    text = f["offload_modules"]
    modules = _words(text)
    unknown = modules - set(OFFLOAD_MODULES)
    if unknown:
        return InputError("offload_modules", text, "not a Megatron offload module: "
                          + ", ".join(sorted(unknown)) + " (of " + ", ".join(OFFLOAD_MODULES)
                          + ")")
    if "attn_proj" in modules and "core_attn" not in modules:
        return InputError("offload_modules", text, "attn_proj needs core_attn")
    if modules & {"expert_fc1", "moe_act"} and not model.is_moe:
        return InputError("offload_modules", text, f"expert_fc1 and moe_act need experts: "
                                                   f"{model.name} has none")
    return None


def _modules_of(f: Fields) -> set[str]:
    try:
        return set(recompute_module_list(f["recompute_modules"]))
    except InputError:
        return set()


def check_search_options(model: ModelSpec, options: Mapping[str, Any]) -> None:
    """Raise the :class:`InputError` of the first rule that only the search-wide fields
    (:data:`configurator.core.plan.SEARCH_OPTIONS`) decide and ``options`` break, before any
    plan is enumerated (else every plan would be illegal for one reason no plan names)."""
    shared = {f.name for f in PLAN_FIELDS if not f.per_candidate}
    for r in RULES:
        if r.needs <= shared and r.needs <= set(options):
            if not bool(r.ok(model, options, 0)):
                raise r.error(model, options, 0)


def _modules_problem(model: ModelSpec, f: Fields) -> InputError | None:
    """Why ``recompute_modules`` cannot run (Megatron's choices, TransformerConfig's checks),
    or None."""
    try:
        modules = recompute_module_list(f["recompute_modules"])
    except InputError as err:
        return err
    for name, needs, what in (("moe_act", model.is_moe, "experts"),
                              ("moe", model.is_moe, "experts"),
                              ("shared_experts", bool(model.moe_shared_expert_intermediate_size),
                               "a shared expert"),
                              ("mla_up_proj", bool(model.multi_latent_attention),
                               "multi-latent attention")):
        if name in modules and not needs:
            return InputError("recompute_modules", f["recompute_modules"],
                              f"{name} needs {what}: {model.name} has none "
                              f"(TransformerConfig)")
    return None


def rules_for(known: Iterable[str], already: Iterable[str] = ()) -> tuple[Rule, ...]:
    """Rules whose fields are all in ``known`` and not all in ``already`` (those were applied
    at an earlier level of an enumeration)."""
    known, already = set(known), set(already)
    return tuple(r for r in RULES if r.needs <= known and not r.needs <= already)


def rules_mask(model: ModelSpec, fields: Fields, world_size: int,
               rules: Iterable[Rule] = RULES):
    """Boolean (array) of plans that satisfy every rule in ``rules`` (fields broadcast)."""
    ok = True
    for r in rules:
        res = r.ok(model, fields, world_size)
        if np.ndim(res) == 0:
            if not res:
                return False   # scalar fields: the first broken rule decides
        else:
            ok = np.logical_and(ok, res)
    return ok


def check_plan(model: ModelSpec, plan: ParallelPlan, world_size: int, *,
               measured: bool = False, only: Iterable[str] | None = None) -> None:
    """Raise :class:`InputError` naming the first field or Megatron rule ``plan`` breaks
    (types and choices first, then :data:`RULES` in order). ``measured``: the plan of a run
    measured elsewhere, which ran under whatever Megatron-Core it ran on: the limits of
    core_v0.16.1 that later versions lift (``Rule.launch_only``) are not checked. ``only``:
    the names of the rules to check (:attr:`Rule.name`), else all."""
    for f in PLAN_FIELDS:
        check_field(f, getattr(plan, f.name))
    values = {f.name: getattr(plan, f.name) for f in PLAN_FIELDS}
    names = None if only is None else set(only)
    if names is not None and names - {r.name for r in RULES}:
        raise ValueError(f"no such rule: {sorted(names - {r.name for r in RULES})}")
    for r in RULES:
        if (measured and r.launch_only) or (names is not None and r.name not in names):
            continue
        if not bool(r.ok(model, values, world_size)):
            raise r.error(model, values, world_size)


def plan_for_world(fields: Mapping[str, Any], world_size: int) -> ParallelPlan:
    """A plan from user-given fields on ``world_size`` GPUs: ``dp`` derived, and the defaults
    of a field given as ``None`` (or absent): sequence parallelism on when tp > 1, the
    distributed optimizer when dp·cp > 1, gradient-reduce overlap on, parameter-gather
    overlap with it and the distributed optimizer (a given parameter-gather overlap holds
    only where those two do: Megatron's flag needs both). Integers are checked first, the error
    naming the CLI option (``mbs``, ``gbs``); raises the first rule's error if tp·pp·cp
    does not divide ``world_size``. Megatron's other rules are not checked here
    (:func:`check_plan`)."""
    f = dict(fields)
    for spec in PLAN_FIELDS:
        if spec.type is int and spec.name != "dp" and f.get(spec.name) is not None:
            v.int_in_range((spec.cli_flag or spec.short).lstrip("-").replace("-", "_"),
                           f[spec.name], key=spec.name)
    for name in ("tp", "pp", "cp"):   # the model-parallel sizes first: dp derives from them
        if f.get(name) is None:
            f[name] = PLAN_FIELD[name].default
    divides = RULES[0]
    if not divides.ok(None, f, world_size):
        raise divides.error(None, f, world_size)
    f["dp"] = world_size // (f["tp"] * f["pp"] * f["cp"])
    layout = f.get("pipeline_model_parallel_layout")
    if layout and f.get("vp") is None:   # vp is the layout's stages over pp
        try:
            stages = len(parse_layout(layout))
        except LayoutError:
            stages = 0    # the split rule names the problem
        if stages and stages % f["pp"] == 0:
            f["vp"] = stages // f["pp"]
    modules = f.get("recompute_modules")
    if modules not in (None, PLAN_FIELD["recompute_modules"].default) and (
            f.get("recompute") != "selective"):
        raise InputError("recompute_modules", modules, "applies with recompute selective only "
                                                       "(Megatron --recompute-granularity "
                                                       "selective)")
    if f.get("sequence_parallel") is None:
        f["sequence_parallel"] = f["tp"] > 1
    if f.get("distributed_optimizer") is None:
        f["distributed_optimizer"] = f["dp"] * f["cp"] > 1
    if f.get("overlap_grad_reduce") is None:
        f["overlap_grad_reduce"] = True
    requested = f.get("overlap_param_gather")
    f["overlap_param_gather"] = bool(param_gather_overlap(
        f["overlap_grad_reduce"] and (requested is None or requested),
        f["distributed_optimizer"]))
    for spec in PLAN_FIELDS:   # any other field not given takes the schema's default
        if f.get(spec.name) is None:
            f[spec.name] = spec.default
    return ParallelPlan(**f)
