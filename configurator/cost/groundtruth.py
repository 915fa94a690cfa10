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
from configurator.core.model import MODEL_PRESETS, ModelSpec
from configurator.core.plan import ParallelPlan, is_fp8
from configurator.core.runs import MeasuredRun
from configurator.data import PUBLISHED, data_path
from topology.cluster import CLUSTER_PRESETS

SC21_MODEL_NAMES = {"1.7": "gpt-1.7b", "3.6": "gpt-3.6b", "7.5": "gpt-7.5b",
                    "18.4": "gpt-18.4b", "39.1": "gpt-39.1b", "76.1": "gpt-76.1b",
                    "145.6": "gpt-145.6b", "310.1": "gpt-310.1b", "529.6": "gpt-529.6b",
                    "1008.0": "gpt-1t"}


#: The shipped tables (``configurator/data/published``), one per source.
SC21_TABLE, KORTHIKANTI_TABLE = "sc21_table1.csv", "korthikanti_table3.csv"
NEMO_CP_TABLE, BRIDGE_TABLE = "nemo_long_sequence_cp.csv", "megatron_bridge_perf.csv"


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
    the score matrix) and no gradient-reduce overlap (2021 Megatron reduced after backward)."""
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
                            overlap_grad_reduce=False, overlap_param_gather=False)
        out.append(SC21Row(model, plan, n, float(r["achieved_tflops_per_gpu"]), r["source"]))
    return out


#: Megatron-Bridge systems as cluster presets.
BRIDGE_SYSTEMS = {"DGX-H100": "dgx-h100-80gb", "DGX-B200": "dgx-b200-180gb",
                  "DGX-B300": "dgx-b300-288gb", "DGX-GB200": "gb200-nvl72",
                  "DGX-GB300": "gb300-nvl72"}
#: What a Megatron-Bridge model name adds for a run without multi-token prediction
#: ("DeepSeekV3 (w/o MTP)", 25.11): the preset with ``mtp_num_layers`` unset.
MTP_OFF_SUFFIX = "(w/o MTP)"
#: Megatron-Bridge model names as model presets; other names (a token-dropping variant such
#: as "Qwen3_30B_a3B (tokendrop)", a model without a preset) are skipped and listed.
BRIDGE_MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b",
                 "LLAMA3.1_405B": "llama3.1-405b", "Qwen3_30B_a3B": "qwen3-30b-a3b",
                 "Qwen3_235B_a22B": "qwen3-235b-a22b",
                 "GPT OSS 120B": "gpt-oss-120b", "DeepSeekV3": "deepseek-v3"}


#: Megatron-Bridge MoE recipes that run, from release 26.06 on GB200/GB300 in MXFP8, what no
#: plan field models: full-iteration CUDA graphs (no host issue time at all), the CuTe DSL
#: fused grouped MLP (Transformer Engine op fuser: fc1, activation, probabilities, clamp and
#: fc2 bias in the grouped GEMMs), the expert-parallel all-to-all overlapped with compute
#: (``moe_a2a_overlap``), HybridEP and FP8 attention. Bridge ``scripts/performance/configs``
#: commits 5f98743d5 "full-iter CG for GPT-OSS 120B" (2026-06-09), 55443cbfb "Enable Qwen3
#: GB200/GB300 MXFP8 CuTeDSL Fusion and Full-Iter CUDA Graphs" (2026-06-10), 8af195c0a and
#: afb5dd47c (DeepSeek-V3 GB300 / GB200 MXFP8 full-iteration CUDA graphs, 2026-06-06/10).
#: Their rows are skipped and listed, as token-dropping rows are.
BRIDGE_UNMODELLED_RECIPES = {"gpt-oss-120b": "5f98743d5", "qwen3-30b-a3b": "55443cbfb",
                             "deepseek-v3": "8af195c0a, afb5dd47c"}
BRIDGE_UNMODELLED_FROM = (26, 6)
BRIDGE_UNMODELLED_SYSTEMS = ("DGX-GB200", "DGX-GB300")


def bridge_recipe_unmodelled(release: str, model: str, system: str,
                             precision: str) -> str | None:
    """Why a Megatron-Bridge row's recipe is outside what plans model
    (:data:`BRIDGE_UNMODELLED_RECIPES`), or None."""
    commits = BRIDGE_UNMODELLED_RECIPES.get(model)
    if (commits is None or system not in BRIDGE_UNMODELLED_SYSTEMS
            or "MX" not in precision.upper() or _release_key(release) < BRIDGE_UNMODELLED_FROM):
        return None
    return (f"recipe runs full-iteration CUDA graphs, the fused grouped MLP, the all-to-all "
            f"overlap and FP8 attention, which no plan field models (Bridge {commits})")


#: Selective recompute of Megatron-Bridge's recipes, by model and system: GPT-OSS 120B on
#: H100, B200 and GB200 recomputes its norms and its experts' activation in every release
#: (``recompute_modules=["layernorm", "moe_act"]`` in ``scripts/performance/configs/gpt_oss``
#: from v0.2.0, 25.11, to 26.04, and in ``perf_recipes/gpt_oss`` since; its FP8 variants
#: alias the BF16 configurations); GB300 and B300 recompute nothing.
BRIDGE_RECOMPUTE_MODULES = {("gpt-oss-120b", "DGX-H100"): "layernorm,moe_act",
                            ("gpt-oss-120b", "DGX-B200"): "layernorm,moe_act",
                            ("gpt-oss-120b", "DGX-GB200"): "layernorm,moe_act"}


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
    """Rows of the Megatron-Bridge table (:data:`BRIDGE_TABLE`) we can price, and why the others
    are not (a system or model without a preset, a token-dropping variant, a recipe of
    :data:`BRIDGE_UNMODELLED_RECIPES`)."""
    rows = read_table(path or published_path(BRIDGE_TABLE))
    out, skipped = [], []
    for r in rows:
        key = f"{r['release']} {r['model']} {r['system']} {r['precision'][:12]}"
        if r["system"] not in BRIDGE_SYSTEMS:
            skipped.append(f"{key}: no {r['system']} preset")
            continue
        # "DeepSeekV3 (w/o MTP)": the same model trained without its MTP layer
        without_mtp = MTP_OFF_SUFFIX in r["model"]
        r = dict(r, model=r["model"].replace(MTP_OFF_SUFFIX, "").strip())
        if r["model"] not in BRIDGE_MODELS:
            why = ("token-dropping routing (not dropless)" if "tokendrop" in r["model"].lower()
                   else f"no model preset for {r['model']}")
            skipped.append(f"{key}: {why}")
            continue
        unmodelled = bridge_recipe_unmodelled(r["release"], BRIDGE_MODELS[r["model"]],
                                              r["system"], r["precision"])
        if unmodelled:
            skipped.append(f"{key}: {unmodelled}")
            continue
        cluster = BRIDGE_SYSTEMS[r["system"]]
        gpus_per_host = CLUSTER_PRESETS[cluster]["gpus_per_node"]
        # a cell "a (b)" gives the plan of the first figure and an alternative's
        first = {k: r[k].split("(")[0].strip() for k in _BRIDGE_PLAN_COLUMNS}
        try:
            n, seq, tp, pp, cp, ep, mbs, gbs = (int(first[k]) for k in (
                "num_gpus", "seq_len", "tp", "pp", "cp", "ep", "mbs", "gbs"))
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
        modules = BRIDGE_RECOMPUTE_MODULES.get((model.name, r["system"]))
        recompute = dict(recompute="selective", recompute_modules=modules) if modules else {}
        for precision, tokens in _bridge_figures(r["precision"], r["tokens_per_sec_per_gpu"],
                                                 same_plan):
            plan = ParallelPlan(tp=tp, pp=pp, cp=cp, dp=n // (tp * pp * cp), vp=vp,
                                account_for_embedding_in_pipeline_split=accounted,
                                account_for_loss_in_pipeline_split=accounted,
                                pipeline_model_parallel_layout=layout,
                                ep=ep if model.is_moe else 1, etp=1,
                                micro_batch_size=mbs, global_batch_size=gbs,
                                sequence_parallel=tp > 1,
                                distributed_optimizer=True, precision=precision,
                                fp8_param_gather=is_fp8(precision),
                                grad_reduce_in_bf16=True, cross_entropy_fusion="te",
                                megatron_fsdp=fsdp > 0, **recompute)
            out.append(BridgeRow(r["release"], model, cluster, n // gpus_per_host, plan,
                                 tokens, f"{r['source']}, {r['release']} {r['section']}: "
                                         f"{r['model']} {r['system']} {r['precision']} row"))
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
DATASETS = {SC21_TABLE: "SC'21 Table 1", NEMO_CP_TABLE: "NeMo long context",
            BRIDGE_TABLE: "Megatron-Bridge"}


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


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split(".") if x.isdigit())


def bridge_runs(newest_only: bool = True) -> tuple[list[MeasuredRun], list[str]]:
    """Megatron-Bridge rows (:func:`bridge_rows`) as runs, and the skipped rows' reasons.

    ``newest_only``: of the rows that publish the same configuration (model, system,
    precision, plan) in several releases keep the newest release's: the figure of one
    configuration moves by up to 1.6× between releases as the software improves, and the
    cost model describes today's software."""
    rows, skipped = bridge_rows()
    if newest_only:
        newest: dict = {}
        for r in rows:
            key = (r.model.name, r.cluster, r.plan)
            if key not in newest or _release_key(r.release) > _release_key(newest[key].release):
                newest[key] = r
        kept = [r for r in rows if newest[(r.model.name, r.cluster, r.plan)] is r]
        skipped = skipped + [f"{r.release} {r.model.name} {r.cluster} {r.plan.precision}: "
                             f"superseded by release {newest[(r.model.name, r.cluster, r.plan)].release}"
                             for r in rows if newest[(r.model.name, r.cluster, r.plan)] is not r]
        rows = kept
    return [_run(f"bridge {r.release} {r.model.name} {r.cluster} {r.plan.precision} "
                 f"{r.plan.world_size}", r.source,
                 r.model, r.cluster, r.plan, BRIDGE_TABLE,
                 seq=r.model.seq_length, tokens_per_s_per_gpu=r.tokens_per_s_per_gpu)
            for r in rows], skipped



def published_runs() -> tuple[list[MeasuredRun], list[str]]:
    """Every published row we can price (SC'21, NeMo long context, Megatron-Bridge) and why
    the others are skipped."""
    bridge, skipped = bridge_runs()
    return sc21_runs() + nemo_cp_runs() + bridge, skipped
