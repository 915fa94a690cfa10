"""A plan as Megatron-Bridge recipe overrides: ``bridge_overrides.yaml``.

Megatron-Bridge (``megatron-bridge`` 0.3.1, NVIDIA-NeMo/Megatron-Bridge) trains from a
recipe, a function returning a ``ConfigContainer`` (``megatron/bridge/training/config.py``:
``model`` a ``GPTModelProvider`` (megatron-core's ``TransformerConfig`` and its own fields),
``train`` a ``TrainingConfig``, ``ddp`` a ``DistributedDataParallelConfig``, ``optimizer`` an
``OptimizerConfig``, ``checkpoint``, ``dataset``, ``mixed_precision`` a recipe name …). Its
``process_config_with_overrides(cfg, config_filepath=...)``
(``megatron/bridge/training/utils/omegaconf_utils.py``) merges a YAML file of the same nesting
into a recipe's config. This module writes that file for a plan: each plan field's overrides
come from its schema entry (``PlanField.bridge`` in :mod:`configurator.core.plan`), the
sequence length from the model. Every key is written with the plan's value, ``null`` where
the field is unset (no interleaving, an even split, no recompute), so whatever the recipe set
is replaced; the model's architecture stays the recipe's (pick the recipe of the same model).

What a YAML override cannot carry (an enum-typed field; the settings a named mixed-precision
recipe applies over ``model`` and ``ddp`` at setup) is written as a comment with the Python
line that sets it (:data:`NOT_CARRIED`).
"""

from __future__ import annotations

from typing import Any, Callable

import yaml

from configurator.core.model import ModelSpec
from configurator.core.plan import (BRIDGE_KEEP, PLAN_FIELDS, ParallelPlan,
                                    bridge_precision_recipe)
from configurator.core.plan_terms import fp8_weights_gathered, tp_backward_allreduce_exposed

BRIDGE_FILE = "bridge_overrides.yaml"
#: The Megatron-Bridge release whose config classes the keys were read from
#: (tests/data/megatron_bridge_0_3_1_fields.json).
BRIDGE_VERSION = "0.3.1"

#: ``fp8_param_gather`` of each Megatron-Bridge 0.3.1 mixed-precision recipe
#: (megatron/bridge/training/mixed_precision.py); the recipe sets ``ddp.fp8_param_gather`` and
#: ``model.fp8_param`` from it at setup, over any override.
RECIPE_FP8_PARAM_GATHER = {"bf16_mixed": False, "fp16_mixed": False,
                           "bf16_with_fp8_delayed_scaling_mixed": True,
                           "bf16_with_fp8_current_scaling_mixed": True,
                           "bf16_with_fp8_subchannel_scaling_mixed": False,
                           "bf16_with_mxfp8_mixed": True}


def _mp(line: str) -> str:
    return ("cfg.mixed_precision = get_mixed_precision_config(cfg.mixed_precision); "
            f"cfg.mixed_precision.{line}")


def _fp8_param_gather(m: ModelSpec, p: ParallelPlan) -> str | None:
    want = bool(fp8_weights_gathered(p.fp8_param_gather, p.distributed_optimizer, p.precision))
    recipe = bridge_precision_recipe(p)
    if want == RECIPE_FP8_PARAM_GATHER[recipe]:
        return None
    return _mp(f"fp8_param_gather = {want}  (the plan's; {recipe} sets {not want})")


def _first_last_bf16(m: ModelSpec, p: ParallelPlan) -> str | None:
    # the current-scaling recipe keeps the first and last layers in BF16; the plan's FP8
    # covers every layer, as Megatron-LM's --fp8-format does
    if bridge_precision_recipe(p) != "bf16_with_fp8_current_scaling_mixed":
        return None
    return _mp("first_last_layers_bf16 = False  (the plan prices every layer in FP8)")


#: Plan fields a YAML override does not carry, each with the comment (a Python line on the
#: recipe's ``cfg``) written when the plan needs it, or None when its value is the recipe's.
NOT_CARRIED: dict[str, Callable[[ModelSpec, ParallelPlan], str | None]] = {
    # megatron-core's AttnBackend is an enum; the YAML merge would set a string
    "attention_backend": lambda m, p: None if p.attention_backend == "auto" else (
        f"cfg.model.attention_backend = AttnBackend.{p.attention_backend}  "
        "(from megatron.core.transformer.enums import AttnBackend)"),
    "fp8_param_gather": _fp8_param_gather,
    "fp8_recipe": _first_last_bf16,
    "grad_reduce_in_bf16": lambda m, p: _mp("grad_reduce_in_fp32 = False") if (
        p.grad_reduce_in_bf16 and p.precision != "fp16") else None,
    "fp8_dot_product_attention": lambda m, p: _mp("fp8_dot_product_attention = True")
    if p.fp8_dot_product_attention else None,
    "async_tensor_model_parallel_allreduce": lambda m, p: None if not (
        tp_backward_allreduce_exposed(p.async_tensor_model_parallel_allreduce, p.tp,
                                      p.sequence_parallel)) else (
        "async_tensor_model_parallel_allreduce: megatron-core 0.16.1 always overlaps the "
        "backward's tensor-parallel all-reduce; the plan was priced without it"),
    "moe_fused_grouped_mlp": lambda m, p: (
        "moe_fused_grouped_mlp: Transformer Engine's op fuser for the experts' MLP has no "
        "field in megatron-core 0.16.1; the plan was priced with it") if
    p.moe_fused_grouped_mlp else None,
}
#: Plan fields whose overrides another field writes (``dp`` follows from the world size).
CARRIED_BY = {"dp": "the world size", "fp8_recipe": "precision",
              "cuda_graph_scope": "cuda_graph_impl", "main_grads_dtype":
              "use_precision_aware_optimizer", "main_params_dtype":
              "use_precision_aware_optimizer", "exp_avg_dtype": "use_precision_aware_optimizer",
              "exp_avg_sq_dtype": "use_precision_aware_optimizer"}


def bridge_overrides(model: ModelSpec, plan: ParallelPlan) -> dict[str, Any]:
    """The plan's Megatron-Bridge ``ConfigContainer`` overrides, nested as the container
    (``{"model": {...}, "train": {...}, "ddp": {...}, ...}``): every plan field's
    ``PlanField.bridge`` rules (a rule's :data:`~configurator.core.plan.BRIDGE_KEEP` leaves
    the key out), then ``model.seq_length`` and ``dataset.seq_length`` (the model's sequence
    length; Megatron-Bridge asserts they are equal)."""
    out: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        *path, leaf = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value

    for f in PLAN_FIELDS:
        for key, rule in f.bridge:
            value = rule(model, plan)
            if value is not BRIDGE_KEEP:
                put(key, value)
    put("model.seq_length", model.seq_length)
    put("dataset.seq_length", model.seq_length)
    return out


def not_carried(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """The Python lines that set what the YAML cannot carry for this plan
    (:data:`NOT_CARRIED`), in schema order."""
    lines = []
    for f in PLAN_FIELDS:
        note = NOT_CARRIED.get(f.name)
        line = note(model, plan) if note else None
        if line:
            lines.append(line)
    return lines


def render_bridge_overrides(model: ModelSpec, plan: ParallelPlan, *, nodes: int,
                            gpus_per_node: int, summary: dict | None = None) -> str:
    """``bridge_overrides.yaml``: a comment header (what it is, how to apply it, the world
    size it was planned for, the lines the YAML cannot carry), then
    :func:`bridge_overrides` as YAML."""
    world = nodes * gpus_per_node
    head = [f"Megatron-Bridge {BRIDGE_VERSION} ConfigContainer overrides of the plan for "
            f"{model.name} on {nodes} x {gpus_per_node} GPUs",
            f"(tp {plan.tp}, pp {plan.pp}, cp {plan.cp}, dp {plan.dp} = {world} GPUs; "
            f"global batch {plan.global_batch_size}, micro-batch {plan.micro_batch_size}).",
            "Apply them to the Megatron-Bridge recipe of the same model (RECIPE, e.g.",
            "megatron.bridge.recipes.llama.llama3_70b_pretrain_config for Llama 3 70B):",
            "  from megatron.bridge.training.utils.omegaconf_utils import "
            "process_config_with_overrides",
            f"  cfg = process_config_with_overrides(RECIPE(), config_filepath=\"{BRIDGE_FILE}\")",
            f"and launch on {world} GPUs (the data-parallel size follows from the world size)."]
    if summary:
        head.append("predicted: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    lines = not_carried(model, plan)
    if lines:
        head.append("Not carried by YAML; set on cfg in Python after loading the recipe:")
        head += ["  " + line for line in lines]
    # one comment line each, whatever the model's name holds
    text = "".join("# " + "".join(c for c in line if c.isprintable()) + "\n" for line in head)
    return text + yaml.safe_dump(bridge_overrides(model, plan), sort_keys=False,
                                 default_flow_style=False)
