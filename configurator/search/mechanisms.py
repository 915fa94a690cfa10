"""The recipe mechanisms the search turns on by itself, and what each needs of the cluster.

The cost and memory models price mechanisms of Megatron-Core beyond the parallel layout:
Transformer Engine's fused cross entropy, the BF16 gradient reduction, the tensor-parallel
communication overlap, the flex token dispatcher (DeepEP, HybridEP), Transformer Engine's
fused MoE permutation and routing, the delayed expert weight gradients and the
precision-aware optimizer. A search-wide option a user does not give (``search``'s
``--cross-entropy-fusion``, ``--moe-token-dispatcher-type``, ...) is chosen here where the
cluster and the software allow the mechanism (:data:`MECHANISMS`, each with what it needs
and the source; :data:`CLUSTER_CAPABILITIES`, what each cluster preset has), never where
the user gave the field.

Each mechanism here is, by the models, never slower and never more memory where it applies
(it only removes work, bytes or exposed communication), except two that only move time:
the tensor-parallel overlap (its pipelined GEMMs run on fewer SMs) and the flex dispatcher
(its NVLink phase can exceed NCCL's inside one domain). Both are turned on for the whole
search and switched off again for a shortlisted plan where that is faster
(:func:`plan_variants`); neither changes a plan's memory, so no plan's fit depends on them.

A mechanism Megatron ties to a per-candidate field would otherwise remove the plans without
that field from the search. The flex dispatcher (``ep·etp > 1``) splits the search into
regimes (:func:`search_regimes`): the plans with ep > 1 carry it, the others do not, and
together they are the plans the search would enumerate without it. The precision-aware
optimizer (the distributed optimizer) is applied per plan instead, to each shortlisted plan
with the distributed optimizer (:func:`plan_variants`): it only lowers memory and time, but
the memory filter prices plans without it, so a plan that fits only with it is not found.

CPU offloading of whole layers (:func:`cpu_offload_allowed`: GPUs with an NVLink-C2C host link)
lowers memory and, where its copies outlast the compute, costs time; Megatron ties it to pp 1
and no recompute. Each regime runs again on those plans at each of
:data:`CPU_OFFLOAD_SHARES` of the layers, with and without Megatron FSDP (which NVIDIA's
recipes pair with it), so the plans that fit only with them are found and priced as they run.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.plan import PLAN_FIELD
from configurator.core.rules import check_search_options

#: GPU families by GPU preset name prefix (topology/gpus.py): what the software support of a
#: mechanism is stated against.
GPU_FAMILIES = (("a100", "ampere"), ("h100", "hopper"), ("h200", "hopper"),
                ("h800", "hopper"), ("b200", "blackwell"), ("b300", "blackwell"),
                ("gb200", "blackwell"), ("gb300", "blackwell"))


def gpu_family(gpu_name: str) -> str | None:
    """``ampere``, ``hopper`` or ``blackwell`` for a GPU preset name (``h100-80gb``), else
    None (a GPU file of another part: no family-dependent mechanism is turned on)."""
    for prefix, family in GPU_FAMILIES:
        if gpu_name.lower().startswith(prefix):
            return family
    return None


#: What each cluster preset offers the flex dispatcher: its backend, or None. DeepEP's
#: internode kernels need Hopper or Blackwell GPUs with NVLink inside the node and RDMA
#: NICs with GPUDirect (IBGDA) between nodes (deepseek-ai/DeepEP README, "Requirements":
#: "Hopper GPUs", "NVLink for intranode communication", "RDMA network for internode
#: communication"; ConnectX-7 400 Gb/s InfiniBand is the tested NIC): the DGX H100, H200,
#: H800, B200 and B300 presets (ConnectX-7/8, one per GPU). HybridEP (the hybrid-ep branch,
#: docs/Hybrid-EP_Implementation.md) is DeepEP's kernel for multi-node NVLink domains: the
#: GB200 and GB300 NVL72 presets, as Megatron-Bridge's GB200/GB300 MoE recipes set
#: ``moe_flex_dispatcher_backend="hybridep"`` (megatron_bridge_recipes.csv). A100
#: (ConnectX-6, Ampere) and a cluster file the table does not name: none.
CLUSTER_CAPABILITIES: Mapping[str, Mapping[str, Any]] = {
    "dgx-a100-80gb": {"flex_backend": None},
    "dgx-h100-80gb": {"flex_backend": "deepep"},
    "dgx-h200-141gb": {"flex_backend": "deepep"},
    "dgx-h800-80gb": {"flex_backend": "deepep"},
    "dgx-b200-180gb": {"flex_backend": "deepep"},
    "dgx-b300-288gb": {"flex_backend": "deepep"},
    "gb200-nvl72": {"flex_backend": "hybridep"},
    "gb300-nvl72": {"flex_backend": "hybridep"},
}


def flex_backend(cluster) -> str | None:
    """The flex dispatcher backend ``cluster`` supports (:data:`CLUSTER_CAPABILITIES`), or
    None."""
    caps = CLUSTER_CAPABILITIES.get(cluster.name)
    if caps is None or gpu_family(cluster.gpu.name) not in ("hopper", "blackwell"):
        return None
    return caps["flex_backend"]


def _transformer_engine(options) -> bool:
    # --attention-backend local selects --transformer-impl local: no Transformer Engine layers
    return options["attention_backend"] != "local"


@dataclass(frozen=True)
class Mechanism:
    """One mechanism: ``name`` (as the output names it), ``fields(model, cluster, options)``
    the plan fields it sets, ``allowed(model, cluster, options)`` whether the cluster and
    the software run it, ``needs`` what it needs with the source, and ``split``: the
    per-candidate field and the values where Megatron takes it (None: every plan)."""

    name: str
    fields: Callable[[ModelSpec, Any, Mapping], dict]
    allowed: Callable[[ModelSpec, Any, Mapping], bool]
    needs: str
    split: Callable[[ModelSpec], tuple[str, tuple]] | None = None
    #: whether the shortlist tries each plan without it (it only moves time)
    per_plan: bool = False
    #: the plans it is applied to one by one on the shortlist (None: a search-wide option)
    applies: Callable[[Any], bool] | None = None


def _experts_parallel(model: ModelSpec) -> tuple[str, tuple]:
    return "ep", tuple(d for d in range(2, model.num_experts + 1) if model.num_experts % d == 0)


#: The mechanisms the search chooses, in the order the output names them.
MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        "te_cross_entropy", lambda m, c, o: {"cross_entropy_fusion": "te"},
        lambda m, c, o: _transformer_engine(o),
        "Transformer Engine (transformer_engine/pytorch/triton/cross_entropy.py; "
        "Megatron --cross-entropy-loss-fusion --cross-entropy-fusion-impl te, "
        "Megatron-Bridge's performance recipes' cross_entropy_fusion_impl \"te\")"),
    Mechanism(
        "grad_reduce_in_bf16", lambda m, c, o: {"grad_reduce_in_bf16": True},
        lambda m, c, o: o["precision"] != "fp16",
        "BF16 parameters: bf16, fp8 or mxfp8 (Megatron --grad-reduce-in-bf16; "
        "Megatron-Bridge's performance recipes set grad_reduce_in_fp32=False)"),
    Mechanism(
        "tp_comm_overlap", lambda m, c, o: {"tp_comm_overlap": True},
        lambda m, c, o: _transformer_engine(o) and gpu_family(c.gpu.name) in (
            "hopper", "blackwell"),
        "Transformer Engine userbuffers on Hopper or Blackwell, tp > 1 with sequence "
        "parallelism (validate_args) and the tp group inside one NVLink domain "
        "(Megatron-Bridge's comm_overlap.py sets it for its H100, B200 and GB200 recipes)",
        per_plan=True),
    Mechanism(
        "flex_dispatcher", lambda m, c, o: {"moe_token_dispatcher_type": "flex",
                                            "moe_flex_dispatcher_backend": flex_backend(c)},
        lambda m, c, o: m.is_moe and flex_backend(c) is not None and not (
            flex_backend(c) == "deepep" and o["moe_pad_expert_input_to_capacity"]),
        "experts with ep > 1 (MoEFlexTokenDispatcher) and a cluster with DeepEP's or "
        "HybridEP's GPUs and NICs (CLUSTER_CAPABILITIES)",
        split=_experts_parallel, per_plan=True),
    Mechanism(
        "moe_permute_fusion", lambda m, c, o: {"moe_permute_fusion": True},
        lambda m, c, o: m.is_moe and _transformer_engine(o),
        "experts and Transformer Engine's fused permutation (Megatron --moe-permute-fusion)"),
    Mechanism(
        "moe_router_fusion", lambda m, c, o: {"moe_router_fusion": True},
        lambda m, c, o: m.is_moe and _transformer_engine(o),
        "experts and Transformer Engine's fused top-k routing (Megatron --moe-router-fusion)"),
    Mechanism(
        "delay_wgrad_compute", lambda m, c, o: {"delay_wgrad_compute": True},
        lambda m, c, o: m.is_moe,
        "experts; applies to plans with the expert-parallel all-to-all overlap "
        "(Megatron --delay-wgrad-compute)"),
    Mechanism(
        "precision_aware_optimizer",
        lambda m, c, o: {"use_precision_aware_optimizer": True, "exp_avg_dtype": "bf16",
                         "exp_avg_sq_dtype": "bf16"},
        lambda m, c, o: _transformer_engine(o) and o["precision"] != "fp16",
        "Transformer Engine's FusedAdam with the distributed optimizer (OptimizerConfig); "
        "Adam's moments in BF16 as Megatron-Bridge's DeepSeek-V3 recipes keep them "
        "(exp_avg_dtype, exp_avg_sq_dtype torch.bfloat16)",
        applies=lambda p: bool(p.distributed_optimizer)),
)
MECHANISM = {m.name: m for m in MECHANISMS}


@dataclass(frozen=True)
class Regime:
    """One part of a search: the search-wide ``options`` its plans carry, the per-candidate
    ``restrict`` (field -> values) that selects its plans, and the mechanisms it turned on."""

    options: dict
    restrict: dict
    mechanisms: tuple[str, ...]


def chosen_mechanisms(model: ModelSpec, cluster, options: Mapping[str, Any],
                      pinned) -> list[Mechanism]:
    """The mechanisms of :data:`MECHANISMS` the search turns on: allowed on ``cluster``
    with ``options``, none of whose fields the user gave (``pinned``: names of the
    search options given), and legal with the other options (Megatron's rules that only
    search-wide fields decide)."""
    out, opts = [], dict(options)
    for mech in MECHANISMS:
        if not mech.allowed(model, cluster, opts):
            continue
        fields = mech.fields(model, cluster, opts)
        if set(fields) & set(pinned):
            continue
        trial = dict(opts, **fields)
        try:
            check_search_options(model, trial)
        except InputError:
            continue
        opts = trial
        out.append(mech)
    return out


def search_regimes(model: ModelSpec, cluster, options: Mapping[str, Any], pinned,
                   allowed: Mapping[str, tuple] | None = None) -> list[Regime]:
    """The regimes of a search (module docstring): ``options`` with the mechanisms
    :func:`chosen_mechanisms` turns on, split on the per-candidate fields some of them need.
    ``allowed``: the search's own restrictions (field -> values) each regime's restriction
    lies within; a regime they leave empty is dropped."""
    allowed = dict(allowed or {})
    mechs = chosen_mechanisms(model, cluster, options, pinned)
    free = [m for m in mechs if m.split is None and m.applies is None]
    split = [m for m in mechs if m.split is not None]
    base = dict(options)
    for m in free:
        base.update(m.fields(model, cluster, base))
    out = []
    for on in itertools.product((True, False), repeat=len(split)):
        opts, restrict, names = dict(base), {}, [m.name for m in free]
        ok = True
        for m, use in zip(split, on):
            field, values = m.split(model)
            if field in restrict:     # two mechanisms on one field: not declared
                raise ValueError(f"mechanisms split twice on {field}")
            restrict[field] = values if use else ("not", values)
            if use:
                opts.update(m.fields(model, cluster, opts))
                names.append(m.name)
        for field, vals in list(restrict.items()):
            kept = _restriction(field, vals, allowed.get(field), model)
            if not kept:
                ok = False
                break
            restrict[field] = kept
        names += [m.name for m in mechs if m.applies is not None]
        if ok:
            out.append(Regime(options=opts, restrict=restrict,
                              mechanisms=tuple(n for n in (m.name for m in MECHANISMS)
                                               if n in names)))
    if cpu_offload_allowed(model, cluster, options, pinned):
        # each regime again on the plans CPU offloading runs on, at each share of the
        # layers, with and without Megatron FSDP (which needs the distributed optimizer)
        fsdp = (False, True) if "megatron_fsdp" not in pinned else (options["megatron_fsdp"],)
        for regime in list(out):
            for sharded in fsdp:
                want = [("pp", (1,)), ("recompute", ("none",))] + (
                    [("distributed_optimizer", (True,))] if sharded else [])
                kept = {f: _restriction(f, vals, allowed.get(f), model) for f, vals in want}
                if not all(kept.values()):
                    continue
                names = regime.mechanisms + (CPU_OFFLOADING,) + (
                    (MEGATRON_FSDP,) if sharded and "megatron_fsdp" not in pinned else ())
                for n in cpu_offload_layers(model):
                    out.append(Regime(options=dict(regime.options, megatron_fsdp=sharded,
                                                   cpu_offloading_num_layers=n),
                                      restrict=dict(regime.restrict, **kept),
                                      mechanisms=names))
    return out


#: The name the output gives CPU offloading of whole layers (``cpu_offloading_num_layers``),
#: and Megatron FSDP, which the search tries beside it only (NVIDIA's GB200 and GB300 recipes
#: pair them: Llama-3 70B at tp 1, Llama-3.1 405B at tp 2).
CPU_OFFLOADING = "cpu_offloading"
MEGATRON_FSDP = "megatron_fsdp"
#: Shares of a model's layers the search offloads (each a regime of its own): NVIDIA's
#: GB200 and GB300 recipes offload Llama-3 70B's 40 and 20 of 80 layers and Llama-3.1
#: 405B's 95 (and 92) of 126 (megatron_bridge_recipes.csv, ``cpu_offloading_num_layers``;
#: NeMo's recommended GB200 configuration, 95).
CPU_OFFLOAD_SHARES = (0.25, 0.5, 0.75)


def cpu_offload_layers(model: ModelSpec) -> tuple[int, ...]:
    """The numbers of layers the search offloads: :data:`CPU_OFFLOAD_SHARES` of the model's,
    each at least 1 and below the model's (Megatron's rule), without repeats."""
    L = model.num_layers
    return tuple(sorted({min(L - 1, max(1, round(share * L))) for share in CPU_OFFLOAD_SHARES}
                        - {0}))


def cpu_offload_allowed(model: ModelSpec, cluster, options: Mapping[str, Any], pinned) -> bool:
    """Whether the search tries CPU offloading of whole layers: not given by the user, with
    Transformer Engine's layers (its CPU offload context) and no fine-grained offloading
    (they exclude each other), on GPUs whose link to host memory is NVLink-C2C (GB200, GB300:
    :data:`topology.gpus.NVLINK_C2C_BPS`, 450 GB/s each way), where NVIDIA's recipes use it:
    over PCIe a layer's copy outlasts its compute (the cost prices that, and ``estimate``
    takes the field on any GPU)."""
    from topology.gpus import NVLINK_C2C_BPS

    return ("cpu_offloading_num_layers" not in pinned and model.num_layers > 1
            and _transformer_engine(options) and not options.get("offload_modules")
            and cluster.gpu.host_link_Bps >= NVLINK_C2C_BPS)


def _restriction(field: str, vals, user: tuple | None, model: ModelSpec) -> tuple:
    """The values of ``field`` a regime keeps: ``vals`` (or, as ``("not", vals)``, every
    value but those) within the user's restriction ``user``."""
    f = PLAN_FIELD[field]
    if isinstance(vals, tuple) and len(vals) == 2 and vals[0] == "not":
        if f.type is bool:
            every = (False, True)
        elif field == "ep":
            every = tuple(d for d in range(1, model.num_experts + 1)
                          if model.num_experts % d == 0)
        else:
            raise ValueError(f"no value list of {field}")
        vals = tuple(x for x in every if x not in vals[1])
    return tuple(x for x in vals if user is None or x in user)


def plan_variants(model: ModelSpec, cluster, plan, regime: Regime) -> list:
    """``plan`` and the variants the shortlist prices it as (module docstring): first with
    the per-plan mechanisms of ``regime`` applied where they apply (the precision-aware
    optimizer with the distributed optimizer), then each mechanism that only moves time
    switched off, alone and together; the tensor-parallel overlap off outright where the
    tp group leaves one NVLink domain (userbuffers run over NVLink)."""
    base = plan
    for m in MECHANISMS:
        if m.applies is not None and m.name in regime.mechanisms and m.applies(plan):
            base = dataclasses.replace(base, **m.fields(model, cluster, regime.options))
    if "tp_comm_overlap" in regime.mechanisms and plan.tp > cluster.nvlink_domain_gpus:
        base = dataclasses.replace(base, tp_comm_overlap=False)
    offs = [m for m in MECHANISMS if m.per_plan and m.name in regime.mechanisms]
    out = [base]
    for k in range(1, len(offs) + 1):
        for combo in itertools.combinations(offs, k):
            kw = {name: PLAN_FIELD[name].default for m in combo
                  for name in m.fields(model, cluster, regime.options)}
            variant = dataclasses.replace(base, **kw)
            if variant not in out:
                out.append(variant)
    return out


def mechanisms_on(plan, regime_mechanisms) -> list[str]:
    """The mechanisms of ``regime_mechanisms`` (names) ``plan`` carries: those whose fields
    it holds at the mechanism's values and which take effect in it (the tensor-parallel
    overlap with tp > 1 and sequence parallelism, the delayed weight gradients with the
    all-to-all overlap, the flex dispatcher with ep > 1)."""
    out = []
    for name in regime_mechanisms:
        if name == "tp_comm_overlap":
            on = bool(plan.tp_comm_overlap and plan.tp > 1 and plan.sequence_parallel)
        elif name == "flex_dispatcher":
            on = plan.moe_token_dispatcher_type == "flex" and plan.ep * plan.etp > 1
        elif name == "delay_wgrad_compute":
            on = bool(plan.delay_wgrad_compute and plan.overlap_moe_expert_parallel_comm)
        elif name == "precision_aware_optimizer":
            on = bool(plan.use_precision_aware_optimizer)
        elif name == "te_cross_entropy":
            on = plan.cross_entropy_fusion == "te"
        elif name == CPU_OFFLOADING:
            on = plan.cpu_offloading_num_layers > 0
        else:
            on = bool(getattr(plan, name))
        if on:
            detail = {"flex_dispatcher": plan.moe_flex_dispatcher_backend,
                      CPU_OFFLOADING: f"{plan.cpu_offloading_num_layers} layers"}.get(name)
            out.append(name if detail is None else f"{name} ({detail})")
    return out
