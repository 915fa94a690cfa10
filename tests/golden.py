"""Golden outputs: ``search --json``, ``estimate --json`` and the generated launch scripts for a
fixed set of cases, recorded once and compared on every run (``tests/test_golden.py``).

Only timing fields that measure this machine (``search_time_s``) are dropped before the
comparison; every predicted figure, plan field and script line must stay identical.

Record after an intended change of behaviour (and say why in the commit)::

    python -m tests.golden --record

Record a case just added (only the cases that have no file yet; the others stay as recorded)::

    python -m tests.golden --record-new
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

from configurator.data import EXAMPLES, data_path

GOLDEN_DIR = Path(__file__).resolve().parent / "data" / "golden"
REAL_LOGS = data_path(EXAMPLES, "h100-17node-nccl-tests")

#: Fields that measure this machine, not the model: removed before comparing.
TIMING_FIELDS = frozenset({"search_time_s", "wall_time_s"})   # wall-clock, not behaviour

CUSTOM_MODEL = """\
name: custom-gpt-13b
num_layers: 40
hidden_size: 5120
num_attention_heads: 40
vocab_size: 50257
seq_length: 2048
"""

CUSTOM_CLUSTER = """\
name: lab-h100
gpu: h100-80gb
gpus_per_node: 8
nodes: 4
intra_node_bandwidth_GBps: 450
inter_node_bandwidth_GBps: 25
intra_node_latency_us: 3
inter_node_latency_us: 8
"""

HF_LLAMA = {"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
            "vocab_size": 128256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": True}

A100, H100, H200 = "dgx-a100-80gb", "dgx-h100-80gb", "dgx-h200-141gb"

#: name -> argv after ``configurator``. ``{model}``, ``{cluster}``, ``{hf}``, ``{topo}`` and
#: ``{out}`` are filled in with files made for the run.
SEARCH_CASES: dict[str, list[str]] = {
    "search_gpt3_175b_a100_128n": ["--model", "gpt3-175b", "--cluster", A100, "--nodes", "128",
                                   "--gbs", "1536"],
    "search_gpt_1.7b_a100_4n": ["--model", "gpt-1.7b", "--cluster", A100, "--nodes", "4",
                                "--gbs", "512"],
    "search_llama3_8b_h100_2n": ["--model", "llama3-8b", "--cluster", H100, "--nodes", "2",
                                 "--gbs", "128"],
    "search_llama3_70b_h100_16n": ["--model", "llama3-70b", "--cluster", H100, "--nodes", "16",
                                   "--gbs", "512"],
    "search_llama2_70b_h200_8n": ["--model", "llama2-70b", "--cluster", H200, "--nodes", "8",
                                  "--gbs", "256"],
    "search_llama2_7b_a100_1n_fp16": ["--model", "llama2-7b", "--cluster", A100, "--nodes", "1",
                                      "--gbs", "64", "--precision", "fp16"],
    "search_llama3_8b_h100_4n_fp8": ["--model", "llama3-8b", "--cluster", H100, "--nodes", "4",
                                     "--gbs", "256", "--precision", "fp8"],
    "search_gpt_18.4b_a100_local_full": ["--model", "gpt-18.4b", "--cluster", A100, "--nodes",
                                         "32", "--gbs", "1024", "--attention-backend", "local",
                                         "--recompute", "full", "--precision", "fp16"],
    "search_llama3_70b_h100_32k": ["--model", "llama3-70b", "--cluster", H100, "--nodes", "8",
                                   "--gbs", "64", "--seq-length", "32768"],
    "search_gpt_1t_a100_384n": ["--model", "gpt-1t", "--cluster", A100, "--nodes", "384",
                                "--gbs", "3072"],
    "search_llama3.1_405b_h100_128n": ["--model", "llama3.1-405b", "--cluster", H100,
                                       "--nodes", "128", "--gbs", "1024"],
    "search_custom_model_cluster": ["--model", "{model}", "--cluster", "{cluster}",
                                    "--gbs", "256", "--top", "20", "--max-memory-fraction",
                                    "0.9"],
    "search_hf_config_h100_1n": ["--model", "{hf}", "--cluster", H100, "--nodes", "1", "--gbs",
                                 "64", "--recompute", "none", "selective"],
    "search_topology_llama3_70b": ["--model", "llama3-70b", "--cluster", H100, "--nodes", "17",
                                   "--gbs", "544", "--topology", "{topo}"],
    "search_topology_exclude_flagged": ["--model", "llama3-70b", "--cluster", H100, "--gbs",
                                        "512", "--topology", "{topo}", "--exclude-flagged"],
}

ESTIMATE_CASES: dict[str, list[str]] = {
    "estimate_gpt3_175b_a100": ["--model", "gpt3-175b", "--cluster", A100, "--nodes", "128",
                                "--gbs", "1536", "--tp", "8", "--pp", "16", "--vp", "2",
                                "--mbs", "1"],
    "estimate_llama3_70b_h100_cp": ["--model", "llama3-70b", "--cluster", H100, "--nodes", "16",
                                    "--gbs", "512", "--tp", "4", "--pp", "4", "--cp", "2",
                                    "--vp", "5", "--mbs", "1"],
    "estimate_llama3_8b_fp8_plain_opt": ["--model", "llama3-8b", "--cluster", H100, "--nodes",
                                         "1", "--gbs", "64", "--tp", "1", "--pp", "1", "--mbs",
                                         "2", "--precision", "fp8",
                                         "--no-distributed-optimizer"],
    "estimate_gpt_1.7b_local_selective": ["--model", "gpt-1.7b", "--cluster", A100, "--nodes",
                                          "2", "--gbs", "256", "--tp", "2", "--pp", "2",
                                          "--mbs", "4", "--recompute", "selective",
                                          "--no-sequence-parallel", "--attention-backend",
                                          "local"],
    "estimate_does_not_fit": ["--model", "llama3-70b", "--cluster", A100, "--nodes", "1",
                              "--gbs", "8", "--tp", "8", "--pp", "1", "--mbs", "1"],
    "estimate_sc21_145b_row": ["--model", "gpt-145.6b", "--cluster", A100, "--nodes", "192",
                               "--gbs", "2304", "--tp", "8", "--pp", "8", "--vp", "2",
                               "--mbs", "2", "--recompute", "full", "--precision", "fp16",
                               "--attention-backend", "local", "--no-overlap-grad-reduce"],
    "estimate_topology": ["--model", "llama3-8b", "--cluster", H100, "--nodes", "17", "--gbs",
                          "544", "--tp", "2", "--pp", "4", "--mbs", "1", "--topology", "{topo}"],
    "estimate_custom_cluster_uneven_tp": ["--model", "{model}", "--cluster", "{cluster}",
                                          "--gbs", "64", "--tp", "4", "--pp", "2", "--mbs", "2",
                                          "--recompute", "full"],
    # multi-latent attention, MoE with shared experts, multi-token prediction, an uneven split
    "estimate_deepseek_v3_h100_mla_mtp": ["--model", "deepseek-v3", "--cluster", H100, "--nodes",
                                          "64", "--gbs", "1024", "--tp", "2", "--pp", "16",
                                          "--ep", "32", "--mbs", "1", "--recompute",
                                          "selective"],
    "estimate_qwen3_30b_a3b_h100_fp8_moe": ["--model", "qwen3-30b-a3b", "--cluster", H100,
                                            "--nodes", "1", "--gbs", "64", "--tp", "1", "--pp",
                                            "1", "--ep", "8", "--mbs", "1", "--precision",
                                            "fp8"],
}

#: Cases whose ``search --out`` files (scripts, plan.json) are compared too.
SCRIPT_CASES = ("search_gpt3_175b_a100_128n", "search_llama3_8b_h100_4n_fp8",
                "search_gpt_18.4b_a100_local_full", "search_custom_model_cluster")

#: ``launch --plan`` from the first script case's plan.json, with real data paths.
LAUNCH_ARGS = ["--data-path", "/data/my corpus_text_document", "--tokenizer-model",
               "/models/tok.model"]


def _inputs(tmp: Path) -> dict[str, str]:
    files = {"model": tmp / "model.yaml", "cluster": tmp / "cluster.yaml",
             "hf": tmp / "llama-1b" / "config.json"}
    files["model"].write_text(CUSTOM_MODEL)
    files["cluster"].write_text(CUSTOM_CLUSTER)
    files["hf"].parent.mkdir()
    files["hf"].write_text(json.dumps(HF_LLAMA))
    out = {k: str(p) for k, p in files.items()}
    out["topo"] = str(tmp / "topo.json")
    return out


def _run(argv: list[str]) -> tuple[int, str, str]:
    from configurator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING_FIELDS}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def produce(only: set[str] | None = None) -> dict[str, object]:
    """Run every case (or the search and estimate cases named in ``only``, and the
    ``launch --plan`` case when its search is among them); returns ``{name: JSON object or
    script text}`` (timing stripped)."""
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        files = _inputs(tmp)
        code, _, err = _run(["topology", "import", str(REAL_LOGS), "-o", files["topo"]])
        assert code == 0, err
        fill = lambda argv, out="": [a.format(out=out, **files) for a in argv]  # noqa: E731
        for name, argv in SEARCH_CASES.items():
            if only is not None and name not in only:
                continue
            out_dir = tmp / name
            extra = ["--out", str(out_dir)] if name in SCRIPT_CASES else []
            code, out, err = _run(["search", *fill(argv), "--json", *extra])
            assert code == 0, f"{name}: {err}"
            results[name] = _strip(json.loads(out))
            if name in SCRIPT_CASES:
                for fname in ("launch_torchrun.sh", "launch_slurm.sbatch"):
                    results[f"{name}/{fname}"] = (out_dir / fname).read_text()
                plan_doc = json.loads((out_dir / "plan.json").read_text())
                results[f"{name}/plan.json:estimate"] = _strip(plan_doc["estimate"])
        for name, argv in ESTIMATE_CASES.items():
            if only is not None and name not in only:
                continue
            code, out, err = _run(["estimate", *fill(argv), "--json"])
            assert code == 0, f"{name}: {err}"
            results[name] = _strip(json.loads(out))
        if only is not None and SCRIPT_CASES[0] not in only:
            return results
        src = tmp / SCRIPT_CASES[0] / "plan.json"
        code, _, err = _run(["launch", "--plan", str(src), "--out", str(tmp / "launch"),
                             *LAUNCH_ARGS])
        assert code == 0, err
        for fname in ("launch_torchrun.sh", "launch_slurm.sbatch"):
            results[f"launch_from_plan/{fname}"] = (tmp / "launch" / fname).read_text()
    return results


def golden_path(name: str) -> Path:
    safe = name.replace("/", "__").replace(":", "_")
    return GOLDEN_DIR / (safe if safe.endswith((".sh", ".sbatch")) else safe + ".json")


def record(new_only: bool = False) -> int:
    """Record every case (the old files removed first), or with ``new_only`` the search and
    estimate cases that have no recorded file yet, leaving every recorded file as it is."""
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    if new_only:
        only = {n for n in (*SEARCH_CASES, *ESTIMATE_CASES) if not golden_path(n).exists()}
        results = {n: v for n, v in produce(only).items() if not golden_path(n).exists()}
    else:
        for old in GOLDEN_DIR.iterdir():
            old.unlink()
        results = produce()
    for name, value in results.items():
        text = value if isinstance(value, str) else json.dumps(value, indent=1, sort_keys=True)
        golden_path(name).write_text(text if text.endswith("\n") else text + "\n")
    print(f"recorded {len(results)} golden outputs in {GOLDEN_DIR}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] not in (["--record"], ["--record-new"]):
        print("usage: python -m tests.golden --record | --record-new", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(record(new_only=sys.argv[1:] == ["--record-new"]))
