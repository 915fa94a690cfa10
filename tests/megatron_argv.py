"""Shared test helpers: sample models and plans, and Megatron argv checks.

``assert_validate_args_rules`` re-states the rules of Megatron-LM core_v0.16.1
(megatron/training/arguments.py ``validate_args``; TransformerConfig ``__post_init__``) that
can be checked on an argv alone.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from configurator.core.errors import InputError
from configurator.core.layers import parse_layout
from configurator.core.model import make_model
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.plan_values import CP_COMM_TYPES, CROSS_ENTROPY_FUSIONS
from configurator.core.rules import check_plan

FLAGS_FILE = Path(__file__).parent / "data" / "megatron_core_v0_16_flags.txt"
GPT3 = MODEL_PRESETS["gpt3-175b"]
LLAMA8 = MODEL_PRESETS["llama3-8b"]
# gpt3-175b on 16 nodes x 8: tp8 pp8 dp2, 3 virtual stages of 4 layers, SP, distopt, selective
GPT3_PLAN = ParallelPlan(tp=8, pp=8, dp=2, vp=3, micro_batch_size=1, global_batch_size=32,
                         recompute="selective", sequence_parallel=True,
                         distributed_optimizer=True)
SMALL = make_model(name="tiny", num_layers=8, hidden_size=256, num_attention_heads=8,
                   num_query_groups=4, vocab_size=1000, seq_length=512, swiglu=True,
                   normalization="RMSNorm", untie_embeddings_and_output_weights=True,
                   position_embedding_type="rope", hidden_dropout=0.0, attention_dropout=0.0)
SMALL_PLAN = ParallelPlan(tp=2, pp=2, dp=2, vp=2, micro_batch_size=1, global_batch_size=8,
                          recompute="full", sequence_parallel=True, distributed_optimizer=True)


def megatron_flag_names() -> set[str]:
    lines = FLAGS_FILE.read_text().splitlines()
    assert "core_v0.16" in lines[0] and "55ac7082" in lines[0]
    return {ln.strip() for ln in lines if ln.startswith("--")}


def plan_spread():
    """(model, plan) pairs: legal combinations covering every value of every plan field."""
    out = []
    models = [GPT3, LLAMA8, MODEL_PRESETS["llama2-70b"], MODEL_PRESETS["gpt-1.7b"], SMALL]
    for model, tp, pp, cp, vp, rec, prec, att, sp, dopt, ogr, opg in itertools.product(
            models, (1, 2, 8), (1, 2, 4), (1, 2), (1, 2), ("none", "selective", "full"),
            ("bf16", "fp16", "fp8", "mxfp8"), ("auto", "flash", "local"), (False, True),
            (False, True), (False, True), (False, True)):
        if (prec, att) not in (("bf16", "auto"), ("fp16", "local"), ("fp8", "flash"),
                               ("mxfp8", "auto")):
            continue                     # the kernels vary independently of the rest
        dp = 2
        plan = ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, micro_batch_size=1,
                            global_batch_size=dp * pp * 2, recompute=rec, precision=prec,
                            attention_backend=att, sequence_parallel=sp and tp > 1,
                            distributed_optimizer=dopt, overlap_grad_reduce=ogr,
                            overlap_param_gather=opg, fp8_param_gather=opg,
                            grad_reduce_in_bf16=ogr != opg, tp_comm_overlap=sp != dopt,
                            cross_entropy_fusion=CROSS_ENTROPY_FUSIONS[(tp + cp + vp) % 3],
                            megatron_fsdp=dopt and ogr and not opg and pp < 4,
                            cp_comm_type=CP_COMM_TYPES[(tp + pp + vp) % 3])
        try:
            check_plan(model, plan, plan.world_size)
        except InputError:
            continue
        out.append((model, plan))
    return out


#: Mixture-of-experts, multi-latent-attention and uneven-pipeline models: a Qwen3-MoE-like
#: model (kv_channels != h/a, qk_layernorm, RoPE base, norm epsilon, dense first layer) and
#: a DeepSeek-V3-like one (MLA, shared expert, MTP), 10 layers each.
MOE = make_model(name="tiny-moe", num_layers=10, hidden_size=256, num_attention_heads=8,
                 num_query_groups=4, kv_channels=64, vocab_size=1000, seq_length=512,
                 swiglu=True, normalization="RMSNorm", untie_embeddings_and_output_weights=True,
                 position_embedding_type="rope", rotary_base=1000000, norm_epsilon=1e-6,
                 hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=False,
                 qk_layernorm=True, add_qkv_bias=True, num_experts=8, moe_router_topk=2,
                 moe_ffn_hidden_size=128, moe_layer_freq=[0] + [1] * 9)
MLA = make_model(name="tiny-mla", num_layers=10, hidden_size=256, num_attention_heads=8,
                 vocab_size=1000, seq_length=512, swiglu=True, normalization="RMSNorm",
                 untie_embeddings_and_output_weights=True, position_embedding_type="rope",
                 hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=False,
                 num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=128,
                 moe_shared_expert_intermediate_size=128, multi_latent_attention=True,
                 q_lora_rank=96, kv_lora_rank=64, qk_head_dim=32, qk_pos_emb_head_dim=16,
                 v_head_dim=32, mtp_num_layers=1)
#: GPT-OSS-like: sliding window on every other layer, biases, clamped gated MLP, top-1
#: routing (Switch-style).
WINDOWED = make_model(name="tiny-window", num_layers=4, hidden_size=256, num_attention_heads=8,
                      num_query_groups=2, vocab_size=1000, seq_length=512, swiglu=True,
                      normalization="RMSNorm", untie_embeddings_and_output_weights=True,
                      position_embedding_type="rope", hidden_dropout=0.0,
                      attention_dropout=0.0, window_size=128, window_attn_skip_freq=2,
                      num_experts=4, moe_router_topk=1, moe_ffn_hidden_size=128,
                      activation_func_clamp_value=7.0)
MODERN_PLANS = [
    (WINDOWED, ParallelPlan(tp=1, pp=1, dp=4, ep=4, etp=1, micro_batch_size=1,
                            global_batch_size=4, distributed_optimizer=True)),
    (MOE, ParallelPlan(tp=2, pp=2, dp=2, ep=4, etp=1, micro_batch_size=1,
                       global_batch_size=8, recompute="selective", sequence_parallel=True,
                       distributed_optimizer=True)),
    (MOE, ParallelPlan(tp=1, pp=3, dp=2, ep=2, etp=1, micro_batch_size=1,
                       global_batch_size=6, decoder_first_pipeline_num_layers=3,
                       decoder_last_pipeline_num_layers=3, distributed_optimizer=True)),
    (MLA, ParallelPlan(tp=2, pp=2, dp=2, ep=2, etp=2, vp=2, micro_batch_size=1,
                       global_batch_size=8, recompute="full", sequence_parallel=True,
                       account_for_embedding_in_pipeline_split=True,
                       account_for_loss_in_pipeline_split=True)),
    (LLAMA8, ParallelPlan(tp=8, pp=3, dp=1, micro_batch_size=1, global_batch_size=3,
                          decoder_first_pipeline_num_layers=10,
                          decoder_last_pipeline_num_layers=10, sequence_parallel=True)),
    # 32 layers + embedding + loss = 34 slots over pp 2 x vp 17: the first and the last
    # virtual stage build no decoder layer
    (LLAMA8, ParallelPlan(tp=8, pp=2, vp=17, dp=1, micro_batch_size=1, global_batch_size=4,
                          account_for_embedding_in_pipeline_split=True,
                          account_for_loss_in_pipeline_split=True, sequence_parallel=True)),
    # a pipeline layout (DeepSeek-V3's form on a 10-layer model): 4 virtual stages over
    # pp 2, so vp 2, the MTP layer with the loss
    (MLA, ParallelPlan(tp=1, pp=2, vp=2, dp=4, ep=2, etp=1, micro_batch_size=1,
                       global_batch_size=8, distributed_optimizer=True,
                       pipeline_model_parallel_layout="Et*2|t*3|t*3|t*2mL")),
    # selective recompute of the norms and the experts' activation (Megatron-Bridge's
    # GPT-OSS recipes), with and without core attention
    (MOE, ParallelPlan(tp=1, pp=2, dp=4, ep=4, etp=1, micro_batch_size=1,
                       global_batch_size=8, recompute="selective",
                       recompute_modules="layernorm,moe_act", distributed_optimizer=True)),
    (MLA, ParallelPlan(tp=2, pp=2, dp=2, ep=2, etp=1, micro_batch_size=1,
                       global_batch_size=8, recompute="selective", sequence_parallel=True,
                       recompute_modules="moe_act,core_attn,layernorm",
                       distributed_optimizer=True)),
    # Megatron-Bridge's Llama-3 8B FP8 row on 8 H100 with Megatron FSDP over its 8 GPUs
    (LLAMA8, ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=128,
                          precision="fp8", distributed_optimizer=True, fp8_param_gather=True,
                          grad_reduce_in_bf16=True, cross_entropy_fusion="te",
                          megatron_fsdp=True)),
    # the expert all-to-all overlapped with the other microbatch's compute, the experts'
    # weight gradients delayed into it, Transformer Engine's fused permutation and routing
    (MOE, ParallelPlan(tp=1, pp=1, dp=4, ep=4, etp=1, micro_batch_size=1, global_batch_size=8,
                       distributed_optimizer=True, overlap_moe_expert_parallel_comm=True,
                       delay_wgrad_compute=True, moe_permute_fusion=True,
                       moe_router_fusion=True)),
    # Megatron-Bridge's DeepSeek-V3 form: a layout, the overlap, HybridEP, Transformer Engine
    # graphs of attention and router, the precision-aware optimizer with BF16 state, routing
    # forced to balance
    (MLA, ParallelPlan(tp=1, pp=2, vp=2, dp=4, ep=2, etp=1, micro_batch_size=1,
                       global_batch_size=8, distributed_optimizer=True,
                       moe_router_force_load_balancing=True,
                       pipeline_model_parallel_layout="Et*2|t*3|t*3|t*2mL",
                       overlap_moe_expert_parallel_comm=True,
                       moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                       cuda_graph_impl="transformer_engine",
                       cuda_graph_scope="attn,moe_router,moe_preprocess",
                       use_precision_aware_optimizer=True, main_grads_dtype="bf16",
                       exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")),
    # drop-and-pad experts under a full-iteration graph
    (MOE, ParallelPlan(tp=1, pp=1, dp=4, ep=4, etp=1, micro_batch_size=1, global_batch_size=8,
                       distributed_optimizer=True, moe_expert_capacity_factor=1.25,
                       moe_pad_expert_input_to_capacity=True, cuda_graph_impl="local",
                       cuda_graph_scope="full_iteration")),
    # FP8 blockwise scaling with DeepEP and a capacity factor (tokens dropped, not padded)
    (MOE, ParallelPlan(tp=2, pp=1, dp=2, ep=2, etp=1, micro_batch_size=1, global_batch_size=4,
                       sequence_parallel=True, distributed_optimizer=True, precision="fp8",
                       fp8_recipe="blockwise", moe_token_dispatcher_type="flex",
                       moe_expert_capacity_factor=1.5)),
    # FP8 current scaling with fine-grained activation offloading
    (LLAMA8, ParallelPlan(tp=2, pp=1, dp=4, micro_batch_size=1, global_batch_size=8,
                          sequence_parallel=True, distributed_optimizer=True,
                          precision="fp8", fp8_recipe="tensorwise",
                          offload_modules="attn_norm,core_attn,attn_proj,mlp_norm",
                          use_precision_aware_optimizer=True, main_params_dtype="fp16",
                          exp_avg_dtype="fp16", exp_avg_sq_dtype="fp8")),
    # CPU offloading of whole layers (pp 1, no recompute), as NVIDIA's GB200 recipes of
    # Llama-3 70B and 405B run it
    (LLAMA8, ParallelPlan(tp=2, pp=1, dp=4, micro_batch_size=1, global_batch_size=8,
                          sequence_parallel=True, distributed_optimizer=True,
                          precision="fp8", fp8_recipe="tensorwise",
                          cpu_offloading_num_layers=20)),
    # megatron-core's own layers on a machine without Apex: no fused softmax, the scores'
    # softmax in FP32
    (SMALL, ParallelPlan(tp=2, pp=1, dp=2, micro_batch_size=1, global_batch_size=4,
                         attention_backend="local", masked_softmax_fusion=False,
                         attention_softmax_in_fp32=True)),
    # routers balanced over the global batch (Qwen3's), by DeepSeek-V3's expert bias beside a
    # sequence-wise loss (with its sigmoid scores), and not at all (GPT-OSS's)
    *[(dataclasses.replace(MOE, moe_router_load_balancing_type=balancing,
                           moe_router_enable_expert_bias=bias),
       ParallelPlan(tp=1, pp=1, dp=4, ep=4, etp=1, micro_batch_size=1, global_batch_size=8,
                    distributed_optimizer=True))
      for balancing, bias in (("global_aux_loss", False), ("seq_aux_loss", True),
                              ("none", False))],
]
for _m, _p in MODERN_PLANS:
    check_plan(_m, _p, _p.world_size)

SPREAD = plan_spread() + MODERN_PLANS


def parse_argv(argv: list[str]) -> dict[str, str | bool | tuple]:
    """Megatron argv -> {flag: value, a tuple of values (a list argument), or True}; a flag
    followed by a flag is a switch."""
    out: dict[str, str | bool | tuple] = {}
    i = 0
    while i < len(argv):
        assert argv[i].startswith("--"), argv[i]
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        assert argv[i] not in out, f"{argv[i]} given twice"
        words = argv[i + 1:j]
        out[argv[i]] = True if not words else words[0] if len(words) == 1 else tuple(words)
        i = j
    return out


def assert_validate_args_rules(a: dict, world_size: int) -> None:
    """The rules of Megatron-LM core_v0.16.1 validate_args / TransformerConfig that can be
    checked on the argv alone (megatron/training/arguments.py)."""
    tp = int(a["--tensor-model-parallel-size"])
    pp = int(a["--pipeline-model-parallel-size"])
    cp = int(a.get("--context-parallel-size", 1))
    layers, heads = int(a["--num-layers"]), int(a["--num-attention-heads"])
    seq = int(a["--seq-length"])
    assert world_size % (tp * pp * cp) == 0
    dp = world_size // (tp * pp * cp)
    first = int(a.get("--decoder-first-pipeline-num-layers", 0))
    last = int(a.get("--decoder-last-pipeline-num-layers", 0))
    accounted = ("--account-for-embedding-in-pipeline-split" in a) + (
        "--account-for-loss-in-pipeline-split" in a)
    vp = int(a.get("--num-virtual-stages-per-pipeline-rank", 1))
    if "--pipeline-model-parallel-layout" in a:   # validate_args: vp from the stages
        assert not (first or last or accounted)
        stages = a["--pipeline-model-parallel-layout"]
        assert len(parse_layout(stages)) % pp == 0
        assert "".join(parse_layout(stages)).count("t") == layers
    elif first or last:        # uneven: TransformerConfig.__post_init__
        assert not accounted and "--num-layers-per-virtual-pipeline-stage" not in a
        mid_ranks = pp - (first > 0) - (last > 0)
        mid = layers - first - last
        assert first % vp == 0 and last % vp == 0
        assert (mid == 0) == (mid_ranks == 0)
        if mid_ranks:
            assert mid % mid_ranks == 0 and (mid // mid_ranks) % vp == 0
    else:
        assert (layers + accounted) % pp == 0
    assert heads % tp == 0
    if "--num-experts" in a:      # validate_args, TransformerConfig, parallel_state
        ep = int(a.get("--expert-model-parallel-size", 1))
        etp = int(a.get("--expert-tensor-parallel-size", tp))
        assert int(a["--num-experts"]) % ep == 0 and world_size % (etp * ep * pp) == 0
        if tp > 1:
            assert "--sequence-parallel" in a        # MoELayer.forward in training
        if "--disable-bias-linear" not in a:
            assert etp == 1
        assert int(a["--moe-router-topk"]) <= int(a["--num-experts"])
    else:
        assert "--expert-model-parallel-size" not in a
    if "--multi-latent-attention" in a:
        assert "--group-query-attention" not in a
    mbs, gbs = int(a["--micro-batch-size"]), int(a["--global-batch-size"])
    assert gbs % (mbs * dp) == 0
    if "--overlap-param-gather" in a:
        assert "--use-distributed-optimizer" in a and "--overlap-grad-reduce" in a
    if "--fp8-param-gather" in a:   # "--fp8-param-gather only supported with distributed ..."
        assert "--use-distributed-optimizer" in a and "--fp8-format" in a
    if "--sequence-parallel" in a:
        assert tp > 1
    gran = a.get("--recompute-granularity")
    if gran == "full":
        assert a["--recompute-method"] in ("uniform", "block")
        assert 1 <= int(a["--recompute-num-layers"])
    else:
        assert "--recompute-method" not in a and "--recompute-num-layers" not in a
    vp_flags = [f for f in ("--num-layers-per-virtual-pipeline-stage",
                            "--num-virtual-stages-per-pipeline-rank",
                            "--pipeline-model-parallel-layout") if f in a]
    assert len(vp_flags) <= 1
    if "--num-layers-per-virtual-pipeline-stage" in a:
        k = int(a["--num-layers-per-virtual-pipeline-stage"])
        assert (layers // pp) % k == 0 and (layers // pp) // k > 1 and pp > 1
        assert (gbs // (mbs * dp)) % pp == 0
    if cp > 1:
        assert seq % (2 * cp) == 0
    assert int(a["--max-position-embeddings"]) >= seq
    if "--group-query-attention" in a:
        g = int(a["--num-query-groups"])
        assert heads % g == 0 and (g % tp == 0 or tp % g == 0)
    assert not ("--fp16" in a and "--bf16" in a)
    if "--fp8-format" in a:
        assert a["--fp8-format"] in ("e4m3", "hybrid") and "--bf16" in a
    if "--fp8-recipe" in a:      # TransformerConfig.fp8_recipe's choices; needs --fp8-format
        assert a["--fp8-recipe"] in ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
        assert "--fp8-format" in a
    assert a.get("--attention-backend") != "local"   # asserts --spec local in validate_args
    assert float(a["--min-lr"]) <= float(a["--lr"])
    assert int("--mock-data" in a) + int("--data-path" in a) <= 1
    if a.get("--tokenizer-type") == "NullTokenizer":
        assert int(a["--vocab-size"]) > 0




def megatron_arguments_preamble(src: str) -> str:
    """Python source that imports Megatron-LM's ``megatron.training.arguments`` as ``A`` from
    a checkout at ``src`` without a GPU: its ``__init__`` skipped (it imports triton), the
    device checks answering as a Hopper GPU would; prints ``SKIP …`` and exits when six or
    regex (imported by its tokenizer modules) are missing."""
    return f"""
import contextlib, dataclasses, io, json, os, sys, types, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {src!r})
try:
    import six, regex  # noqa: F401
except ImportError:
    print("SKIP six/regex not installed"); sys.exit(0)
import megatron
pkg = types.ModuleType("megatron.training")
pkg.__path__ = [{src!r} + "/megatron/training"]
sys.modules["megatron.training"] = pkg
import megatron.training.global_vars as gv
for k in dir(gv):
    if k.startswith("get_"):
        setattr(pkg, k, getattr(gv, k))
import megatron.training.arguments as A
A.get_device_arch_version = lambda: 9
import torch
torch.cuda.get_device_capability = lambda *a: (9, 0)
# answer as the Transformer Engine core_v0.16.1 pins (>= 2.9) would: its version checks and
# the fused MoE permutation it provides
import megatron.core.transformer.transformer_config as TC
import megatron.core.transformer.moe.moe_utils as MU
TC.is_te_min_version = A.is_te_min_version = lambda *a, **k: True
for name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
             "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
    setattr(MU, name, getattr(MU, name, None) or object())
"""
