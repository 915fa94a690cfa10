"""Hypothesis strategies of :class:`~tests.support.fuzzing.case.Case`, one per input format
(:data:`TARGETS`; the package docstring lists them), built from the argument pieces of
search/estimate and the hostile documents of :mod:`tests.support.fuzzing.documents`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import strategies as st

from tests.support.fuzzing.case import Case
from tests.support.fuzzing.documents import (NORMAL_HOSTS, ODD_HOSTS, ODD_NAMES, WEIRD_STRINGS,
                                             chance, copy_doc, document_file, dump_yaml, encode,
                                             safe_text)
from tests.support.fuzzing.worker import REPO, worker_env

TARGETS = ("model", "cluster", "hf_config", "topofile", "nccl", "nvsmi", "plan", "argv",
           "runs", "calibration")


# ============================================================================================
# Argument pieces
# ============================================================================================

MODEL_PRESETS_SMALL = ("gpt-1.7b", "gpt-3.6b", "llama2-7b", "llama3-8b", "qwen3-30b-a3b")
CLUSTER_PRESETS = ("dgx-a100-80gb", "dgx-h100-80gb", "dgx-h200-141gb")
#: Integer-ish argument values: mostly sane, sometimes hostile.
ODD_INT_ARGS = ["0", "-1", "-8", "1000000", "262145", "32769", str(2**63), str(10**30),
                "9" * 400, "1e3", "1.5", "nan", "inf", "", " 8", "8 ", "٣", "²", "0x10",
                "1_0", "+8", "08", "x", "--", "-", "\u2028", "8\n"]
ODD_FLOAT_ARGS = ["0", "-1", "1e308", "1e309", "-1e308", "nan", "NaN", "inf", "-inf",
                  "5e-324", "1e-320", "0.0", "2", "1.0000001", "x", "", "٣.٥", "0x1p-2",
                  "1_0.5", "infinity"]


@st.composite
def int_arg(draw, sane: list[int]) -> str:
    if not draw(chance(30)):
        return str(draw(st.sampled_from(sane)))
    return draw(st.sampled_from(ODD_INT_ARGS) | st.integers().map(str))


@st.composite
def float_arg(draw, sane: list[float]) -> str:
    if not draw(chance(30)):
        return repr(draw(st.sampled_from(sane)))
    return draw(st.sampled_from(ODD_FLOAT_ARGS) | st.floats().map(repr))


def _plan_flags(draw, command: str, hostile: bool) -> list[str]:
    """The plan options of search/estimate (sane values, sometimes hostile)."""
    argv: list[str] = []
    pick = (lambda sane: draw(int_arg(sane))) if hostile else (
        lambda sane: str(draw(st.sampled_from(sane))))
    argv += ["--gbs", pick([8, 16, 64, 128, 512, 1536])]
    if draw(chance(25)):
        argv += ["--nodes", pick([1, 2, 4, 8])]
    if draw(chance(17)):
        argv += ["--seq-length", pick([512, 1024, 2048, 4096])]
    if draw(chance(17)):
        argv += ["--precision", draw(st.sampled_from(["bf16", "fp16", "fp8", "mxfp8"]))]
    if command == "estimate":
        argv += ["--tp", pick([1, 2, 4, 8]), "--pp", pick([1, 2, 4]), "--mbs", pick([1, 2, 4])]
        if draw(chance(25)):
            argv += ["--recompute", draw(st.sampled_from(["none", "selective", "full"]))]
        if draw(chance(20)):
            argv += ["--cp", pick([1, 2])]
        if draw(chance(20)):
            argv += ["--vp", pick([1, 2])]
        if draw(chance(20)):
            argv += ["--ep", pick([1, 2, 8]), "--etp", pick([1, 2])]
        if draw(chance(15)):
            argv += ["--decoder-first-pipeline-num-layers", pick([0, 2, 7]),
                     "--decoder-last-pipeline-num-layers", pick([0, 2, 7])]
        if draw(chance(10)):
            argv += ["--account-for-embedding-in-pipeline-split"]
    else:
        if draw(chance(15)):
            argv += ["--ep", pick([1, 2, 8, 16])]
        if draw(chance(20)):
            argv += ["--top", pick([1, 3, 10])]
        if draw(chance(17)):
            argv += ["--max-memory-fraction", draw(float_arg([0.5, 0.9, 1.0]))
                     if hostile else "0.9"]
    return argv


@st.composite
def plan_command(draw, *, model: str, cluster: str, topology: str | None = None,
                 out_p: int = 25, hostile_flags: bool | None = None) -> list[str]:
    """argv of ``search`` or ``estimate`` for ``model`` on ``cluster``: ``--json`` mostly,
    ``--out out`` (search: plans.png, plan.json, launch scripts) in ``out_p`` % of cases."""
    command = draw(st.sampled_from(["search", "search", "estimate"]))
    argv = [command, "--model", model, "--cluster", cluster]
    if hostile_flags is None:
        hostile_flags = draw(chance(15))
    argv += _plan_flags(draw, command, hostile_flags)
    if topology is not None:
        argv += ["--topology", topology]
        if command == "search" and draw(chance(25)):
            argv += ["--exclude-flagged"]
    if command == "search" and draw(chance(out_p)):
        argv += ["--out", "out"]
        if draw(chance(25)):
            argv += ["--json"]
    else:
        argv += ["--json"] if not draw(chance(17)) else (
            ["--wide"] if command == "search" else [])
    return argv


# ============================================================================================
# Targets
# ============================================================================================

def model_base(preset: str) -> dict:
    from configurator.core.model_presets import MODEL_PRESETS

    return MODEL_PRESETS[preset].to_dict()


@st.composite
def model_cases(draw, out_p: int = 25) -> Case:
    base = model_base(draw(st.sampled_from(MODEL_PRESETS_SMALL + ("gpt-18.4b",))))
    if draw(st.booleans()):
        base["name"] = safe_text(draw(st.sampled_from(ODD_NAMES)))
    for k in ("num_query_groups", "ffn_hidden_size", "swiglu", "normalization"):
        if draw(chance(17)):
            base.pop(k, None)
    ext, content = draw(document_file(base, key="num_layers"))
    name = "model" + ext
    argv = draw(plan_command(model=name, cluster=draw(st.sampled_from(CLUSTER_PRESETS)),
                             out_p=out_p))
    return Case("model", tuple(argv), ((name, content),))


GPU_MAPPING = {"name": "my-gpu", "peak_tflops": {"bf16": 312, "fp16": 312},
               "memory_GiB": 80, "hbm_bandwidth_GBps": 2039, "num_sms": 108,
               "efficiency": {"gemm": 0.69, "hbm": 0.83, "flash_attention": 0.55,
                              "kernel_overhead_us": 4, "source": "datasheet"}}


@st.composite
def cluster_cases(draw, out_p: int = 25) -> Case:
    from topology.cluster_files import CLUSTER_PRESETS as PRESETS

    base = dict(PRESETS[draw(st.sampled_from(sorted(PRESETS)))])
    base["nodes"] = draw(st.sampled_from([1, 2, 4]))
    if draw(st.booleans()):
        gpu = copy_doc(GPU_MAPPING)
        if draw(st.booleans()):
            gpu["peak_tflops"]["fp8"] = 624
            gpu["efficiency"]["gemm_fp8"] = 0.6
        base["gpu"] = gpu
    if draw(st.booleans()):
        base["name"] = safe_text(draw(st.sampled_from(ODD_NAMES)))
    if draw(chance(25)) and isinstance(base["gpu"], dict):
        base["gpu"]["name"] = safe_text(draw(st.sampled_from(ODD_NAMES)))
    ext, content = draw(document_file(base, key="gpus_per_node"))
    name = "cluster" + ext
    argv = draw(plan_command(model=draw(st.sampled_from(MODEL_PRESETS_SMALL)), cluster=name,
                             out_p=out_p))
    return Case("cluster", tuple(argv), ((name, content),))


HF_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
            "intermediate_size": 5504, "num_attention_heads": 16, "num_hidden_layers": 8,
            "num_key_value_heads": 16, "max_position_embeddings": 2048, "vocab_size": 32000,
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16"}
HF_GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
           "n_ctx": 1024, "n_inner": None, "vocab_size": 50257, "resid_pdrop": 0.1,
           "attn_pdrop": 0.1, "activation_function": "gelu_new"}
HF_QWEN = dict(HF_LLAMA, model_type="qwen2", num_key_value_heads=4, attention_bias=True,
               hidden_act="swiglu", tie_word_embeddings=True, sliding_window=None,
               attention_dropout=0.0)
HF_MIXTRAL = dict(HF_LLAMA, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2,
                  sliding_window=None, router_aux_loss_coef=0.02)
HF_QWEN3_MOE = dict(HF_LLAMA, model_type="qwen3_moe", head_dim=128, num_experts=16,
                    num_experts_per_tok=4, moe_intermediate_size=768, decoder_sparse_step=1,
                    mlp_only_layers=[0], norm_topk_prob=True)
HF_DEEPSEEK = dict(HF_LLAMA, model_type="deepseek_v3", n_routed_experts=16,
                   num_experts_per_tok=4, moe_intermediate_size=512, n_shared_experts=1,
                   first_k_dense_replace=1, moe_layer_freq=1, q_lora_rank=384,
                   kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                   num_nextn_predict_layers=1, n_group=4, topk_group=2)
ODD_DIRS = ["llama", "$x^2$", "$\\alpha$-7b", "$\\foo$", "$x^$", "a$\\frac{$b", "my model",
            "名前", "é" * 70, "m" * 200,
            "a$b$c", "\u2028", "tab\tdir", "model\x1b[31m", "100%", "{x}", "٣", "_", "-",
            "x\udcff", "$(id)", "a'b\"c"]


@st.composite
def hf_config_cases(draw, out_p: int = 25) -> Case:
    base = copy_doc(draw(st.sampled_from([HF_LLAMA, HF_GPT2, HF_QWEN, HF_MIXTRAL,
                                           HF_QWEN3_MOE, HF_DEEPSEEK])))
    if draw(chance(25)):   # strings where numbers go, HF-style
        k = draw(st.sampled_from(sorted(k for k, v in base.items()
                                        if isinstance(v, (int, float)) and
                                        not isinstance(v, bool))))
        base[k] = str(base[k])
    ext, content = draw(document_file(base, ext=".json", key="num_hidden_layers",
                                      hostile_p=15))
    folder = draw(st.sampled_from(ODD_DIRS)) if draw(st.booleans()) else "hf-model"
    fname = (draw(st.sampled_from(["config.json", "config.json", "hf.json"])) if ext == ".json"
             else draw(st.sampled_from(["config.yaml", "cfg"])))
    path = f"{folder}/{fname}"
    argv = draw(plan_command(model=path, cluster=draw(st.sampled_from(CLUSTER_PRESETS)),
                             out_p=out_p))
    return Case("hf_config", tuple(argv), ((path, content),))


def _host_names(draw, n: int) -> list[str]:
    names: list[str] = []
    pool = ODD_HOSTS if draw(st.booleans()) else NORMAL_HOSTS
    while len(names) < n:
        h = draw(st.sampled_from(pool + NORMAL_HOSTS))
        if h not in names:
            names.append(h)
    return names


def topology_base(draw) -> dict:
    n = draw(st.integers(1, 4))
    hosts = _host_names(draw, n)
    bw = draw(st.sampled_from([12.5, 23.0, 46.5, 0.001, 1e6]))
    links = []
    for a in hosts:
        for b in hosts:
            if a != b:
                slow = draw(chance(12))
                links.append(dict(src=a, dst=b, src_gpu=None, dst_gpu=None,
                                  bandwidth_GBps=bw / 10 if slow else bw,
                                  latency_us=draw(st.sampled_from([None, 7.5])),
                                  link_class="network", message_bytes=2**25,
                                  method="nccl-tests sendrecv_perf busbw",
                                  timestamp=draw(st.sampled_from(
                                      [None, "2025-11-03T10:00:00+00:00"])),
                                  samples_GBps=[bw, bw * 1.01], rails_used=1,
                                  gpus_per_host=1))
    if draw(st.booleans()):
        links.append(dict(src=hosts[0], dst=hosts[0], src_gpu=0, dst_gpu=1,
                          bandwidth_GBps=370.0, latency_us=None, link_class="nvlink",
                          message_bytes=None, method="nvidia-smi topo -m (nominal)",
                          timestamp=None))
    doc = dict(format="configurator-topology", version=1, hosts=hosts,
               gpus_per_host=draw(st.sampled_from([8, None, 1])), merge_policy="min",
               links=links)
    if draw(st.booleans()):
        doc["collectives"] = [dict(hosts=hosts, gpus_per_host=8, op="all_reduce",
                                   busbw_GBps=180.0, message_bytes=2**27,
                                   method="nccl-tests all_reduce_perf busbw",
                                   timestamp=None)]
    if n > 1 and draw(st.booleans()):
        doc["missing"] = [dict(src=hosts[0], dst=hosts[-1], reason="x.log: failed")]
        doc["links"] = [l for l in links if {l["src"], l["dst"]} != {hosts[0], hosts[-1]}]
    if draw(st.booleans()):
        doc["warnings"] = ["w1"]
    return doc


@st.composite
def topofile_cases(draw, out_p: int = 25) -> Case:
    base = topology_base(draw)
    ext, content = draw(document_file(base, key="hosts"))
    name = "topo" + ext
    kind = draw(st.sampled_from(["audit", "audit", "import", "plan", "plan", "runs",
                                 "trial"]))
    extra = []
    if kind == "trial":       # runs chosen on the topology's links, pinned to its hosts
        argv = ["trial", "--model", "gpt-1.7b", "--cluster",
                draw(st.sampled_from(CLUSTER_PRESETS)), "--gbs",
                draw(st.sampled_from(["8", "64"])), "--topology", name, "--runs", "2"]
        argv += draw(st.sampled_from([[], ["--nodes", "1"], ["--nodes", "2"],
                                      ["--nodes", "0"]]))
        argv += draw(st.sampled_from([[], [], ["--exclude-flagged"]]))
        argv += ["--out", "t"] if draw(chance(out_p)) else ["--json"]
    elif kind == "runs":        # the hosts the runs of a run file ran on
        extra = [("runs.yaml", encode(dump_yaml(RUNS_BASE) or ""))]
        argv = draw(st.sampled_from([["validate", "runs.yaml", "--json"],
                                     ["calibrate", "runs.yaml", "-o", "cal.yaml"]]))
        argv += ["--topology", name]
    elif kind == "audit":
        argv = ["audit", "--topology", name]
        argv += ["--out", "report"] if draw(chance(out_p)) else ["--json"]
    elif kind == "import":
        argv = ["topology", "import", name, "-o", draw(st.sampled_from(["t.json", "t.yaml"]))]
        argv += draw(st.sampled_from([[], ["--json"], ["-v"], ["--merge", "median"],
                                      ["--merge", "p10", "--json"]]))
    else:
        argv = draw(plan_command(model="gpt-1.7b", cluster=draw(st.sampled_from(
            CLUSTER_PRESETS)), topology=name, out_p=out_p))
    files = [(name, content)] + extra
    if kind == "plan":
        argv += draw(placement_flags(argv[0], base.get("hosts") or [], files))
    return Case("topofile", tuple(argv), tuple(files))


@st.composite
def placement_flags(draw, command: str, hosts: list, files: list) -> list[str]:
    """The placement options of search/estimate on a topology, sane or hostile; an
    ``estimate --placement FILE`` adds its (mutated) placement file to ``files``."""
    argv: list[str] = []
    if draw(chance(25)):
        argv += _opt(draw, "--placement-evaluations", st.sampled_from(["1", "10", "100"]))
    if draw(chance(20)):
        argv += _opt(draw, "--placement-time-s", st.sampled_from(["0.01", "0.5", "2.0"]))
    if draw(chance(20)):
        argv += _opt(draw, "--seed", st.sampled_from(["0", "1", "7"]))
    if command == "search" and draw(chance(20)):
        argv += _opt(draw, "--nodes-range", st.sampled_from(["1:2", "1:1", "2:4", "3:1",
                                                             "1:", ":2", "a:b", "1:2:3"]))
    if command == "estimate" and draw(chance(50)):
        kind = draw(st.sampled_from(["default", "optimized", "file", "file", "file"]))
        if kind != "file":
            return argv + ["--placement", kind]
        n = draw(st.sampled_from([1, 1, 2]))
        names = [h for h in hosts if isinstance(h, str)][:n] or ["h0"]
        doc = {"hosts": names, "gpu_order": [list(range(8)) for _ in names]}
        if draw(st.booleans()):
            doc = {"placement": doc}          # a plan document's placement
        ext, content = draw(document_file(doc, ext=draw(st.sampled_from([".json", ".yaml"])),
                                          key="hosts"))
        files.append(("placement" + ext, content))
        argv += ["--placement", "placement" + ext]
    return argv


NCCL_TESTS = ("sendrecv", "all_reduce", "alltoall", "all_gather", "reduce_scatter")
NCCL_NUMBERS = ["nan", "-nan", "inf", "-inf", "1e308", "1e309", "-1", "0", "N/A", "x",
                str(2**63), "9" * 40, "٣", "1,5", "0x10", "", "1e-320"]


@st.composite
def nccl_log(draw, hosts: list[str], gpus: int, test: str) -> str:
    new = draw(st.booleans())
    lines = []
    if new:
        lines += ["# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807",
                  f"# Collective test starting: {test}_perf"]
    lines += [f"# nThread 1 nGpus {1 if new else gpus} minBytes 33554432 maxBytes 134217728 "
              "step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
              "#", "# Using devices"]
    rank = 0
    for h in hosts:
        for d in range(gpus):
            group = "Group  0 " if new else ""
            lines.append(f"#  Rank {rank:2d} {group}Pid {1000 + rank} on {h:>10} device {d:2d} "
                         "[0000:1b:00] NVIDIA H100 80GB HBM3")
            rank += 1
    lines.append("#")
    if new:
        lines += ["#       size         count      type   redop    root     time   algbw   "
                  "busbw  #wrong     time   algbw   busbw  #wrong",
                  "#        (B)    (elements)                               (us)  (GB/s)  "
                  "(GB/s)             (us)  (GB/s)  (GB/s)"]
    else:
        lines += ["#       size         count      type   redop     time   algbw   busbw  "
                  "error     time   algbw   busbw  error",
                  "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)     "
                  "       (us)  (GB/s)  (GB/s)"]
    rows = draw(st.sampled_from([3, 1, 2, 4, 0]))
    for i in range(rows):
        size = 33554432 << i
        bw = draw(st.sampled_from([13.35, 180.6, 46.1, 0.01, 370.0]))
        vals = [f"{size}", f"{size // 8}", "double", "sum"] + (["-1"] if new else [])
        vals += [f"{size / bw / 1e3:.2f}", f"{bw:.2f}", f"{bw:.2f}", "0",
                 f"{size / bw / 1e3:.2f}", f"{bw:.2f}", f"{bw:.2f}", "N/A" if new else "0"]
        if draw(chance(25)):
            j = draw(st.integers(0, len(vals) - 1))
            vals[j] = draw(st.sampled_from(NCCL_NUMBERS))
        lines.append("  " + "  ".join(f"{v:>9}" for v in vals))
    if draw(chance(17)):
        lines.append(f"{hosts[0]}: Test NCCL failure common.cu:1234 'unhandled system error "
                     f"(run with NCCL_DEBUG=INFO for details)'")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 13.4454", "#"]
    if new:
        lines.append(f"# Collective test concluded: {test}_perf")
    return "\n".join(lines) + "\n"


@st.composite
def mangled_text(draw, text: str) -> str:
    """``text`` truncated, shuffled, with lines dropped/duplicated or garbage spliced in."""
    lines = text.splitlines(keepends=True)
    op = draw(st.sampled_from(["truncate", "shuffle", "garbage", "drop", "dup", "longline"]))
    if op == "truncate":
        return text[:draw(st.integers(0, len(text)))]
    if op == "shuffle":
        return "".join(draw(st.permutations(lines)))
    if op == "drop" and lines:
        i = draw(st.integers(0, len(lines) - 1))
        return "".join(lines[:i] + lines[i + 1:])
    if op == "dup" and lines:
        i = draw(st.integers(0, len(lines) - 1))
        return "".join(lines[:i] + lines[i:i + 1] * draw(st.sampled_from([2, 100, 20000]))
                       + lines[i + 1:])
    if op == "longline":
        return text + "#" + "x" * draw(st.sampled_from([10_000, 1_000_000])) + "\n"
    junk = safe_text(draw(st.text(min_size=1, max_size=80)))
    pos = draw(st.integers(0, len(text)))
    return text[:pos] + junk + text[pos:]


@st.composite
def nccl_files(draw) -> list[tuple[str, bytes]]:
    files = []
    for k in range(draw(st.integers(1, 3))):
        test = draw(st.sampled_from(NCCL_TESTS))
        if test == "sendrecv":
            two = not draw(chance(25))
            hosts = _host_names(draw, 2 if two else 1)
            gpus = 1 if two else 2
        else:
            hosts = _host_names(draw, draw(st.integers(1, 3)))
            gpus = draw(st.sampled_from([1, 2, 8]))
        text = draw(nccl_log(hosts, gpus, test))
        r = draw(st.sampled_from(["plain"] * 7 + ["mangle"] * 2 + ["raw"]))
        if r == "mangle":
            text = draw(mangled_text(text))
        if r == "raw":
            data = draw(st.sampled_from([b"", b"\x00\x01", b"# nccl-tests version\n",
                                         b"#  Rank  0 Pid 1 on \xff\xfe device 0\n"]))
        else:
            data = encode(text)
        fh = "_".join(hosts) if draw(st.booleans()) else "x"
        name = draw(st.sampled_from([f"nccl_N{len(hosts)}_G{gpus}_{fh}.log",
                                     f"{test}_{k}.log", f"{test}_perf_{fh}.txt"]))
        name = name.replace("/", "_")[:200] or "x.log"
        files.append((f"logs/{name}", data))
    # unique names
    seen, out = set(), []
    for n, d in files:
        while n in seen:
            n = n + "_"
        seen.add(n)
        out.append((n, d))
    return out


def _import_or_audit(draw, paths: list[str], out_p: int) -> list[str]:
    if draw(st.booleans()):
        argv = ["topology", "import", *paths, "-o", draw(st.sampled_from(["t.json", "t.yaml"]))]
        argv += draw(st.sampled_from([[], ["--json"], ["-v"], ["--json", "-v"],
                                      ["--merge", "median"], ["--merge", "p90", "--json"],
                                      ["--merge", draw(st.sampled_from(
                                          ["p100", "p0", "p1e3", "p٣", "p-1", "max", ""]))]]))
        return argv
    argv = ["audit", *paths]
    argv += ["--out", "report"] if draw(chance(out_p)) else (
        ["--json"] if not draw(chance(25)) else [])
    return argv


@st.composite
def nccl_cases(draw, out_p: int = 25) -> Case:
    files = draw(nccl_files())
    paths = ["logs"] if draw(st.booleans()) else [n for n, _ in files]
    return Case("nccl", tuple(_import_or_audit(draw, paths, out_p)), tuple(files))


NVSMI_CODES = ["NV12", "NV18", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
NVSMI_ODD = ["NV0", "NV999999999999999999999", "NV-1", "NV١٢", "NV²", "NV", "X", "x", "N/A",
             "", "SYS SYS", "\x1b[0m", "NV1e3", "NVnan"]


@st.composite
def nvsmi_text(draw) -> str:
    ngpu = draw(st.sampled_from([1, 2, 4, 8, 8, 0, 20]))
    nnic = draw(st.sampled_from([0, 2, 4]))
    mlx = draw(st.booleans())
    devs = [f"GPU{i}" for i in range(ngpu)] + [f"mlx5_{i}" if mlx else f"NIC{i}"
                                               for i in range(nnic)]
    sep = draw(st.sampled_from(["\t", "\t", "   "]))
    header = sep.join(devs + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    if draw(st.booleans()):
        header = "\x1b[4m" + header + "\x1b[0m"
    nv = draw(st.sampled_from(NVSMI_CODES))
    lines = [sep + header]
    for i, d in enumerate(devs):
        cells = []
        for j in range(len(devs)):
            if i == j:
                cells.append(" X ")
            elif i < ngpu and j < ngpu:
                cells.append(nv if not draw(chance(12)) else draw(st.sampled_from(
                    NVSMI_CODES + NVSMI_ODD)))
            else:
                cells.append(draw(st.sampled_from(["PIX", "PXB", "SYS", "NODE"])))
        tail = ["0-15", "0", "N/A"] if i < ngpu else ["", "", ""]
        lines.append(sep.join([d] + cells + tail))
    lines += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set "
              "of # NVLinks"]
    if nnic and not mlx:
        lines += ["", "NIC Legend:", ""] + [f"  NIC{i}: mlx5_{i}" for i in range(nnic)]
    return "\n".join(lines) + "\n"


@st.composite
def nvsmi_cases(draw, out_p: int = 25) -> Case:
    files = []
    hosts = _host_names(draw, draw(st.integers(1, 3)))
    data_dir = REPO / "tests" / "data"
    for h in hosts:
        if draw(chance(20)):
            text = (data_dir / draw(st.sampled_from(["nvidia-smi-topo_dgx-a100.txt",
                                                     "nvidia-smi-topo_dgx-h100.txt"]))
                    ).read_text()
        else:
            text = draw(nvsmi_text())
        if draw(chance(20)):
            text = draw(mangled_text(text))
        prefix = draw(st.sampled_from(["topo_", "nvidia-smi-topo_", "nvidia_smi_topo_m_", ""]))
        name = (prefix + h).replace("/", "_")[:200] + draw(st.sampled_from([".txt", ".log", ""]))
        if name.startswith("."):
            name = "_" + name
        files.append((f"smi/{name}", encode(text)))
    files = list(dict(files).items())
    paths = ["smi"] if draw(st.booleans()) else [n for n, _ in files]
    return Case("nvsmi", tuple(_import_or_audit(draw, paths, out_p)), tuple(files))


_PLAN_TEXT: str | None = None


def base_plan_text() -> str:
    """A valid plan.json: ``configurator search --out`` run once (cached per process)."""
    global _PLAN_TEXT
    if _PLAN_TEXT is None:
        with tempfile.TemporaryDirectory(prefix="fuzz-plan-") as tmp:
            out = os.path.join(tmp, "out")
            proc = subprocess.run(
                [sys.executable, "-m", "configurator", "search", "--model", "gpt-1.7b",
                 "--cluster", "dgx-a100-80gb", "--nodes", "2", "--gbs", "64", "--out", out],
                capture_output=True, text=True, timeout=300, cwd=REPO,
                env=dict(worker_env(), PYTHONWARNINGS="ignore"))
            if proc.returncode != 0:
                raise RuntimeError("configurator search --out failed: " + proc.stderr[-2000:])
            _PLAN_TEXT = Path(out, "plan.json").read_text(encoding="utf-8")
    return _PLAN_TEXT


def _plan_focus(path: tuple) -> bool:
    # Edits land on the model, cluster, plan and the estimate's summary keys, mostly.
    if not path:
        return True
    if path[0] != "estimate":
        return True          # (the placement, when there is one, included)
    return len(path) == 1 or path[1] in ("iteration_time_s", "model_tflops_per_gpu", "mfu",
                                         "peak_memory_bytes", "config")


@st.composite
def plan_cases(draw, out_p: int = 0) -> Case:
    base = json.loads(base_plan_text())
    if draw(chance(17)):                      # schema version 0
        base.pop("schema_version")
        base.pop("plan")
    elif draw(chance(40)):                    # a placement to enforce (2 nodes of 8 GPUs)
        hosts = _host_names(draw, 3)
        base["placement"] = dict(
            hosts=hosts[:2], gpu_order=[list(range(8)), list(range(7, -1, -1))],
            excluded_hosts=hosts[2:], method="optimized", iteration_time_s=1.0,
            default_iteration_time_s=1.1, random_median_iteration_time_s=1.05)
    if draw(chance(33)):
        base["model"]["name"] = safe_text(draw(st.sampled_from(ODD_NAMES)))
    if draw(chance(20)):
        base["cluster"][draw(st.sampled_from(["name", "gpu"]))] = safe_text(
            draw(st.sampled_from(ODD_NAMES)))
    ext, content = draw(document_file(base, ext=draw(st.sampled_from([".json"] * 4 + [".yaml"])),
                                      key="schema_version", focus=_plan_focus))
    name = "plan" + ext
    if draw(chance(20)):                      # explain: the mutated plan against the valid one
        files = ((name, content), ("valid.json", base_plan_text().encode()))
        pair = [name, "valid.json"] if draw(st.booleans()) else ["valid.json", name]
        return Case("plan", tuple(["explain", *pair] + draw(st.sampled_from([[], ["--json"]]))),
                    files)
    argv = ["launch", "--plan", name, "--out", "scripts"]
    if draw(chance(25)):
        argv += ["--nodes", draw(int_arg([1, 2, 4]))]
    if draw(chance(25)):
        argv += ["--data-path", safe_text(draw(st.sampled_from(
            ["data/my_text_document", "a b", "$HOME/x", "x'y", "x\ny", "-", "名前"])))]
        if draw(st.booleans()):
            argv += ["--tokenizer-model", safe_text(draw(st.sampled_from(
                ["tok.model", "t'o\"k", "$(id)", "a\u2028b"])))]
    if draw(chance(17)):
        argv += ["--force"]
    return Case("plan", tuple(argv), ((name, content),))


#: Values for path-like options that only read (never written to).
READ_PATHS = ["missing.yaml", ".", "/dev/null", "/dev/zero", "empty.yaml", "", "-", "model.yaml",
              "名前.yaml", "a\u2028b", "x\udcff"]
#: Values for options naming a directory or file the call writes: relative names only.
WRITE_PATHS = ["out", "out2/nested", "existing", "file.txt", "", "-", "名前", "a b", "x\udcff",
               "out/../out3"]
_ODD_VALUE = st.sampled_from(ODD_INT_ARGS + ODD_FLOAT_ARGS + WEIRD_STRINGS).map(
    lambda s: safe_text(s.replace("\x00", "")))


def _opt(draw, flag: str, sane) -> list[str]:
    """``flag VALUE`` with a sane value mostly, an odd one otherwise (or no value)."""
    r = draw(st.sampled_from(["sane"] * 16 + ["odd"] * 3 + ["bare"]))
    if r == "bare":
        return [flag]
    if r == "odd":
        return [flag, draw(_ODD_VALUE)]
    return [flag, draw(sane) if isinstance(sane, st.SearchStrategy) else str(sane)]


@st.composite
def argv_cases(draw, out_p: int = 10) -> Case:
    files = [("model.yaml", encode(dump_yaml(model_base("gpt-1.7b")) or "")),
             ("empty.yaml", b""), ("file.txt", b"x"), ("existing/keep", b"x"),
             ("plan.json", base_plan_text().encode()),
             ("logs/nccl_N2_G1_hostA_hostB.log",
              encode(draw(nccl_log(["hostA", "hostB"], 1, "sendrecv"))))]
    command = draw(st.sampled_from(["search", "estimate", "launch", "topology", "audit",
                                    "probe", "bogus", "", "--version", "--help", "-h"]))
    ints = lambda *xs: st.sampled_from([str(x) for x in xs])  # noqa: E731
    argv: list[str] = [command] if command else []
    if command in ("search", "estimate"):
        opts = [("--model", st.sampled_from(list(MODEL_PRESETS_SMALL) + READ_PATHS)),
                ("--cluster", st.sampled_from(list(CLUSTER_PRESETS) + READ_PATHS[:4])),
                ("--nodes", ints(1, 2, 4, 1000000, 32768, 32769, 0)),
                ("--gbs", ints(8, 64, 512, 2**24, 2**24 + 1)),
                ("--seq-length", ints(1, 2048, 2**24, 2**24 + 1)),
                ("--precision", st.sampled_from(["bf16", "fp16", "fp8", "fp4"])),
                ("--attention-backend", st.sampled_from(["auto", "flash", "local", "unfused"])),
                ("--topology", st.sampled_from(READ_PATHS))]
        if command == "search":
            opts += [("--top", ints(1, 10, 100000, 100001)),
                     ("--out", st.sampled_from(WRITE_PATHS)),
                     ("--recompute", st.sampled_from(["none", "full", "selective", "all"])),
                     ("--max-memory-fraction", st.sampled_from(["0.5", "1", "1e-300", "nan"])),
                     ("--wide", None), ("--force", None), ("--exclude-flagged", None),
                     ("--json", None)]
        else:
            opts += [("--tp", ints(1, 2, 8, 3, 262144)), ("--pp", ints(1, 2, 2048, 4096)),
                     ("--mbs", ints(1, 4, 2**24)), ("--cp", ints(1, 2)), ("--vp", ints(1, 2, 3)),
                     ("--recompute", st.sampled_from(["none", "full"])),
                     ("--ep", ints(1, 2, 8, 3, 65537)), ("--etp", ints(1, 2, 3)),
                     ("--decoder-first-pipeline-num-layers", ints(0, 1, 3, 2049)),
                     ("--account-for-loss-in-pipeline-split", None),
                     ("--sequence-parallel", None), ("--no-sequence-parallel", None),
                     ("--distributed-optimizer", None), ("--json", None)]
        required = {"--model", "--cluster", "--gbs"} | (
            {"--tp", "--pp", "--mbs"} if command == "estimate" else set())
    elif command == "launch":
        opts = [("--plan", st.sampled_from(["plan.json"] * 5 + READ_PATHS)),
                ("--out", st.sampled_from(WRITE_PATHS)), ("--nodes", ints(1, 2, 3, 0, 10**6)),
                ("--data-path", st.sampled_from(["d", "a b", "$x"])),
                ("--tokenizer-model", st.sampled_from(["t", "$(id)"])), ("--force", None)]
        required = {"--plan", "--out"}
    elif command == "topology":
        argv.append(draw(st.sampled_from(["import", "import", "import", "export", ""])))
        opts = [("-o", st.sampled_from(["t.json", "t.yaml"] + WRITE_PATHS)),
                ("--merge", st.sampled_from(["min", "median", "p50", "p101", "p", "mean"])),
                ("--force", None), ("--json", None), ("-v", None)]
        argv += draw(st.lists(st.sampled_from(["logs", "logs/nccl_N2_G1_hostA_hostB.log",
                                               "missing.log", "model.yaml", "."]),
                              max_size=3))
        required = {"-o"}
    elif command == "audit":
        opts = [("--topology", st.sampled_from(READ_PATHS)),
                ("--out", st.sampled_from(WRITE_PATHS)), ("--json", None), ("--force", None)]
        argv += draw(st.lists(st.sampled_from(["logs", "missing.log", "model.yaml"]),
                              max_size=2))
        required = set()
    elif command == "probe":
        opts = [("--nnodes", ints(1, 2, 16, 0, 10**6, 2**63)),
                ("--nproc-per-node", ints(1, 8, 0, 10**6)),
                ("--master-addr", st.sampled_from(["10.0.0.1", "$MASTER_ADDR", "a b", "h'x",
                                                   "$(id)", "", "名前"])),
                ("--master-port", ints(29500, 0, 65536, 2**63)), ("--slurm", None),
                ("--out", st.sampled_from(["topo.json", "a b.json", "$x"])),
                ("--size-mb", st.sampled_from(["32", "1e308", "1e-320", "0.5"])),
                ("--iters", ints(1, 5, 0, 10**9)), ("--warmup", ints(0, 2, -1)),
                ("--timeout-s", st.sampled_from(["120", "1e308", "0.001", "1e-320"])),
                ("--backend", st.sampled_from(["auto", "nccl", "gloo", "mpi"])),
                ("--expected-hosts", st.sampled_from(["a,b", "", "a,,b", "名前,٣"])),
                ("--force", None)]
        required = {"--nnodes", "--nproc-per-node"}
    else:
        opts, required = [("--json", None), ("--help", None)], set()
    chosen = [o for o in opts if o[0] in required and not draw(chance(6))]
    chosen += draw(st.lists(st.sampled_from(opts), max_size=5)) if opts else []
    for flag, values in chosen:
        if values is None:
            argv.append(flag)
        else:
            argv += _opt(draw, flag, values)
    if draw(chance(10)):       # stray tokens anywhere
        pos = draw(st.integers(0, len(argv)))
        argv.insert(pos, draw(_ODD_VALUE | st.sampled_from(["--help", "-h", "--version",
                                                            "--json=1", "--no-json", "-"])))
    if out_p and command == "search" and "--out" not in argv and draw(chance(out_p)):
        argv += ["--out", "out"]
    argv = [a.replace("\x00", "") for a in argv]
    return Case("argv", tuple(argv), tuple(files))


def _run(name: str, model: str, tp: int, pp: int, mbs: int, **measured) -> dict:
    return dict(name=name, model=model, cluster="dgx-a100-80gb", num_gpus=8, tp=tp, pp=pp,
                micro_batch_size=mbs, global_batch_size=64, precision="fp16", **measured)


#: A valid run file (docs/formats.md, "Run files"): three small plans on one DGX A100,
#: each with another kind of measurement, one naming the host it ran on, two their GPU
#: order (as one string, and as a list of lists).
RUNS_BASE = {"runs": [_run("a", "gpt-1.7b", 1, 1, 4, iteration_time_s=1.2,
                           gpu_order="7,6,5,4,3,2,1,0"),
                      _run("b", "gpt-1.7b", 2, 1, 2, tokens_per_s_per_gpu=9000.0,
                           hosts=["node-b"]),
                      _run("c", "gpt-3.6b", 2, 2, 1, tflops_per_gpu=120.0,
                           flops_formula="megatron", seq_length=2048,
                           gpu_order=[[0, 2, 4, 6, 1, 3, 5, 7]])]}


@st.composite
def runs_cases(draw, out_p: int = 0) -> Case:
    """A run file (mutated, YAML or JSON, a mapping of ``runs`` or a bare list) priced by
    ``validate`` or fitted by ``calibrate``."""
    base = RUNS_BASE if draw(st.booleans()) else RUNS_BASE["runs"]
    ext, content = draw(document_file(base, ext=draw(st.sampled_from([".yaml", ".json"])),
                                      key="runs"))
    name = "runs" + ext
    argv = draw(st.sampled_from([["validate", name], ["validate", name, "--json"],
                                 ["validate", name, "--all-runs"],
                                 ["calibrate", name, "-o", "cal.yaml"],
                                 ["calibrate", name, "-o", "cal.yaml", "--json"]]))
    if out_p and argv[0] == "validate" and draw(chance(out_p)):
        argv += ["--out", "report.html"]
    return Case("runs", tuple(argv), ((name, content),))


#: A valid calibration file (``calibrate -o``; docs/formats.md, "Calibration files").
CALIBRATION_BASE = {
    "format": "configurator-calibration/1",
    "gpus": {"a100-80gb": {"fp16": {"gemm": 0.7, "host_op_us": 20.0,
                                    "intra_node_efficiency": 0.64}},
             "h100-80gb": {"bf16": {"flash_attention": 0.4}}},
    "intervals": {"a100-80gb": {"fp16": {"gemm": [0.6, 0.8]}}},
}


@st.composite
def calibration_cases(draw, out_p: int = 0) -> Case:
    """A calibration file (mutated) read by ``estimate``, ``search`` or ``validate``'s
    ``--calibration``."""
    ext, content = draw(document_file(CALIBRATION_BASE,
                                      ext=draw(st.sampled_from([".yaml", ".json"])),
                                      key="gpus"))
    name = "calibration" + ext
    job = ["--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1", "--gbs", "64",
           "--precision", "fp16", "--calibration", name]
    argv = draw(st.sampled_from([
        ["estimate", *job, "--tp", "2", "--pp", "1", "--mbs", "2"],
        ["estimate", *job, "--tp", "1", "--pp", "2", "--mbs", "1", "--json"],
        ["search", *job, "--json", "--top", "3"],
        ["validate", "runs.yaml", "--calibration", name]]))
    files = [(name, content)]
    if argv[0] == "validate":
        files.append(("runs.yaml", encode(dump_yaml(RUNS_BASE) or "")))
    return Case("calibration", tuple(argv), tuple(files))


_STRATEGIES = {"model": model_cases, "cluster": cluster_cases, "hf_config": hf_config_cases,
               "topofile": topofile_cases, "nccl": nccl_cases, "nvsmi": nvsmi_cases,
               "plan": plan_cases, "argv": argv_cases, "runs": runs_cases,
               "calibration": calibration_cases}


def case_strategy(target: str, out_p: int | None = None) -> st.SearchStrategy[Case]:
    """The Hypothesis strategy of :class:`Case` for ``target``; ``out_p``: the percentage of
    calls that write ``--out`` files (plots) where the target has such calls."""
    if target not in _STRATEGIES:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    fn = _STRATEGIES[target]
    return fn() if out_p is None else fn(out_p=out_p)
