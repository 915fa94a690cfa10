"""The eager fc2 bias of biased experts (GPT-OSS, ``add_bias_linear``): megatron-core's
``TEGroupedMLP._apply_bias`` adds each local expert's bias, weighted by its FP32 router
probability, outside the grouped GEMM. Its time is exactly its HBM bytes per routed output
element and its kernels; a model without biases pays nothing."""

from __future__ import annotations

import dataclasses

import pytest

from configurator.core.candidates import Candidates
from configurator.core.model import MODEL_PRESETS
from configurator.core.plan import ParallelPlan
from configurator.cost.compute import (EXPERT_BIAS_BYTES, EXPERT_BIAS_KERNELS,
                                       HOST_BACKWARD_FACTOR, layer_costs)
from topology.cluster import load_cluster

OSS = MODEL_PRESETS["gpt-oss-120b"]
PLAN = ParallelPlan(tp=1, pp=4, dp=16, ep=8, etp=1, micro_batch_size=1,
                    global_batch_size=1280, distributed_optimizer=True)


def _costs(model, precision="bf16"):
    gpu = load_cluster("dgx-h100-80gb").gpu
    lc = layer_costs(model, Candidates.from_plan(dataclasses.replace(PLAN,
                                                                      precision=precision)),
                     gpu)
    return {k: float(lc[k][0]) if hasattr(lc[k], "__len__") else float(lc[k])
            for k in ("moe_fwd", "moe_bwd", "fwd", "bwd", "moe_host", "tokens_routed")}, gpu


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_bias_adds_its_bytes_and_kernels_and_nothing_else(precision):
    biased, gpu = _costs(OSS, precision)
    plain, _ = _costs(dataclasses.replace(OSS, add_bias_linear=False), precision)
    eff = gpu.efficiency
    elements = biased["tokens_routed"] * OSS.hidden_size        # R x h, the fc2 output
    local = OSS.num_experts / PLAN.ep                             # 16 local experts
    for key, i in (("moe_fwd", 0), ("moe_bwd", 1)):
        want = (EXPERT_BIAS_BYTES[i] * elements / (gpu.hbm_bandwidth_Bps * eff.hbm)
                + (EXPERT_BIAS_KERNELS[i][0] * local + EXPERT_BIAS_KERNELS[i][1])
                * eff.kernel_overhead_s)
        assert biased[key] - plain[key] == pytest.approx(want, rel=1e-9)
    # the dense part of the layer and the routed tokens do not move
    assert (biased["fwd"], biased["bwd"]) == (plain["fwd"], plain["bwd"])
    assert biased["tokens_routed"] == plain["tokens_routed"] == 4 * 4096
    # the host issues the multiply and the add for every local expert
    assert biased["moe_host"] - plain["moe_host"] == pytest.approx(
        EXPERT_BIAS_KERNELS[0][0] * local * eff.host_op_s, rel=1e-9)
    assert HOST_BACKWARD_FACTOR == 2.0


def test_bias_bytes_sum_the_passes():
    """Forward: b·p (write 4), t + b·p (read 2 + 4, write 4), cat (read 4, write 4), cast
    (read 4, write 2); backward: the cast's gradient (read 2, write 4), the add's (read 4,
    write 2), the two products' gradients (read 4, write 4, read 4 each)."""
    assert EXPERT_BIAS_BYTES == (4 + (2 + 4 + 4) + (4 + 4) + (4 + 2),
                                 (2 + 4) + (4 + 2) + 2 * (4 + 4 + 4))
