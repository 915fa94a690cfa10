"""The plan field ``cross_entropy_fusion``: which implementation computes the loss's
vocabulary-parallel cross entropy (Megatron's eager ops by default, its jit-fused version
with ``--cross-entropy-loss-fusion``, Transformer Engine's Triton kernels with
``--cross-entropy-fusion-impl te``) and the HBM bytes each moves per logit element."""

from __future__ import annotations

import dataclasses
import json

import pytest

from configurator.core.plan_batch import PlanBatch
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.core.plan_values import CROSS_ENTROPY_FUSIONS
from configurator.cost.compute import layer_costs
from configurator.cost.groundtruth import bridge_runs
from configurator.cost.iteration import CROSS_ENTROPY_BYTES, stage_extras_s
from launchers.megatron_flags import flag_argv, megatron_flags
from memory_model.params import padded_vocab_size
from tests.conftest import run_cli
from tests.test_megatron_log import DENSE_TEXT, one, with_args
from topology.cluster_files import load_cluster

LLAMA8 = MODEL_PRESETS["llama3-8b"]
PLAN = ParallelPlan(tp=2, pp=1, dp=4, micro_batch_size=2, global_batch_size=16,
                    precision="bf16", sequence_parallel=True, distributed_optimizer=True)


def _extras(fusion):
    plan = dataclasses.replace(PLAN, cross_entropy_fusion=fusion)
    c = PlanBatch.from_plan(plan)
    gpu = load_cluster("dgx-h100-80gb").gpu
    lc = layer_costs(LLAMA8, c, gpu)
    x = stage_extras_s(LLAMA8, c, gpu, lc, 1e11, 1e-5)
    return {k: float(v[0]) for k, v in x.items()}, gpu


def test_byte_counts_sum_the_passes_each_implementation_makes():
    """Eager: FP32 copy, max, subtract, exp, sum, divide; backward scale and cast. Fused:
    three jit kernels and one backward pass. TE: two reads of the BF16 logits and the FP32
    gradient written in the forward; backward scales it and casts it."""
    assert CROSS_ENTROPY_BYTES["none"] == (2 + 4 + 4 + 8 + 8 + 4 + 8, 8 + 6)
    assert CROSS_ENTROPY_BYTES["native"] == (6 + 8 + 8, 6)
    assert CROSS_ENTROPY_BYTES["te"] == (2 + 6, 8 + 6)
    assert set(CROSS_ENTROPY_BYTES) == set(CROSS_ENTROPY_FUSIONS)


def test_loss_time_moves_by_the_bytes_only():
    """Only the last stage's loss changes, by the byte difference over the rank's logits
    (``b·s`` tokens × padded vocabulary ÷ tp) at the attained HBM bandwidth; the fused
    kernels are faster than the eager ops, TE's forward the fastest."""
    x = {f: _extras(f) for f in CROSS_ENTROPY_FUSIONS}
    gpu = x["none"][1]
    elements = (PLAN.micro_batch_size * LLAMA8.seq_length
                * padded_vocab_size(LLAMA8.vocab_size, PLAN.tp) / PLAN.tp)
    hbm = gpu.hbm_bandwidth_Bps * gpu.efficiency.hbm
    for f in ("native", "te"):
        for i, key in enumerate(("logits_fwd", "logits_bwd")):
            want = (CROSS_ENTROPY_BYTES["none"][i] - CROSS_ENTROPY_BYTES[f][i]) * elements / hbm
            assert x["none"][0][key] - x[f][0][key] == pytest.approx(want, rel=1e-9)
        assert x[f][0]["emb_fwd"] == x["none"][0]["emb_fwd"]
    total = {f: x[f][0]["logits_fwd"] + x[f][0]["logits_bwd"] for f in CROSS_ENTROPY_FUSIONS}
    assert total["te"] < total["native"] < total["none"]


@pytest.mark.parametrize("fusion, flags", [
    ("none", {}), ("native", {"--cross-entropy-loss-fusion": True}),
    ("te", {"--cross-entropy-loss-fusion": True, "--cross-entropy-fusion-impl": "te"})])
def test_launch_flags(fusion, flags):
    argv = flag_argv(megatron_flags(LLAMA8, dataclasses.replace(PLAN,
                                                                 cross_entropy_fusion=fusion)))
    got = {a: (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--")
               else True)
           for i, a in enumerate(argv) if a.startswith("--cross-entropy")}
    assert got == flags


def test_cli_estimate_and_search(tmp_path):
    argv = ("estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes", "1",
            "--gbs", "8", "--tp", "1", "--pp", "1", "--mbs", "1", "--json")
    none, te = (json.loads(run_cli(*argv, *extra).stdout)
                for extra in ((), ("--cross-entropy-fusion", "te")))
    assert none["config"]["cross_entropy_fusion"] == "none"
    assert te["config"]["cross_entropy_fusion"] == "te"
    assert te["iteration_time_s"] < none["iteration_time_s"]
    bad = run_cli(*argv, "--cross-entropy-fusion", "liger")
    assert bad.returncode == 2 and "cross-entropy-fusion" in bad.stderr
    out = tmp_path / "out"
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                  "1", "--gbs", "8", "--top", "1", "--cross-entropy-fusion", "native",
                  "--out", str(out))
    assert "cross_entropy_fusion native" in res.stdout
    script = (out / "launch_torchrun.sh").read_text()
    assert "--cross-entropy-loss-fusion" in script
    assert "--cross-entropy-fusion-impl" not in script


@pytest.mark.parametrize("fusion, impl, want", [
    (False, "native", "none"), (False, "te", "none"), (True, "native", "native"),
    (True, "te", "te")])
def test_megatron_log_reads_both_arguments(fusion, impl, want):
    text = with_args(DENSE_TEXT, cross_entropy_loss_fusion=fusion,
                     cross_entropy_fusion_impl=impl)
    assert one(text).plan.cross_entropy_fusion == want


def test_bridge_rows_use_te():
    runs, _ = bridge_runs()
    assert runs and all(r.plan.cross_entropy_fusion == "te" for r in runs)
