"""The plan as Megatron-Bridge recipe overrides (``bridge_overrides.yaml``, launchers/bridge.py):
the keys are fields of Megatron-Bridge 0.3.1's config classes (recorded in
tests/data/megatron_bridge_0_3_1_fields.json by tests/support/record_bridge_fields.py), the
values agree with the same plan's Megatron-LM flags, every plan field is carried or says how
to set it, and, where megatron-bridge imports, the file loads into its own classes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import PLAN_FIELDS, ParallelPlan
from launchers import BRIDGE_FILE, bridge_overrides, render_bridge_overrides
from launchers.bridge import CARRIED_BY, NOT_CARRIED, RECIPE_FP8_PARAM_GATHER
from launchers.megatron_flags import flag_argv, megatron_flags
from tests.megatron_argv import MODERN_PLANS, parse_argv, plan_spread

RECORD = json.loads((Path(__file__).parent / "data" / "megatron_bridge_0_3_1_fields.json")
                    .read_text())
LLAMA8 = MODEL_PRESETS["llama3-8b"]
MOE_PLAN = (MODEL_PRESETS["deepseek-v3"], ParallelPlan(
    tp=2, pp=4, dp=8, ep=8, vp=2, micro_batch_size=1, global_batch_size=64,
    recompute="selective", recompute_modules="moe_act,layernorm", sequence_parallel=True,
    distributed_optimizer=True, precision="fp8", fp8_recipe="blockwise",
    moe_token_dispatcher_type="flex", moe_expert_capacity_factor=1.5,
    overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True,
    use_precision_aware_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="fp8",
    offload_modules="core_attn", cuda_graph_impl="transformer_engine",
    cuda_graph_scope="attn,moe_router", grad_reduce_in_bf16=True, attention_backend="flash"))


def cases():
    return plan_spread()[::101] + MODERN_PLANS + [MOE_PLAN]


def flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def test_every_key_is_a_field_of_megatron_bridge_0_3_1():
    seen = set()
    for model, plan in cases():
        tree = bridge_overrides(model, plan)
        for key, value in flat(tree).items():
            container, _, field = key.partition(".")
            assert container in RECORD["ConfigContainer"], key
            if field:
                assert field in RECORD[container], f"{key}: not a field of {container}"
            seen.add(key)
        assert tree["mixed_precision"] in RECORD["mixed_precision_recipes"]
        assert tree["mixed_precision"] in RECIPE_FP8_PARAM_GATHER
    # the names the plan's parallel layout needs, all written
    for key in ("model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
                "model.virtual_pipeline_model_parallel_size", "model.context_parallel_size",
                "model.expert_model_parallel_size", "model.expert_tensor_parallel_size",
                "model.sequence_parallel", "model.recompute_granularity",
                "model.recompute_method", "model.recompute_num_layers",
                "model.recompute_modules", "train.micro_batch_size", "train.global_batch_size",
                "model.seq_length", "dataset.seq_length", "ddp.use_distributed_optimizer",
                "optimizer.use_distributed_optimizer", "mixed_precision",
                "model.moe_token_dispatcher_type", "optimizer.exp_avg_sq_dtype"):
        assert key in seen, key


def test_the_record_is_megatron_bridge_s_classes():
    # a few fields each class is known to hold, and none it is known not to
    assert {"tensor_model_parallel_size", "seq_length", "recompute_granularity"} <= set(
        RECORD["model"])
    assert {"micro_batch_size", "global_batch_size", "train_iters"} <= set(RECORD["train"])
    assert "use_distributed_optimizer" in RECORD["ddp"] and "lr" in RECORD["optimizer"]
    assert "micro_batch_size" not in RECORD["model"]
    assert {"model", "train", "ddp", "optimizer", "mixed_precision"} <= set(
        RECORD["ConfigContainer"])


def test_every_plan_field_is_carried_or_says_how():
    for f in PLAN_FIELDS:
        assert f.bridge or f.name in NOT_CARRIED or f.name in CARRIED_BY, f.name
    assert set(NOT_CARRIED) | set(CARRIED_BY) <= {f.name for f in PLAN_FIELDS}


@pytest.mark.parametrize("model,plan", cases())
def test_overrides_agree_with_the_megatron_flags(model, plan):
    """The same plan read from the two outputs: the pretrain_gpt.py flags and the overrides."""
    a = parse_argv(flag_argv(megatron_flags(model, plan)))
    o = flat(bridge_overrides(model, plan))
    assert o["model.tensor_model_parallel_size"] == int(a["--tensor-model-parallel-size"])
    assert o["model.pipeline_model_parallel_size"] == int(a["--pipeline-model-parallel-size"])
    assert o["model.context_parallel_size"] == int(a.get("--context-parallel-size", 1))
    assert o["train.micro_batch_size"] == int(a["--micro-batch-size"])
    assert o["train.global_batch_size"] == int(a["--global-batch-size"])
    assert o["model.seq_length"] == o["dataset.seq_length"] == int(a["--seq-length"])
    vp = o["model.virtual_pipeline_model_parallel_size"]
    if "--num-layers-per-virtual-pipeline-stage" in a:
        assert vp == model.num_layers // plan.pp // int(
            a["--num-layers-per-virtual-pipeline-stage"])
    elif "--num-virtual-stages-per-pipeline-rank" in a:
        assert vp == int(a["--num-virtual-stages-per-pipeline-rank"])
    elif "--pipeline-model-parallel-layout" not in a:
        assert vp is None
    assert o["model.sequence_parallel"] == ("--sequence-parallel" in a)
    assert o["model.recompute_granularity"] == a.get("--recompute-granularity")
    assert o["model.recompute_method"] == a.get("--recompute-method")
    assert o["model.recompute_num_layers"] == (int(a["--recompute-num-layers"])
                                               if "--recompute-num-layers" in a else None)
    if "--recompute-modules" in a:
        mods = a["--recompute-modules"]
        assert o["model.recompute_modules"] == ([mods] if isinstance(mods, str) else list(mods))
    assert o["ddp.use_distributed_optimizer"] == ("--use-distributed-optimizer" in a)
    assert o["optimizer.use_distributed_optimizer"] == o["ddp.use_distributed_optimizer"]
    assert o["ddp.overlap_grad_reduce"] == ("--overlap-grad-reduce" in a)
    assert o["ddp.overlap_param_gather"] == ("--overlap-param-gather" in a)
    assert o["model.tp_comm_overlap"] == ("--tp-comm-overlap" in a)
    assert o["ddp.use_megatron_fsdp"] == ("--use-megatron-fsdp" in a)
    assert o["model.cross_entropy_loss_fusion"] == ("--cross-entropy-loss-fusion" in a)
    assert o["model.cp_comm_type"] == a.get("--cp-comm-type",
                                            "p2p" if plan.cp > 1 else None)
    if model.is_moe:
        assert o["model.expert_model_parallel_size"] == int(a["--expert-model-parallel-size"])
        assert o["model.expert_tensor_parallel_size"] == int(
            a["--expert-tensor-parallel-size"])
        assert o["model.moe_token_dispatcher_type"] == a["--moe-token-dispatcher-type"]
    else:
        assert o["model.expert_tensor_parallel_size"] is None
        assert "model.moe_token_dispatcher_type" not in o
    for flag, key in (("--decoder-first-pipeline-num-layers",
                       "model.num_layers_in_first_pipeline_stage"),
                      ("--decoder-last-pipeline-num-layers",
                       "model.num_layers_in_last_pipeline_stage")):
        assert o[key] == (int(a[flag]) if flag in a else None)
    assert o["model.pipeline_model_parallel_layout"] == a.get(
        "--pipeline-model-parallel-layout")
    fp8 = {"bf16": None, "fp16": None}.get(plan.precision, "fp8")
    assert (fp8 is None) == ("--fp8-format" not in a)
    assert o["mixed_precision"].startswith("fp16") == ("--fp16" in a)


def test_the_file_is_comments_then_the_overrides(tmp_path):
    model, plan = MOE_PLAN
    text = render_bridge_overrides(model, plan, nodes=8, gpus_per_node=8,
                                   summary={"iteration_time_s": 1.5, "x": "a\nb: 1"})
    head, _, body = text.partition("\nmodel:\n")
    assert all(line.startswith("# ") for line in head.splitlines())
    assert yaml.safe_load(text) == bridge_overrides(model, plan)
    o = flat(yaml.safe_load(text))
    assert o["mixed_precision"] == "bf16_with_fp8_subchannel_scaling_mixed"
    assert o["model.recompute_modules"] == ["moe_act", "layernorm"]   # Megatron's order
    assert o["model.moe_router_dtype"] == "fp32"                      # flex wants fp32 probs
    assert o["model.moe_expert_capacity_factor"] == 1.5
    assert o["model.offload_modules"] == ["core_attn"]
    assert o["model.cuda_graph_scope"] == ["attn", "moe_router"]
    assert o["optimizer.exp_avg_dtype"] == "torch.bfloat16"
    assert o["optimizer.exp_avg_sq_dtype"] == "torch.uint8"
    # what YAML cannot carry is a comment with its Python line
    assert "cfg.model.attention_backend = AttnBackend.flash" in head
    assert "cfg.mixed_precision.grad_reduce_in_fp32 = False" in head
    # blockwise: the recipe gathers BF16 weights, the plan FP8 ones
    assert "cfg.mixed_precision.fp8_param_gather = True" in head
    assert "on 8 x 8 GPUs" in head and "dp 8 = 64 GPUs" in head


def test_a_plain_plan_needs_no_python_lines():
    plan = ParallelPlan(tp=2, pp=1, dp=8, micro_batch_size=2, global_batch_size=128,
                        sequence_parallel=True, distributed_optimizer=True)
    text = render_bridge_overrides(LLAMA8, plan, nodes=2, gpus_per_node=8)
    assert "Not carried" not in text
    o = flat(yaml.safe_load(text))
    assert o["mixed_precision"] == "bf16_mixed"
    assert o["model.virtual_pipeline_model_parallel_size"] is None
    assert o["model.recompute_granularity"] is None
    cs = dataclasses.replace(plan, precision="fp8", fp8_recipe="tensorwise")
    assert "first_last_layers_bf16 = False" in render_bridge_overrides(
        LLAMA8, cs, nodes=2, gpus_per_node=8)


def test_search_and_launch_write_the_overrides(tmp_path):
    from configurator.cli import main

    out = tmp_path / "plan"
    assert main(["search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                 "2", "--gbs", "128", "--top", "1", "--out", str(out)]) == 0
    doc = json.loads((out / "plan.json").read_text())
    o = flat(yaml.safe_load((out / BRIDGE_FILE).read_text()))
    assert o["model.tensor_model_parallel_size"] == doc["plan"]["tp"]
    assert o["train.global_batch_size"] == 128
    run = tmp_path / "run"
    assert main(["launch", "--plan", str(out / "plan.json"), "--out", str(run)]) == 0
    assert (run / BRIDGE_FILE).read_text() == (out / BRIDGE_FILE).read_text()


def test_the_overrides_load_into_megatron_bridge(tmp_path):
    pytest.importorskip(
        "megatron.bridge.training.config",
        reason="megatron-bridge is not importable here: 0.3.1 depends on transformer-engine "
               "and mamba-ssm, CUDA builds pip cannot make without CUDA (mamba-ssm's build "
               "imports torch); the key check above uses the fields recorded from its source")
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.recipes.common import _pretrain_common
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    for model, plan in [MOE_PLAN] + MODERN_PLANS:
        path = tmp_path / BRIDGE_FILE
        path.write_text(render_bridge_overrides(model, plan, nodes=1,
                                                gpus_per_node=plan.world_size))
        cfg = _pretrain_common()
        cfg.model = GPTModelProvider(num_layers=model.num_layers,
                                     hidden_size=model.hidden_size,
                                     num_attention_heads=model.num_attention_heads)
        cfg = process_config_with_overrides(cfg, config_filepath=str(path))
        for key, value in flat(bridge_overrides(model, plan)).items():
            container, _, field = key.partition(".")
            got = getattr(getattr(cfg, container), field) if field else getattr(cfg, container)
            if key.startswith("optimizer.") and key.endswith("_dtype"):
                got = str(got)
            assert got == value, key
        get_mixed_precision_config(cfg.mixed_precision)
