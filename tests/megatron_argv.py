"""Shared test helpers: sample models and plans, and Megatron argv checks.

``assert_validate_args_rules`` re-states the rules of Megatron-LM core_v0.16.1
(megatron/training/arguments.py ``validate_args``; TransformerConfig ``__post_init__``) that
can be checked on an argv alone.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from configurator.core.errors import InputError
from configurator.core.model import MODEL_PRESETS, make_model
from configurator.core.plan import ParallelPlan
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
                            overlap_param_gather=opg)
        try:
            check_plan(model, plan, plan.world_size)
        except InputError:
            continue
        out.append((model, plan))
    return out


SPREAD = plan_spread()


def parse_argv(argv: list[str]) -> dict[str, str | bool]:
    """Megatron argv -> {flag: value or True}; a flag followed by a flag is a switch."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        assert argv[i].startswith("--"), argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            assert argv[i] not in out, f"{argv[i]} given twice"
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = True
            i += 1
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
    assert layers % pp == 0 and heads % tp == 0
    mbs, gbs = int(a["--micro-batch-size"]), int(a["--global-batch-size"])
    assert gbs % (mbs * dp) == 0
    if "--overlap-param-gather" in a:
        assert "--use-distributed-optimizer" in a and "--overlap-grad-reduce" in a
    if "--sequence-parallel" in a:
        assert tp > 1
    gran = a.get("--recompute-granularity")
    if gran == "full":
        assert a["--recompute-method"] in ("uniform", "block")
        assert 1 <= int(a["--recompute-num-layers"]) <= layers // pp
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


