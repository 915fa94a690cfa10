"""Megatron-LM training logs read as measured runs (configurator.core.megatron_log).

The fixtures in tests/data/megatron_logs hold Megatron-LM core_v0.16.1's own arguments dump
(its validate_args run on the plan's flags) and lines in training_log's / report_memory's
formats (make_fixtures.py there says how they were written).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from configurator.core import megatron_log as ml
from configurator.core.errors import InputError
from configurator.core.megatron_log import load_megatron_log, runs_from_megatron_log
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.runs import run_from_mapping, runs_to_rows
from configurator.core.units import GiB

DATA = Path(__file__).parent / "data" / "megatron_logs"
DENSE = DATA / "llama3-8b_tp2pp2_16xh100.log"
MOE = DATA / "qwen3-30b-a3b_ep8_mxfp8_16xb200.log"
DENSE_TEXT = DENSE.read_text()
MOE_TEXT = MOE.read_text()
#: The plans the fixtures' jobs ran (make_fixtures.py), with the schema's defaults.
DENSE_PLAN = ParallelPlan(tp=2, pp=2, dp=4, micro_batch_size=1, global_batch_size=64,
                          recompute="selective", sequence_parallel=True,
                          distributed_optimizer=True)
MOE_PLAN = ParallelPlan(tp=1, pp=2, dp=8, ep=8, etp=1, micro_batch_size=1,
                        global_batch_size=256, precision="mxfp8", distributed_optimizer=True,
                        fp8_param_gather=False)    # the log's; the plan field's default is on
ITER = re.compile(r"iteration\s+(\d+)/.*elapsed time per iteration \(ms\): ([\d.]+) \| "
                  r"throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)")


def logged(text):
    """(iteration, ms, TFLOP/s) of every iteration line, read independently of the module."""
    return [(int(m[1]), float(m[2]), float(m[3])) for m in map(ITER.search, text.splitlines())
            if m]


def with_args(text: str, **values) -> str:
    """``text`` with the arguments dump's ``name`` lines set to ``values`` (as
    ``_print_args`` prints them; None removes the line); each name must be there."""
    lines = text.splitlines()
    for name, val in values.items():
        pat = re.compile(rf"^(.*?  ){name} (\.*) ")
        hits = [i for i, ln in enumerate(lines) if pat.match(ln)]
        assert len(hits) == 1, name
        i = hits[0]
        if val is None:
            del lines[i]
        else:
            prefix = pat.match(lines[i]).group(1)
            lines[i] = f"{prefix}{name} {'.' * (48 - len(name))} {val}"
    return "\n".join(lines) + "\n"


def one(text, **kw):
    kw.setdefault("cluster", "dgx-h100")
    runs = runs_from_megatron_log(text, **kw)
    assert len(runs) == 1
    return runs[0]


def test_dense_fixture_model_plan_and_figures():
    (run,) = load_megatron_log(str(DENSE), cluster="dgx-h100-16")
    assert run.name == "llama3-8b_tp2pp2_16xh100" and run.source == DENSE.name
    assert run.cluster == "dgx-h100-16" and run.num_gpus == 16 and run.seq_length == 8192
    assert run.model == dataclasses.replace(MODEL_PRESETS["llama3-8b"], name=run.name)
    assert run.plan == DENSE_PLAN          # the round trip: the plan the job was launched with
    lines = logged(DENSE_TEXT)
    assert [it for it, _, _ in lines] == list(range(1, 21))
    kept = lines[2:]                       # 20 lines: the first 2 are warm-up
    assert run.iteration_time_s == pytest.approx(statistics.median(ms for _, ms, _ in kept)
                                                 / 1000)
    assert run.tflops_per_gpu == pytest.approx(statistics.median(t for _, _, t in kept))
    assert run.flops_formula == "megatron"
    assert run.peak_memory_bytes == pytest.approx(62286.00 * 2**20)   # max reserved, MiB
    assert run.extra["iterations"] == (3, 20) and run.extra["skipped_lines"] == 2
    assert run.extra["memory_reports"] == 8


def test_moe_mxfp8_fixture_with_srun_prefixes():
    (run,) = load_megatron_log(str(MOE), cluster="b200")
    # the run's router balanced each micro-batch (its arguments: Megatron's default loss, as
    # Megatron-Bridge's Qwen3 bridge sets it), where the preset says how Qwen3 was trained
    assert run.model == dataclasses.replace(MODEL_PRESETS["qwen3-30b-a3b"], name=run.name,
                                            moe_router_load_balancing_type="aux_loss")
    assert run.model.is_moe and run.model.moe_ffn_hidden_size == 768
    assert run.plan == MOE_PLAN and run.plan.precision == "mxfp8"
    lines = logged(MOE_TEXT)
    assert [it for it, _, _ in lines] == [1] + list(range(5, 51, 5))
    assert run.iteration_time_s == pytest.approx(statistics.median(
        ms for _, ms, _ in lines[2:]) / 1000)
    assert run.peak_memory_bytes / GiB == pytest.approx(132446.00 / 1024)


def test_text_and_file_agree():
    assert one(DENSE_TEXT, name="llama3-8b_tp2pp2_16xh100",
               source=DENSE.name) == load_megatron_log(str(DENSE), cluster="dgx-h100")[0]


@pytest.mark.parametrize("prefix", ["[rank0]: ", "0: ", "[default0]:", "12: ",
                                    "2025-11-03T10:14:07.123456789Z ",
                                    "[2025-11-03 10:14:07,123] [INFO] "])
def test_prefixed_lines(prefix):
    text = "".join(prefix + ln + "\r\n" for ln in DENSE_TEXT.splitlines())
    run = one(text, name="x")
    ref = one(DENSE_TEXT, name="x")
    assert (run.plan, run.model, run.iteration_time_s, run.tflops_per_gpu,
            run.peak_memory_bytes) == (ref.plan, ref.model, ref.iteration_time_s,
                                       ref.tflops_per_gpu, ref.peak_memory_bytes)


@pytest.mark.parametrize("fp8, recipe, precision, noted", [
    ("hybrid", "delayed", "fp8", False), ("e4m3", "tensorwise", "fp8", False),
    ("e4m3", "custom", "fp8", True),
    ("e4m3", "mxfp8", "mxfp8", False), ("None", "mxfp8", "bf16", False)])
def test_fp8_args(fp8, recipe, precision, noted):
    run = one(with_args(DENSE_TEXT, fp8=fp8, fp8_recipe=recipe))
    assert run.plan.precision == precision
    assert bool(run.extra["notes"]) == noted


def test_fp16_fp32_fp4():
    assert one(with_args(DENSE_TEXT, bf16="False", fp16="True")).plan.precision == "fp16"
    with pytest.raises(InputError, match="FP32"):
        one(with_args(DENSE_TEXT, bf16="False"))
    with pytest.raises(InputError, match="fp4.*FP4"):
        one(with_args(DENSE_TEXT, fp4="nvfp4"))


# Plans whose Megatron arguments differ from the fixture's: (argument values, plan).
ROUND_TRIPS = [
    (dict(virtual_pipeline_model_parallel_size=2, recompute_granularity="full",
          recompute_method="uniform", recompute_num_layers=1, overlap_param_gather="False"),
     dataclasses.replace(DENSE_PLAN, vp=2, recompute="full", overlap_param_gather=False)),
    (dict(context_parallel_size=2, data_parallel_size=2, decoder_first_pipeline_num_layers=15,
          decoder_last_pipeline_num_layers=17, bf16="False", fp16="True",
          sequence_parallel="False", use_distributed_optimizer="False",
          overlap_param_gather="False"),
     dataclasses.replace(DENSE_PLAN, cp=2, dp=2, decoder_first_pipeline_num_layers=15,
                         decoder_last_pipeline_num_layers=17, precision="fp16",
                         sequence_parallel=False, distributed_optimizer=False,
                         overlap_param_gather=False)),
    (dict(tensor_model_parallel_size=1, data_parallel_size=8, sequence_parallel="False",
          account_for_embedding_in_pipeline_split="True",
          account_for_loss_in_pipeline_split="True", attention_backend="AttnBackend.flash",
          overlap_grad_reduce="False", overlap_param_gather="False",
          recompute_granularity="None", micro_batch_size=2, global_batch_size=128),
     dataclasses.replace(DENSE_PLAN, tp=1, dp=8, sequence_parallel=False,
                         account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True, attention_backend="flash",
                         overlap_grad_reduce=False, overlap_param_gather=False,
                         recompute="none", micro_batch_size=2, global_batch_size=128)),
    (dict(transformer_impl="local"), dataclasses.replace(DENSE_PLAN, attention_backend="local")),
]


@pytest.mark.parametrize("args, plan", ROUND_TRIPS)
def test_plan_round_trip(args, plan):
    text = with_args(DENSE_TEXT, **args)
    if "global_batch_size" in args:        # the iteration lines log the batch too
        text = text.replace("global batch size:    64", "global batch size:   128")
    run = one(text)
    assert run.plan == plan
    # and through a run file's row
    back = run_from_mapping(runs_to_rows([run])[0])
    assert dataclasses.replace(back.plan, overlap_param_gather=plan.overlap_param_gather) \
        == plan


def test_recompute_block_is_noted():
    run = one(with_args(DENSE_TEXT, recompute_granularity="full", recompute_method="block",
                        recompute_num_layers=4))
    assert run.plan.recompute == "full" and "block" in run.extra["notes"][0]


def test_moe_args_and_dense_expert_sizes():
    # a dense model's expert_tensor_parallel_size (Megatron sets it to tp) is not read
    assert one(DENSE_TEXT).plan.etp == 1
    text = with_args(MOE_TEXT, moe_shared_expert_intermediate_size=1536,
                     moe_layer_freq=str([0, 0] + [1] * 46), expert_tensor_parallel_size=2,
                     moe_router_topk=4)
    model = one(text).model
    assert model.moe_shared_expert_intermediate_size == 1536 and model.moe_router_topk == 4
    assert model.moe_layer_freq == (0, 0) + (1,) * 46 and model.num_moe_layers == 46
    assert one(text).plan.etp == 2
    # MoE fields without num_experts are Megatron's defaults, not the model's
    with pytest.raises(InputError, match="topk"):
        one(with_args(MOE_TEXT, num_experts=2))


def test_gqa_window_and_mla_args():
    dense = with_args(DENSE_TEXT, group_query_attention="False")
    assert one(dense).model.num_query_groups == 32      # without GQA: one group per head
    win = one(with_args(DENSE_TEXT, window_size="(4096, 0)", window_attn_skip_freq=4)).model
    assert (win.window_size, win.window_attn_skip_freq) == (4096, 4)
    with pytest.raises(InputError, match="causal window"):
        one(with_args(DENSE_TEXT, window_size="(4096, 16)"))
    mla = one(with_args(DENSE_TEXT, multi_latent_attention="True", q_lora_rank=1536,
                        kv_lora_rank=512, group_query_attention="False",
                        position_embedding_type="rope")).model
    assert mla.multi_latent_attention and mla.q_lora_rank == 1536 and mla.kv_lora_rank == 512
    assert mla.num_query_groups == mla.num_attention_heads


def test_quick_geglu_args_read_as_gpt_oss_gated_mlp():
    """A GPT-OSS run's dump (--quick-geglu, the clamp, --glu-linear-offset 1.0, as our
    scripts write it) reads as a gated MLP with its clamp; a SwiGLU one has no clamp."""
    gpt_oss = one(with_args(MOE_TEXT, swiglu="False", quick_geglu="True",
                            activation_func_clamp_value="7.0", glu_linear_offset="1.0")).model
    assert gpt_oss.swiglu and gpt_oss.activation_func_clamp_value == 7.0
    plain = one(MOE_TEXT).model
    assert plain.swiglu and plain.activation_func_clamp_value is None


def test_vocab_sources():
    no_line = DENSE_TEXT.replace(" > padded vocab", " > vocab")
    # NullTokenizer: vocab_size + 1 (EOD), padded to 128 * tp
    assert one(no_line).model.vocab_size == 128256
    assert one(with_args(no_line, vocab_size=50000)).model.vocab_size == 50176
    assert one(with_args(no_line, padded_vocab_size=50304)).model.vocab_size == 50304
    hf = with_args(no_line, tokenizer_type="HuggingFaceTokenizer", vocab_size="None")
    with pytest.raises(InputError, match="vocab_size"):
        one(hf)
    assert one(hf, overrides={"vocab_size": 128256}).model.vocab_size == 128256
    line = DENSE_TEXT.replace("(size: 128256) with 0 dummy tokens (new size: 128256)",
                              "(size: 50257) with 47 dummy tokens (new size: 50304)")
    assert one(line).model.vocab_size == 50304


def iteration_lines(ms_values, gbs=64, start=1, tflops=True):
    out = []
    for k, ms in enumerate(ms_values, start=start):
        s = f" [2025-11-03 10:14:{k % 60:02d}.000000] iteration {k:8d}/{1000:8d} |"
        s += f" consumed samples: {k * gbs:12d} | elapsed time per iteration (ms): {ms:.1f} |"
        if tflops:
            s += f" throughput per GPU (TFLOP/s/GPU): {1e6 / ms:.1f} |"
        s += f" learning rate: 3.000000E-04 | global batch size: {gbs:5d} | lm loss: " \
             "5.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 |"
        out.append(s)
    return "\n".join(out) + "\n"


HEAD = DENSE_TEXT[:DENSE_TEXT.index(" [2025-11-03")]


def test_median_and_warm_up():
    ms = [90000.0, 30000.0] + [1000.0, 1200.0, 1100.0, 5000.0, 1050.0]
    run = one(HEAD + iteration_lines(ms))
    assert run.iteration_time_s == pytest.approx(1.1)          # median of the last 5
    assert run.tflops_per_gpu == pytest.approx(statistics.median(
        round(1e6 / x, 1) for x in ms[2:]))
    assert run.extra["iterations"] == (3, 7)
    assert one(HEAD + iteration_lines(ms), skip_iterations=0).iteration_time_s == \
        pytest.approx(1.2)
    assert one(HEAD + iteration_lines(ms), skip_iterations=4).iteration_time_s == \
        pytest.approx(1.1)
    # 10 % of 40 lines: 4 skipped
    many = [50000.0] * 4 + [2000.0] * 36
    assert one(HEAD + iteration_lines(many)).extra["skipped_lines"] == 4
    with pytest.raises(InputError, match="too few"):
        one(HEAD + iteration_lines([1000.0, 1000.0]))
    with pytest.raises(InputError, match="skip_iterations"):
        one(HEAD + iteration_lines(ms), skip_iterations=-1)
    # without --log-throughput: time only
    bare = one(HEAD + iteration_lines(ms, tflops=False))
    assert bare.tflops_per_gpu is None and bare.flops_formula is None


def test_batch_ramp_up_and_repeated_lines_are_left_out():
    ramp = iteration_lines([9000.0, 500.0, 600.0, 700.0], gbs=16) + iteration_lines(
        [3000.0, 3000.0, 2000.0, 2100.0, 2200.0], start=5)
    run = one(HEAD + ramp + iteration_lines([9999.0], start=7))   # a repeated report
    assert run.extra["iterations"] == (7, 9)
    assert run.iteration_time_s == pytest.approx(2.1)


def test_two_job_starts_in_one_log():
    crashed = HEAD + iteration_lines([9000.0])                     # died after 1 iteration
    again = with_args(HEAD, micro_batch_size=2) + iteration_lines([9000.0, 4000.0, 2000.0,
                                                                    2000.0])
    (run,) = runs_from_megatron_log(crashed + again, cluster="c", name="job")
    assert run.plan.micro_batch_size == 2 and run.name == "job#2"   # the 2nd start
    runs = runs_from_megatron_log(DENSE_TEXT + again, cluster="c", name="job")
    assert [r.name for r in runs] == ["job#1", "job#2"]
    assert [r.plan.micro_batch_size for r in runs] == [1, 2]


def test_missing_arguments_block():
    body = DENSE_TEXT[DENSE_TEXT.index("INFO:megatron.core.num_micro"):]
    with pytest.raises(InputError, match="arguments") as err:
        one(body)
    assert "\n" not in str(err.value) and "job's start" in str(err.value)
    run = one(body, model="llama3-8b", overrides={
        "tp": 2, "pipeline_model_parallel_size": 2, "num_gpus": 16, "mbs": 1, "gbs": 64,
        "precision": "bf16", "recompute": "selective"})
    assert run.model == "llama3-8b" and run.plan == DENSE_PLAN
    assert run.peak_memory_bytes == pytest.approx(62286.00 * 2**20)
    with pytest.raises(InputError, match="tp"):
        one(body, model="llama3-8b", overrides={"num_gpus": 16})


def test_overrides():
    run = one(DENSE_TEXT, overrides={"name": "mine", "group": "h100", "seq_length": 4096,
                                     "peak_memory_GiB": 70})
    assert run.name == run.model.name == "mine" and run.group == "h100"
    assert run.seq_length == run.model.seq_length == 4096
    assert run.peak_memory_bytes == 70 * GiB
    assert one(DENSE_TEXT, overrides={"tp": 4, "pp": 1}).plan.dp == 4   # dp re-derived
    assert one(DENSE_TEXT, flops_formula="megatron-full-attention").flops_formula == \
        "megatron-full-attention"
    for bad, match in (({"bogus": 1}, "unknown key"), ({"model": "x"}, "model="),
                       ({"tp": 3}, "tp")):
        with pytest.raises(InputError, match=match):
            one(DENSE_TEXT, overrides=bad)
    with pytest.raises(InputError, match="not with model="):
        one(DENSE_TEXT, model="llama3-8b", overrides={"num_layers": 2})
    assert one(DENSE_TEXT, model="llama3-8b").model == "llama3-8b"


def test_no_iteration_lines():
    with pytest.raises(InputError, match="iteration line") as err:
        one(HEAD)
    assert "\n" not in str(err.value)


def test_long_argument_names_and_truncated_dump():
    segs = ml._parse(DENSE_TEXT.splitlines(), "x")
    args = segs[1].args
    assert args["inference_dynamic_batching_cuda_graph_max_tokens"] == "16384"
    assert args["world_size"] == "16" and len(args) > 600
    cut = DENSE_TEXT.replace("-------------------- end of arguments ---------------------",
                             "")
    assert one(cut).plan == DENSE_PLAN


@pytest.mark.parametrize("data, match", [
    (b"\x00\x01\x02ELF" * 100, "binary"), (b"", "arguments"),
    (bytes(range(256)) * 50, "binary"), ("\u00e9t\u00e9\n".encode("latin-1") * 10, "arguments"),
    (b"a" * (3 * 2**20), "arguments")])
def test_bad_files(tmp_path, data, match):
    p = tmp_path / "x.log"
    p.write_bytes(data)
    with pytest.raises(InputError, match=match) as err:
        load_megatron_log(str(p), cluster="c")
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="cannot be read"):
        load_megatron_log(str(tmp_path / "missing.log"), cluster="c")
    with pytest.raises(InputError, match="cannot be read"):
        load_megatron_log(str(tmp_path), cluster="c")


def test_size_and_line_caps(tmp_path, monkeypatch):
    monkeypatch.setattr(ml, "MAX_LOG_BYTES", 10_000)
    p = tmp_path / "big.log"
    p.write_text(DENSE_TEXT)
    with pytest.raises(InputError, match="larger than"):
        load_megatron_log(str(p), cluster="c")
    with pytest.raises(InputError, match="larger than"):
        one(DENSE_TEXT)
    monkeypatch.setattr(ml, "MAX_LOG_BYTES", 2**30)
    monkeypatch.setattr(ml, "MAX_LOG_LINES", 100)
    with pytest.raises(InputError, match="lines"):
        one(DENSE_TEXT)
    with pytest.raises(InputError):
        runs_from_megatron_log(b"bytes", cluster="c")


#: The dense fixture as the tool's launch scripts log it: their hosts line first.
FIXTURE_LINES = ["configurator: hosts cnode2-001 cnode2-002"] + DENSE_TEXT.splitlines()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_fuzz_garbage_text(text):
    with pytest.raises(InputError) as err:
        one(text)
    assert "\n" not in str(err.value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(FIXTURE_LINES) - 1),
                          st.text(max_size=40)), max_size=8))
def test_fuzz_corrupted_fixture(edits):
    """Lines of the fixture replaced by junk or cut: a run or a one-line InputError."""
    lines = list(FIXTURE_LINES)
    for i, junk in edits:
        lines[i] = lines[i][:len(lines[i]) // 2] + junk
    try:
        runs = runs_from_megatron_log("\n".join(lines), cluster="c")
    except InputError as exc:
        assert "\n" not in str(exc)
    else:
        assert runs and all(r.iteration_time_s > 0 for r in runs)


def test_selective_recompute_modules_are_read():
    """Megatron prints the list (``['moe_act', 'layernorm']``): the MoE fixture's plan gets
    it, whichever of Megatron's modules it names."""
    text = with_args(MOE_TEXT, recompute_granularity="selective",
                     recompute_modules="['layernorm', 'moe_act']")
    run = one(text, cluster="dgx-b200")
    assert run.plan == dataclasses.replace(MOE_PLAN, recompute="selective",
                                           recompute_modules="moe_act,layernorm")
    run = one(with_args(MOE_TEXT, recompute_granularity="selective",
                        recompute_modules="['moe', 'mlp']"), cluster="dgx-b200")
    assert run.plan.recompute_modules == "mlp,moe" and not run.extra["notes"]


def test_fp8_param_gather_is_read_and_absent_means_megatron_default():
    """The MXFP8 fixture with ``fp8_param_gather True`` reads as on; a dump without the line
    (Megatron before the flag existed) reads as Megatron's default, off, not the plan field's
    default (on)."""
    assert one(with_args(MOE_TEXT, fp8_param_gather="True"),
               cluster="dgx-b200").plan.fp8_param_gather is True
    assert one(with_args(MOE_TEXT, fp8_param_gather=None),
               cluster="dgx-b200").plan.fp8_param_gather is False
    assert ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8,
                        precision="mxfp8").fp8_param_gather is True
    # where the flag does not apply (BF16) the plan keeps its default, as launched
    assert one(DENSE_TEXT, cluster="dgx-h100-16").plan.fp8_param_gather is True


def test_moe_communication_graph_optimizer_and_offload_arguments_are_read():
    """The recipe mechanisms a job ran with come back as plan fields: the expert all-to-all
    overlap and delayed weight gradients, the flex dispatcher and its backend, the capacity
    factor with padding, the fusions, Transformer Engine graphs of named scopes (printed as
    ``CudaGraphScope`` members), the precision-aware optimizer's dtypes (printed as torch
    dtypes; ``torch.uint8`` is FP8) and the offloaded modules."""
    text = with_args(
        MOE_TEXT, overlap_moe_expert_parallel_comm="True", delay_wgrad_compute="True",
        moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
        moe_expert_capacity_factor="1.5", moe_pad_expert_input_to_capacity="True",
        moe_permute_fusion="True", moe_router_fusion="True",
        cuda_graph_impl="transformer_engine",
        cuda_graph_scope="[<CudaGraphScope.attn: 2>, <CudaGraphScope.moe_router: 5>, "
                         "<CudaGraphScope.moe_preprocess: 6>]",
        use_precision_aware_optimizer="True", main_grads_dtype="torch.bfloat16",
        exp_avg_dtype="torch.bfloat16", exp_avg_sq_dtype="torch.uint8",
        fine_grained_activation_offloading="True", offload_modules="['expert_fc1', 'moe_act']")
    p = one(text, cluster="dgx-b200").plan
    assert (p.overlap_moe_expert_parallel_comm, p.delay_wgrad_compute) == (True, True)
    assert (p.moe_token_dispatcher_type, p.moe_flex_dispatcher_backend) == ("flex", "hybridep")
    assert (p.moe_expert_capacity_factor, p.moe_pad_expert_input_to_capacity) == (1.5, True)
    assert p.moe_permute_fusion and p.moe_router_fusion
    assert (p.cuda_graph_impl, p.cuda_graph_scope) == ("transformer_engine",
                                                       "attn,moe_router,moe_preprocess")
    assert (p.use_precision_aware_optimizer, p.main_grads_dtype, p.exp_avg_dtype,
            p.exp_avg_sq_dtype, p.main_params_dtype) == (True, "bf16", "bf16", "fp8", "fp32")
    assert p.offload_modules == "expert_fc1,moe_act"
    # the fixture as run: Megatron's defaults everywhere
    q = one(MOE_TEXT, cluster="dgx-b200").plan
    assert not (q.overlap_moe_expert_parallel_comm or q.use_precision_aware_optimizer
                or q.offload_modules or q.moe_expert_capacity_factor)
    assert q.moe_token_dispatcher_type == "alltoall" and q.cuda_graph_impl == "none"


def test_the_launch_scripts_hosts_line_names_the_runs_hosts():
    """The line the tool's launch scripts print before Megatron starts
    (``launchers.script_parts.HOSTS_LINE_PREFIX``: the job's hosts in node_rank order) gives
    the run's hosts, with any line prefix; each job start in a log takes the line before it
    (or one printed after its arguments, before its iterations); a log without one names
    none; a name a run file could not hold is an error naming ``hosts``."""
    from configurator.core.megatron_log import HOSTS_LINE_PREFIX

    def line(names):
        return HOSTS_LINE_PREFIX + names + "\n"
    assert one(DENSE_TEXT, name="x").hosts is None
    assert one(line("cnode2-001 cnode2-002") + DENSE_TEXT, name="x").hosts == (
        "cnode2-001", "cnode2-002")
    assert one("12: " + line("a  b ") + DENSE_TEXT, name="x").hosts == ("a", "b")
    runs = runs_from_megatron_log(line("a b") + DENSE_TEXT + line("c d") + DENSE_TEXT,
                                  cluster="c", name="job")
    assert [r.hosts for r in runs] == [("a", "b"), ("c", "d")]
    runs = runs_from_megatron_log(line("a b") + DENSE_TEXT + DENSE_TEXT, cluster="c",
                                  name="job")
    assert [r.hosts for r in runs] == [("a", "b"), None]     # a start of another script
    end = DENSE_TEXT.index("\n", DENSE_TEXT.index("end of arguments")) + 1
    after = DENSE_TEXT[:end] + line("e f") + DENSE_TEXT[end:]
    assert one(after, name="x").hosts == ("e", "f")
    with pytest.raises(InputError, match="hosts"):
        one(line("a a") + DENSE_TEXT, name="x")
    with pytest.raises(InputError, match="hosts"):
        one(line(" ".join(f"h{i}" for i in range(17))) + DENSE_TEXT, name="x")


def test_the_launch_scripts_gpu_order_line_gives_the_runs_gpu_order():
    """The placement's GPU order line (``GPU_ORDER_LINE_PREFIX``, each node_rank's
    ``CUDA_VISIBLE_DEVICES``) gives the run's ``gpu_order`` beside its hosts, each job
    start taking the lines before it; a log without one has none; an order the run's GPUs
    do not fill is an error naming ``gpu_order``."""
    from configurator.core.megatron_log import GPU_ORDER_LINE_PREFIX, HOSTS_LINE_PREFIX

    order = "7,6,5,4,3,2,1,0 0,1,2,3,4,5,6,7"
    lines = HOSTS_LINE_PREFIX + "a b\n" + "[x] " + GPU_ORDER_LINE_PREFIX + order + "\n"
    run = one(lines + DENSE_TEXT, name="x")
    assert run.hosts == ("a", "b")
    assert run.gpu_order == (tuple(range(7, -1, -1)), tuple(range(8)))
    assert one(DENSE_TEXT, name="x").gpu_order is None
    runs = runs_from_megatron_log(lines + DENSE_TEXT + DENSE_TEXT, cluster="c", name="job")
    assert [r.gpu_order is None for r in runs] == [False, True]
    with pytest.raises(InputError, match="gpu_order"):
        one(GPU_ORDER_LINE_PREFIX + "0,1,2,3 4,5,6,7\n" + DENSE_TEXT, name="x")
