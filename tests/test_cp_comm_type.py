"""Context-parallel communication types (``cp_comm_type``, Megatron ``--cp-comm-type``):
Transformer Engine's rules, the time and memory each costs, the launch flag and the log
importer."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.core.errors import InputError
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.plan_values import CP_COMM_TYPES
from configurator.core.rules import check_plan
from configurator.cost.communication import comm_figures, expert_comm_figures
from configurator.cost.compute import layer_costs
from configurator.cost.iteration import cp_layer_s
from configurator.search.evaluate import evaluate_plan
from configurator.search.space import enumerate_plans
from launchers.megatron_flags import megatron_flags
from memory_model.estimate import cp_gather_bytes, estimate_memory
from topology.cluster_files import load_cluster
from topology.collectives import all_gather_time_s

LLAMA = MODEL_PRESETS["llama3-8b"]          # 32 heads, 8 query groups


def _plan(**kw) -> ParallelPlan:
    base = dict(tp=1, cp=8, dp=1, micro_batch_size=1, global_batch_size=4,
                precision="bf16", distributed_optimizer=True)
    return ParallelPlan(**{**base, **kw})


def _batch(**kw):
    """:func:`_plan` as a batch of one (the single-plan form the models take)."""
    return PlanBatch.from_plan(_plan(**kw))


def _flags(model, plan) -> dict:
    return {f: v for _, flags in megatron_flags(model, plan) for f, v in flags}


def test_flag_only_where_it_differs_from_megatrons_default():
    assert _flags(LLAMA, _plan(cp_comm_type="a2a"))["--cp-comm-type"] == "a2a"
    assert _flags(LLAMA, _plan(cp_comm_type="all_gather"))["--cp-comm-type"] == "all_gather"
    assert "--cp-comm-type" not in _flags(LLAMA, _plan())                # p2p: the default
    assert "--cp-comm-type" not in _flags(LLAMA, _plan(cp=1, dp=8, cp_comm_type="a2a"))


def test_a2a_needs_heads_per_tp_rank_divisible_by_cp():
    model = LLAMA.with_seq_length(65536)
    check_plan(model, _plan(tp=1, cp=8, cp_comm_type="a2a"), 8)           # 32 and 8 heads
    with pytest.raises(InputError) as err:                                  # 8 and 2 heads
        check_plan(model, _plan(tp=4, cp=4, cp_comm_type="a2a"), 16)
    assert err.value.field == "cp" and "key/value heads" in str(err.value)
    check_plan(model, _plan(tp=4, cp=4, cp_comm_type="p2p"), 16)
    check_plan(model, _plan(tp=4, cp=4, cp_comm_type="all_gather"), 16)


def test_sliding_window_attention_with_cp_needs_a2a_or_all_gather():
    model = dataclasses.replace(LLAMA, window_size=4096).with_seq_length(32768)
    with pytest.raises(InputError) as err:
        check_plan(model, _plan(cp=2), 2)
    assert err.value.field == "cp_comm_type"
    for kind in ("a2a", "all_gather"):
        check_plan(model, _plan(cp=2, cp_comm_type=kind), 2)
    cps = {kind: set(enumerate_plans(model, 16, 16, cp_comm_type=kind).cp.tolist())
           for kind in CP_COMM_TYPES}
    assert cps["p2p"] == {1} and max(cps["a2a"]) > 1 and max(cps["all_gather"]) > 1


def _cp_costs(kind: str, seq: int, cp: int = 8, nodes: int = 1):
    model = LLAMA.with_seq_length(seq)
    cluster = load_cluster("dgx-h100-80gb", nodes)
    plan = _plan(cp=cp, dp=8 * nodes // cp, global_batch_size=8 * nodes // cp,
                 cp_comm_type=kind)
    c = PlanBatch.from_plan(plan)
    lc = layer_costs(model, c, cluster.gpu)
    comm = dict(comm_figures(cluster, c), **expert_comm_figures(cluster, c))
    fwd, bwd = cp_layer_s(model, lc, c, comm, cluster.gpu)
    return float(fwd[0]), float(bwd[0]), lc, comm, c


@pytest.mark.parametrize("nodes, cp", [(1, 8), (4, 32)])
def test_all_gather_exposes_its_gathers(nodes, cp):
    """The all-gather variant pays its K/V all-gather forward, and again plus the dK/dV
    reduce-scatter backward, in full, whatever the attention time (the p2p ring hides its
    blocks under each step's attention and pays the steps' kernels and fp32 corrections)."""
    seq = 262144
    ag_f, ag_b, _, comm, _ = _cp_costs("all_gather", seq, cp, nodes)
    kv_local = 2 * 2 * (seq / cp) * 8 * 128          # bytes of K and V on one rank
    gather = float(all_gather_time_s(cp * kv_local, cp, comm["cp_bw"], comm["cp_lat"])[0])
    overhead = load_cluster("dgx-h100-80gb", 1).gpu.efficiency.kernel_overhead_s
    assert ag_f == pytest.approx(gather + overhead, rel=1e-6)
    assert ag_b == pytest.approx(2 * gather + overhead, rel=1e-6)


def test_a2a_moves_q_k_v_and_the_output_once_each_way():
    """Ulysses' all-to-alls grow with the tokens (twice the sequence: twice the bytes) and do
    not hide; its attention sees the whole sequence per call, so attention is no slower than
    the ring's blocks."""
    f1, b1, lc1, comm, _ = _cp_costs("a2a", 65536)
    f2, b2, *_ = _cp_costs("a2a", 131072)
    assert f1 == b1 > 0
    assert f2 / f1 == pytest.approx(2.0, rel=0.05)
    _, _, lc_ring, _, _ = _cp_costs("p2p", 65536)
    assert float(lc1["attn_fwd"][0]) < float(lc_ring["attn_fwd"][0])


def test_cp_comm_type_reaches_the_iteration_time():
    model = LLAMA.with_seq_length(262144)
    cluster = load_cluster("dgx-h100-80gb", 2)
    times = {k: evaluate_plan(model, cluster, _plan(cp=16, global_batch_size=2,
                                                    cp_comm_type=k))
             for k in CP_COMM_TYPES if k != "a2a"}
    assert (times["all_gather"].time_breakdown_s["cp_comm"]
            > times["p2p"].time_breakdown_s["cp_comm"] > 0)


def test_all_gather_memory_holds_the_gathered_kv_and_their_gradients():
    model = LLAMA.with_seq_length(131072)
    ring = estimate_memory(model, _batch(cp=8, tp=2, dp=1, global_batch_size=2))
    gathered = estimate_memory(model, _batch(cp=8, tp=2, dp=1, global_batch_size=2,
                                            cp_comm_type="all_gather"))
    extra = gathered[0].other_bytes - ring[0].other_bytes
    # K, V and dK, dV of 131,072 tokens, 4 key/value heads of 128 per tp rank, 16-bit,
    # less the 1/8 each rank already holds
    assert extra == pytest.approx(4 * 2 * 131072 * 4 * 128 * 7 / 8)
    assert extra == pytest.approx(float(cp_gather_bytes(model, tp=2, cp=8, mbs=1,
                                                        cp_comm_type="all_gather")))
    assert float(np.max(cp_gather_bytes(model, tp=2, cp=8, mbs=1, cp_comm_type="a2a"))) == 0


def test_megatron_log_cp_comm_type_is_read():
    from tests.test_megatron_log import DENSE_TEXT, one, with_args

    run = one(with_args(DENSE_TEXT, cp_comm_type="['a2a']"))
    assert run.plan.cp_comm_type == "a2a"
    run = one(with_args(DENSE_TEXT, cp_comm_type="['p2p', 'a2a']"))
    assert run.plan.cp_comm_type == "p2p" and any("cp_comm_type" in n for n in run.extra["notes"])


def test_cli_choice_and_rule_errors_exit_2():
    base = [sys.executable, "-m", "configurator", "estimate", "--model", "llama3-8b",
            "--cluster", "dgx-h100-80gb", "--nodes", "2", "--tp", "4", "--pp", "1", "--cp", "4",
            "--mbs", "1", "--gbs", "1", "--seq-length", "65536"]
    bad = subprocess.run(base + ["--cp-comm-type", "ring"], capture_output=True, text=True)
    assert bad.returncode == 2 and "p2p" in bad.stderr and "Traceback" not in bad.stderr
    rule = subprocess.run(base + ["--cp-comm-type", "a2a"], capture_output=True, text=True)
    assert rule.returncode == 2 and "Traceback" not in rule.stderr
    assert len(rule.stderr.strip().splitlines()) == 1 and "divisible by cp" in rule.stderr


def test_search_takes_it_and_says_so(capsys):
    """A search with --cp-comm-type a2a names it in its header and keeps only plans whose
    heads per tp rank cp divides (llama3-8b: 8 key/value heads, so tp·cp ≤ 8)."""
    import json

    from configurator.cli import main

    args = ["search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "8",
            "--gbs", "64", "--seq-length", "32768", "--top", "20", "--cp-comm-type", "a2a"]
    assert main(args) == 0
    assert "cp_comm_type a2a" in capsys.readouterr().out.splitlines()[0]
    assert main(args + ["--json"]) == 0
    plans = [p["config"] for p in json.loads(capsys.readouterr().out)["plans"]]
    assert {p["cp_comm_type"] for p in plans} == {"a2a"}
    assert all(8 % (p["tp"] * p["cp"]) == 0 for p in plans if p["cp"] > 1)
    assert any(p["cp"] > 1 for p in plans)


def _measured_attention():
    """``tests/data/attention_masks.csv`` (``bench.kernels.attention_masks --csv``, H200):
    ``{(backend, mask): {keys: rate}}``, the forward and 2.5× the backward at one rate."""
    import csv
    from pathlib import Path

    out = {}
    path = Path(__file__).parent / "data" / "attention_masks.csv"
    with open(path, encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if float(row["dropout"]):
                continue
            f, b = float(row["forward_tflops"]), float(row["backward_tflops"])
            out.setdefault((row["backend"], row["mask"]), {})[int(row["keys"])] = (
                3.5 / (1 / f + 2.5 / b))
    return out


def test_unmasked_kernels_saturate_at_far_fewer_keys_as_measured():
    """The two forms (:data:`FLASH_HALF_TOKENS` causal, :data:`FLASH_HALF_TOKENS_NO_MASK`
    unmasked, one long-sequence efficiency) against cuDNN's and FlashAttention-2's fused
    attention timed at 512–64k keys: the measured rates over the longest run's within 7 % of
    the unmasked form at every length and within 9 % of the causal one (measured: 897 keys
    to half efficiency, the form 1,024), the causal over unmasked rate within 9 % of the
    forms' ratio; a causal form for both would be 30 % off the unmasked runs at 1k keys."""
    from configurator.cost.compute import flash_efficiency

    data = _measured_attention()
    assert {b for b, _ in data} == {"cuDNN", "flash"} and len(data[("cuDNN", "none")]) == 8
    for (backend, mask), rates in data.items():
        share = 1.0 if mask == "causal" else 0.0
        top = max(rates)
        for keys, rate in rates.items():
            model = flash_efficiency(1.0, keys, share) / flash_efficiency(1.0, top, share)
            assert rate / rates[top] == pytest.approx(
                model, rel=0.09 if mask == "causal" else 0.07), (backend, mask, keys)
        if mask == "none":
            causal = data[(backend, "causal")]
            for keys, rate in rates.items():
                form = flash_efficiency(1.0, keys) / flash_efficiency(1.0, keys, 0.0)
                assert causal[keys] / rate == pytest.approx(form, rel=0.09), (backend, keys)
            wrong = flash_efficiency(1.0, 1024) / flash_efficiency(1.0, top)
            assert rates[1024] / rates[top] > 1.3 * wrong
    # the rates combine by time: a quarter of the work causal, the rest unmasked
    mixed = flash_efficiency(1.0, 4096, causal_share=0.25)
    assert 1 / mixed == pytest.approx(0.25 / flash_efficiency(1.0, 4096)
                                      + 0.75 / flash_efficiency(1.0, 4096, 0.0))


@pytest.mark.parametrize("kind", CP_COMM_TYPES)
def test_only_p2p_ring_steps_after_the_first_run_unmasked(kind):
    """``p2p``: of cp equal ring steps only the first (Transformer Engine's ``"diagonal"``
    section) is causal, so 1/cp of the attention runs at the causal rate of the s/cp keys a
    step sees and the rest at the unmasked rate; ``a2a`` and ``all_gather`` keep causal
    calls. Llama-3 8B at 256k tokens, cp 8."""
    from configurator.cost.compute import cp_causal_share, cp_key_tokens, flash_efficiency

    model = LLAMA.with_seq_length(262144)
    cp = 8
    share = float(cp_causal_share(cp, kind))
    assert share == (1 / cp if kind == "p2p" else 1.0)
    assert float(cp_causal_share(1, kind)) == 1.0
    gpu = load_cluster("dgx-h100-80gb").gpu
    c = PlanBatch.from_plan(_plan(cp_comm_type=kind))
    got = float(layer_costs(model, c, gpu)["attn_fwd"][0]) - gpu.efficiency.kernel_overhead_s
    s, a, d = model.seq_length, model.num_attention_heads, model.kv_channels
    pairs = 2.0 * (s / cp) * s * a * 2 * d
    keys = float(cp_key_tokens(s, cp, kind))
    eta = flash_efficiency(gpu.efficiency.flash_attention, keys, share)
    assert got == pytest.approx(0.5 * pairs / (gpu.peak("bf16") * eta), rel=1e-9)
    causal_only = 0.5 * pairs / (gpu.peak("bf16") * flash_efficiency(
        gpu.efficiency.flash_attention, keys))
    if kind == "p2p":   # 32k keys: 3 % below the saturated rate causal, 1.2 % unmasked
        assert 0.97 < got / causal_only < 0.985
    else:
        assert got == pytest.approx(causal_only, rel=1e-12)


def test_attention_dropout_costs_what_the_kernel_pays_per_visited_score():
    """cuDNN's fused attention with dropout 0.1 (``tests/data/attention_masks.csv``, H200,
    causal, 512–8k keys) takes longer than without by a fixed time per visited score: the
    geometric means within 10 % of :data:`ATTENTION_DROPOUT_SCORES_PER_SM_S` over the GPU's
    SMs, every length within 30 %; FlashAttention-2 pays under half of cuDNN's forward. The
    layer prices exactly that on top of the kernel's matrix work (GPT-3 5B, 2k tokens)."""
    import csv
    import dataclasses
    import math
    from pathlib import Path

    from configurator.cost.compute import ATTENTION_DROPOUT_SCORES_PER_SM_S

    rows = list(csv.DictReader(open(Path(__file__).parent / "data" / "attention_masks.csv",
                                    encoding="utf-8")))

    def seconds_per_score(row):   # rates count 4·d FLOPs per visited (useful) score
        d = float(row["head_dim"])
        return (4 * d / (1e12 * float(row["forward_tflops"])),
                2.5 * 4 * d / (1e12 * float(row["backward_tflops"])))
    plain = {(r["backend"], r["keys"]): seconds_per_score(r) for r in rows
             if r["mask"] == "causal" and float(r["dropout"]) == 0}
    extra = {}
    for r in rows:
        if float(r["dropout"]) == 0.1:
            with_drop, base = seconds_per_score(r), plain[(r["backend"], r["keys"])]
            extra.setdefault(r["backend"], []).append(
                (with_drop[0] - base[0], with_drop[1] - base[1], int(r["sms"])))
    assert len(extra["cuDNN"]) == 5
    for i in (0, 1):
        model = [1 / (ATTENTION_DROPOUT_SCORES_PER_SM_S[i] * sms) for *_, sms in extra["cuDNN"]]
        got = [e[i] for e in extra["cuDNN"]]
        geo = math.exp(sum(math.log(g / m) for g, m in zip(got, model)) / len(got))
        assert geo == pytest.approx(1.0, rel=0.10), i
        assert all(g / m == pytest.approx(1.0, rel=0.30) for g, m in zip(got, model)), i
    assert max(e[0] for e in extra["flash"]) < 0.5 * min(e[0] for e in extra["cuDNN"])

    gpu = load_cluster("dgx-h100-80gb").gpu
    gpt = dataclasses.replace(MODEL_PRESETS["gpt3-175b"], num_layers=24, hidden_size=4096,
                              ffn_hidden_size=16384, num_attention_heads=32,
                              num_query_groups=32, kv_channels=128)
    assert gpt.attention_dropout == 0.1 and not PlanBatch.from_plan(_plan()).stores_scores
    c = PlanBatch.from_plan(_plan(cp=1, dp=8, micro_batch_size=4))
    with_drop = layer_costs(gpt, c, gpu)
    without = layer_costs(dataclasses.replace(gpt, attention_dropout=0.0), c, gpu)
    visited = 4 * 2048 * 2048 * 32 * 0.5
    for i, key in enumerate(("attn_fwd", "attn_bwd")):
        assert float(with_drop[key][0] - without[key][0]) == pytest.approx(
            visited / (ATTENTION_DROPOUT_SCORES_PER_SM_S[i] * gpu.num_sms), rel=1e-9)


def test_attention_masks_bench_runs_on_the_cpu_and_refuses_bad_lengths(tmp_path):
    """``python -m bench.kernels.attention_masks --dry-run`` times both masks with torch's
    math backend and writes its CSV in the columns the test data uses; bad ``--lengths`` exit
    2 in one line."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "rates.csv"
    res = subprocess.run([sys.executable, "-m", "bench.kernels.attention_masks", "--dry-run",
                          "--heads", "2", "--head-dim", "16", "--repeats", "1", "--warmup", "0",
                          "--csv", str(out)], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == (root / "tests/data/attention_masks.csv").read_text().splitlines()[0]
    assert {(x.split(",")[2],) + tuple(x.split(",")[5:8]) for x in lines[1:]} == {
        ("math", m, k, p) for m, p in (("causal", "0"), ("none", "0"), ("causal", "0.1"))
        for k in ("64", "128")}
    for bad in ("3,x", "3000"):
        res = subprocess.run([sys.executable, "-m", "bench.kernels.attention_masks",
                              "--lengths", bad],
                             cwd=root, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "--lengths" in res.stderr.splitlines()[-1]
    import torch
    if not torch.cuda.is_available():   # profiler.timing.bench_torch: one line, exit code 2
        res = subprocess.run([sys.executable, "-m", "bench.kernels.attention_masks"],
                             cwd=root, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and res.stderr.strip().splitlines() == [
            "attention_masks: device='cpu': needs a CUDA device (--dry-run: the CPU)"]
