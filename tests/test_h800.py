"""The H800 SXM GPU preset and the dgx-h800-80gb cluster preset."""

from __future__ import annotations

import pytest

from configurator.core.model_presets import load_model
from configurator.core.plan import ParallelPlan
from configurator.core.units import GB
from configurator.search.evaluate import evaluate_plan
from topology.cluster_files import load_cluster
from topology.gpus import GPU_PRESETS, guess_gpu_preset


def test_h800_computes_as_an_h100():
    h800, h100 = GPU_PRESETS["h800-80gb"], GPU_PRESETS["h100-80gb"]
    assert h800.peak_flops_per_s == h100.peak_flops_per_s
    assert (h800.memory_bytes, h800.hbm_bandwidth_Bps, h800.num_sms) == (
        h100.memory_bytes, h100.hbm_bandwidth_Bps, h100.num_sms)
    assert h800.efficiency == h100.efficiency


def test_h800_device_names():
    assert guess_gpu_preset("NVIDIA H800") == "h800-80gb"
    assert guess_gpu_preset("NVIDIA H800 80GB HBM3") == "h800-80gb"
    assert guess_gpu_preset("NVIDIA H800 PCIe") is None


def test_dgx_h800_links():
    """NVLink 200 GB/s per direction attaining 160 (DeepSeek-V3's figure), one 400 Gb/s NIC
    per GPU attaining 46.5 GB/s: an 8-GPU ring runs at 160 GB/s, one over two hosts at the
    lesser of NVLink and 8 NICs."""
    c = load_cluster("dgx-h800-80gb", 2)
    assert c.gpu.name == "h800-80gb" and c.gpus_per_node == 8
    assert c.link(0, 1)[0] == pytest.approx(160 * GB)
    assert c.link(0, 8)[0] == pytest.approx(46.5 * GB)
    assert c.group_busbw(1, 8, 16)[0] == pytest.approx(160 * GB)
    assert c.group_busbw(1, 16, 16)[0] == pytest.approx(160 * GB)
    h100 = load_cluster("dgx-h100-80gb", 2)
    assert h100.group_busbw(1, 8, 16)[0] == pytest.approx(370 * GB)


def test_tensor_parallel_costs_more_on_h800():
    """Same GPU, a 2.3x slower NVLink: a tp-8 plan's tensor-parallel communication takes
    longer on the H800 cluster, its compute the same."""
    model = load_model("llama3-70b")
    plan = ParallelPlan(tp=8, pp=2, dp=1, micro_batch_size=1, global_batch_size=16,
                        sequence_parallel=True)
    e800 = evaluate_plan(model, load_cluster("dgx-h800-80gb", 2), plan)
    e100 = evaluate_plan(model, load_cluster("dgx-h100-80gb", 2), plan)
    b800, b100 = e800.time_breakdown_s, e100.time_breakdown_s
    assert b800["tp_comm"] > 2 * b100["tp_comm"]
    assert b800["compute"] == pytest.approx(b100["compute"], rel=1e-9)
    assert e800.iteration_time_s > e100.iteration_time_s
