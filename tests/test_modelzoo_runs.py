"""The held-out runs of NVIDIA's Megatron-Core MoE team (the Model Zoo's
``tests/data/modelzoo_qwen3.csv`` and the DeepSeek-V3 GB200 optimisation history
``tests/data/dsv3_gb200_history.csv``, read by ``bench.accuracy.modelzoo``) stay readable and
priceable: every row a valid run of the run-file schema, with a citation, priced without an
input problem, and none of them among the published runs a fit sees."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from configurator.app.validate_jobs import validate_runs
from configurator.core.model_presets import MODEL_PRESETS, load_model
from configurator.core.runs import load_runs
from configurator.cost.flops import megatron_model_flops
from configurator.cost.groundtruth import published_runs

PATH = Path(__file__).parent / "data" / "modelzoo_qwen3.csv"
HISTORY = PATH.with_name("dsv3_gb200_history.csv")
MIXTRAL = PATH.with_name("modelzoo_mixtral.csv")


def test_every_modelzoo_row_is_a_cited_run_the_model_prices():
    runs = load_runs(str(PATH))
    assert len(runs) == 17
    assert all("Megatron-MoE-ModelZoo" in r.source for r in runs)
    report = validate_runs(runs)
    assert [c.problem for c in report.checks] == [None] * len(runs)
    assert all(c.predicted_iteration_time_s > 0 and c.measured_iteration_time_s > 0
               for c in report.checks)
    # the long-context table's two routings are one plan apart only
    forced = {r.seq_length: r.plan for r in runs if r.name.endswith("forced")}
    dropless = {r.seq_length: r.plan for r in runs if r.name.endswith("dropless")}
    assert forced.keys() == dropless.keys() and len(forced) == 4
    for s, plan in forced.items():
        assert plan.moe_router_force_load_balancing
        assert dataclasses.replace(plan, moe_router_force_load_balancing=False) == dropless[s]


@pytest.mark.parametrize("path", [PATH, HISTORY, MIXTRAL],
                         ids=["modelzoo", "dsv3-history", "mixtral-twins"])
def test_the_modelzoo_runs_are_held_out_of_every_fit(path):
    dataset = load_runs(str(path))[0].dataset
    published, _ = published_runs()
    assert not any("ModelZoo" in (r.source or "") or "deepseek-v3-gb200-optimization"
                   in (r.source or "") or r.dataset == dataset for r in published)


#: What each step of the history changes in the plan (section 3's table; the steps not
#: listed change software only).
HISTORY_CHANGES = {3: {"moe_router_fusion"},
                   4: {"moe_token_dispatcher_type"},
                   5: {"recompute_modules"},
                   6: {"cuda_graph_impl", "cuda_graph_scope"},
                   11: {"moe_flex_dispatcher_backend"},
                   13: {"cross_entropy_fusion"}}


def test_the_mixtral_twins_are_one_plan_apart_and_cited():
    """Mixtral 8x22B's forced and dropless runs (the twins that set the spread of routers
    that even every batch): cited, priced without a problem, their plans equal but for the
    forced balance, and 465 and 445 TFLOP/s as published."""
    forced, dropless = load_runs(str(MIXTRAL))
    assert all("run_mixtral_8x22B.sh@31942f0" in r.source for r in (forced, dropless))
    assert dataclasses.replace(forced.plan, moe_router_force_load_balancing=False) == (
        dropless.plan)
    assert (forced.tflops_per_gpu, dropless.tflops_per_gpu) == (465, 445)
    model = MODEL_PRESETS["mixtral-8x22b"]
    assert {r.model for r in (forced, dropless)} == {"mixtral-8x22b"}
    assert (model.num_experts, model.moe_router_topk, model.num_layers) == (8, 2, 56)
    report = validate_runs([forced, dropless])
    assert [c.problem for c in report.checks] == [None, None]


def test_the_dsv3_history_is_one_plan_changed_where_its_table_says():
    runs = load_runs(str(HISTORY))
    assert len(runs) == 13
    assert all("deepseek-v3-gb200-optimization.md@eb0783b6d3" in r.source for r in runs)
    assert [r.plan.moe_flex_dispatcher_backend for r in runs[3:10]] == ["deepep"] * 7
    model = load_model(str(HISTORY.with_name("deepseek-v3-no-mtp.yaml")))
    assert model == dataclasses.replace(MODEL_PRESETS["deepseek-v3"], mtp_num_layers=None,
                                        name="deepseek-v3-no-mtp")
    for step, (before, after) in enumerate(zip(runs, runs[1:]), start=2):
        a, b = before.plan.to_dict(), after.plan.to_dict()
        assert {k for k in a if a[k] != b[k]} == HISTORY_CHANGES.get(step, set()), step
    report = validate_runs(runs)
    assert [c.problem for c in report.checks] == [None] * len(runs)
    # TFLOP/s as published, converted with the model's own FLOPs: 494.46 at the first step
    first = report.checks[0]
    flops = megatron_model_flops(model, 2048, 4096)
    assert first.measured_iteration_time_s == pytest.approx(flops / (494.46e12 * 256))


#: The H100 table's first row as the README prints it (best_practice/Qwen3/readme.md at
#: b0b92ff): 19.7 s per step at 245 TFLOP/s per GPU on 256 H100, 2,048 sequences of 4,096.
ZOO_4K_STEP_S, ZOO_4K_TFLOPS = 19.7, 245.0


def test_the_zoo_counts_the_causal_scores_at_half():
    """The README's 4k table gives both a step time and TFLOP/s, so its FLOP count can be
    read off: Megatron-LM's causal count (scores at half) within 1 %, the count over all s²
    pairs 13 % above. The long-context rows, which give TFLOP/s only, are read with it."""
    model = load_model("qwen3-235b-a22b").with_seq_length(4096)
    per_gpu = [megatron_model_flops(model, 2048, causal=c) / (ZOO_4K_STEP_S * 256) / 1e12
               for c in (True, False)]
    assert per_gpu[0] == pytest.approx(ZOO_4K_TFLOPS, rel=0.01)
    assert per_gpu[1] > 1.12 * ZOO_4K_TFLOPS
    long_rows = [r for r in load_runs(str(PATH)) if r.tflops_per_gpu is not None
                 and r.cluster == "dgx-h100-80gb"]
    assert len(long_rows) == 8 and {r.flops_formula for r in long_rows} == {"megatron"}


def test_the_long_context_rows_split_into_attention_and_the_rest():
    """bench.accuracy.modelzoo's two-term fit over each routing's four long-context rows
    (tokens per rank fixed, the attention growing with cp): each row within 2 %; read with
    the causal count, the attention attains no more than the cuDNN kernel's own figure at
    those keys and more than the preset's, and the rest of the microbatch takes longer than
    priced; read with the full count, the attention would attain under half the kernel's."""
    from bench.accuracy.modelzoo import long_context_rows, long_context_split
    from configurator.app.validate_jobs import run_model

    runs = load_runs(str(PATH))
    for forced in (True, False):
        rows = long_context_rows(runs, forced)
        assert [r.plan.cp for r in rows] == [1, 2, 4, 8]
        # the same tokens per rank in every row: s / (tp·cp)
        assert {run_model(r).seq_length / (r.plan.tp * r.plan.cp) for r in rows} == {4096.0}
        causal, full = (long_context_split(rows, f)
                        for f in ("megatron", "megatron-full-attention"))
        for x in (causal, full):
            assert x["fitted"] == pytest.approx(x["measured"], rel=0.02)
            assert x["rest"] > 1.1
        assert causal["preset"] < causal["attained"] <= causal["kernel"]
        assert full["attained"] < 0.5 * full["kernel"]


def test_the_fsdp_row_runs_faster_than_an_fp32_reduction_lets_rings_run_its_nics():
    """The Model Zoo's Megatron FSDP row (Qwen3-235B, tp 2, ep 8, mbs 4, 4 micro-batches on
    32 nodes): each GPU holds 16 experts of each of the 94 layers, 28.4 B parameters sharded
    over an expert-data-parallel group of one GPU per node, so every micro-batch moves
    (2 + 2 + 4)·31/32 bytes per expert parameter each way through each GPU's 50 GB/s NIC
    (rings: every GPU sends what it receives) with the gradients reduced in FP32: 17.6 s
    of the expert traffic alone in 4 micro-batches, more than the 17.6 s measured once the
    non-expert shards are added. Reduced in BF16 the floor is 13.7 s and the model prices
    the run within 1 %."""
    from bench.accuracy.modelzoo import fsdp_nic_floor

    (run,) = [r for r in load_runs(str(PATH)) if r.plan.megatron_fsdp]
    floor = fsdp_nic_floor(run)
    assert floor["expert_params"] == pytest.approx(94 * 128 * 3 * 4096 * 1536 / 8, rel=1e-3)
    expert_s = 4 * floor["expert_params"] * 8 * 31 / 32 / 50e9
    assert expert_s == pytest.approx(run.iteration_time_s, rel=0.01)
    assert floor["bf16_floor_s"] < run.iteration_time_s < floor["fp32_floor_s"]
    assert floor["bf16_floor_s"] > 0.75 * expert_s
    assert floor["predicted_bf16_s"] == pytest.approx(run.iteration_time_s, rel=0.01)
    assert floor["predicted_fp32_s"] > 1.2 * run.iteration_time_s


def test_moe_layer_regime_reads_the_host_and_gpu_sides_of_a_pass():
    """``bench.accuracy.modelzoo``'s split of an eager MoE layer pass: Megatron-Bridge's
    Qwen3-30B-A3B on 16 H100 (26.06, FP8, DeepEP) is priced host-bound in the forward (the
    host issues the layer in more time than its GPU work takes) and GPU-bound in the
    backward; with no host time per operation the forward is GPU-bound by its whole GPU time
    and the backward's lead grows by the host time it no longer has."""
    from bench.accuracy.modelzoo import moe_layer_regime
    from configurator.app.validate_jobs import priced_run
    from configurator.core.plan_batch import PlanBatch
    from configurator.cost.compute import layer_costs

    run = next(r for r in published_runs()[0]
               if r.name == "bridge 26.06 qwen3-30b-a3b dgx-h100-80gb fp8 16")
    model, cluster, priced = priced_run(run)
    regime = moe_layer_regime(model, cluster, priced.plan)
    assert regime["host_over_gpu_fwd"] > 0 and regime["gpu_over_host_bwd"] > 0
    assert regime["host_fwd"] > regime["host_over_gpu_fwd"]
    gpu = cluster.gpu
    free = cluster.with_gpu(dataclasses.replace(
        gpu, efficiency=dataclasses.replace(gpu.efficiency, host_op_s=0.0)))
    idle = moe_layer_regime(model, free, priced.plan)
    lc = layer_costs(model, PlanBatch.from_plan(priced.plan), free.gpu)
    assert idle["host_fwd"] == 0.0
    assert idle["host_over_gpu_fwd"] == pytest.approx(-float(lc["moe_fwd"][0]))
    assert idle["gpu_over_host_bwd"] > regime["gpu_over_host_bwd"]
