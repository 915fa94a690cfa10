"""Published measurements used for calibration and accuracy checks.

The CSVs (SC'21 Table 1, Korthikanti et al.'s Table 3, NeMo's long-context runs,
Megatron-Bridge's performance summary) ship with the tool in ``configurator/data/published``
(:func:`published_path`), each row with its citation. :func:`published_runs` gives every row
we can price as a :class:`~configurator.core.runs.MeasuredRun` (what ``configurator
validate`` and ``calibrate`` price when given no run file), grouped as
:func:`published_group` says.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from configurator.cost.flops import sc21_flops
from configurator.core.layers import format_layout
from configurator.core.model import ModelSpec
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.errors import InputError
from configurator.core.plan import ParallelPlan
from configurator.core.rules import check_plan
from configurator.core.runs import MeasuredRun
from configurator.data import PUBLISHED, data_path
from topology.cluster_files import CLUSTER_PRESETS

SC21_MODEL_NAMES = {"1.7": "gpt-1.7b", "3.6": "gpt-3.6b", "7.5": "gpt-7.5b",
                    "18.4": "gpt-18.4b", "39.1": "gpt-39.1b", "76.1": "gpt-76.1b",
                    "145.6": "gpt-145.6b", "310.1": "gpt-310.1b", "529.6": "gpt-529.6b",
                    "1008.0": "gpt-1t"}


#: The shipped tables (``configurator/data/published``), one per source.
SC21_TABLE, KORTHIKANTI_TABLE = "sc21_table1.csv", "korthikanti_table3.csv"
KORTHIKANTI_TIMES_TABLE = "korthikanti_table5.csv"
NEMO_CP_TABLE, BRIDGE_TABLE = "nemo_long_sequence_cp.csv", "megatron_bridge_perf.csv"
NEMO_SUMMARY_TABLE, MEGATRON_LM_TABLE = "nemo_perf_summary.csv", "megatron_lm_h100_table.csv"


def published_path(name: str) -> Path:
    """Path of the shipped table ``name`` (e.g. :data:`SC21_TABLE`)."""
    return data_path(PUBLISHED, name)


def read_table(path: Path | str) -> list[dict[str, str]]:
    """Rows of a published table: a CSV whose ``#`` lines are comments (the source)."""
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


@dataclass(frozen=True)
class SC21Row:
    model: ModelSpec
    plan: ParallelPlan
    num_gpus: int
    published_tflops_per_gpu: float
    #: the row's citation (the table's ``source`` column)
    source: str = ""

    @property
    def published_iteration_time_s(self) -> float:
        """T = F / (TFLOP/s · 1e12 · GPUs), F as SC'21 counts it (includes recompute)."""
        return sc21_flops(self.model, self.plan.global_batch_size) / (
            self.published_tflops_per_gpu * 1e12 * self.num_gpus)


def sc21_rows(path: Path | None = None) -> list[SC21Row]:
    """Rows of SC'21 Table 1 as plans: the row's tp, pp, mbs and virtual stages (from the
    paper's run_table_1.sh), full recompute, fp16, ``local`` attention (2021 Megatron stored
    the score matrix), no gradient-reduce overlap (2021 Megatron reduced after backward) and
    the backward's tensor-parallel all-reduce exposed (``async_tensor_model_parallel_allreduce``
    off: its overlap with the weight-gradient GEMM came to Megatron-LM in August 2021,
    NVIDIA/Megatron-LM cf7efd4, after the paper's runs; arXiv:2104.04473 v1 is of April)."""
    rows = read_table(path or published_path(SC21_TABLE))
    out = []
    for r in rows:
        model = MODEL_PRESETS[SC21_MODEL_NAMES[r["params_billion"]]]
        tp, pp, n = int(r["tp"]), int(r["pp"]), int(r["num_gpus"])
        k = r["num_layers_per_virtual_stage_from_script"]
        vp = (model.num_layers // pp) // int(k) if k else 1
        plan = ParallelPlan(tp=tp, pp=pp, dp=n // (tp * pp), vp=vp,
                            micro_batch_size=int(r["mbs_from_script"]),
                            global_batch_size=int(r["global_batch_size"]), recompute="full",
                            precision="fp16", attention_backend="local",
                            overlap_grad_reduce=False, overlap_param_gather=False,
                            async_tensor_model_parallel_allreduce=False)
        out.append(SC21Row(model, plan, n, float(r["achieved_tflops_per_gpu"]), r["source"]))
    return out


#: Megatron-Bridge systems as cluster presets.
BRIDGE_SYSTEMS = {"DGX-H100": "dgx-h100-80gb", "DGX-B200": "dgx-b200-180gb",
                  "DGX-B300": "dgx-b300-288gb", "DGX-GB200": "gb200-nvl72",
                  "DGX-GB300": "gb300-nvl72"}
#: What a Megatron-Bridge model name adds for a run without multi-token prediction
#: ("DeepSeekV3 (w/o MTP)", 25.11): the preset with ``mtp_num_layers`` unset.
MTP_OFF_SUFFIX = "(w/o MTP)"
#: Labels a Megatron-Bridge page appends to a model name that leave the model as its preset:
#: "(dropless)" (25.09: the default routing, every token kept) and "(w/ MTP)" (25.11: the
#: preset's multi-token prediction layer). "(w/o MTP)" (:data:`MTP_OFF_SUFFIX`) removes it.
BRIDGE_PRESET_LABELS = ("(dropless)", "(w/ MTP)", MTP_OFF_SUFFIX)


def _bridge_model_name(name: str) -> str:
    """A Megatron-Bridge model name without the labels of :data:`BRIDGE_PRESET_LABELS`."""
    for label in BRIDGE_PRESET_LABELS:
        name = name.replace(label, "")
    return name.strip()


#: Megatron-Bridge model names as model presets; other names (a token-dropping variant such
#: as "Qwen3_30B_a3B (tokendrop)", a model without a preset) are skipped and listed.
BRIDGE_MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b",
                 "LLAMA3.1_405B": "llama3.1-405b", "Qwen3_30B_a3B": "qwen3-30b-a3b",
                 "Qwen3_235B_a22B": "qwen3-235b-a22b",
                 "GPT OSS 120B": "gpt-oss-120b", "DeepSeekV3": "deepseek-v3"}


#: The recipe settings behind each Megatron-Bridge row (``megatron_bridge_recipes.csv``:
#: read from each release's launcher code at its commit, every value with its file:line).
BRIDGE_RECIPES_TABLE = "megatron_bridge_recipes.csv"
#: A row's plan precision as the recipe table's ``compute_dtype``.
BRIDGE_COMPUTE_DTYPES = {"fp8": "fp8_cs", "mxfp8": "fp8_mx", "bf16": "bf16"}
#: Megatron's dtype names in the table as plan dtypes.
_TORCH_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "uint8": "fp8"}


def bridge_recipes() -> dict[tuple, dict[str, str]]:
    """The recipe table's rows by ``(release, model label, system, precision cell,
    compute_dtype)``."""
    return {(r["release"], r["model"], r["system"], r["precision"], r["compute_dtype"]): r
            for r in read_table(published_path(BRIDGE_RECIPES_TABLE))}


def _words(cell: str) -> str:
    """A printed list (``['mla_up_proj','mlp']``) as comma-separated words."""
    return ",".join(w for w in cell.strip("[]").replace("'", "").replace('"', "")
                    .replace(" ", "").split(",") if w)


def bridge_recipe_fields(rec: dict[str, str], precision: str,
                         model: ModelSpec) -> tuple[dict, str | None, list[str]]:
    """The plan fields a recipe row sets, why a row is outside what plans model (or None)
    and what the plan leaves unpriced: ``(fields, unmodelled, notes)``. CPU offloading of
    whole layers becomes ``cpu_offloading_num_layers``; a block recompute of some layers is
    not a plan field; the paged stash of full-iteration graphs and the parameter all-gather
    overlapped with the optimizer step run unpriced."""
    def on(key):
        return rec.get(key, "").startswith("True")

    if rec.get("recompute_method"):
        return {}, (f"recompute {rec['recompute_granularity']} of "
                    f"{rec['recompute_num_layers']} layers by {rec['recompute_method']} is not "
                    f"a plan field"), []
    f: dict = {}
    if on("cpu_offloading"):
        f["cpu_offloading_num_layers"] = int(rec["cpu_offloading_num_layers"])
    modules = _words(rec["recompute_modules"])
    if rec["recompute_granularity"] == "selective" and modules:
        f.update(recompute="selective", recompute_modules=modules)
    elif rec["recompute_granularity"] == "full":
        f.update(recompute="full")
    if model.is_moe:
        dispatcher = rec["moe_token_dispatcher_type"]
        f["moe_token_dispatcher_type"] = "flex" if dispatcher == "flex" else "alltoall"
        if dispatcher == "flex":
            f["moe_flex_dispatcher_backend"] = rec["moe_flex_dispatcher_backend"] or "deepep"
        f.update(overlap_moe_expert_parallel_comm=on("overlap_moe_expert_parallel_comm"),
                 delay_wgrad_compute=on("delay_wgrad_compute"),
                 moe_permute_fusion=on("moe_permute_fusion"),
                 moe_router_fusion=on("moe_router_fusion"),
                 moe_router_force_load_balancing=on("moe_router_force_load_balancing"))
        if rec["moe_expert_capacity_factor"]:
            f.update(moe_expert_capacity_factor=float(rec["moe_expert_capacity_factor"]),
                     moe_pad_expert_input_to_capacity=on("moe_pad_expert_input_to_capacity"))
    impl, scope = rec["cuda_graph_impl"], _words(rec["cuda_graph_scope"])
    if impl == "full_iteration" or (impl == "local" and "full_iteration" in scope):
        f.update(cuda_graph_impl="local", cuda_graph_scope="full_iteration")
    elif impl == "transformer_engine":
        f.update(cuda_graph_impl="transformer_engine",
                 cuda_graph_scope="" if scope == "full" else scope)
    if on("use_precision_aware_optimizer"):
        f["use_precision_aware_optimizer"] = True
        for key in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                    "exp_avg_sq_dtype"):
            if rec[key]:
                f[key] = _TORCH_DTYPE[rec[key]]
    if precision == "fp8":
        recipe = rec["fp8_recipe"].split()[0] if rec["fp8_recipe"] else "tensorwise"
        f["fp8_recipe"] = recipe if recipe in ("delayed", "tensorwise", "blockwise") else (
            "tensorwise")
    f["fp8_param_gather"] = on("fp8_param_gather")
    f["fp8_dot_product_attention"] = on("fp8_dot_product_attention") and precision == "fp8"
    f["tp_comm_overlap"] = rec["tp_comm_overlap"] == "True"
    if on("use_megatron_fsdp"):
        f["megatron_fsdp"] = True
    if on("use_transformer_engine_op_fuser") and model.is_moe:
        f["moe_fused_grouped_mlp"] = True
    notes = [name for key, name in (
        ("moe_paged_stash", "the paged stash"),
        ("fp8_dot_product_attention", "FP8 attention under MXFP8")) if on(key) and not (
            key == "fp8_dot_product_attention" and precision == "fp8")]
    return f, None, notes


#: Decoder layers per virtual stage of Megatron-Bridge's DeepSeek-V3 pipeline layouts, by
#: the number of virtual stages pp·vp (the embedding on the first stage, the MTP layer and
#: the loss on the last): ``recipes/deepseek/deepseek_v3.py``
#: ``set_deepseek_v3_pipeline_model_parallel_layout`` (4, 8 and 16 stages, unchanged from
#: v0.2.0 to v0.5.0; its performance configurations' ``pp_layout`` "Et*4|(t*4|)*14tmL" is
#: the same 16 stages) and the H100 configuration's ``pp_layout`` "Et|(tt|)*30mL" (32).
BRIDGE_DEEPSEEK_V3_STAGES = {4: (16, 16, 16, 13), 8: (8,) * 7 + (5,), 16: (4,) * 15 + (1,),
                             32: (1,) + (2,) * 30 + (0,)}


def bridge_layout(model: ModelSpec, stages: int) -> str:
    """The pipeline layout a Megatron-Bridge recipe gives ``model`` on ``stages`` virtual
    stages where its layers split neither evenly nor with the embedding and loss accounted
    (:data:`BRIDGE_DEEPSEEK_V3_STAGES`), or "" (none published)."""
    counts = BRIDGE_DEEPSEEK_V3_STAGES.get(stages) if model.name == "deepseek-v3" else None
    return format_layout(counts, model.mtp_num_layers or 0) if counts else ""


def _bridge_precision(text: str) -> str:
    """The row's precision as a plan precision: the first one named (FP8-CS and the
    unstated 25.09 rows, FP8 implied by the page notes, are fp8 with current scaling)."""
    head = text.split("(")[0].strip().upper()
    if head.startswith(("MXFP8", "FP8-MX")):
        return "mxfp8"
    if head.startswith(("FP8", "UNSTATED")):
        return "fp8"
    return "bf16"


@dataclass(frozen=True)
class BridgeRow:
    """One Megatron-Bridge pre-training row: the plan as published (etp 1, no recompute,
    the distributed optimizer; an FSDP row (``fsdp`` > 0) with Megatron FSDP over dp·cp
    (``megatron_fsdp``; a group of another size is skipped);
    the embedding and loss counted in the pipeline split where the layers do not divide, or
    where that does not split them either, the recipe's pipeline layout (:func:`bridge_layout`);
    ``fp8_param_gather`` with ``fp8`` and ``mxfp8``, as Megatron-Bridge's FP8 and MXFP8
    mixed-precision presets set it (``bridge/training/mixed_precision.py``
    ``bf16_with_fp8_*_mixed``, ``bf16_with_mxfp8_mixed``, since October 2025);
    ``grad_reduce_in_bf16``,
    as every Megatron-Bridge performance recipe sets ``grad_reduce_in_fp32=False`` since its
    first, August 2025: ``scripts/performance`` then, ``perf_recipes/_common.py``
    ``_benchmark_common`` now), Transformer Engine's cross entropy (``cross_entropy_fusion``
    ``te``: the model providers' ``cross_entropy_loss_fusion=True`` with the performance
    configurations' ``cross_entropy_fusion_impl: "te"``, also since August 2025), the cluster
    preset and the published tokens/s/GPU (the first figure of the row)."""

    release: str
    model: ModelSpec
    cluster: str
    nodes: int
    plan: ParallelPlan
    tokens_per_s_per_gpu: float
    #: the row's citation (the table's ``source`` column)
    source: str = ""

    @property
    def published_iteration_time_s(self) -> float:
        """``T = gbs·seq / (tokens/s/GPU · GPUs)``."""
        return (self.plan.global_batch_size * self.model.seq_length
                / (self.tokens_per_s_per_gpu * self.plan.world_size))


def bridge_rows(path: Path | None = None) -> tuple[list[BridgeRow], list[str]]:
    """Rows of the Megatron-Bridge table (:data:`BRIDGE_TABLE`) we can price, each plan with
    its recipe's settings (:data:`BRIDGE_RECIPES_TABLE`, :func:`bridge_recipe_fields`; a row
    the recipe table does not hold keeps Megatron's defaults), and why the others are not (a
    system or model without a preset, NVFP4, a recipe setting no plan field has)."""
    rows = read_table(path or published_path(BRIDGE_TABLE))
    recipes = bridge_recipes()
    out, skipped = [], []
    for r in rows:
        key = f"{r['release']} {r['model']} {r['system']} {r['precision'][:12]}"
        label = r["model"]
        if r["system"] not in BRIDGE_SYSTEMS:
            skipped.append(f"{key}: no {r['system']} preset")
            continue
        # "DeepSeekV3 (w/o MTP)": the same model trained without its MTP layer
        without_mtp = MTP_OFF_SUFFIX in r["model"]
        r = dict(r, model=_bridge_model_name(r["model"]))
        if r["precision"].upper().startswith("NVFP4"):
            skipped.append(f"{key}: NVFP4 (no plan precision prices 4-bit GEMMs)")
            continue
        r = dict(r, model=r["model"].replace("(tokendrop)", "").strip())
        if r["model"] not in BRIDGE_MODELS:
            skipped.append(f"{key}: no model preset for {r['model']}")
            continue
        cluster = BRIDGE_SYSTEMS[r["system"]]
        gpus_per_host = CLUSTER_PRESETS[cluster]["gpus_per_node"]
        # a cell "a (b)" gives the plan of the first figure and an alternative's
        first = {k: r[k].split("(")[0].strip() for k in _BRIDGE_PLAN_COLUMNS}
        try:
            # a dense model's ep (and a page's unused cp) reads "n/a": 1
            n, seq, tp, pp, cp, ep, mbs, gbs = (1 if first[k] == "n/a" else int(first[k])
                                                for k in ("num_gpus", "seq_len", "tp", "pp",
                                                          "cp", "ep", "mbs", "gbs"))
            fsdp = int(first["fsdp"] or 0)
            vp = 1 if first["vp"] in ("n/a", "") else int(first["vp"])
        except ValueError as exc:
            skipped.append(f"{key}: unreadable plan ({exc})")
            continue
        if fsdp and fsdp != n // (tp * pp):
            skipped.append(f"{key}: FSDP group {r['fsdp']} is not dp*cp ({n // (tp * pp)})")
            continue
        model = MODEL_PRESETS[BRIDGE_MODELS[r["model"]]].with_seq_length(seq)
        if without_mtp and model.mtp_num_layers:
            model = dataclasses.replace(model, mtp_num_layers=None)
        # layers that do not split evenly: the embedding and the loss count as one layer
        # each, as Megatron-Bridge's Llama-3.1 405B recipes set
        accounted = model.num_layers % (pp * vp) != 0
        # nor that way: the recipe's pipeline layout (DeepSeek-V3's 61 layers)
        layout = "" if (model.num_layers + 2) % (pp * vp) == 0 else bridge_layout(
            model, pp * vp)
        accounted = accounted and not layout
        # an alternative in a plan column ran another plan: only the first figure is read
        same_plan = not any("(" in r[k] for k in _BRIDGE_PLAN_COLUMNS)
        for precision, tokens in _bridge_figures(r["precision"], r["tokens_per_sec_per_gpu"],
                                                 same_plan):
            rec = recipes.get((r["release"], label, r["system"], r["precision"],
                               BRIDGE_COMPUTE_DTYPES[precision]))
            if rec is None:       # a row the recipe table does not hold: Megatron's defaults
                fields, unmodelled, notes = {}, None, ["no recipe settings"]
                rec = {"commit_ref": "unknown"}
            else:
                fields, unmodelled, notes = bridge_recipe_fields(rec, precision, model)
            if fields.get("cpu_offloading_num_layers") and pp > 1:
                # Megatron offloads layers at pp 1 only: the recipe's plan, not the page's
                unmodelled = (f"the recipe offloads {fields['cpu_offloading_num_layers']} "
                              f"layers at pp 1; the page's plan has pp {pp}")
            if unmodelled:
                skipped.append(f"{key} {precision}: {unmodelled}")
                continue
            plan = ParallelPlan(**(dict(
                tp=tp, pp=pp, cp=cp, dp=n // (tp * pp * cp), vp=vp,
                account_for_embedding_in_pipeline_split=accounted,
                account_for_loss_in_pipeline_split=accounted,
                pipeline_model_parallel_layout=layout,
                ep=ep if model.is_moe else 1, etp=1,
                micro_batch_size=mbs, global_batch_size=gbs, sequence_parallel=tp > 1,
                distributed_optimizer=True, precision=precision,
                grad_reduce_in_bf16=True, cross_entropy_fusion="te",
                megatron_fsdp=fsdp > 0) | fields))
            note = f"; not priced: {', '.join(notes)}" if notes else ""
            out.append(BridgeRow(r["release"], model, cluster, n // gpus_per_host, plan,
                                 tokens, f"{r['source']}, {r['release']} {r['section']}: "
                                         f"{r['model']} {r['system']} {r['precision']} row; "
                                         f"recipe {rec['commit_ref']}{note}"))
    return out, skipped


_BRIDGE_PLAN_COLUMNS = ("num_gpus", "seq_len", "tp", "pp", "cp", "vp", "ep", "mbs", "gbs",
                        "fsdp")


def _bridge_figures(precision: str, tokens: str,
                    same_plan: bool = True) -> list[tuple[str, float]]:
    """``(plan precision, tokens/s/GPU)`` of a row: the first figure in the first precision
    and, where the row names its alternative ``FP8-CS (FP8-MX)`` with one plan
    (``same_plan``), the parenthesised figure as an MXFP8 run of that plan (the page ran
    the plan in both recipes). Other parenthesised figures (25.09's unnamed "finer-grained
    quantization") are not read."""
    out = [(_bridge_precision(precision), float(tokens.split("(")[0]))]
    if same_plan and "(FP8-MX)" in precision.upper() and "(" in tokens:
        out.append(("mxfp8", float(tokens.split("(")[1].rstrip(")"))))
    return out


def published_group(gpu: str, precision: str) -> str:
    """Statistics group of a published run: ``A100``; ``H100 bf16`` / ``H100 fp8`` (H100 and
    H200, 16-bit or FP8 GEMMs); ``Blackwell`` (B200, B300, GB200, GB300, any precision)."""
    if gpu.startswith("a100"):
        return "A100"
    if gpu.startswith(("h100", "h200")):
        return "H100 fp8" if precision in ("fp8", "mxfp8") else "H100 bf16"
    if gpu.startswith(("b200", "gb200", "gb300", "b300")):
        return "Blackwell"
    return f"{gpu} {precision}"


#: The collections the published runs come from (``MeasuredRun.dataset``), by table.
DATASETS = {SC21_TABLE: "SC'21 Table 1", KORTHIKANTI_TIMES_TABLE: "Korthikanti Table 5",
            MEGATRON_LM_TABLE: "Megatron-LM H100 table", NEMO_CP_TABLE: "NeMo long context",
            NEMO_SUMMARY_TABLE: "NeMo performance summary", BRIDGE_TABLE: "Megatron-Bridge"}


def _run(name, source, model, cluster, plan, table, seq=None, **measured) -> MeasuredRun:
    gpu = CLUSTER_PRESETS[cluster]["gpu"]
    return MeasuredRun(name=name, group=published_group(gpu, plan.precision),
                       source=source, model=model, cluster=cluster, num_gpus=plan.world_size,
                       seq_length=seq, plan=plan, dataset=DATASETS[table], **measured)


def sc21_runs() -> list[MeasuredRun]:
    """SC'21 Table 1 rows (:func:`sc21_rows`) as runs: TFLOP/s counted the SC'21 way."""
    return [_run(f"sc21 {r.model.name} {r.num_gpus} GPUs", r.source,
                 r.model.name, "dgx-a100-80gb", r.plan, SC21_TABLE,
                 tflops_per_gpu=r.published_tflops_per_gpu, flops_formula="sc21")
            for r in sc21_rows()]


def nemo_cp_runs(path: Path | None = None) -> list[MeasuredRun]:
    """NeMo's long-context runs with context parallelism (``nemo_long_sequence_cp.csv``, the
    "with CP" columns: tp, pp, dp, cp given) as FP8 runs: micro batch 1, sequence
    parallelism with tp > 1, the distributed optimizer, no recompute (none is stated), FP8
    weights gathered in FP8 (NeMo's ``bf16_with_fp8_mixed`` preset sets ``fp8_params``,
    nemo/collections/llm/recipes/precision/mixed_precision.py).
    TFLOP/s counted over all ``s²`` attention scores (``megatron-full-attention``): NeMo's
    ``flops_formulas`` (nemo/utils/flops_formulas.py) discount causal attention only from
    commit 6251117 ("Discount FLOPs in dot-product att", 2025-08-09), after both containers
    (24.03.01 and 25.04); NeMo 24.07's Llama-2 7B FP8 row (16,634 tokens/s/GPU, 767
    TFLOP/s) is 4.611e10 FLOP per token, the full-score count (4.608e10), not the causal
    one (4.286e10). The "without CP" column has no configuration, so it is not a run.
    The loss's cross entropy (``cross_entropy_fusion``): Megatron's jit-fused one in NeMo
    25.04 (the B200 rows; NeMo 2.0's ``GPTConfig.cross_entropy_loss_fusion = True`` since
    September 2024, nemo/collections/llm/gpt/model/base.py, Megatron's default ``native``
    implementation), the eager one in 24.03.01 (the H100 rows; megatron-core had no fused
    cross entropy before 0.8, June 2024)."""
    rows = read_table(path or published_path(NEMO_CP_TABLE))
    models = {"LLAMA2-7B": "llama2-7b", "LLAMA3-8B": "llama3-8b"}
    systems = {"DGX-H100": "dgx-h100-80gb", "DGX-B200": "dgx-b200-180gb"}
    cross_entropy = {"DGX-H100": "none", "DGX-B200": "native"}    # NeMo 24.03.01, 25.04
    out = []
    for r in rows:
        seq = int(r["seq_len_k"]) * 1024
        tp, pp, dp, cp = (int(r[k]) for k in ("tp", "pp", "dp", "cp"))
        plan = ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch_size=1,
                            global_batch_size=int(r["batch_size"]), sequence_parallel=tp > 1,
                            distributed_optimizer=dp * cp > 1, precision="fp8",
                            fp8_param_gather=True,
                            cross_entropy_fusion=cross_entropy[r["system"]])
        out.append(_run(f"nemo {r['model']} {r['system']} {r['seq_len_k']}k",
                        r["source"], models[r["model"]],
                        systems[r["system"]], plan, NEMO_CP_TABLE, seq=seq,
                        tflops_per_gpu=float(r["tflops_per_gpu_with_cp"]),
                        flops_formula="megatron-full-attention"))
    return out


def gpt_model(name: str, heads: int, hidden: int, layers: int, *, vocab: int = 51200,
              seq: int = 2048, untied: bool = False) -> ModelSpec:
    """A GPT model of the shape a paper's table gives (heads, hidden size, layers): the
    ``gpt3-175b`` preset's architecture (4h GeLU MLP with biases, LayerNorm, learned
    positions, dropout 0.1) with that shape, vocabulary, sequence length and, with
    ``untied``, an output layer of its own."""
    return dataclasses.replace(MODEL_PRESETS["gpt3-175b"], name=name, num_layers=layers,
                               hidden_size=hidden, ffn_hidden_size=4 * hidden,
                               num_attention_heads=heads, num_query_groups=heads,
                               kv_channels=hidden // heads, vocab_size=vocab, seq_length=seq,
                               untie_embeddings_and_output_weights=untied)


def korthikanti_runs() -> list[MeasuredRun]:
    """Korthikanti et al. 2022 (arXiv:2205.05198) Table 5: the iteration time of the Table 3
    configurations (``korthikanti_table3.csv``: 22B, 175B, 530B, 1T on 8-512 A100, no data
    parallelism; 3 model chunks for 175B and 530B) with full recompute and with the paper's
    method, selective recompute and sequence parallelism (``korthikanti_table5.csv``).
    Megatron-LM of 2022: fp16, the attention scores stored (``local``), no distributed
    optimizer (dp = 1); sequence 2048, vocabulary 51,200 (§6)."""
    configs = {r["model_size"].split()[0]: r for r in read_table(published_path(
        KORTHIKANTI_TABLE))}
    out = []
    for r in read_table(published_path(KORTHIKANTI_TIMES_TABLE)):
        cfg = configs[r["model_size"]]
        tp, pp, gpus = int(cfg["tp"]), int(cfg["pp"]), int(cfg["num_gpus"])
        selective = r["recompute"] == "selective"
        plan = ParallelPlan(tp=tp, pp=pp, dp=gpus // (tp * pp),
                            vp=int(cfg["interleave_chunks"] or 1),
                            micro_batch_size=int(cfg["micro_batch_size"]),
                            global_batch_size=int(cfg["global_batch_size"]), precision="fp16",
                            recompute=r["recompute"], sequence_parallel=selective,
                            attention_backend="local", distributed_optimizer=False,
                            overlap_grad_reduce=False, overlap_param_gather=False)
        model = gpt_model(f"gpt-{r['model_size'].lower()}", int(cfg["attention_heads"]),
                          int(cfg["hidden_size"]), int(cfg["num_layers"]))
        out.append(_run(f"korthikanti {r['model_size']} {r['recompute']} recompute",
                        r["source"], model, "dgx-a100-80gb", plan, KORTHIKANTI_TIMES_TABLE,
                        iteration_time_s=float(r["iteration_time_s"])))
    return out


def megatron_lm_runs() -> list[MeasuredRun]:
    """Megatron-LM's H100 weak-scaling table (README "Training Speed and Scalability",
    ``images/model_table.png``, Megatron-Core r0.8.0, ``megatron_lm_h100_table.csv``): GPT
    models of 1.7B-462B (vocabulary 131,072, sequence 4096; untied output layers, as the
    parameter counts the table names imply) on 48-6,144 H100, dp 48. The README's flags:
    ``--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap`` (hence sequence
    parallelism and the distributed optimizer, which those flags require). Not published,
    so the plan takes Megatron's defaults: BF16 (the table's MFU is against the BF16 peak),
    micro batch 1, no interleaving, no recompute. TFLOP/s counted by Megatron-LM's
    ``num_floating_point_operations`` of 2024, over all ``s²`` attention scores."""
    out = []
    for r in read_table(published_path(MEGATRON_LM_TABLE)):
        tp, pp, dp = int(r["tp"]), int(r["pp"]), int(r["dp"])
        model = gpt_model(f"gpt-{r['model_size'].lower()}", int(r["attention_heads"]),
                          int(r["hidden_size"]), int(r["num_layers"]),
                          vocab=int(r["vocab_size"]), seq=int(r["seq_len"]), untied=True)
        plan = ParallelPlan(tp=tp, pp=pp, dp=dp, micro_batch_size=1,
                            global_batch_size=int(r["global_batch_size"]), precision="bf16",
                            sequence_parallel=tp > 1, tp_comm_overlap=tp > 1,
                            distributed_optimizer=True)
        out.append(_run(f"megatron-lm {r['model_size']} {r['num_gpus']} H100", r["source"],
                        model, "dgx-h100-80gb", plan, MEGATRON_LM_TABLE,
                        tflops_per_gpu=float(r["tflops_per_gpu"]),
                        flops_formula="megatron-full-attention"))
    return out


#: NeMo performance-summary systems and models as presets (the others are skipped).
NEMO_SYSTEMS = {"DGX-H100": "dgx-h100-80gb", "DGX-B200": "dgx-b200-180gb",
                "DGX-GB200": "gb200-nvl72"}


def nemo_summary_runs() -> tuple[list[MeasuredRun], list[str]]:
    """NeMo's performance summary (``nemo_perf_summary.csv``): the pre-training rows of NeMo
    24.07 on DGX H100 (the file's last revision; earlier revisions of the same table are
    skipped) and the rows of 25.02-25.07 on B200 and GB200 that were readable, FP8, each
    row's plan as published (the first plan and figure of a cell with an alternative).
    NeMo's performance recipes: sequence parallelism and Transformer Engine's tensor-parallel
    overlap with tp > 1 (``tp_comm_overlap``), the distributed optimizer, FP8 weights
    gathered in FP8 (NeMo's ``fp8_params``), Megatron FSDP where the FSDP column reads 1;
    the cross entropy fused from NeMo 2.0 (25.02 on; ``GPTConfig.cross_entropy_loss_fusion``),
    eager before; FP8 with current per-tensor scaling from 25.02 on (``fp8_recipe``
    tensorwise: the 25.0x pages "apply per-tensor FP8 quantization, leveraging scaling
    factors computed in the current step"), delayed scaling in 24.07 (Transformer Engine's
    default recipe then); MoE models' tokens dropped and padded to capacity 1.0 (the performance
    scripts call the recipe with ``performance_mode=True``,
    scripts/performance/llm/pretrain_mixtral_8x7b.py, whose
    ``pretrain_performance_optimizations`` in nemo/collections/llm/recipes/mixtral_8x7b.py
    adds ``MegatronTokenDropCallback``: ``moe_expert_capacity_factor=1.0``,
    ``moe_pad_expert_input_to_capacity=True``); the layers whose activations a recipe
    offloads to host memory from the table's ``activation_offload_layers`` (its header says
    where each comes from). Priced from the published tokens/s/GPU."""
    out, skipped = [], []
    for r in read_table(published_path(NEMO_SUMMARY_TABLE)):
        key = f"nemo {r['release']} {r['model']} {r['system']} {r['num_gpus']}"
        if r["revision_status"].startswith("superseded"):
            skipped.append(f"{key}: superseded revision of the table")
            continue
        if r["preset"] not in MODEL_PRESETS or r["system"] not in NEMO_SYSTEMS:
            skipped.append(f"{key}: no preset for {r['model']} or {r['system']}")
            continue
        first = {k: r[k].split("(")[0].strip() for k in (
            "num_gpus", "gbs", "mbs", "seq_len", "tp", "pp", "cp", "vp", "ep", "fsdp",
            "tokens_per_sec_per_gpu")}
        n, gbs, mbs, seq, tp, pp, cp, vp, ep = (
            1 if first[k] in ("n/a", "") else int(first[k])
            for k in ("num_gpus", "gbs", "mbs", "seq_len", "tp", "pp", "cp", "vp", "ep"))
        model = MODEL_PRESETS[r["preset"]].with_seq_length(seq)
        fsdp = first["fsdp"] == "1"
        plan = ParallelPlan(tp=tp, pp=pp, cp=cp, dp=n // (tp * pp * cp), vp=vp,
                            ep=ep if model.is_moe else 1, micro_batch_size=mbs,
                            global_batch_size=gbs, sequence_parallel=tp > 1,
                            tp_comm_overlap=tp > 1, distributed_optimizer=True,
                            precision="fp8", fp8_param_gather=True, megatron_fsdp=fsdp,
                            fp8_recipe="delayed" if r["release"] == "24.07" else "tensorwise",
                            cross_entropy_fusion="none" if r["release"] == "24.07"
                            else "native",
                            moe_expert_capacity_factor=1.0 if model.is_moe else 0.0,
                            moe_pad_expert_input_to_capacity=model.is_moe,
                            cpu_offloading_num_layers=int(r["activation_offload_layers"]))
        try:    # the layer split is validate's to choose (best_layer_split), not checked
            check_plan(model, plan, n, only=("global batch divisible by mbs*dp",))
        except InputError as exc:
            # typed as published: the 25.0x Mixtral-8x22B rows read GBS 1 / MBS 64, which no
            # dp divides (their GA column, 16, fits the swap, 64 = 1 * 4 * 16); a guess is not
            # priced
            skipped.append(f"{key}: as published, {exc}")
            continue
        out.append(_run(key, r["source"], model, NEMO_SYSTEMS[r["system"]], plan,
                        NEMO_SUMMARY_TABLE, seq=seq,
                        tokens_per_s_per_gpu=float(first["tokens_per_sec_per_gpu"])))
    return out, skipped


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split(".") if x.isdigit())


def bridge_runs(newest_only: bool = True) -> tuple[list[MeasuredRun], list[str]]:
    """Megatron-Bridge rows (:func:`bridge_rows`) as runs, and the skipped rows' reasons.

    ``newest_only``: of the rows of one recipe family (model, system and precision) keep
    the newest release's: the figure of one configuration moves by up to 1.8× between
    releases as the software improves (Qwen3-30B-A3B on 16 H100 in FP8, tp 1 pp 2 vp 12 ep 8:
    51.3 s in 26.02, 28.9 s in 26.02.01), more than the recipe settings the plans carry
    explain; the 25.11 GB200/GB300 rows were replaced on the page by plans no public recipe
    of the time holds; and the cost model describes today's Megatron-Core. A release that
    publishes several plans of a family keeps them all."""
    rows, skipped = bridge_rows()
    if newest_only:
        def family(r):
            return (r.model.name, r.cluster, r.plan.precision)
        latest: dict = {}
        for r in rows:
            k = family(r)
            if k not in latest or _release_key(r.release) > _release_key(latest[k]):
                latest[k] = r.release

        def key(r):
            return family(r)
        kept = [r for r in rows if r.release == latest[key(r)]]
        skipped = skipped + [f"{r.release} {r.model.name} {r.cluster} {r.plan.precision}: "
                             f"superseded by release {latest[key(r)]}"
                             for r in rows if r.release != latest[key(r)]]
        rows = kept
    return [_run(f"bridge {r.release} {r.model.name} {r.cluster} {r.plan.precision} "
                 f"{r.plan.world_size}", r.source,
                 r.model, r.cluster, r.plan, BRIDGE_TABLE,
                 seq=r.model.seq_length, tokens_per_s_per_gpu=r.tokens_per_s_per_gpu)
            for r in rows], skipped



def published_runs() -> tuple[list[MeasuredRun], list[str]]:
    """Every published row we can price (:data:`DATASETS`) and why the others are
    skipped."""
    bridge, skipped = bridge_runs()
    nemo, nemo_skipped = nemo_summary_runs()
    return (sc21_runs() + korthikanti_runs() + megatron_lm_runs() + nemo_cp_runs() + nemo
            + bridge, nemo_skipped + skipped)
