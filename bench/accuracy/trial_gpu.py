"""``configurator trial`` on one GPU, end to end: the trial's runs and every other plan of the
job measured with Megatron-LM's ``pretrain_gpt.py``, then ``calibrate`` on the trial's logs
alone, and the ranking and times before and after against what was measured.

Three steps, the middle one on the GPU machine (it needs only Python's standard library, bash,
torchrun and a Megatron-LM core_v0.16.1 checkout):

    python -m bench.accuracy.trial_gpu prepare --out .gpu/trial
    python -m bench.accuracy.trial_gpu run --plans .gpu/trial --megatron-lm MEGATRON_LM_DIR \\
        --out measured/
    python -m bench.accuracy.trial_gpu compare --measured measured/

The job (:data:`JOB`) is ``gpt-1.7b`` at global batch 8 on one H200 with megatron-core's
local layers (``--attention-backend local``: a GPU machine without Transformer Engine or
Apex, whose software the presets do not describe, which is what ``calibrate`` is for).
``prepare`` writes ``configurator trial``'s scripts (``trial/``) and, for every other plan
the search keeps, ``estimate --out`` + ``launch``'s (``check/``), and ``plans.json`` naming
them. ``run`` runs each with :data:`bench.accuracy.megatron_gpu.LOCAL_FLAGS` and
:data:`ITERATIONS` iterations and packs the logs into ``logs.tar.gz`` beside
``trial_gpu.json``. ``compare`` prices every log with ``configurator validate`` (as
``estimate`` prices the plan) before and after ``configurator calibrate`` on the logs of the
runs the trial chooses, and prints the time and peak-memory errors, the error on the plans
the calibration never saw and the regret of each pick (the measured time lost by running the
predicted best instead of the measured best). The measurements kept in
``tests/data/trial_gpu/`` say where and how they were taken.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.accuracy.megatron_gpu import (LOCAL_FLAGS, _configurator, _device_facts,
                                         _script_for_run, megatron_copy, one_gpu_cluster,
                                         run_env, run_script, run_step,
                                         step_parsers)

#: The job: model, global batch size, the cluster preset whose GPU the runs use, and the
#: search options (megatron-core's local layers: no Transformer Engine on the machine; nor
#: Apex, so no fused softmax: ``--no-masked-softmax-fusion``, which the runs as measured got
#: from :data:`bench.accuracy.megatron_gpu.LOCAL_FLAGS` and their logs record).
JOB = dict(model="gpt-1.7b", gbs=8, preset="dgx-h200-141gb", attention_backend="local",
           masked_softmax_fusion=False)

#: Iterations each run trains (the first 10 %, at least 2, are skipped as warm-up when the log
#: is read, as ``calibrate`` reads it: :mod:`configurator.core.megatron_log`).
ITERATIONS = 10

#: The learning rate's warm-up (the scripts' 10 iterations must be fewer than the run's:
#: core_v0.16.1 ``optimizer_param_scheduler.py`` asserts ``lr_warmup_steps < lr_decay_steps``;
#: the schedule does not change the time of an iteration).
WARMUP_LR_ITERATIONS = 2

#: The measurements kept with the tests.
MEASURED = Path(__file__).resolve().parents[2] / "tests/data/trial_gpu"


def _plan_name(plan: dict) -> str:
    return f"mbs{plan['micro_batch_size']}_{plan['recompute']}"


def _job_flags(cluster: Path) -> list[str]:
    return ["--model", JOB["model"], "--cluster", str(cluster), "--gbs", str(JOB["gbs"]),
            "--attention-backend", JOB["attention_backend"],
            *([] if JOB["masked_softmax_fusion"] else ["--no-masked-softmax-fusion"])]


def prepare(out: Path, force: bool = False) -> dict:
    """Write the one-GPU cluster, the trial's scripts, the other plans' scripts and
    ``plans.json`` (name -> role, directory, micro-batch size, recompute) under ``out``;
    FileExistsError if ``out`` holds files and ``force`` is off. Returns ``plans.json``."""
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} is not empty; give --force to write over it")
    out.mkdir(parents=True, exist_ok=True)
    cluster = one_gpu_cluster(JOB["preset"], out / "cluster.yaml")
    flags = _job_flags(cluster)
    _configurator("trial", *flags, "--out", str(out / "trial"), "--force", "-q")
    trials = json.loads((out / "trial" / "trials.json").read_text())["runs"]
    plans = {}
    for r in trials:
        plans[f"trial{r['index']}"] = dict(role=r["role"], directory=f"trial/trial{r['index']}",
                                           mbs=r["plan"]["micro_batch_size"],
                                           recompute=r["plan"]["recompute"])
    tried = {(p["mbs"], p["recompute"]) for p in plans.values()}
    found = json.loads(_configurator("search", *flags, "--top", "1000", "--json", "-q"))
    for entry in found["plans"]:
        cfg = entry["config"]
        key = (cfg["micro_batch_size"], cfg["recompute"])
        if key in tried or (cfg["tp"], cfg["pp"], cfg["cp"]) != (1, 1, 1):
            continue
        tried.add(key)
        name = _plan_name(cfg)
        doc = out / "check" / f"{name}.json"
        doc.parent.mkdir(exist_ok=True)
        _configurator("estimate", *flags, "--tp", "1", "--pp", "1", "--mbs", str(key[0]),
                      "--recompute", key[1], "--out", str(doc), "--force")
        _configurator("launch", "--plan", str(doc), "--out", str(out / "check" / name),
                      "--force")
        plans[name] = dict(role="check", directory=f"check/{name}", mbs=key[0],
                           recompute=key[1])
    (out / "plans.json").write_text(json.dumps(plans, indent=1) + "\n")
    for name, p in plans.items():
        print(f"{name}: {p['role']}, mbs {p['mbs']}, recompute {p['recompute']}: "
              f"{out / p['directory'] / 'launch_torchrun.sh'}")
    return plans


def _pack(logs: Path, dest: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for log in sorted(logs.glob("*.log")):
            tar.add(log, arcname=log.name)
    dest.write_bytes(buf.getvalue())


def run(plans: Path, megatron_lm: Path, out: Path, timeout_s: int, force: bool = False) -> int:
    """Run every plan of ``plans/plans.json`` (trial runs first) with a copy of the Megatron-LM
    checkout, megatron-core's local layers and :data:`ITERATIONS` iterations; after each run
    write ``out/logs.tar.gz`` (every log so far, named ``<plan>.log``) and
    ``out/trial_gpu.json``. Returns the number of runs that failed."""
    if (out / "trial_gpu.json").exists() and not force:
        raise FileExistsError(f"{out / 'trial_gpu.json'} exists; give --force to replace it")
    out.mkdir(parents=True, exist_ok=True)
    listed = json.loads((plans / "plans.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        megatron, patched = megatron_copy(megatron_lm, work)
        env = run_env(megatron, work)
        logs = work / "logs"
        logs.mkdir()
        result = {"command": "python -m bench.accuracy.trial_gpu " + " ".join(sys.argv[1:]),
                  "device": _device_facts(), "megatron_changes": patched,
                  "extra_flags": [*LOCAL_FLAGS, "--train-iters", str(ITERATIONS),
                                  "--lr-warmup-iters", str(WARMUP_LR_ITERATIONS)],
                  "runs": {}}
        failed = 0
        for port, (name, p) in enumerate(listed.items(), start=29510):
            script, dropped = _script_for_run(plans / p["directory"], work, local=True)
            start = time.time()
            log, code = run_script(script, result["extra_flags"], env, port, timeout_s)
            (logs / f"{name}.log").write_text(log)
            failed += code != 0
            result["runs"][name] = dict(p, exit=code, wall_s=round(time.time() - start, 1),
                                        lines_left_out=dropped)
            print(f"{name}: exit {code}, {result['runs'][name]['wall_s']} s", flush=True)
            _pack(logs, out / "logs.tar.gz")
            (out / "trial_gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    return failed


def _validate(logs: list[Path], cluster: Path, calibration: Path | None = None) -> dict:
    extra = ["--calibration", str(calibration)] if calibration else []
    doc = json.loads(_configurator("validate", *map(str, logs), "--cluster", str(cluster),
                                   "--json", "-q", *extra))
    return {r["name"]: r for r in doc["runs"]}


def _fitted(fit: dict) -> str:
    """``calibrate --json``'s fitted parameters as ``name preset -> value [interval]``."""
    words = [f"{name} {g['before'][name]:.3g} -> {value:.3g} "
             f"[{g['intervals'][name][0]:.3g}, {g['intervals'][name][1]:.3g}]"
             for g in fit["groups"] for name, value in g["parameters"].items()]
    return ", ".join(words) or "every preset kept"


def _calibrated(logs: dict, names: list[str], cluster: Path, work: Path,
                presets: dict) -> tuple[dict, dict]:
    """``calibrate --json`` on the logs of ``names`` (``{"refused": why}`` where it exits 2)
    and every log priced with that calibration (``presets``, every log priced without one,
    where refused)."""
    calibration = Path(tempfile.mkdtemp(dir=work)) / "calib.yaml"
    res = subprocess.run([sys.executable, "-m", "configurator", "calibrate",
                          *(str(logs[n]) for n in names), "--cluster", str(cluster), "-o",
                          str(calibration), "--json", "-q"], capture_output=True, text=True)
    if res.returncode != 0:
        return {"refused": res.stderr.strip().rpartition("error: ")[2]}, presets
    return json.loads(res.stdout), _validate(list(logs.values()), cluster, calibration)


def _trial_now(cluster: Path, measured: dict) -> list[str]:
    """The runs ``configurator trial`` chooses for :data:`JOB` today, as the names of the
    measured plans of the same micro-batch size and recompute; ``ValueError`` naming a run
    that was not measured."""
    doc = json.loads(_configurator("trial", *_job_flags(cluster), "--json", "-q"))
    by_key = {(r["mbs"], r["recompute"]): n for n, r in measured.items()}
    names = []
    for r in doc["runs"]:
        key = (r["plan"]["micro_batch_size"], r["plan"]["recompute"])
        if key not in by_key:
            raise ValueError(f"the trial now runs mbs {key[0]}, recompute {key[1]}, which "
                             "was not measured: prepare and run again")
        names.append(by_key[key])
    return names


def _regret(names: list[str], measured: dict, predicted: dict) -> tuple[str, float]:
    pick = min(names, key=lambda n: predicted[n])
    best = min(measured[n] for n in names)
    return pick, measured[pick] / best - 1


def compare(measured: Path) -> dict:
    """Calibrate on the logs under ``measured`` (``trial_gpu.json`` and ``logs.tar.gz``) of
    the runs ``configurator trial`` chooses today (every plan was measured, so a change of
    the trial's choice is judged on the same logs), and of the trial as it was run; price
    every measured plan before and after; print the table and the summary and return them:
    MAPE of the plans the calibration never saw (``held_out``), Kendall's τ of the order,
    and each pick's regret (the predicted best's measured time over the measured best's,
    minus 1), before, after, and for the best of the trial's runs alone."""
    from scipy.stats import kendalltau

    from bench.accuracy.megatron_gpu import gpu_preset
    from bench.common import table_head

    data = json.loads((measured / "trial_gpu.json").read_text())
    work = Path(tempfile.mkdtemp())
    with tarfile.open(measured / "logs.tar.gz") as tar:
        tar.extractall(work / "logs", filter="data")
    runs = {n: r for n, r in data["runs"].items() if r["exit"] == 0}
    ran = list(runs)
    logs = {n: work / "logs" / f"{n}.log" for n in ran}
    preset = gpu_preset(data["device"]["nvidia_smi"])
    cluster = one_gpu_cluster(preset, work / "cluster.yaml")
    before = _validate(list(logs.values()), cluster)
    meas = {n: before[n]["measured_iteration_time_s"] for n in ran}
    pred0 = {n: before[n]["predicted_iteration_time_s"] for n in ran}
    now, as_run = _trial_now(cluster, runs), [n for n in ran if runs[n]["role"] != "check"]
    trials = {"now": now} if sorted(now) == sorted(as_run) else {"now": now, "as run": as_run}

    def mape(names, pred):
        return 100 * sum(abs(pred[n] / meas[n] - 1) for n in names) / len(names)

    def tau(pred):
        return float(kendalltau([meas[n] for n in ran], [pred[n] for n in ran]).statistic)

    memory_error = {n: before[n]["memory_error"] for n in ran}
    summary = dict(gpu=data["device"]["nvidia_smi"], preset=preset, plans=len(ran),
                   memory_error=memory_error,
                   measured_best=min(ran, key=meas.get), mape_before_pct=mape(ran, pred0),
                   tau_before=tau(pred0), pick_before=_regret(ran, meas, pred0), trials={})
    for label, names in trials.items():
        fit, after = _calibrated(logs, names, cluster, work, before)
        pred1 = {n: after[n]["predicted_iteration_time_s"] for n in ran}
        held = [n for n in ran if n not in names]
        summary["trials"][label] = dict(
            runs=names, calibration=fit, predicted_s=pred1,
            mape_held_out_before_pct=mape(held, pred0), mape_held_out_after_pct=mape(held, pred1),
            mape_trial_after_pct=mape(names, pred1), tau_after=tau(pred1),
            pick_after=_regret(ran, meas, pred1), best_trial_run=_regret(names, meas, meas))
    now = summary["trials"]["now"]
    same = "" if "as run" in trials else ", the runs it chose when they were measured"
    print(f"GPU: {summary['gpu']} (priced as {preset}, one GPU); {JOB['model']}, gbs "
          f"{JOB['gbs']}, attention backend {JOB['attention_backend']}; calibrated on the "
          f"runs `configurator trial` chooses now ({', '.join(now['runs'])}{same})\n")
    print(table_head(["plan", "role", "mbs", "recompute", "measured s", "predicted s",
                      "error", "calibrated s", "error", "max reserved GiB",
                      "predicted peak GiB", "error"]))

    def err(a, b):
        return f"{100 * (b / a - 1):+.1f} %"

    for n in sorted(ran, key=meas.get):
        r, p1 = runs[n], now["predicted_s"][n]
        role = "trial" if n in now["runs"] else "held out"
        m0, m1 = before[n]["measured_peak_memory_bytes"], before[n]["predicted_peak_memory_bytes"]
        print(f"| {n} | {role} | {r['mbs']} | {r['recompute']} | {meas[n]:.3f} | "
              f"{pred0[n]:.3f} | {err(meas[n], pred0[n])} | {p1:.3f} | {err(meas[n], p1)} | "
              f"{m0 / 2**30:.2f} | {m1 / 2**30:.2f} | {err(m0, m1)} |")
    print(f"\nbefore calibrating: MAPE {summary['mape_before_pct']:.1f} %, Kendall τ "
          f"{summary['tau_before']:.2f}; pick {summary['pick_before'][0]}, "
          f"{100 * summary['pick_before'][1]:.1f} % slower than the measured best "
          f"({summary['measured_best']})")
    for label, t in summary["trials"].items():
        fit = t["calibration"]
        print(f"\ntrial {label} ({len(t['runs'])} runs: {', '.join(t['runs'])}): calibrate "
              + (f"refused ({fit['refused']})" if "refused" in fit else _fitted(fit)))
        print(f"  MAPE of the {len(ran) - len(t['runs'])} plans it never saw "
              f"{t['mape_held_out_before_pct']:.1f} % -> {t['mape_held_out_after_pct']:.1f} %, "
              f"of its own runs {t['mape_trial_after_pct']:.1f} %; Kendall τ "
              f"{t['tau_after']:.2f}; pick {t['pick_after'][0]}, "
              f"{100 * t['pick_after'][1]:.1f} % slower than the measured best; the best of "
              f"its runs {t['best_trial_run'][0]}, {100 * t['best_trial_run'][1]:.1f} % slower")
    return summary


def main(argv=None) -> int:
    ap, _, _, _ = step_parsers(__doc__, "the trial's and the other plans' scripts", 120,
                               MEASURED, "calibrate on the trial's logs, then measured "
                               "against predicted (CPU)")
    args = ap.parse_args(argv)
    return run_step("trial_gpu", args.step, lambda: prepare(args.out, args.force),
                    lambda: run(args.plans, args.megatron_lm, args.out, args.timeout_s,
                                args.force),
                    lambda: compare(args.measured))


if __name__ == "__main__":
    sys.exit(main())
