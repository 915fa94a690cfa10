"""Known hostile inputs: a fixed corpus, one or more per bug class seen so far, per target
(:func:`regression_cases`; run by the quick profile, ``tests/test_fuzz_inputs.py``)."""

from __future__ import annotations

import json

from tests.support.fuzzing.case import Case
from tests.support.fuzzing.documents import alias_bomb, alias_bomb_inline, dump_yaml, encode
from tests.support.fuzzing.strategies import (GPU_MAPPING, HF_DEEPSEEK, HF_LLAMA, HF_MIXTRAL,
                                              HF_QWEN3_MOE, TARGETS, base_plan_text,
                                              model_base)
from tests.support.fuzzing.worker import REPO

_SENDRECV = """\
# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: sendrecv_perf
# nThread 1 nGpus 1 minBytes 33554432 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid 1 on {a} device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid 2 on {b} device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
   134217728      16777216    double     sum      -1  9947.83   {bw}   {bw}       0  9927.85   13.52   13.52    N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 13.4454
#
# Collective test concluded: sendrecv_perf
"""


def _yaml_doc(doc: dict, **over) -> bytes:
    d = dict(doc)
    d.update(over)
    return encode(dump_yaml(d) or "")


def regression_cases() -> dict[str, list[Case]]:
    """Per target, fixed hostile inputs of every bug class seen so far (YAML alias bombs,
    tags, non-string keys, huge/non-finite numbers, HF strings and mappings, non-ASCII digits
    in host names, mathtext in names, huge node counts, line separators in argv, ...)."""
    m = model_base("gpt-1.7b")
    ok = ("--cluster", "dgx-a100-80gb", "--gbs", "64", "--json")
    srch = lambda model, *extra: ("search", "--model", model, *ok, *extra)  # noqa: E731
    cl = dict(__import__("topology.cluster_files", fromlist=["x"]).CLUSTER_PRESETS["dgx-a100-80gb"])
    cl["nodes"] = 2
    csrch = lambda *extra: ("search", "--model", "gpt-1.7b", "--cluster", "cluster.yaml",  # noqa
                            "--gbs", "64", *extra)
    bomb = alias_bomb_inline(8)
    m_no = {k: v for k, v in m.items() if k != "num_layers"}
    out: dict[str, list[Case]] = {t: [] for t in TARGETS}
    model = lambda content, *argv: out["model"].append(  # noqa: E731
        Case("model", argv or srch("model.yaml"), (("model.yaml", content),)))
    model((dump_yaml(m_no) + f"num_layers: {bomb}\n").encode())
    model((dump_yaml(m_no) + f"num_layers: {bomb}\n").encode(),
          "search", "--model", "model.yaml", "--cluster", "dgx-a100-80gb", "--gbs", "64")
    model((alias_bomb(8) + dump_yaml(m)).encode())
    model(_yaml_doc(m, num_layers=2**63))
    model(_yaml_doc(m, hidden_size=10**400))
    model(_yaml_doc(m, vocab_size=1e308))
    model(_yaml_doc(m, seq_length=float("nan")))
    model(_yaml_doc(m, hidden_dropout=float("inf")))
    model(_yaml_doc(m, num_layers="24"))
    model(_yaml_doc(m, num_layers="٢٤"))
    model((dump_yaml(m) + "1: one\nnull: x\n? [a, b]\n: c\n").encode())
    model((dump_yaml(m_no) + "num_layers: !!timestamp 1\n").encode())
    model((dump_yaml({k: v for k, v in m.items() if k != "swiglu"}) + "swiglu: !!bool maybe\n"
           ).encode())
    model(_yaml_doc(m, name="$\\foo$"), "search", "--model", "model.yaml", "--cluster",
          "dgx-a100-80gb", "--gbs", "64", "--out", "out")
    model(_yaml_doc(m, name="a\u2028b"))
    model(b"")
    model(b"\x00\xff\xfe binary")
    model(("[" * 100000 + "]" * 100000).encode())
    model((dump_yaml(m) + "# " + "x" * 1_000_000 + "\n").encode())
    clus = lambda content, *argv: out["cluster"].append(  # noqa: E731
        Case("cluster", argv or csrch("--json"), (("cluster.yaml", content),)))
    clus(_yaml_doc(cl, nodes=2**63))
    clus(_yaml_doc(cl, nodes=1000000))
    clus(_yaml_doc(cl, gpus_per_node=1e308))
    clus(_yaml_doc(cl, inter_node_bandwidth_GBps=float("nan")))
    clus(_yaml_doc(cl, intra_node_latency_us="3"))
    clus(_yaml_doc(cl, name="$\\foo$"), *csrch("--out", "out"))
    clus(_yaml_doc(cl, gpu=dict(GPU_MAPPING, name="$x^$")), *csrch("--out", "out"))
    clus(_yaml_doc(cl, gpu=dict(GPU_MAPPING, num_sms=2**64)))
    clus((dump_yaml({k: v for k, v in cl.items() if k != "nodes"}) + f"nodes: {bomb}\n"
          ).encode())
    clus(_yaml_doc(cl), "search", "--model", "gpt-1.7b", "--cluster", "cluster.yaml", "--gbs",
         "64", "--nodes", "1000000", "--json")
    hf = lambda cfg, path="hf-model/config.json", *extra: out["hf_config"].append(  # noqa
        Case("hf_config", srch(path, *extra), ((path, encode(json.dumps(cfg))),)))
    hf({"n_embd": {}, "n_head": 12, "n_layer": 12})
    hf({"n_embd": "768", "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "vocab_size": 50257})
    hf(dict(HF_LLAMA, hidden_size="2048"))
    hf(dict(HF_LLAMA, num_hidden_layers=2**63))
    hf(dict(HF_LLAMA, max_position_embeddings=float("inf")))
    hf(dict(HF_LLAMA, tie_word_embeddings="false"))
    hf(dict(HF_LLAMA, model_type=["llama"], hidden_act={"a": 1}))
    hf(dict(HF_LLAMA, model_type={"llama": 1}))
    hf(dict(HF_QWEN3_MOE, mlp_only_layers=3))
    hf(dict(HF_DEEPSEEK, n_shared_experts="1", moe_intermediate_size="512"))
    hf(dict(HF_MIXTRAL, sliding_window="4096"))
    hf(dict(HF_LLAMA, num_local_experts=8, num_experts_per_tok=2))   # experts, not mixtral
    hf(dict(HF_DEEPSEEK, first_k_dense_replace=10**9))
    hf(HF_LLAMA, "$\\foo$/config.json", "--out", "out")
    hf(HF_LLAMA, "a\u2028b/config.json")
    tb = {"hosts": ["²", "node1²"], "gpus_per_host": 1, "links": [
        dict(src="²", dst="node1²", src_gpu=None, dst_gpu=None, bandwidth_GBps=12.5,
             latency_us=None, link_class="network", message_bytes=2**25,
             method="nccl-tests sendrecv_perf busbw", timestamp=None)]}
    topo = lambda content, *argv: out["topofile"].append(  # noqa: E731
        Case("topofile", argv or ("audit", "--topology", "topo.yaml", "--json"),
             (("topo.yaml", content),)))
    topo(_yaml_doc(tb))
    topo(_yaml_doc(tb), "topology", "import", "topo.yaml", "-o", "t.json", "--json")
    topo(_yaml_doc(tb), "search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
         "--gbs", "64", "--topology", "topo.yaml", "--json")
    topo(_yaml_doc(tb, hosts=["$\\foo$", "$x^$"], links=[]), "audit", "--topology",
         "topo.yaml", "--out", "report")
    # trial pins its scripts to the topology's hosts: names no script may hold
    trial = ("trial", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
             "--topology", "topo.yaml", "--runs", "2")
    topo(_yaml_doc(tb), *trial, "--json")
    for hosts in (["$\\foo$", "$x^$"], ["a b", "c;d"], ["-x", "y"]):
        topo(_yaml_doc(tb, hosts=hosts, gpus_per_host=8, links=[]), *trial, "--out", "t")
    topo(_yaml_doc(tb, hosts=["hostA", "hostB"], gpus_per_host=8, links=[
        dict(tb["links"][0], src="hostA", dst="hostB")]), *trial, "--nodes", "2", "--out", "t")
    topo(b"hosts: !!timestamp 1\nlinks: []\n")
    topo(_yaml_doc(tb, gpus_per_host=2**63))
    topo(_yaml_doc(tb, links=[dict(tb["links"][0], bandwidth_GBps=1e308, message_bytes=10**30,
                                   latency_us=float("nan"))]))
    topo(f"hosts: {bomb}\nlinks: []\n".encode())
    # placements and the placement options on a measured topology
    est = ("estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
           "--tp", "8", "--pp", "2", "--mbs", "1", "--nodes", "2", "--topology", "topo.yaml",
           "--json")
    ab = _yaml_doc(tb, hosts=["hostA", "hostB"], links=[
        dict(tb["links"][0], src="hostA", dst="hostB")])
    for place in ({"hosts": ["hostA", "hostA"]}, {"hosts": ["hostA", "nope"]},
                  {"hosts": ["hostA"]}, {"hosts": ["²", "hostB"]},
                  {"hosts": ["hostA", "hostB"], "gpu_order": [[0] * 8, list(range(8))]},
                  {"hosts": ["hostA", "hostB"], "gpu_order": [list(range(9))] * 2},
                  {"hosts": ["hostA", "hostB"], "gpu_order": [[2**63] * 8] * 2},
                  {"hosts": ["hostA", "hostB"], "gpu_order": [list(range(8))]},
                  {"placement": {"hosts": "hostA"}}, {"hosts": {"a": 1}}, [1, 2],
                  {"hosts": None}, {"hosts": ["hostB", "hostA"], "extra": 1}):
        out["topofile"].append(Case("topofile", (*est, "--placement", "p.yaml"),
                                    (("topo.yaml", ab),
                                     ("p.yaml", encode(dump_yaml(place) or "")))))
    out["topofile"].append(Case("topofile", (*est, "--placement", "p.yaml"),
                                (("topo.yaml", ab), ("p.yaml", f"hosts: {bomb}\n".encode()))))
    for flags in (("--nodes-range", "1:99999"), ("--nodes-range", "2:1"),
                  ("--nodes-range", "\u0663:\u0664"), ("--nodes", "3"),
                  ("--placement-evaluations", "0"), ("--placement-evaluations", str(2**63)),
                  ("--placement-time-s", "nan"), ("--placement-time-s", "1e309"),
                  ("--seed", "-1"), ("--seed", "9" * 400)):
        topo(_yaml_doc(tb), "search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
             "--gbs", "64", "--topology", "topo.yaml", "--json", *flags)
    nccl = lambda files, *argv: out["nccl"].append(  # noqa: E731
        Case("nccl", argv or ("topology", "import", "logs", "-o", "t.json", "--json"),
             tuple(files)))
    for a, b in (("²", "node1²"), ("\u0663\u00b2", "1\u2070"), ("x" * 300, "node10")):
        nccl([("logs/a.log", encode(_SENDRECV.format(a=a, b=b, bw="13.35")))])
    nccl([("logs/a.log", encode(_SENDRECV.format(a="$\\foo$", b="$x^$", bw="13.35")))],
         "audit", "logs", "--out", "report")
    nccl([("logs/a.log", encode(_SENDRECV.format(a="hostA", b="hostB", bw="1e309")))])
    nccl([("logs/a.log", encode(_SENDRECV.format(a="hostA", b="hostB", bw="nan")))],
         "audit", "logs", "--json")
    nccl([("logs/nccl_N2_G1_²_node1².log", b"# nThread 1 nGpus 1 minBytes 1\n")])
    smi_text = (REPO / "tests" / "data" / "nvidia-smi-topo_dgx-a100.txt").read_text()
    smi = lambda files, *argv: out["nvsmi"].append(  # noqa: E731
        Case("nvsmi", argv or ("topology", "import", "smi", "-o", "t.json", "--json"),
             tuple(files)))
    smi([("smi/topo_².txt", encode(smi_text)), ("smi/topo_node1².txt", encode(smi_text))])
    smi([("smi/topo_$\\foo$.txt", encode(smi_text))], "audit", "smi", "--out", "report")
    smi([("smi/topo_h.txt", encode(smi_text.replace("NV12", "NV999999999999999999999")))])
    smi([("smi/topo_h.txt", encode(smi_text.replace("NV12", "NV١٢")))])
    plan_doc = json.loads(base_plan_text())

    def plan(edit, *extra, name="plan.json"):
        d = json.loads(json.dumps(plan_doc))
        edit(d)
        out["plan"].append(Case("plan", ("launch", "--plan", name, "--out", "scripts", *extra),
                                ((name, encode(json.dumps(d, allow_nan=True))),)))
    plan(lambda d: d["estimate"].update(mfu=float("nan")))
    plan(lambda d: d["estimate"].update(iteration_time_s=float("inf")))
    plan(lambda d: d["plan"].update(tp=2**63))
    plan(lambda d: d["model"].update(num_layers=10**400))
    plan(lambda d: d["model"].update(name="$\\foo$ $(id)'\""))
    plan(lambda d: d["cluster"].update(name="a\u2028b"))
    plan(lambda d: d.update({"1": 2}), "--nodes", "1000000")
    plan(lambda d: d["model"].update({"1": 2}))
    plan(lambda d: None, "--nodes", str(2**63))
    plan(lambda d: None, "--data-path", "a'b\"$(id)`x`", "--tokenizer-model", "a\u2028b")
    files = (("plan.json", base_plan_text().encode()),)
    for argv in (("estimate", "a\x0bb", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                  "--gbs", "8", "--tp", "1", "--pp", "1", "--mbs", "1"),
                 ("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
                  "extra\u2028token"),
                 ("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
                  "--nodes", "1000000", "--json"),
                 ("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs",
                  "9" * 400, "--json"),
                 ("search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs", "64",
                  "--max-memory-fraction", "nan", "--json"),
                 # every plan shown is priced on its exact schedule: --top 3496 of a
                 # 40-layer model on one H200 host took 16 s (now refused above 1,000)
                 ("search", "--model", "gpt3-175b", "--cluster", "dgx-h200-141gb", "--gbs", "8",
                  "--top", "3496", "--json"),
                 ("estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gbs",
                  "64", "--tp", "262144", "--pp", "2048", "--mbs", "1", "--json"),
                 ("search", "--model", "/dev/zero", "--cluster", "dgx-a100-80gb", "--gbs",
                  "64"),
                 ("launch", "--plan", "plan.json", "--out", "s", "--nodes", "1000000"),
                 ("probe", "--nnodes", str(2**63), "--nproc-per-node", "8"),
                 ("probe", "--nnodes", "2", "--nproc-per-node", "8", "--timeout-s", "1e308",
                  "--size-mb", "1e-320"),
                 ("topology", "import", "/dev/zero", "-o", "t.json")):
        out["argv"].append(Case("argv", argv, files))
    # run and calibration files: PyYAML constructor errors (a ValueError escaped the run
    # file's reader), an alias bomb, deep nesting, a top level of the wrong kind
    for content in (b"global_batch_size: !!int 0x\n", b"runs:\n- {tp: !!float x}\n",
                    alias_bomb(8).encode() + b"runs: []\n", b"[" * 5000, b"42\n",
                    b"runs: {a: 1}\n"):
        out["runs"].append(Case("runs", ("validate", "runs.yaml"), (("runs.yaml", content),)))
        out["runs"].append(Case("runs", ("calibrate", "runs.yaml", "-o", "cal.yaml"),
                                (("runs.yaml", content),)))
        out["calibration"].append(Case(
            "calibration", ("estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                            "--nodes", "1", "--gbs", "64", "--tp", "1", "--pp", "1", "--mbs",
                            "1", "--calibration", "cal.yaml"), (("cal.yaml", content),)))
    return out
