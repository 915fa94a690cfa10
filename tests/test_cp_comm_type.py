"""Context-parallel communication types (``cp_comm_type``, Megatron ``--cp-comm-type``):
Transformer Engine's rules, the time and memory each costs, the launch flag and the log
importer."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from configurator.core.candidates import Candidates
from configurator.core.errors import InputError
from configurator.core.model import MODEL_PRESETS
from configurator.core.plan import CP_COMM_TYPES, ParallelPlan
from configurator.core.rules import check_plan
from configurator.cost.communication import comm_figures
from configurator.cost.compute import layer_costs
from configurator.cost.iteration import cp_layer_s
from configurator.search.evaluate import evaluate_plan
from configurator.search.space import enumerate_plans
from launchers.megatron_flags import megatron_flags
from memory_model.estimate import cp_gather_bytes, estimate_memory
from topology.cluster import load_cluster
from topology.collectives import all_gather_time_s

LLAMA = MODEL_PRESETS["llama3-8b"]          # 32 heads, 8 query groups


def _plan(**kw) -> ParallelPlan:
    base = dict(tp=1, cp=8, dp=1, micro_batch_size=1, global_batch_size=4,
                precision="bf16", distributed_optimizer=True)
    return ParallelPlan(**{**base, **kw})


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
    c = Candidates.from_plan(plan)
    lc = layer_costs(model, c, cluster.gpu)
    comm = comm_figures(cluster, c)
    fwd, bwd = cp_layer_s(model, lc, c, comm["cp_bw"], comm["cp_lat"], cluster.gpu)
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
    ring = estimate_memory(model, _plan(cp=8, tp=2, dp=1, global_batch_size=2))
    gathered = estimate_memory(model, _plan(cp=8, tp=2, dp=1, global_batch_size=2,
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
