"""Megatron-LM's own ``pretrain_gpt.py`` on one GPU, launched by the scripts ``search --out``
and ``launch`` write, against ``estimate``: measured iteration time and
``torch.cuda.max_memory_allocated`` of three small plans (dense; dense with selective
recompute; a small mixture of experts).

Three steps, the middle one on the GPU machine (it needs only Python's standard library, bash,
torchrun and a Megatron-LM core_v0.16.1 checkout):

    python -m bench.accuracy.megatron_gpu prepare --out runs/
    python -m bench.accuracy.megatron_gpu run --plans runs/ --megatron-lm MEGATRON_LM_DIR \\
        --out measured/
    python -m bench.accuracy.megatron_gpu compare --measured measured/megatron_gpu.json

``prepare`` writes a one-GPU cluster file and, per plan, the launch scripts: the dense and the
MoE plan are ``configurator search --out``'s best plan, the selective-recompute plan is the
dense plan with ``--recompute selective`` (``estimate --out`` then ``launch``);
``--attention-backend auto`` writes plans for a GPU with Transformer Engine. ``run`` runs
each ``launch_torchrun.sh`` with mock data; where Transformer Engine is missing (``--impl``)
it adds the flags a machine without it and Apex needs (:data:`LOCAL_FLAGS`) and drops
``--moe-grouped-gemm`` from the script (the legacy grouped GEMM needs the ``grouped_gemm``
package, so the experts run as megatron-core's ``SequentialMLP``, one GEMM per expert). It
runs a copy of the checkout in which MoE can run without Transformer Engine
(:data:`MOE_UTILS`), and parses Megatron's log: ``elapsed time per
iteration (ms)`` of every iteration and the last ``max allocated`` of ``report_memory``, i.e.
``torch.cuda.max_memory_allocated`` over the run. ``compare`` prices each plan with
``configurator estimate`` on a one-GPU cluster of the GPU the runs used and prints measured
against predicted. The measurements kept in ``tests/data/megatron_gpu/`` (``measured.json``
and the log lines it was parsed from) say where and how they were taken; docs/accuracy.md
discusses them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: pretrain_gpt.py flags for a GPU without Transformer Engine or Apex: megatron-core's local
#: layers (torch norms, unfused core attention: the plans say ``--attention-backend unfused``),
#: no persistent layer norm (torch's norm refuses it), no fused weight-gradient accumulation
#: (Apex's ``fused_weight_gradient_mlp_cuda``), no fused softmax (Megatron's
#: ``scaled_*_softmax_cuda`` kernels) and no fused RoPE (Transformer Engine's), as
#: megatron-core's own checks require (core_v0.16.1 ``transformer/torch_norm.py``,
#: ``tensor_parallel/layers.py``, ``fusions/fused_softmax.py``,
#: ``transformer/transformer_config.py``).
LOCAL_FLAGS = ("--transformer-impl", "local", "--no-persist-layer-norm",
               "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
               "--no-rope-fusion")

#: Iterations each run trains; the first ``WARMUP_ITERATIONS`` (allocator growth, autotuning)
#: are left out of the median.
TRAIN_ITERATIONS = 30
WARMUP_ITERATIONS = 10

#: A small mixture of experts in the shape of Mixtral (GQA, SwiGLU, RMSNorm, RoPE, top-2 of 8).
TINY_MOE = dict(name="tiny-moe", num_layers=12, hidden_size=1024, num_attention_heads=16,
                num_query_groups=4, ffn_hidden_size=4096, vocab_size=32000, seq_length=2048,
                swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
                untie_embeddings_and_output_weights=True, hidden_dropout=0.0,
                attention_dropout=0.0, num_experts=8, moe_router_topk=2,
                moe_ffn_hidden_size=1792, add_bias_linear=False)

#: The plans: name -> (model, global batch size, how the plan is chosen).
PLANS = {
    "dense": ("gpt-1.7b", 8, "search"),
    "dense_selective": ("gpt-1.7b", 8, "selective"),
    "moe": ("tiny-moe.yaml", 8, "search"),
}

#: The measurements kept with the tests.
MEASURED = Path(__file__).resolve().parents[2] / "tests/data/megatron_gpu/measured.json"

#: The GPU the plans are chosen for (the smallest memory they may run on).
PLAN_CLUSTER = "dgx-h100-80gb"

_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): "
                   r"([0-9.]+)")
_MEMORY = re.compile(r"\(after (\d+) iterations\) memory \(MB\) \| allocated: ([0-9.]+) \| "
                     r"max allocated: ([0-9.]+) \| reserved: ([0-9.]+) \| max reserved: "
                     r"([0-9.]+)")
_THEORY = re.compile(r"Theoretical memory footprints: weight and optimizer=([0-9.]+) MB, "
                     r"activation=([0-9.]+) MB, total=([0-9.]+) MB")


def _configurator(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "configurator", *args], capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise SystemExit(f"configurator {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


def one_gpu_cluster(preset: str, path: Path) -> Path:
    """Write a cluster file of one node with one GPU of ``preset``'s kind to ``path``."""
    import yaml

    from topology.cluster_files import CLUSTER_PRESETS

    data = {k: v for k, v in CLUSTER_PRESETS[preset].items() if k != "source"}
    data.update(gpus_per_node=1, nodes=1)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def prepare(out: Path, force: bool = False, attention_backend: str = "unfused") -> None:
    """Write the one-GPU cluster, the MoE model file and each plan's scripts under ``out``
    (core attention ``attention_backend``: ``unfused`` is what megatron-core's local layers
    run, for a GPU without Transformer Engine; ``auto`` for one with it); FileExistsError if
    ``out`` holds files and ``force`` is off."""
    import yaml

    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} is not empty; give --force to write over it")
    out.mkdir(parents=True, exist_ok=True)
    cluster = one_gpu_cluster(PLAN_CLUSTER, out / "cluster.yaml")
    (out / "tiny-moe.yaml").write_text(yaml.safe_dump(TINY_MOE, sort_keys=False),
                                       encoding="utf-8")
    common = ["--cluster", str(cluster), "--attention-backend", attention_backend]
    for name, (model, gbs, how) in PLANS.items():
        model_ref = str(out / model) if model.endswith(".yaml") else model
        plan_dir = out / name
        if how == "search":
            _configurator("search", "--model", model_ref, "--gbs", str(gbs), *common,
                          "--out", str(plan_dir), "--force")
        else:
            dense = json.loads((out / "dense" / "plan.json").read_text())["plan"]
            doc = out / f"{name}.json"
            _configurator("estimate", "--model", model_ref, "--gbs", str(gbs), *common,
                          "--tp", str(dense["tp"]), "--pp", str(dense["pp"]),
                          "--mbs", str(dense["micro_batch_size"]), "--recompute", "selective",
                          "--out", str(doc), "--force")
            _configurator("launch", "--plan", str(doc), "--out", str(plan_dir), "--force")
            shutil.copy(doc, plan_dir / "plan.json")
        print(f"{name}: {plan_dir / 'launch_torchrun.sh'}")


def parse_log(text: str) -> dict:
    """Iteration times (ms, in order), the last memory report (MB) and Megatron's theoretical
    memory (MB) from a ``pretrain_gpt.py`` log; ``ValueError`` if it logged no iteration."""
    iters = [(int(i), float(ms)) for i, ms in _ITER.findall(text)]
    if not iters:
        raise ValueError("no 'elapsed time per iteration' line in the log")
    memory = _MEMORY.findall(text)
    theory = _THEORY.search(text)
    out = {"iteration_time_ms": [ms for _, ms in sorted(iters)]}
    if memory:
        after, alloc, max_alloc, reserved, max_reserved = memory[-1]
        out.update(memory_after_iterations=int(after), allocated_MB=float(alloc),
                   max_allocated_MB=float(max_alloc), max_reserved_MB=float(max_reserved))
    if theory:
        out["megatron_theoretical_MB"] = {
            "weight_and_optimizer": float(theory.group(1)),
            "activation": float(theory.group(2)), "total": float(theory.group(3))}
    return out


def summary(parsed: dict) -> dict:
    """The median iteration time (s) after the warm-up iterations and the peak memory
    (bytes) of one parsed run."""
    times = parsed["iteration_time_ms"][WARMUP_ITERATIONS:] or parsed["iteration_time_ms"]
    return {"iteration_time_s": statistics.median(times) / 1e3,
            "max_memory_allocated_bytes": parsed["max_allocated_MB"] * 2**20}


def _device_facts() -> dict:
    facts = {}
    try:
        facts["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        facts["nvidia_smi"] = f"unavailable: {err}"
    res = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, "
                          "torch.version.cuda, torch.cuda.get_device_name())"],
                         capture_output=True, text=True)
    facts["torch"] = res.stdout.strip() or res.stderr.strip()[-300:]
    return facts


def _script_for_run(plan_dir: Path, work: Path, local: bool = True) -> tuple[Path, list[str]]:
    """The plan's torchrun script, copied with the lines a GPU without Transformer Engine
    cannot run left out (``local``; with Transformer Engine, as written); the lines left
    out."""
    text = (plan_dir / "launch_torchrun.sh").read_text()
    kept, dropped = [], []
    for line in text.splitlines():
        if local and line.strip() == "--moe-grouped-gemm":
            dropped.append(line.strip())
            continue
        kept.append(line)
    script = work / f"{plan_dir.name}.sh"
    script.write_text("\n".join(kept) + "\n")
    return script, dropped


#: core_v0.16.1's ``megatron/core/transformer/moe/moe_utils.py`` imports ``te_general_gemm``
#: from Transformer Engine and, where that import fails, leaves the name undefined, so the
#: router's ``RouterGatingLinearFunction`` stops with a ``NameError`` at the first MoE
#: forward; defining it as ``None`` selects the torch GEMM the function already has.
MOE_UTILS = Path("megatron/core/transformer/moe/moe_utils.py")
_NO_TE = "    HAVE_TE = False\n"
_NO_TE_FIXED = _NO_TE + "    te_general_gemm = None\n"


def megatron_copy(megatron_lm: Path, work: Path) -> tuple[Path, list[str]]:
    """A copy of the Megatron-LM checkout under ``work`` (its Python files and
    ``pretrain_gpt.py``'s neighbours) with :data:`MOE_UTILS` able to run without Transformer
    Engine; the changes made, as text."""
    dst = work / "Megatron-LM"
    shutil.copytree(megatron_lm, dst, ignore=shutil.ignore_patterns(".git", "docs", "images",
                                                                      "tests", "examples"))
    path = dst / MOE_UTILS
    text = path.read_text()
    if _NO_TE in text and "te_general_gemm = None" not in text:
        path.write_text(text.replace(_NO_TE, _NO_TE_FIXED, 1))
        return dst, [f"{MOE_UTILS}: te_general_gemm = None where Transformer Engine is absent"]
    return dst, []


def run_env(megatron: Path, work: Path) -> dict:
    """The environment the launch scripts run in: ``MEGATRON_LM_DIR`` set to ``megatron``,
    unbuffered Python output, and, where no ``torchrun`` is on the ``PATH``, one under
    ``work/bin`` that runs this interpreter's ``torch.distributed.run``."""
    env = dict(os.environ, MEGATRON_LM_DIR=str(megatron), PYTHONUNBUFFERED="1")
    if shutil.which("torchrun") is None:          # the interpreter's module, under its name
        shim = work / "bin" / "torchrun"
        shim.parent.mkdir(exist_ok=True)
        shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m torch.distributed.run \"$@\"\n")
        shim.chmod(0o755)
        env["PATH"] = f"{shim.parent}:{env['PATH']}"
    return env


def run_script(script: Path, extra: list[str], env: dict, port: int,
               timeout_s: int) -> tuple[str, int | str]:
    """Run one launch script with ``extra`` flags (after its own) on master port ``port``;
    its output (stdout, then stderr) and exit code, ``"timeout"`` where it ran past
    ``timeout_s`` seconds."""
    try:
        res = subprocess.run(["bash", str(script), *extra],
                             env=dict(env, MASTER_PORT=str(port)), timeout=timeout_s,
                             capture_output=True, text=True)
        return res.stdout + res.stderr, res.returncode
    except subprocess.TimeoutExpired as err:
        return (err.stdout or b"").decode() + (err.stderr or b"").decode(), "timeout"


def has_transformer_engine() -> bool:
    """Whether this interpreter can import Transformer Engine (what ``--impl auto`` asks)."""
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


def run(plans: Path, megatron_lm: Path, out: Path, timeout_s: int,
        only: list[str] | None = None, force: bool = False, impl: str = "auto") -> int:
    """Run every plan under ``plans`` with (a copy of) the Megatron-LM checkout at
    ``megatron_lm``; write each log and ``megatron_gpu.json`` under ``out``. ``impl``:
    ``local`` adds :data:`LOCAL_FLAGS` and drops the grouped GEMM, ``te`` runs the scripts
    as written (Transformer Engine layers), ``auto`` the first where Transformer Engine is
    missing. Returns the number of runs that failed; FileExistsError if ``out`` already
    holds a ``megatron_gpu.json`` and ``force`` is off."""
    if (out / "megatron_gpu.json").exists() and not force:
        raise FileExistsError(f"{out / 'megatron_gpu.json'} exists; give --force to replace it")
    out.mkdir(parents=True, exist_ok=True)
    local = impl == "local" or (impl == "auto" and not has_transformer_engine())
    with tempfile.TemporaryDirectory() as tmp:
        return _run_in(Path(tmp), plans, megatron_lm, out, timeout_s, only, local)


def _run_in(work: Path, plans: Path, megatron_lm: Path, out: Path, timeout_s: int,
            only: list[str] | None, local: bool) -> int:
    megatron, patched = megatron_copy(megatron_lm, work)
    env = run_env(megatron, work)
    result = {"command": "python -m bench.accuracy.megatron_gpu " + " ".join(sys.argv[1:]),
              "device": _device_facts(), "megatron_changes": patched,
              "transformer_impl": "local" if local else "transformer_engine",
              "train_iterations": TRAIN_ITERATIONS, "warmup_iterations": WARMUP_ITERATIONS,
              "runs": {}}
    failed = 0
    for port, name in enumerate(only or PLANS, start=29510):
        plan_dir = plans / name
        script, dropped = _script_for_run(plan_dir, work, local)
        extra = [*(LOCAL_FLAGS if local else ()), "--train-iters", str(TRAIN_ITERATIONS),
                 "--log-memory-interval", "5"]
        start = time.time()
        log, code = run_script(script, extra, env, port, timeout_s)
        (out / f"{name}.log").write_text(log)
        entry = {"plan": json.loads((plan_dir / "plan.json").read_text())["plan"],
                 "script": f"{name}/launch_torchrun.sh", "lines_left_out": dropped,
                 "extra_flags": extra, "exit": code, "wall_s": round(time.time() - start, 1)}
        try:
            entry["log"] = parse_log(log)
            entry.update(summary(entry["log"]))
        except (ValueError, KeyError) as err:
            entry["error"] = str(err)
            failed += 1
        result["runs"][name] = entry
        print(f"{name}: exit {code}, {entry.get('iteration_time_s', 'n/a')} s/iteration, "
              f"{entry.get('max_memory_allocated_bytes', 0) / 2**30:.2f} GiB", flush=True)
        (out / "megatron_gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    return failed


def gpu_preset(device_name: str) -> str:
    """The first cluster preset built of the GPU the device name names
    (:func:`topology.gpus.guess_gpu_preset`: ``NVIDIA H100 80GB HBM3`` -> ``dgx-h100-80gb``);
    ``ValueError`` if none is."""
    from topology.cluster_files import CLUSTER_PRESETS
    from topology.gpus import guess_gpu_preset

    gpu = guess_gpu_preset(device_name)
    for name, preset in CLUSTER_PRESETS.items():
        if gpu is not None and preset["gpu"] == gpu:
            return name
    raise ValueError(f"no cluster preset for the GPU {device_name!r}")


def compare(measured: Path) -> list[dict]:
    """Price every measured run's plan with ``estimate`` on a one-GPU cluster of the GPU the
    runs used; print and return measured against predicted.

    Memory is compared three ways: the state between iterations (``allocated`` after the last
    one: weights, gradients, optimizer state) against the predicted parameters, gradients and
    optimizer state; ``max allocated`` against that plus the predicted activations; ``max
    reserved`` (what the caching allocator held) against the predicted peak, whose
    ``other_bytes`` allowance covers what the allocator reserves beyond its live tensors and
    the CUDA context (:mod:`memory_model.estimate`)."""
    from bench.common import table_head

    data = json.loads(measured.read_text())
    preset = gpu_preset(data["device"]["nvidia_smi"])
    work = Path(tempfile.mkdtemp())
    cluster = one_gpu_cluster(preset, work / "cluster.yaml")
    (work / "tiny-moe.yaml").write_text(json.dumps(TINY_MOE), encoding="utf-8")
    rows = []
    for name, run_ in data["runs"].items():
        if "iteration_time_s" not in run_:
            continue
        p = run_["plan"]
        model, gbs, _ = PLANS[name]
        model_ref = str(work / model) if model.endswith(".yaml") else model
        est = json.loads(_configurator(
            "estimate", "--model", model_ref, "--cluster", str(cluster), "--gbs", str(gbs),
            "--tp", str(p["tp"]), "--pp", str(p["pp"]), "--mbs", str(p["micro_batch_size"]),
            "--recompute", p["recompute"], "--attention-backend", p["attention_backend"],
            "--json"))
        stage = est["memory_per_stage"][0]
        static = sum(stage[k] for k in ("parameters_bytes", "gradients_bytes",
                                        "optimizer_bytes"))
        log = run_["log"]
        rows.append(dict(
            plan=name, mbs=p["micro_batch_size"], recompute=p["recompute"],
            measured_s=run_["iteration_time_s"], predicted_s=est["iteration_time_s"],
            state_bytes=(log["allocated_MB"] * 2**20, static),
            allocated_bytes=(run_["max_memory_allocated_bytes"],
                             static + stage["activations_bytes"]),
            reserved_bytes=(log["max_reserved_MB"] * 2**20, est["peak_memory_bytes"])))

    def err(pair):
        return f"{100 * (pair[1] / pair[0] - 1):+.1f} %"

    def gib(pair):
        return f"{pair[0] / 2**30:.2f} | {pair[1] / 2**30:.2f} | {err(pair)}"

    print(f"GPU: {data['device']['nvidia_smi']} (priced as {preset}, one GPU)\n")
    print(table_head(["plan", "mbs", "recompute", "measured s", "predicted s", "error"]))
    for r in rows:
        print(f"| {r['plan']} | {r['mbs']} | {r['recompute']} | {r['measured_s']:.3f} | "
              f"{r['predicted_s']:.3f} | {err((r['measured_s'], r['predicted_s']))} |")
    print()
    print(table_head(["plan", "between iterations GiB", "predicted state GiB", "error",
                      "max allocated GiB", "predicted state + activations GiB", "error",
                      "max reserved GiB", "predicted peak GiB", "error"]))
    for r in rows:
        print(f"| {r['plan']} | {gib(r['state_bytes'])} | {gib(r['allocated_bytes'])} | "
              f"{gib(r['reserved_bytes'])} |")
    return rows


def step_parsers(doc: str, what: str, timeout_s: int, measured: Path, measured_help: str):
    """The three steps' argument parsers every one-GPU Megatron-LM bench shares: ``prepare
    --out [--force]`` (CPU), ``run --plans --megatron-lm --out [--timeout-s] [--force]`` (GPU)
    and ``compare [--measured]`` (CPU); ``what``: what ``prepare`` writes, ``timeout_s``: the
    default per run, ``measured``: the default of ``--measured``. Returns the top parser and
    the three subparsers, for each bench's own options."""
    from bench.common import bench_parser

    ap = bench_parser(doc)
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help=f"write {what} (CPU)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--force", action="store_true", help="write over a non-empty --out")
    r = sub.add_parser("run", help="run them with Megatron-LM (GPU)")
    r.add_argument("--plans", type=Path, required=True)
    r.add_argument("--megatron-lm", type=Path, required=True,
                   help="a Megatron-LM core_v0.16.1 checkout")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--timeout-s", type=int, default=timeout_s,
                   help=f"per run (default {timeout_s})")
    r.add_argument("--force", action="store_true", help="replace what --out holds")
    c = sub.add_parser("compare", help=measured_help)
    c.add_argument("--measured", type=Path, default=measured)
    return ap, p, r, c


def main(argv=None) -> int:
    ap, p, r, c = step_parsers(__doc__, "the plans' launch scripts", 240, MEASURED,
                               "measured against estimate (CPU)")
    p.add_argument("--attention-backend", choices=("unfused", "auto"), default="unfused",
                   help="the plans' core attention: unfused (megatron-core's local layers, "
                        "a GPU without Transformer Engine; default) or auto (with it)")
    r.add_argument("--only", nargs="+", choices=list(PLANS), help="run these plans alone")
    r.add_argument("--impl", choices=("auto", "local", "te"), default="auto",
                   help="megatron-core's local layers with the flags they need, or the "
                        "scripts as written (Transformer Engine); auto: local where "
                        "Transformer Engine is missing")
    args = ap.parse_args(argv)
    return run_step("megatron_gpu", args.step,
                    lambda: prepare(args.out, args.force, args.attention_backend),
                    lambda: run(args.plans, args.megatron_lm, args.out, args.timeout_s,
                                args.only, args.force, args.impl),
                    lambda: compare(args.measured))


def run_step(name: str, step: str, prepare_, run_, compare_) -> int:
    """Run one bench step: ``prepare_()`` (exit 0), ``run_()`` (its count of failed runs:
    exit 1 if any) or ``compare_()`` (exit 0); a ``FileExistsError`` (nothing written over)
    is one line ``name step: error`` and exit 2."""
    try:
        if step == "prepare":
            prepare_()
            return 0
        if step == "run":
            return 1 if run_() else 0
    except FileExistsError as err:
        print(f"{name} {step}: {err}", file=sys.stderr)
        return 2
    compare_()
    return 0


if __name__ == "__main__":
    sys.exit(main())
