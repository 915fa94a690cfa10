"""Expert parallelism and pipeline layer splits: Megatron's split arithmetic, the closed form
against the simulated schedule on uneven and MoE plans, the all-to-all on the links the EP
group spans, and the CLI choosing a split."""

from __future__ import annotations

import json

import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.core.layers import (layout_problem, rank_layer_counts, split_ok,
                                      stage_classes, virtual_stage_layers)
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.rules import check_plan, plan_for_world
from configurator.cost.iteration import iteration_time
from configurator.cost.placed import PlacedPlan
from configurator.search.space import layer_splits
from configurator.search.engine import peak_memory
from memory_model.estimate import estimate_memory
from tests.conftest import run_cli
from topology.cluster_files import load_cluster
from topology.collectives import all_to_all_time_s

L405 = MODEL_PRESETS["llama3.1-405b"]


def test_accounted_split_of_405b():
    """126 layers + embedding + loss = 128 slots over pp 8 × vp 8: 2 per virtual stage, the
    first and the last building one decoder layer (transformer_block.get_num_layers_to_build)."""
    stages = virtual_stage_layers(126, 8, 8, 0, 0, True, True)
    assert len(stages) == 64 and stages[0] == (0, 1) and stages[-1] == (125, 1)
    assert all(c == 2 for _, c in stages[1:-1])
    assert sum(c for _, c in stages) == 126
    counts = rank_layer_counts(L405, 8, 8, 0, 0, True, True)
    assert counts[:, 0].tolist() == [15] + [16] * 6 + [15]


@pytest.mark.parametrize("L,pp,vp,first,last,ae,al,ok", [
    (126, 8, 1, 0, 0, False, False, False),     # pp does not divide
    (126, 8, 1, 15, 15, False, False, True),    # 15 + 6·16 + 15
    (126, 8, 2, 15, 15, False, False, False),   # first not a multiple of vp
    (126, 8, 2, 14, 16, False, False, True),
    (126, 8, 1, 15, 15, True, False, False),    # uneven and accounted do not mix
    (126, 8, 8, 0, 0, True, True, True),
    # 1 slot per chunk: the first and last chunks build no decoder layer, which Megatron
    # allows (get_num_layers_to_build asserts num_layers_to_build >= 0) and Megatron-Bridge
    # runs (Llama-3.1 405B on 256 GB200 at pp 16, vp 8)
    (126, 8, 16, 0, 0, True, True, True),
    (126, 8, 32, 0, 0, True, True, False),      # 128 slots over 256 chunks
    (12, 3, 1, 6, 6, False, False, False),      # the middle rank would build nothing
    (12, 2, 1, 5, 7, False, False, True),
    (12, 1, 2, 0, 0, False, False, False),      # interleaving needs pp > 1
])
def test_split_rules(L, pp, vp, first, last, ae, al, ok):
    """TransformerConfig.__post_init__ and validate_args (megatron core_v0.16.1)."""
    assert bool(split_ok(L, pp=pp, vp=vp, first=first, last=last, account_embedding=ae,
                         account_loss=al)) is ok


def test_moe_layers_per_rank_follow_the_pattern():
    ds = MODEL_PRESETS["deepseek-v3"]          # 3 dense, then 58 MoE layers
    counts = rank_layer_counts(ds, 8, 1, 4, 9)   # 4 + 6·8 + 9
    assert counts[:, 0].tolist() == [4] + [8] * 6 + [9]
    assert counts[:, 1].tolist() == [1] + [8] * 6 + [9]
    classes = stage_classes(ds, 8, 1, 4, 9)
    assert [(s, n) for s, n, _, _ in classes] == [(0, 1), (1, 6), (7, 1)]


def test_search_splits_are_distinct_and_legal():
    for model, pp in ((L405, 8), (L405, 32), (MODEL_PRESETS["deepseek-v3"], 8)):
        splits = layer_splits(model, pp)
        assert splits and len(set(splits)) == len(splits)
        layouts = {(x[0], virtual_stage_layers(model.num_layers, pp, *x)) for x in splits}
        assert len(layouts) == len(splits)
        for x in splits:
            if x[5]:      # a pipeline layout, at a vp no field-based split reaches
                assert not any(x[1:5]) and layout_problem(
                    x[5], model.num_layers, model.mtp_num_layers or 0, pp, x[0]) is None
                assert not any(y[0] == x[0] and not y[5] for y in splits)
            else:
                assert split_ok(model.num_layers, pp=pp, vp=x[0], first=x[1], last=x[2],
                                account_embedding=x[3], account_loss=x[4])


@pytest.mark.parametrize("model,nodes,fields", [
    (L405.with_seq_length(2048), 64, dict(tp=8, pp=8, cp=1, vp=1,
                                          decoder_first_pipeline_num_layers=15,
                                          decoder_last_pipeline_num_layers=15)),
    (L405.with_seq_length(2048), 64, dict(tp=8, pp=8, cp=1, vp=4,
                                          account_for_embedding_in_pipeline_split=True,
                                          account_for_loss_in_pipeline_split=True)),
    (MODEL_PRESETS["qwen3-30b-a3b"], 4, dict(tp=1, pp=4, cp=1, vp=1, ep=8)),
    (MODEL_PRESETS["deepseek-v3"], 32, dict(tp=2, pp=8, cp=1, vp=1, ep=32,
                                            decoder_first_pipeline_num_layers=4,
                                            decoder_last_pipeline_num_layers=9)),
])
@pytest.mark.parametrize("mult", [1, 8])
def test_closed_form_agrees_with_the_simulated_schedule(model, nodes, fields, mult):
    """Uneven, accounted and MoE pipelines on a uniform cluster: the closed form (stage
    classes, the slowest pacing, the flow-shop bubble) within 3 % of the simulated schedule
    of every stage's own layers (measured worst 1.9 %: the accounted interleaved split at
    m = pp; even dense splits: tests/test_placement.py)."""
    cl = load_cluster("dgx-h100-80gb", nodes)
    world = nodes * 8
    dp = world // (fields["tp"] * fields["pp"])
    plan = plan_for_world(dict(fields, micro_batch_size=1, recompute="full",
                               global_batch_size=mult * fields["pp"] * dp), world)
    check_plan(model, plan, world)
    closed = float(iteration_time(model, cl, PlanBatch.from_plan(plan))["iteration_time_s"][0])
    priced = PlacedPlan(model, cl, PlanBatch.from_plan(plan))
    sim = priced.time(*priced.default_placement()).iteration_time_s
    assert sim == pytest.approx(closed, rel=0.03)


def test_expert_parameters_shard_over_ep_and_the_expert_data_parallel_group():
    q = MODEL_PRESETS["qwen3-30b-a3b"]
    base = dict(tp=1, pp=1, cp=1, vp=1, micro_batch_size=1, global_batch_size=64)
    one, eight = (estimate_memory(q, PlanBatch.from_plan(plan_for_world(dict(base, ep=ep), 64)))[0]
                  for ep in (1, 8))
    # 8× fewer expert weights and gradients per GPU; the optimizer state of experts is
    # sharded over dp/ep, so it does not shrink with ep
    assert eight.parameters_bytes < one.parameters_bytes / 4
    assert eight.optimizer_bytes == pytest.approx(one.optimizer_bytes, rel=1e-9)


def test_all_to_all_pays_the_network_only_for_members_off_the_domain():
    S = 1e9
    inside = all_to_all_time_s(S, 8, 8, 400e9, 3e-6, 50e9, 6e-6)
    across = all_to_all_time_s(S, 16, 8, 400e9, 3e-6, 50e9, 6e-6)
    assert inside == pytest.approx(3e-6 + 7 / 8 * S / 400e9)
    assert across == pytest.approx(6e-6 + 8 / 16 * S / 50e9)
    assert float(all_to_all_time_s(S, 1, 1, 400e9, 3e-6, 50e9, 6e-6)) == 0.0


def test_ep_across_hosts_costs_more_than_inside_an_nvl72_rack():
    """ep 16 on DGX H100 crosses InfiniBand; on GB200 NVL72 the same 16 GPUs span 4 trays
    of one NVLink domain."""
    q = MODEL_PRESETS["qwen3-30b-a3b"]
    times = {}
    for cluster, nodes in (("dgx-h100-80gb", 2), ("gb200-nvl72", 4)):
        cl = load_cluster(cluster, nodes)
        plan = plan_for_world(dict(tp=1, pp=1, cp=1, vp=1, ep=16, micro_batch_size=1,
                                   global_batch_size=64), 16)
        times[cluster] = float(iteration_time(q, cl, PlanBatch.from_plan(plan))["ep_comm"][0])
    assert times["gb200-nvl72"] < times["dgx-h100-80gb"] / 4


def test_peak_memory_covers_every_stage_class():
    """The search's vectorised peak equals the worst stage of the per-stage estimate, on an
    uneven MoE split where a middle rank is the worst."""
    ds = MODEL_PRESETS["deepseek-v3"]
    plan = plan_for_world(dict(tp=2, pp=8, cp=1, vp=1, ep=32, micro_batch_size=1,
                               global_batch_size=256, decoder_first_pipeline_num_layers=4,
                               decoder_last_pipeline_num_layers=9), 512)
    per_stage = max(m.total_bytes for m in estimate_memory(ds, PlanBatch.from_plan(plan)))
    c = PlanBatch.from_plan(plan)
    peak = peak_memory(ds, c)
    assert float(peak[0]) == pytest.approx(per_stage, rel=1e-12)


def test_estimate_chooses_and_reports_a_split(tmp_path):
    res = run_cli("estimate", "--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb",
                  "--nodes", "128", "--gbs", "512", "--tp", "8", "--pp", "8", "--cp", "2",
                  "--vp", "8", "--mbs", "1")
    assert res.returncode == 0, res.stderr
    assert "layer split chosen: account_for_embedding account_for_loss" in res.stdout
    res = run_cli("estimate", "--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb",
                  "--nodes", "128", "--gbs", "512", "--tp", "8", "--pp", "8", "--mbs", "1",
                  "--decoder-first-pipeline-num-layers", "14",
                  "--decoder-last-pipeline-num-layers", "14", "--json")
    assert res.returncode == 2 and "--decoder-first-pipeline-num-layers" in res.stderr
    res = run_cli("estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-80gb",
                  "--nodes", "2", "--gbs", "64", "--tp", "1", "--pp", "1", "--mbs", "1",
                  "--ep", "3")
    assert res.returncode == 2 and "ep=3" in res.stderr and "num_experts" in res.stderr


def test_search_restricted_to_ep_values():
    res = run_cli("search", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-80gb",
                  "--nodes", "2", "--gbs", "256", "--ep", "8", "16", "--top", "5", "--json")
    assert res.returncode == 0, res.stderr
    plans = json.loads(res.stdout)["plans"]
    assert plans and {p["config"]["ep"] for p in plans} <= {8, 16}
    dense = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb",
                    "--nodes", "1", "--gbs", "64", "--ep", "2", "--json")
    assert dense.returncode == 2 and "ep=2" in dense.stderr and "num_experts" in dense.stderr
