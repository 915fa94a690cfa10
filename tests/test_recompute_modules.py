"""Selective recompute's modules (Megatron ``--recompute-modules``): core_attn, layernorm and
moe_act, as Megatron-Bridge's GPT-OSS recipes run them (``layernorm``, ``moe_act``).

Memory: ``moe_act`` keeps the routed experts' fc1 output and drops fc2's input and the
activation's own saved tensors; ``layernorm`` drops an MoE layer's pre-MLP norm output (and
MLA's input-norm output); core attention is recomputed only where ``core_attn`` is listed.
Time: each recomputed module's forward runs again in backward."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.core.errors import InputError
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan, plan_from_dict
from configurator.core.plan_terms import recompute_code
from configurator.core.plan_values import RECOMPUTE_MODULES, recompute_module_list
from configurator.core.rules import check_plan
from configurator.cost.compute import layer_costs
from launchers.megatron_flags import flag_argv, format_value, megatron_flags
from memory_model.activations import (LayerInputs, linear_input_bytes, mlp_bytes_per_ffn_element,
                                      moe_mlp_activation_delta, recompute_module_bytes)
from memory_model.estimate import estimate_memory
from topology.cluster_files import load_cluster

OSS = MODEL_PRESETS["gpt-oss-120b"]
LLAMA = MODEL_PRESETS["llama3-8b"]
DSV3 = MODEL_PRESETS["deepseek-v3"]
#: Megatron-Bridge's GPT-OSS 120B H100 recipe (tp 1, pp 4, ep 8, mbs 1, 64 GPUs).
PLAN = ParallelPlan(tp=1, pp=4, dp=16, ep=8, etp=1, micro_batch_size=1,
                    global_batch_size=1280, distributed_optimizer=True,
                    moe_router_force_load_balancing=True)   # as Megatron-Bridge's recipe
BRIDGE = dataclasses.replace(PLAN, recompute="selective", recompute_modules="layernorm,moe_act")


def test_module_lists_are_megatron_choices_in_megatron_order():
    assert recompute_module_list("moe_act, layernorm") == ("moe_act", "layernorm")
    assert recompute_module_list("layernorm core_attn moe_act") == (
        "core_attn", "moe_act", "layernorm")
    assert set(recompute_module_list("core_attn")) <= set(RECOMPUTE_MODULES)
    for bad, what in (("", "at least one"), ("attn", "not a Megatron"),
                      ("moe_act,moe_act", "twice"), ("mlp,moe,mlpx", "not a Megatron")):
        with pytest.raises(InputError, match=what) as err:
            recompute_module_list(bad)
        assert err.value.field == "recompute_modules" and "\n" not in str(err.value)


def test_codes_carry_the_module_bits():
    assert int(recompute_code("none", "moe_act")) == 0
    assert int(recompute_code("full", "moe_act")) == 2
    assert int(recompute_code("selective", "core_attn")) == 1
    assert int(recompute_code("selective", "layernorm,moe_act")) == 4 | 8
    assert list(recompute_code([0, 1, 2], "core_attn,moe_act")) == [0, 1 | 8, 2]
    c = PlanBatch.from_plans([PLAN, dataclasses.replace(PLAN, recompute="full")])
    assert list(c.recompute_code) == [0, 2]


def test_modules_need_selective_recompute():
    """Megatron reads the list with selective recompute only: given with another
    granularity it is an error where a user gives it (estimate, run files); a plan of
    another granularity carries the default."""
    from configurator.core.rules import plan_for_world

    fields = dict(tp=1, pp=4, ep=8, micro_batch_size=1, global_batch_size=1280,
                  recompute_modules="moe_act")
    with pytest.raises(InputError, match="selective") as err:
        plan_for_world(fields, 64)
    assert err.value.field == "recompute_modules"
    assert plan_for_world(dict(fields, recompute="selective"), 64).recompute_modules == (
        "moe_act")
    assert dataclasses.replace(PLAN, recompute="full",
                               recompute_modules="moe_act").recompute_modules == "core_attn"


@pytest.mark.parametrize("plan, model, field, rule", [
    (dataclasses.replace(PLAN, recompute="selective", recompute_modules="moe_act"), LLAMA,
     "recompute_modules", "needs experts"),
    (dataclasses.replace(BRIDGE, precision="fp8"), OSS, "recompute_modules", "delayed"),
    (dataclasses.replace(BRIDGE, recompute_modules="mla_up_proj"), OSS, "recompute_modules",
     "multi-latent attention"),
    (dataclasses.replace(BRIDGE, recompute_modules="shared_experts"), OSS,
     "recompute_modules", "shared expert"),
])
def test_rules_name_the_field(plan, model, field, rule):
    if model is LLAMA:
        plan = dataclasses.replace(plan, ep=1)
    with pytest.raises(InputError, match=rule) as err:
        check_plan(model, plan, plan.world_size)
    assert err.value.field == field


def test_the_bridge_plan_is_legal_and_emits_a_list_flag():
    check_plan(OSS, BRIDGE, BRIDGE.world_size)
    check_plan(OSS, dataclasses.replace(BRIDGE, precision="bf16"), BRIDGE.world_size)
    argv = flag_argv(megatron_flags(OSS, BRIDGE))
    i = argv.index("--recompute-modules")
    assert argv[i + 1:i + 3] == ["moe_act", "layernorm"] and argv[i + 3].startswith("--")
    assert argv[argv.index("--recompute-granularity") + 1] == "selective"
    # the default list is Megatron's default: no flag
    argv = flag_argv(megatron_flags(OSS, dataclasses.replace(BRIDGE,
                                                             recompute_modules="core_attn")))
    assert "--recompute-modules" not in argv
    assert format_value(("moe_act", "layer norm")) == "moe_act 'layer norm'"


def test_plan_documents_round_trip_and_older_ones_default():
    d = BRIDGE.to_dict()
    assert d["recompute_modules"] == "moe_act,layernorm"        # one spelling, Megatron's order
    assert dataclasses.replace(BRIDGE, recompute_modules="layernorm moe_act") == BRIDGE
    assert plan_from_dict(d) == BRIDGE
    del d["recompute_modules"]
    assert plan_from_dict(d).recompute_modules == "core_attn"


def _act(model, plan, stage=1):
    return estimate_memory(model, PlanBatch.from_plan(plan))[stage].activations_bytes


def test_moe_act_and_layernorm_drop_what_megatron_core_discards():
    """Per MoE layer and microbatch in flight: moe_act drops ``R·f_e·(per_ffn − 2·gate)``
    (fc2's input and the clamp's copy; the checkpoint keeps the fc1 output), layernorm the
    pre-MLP norm output ``X·h`` (16-bit)."""
    x = LayerInputs(mbs=1, seq=4096, tp=1, sp=False, etp=1)
    R, X = 4 * 4096, 4096
    every, moe = recompute_module_bytes(OSS, x.replace(recompute=8))
    assert every == 0 and moe == R * OSS.moe_ffn_hidden_size * (
        mlp_bytes_per_ffn_element(OSS) - 4)
    assert mlp_bytes_per_ffn_element(OSS) - 4 == 6          # 4 (clamp's copy) + 2 (fc2 input)
    _, ln = recompute_module_bytes(OSS, x.replace(recompute=4))
    assert ln == linear_input_bytes("bf16") * X * OSS.hidden_size
    _, both = recompute_module_bytes(OSS, x.replace(recompute=12))
    assert both == moe + ln
    d0 = moe_mlp_activation_delta(OSS, x.replace(sp=True))
    d1 = moe_mlp_activation_delta(OSS, x.replace(recompute=12))
    assert d0 - d1 == both
    # the whole stage: every MoE layer of every microbatch in flight keeps that much less,
    # but the first backward re-materialises one layer's while it recomputes them
    none, bridge = _act(OSS, PLAN), _act(OSS, BRIDGE)
    n_layers = 9 * 3                 # stage 1: 9 layers x 3 microbatches in flight (1F1B)
    assert none - bridge == pytest.approx((n_layers - 1) * both, rel=1e-9)


def test_layernorm_reaches_only_unfused_norms():
    """A dense GQA model's norms are fused into Transformer Engine linears: layernorm
    recompute changes nothing; MLA's input norm is not."""
    plan = ParallelPlan(tp=1, pp=1, dp=8, micro_batch_size=1, global_batch_size=8,
                        recompute="selective", distributed_optimizer=True)
    ln = dataclasses.replace(plan, recompute_modules="core_attn,layernorm")
    assert _act(LLAMA, plan, 0) == _act(LLAMA, ln, 0)
    every, _ = recompute_module_bytes(DSV3, LayerInputs(mbs=1, seq=4096, tp=1, sp=False,
                                                        etp=1, recompute=4))
    assert every == 4096 * DSV3.hidden_size * 2


def test_recompute_reruns_the_modules_forward():
    gpu = load_cluster("dgx-h100-80gb").gpu

    def costs(plan):
        lc = layer_costs(OSS, PlanBatch.from_plan(plan), gpu)
        return {k: float(lc[k][0]) if hasattr(lc[k], "__len__") else float(lc[k])
                for k in ("recompute", "moe_recompute", "fwd", "moe_fwd")}

    none, act, ln = (costs(dataclasses.replace(PLAN, recompute="selective",
                                               recompute_modules=m))
                     for m in ("core_attn", "moe_act", "layernorm"))
    plain = costs(PLAN)
    assert plain["recompute"] == plain["moe_recompute"] == 0.0
    assert none["moe_recompute"] == none["recompute"] > 0          # core attention only
    assert act["recompute"] == ln["recompute"] == 0.0              # attention kept
    eff = gpu.efficiency
    norm = 4 * 4096 * OSS.hidden_size / (gpu.hbm_bandwidth_Bps * eff.hbm) + eff.kernel_overhead_s
    # the norm, then CheckpointWithoutOutput's copy of its output into the freed storage
    assert ln["moe_recompute"] == pytest.approx(2 * norm, rel=1e-12)
    assert act["moe_recompute"] > 3 * norm      # the activation's pass and its eager clamp
    assert act["moe_fwd"] == plain["moe_fwd"]  # the forward itself does not move


def test_megatron_core_checkpoint_keeps_only_the_fc1_output_on_the_cpu():
    """megatron-core's own ``CheckpointWithoutOutput`` around its clamped quick-GEGLU, the
    output discarded after the next linear as ``TEGroupedMLP`` does: what stays saved is the
    fc1 output (``2·gate`` bytes per FFN unit), against the ``per_ffn`` of
    :func:`mlp_bytes_per_ffn_element` without it; the gradients are the same."""
    torch = pytest.importorskip("torch")
    fused = pytest.importorskip("megatron.core.fusions.fused_bias_geglu")
    mrandom = pytest.importorskip("megatron.core.tensor_parallel.random")
    rng = (mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state)
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.zeros(1, dtype=torch.uint8)
    mrandom._set_cuda_rng_state = lambda *a, **k: None
    try:
        rows, ffn = 64, 96
        w2 = torch.randn(8, ffn, dtype=torch.bfloat16, requires_grad=True)
        probs = torch.rand(rows, 1)

        def act(x, p):      # TEGroupedMLP's bias_act_func: the input, the probabilities
            return fused.weighted_bias_quick_geglu_impl(x, None, p, False, 1.0, 7.0)

        saved, grads = {}, {}
        for recompute in (False, True):
            torch.manual_seed(0)
            fc1_out = torch.randn(rows, 2 * ffn, dtype=torch.bfloat16, requires_grad=True)
            held = {}

            def pack(t):
                held[t.untyped_storage().data_ptr()] = t.untyped_storage()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                if recompute:
                    # fp8=None: CheckpointWithoutOutput() reads FP8 state from Transformer
                    # Engine, absent here; the BF16 path is the same
                    ck = mrandom.CheckpointWithoutOutput(fp8=None)
                    out = torch.nn.functional.linear(ck.checkpoint(act, fc1_out, probs), w2)
                    ck.discard_output_and_register_recompute(out)
                else:
                    out = torch.nn.functional.linear(act(fc1_out, probs), w2)
            saved[recompute] = sum(st.nbytes() for st in held.values()
                                   if st.nbytes() >= 2 * rows * ffn)
            out.backward(torch.ones_like(out))
            grads[recompute] = fc1_out.grad
    finally:
        mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = rng
    assert saved[False] == rows * ffn * mlp_bytes_per_ffn_element(OSS)     # 10 per unit
    assert saved[True] == rows * ffn * 4                                  # 2·gate
    assert torch.equal(grads[False], grads[True])


def test_estimate_cli_and_megatron_log_read_the_modules(tmp_path):
    base = [sys.executable, "-m", "configurator", "estimate", "--model", "gpt-oss-120b",
            "--cluster", "dgx-h100-80gb", "--nodes", "8", "--tp", "1", "--pp", "4", "--ep",
            "8", "--mbs", "1", "--gbs", "1280", "--json"]
    out = {}
    for extra in ([], ["--recompute", "selective", "--recompute-modules", "moe_act,layernorm"]):
        res = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        out[bool(extra)] = json.loads(res.stdout)
    assert out[True]["config"]["recompute_modules"] == "moe_act,layernorm"   # Megatron's order
    assert out[True]["peak_memory_bytes"] < out[False]["peak_memory_bytes"]
    assert out[True]["iteration_time_s"] > out[False]["iteration_time_s"]
    res = subprocess.run(base + ["--recompute-modules", "moe_act"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "--recompute-modules" in res.stderr and "selective" in res.stderr


def test_run_files_carry_the_modules(tmp_path):
    from configurator.core.runs import load_runs

    head = ("model,cluster,num_gpus,tp,pp,ep,micro_batch_size,global_batch_size,precision,"
            "recompute,recompute_modules,iteration_time_s\n")
    path = tmp_path / "runs.csv"
    path.write_text(head + "gpt-oss-120b,dgx-h100-80gb,64,1,4,8,1,1280,bf16,selective,"
                           "\"layernorm,moe_act\",14.0\n")
    (run,) = load_runs(str(path))
    assert run.plan.recompute_modules == "moe_act,layernorm" and run.plan.ep == 8
    path.write_text(head + "gpt-oss-120b,dgx-h100-80gb,64,1,4,8,1,1280,bf16,none,moe_act,14\n")
    with pytest.raises(InputError, match="selective") as err:
        load_runs(str(path))
    assert "recompute_modules" in str(err.value) and "\n" not in str(err.value)
