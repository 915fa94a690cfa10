"""The mapping of a Megatron-LM arguments dump to model and plan fields.

The dump is the block ``megatron/training/arguments.py`` ``_print_args`` prints at a job's
start (Megatron-LM core_v0.16.1), one argument a line, ``str()`` of each value; the parser
(:mod:`configurator.core.megatron_log`) hands its names and texts here. :class:`MegatronArgs`
reads them as typed values, :func:`model_fields` gives the model
(:class:`~configurator.core.model.ModelSpec` keys), :func:`plan_fields` the plan (run keys)
and :func:`split_overrides` sorts what a caller gives over the log by name.

The model: :data:`MODEL_ARGS` (``layernorm_epsilon`` is Megatron's name of
``norm_epsilon``; query groups only with ``group_query_attention``; MoE fields
(:data:`MOE_ARGS`) only with ``num_experts``, MLA fields (:data:`MLA_ARGS`) only with
``multi_latent_attention``); the vocabulary ``padded_vocab_size``, else the tokenizer's
padded size the log prints, else a ``NullTokenizer``'s ``vocab_size`` + 1 padded as Megatron
pads it. The plan: :data:`PLAN_ARGS` (``world_size`` is ``num_gpus``; ``None``
virtual-pipeline size = 1, ``None`` recompute granularity = none; expert sizes only for MoE
models; selective recompute's ``recompute_modules`` where the model prices them, else core
attention with a note; ``fp8_param_gather`` with FP8 and the distributed optimizer only,
absent read as Megatron's default, off). Precision: ``fp8`` (``--fp8-format`` e4m3/hybrid)
set means ``fp8``, or ``mxfp8`` with ``fp8_recipe`` mxfp8 (other FP8 recipes are read as
``fp8``); else ``bf16``/``fp16`` by those flags; FP32 and FP4 are refused.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from configurator.core.errors import InputError
from configurator.core.model import MODEL_KEYS
from configurator.core.plan import PLAN_FIELD, PLAN_FIELDS
from configurator.core.plan_values import (CP_COMM_TYPES, CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES,
                                           MOE_DISPATCHERS, MOE_FLEX_BACKENDS, is_fp8,
                                           recompute_module_list)
from configurator.core.runs import RUN_KEYS

#: Model fields read from the arguments dump: (ModelSpec field, Megatron argument names,
#: kind). The first name present is read.
MODEL_ARGS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("num_layers", ("num_layers",), "int"),
    ("hidden_size", ("hidden_size",), "int"),
    ("num_attention_heads", ("num_attention_heads",), "int"),
    ("ffn_hidden_size", ("ffn_hidden_size",), "int"),
    ("kv_channels", ("kv_channels",), "int"),
    ("seq_length", ("seq_length",), "int"),
    ("swiglu", ("swiglu",), "bool"),
    ("untie_embeddings_and_output_weights", ("untie_embeddings_and_output_weights",), "bool"),
    ("normalization", ("normalization",), "str"),
    ("norm_epsilon", ("layernorm_epsilon", "norm_epsilon"), "float"),
    ("hidden_dropout", ("hidden_dropout",), "float"),
    ("attention_dropout", ("attention_dropout",), "float"),
    ("position_embedding_type", ("position_embedding_type",), "str"),
    ("rotary_base", ("rotary_base",), "int"),
    ("add_bias_linear", ("add_bias_linear",), "bool"),
    ("add_qkv_bias", ("add_qkv_bias",), "bool"),
    ("qk_layernorm", ("qk_layernorm",), "bool"),
    ("multi_latent_attention", ("multi_latent_attention",), "bool"),
    ("mtp_num_layers", ("mtp_num_layers",), "int"),
    ("window_size", ("window_size",), "window"),
    ("window_attn_skip_freq", ("window_attn_skip_freq",), "freq"),
)
#: Read only with ``num_experts`` set.
MOE_ARGS = (("num_experts", "int"), ("moe_router_topk", "int"), ("moe_ffn_hidden_size", "int"),
            ("moe_shared_expert_intermediate_size", "int"), ("moe_layer_freq", "freq"),
            ("moe_router_load_balancing_type", "str"), ("moe_router_enable_expert_bias", "bool"))
#: Read only with ``multi_latent_attention`` true.
MLA_ARGS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
#: Plan fields read from the arguments dump: (run key, Megatron argument, default for
#: ``None`` or absence; ``...``: leave out).
PLAN_ARGS: tuple[tuple[str, str, Any], ...] = (
    ("num_gpus", "world_size", ...),
    ("tp", "tensor_model_parallel_size", ...),
    ("pp", "pipeline_model_parallel_size", ...),
    ("dp", "data_parallel_size", ...),
    ("cp", "context_parallel_size", 1),
    ("vp", "virtual_pipeline_model_parallel_size", 1),
    ("micro_batch_size", "micro_batch_size", ...),
    ("global_batch_size", "global_batch_size", ...),
    ("recompute", "recompute_granularity", "none"),
    ("sequence_parallel", "sequence_parallel", ...),
    ("distributed_optimizer", "use_distributed_optimizer", ...),
    ("masked_softmax_fusion", "masked_softmax_fusion", ...),
    ("attention_softmax_in_fp32", "attention_softmax_in_fp32", ...),
    ("overlap_grad_reduce", "overlap_grad_reduce", ...),
    ("overlap_param_gather", "overlap_param_gather", ...),
    ("fp8_param_gather", "fp8_param_gather", False),   # Megatron's default; the plan's is on
    ("grad_reduce_in_bf16", "grad_reduce_in_bf16", ...),
    ("tp_comm_overlap", "tp_comm_overlap", ...),
    # Megatron-LM 2021-09 to megatron-core 0.8's --no-async-tensor-model-parallel-allreduce
    # (off with sequence parallelism, which overlaps its own); absent later: always on
    ("async_tensor_model_parallel_allreduce", "async_tensor_model_parallel_allreduce", ...),
    ("megatron_fsdp", "use_megatron_fsdp", ...),
    ("decoder_first_pipeline_num_layers", "decoder_first_pipeline_num_layers", ...),
    ("decoder_last_pipeline_num_layers", "decoder_last_pipeline_num_layers", ...),
    ("account_for_embedding_in_pipeline_split", "account_for_embedding_in_pipeline_split", ...),
    ("account_for_loss_in_pipeline_split", "account_for_loss_in_pipeline_split", ...),
    ("overlap_moe_expert_parallel_comm", "overlap_moe_expert_parallel_comm", ...),
    ("delay_wgrad_compute", "delay_wgrad_compute", ...),
    ("moe_permute_fusion", "moe_permute_fusion", ...),
    ("moe_router_fusion", "moe_router_fusion", ...),
    ("moe_pad_expert_input_to_capacity", "moe_pad_expert_input_to_capacity", ...),
    ("moe_router_force_load_balancing", "moe_router_force_load_balancing", ...),
    ("use_precision_aware_optimizer", "use_precision_aware_optimizer", ...),
    ("cpu_offloading_num_layers", "cpu_offloading_num_layers", ...),
)
#: Optimizer-state dtypes as ``validate_args`` leaves them in the dump (torch dtypes;
#: ``fp8`` moments are stored as ``torch.uint8``).
_TORCH_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
                 "torch.uint8": "fp8", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16",
                 "fp8": "fp8"}
_INT_PLAN = {"num_gpus", "tp", "pp", "dp", "cp", "vp", "micro_batch_size", "global_batch_size",
             "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
             "cpu_offloading_num_layers"}

_INT_TEXT = re.compile(r"-?\d{1,15}")
_LIST_TEXT = re.compile(r"\[\s*(?:-?\d{1,6}\s*(?:,\s*-?\d{1,6}\s*)*)?\]")
_WINDOW_TEXT = re.compile(r"\(\s*(-?\d{1,12})\s*,\s*(-?\d{1,12})\s*\)")


def finite_number(text: str) -> float | None:
    """The number ``text`` spells, or None (not a number, or not finite)."""
    try:
        val = float(text)
    except ValueError:
        return None
    return val if math.isfinite(val) else None


class MegatronArgs:
    """Typed access to one arguments dump; errors name ``<where> arguments.<name>``."""

    def __init__(self, args: Mapping[str, str], where: str):
        self.args = args
        self.where = where

    def has(self, name: str) -> bool:
        return name in self.args

    def raw(self, name: str) -> str | None:
        val = self.args.get(name)
        return None if val is None or val == "None" else val

    def error(self, name: str, rule: str) -> InputError:
        return InputError(f"{self.where} arguments.{name}", self.args.get(name), rule)

    def int(self, name: str) -> int | None:
        val = self.raw(name)
        if val is None:
            return None
        if not _INT_TEXT.fullmatch(val):
            raise self.error(name, "must be an integer")
        return int(val)

    def bool(self, name: str) -> bool | None:
        val = self.raw(name)
        if val is None:
            return None
        if val not in ("True", "False"):
            raise self.error(name, "must be True or False")
        return val == "True"

    def float(self, name: str) -> float | None:
        val = self.raw(name)
        if val is None:
            return None
        num = finite_number(val)
        if num is None:
            raise self.error(name, "must be a number")
        return num

    def freq(self, name: str) -> int | list[int] | None:
        """An int, or a list ``[1, 0, ...]`` (Megatron's ``moe_freq_type``)."""
        val = self.raw(name)
        if val is None:
            return None
        if _INT_TEXT.fullmatch(val):
            return int(val)
        if _LIST_TEXT.fullmatch(val):
            return [int(x) for x in val.strip("[] ").split(",") if x.strip()]
        raise self.error(name, "must be an integer or a list of integers")

    def window(self, name: str) -> int | None:
        """``--window-size (w, 0)``: ``w`` past keys (a causal window)."""
        val = self.raw(name)
        if val is None:
            return None
        m = _WINDOW_TEXT.fullmatch(val)
        if not m or int(m.group(2)) != 0:
            raise self.error(name, "only a causal window (w, 0) is supported")
        return int(m.group(1))

    def get(self, name: str, kind: str) -> Any:
        return {"int": self.int, "bool": self.bool, "float": self.float, "freq": self.freq,
                "window": self.window, "str": self.raw}[kind](name)


def _pad_vocab(size: int, a: MegatronArgs) -> int:
    # megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding
    multiple = (a.int("make_vocab_size_divisible_by") or 128) * (
        a.int("tensor_model_parallel_size") or 1)
    return -(-size // multiple) * multiple


def model_fields(a: MegatronArgs, tokenizer_vocab: int | None) -> dict[str, Any]:
    """The model keys the dump gives (see the module docstring); ``tokenizer_vocab``: the
    padded vocabulary of the tokenizer's log line, if the log has one."""
    kw: dict[str, Any] = {}
    for field, names, kind in MODEL_ARGS:
        name = next((n for n in names if a.has(n)), None)
        if name is not None:
            val = a.get(name, kind)
            if val is not None:
                kw[field] = val
    if a.bool("quick_geglu"):
        # GPT-OSS's gated MLP (--quick-geglu with the clamp and --glu-linear-offset 1.0, as
        # the launch scripts write it): a gated MLP with its clamp (ModelSpec
        # activation_func_clamp_value)
        kw["swiglu"] = True
        clamp = a.get("activation_func_clamp_value", "float")
        if clamp is not None:
            kw["activation_func_clamp_value"] = clamp
    if kw.get("window_attn_skip_freq") is not None and not isinstance(
            kw["window_attn_skip_freq"], int):
        raise a.error("window_attn_skip_freq", "a list pattern is not supported")
    mla = bool(kw.get("multi_latent_attention"))
    if a.bool("group_query_attention") and not mla and a.int("num_query_groups"):
        kw["num_query_groups"] = a.int("num_query_groups")
    if a.int("num_experts") is not None:
        for name, kind in MOE_ARGS:
            val = a.get(name, kind)
            if val is not None:
                kw[name] = val
    if mla:
        for name in MLA_ARGS:
            if a.int(name) is not None:
                kw[name] = a.int(name)
    vocab = a.int("padded_vocab_size") or tokenizer_vocab
    if vocab is None and a.int("vocab_size") is not None and (
            a.raw("tokenizer_type") == "NullTokenizer"):
        vocab = _pad_vocab(a.int("vocab_size") + 1, a)     # NullTokenizer adds the EOD token
    if vocab is not None:
        kw["vocab_size"] = vocab
    return kw


def _precision(a: MegatronArgs) -> str:
    if a.raw("fp4") is not None:
        raise a.error("fp4", "FP4 training is not modelled (bf16, fp16, fp8, mxfp8)")
    if a.raw("fp8") is not None:
        return "mxfp8" if a.raw("fp8_recipe") == "mxfp8" else "fp8"
    if a.bool("bf16"):
        return "bf16"
    if a.bool("fp16"):
        return "fp16"
    if a.has("bf16") or a.has("fp16"):
        raise a.error("bf16", "FP32 training is not modelled (bf16, fp16, fp8, mxfp8)")
    raise InputError(f"{a.where} arguments", "bf16/fp16/fp8", "missing: cannot tell the "
                     "precision")


def _printed_list(text: str) -> list[str]:
    """The words of a list of strings as the arguments dump prints it (``['p2p']``,
    ``['core_attn', 'moe_act']``)."""
    return text.strip("[]").replace("'", "").replace('"', "").replace(",", " ").split()


def plan_fields(a: MegatronArgs, moe: bool) -> tuple[dict[str, Any], list[str]]:
    """``(row, notes)``: the run keys of the plan the dump gives (see the module docstring;
    ``moe``: the model has experts) and notes on what is priced otherwise than it ran."""
    row: dict[str, Any] = {}
    notes: list[str] = []
    for key, name, default in PLAN_ARGS:
        if not a.has(name):
            if default is not ...:
                row[key] = default
            continue
        val = a.int(name) if key in _INT_PLAN else (
            a.raw(name) if key == "recompute" else a.bool(name))
        if val is None:
            if default is not ...:
                row[key] = default
            continue
        row[key] = val
    if moe:
        for key, name in (("ep", "expert_model_parallel_size"),
                          ("etp", "expert_tensor_parallel_size")):
            if a.int(name) is not None:
                row[key] = a.int(name)
    if a.has("bf16") or a.has("fp16") or a.has("fp8"):
        row["precision"] = _precision(a)
    impl, backend = a.raw("transformer_impl"), a.raw("attention_backend")
    if impl == "local":
        row["attention_backend"] = "local"
    elif backend is not None:
        row["attention_backend"] = backend.rpartition(".")[2]      # AttnBackend.flash
    if a.has("cross_entropy_loss_fusion"):
        row["cross_entropy_fusion"] = (
            "none" if not a.bool("cross_entropy_loss_fusion")
            else "te" if a.raw("cross_entropy_fusion_impl") == "te" else "native")
    layout = a.raw("pipeline_model_parallel_layout")   # the string as given
    if layout:
        row["pipeline_model_parallel_layout"] = layout
    comm = a.raw("cp_comm_type")         # printed as a list: ['p2p'] or one per layer
    if comm is not None:
        kinds = set(_printed_list(comm))
        if len(kinds) == 1 and next(iter(kinds)) in CP_COMM_TYPES:
            row["cp_comm_type"] = kinds.pop()
        elif kinds:
            notes.append(f"cp_comm_type {comm}: priced as p2p")
    if row.get("recompute") == "full" and (a.raw("recompute_method") != "uniform"
                                           or a.int("recompute_num_layers") != 1):
        notes.append(f"recompute full with method {a.raw('recompute_method')} and "
                     f"{a.raw('recompute_num_layers')} layers: priced as uniform, 1 layer")
    modules = a.raw("recompute_modules")    # printed as a list: ['core_attn', 'moe_act']
    if row.get("recompute") == "selective" and modules not in (None, "None", "['core_attn']"):
        names = ",".join(_printed_list(modules))
        try:
            row["recompute_modules"] = ",".join(recompute_module_list(names))
        except InputError as err:
            notes.append(f"selective recompute of {modules}: priced as core attention "
                         f"({err.rule})")
    if not (is_fp8(row.get("precision", "")) and row.get("distributed_optimizer")):
        # the flag applies to FP8 with the distributed optimizer only: elsewhere the plan's
        # default, as the plan that launched the job has it
        row.pop("fp8_param_gather", None)
    recipe = a.raw("fp8_recipe")
    if row.get("precision") == "fp8" and recipe not in (None, "delayed"):
        if recipe in PLAN_FIELD["fp8_recipe"].choices:
            row["fp8_recipe"] = recipe
        else:
            notes.append(f"fp8 recipe {recipe}: priced as delayed scaling")
    if moe:
        dispatcher = a.raw("moe_token_dispatcher_type")
        if dispatcher in MOE_DISPATCHERS:
            row["moe_token_dispatcher_type"] = dispatcher
            backend = a.raw("moe_flex_dispatcher_backend")
            if dispatcher == "flex" and backend in MOE_FLEX_BACKENDS:
                row["moe_flex_dispatcher_backend"] = backend
        elif dispatcher is not None:
            notes.append(f"moe_token_dispatcher_type {dispatcher}: priced as alltoall")
        factor = a.raw("moe_expert_capacity_factor")
        if factor not in (None, "None"):
            try:
                row["moe_expert_capacity_factor"] = max(float(factor), 0.0)
            except ValueError:
                raise a.error("moe_expert_capacity_factor", "must be a number") from None
    impl = a.raw("cuda_graph_impl")
    if impl in CUDA_GRAPH_IMPLS and impl != "none":
        row["cuda_graph_impl"] = impl
        scope = a.raw("cuda_graph_scope")    # printed as [<CudaGraphScope.attn: 2>, ...]
        if scope not in (None, "None", "[]"):
            row["cuda_graph_scope"] = ",".join(re.findall(
                r"\b(" + "|".join(CUDA_GRAPH_SCOPES) + r")\b", scope))
    if row.get("use_precision_aware_optimizer"):
        for key in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                    "exp_avg_sq_dtype"):
            val = a.raw(key)
            if val is not None and val in _TORCH_DTYPES:
                row[key] = _TORCH_DTYPES[val]
    if a.bool("fine_grained_activation_offloading"):
        modules = a.raw("offload_modules")
        if modules not in (None, "None", "[]"):
            row["offload_modules"] = ",".join(_printed_list(modules))
    return row, notes


def _override_keys() -> dict[str, str]:
    """Accepted override names → canonical key (run keys, their aliases, Megatron's plan
    argument names, model keys)."""
    names = {k: k for k in RUN_KEYS + MODEL_KEYS}
    for f in PLAN_FIELDS:
        if f.alias:
            names[f.alias] = f.name
        if f.megatron_name:
            names[f.megatron_name] = f.name
    names["world_size"] = "num_gpus"
    return names


def split_overrides(overrides: Mapping[str, Any] | None, model_given: bool
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(run keys, model keys)`` of the overrides given over a log, each under its canonical
    name (:func:`_override_keys`). Raises :class:`InputError` for an unknown key, ``model`` or
    ``cluster``, or a model key other than ``seq_length`` when ``model_given``."""
    run_over: dict[str, Any] = {}
    model_over: dict[str, Any] = {}
    if overrides is None:
        return run_over, model_over
    if not isinstance(overrides, Mapping):
        raise InputError("overrides", type(overrides).__name__, "must be a mapping")
    names = _override_keys()
    for key, val in overrides.items():
        canon = names.get(key) if isinstance(key, str) else None
        if canon in ("model", "cluster"):
            raise InputError(f"overrides.{key}", val, f"give it as {canon}=")
        if canon is None:
            raise InputError(f"overrides.{key}", val, "unknown key: a run key ("
                             + ", ".join(RUN_KEYS) + ") or a model key")
        if canon in RUN_KEYS:
            run_over[canon] = val
        if canon in MODEL_KEYS and canon != "name":
            if model_given and canon != "seq_length":
                raise InputError(f"overrides.{key}", val, "a model field: not with model=")
            model_over[canon] = val
    return run_over, model_over
