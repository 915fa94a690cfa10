"""Blackwell GPUs, the mxfp8 precision and NVLink domains that span hosts (GB200/GB300 NVL72).

Hosts are what torchrun and SLURM count (4-GPU compute trays on NVL72); NVLink domains are
what link speeds follow (a 72-GPU rack). The shortcut figures of a uniform cluster must be
bit for bit those of walking every hop, domains or not."""

from __future__ import annotations

import copy
import dataclasses
import inspect

import numpy as np
import pytest

import topology.gpus as gpus_module
from configurator.core.plan_batch import PlanBatch
from configurator.core.errors import InputError
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.plan import PLAN_FIELD, ParallelPlan
from configurator.core.plan_values import PRECISION, is_fp8
from configurator.core.rules import plan_for_world
from configurator.cost.compute import layer_costs
from configurator.cost.placed import PlacedPlan
from configurator.search.evaluate import evaluate_plan
from launchers.megatron_flags import flag_argv, megatron_flags
from memory_model.estimate import memory_arrays
from memory_model.params import stage_non_gemm_parameters, stage_parameters
from tests.conftest import run_cli
from tests.support.placement_cases import assert_links_agree
from tests.megatron_argv import LLAMA8, assert_validate_args_rules, parse_argv
from tests.test_scale import shapes, slow_group_busbw, slow_p2p_worst
from topology.cluster import build_cluster
from topology.cluster_files import CLUSTER_PRESETS, cluster_from_config, load_cluster
from topology.group_figures import ring_figures
from topology.gpus import GPU_PRESETS
from topology.rank_order import group_shape

NVL72 = ("gb200-nvl72", "gb300-nvl72")
TP_BYTES = 1e9


# -- GPU presets -------------------------------------------------------------------------

@pytest.mark.parametrize("name,bf16_tflops,fp8_tflops,mib,sms", [
    ("b200-180gb", 2250, 4500, 183359, 148),
    ("gb200-186gb", 2500, 5000, 189471, 152),
    ("b300-288gb", 2250, 4500, 275040, 148),
    ("gb300-288gb", 2500, 5000, 284208, 160)])
def test_blackwell_presets_dense_peaks_memory_and_sources(name, bf16_tflops, fp8_tflops, mib,
                                                          sms):
    gpu = GPU_PRESETS[name]
    peaks = {k: v / 1e12 for k, v in gpu.peak_flops_per_s.items()}
    # dense = half NVIDIA's with-sparsity figure; MXFP8 at the FP8 rate
    assert peaks == {"bf16": bf16_tflops, "fp16": bf16_tflops, "fp8": fp8_tflops,
                     "mxfp8": fp8_tflops}
    assert gpu.memory_bytes == mib * 2**20 and gpu.num_sms == sms
    assert gpu.hbm_bandwidth_Bps == 8e12
    eff = gpu.efficiency
    assert all(0 < x <= 1 for x in (eff.gemm, eff.gemm_fp8, eff.gemm_mxfp8, eff.hbm,
                                    eff.flash_attention))
    assert eff.source and "see topology/gpus.py" in eff.source
    # every figure's source is named in the module docstring
    doc = inspect.getdoc(gpus_module)
    for cite in ("DGX B200", "HGX B300", "GB200 NVL72", "GB300 NVL72",
                 "Inside NVIDIA Blackwell Ultra", "275040 MiB",
                 "with sparsity", "OpenXLA", "FlashAttention-4", "183359 MiB", "189471 MiB",
                 "284208 MiB", "148 SMs", "152 SMs", "160 SMs"):
        assert cite in doc, cite


def test_only_blackwell_has_mxfp8():
    for name, gpu in GPU_PRESETS.items():
        blackwell = name.startswith(("b200", "b300", "gb200", "gb300"))
        assert ("mxfp8" in gpu.peak_flops_per_s) == blackwell, name
        assert (gpu.efficiency.gemm_mxfp8 is not None) == blackwell, name


def test_mxfp8_gemm_rate_and_memory_follow_fp8():
    b200 = GPU_PRESETS["b200-180gb"]
    assert b200.gemm_rate("mxfp8") == (4.5e15, b200.efficiency.gemm_mxfp8)
    assert b200.gemm_rate("fp8") == (4.5e15, b200.efficiency.gemm_fp8)
    assert is_fp8("mxfp8") and is_fp8("fp8") and not is_fp8("bf16")
    model = MODEL_PRESETS["llama3-8b"]
    times = {}
    for prec in ("bf16", "fp8", "mxfp8"):
        plan = ParallelPlan(tp=2, dp=4, micro_batch_size=1, global_batch_size=8, precision=prec)
        times[prec] = float(layer_costs(model, PlanBatch.from_plan(plan), b200)["fwd"][0])
        mem = memory_arrays(model, PlanBatch.of(
            tp=2, pp=1, dp=4, cp=1, vp=1, mbs=1, global_batch_size=8, recompute="none",
            sequence_parallel=False, distributed_optimizer=False, precision=prec,
            fp8_param_gather=False), 0)
        times[prec, "weights"] = float(mem["parameters_bytes"][0])
    # the same tensor-core instruction and efficiency (topology/gpus.py); MXFP8 trains a
    # little slower than delayed-scaling FP8 by its casts' block scales, both well ahead of
    # BF16
    assert b200.efficiency.gemm_mxfp8 == b200.efficiency.gemm_fp8
    assert times["fp8"] < times["mxfp8"] < times["bf16"]
    # Transformer Engine's cached FP8 weight workspace of every GEMM weight (embedding and
    # output layer excluded): row-wise + transpose for fp8 (2 bytes on Hopper's TN-only FP8
    # GEMMs), row- and column-wise blocks with a scale per 32 for mxfp8
    gemm = stage_parameters(model, 2, 1, 0) - stage_non_gemm_parameters(model, 2, 1, 0)
    assert times["bf16", "weights"] == pytest.approx(2 * stage_parameters(model, 2, 1, 0))
    assert times["fp8", "weights"] == pytest.approx(times["bf16", "weights"] + 2 * gemm)
    assert times["mxfp8", "weights"] == pytest.approx(
        times["bf16", "weights"] + 2 * (1 + 1 / 32) * gemm)


def test_mxfp8_on_hopper_is_a_one_line_input_error():
    with pytest.raises(InputError, match="mxfp8 on Blackwell only"):
        GPU_PRESETS["h100-80gb"].peak("mxfp8")
    plan = ParallelPlan(tp=1, dp=8, micro_batch_size=1, global_batch_size=8, precision="mxfp8")
    with pytest.raises(InputError, match="precision='mxfp8'.*mxfp8 on Blackwell only"):
        evaluate_plan(MODEL_PRESETS["llama3-8b"], load_cluster("dgx-h100-80gb", 1), plan)
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
                  "1", "--gbs", "64", "--precision", "mxfp8")
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1
    assert "precision='mxfp8'" in res.stderr and "mxfp8 on Blackwell only" in res.stderr


def test_precision_field_lists_mxfp8():
    f = PLAN_FIELD["precision"]
    assert f.choices == PRECISION and "mxfp8" in f.choices and "Blackwell" in f.help


def test_mxfp8_launch_flags_are_megatron_s():
    plan = ParallelPlan(tp=2, pp=2, dp=2, micro_batch_size=1, global_batch_size=8,
                        precision="mxfp8", sequence_parallel=True, distributed_optimizer=True)
    a = parse_argv(flag_argv(megatron_flags(LLAMA8, plan)))
    assert (a["--bf16"], a["--fp8-format"], a["--fp8-recipe"]) == (True, "e4m3", "mxfp8")
    assert "--fp16" not in a
    assert_validate_args_rules(a, plan.world_size)
    fp8 = parse_argv(flag_argv(megatron_flags(LLAMA8, dataclasses.replace(plan,
                                                                         precision="fp8"))))
    assert fp8["--fp8-format"] == "hybrid" and "--fp8-recipe" not in fp8   # default delayed
    bf16 = parse_argv(flag_argv(megatron_flags(LLAMA8, dataclasses.replace(plan,
                                                                          precision="bf16"))))
    assert "--fp8-format" not in bf16 and "--fp8-recipe" not in bf16


# -- cluster files -------------------------------------------------------------------------

GPU_MAP = {"name": "x", "peak_tflops": {"bf16": 100, "fp8": 200, "mxfp8": 200},
           "memory_GiB": 40, "hbm_bandwidth_GBps": 1000, "num_sms": 64,
           "efficiency": {"gemm": 0.7, "gemm_fp8": 0.6, "gemm_mxfp8": 0.6, "hbm": 0.8,
                          "flash_attention": 0.5}}


def _cluster_map(**kw):
    base = dict(gpu=copy.deepcopy(GPU_MAP), gpus_per_node=4, nodes=4, intra_node_bandwidth_GBps=900,
                inter_node_bandwidth_GBps=50, intra_node_latency_us=3, inter_node_latency_us=6)
    base.update(kw)
    return base


@pytest.mark.parametrize("missing", ["gemm", "hbm", "flash_attention", "gemm_fp8",
                                     "gemm_mxfp8"])
def test_gpu_mapping_missing_an_efficiency_names_the_key(missing):
    data = _cluster_map()
    del data["gpu"]["efficiency"][missing]
    with pytest.raises(InputError, match=rf"gpu\.efficiency\.{missing}.*missing"):
        cluster_from_config(data)


def test_gpu_mapping_without_efficiency_names_the_key(tmp_path):
    data = _cluster_map()
    del data["gpu"]["efficiency"]
    with pytest.raises(InputError, match=r"gpu\.efficiency.*missing"):
        cluster_from_config(data)
    f = tmp_path / "c.yaml"
    f.write_text("gpu: {name: x, peak_tflops: {bf16: 100, mxfp8: 200}, memory_GiB: 40, "
                 "hbm_bandwidth_GBps: 1000, num_sms: 64, "
                 "efficiency: {gemm: 0.7, hbm: 0.8, flash_attention: 0.5}}\n"
                 "gpus_per_node: 4\nnodes: 2\nintra_node_bandwidth_GBps: 900\n"
                 "inter_node_bandwidth_GBps: 50\nintra_node_latency_us: 3\n"
                 "inter_node_latency_us: 6\n")
    res = run_cli("search", "--model", "llama3-8b", "--cluster", f, "--gbs", "64")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "gpu.efficiency.gemm_mxfp8" in res.stderr and "missing" in res.stderr


@pytest.mark.parametrize("domain", [2, 6, 10, 0, -4, "8", True])
def test_nvlink_domain_not_a_multiple_of_the_host_is_an_error(domain):
    with pytest.raises(InputError, match="nvlink_domain_gpus"):
        cluster_from_config(_cluster_map(nvlink_domain_gpus=domain))


def test_nvlink_domain_error_from_the_cli(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("gpu: b200-180gb\ngpus_per_node: 4\nnodes: 4\nnvlink_domain_gpus: 6\n"
                 "intra_node_bandwidth_GBps: 900\ninter_node_bandwidth_GBps: 50\n"
                 "intra_node_latency_us: 3\ninter_node_latency_us: 6\n")
    res = run_cli("search", "--model", "llama3-8b", "--cluster", f, "--gbs", "64")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "nvlink_domain_gpus=6" in res.stderr and "multiple of gpus_per_node (4)" in res.stderr


def test_domain_defaults_to_the_host_and_partial_racks_are_allowed():
    c = cluster_from_config(_cluster_map())
    assert c.nvlink_domain_gpus == 4 and c.host_domain.tolist() == [0, 1, 2, 3]
    c = load_cluster("gb200-nvl72", nodes=20)           # a rack and 2 trays of the next
    assert c.gpus_per_node == 4 and c.nvlink_domain_gpus == 72
    assert c.host_domain.tolist() == [0] * 18 + [1] * 2
    assert c.domains_in_order and not c.placement_invariant


def test_dgx_b300_is_eight_b300_per_host_with_connectx8():
    """DGX B300 data sheet: 8 B300 on NVLink 5 (900 GB/s per direction) in one host, one
    ConnectX-8 800 Gb/s NIC per GPU (100 GB/s): inside a host as fast as DGX B200, between
    hosts twice as fast."""
    c = load_cluster("dgx-b300-288gb", nodes=2)
    assert c.gpu.name == "b300-288gb" and c.gpus_per_node == 8 and c.nvlink_domain_gpus == 8
    b200 = load_cluster("dgx-b200-180gb", nodes=2)
    spec, spec200 = CLUSTER_PRESETS["dgx-b300-288gb"], CLUSTER_PRESETS["dgx-b200-180gb"]
    assert spec["intra_node_bandwidth_GBps"] == spec200["intra_node_bandwidth_GBps"] == 900
    assert spec["inter_node_bandwidth_GBps"] == 2 * spec200["inter_node_bandwidth_GBps"] == 100
    assert c.link(0, 1) == b200.link(0, 1)
    assert c.link(0, 8)[0] == pytest.approx(2 * b200.link(0, 8)[0])


# -- NVLink domains: link speeds follow the domain, not the host ---------------------------

@pytest.mark.parametrize("name", NVL72)
def test_groups_inside_the_rack_run_at_nvlink_speed(name):
    c = load_cluster(name, nodes=32)                  # 128 GPUs: racks of 72 + 56
    nvlink = c.link(0, 1)
    assert c.link(0, 4) == c.link(0, 71) == nvlink    # other trays of the rack: NVLink
    network = c.link(0, 72)
    assert network[0] < nvlink[0] / 5
    sizes = dict(tp=8, cp=1, ep=1, dp=16, pp=1)
    assert c.group_busbw(*group_shape(("tp",), sizes), 128) == nvlink      # spans 2 trays
    # ep=64 groups inside a 64-GPU job on one rack: all NVLink
    assert c.group_busbw(*group_shape(("ep",), dict(tp=1, cp=1, ep=64, dp=1)), 64) == nvlink
    # 64 ranks of a 128-GPU job: ranks 64..127 straddle the rack boundary at 72: the hop
    # between racks runs 8 rails (GPUs 64..71) at the network's per-GPU figure
    bw, lat = c.group_busbw(*group_shape(("ep",), dict(tp=1, cp=1, ep=64, dp=2)), 128)
    assert bw == pytest.approx(8 * network[0]) and bw < nvlink[0] and lat == network[1]
    # a DGX-style cluster with the same figures but one host per domain: tp=8 leaves the host
    dgx = cluster_from_config({**CLUSTER_PRESETS[name], "nvlink_domain_gpus": 4}, nodes=32)
    assert dgx.group_busbw(1, 8, 128)[0] == pytest.approx(4 * network[0])


def test_pipeline_neighbours_across_racks_take_the_network():
    c = load_cluster("gb200-nvl72", nodes=36)         # two full racks
    nvlink, network = c.link(0, 1), c.link(0, 72)
    assert c.p2p_worst(72, 2, 144) == network         # pp=2 of 72-GPU stages: rack to rack
    assert c.p2p_worst(8, 9, 72) == nvlink            # pp=9 of 8-GPU stages in one rack
    fb, _, bb, _ = c.p2p_boundaries(36, 4, 144)       # stages of 36: boundary 1 crosses
    assert fb.tolist() == [nvlink[0], network[0], nvlink[0], network[0]]


def _domain_cluster(gpn, nodes, domain, **kw):
    return build_cluster(name="d", gpu=GPU_PRESETS["gb200-186gb"], gpus_per_node=gpn,
                         hosts=[f"n{i}" for i in range(nodes)], intra_bandwidth_Bps=900e9,
                         inter_bandwidth_Bps=50e9, intra_latency_s=3e-6, inter_latency_s=6e-6,
                         intra_efficiency=0.9, inter_efficiency=0.93,
                         nvlink_domain_gpus=domain, **kw)


@pytest.mark.parametrize("gpn,nodes,domain", [(4, 5, 8), (4, 6, 12), (2, 7, 6), (1, 6, 4),
                                              (4, 4, 72)])
def test_domain_shortcut_equals_walking_every_hop(gpn, nodes, domain):
    """Shape shortcut (no graph), shortcut on the built uniform graph and the hop-by-hop walk
    (vectorised and group by group) agree bit for bit, partial last domains included."""
    fast, ref = _domain_cluster(gpn, nodes, domain), _domain_cluster(gpn, nodes, domain)
    _ = ref.graph
    n = gpn * nodes
    for world in [w for w in range(2, n + 1) if n % w == 0]:
        for stride, size in shapes(world):
            want = slow_group_busbw(ref, stride, size, world)
            assert fast.group_busbw(stride, size, world) == want, (stride, size, world)
            assert ref.group_busbw(stride, size, world) == want
            if size >= 2:
                assert fast._hop_group_busbw(fast._group_gpus(stride, size, world)) == want
            assert fast.p2p_worst(stride, size, world) == slow_p2p_worst(ref, stride, size,
                                                                          world)
    assert not fast.graph_built and ref.is_uniform


def test_link_table_and_rings_follow_domains_on_an_edited_graph():
    cl = _domain_cluster(4, 6, 12)
    g = cl.graph
    sw = cl.switch_of(0)
    assert sw == "domain0/nvswitch" and set(g.nodes[sw]["hosts"]) == {"n0", "n1", "n2"}
    g.edges["n1/gpu2", sw]["bandwidth_Bps"] = 100e9          # one slow NVLink port
    g.add_edge("n3/nic1", "n5/nic1", bandwidth_Bps=20e9, nominal_bandwidth_Bps=50e9,
               latency_s=9e-6, link_class="network", measured=True)
    g.add_edge("n0/gpu0", "n2/gpu3", bandwidth_Bps=7e9, nominal_bandwidth_Bps=900e9,
               latency_s=1e-6, link_class="nvlink", measured=True)
    cl.invalidate()
    assert not cl.is_uniform
    n = cl.num_gpus
    a, b = np.divmod(np.arange(n * n), n)
    keep = a != b
    a, b = a[keep], b[keep]
    assert_links_agree(cl, a, b)
    np.testing.assert_array_equal(cl.links(a, b)[0], cl.link_table().links(a, b)[0])
    assert cl.link(6, 0)[0] == 100e9                          # n1/gpu2's slow port
    assert cl.link(0, 11) == (7e9, 1e-6)                      # direct edge wins
    rng = np.random.default_rng(0)
    rows = np.stack([rng.permutation(n)[:7] for _ in range(60)])
    rbw, rlat = ring_figures(rows, cl.link_table().links, cl.gpu_domains)
    for r in range(len(rows)):
        want = cl.ring_busbw(rows[r].tolist())
        assert (rbw[r], rlat[r]) == pytest.approx(want, rel=1e-12)
    for stride, size in shapes(n):
        assert cl.group_busbw(stride, size, n) == slow_group_busbw(cl, stride, size, n)


def test_subset_keeps_domains_and_their_switch():
    cl = _domain_cluster(4, 6, 12)
    _ = cl.graph
    sub = cl.subset([4, 0, 1])
    assert sub.host_domain.tolist() == [1, 0, 0] and not sub.domains_in_order
    assert sub.link(4, 8) == cl.link(0, 4)                    # n0 → n1: one domain
    assert sub.link(0, 4) == cl.link(16, 0)                   # n4 → n0: two domains
    assert sub.group_busbw(1, 12, 12) == slow_group_busbw(sub, 1, 12, 12)
    lazy = _domain_cluster(4, 6, 12).subset([2, 3])
    assert lazy.host_domain.tolist() == [0, 1] and lazy.link(0, 4) == cl.link(8, 12)


def test_placed_plan_on_two_racks_prices_host_moves_across_racks():
    model = MODEL_PRESETS["llama3-8b"]
    cl = load_cluster("gb200-nvl72", nodes=36)
    plan = plan_for_world(dict(tp=8, pp=2, cp=1, vp=1, micro_batch_size=1,
                               global_batch_size=64, recompute="none", precision="bf16",
                               attention_backend="auto"), 64)
    priced = PlacedPlan(model, cl, PlanBatch.from_plan(plan))
    assert not priced.uniform                                 # hosts may move across racks
    nh, go = priced.default_placement()                       # 16 trays of rack 0
    one_rack = priced.time(nh, go).iteration_time_s
    split = nh.copy()
    split[8:] += 18                                          # stage 1's trays in rack 1
    two_racks = priced.time(split, go).iteration_time_s
    assert two_racks > one_rack
    # on one rack: what the one-rack cluster (every placement alike) simulates
    rack = evaluate_plan(model, load_cluster("gb200-nvl72", nodes=16), plan)
    assert one_rack == pytest.approx(rack.iteration_time_s, rel=1e-12)
    assert rack.iteration_time_s == pytest.approx(rack.closed_form_iteration_time_s, rel=0.02)


# -- end to end ----------------------------------------------------------------------------

def test_nvl72_launch_scripts_run_four_processes_per_host(tmp_path):
    out = tmp_path / "out"
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--nodes", "2",
                  "--gbs", "128", "--top", "3", "--out", out)
    assert res.returncode == 0, res.stderr
    assert "on 2x4 gb200-186gb" in res.stdout
    torchrun = (out / "launch_torchrun.sh").read_text()
    slurm = (out / "launch_slurm.sbatch").read_text()
    assert "--nproc-per-node 4" in torchrun and "--nnodes" in torchrun
    assert "#SBATCH --gpus-per-node=4" in slurm and "#SBATCH --nodes=2" in slurm


def test_mxfp8_search_on_dgx_b200(tmp_path):
    out = tmp_path / "out"
    res = run_cli("search", "--model", "llama3-8b", "--cluster", "dgx-b200-180gb", "--nodes",
                  "2", "--gbs", "128", "--precision", "mxfp8", "--top", "3", "--out", out)
    assert res.returncode == 0, res.stderr
    assert "mxfp8" in res.stdout.splitlines()[0]
    script = (out / "launch_torchrun.sh").read_text()
    assert "--fp8-format e4m3" in script and "--fp8-recipe mxfp8" in script
    assert "--bf16" in script and "--nproc-per-node 8" in script
