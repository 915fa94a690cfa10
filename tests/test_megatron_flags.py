"""Tests for launchers/megatron_flags.py: every flag is Megatron's, and Megatron's rules hold."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import textwrap

import pytest

from configurator.core.errors import InputError
from configurator.core.layers import parse_layout
from configurator.core.plan import ParallelPlan
from configurator.core.plan_values import is_fp8
from launchers import TrainingArgs
from launchers.megatron_flags import flag_argv, megatron_flags
from launchers.megatron_flags import FLAG_TABLE
from launchers.script_parts import environment_block
from tests.megatron_argv import (GPT3, GPT3_PLAN, LLAMA8, MODERN_PLANS, SMALL, SMALL_PLAN,
                                 SPREAD,
                                 assert_validate_args_rules, megatron_arguments_preamble,
                                 megatron_flag_names, parse_argv)


def test_spread_covers_every_plan_value():
    assert len(SPREAD) > 100
    for field, values in (("recompute", {"none", "selective", "full"}),
                          ("precision", {"bf16", "fp16", "fp8", "mxfp8"}), ("vp", {1, 2}),
                          ("cp", {1, 2}), ("attention_backend", {"auto", "flash", "local"}),
                          ("cp_comm_type", {"p2p", "a2a", "all_gather"}),
                          ("grad_reduce_in_bf16", {False, True}),
                          ("tp_comm_overlap", {False, True}),
                          ("cross_entropy_fusion", {"none", "native", "te"}),
                          ("megatron_fsdp", {False, True})):
        assert values <= {getattr(p, field) for _, p in SPREAD}, field


def test_every_emitted_flag_is_a_megatron_core_v0_16_flag():
    known = megatron_flag_names()
    assert len(known) > 500 and "--tensor-model-parallel-size" in known
    seen: set[str] = set()
    for model, plan in SPREAD:
        for data, training in ((None, None), ("/data/x", CHECKPOINTED)):
            flags = {w for w in flag_argv(megatron_flags(model, plan, data_path=data,
                                                         training=training))
                     if w.startswith("--")}
            assert flags <= known, flags - known
            seen |= flags
    # the spread exercises every row of the table
    assert {r.flag for r in FLAG_TABLE} <= seen


#: Training arguments of a priced plan (``--train-tokens``): checkpoints every 50
#: iterations, saved asynchronously.
CHECKPOINTED = TrainingArgs(save_interval=50, async_save=True)


def test_checkpoint_flags_follow_the_interval_and_the_format():
    for model, plan in SPREAD[::7]:
        a = parse_argv(flag_argv(megatron_flags(model, plan, training=CHECKPOINTED)))
        assert a["--save-interval"] == "50"
        assert a["--save"] == a["--load"] == "$CHECKPOINT_DIR"
        # Megatron's async save needs its distributed format (checkpointing.py); FSDP plans
        # keep theirs and save synchronously
        if plan.megatron_fsdp:
            assert a["--ckpt-format"] == "fsdp_dtensor" and "--async-save" not in a
        else:
            assert a["--ckpt-format"] == "torch_dist" and "--async-save" in a
            # without it validate_args switches the async save off
            assert "--use-persistent-ckpt-worker" in a
        plain = parse_argv(flag_argv(megatron_flags(model, plan)))
        assert not {"--save", "--load", "--save-interval", "--async-save"} & set(plain)
    with pytest.raises(InputError, match="save_interval"):
        megatron_flags(GPT3, GPT3_PLAN, training=TrainingArgs(save_interval=0))


def test_validate_args_rules_hold_for_the_spread():
    for model, plan in SPREAD:
        a = parse_argv(flag_argv(megatron_flags(model, plan)))
        assert_validate_args_rules(a, plan.world_size)
        assert int(a["--tensor-model-parallel-size"]) == plan.tp
        if plan.pipeline_model_parallel_layout:   # vp is the layout's stages over pp
            assert a["--pipeline-model-parallel-layout"] == plan.pipeline_model_parallel_layout
            assert len(parse_layout(a["--pipeline-model-parallel-layout"])) == plan.pp * plan.vp
            assert not {"--num-virtual-stages-per-pipeline-rank",
                        "--num-layers-per-virtual-pipeline-stage"} & set(a)
        elif plan.vp > 1 and plan.custom_layer_split:
            assert int(a["--num-virtual-stages-per-pipeline-rank"]) == plan.vp
            assert "--num-layers-per-virtual-pipeline-stage" not in a
        elif plan.vp > 1:
            per_rank = model.num_layers // plan.pp
            assert per_rank // int(a["--num-layers-per-virtual-pipeline-stage"]) == plan.vp
        else:
            assert "--num-layers-per-virtual-pipeline-stage" not in a
        if plan.attention_backend == "local":
            assert a["--transformer-impl"] == "local" and "--attention-backend" not in a
        else:
            assert a["--attention-backend"] == plan.attention_backend
        assert ("--overlap-param-gather" in a) == (
            plan.overlap_param_gather and plan.distributed_optimizer and plan.overlap_grad_reduce)
        assert ("--fp8-param-gather" in a) == (
            plan.fp8_param_gather and plan.distributed_optimizer and is_fp8(plan.precision))
        assert ("--grad-reduce-in-bf16" in a) == (
            plan.grad_reduce_in_bf16 and plan.precision != "fp16")
        assert ("--tp-comm-overlap" in a) == (
            plan.tp_comm_overlap and plan.tp > 1 and plan.sequence_parallel
            and plan.attention_backend != "local")
        assert ("--cross-entropy-loss-fusion" in a) == (plan.cross_entropy_fusion != "none")
        assert ("--use-megatron-fsdp" in a) == plan.megatron_fsdp
        assert (a.get("--ckpt-format"), a.get("--data-parallel-sharding-strategy")) == (
            ("fsdp_dtensor", "optim_grads_params") if plan.megatron_fsdp else (None, None))
        assert a.get("--cross-entropy-fusion-impl") == (
            "te" if plan.cross_entropy_fusion == "te" else None)


def test_exact_flags_gpt3_175b():
    argv = flag_argv(megatron_flags(GPT3, GPT3_PLAN))
    assert argv == [
        "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
        "--context-parallel-size", "1", "--num-layers-per-virtual-pipeline-stage", "4",
        "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce",
        "--overlap-param-gather", "--recompute-granularity", "selective",
        "--micro-batch-size", "1", "--global-batch-size", "32",
        "--num-layers", "96", "--hidden-size", "12288", "--ffn-hidden-size", "49152",
        "--num-attention-heads", "96", "--seq-length", "2048",
        "--max-position-embeddings", "2048", "--position-embedding-type", "learned_absolute",
        "--normalization", "LayerNorm", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
        "--bf16", "--attention-backend", "auto",
        "--train-iters", "100", "--lr", "0.0003", "--min-lr", "3e-05",
        "--lr-decay-style", "cosine", "--lr-warmup-iters", "10", "--weight-decay", "0.1",
        "--adam-beta2", "0.95", "--clip-grad", "1.0", "--log-interval", "1",
        "--eval-iters", "0", "--eval-interval", "1000", "--seed", "1234",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "51199"]


def test_llama_flags_full_recompute_fp8_gqa():
    plan = ParallelPlan(tp=2, pp=1, dp=4, cp=1, micro_batch_size=1, global_batch_size=8,
                        recompute="full", precision="fp8", attention_backend="flash")
    a = parse_argv(flag_argv(megatron_flags(LLAMA8, plan)))
    assert a["--recompute-granularity"] == "full" and a["--recompute-method"] == "uniform"
    assert a["--recompute-num-layers"] == "1"
    assert a["--bf16"] is True and a["--fp8-format"] == "hybrid" and "--fp16" not in a
    assert a["--group-query-attention"] is True and a["--num-query-groups"] == "8"
    for switch in ("--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear"):
        assert a[switch] is True
    assert a["--normalization"] == "RMSNorm" and a["--position-embedding-type"] == "rope"
    assert a["--ffn-hidden-size"] == "14336" and a["--vocab-size"] == "128255"
    # no SP/distopt requested: neither SP nor overlap-param-gather (it needs distopt)
    assert "--sequence-parallel" not in a and "--overlap-param-gather" not in a
    assert "--disable-bias-linear" not in parse_argv(flag_argv(megatron_flags(GPT3, GPT3_PLAN)))


def test_sequence_parallel_dropped_at_tp1_and_fp16():
    # megatron_flags does not call check_plan (which rejects SP at tp=1); the table itself
    # must still never emit --sequence-parallel without tensor parallelism
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8,
                        precision="fp16", sequence_parallel=True)
    a = parse_argv(flag_argv(megatron_flags(SMALL, plan)))
    assert "--sequence-parallel" not in a and a["--fp16"] is True and "--bf16" not in a


def test_training_args_checked():
    with pytest.raises(InputError, match="min_lr"):
        megatron_flags(SMALL, SMALL_PLAN, training=TrainingArgs(lr=1e-4, min_lr=1e-3))
    with pytest.raises(InputError, match="train_iters"):
        megatron_flags(SMALL, SMALL_PLAN, training=TrainingArgs(train_iters=0))
    a = parse_argv(flag_argv(megatron_flags(SMALL, SMALL_PLAN,
                                            training=TrainingArgs(train_iters=7, eval_iters=3,
                                                                  lr_warmup_iters=1))))
    assert a["--train-iters"] == "7" and a["--eval-iters"] == "3"


def test_clamped_gated_mlp_trains_gpt_oss_activation():
    """A model with activation_func_clamp_value (GPT-OSS) gets --quick-geglu and
    --glu-linear-offset 1.0 in place of --swiglu, which core_v0.16.1 turns into SiLU
    (core_transformer_config_from_args); a plain gated MLP keeps --swiglu."""
    from tests.megatron_argv import MODERN_PLANS, WINDOWED

    plan = dict((id(m), p) for m, p in MODERN_PLANS)[id(WINDOWED)]
    a = parse_argv(flag_argv(megatron_flags(WINDOWED, plan)))
    assert a["--quick-geglu"] is True and "--swiglu" not in a
    assert (a["--activation-func-clamp-value"], a["--glu-linear-offset"]) == ("7.0", "1.0")
    plain = dataclasses.replace(WINDOWED, activation_func_clamp_value=None)
    a = parse_argv(flag_argv(megatron_flags(plain, plan)))
    assert a["--swiglu"] is True
    assert not {"--quick-geglu", "--glu-linear-offset", "--activation-func-clamp-value"} & set(a)


def test_every_script_passes_eval_interval():
    """core_v0.16.1 defaults eval_interval to None (training_config.py) and
    get_train_valid_test_num_samples computes train_iters // eval_interval before the first
    iteration: a script without the flag stops with a TypeError (seen on a GPU, docs/accuracy.md
    'Megatron-LM on one GPU')."""
    a = parse_argv(flag_argv(megatron_flags(SMALL, SMALL_PLAN)))
    assert int(a["--eval-interval"]) == 1000
    a = parse_argv(flag_argv(megatron_flags(SMALL, SMALL_PLAN,
                                            training=TrainingArgs(eval_interval=50))))
    assert a["--eval-interval"] == "50"
    with pytest.raises(InputError, match="eval_interval"):
        megatron_flags(SMALL, SMALL_PLAN, training=TrainingArgs(eval_interval=0))


MEGATRON_SRC = os.environ.get("MEGATRON_LM_SRC")

#: Jobs ``configurator trial`` chooses runs for in the flag tests: dense on one node, FP8 and
#: MoE across two.
TRIAL_JOBS = [dict(model="gpt-1.7b", cluster="dgx-a100-80gb", nodes=1, gbs=8, options={}),
              dict(model="llama3-8b", cluster="dgx-h100-80gb", nodes=2, gbs=64,
                   options={"precision": "fp8"}),
              dict(model="qwen3-30b-a3b", cluster="dgx-h100-80gb", nodes=2, gbs=64,
                   options={})]


def _trial(job, out=None):
    from configurator.app.inputs import JobInputs
    from configurator.app.trial_jobs import TrialRequest, run_trial

    return run_trial(TrialRequest(
        inputs=JobInputs(model=job["model"], cluster=job["cluster"], nodes=job["nodes"]),
        global_batch_size=job["gbs"], options=job["options"], iterations=30, out=out))


def _trial_plans(tmp_path):
    """``(model, plan)`` of every run ``configurator trial`` chooses for :data:`TRIAL_JOBS`."""
    from configurator.core.model_presets import load_model

    return [(load_model(job["model"]), r.plan) for job in TRIAL_JOBS for r in _trial(job).runs]


#: Searches whose best plans carry the recipe mechanisms the search turns on by itself
#: (configurator/search/mechanisms.py): a dense FP8 model on H100 (the tensor-parallel
#: overlap, the precision-aware optimizer) and an MoE model (the flex dispatcher, the fused
#: permutation and routing, the delayed weight gradients).
SEARCH_JOBS = [("llama3-8b", "dgx-h100-80gb", 2, 64, {"precision": "fp8"}),
               ("qwen3-30b-a3b", "dgx-h100-80gb", 2, 64, {})]


def _searched_plans():
    """``(model, plan)`` of the best three plans of every search of :data:`SEARCH_JOBS`."""
    from configurator.core.model_presets import load_model
    from configurator.search.rank import search
    from topology.cluster_files import load_cluster

    out = []
    for name, cluster, nodes, gbs, options in SEARCH_JOBS:
        model = load_model(name)
        res = search(model, load_cluster(cluster, nodes=nodes), gbs, top_k=3, **options)
        out += [(model, e.plan) for e in res.plans]
    return out


def test_searched_plans_carry_the_mechanisms():
    """The plans :data:`SEARCH_JOBS` find carry the mechanisms the validate_args test below
    checks: the flex dispatcher with its fp32 router and the precision-aware optimizer's
    flags reach the launch flags."""
    plans = _searched_plans()
    moe = [(m, p) for m, p in plans if m.is_moe]
    assert moe and all(p.moe_token_dispatcher_type == "flex" for _, p in moe if p.ep > 1)
    a = parse_argv(flag_argv(megatron_flags(*moe[0])))
    assert a["--moe-token-dispatcher-type"] == "flex" and a["--moe-router-dtype"] == "fp32"
    assert a["--moe-permute-fusion"] is True and a["--cross-entropy-fusion-impl"] == "te"
    dense = [p for m, p in plans if not m.is_moe]
    assert any(p.use_precision_aware_optimizer for p in dense)
    a = parse_argv(flag_argv(megatron_flags(
        plans[0][0], next(p for p in dense if p.use_precision_aware_optimizer))))
    assert a["--use-precision-aware-optimizer"] is True and a["--exp-avg-dtype"] == "bf16"
    assert a["--grad-reduce-in-bf16"] is True


@pytest.mark.skipif(not MEGATRON_SRC, reason="set MEGATRON_LM_SRC to a Megatron-LM "
                    "core_v0.16.x checkout to run its parse_args/validate_args on our flags")
def test_megatron_own_validate_args(tmp_path):
    """Megatron's own parse_args, validate_args and TransformerConfig on the spread's flags
    (one subprocess; needs megatron-core's dependencies plus six and regex)."""
    import json
    import sys
    cases = []
    short = TrainingArgs(train_iters=30, lr_warmup_iters=10)    # what trial writes
    cases_in = ([(m, p) for m, p in SPREAD[:: max(1, len(SPREAD) // 40)]]
                + [(GPT3, GPT3_PLAN)] + MODERN_PLANS)
    for model, plan, training in (
            # every other case as a priced plan writes it: checkpoints, async saves
            [(m, p, CHECKPOINTED if k % 2 else None) for k, (m, p) in enumerate(cases_in)]
            + [(m, p, short) for m, p in _trial_plans(tmp_path)]
            + [(m, p, None) for m, p in _searched_plans()]):
        argv = flag_argv(megatron_flags(model, plan, training=training))
        if model.position_embedding_type == "rope" or model.multi_latent_attention:
            argv.append("--no-rope-fusion")      # rope fusion needs Transformer Engine
        env = dict(line.split(" ", 1)[1].split("=", 1) for line in environment_block(plan)
                   if line.startswith("export "))
        priced = training is CHECKPOINTED    # a priced plan's script: checkpoints, async saves
        cases.append({"argv": argv, "world": plan.world_size,
                      "save_interval": 50 if priced else None,
                      "async_save": priced and not plan.megatron_fsdp,
                      "vpp": plan.vp if plan.vp > 1 else None, "dp": plan.dp,
                      "force_balance": bool(model.is_moe
                                            and plan.moe_router_force_load_balancing),
                      # what the launch scripts set (launchers/script_parts.py; FSDP unsets
                      # the connections, i.e. the default 8)
                      "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "8"} | env})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    code = megatron_arguments_preamble(MEGATRON_SRC) + textwrap.dedent(f"""
        for case in json.load(open({str(tmp_path / "cases.json")!r})):
            os.environ.update(WORLD_SIZE=str(case["world"]), RANK="0", **case["env"])
            sys.argv = ["pretrain_gpt.py"] + case["argv"]
            with contextlib.redirect_stdout(io.StringIO()):
                args = A.validate_args(A.parse_args())
                A.core_transformer_config_from_args(args)
            assert args.virtual_pipeline_model_parallel_size == case["vpp"], case
            assert args.data_parallel_size == case["dp"], case
            assert args.moe_router_force_load_balancing == case["force_balance"], case
            # the checkpoint flags survive validate_args (an async save it would switch off)
            assert args.save_interval == case["save_interval"], case
            assert bool(args.async_save) == case["async_save"], case
        print("OK", len(json.load(open({str(tmp_path / "cases.json")!r}))))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    if res.stdout.startswith("SKIP"):
        pytest.skip(res.stdout.strip())
    assert res.returncode == 0 and res.stdout.startswith("OK"), res.stderr[-3000:]
    assert int(res.stdout.split()[1]) == len(cases)


@pytest.mark.parametrize("job", TRIAL_JOBS)
def test_trial_scripts_pass_validate_args(tmp_path, job):
    """Every script ``configurator trial`` writes: Megatron's own flags, its validate_args
    rules, mock data and the short run (``--train-iters``) the trial asked for (Megatron's
    own validate_args runs on them in :func:`test_megatron_own_validate_args`)."""
    from configurator.core.model_presets import load_model

    out = _trial(job, str(tmp_path / "t"))
    model = load_model(job["model"])
    known = megatron_flag_names()
    assert len(out.runs) == 5
    for r in out.runs:
        argv = flag_argv(megatron_flags(model, r.plan, training=TrainingArgs(
            train_iters=30, lr_warmup_iters=10)))
        a = parse_argv(argv)
        assert {w for w in argv if w.startswith("--")} <= known
        assert_validate_args_rules(a, r.plan.world_size)
        assert a["--train-iters"] == "30" and a["--mock-data"] is True
        text = open(os.path.join(r.directory, "launch_torchrun.sh")).read()
        assert " ".join(argv[:6]) in " ".join(text.split())
        slurm = open(os.path.join(r.directory, "launch_slurm.sbatch")).read()
        assert f"--job-name=trial{r.index}" in slurm
