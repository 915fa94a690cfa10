"""``configurator trial`` end to end on one GPU (``bench.accuracy.trial_gpu``): Megatron-LM's
own logs of every plan of a one-H200 job without Transformer Engine, ``calibrate`` on the
trial's logs alone, and the plans it never saw; the run step's plumbing with a stand-in
torchrun; the kept figures are what the logs say."""

import json
import tarfile
from pathlib import Path

import pytest

from bench.accuracy import megatron_gpu as mg
from bench.accuracy import trial_gpu as tg
from configurator.core.megatron_log import runs_from_megatron_log
from tests.megatron_stub import stand_in_megatron

DATA = Path(__file__).parent / "data" / "trial_gpu"


def _log_times(tarball: Path) -> dict[str, float]:
    """Each log's iteration time as calibrate reads it (median after the warm-up)."""
    out = {}
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            text = tar.extractfile(member).read().decode()
            run, = runs_from_megatron_log(text, cluster="dgx-h200-141gb")
            out[member.name.removesuffix(".log")] = run.iteration_time_s
    return out


@pytest.fixture(scope="module")
def summary():
    return tg.compare(DATA)


def test_calibrate_on_the_trial_alone_predicts_the_plans_it_never_saw(summary):
    """The presets describe Transformer Engine and Apex kernels; these runs had neither
    (every plan 35-50 % slower than predicted). ``calibrate`` on the runs the trial chooses
    fits the host time per operation and the attained HBM fraction of the eager
    element-wise kernels together, where alone the host time and the GEMM efficiency sit at
    the bounds of their ranges (on the runs it chooses now the host time alone fits inside
    its range and the HBM fraction joins it in the GEMM efficiency's stead), and the plans it
    never saw come within 5 % (2.4 % and 2.1 % when measured), Kendall's τ of the order above
    0.9 (1.00 measured; 0.82 before) and the pick the measured best."""
    assert summary["plans"] == 11 and summary["mape_before_pct"] > 35
    for t in summary["trials"].values():
        assert "refused" not in t["calibration"], t["calibration"]
        fitted, = t["calibration"]["groups"]
        assert set(fitted["parameters"]) == {"hbm", "host_op_us"}
        assert t["mape_held_out_before_pct"] > 35 and t["mape_held_out_after_pct"] < 5
        assert t["tau_after"] > 0.9 > summary["tau_before"]
        assert t["pick_after"] == (summary["measured_best"], 0.0)


def test_the_hbm_fraction_joins_a_fit_alone_in_a_pushed_parameters_stead():
    """On the runs the trial chose while a GEMM's fixed time held its launch (the mbs-1
    selective plan a contender beside the mbs-1 full recompute probe; it now takes mbs 1
    without recompute in the probe's place) the host time alone fits inside its range and
    the GEMM efficiency is pushed below its own, so no pair
    forms (``calibrate_jobs.py`` step 3); the HBM fraction, tried alone beside the host time,
    predicts the runs left out better and is kept, with a note naming the pushed one."""
    from configurator.app.calibrate_jobs import calibrate_runs

    runs = {}
    with tarfile.open(DATA / "logs.tar.gz") as tar:
        for member in tar.getmembers():
            run, = runs_from_megatron_log(tar.extractfile(member).read().decode(),
                                          cluster="dgx-h200-141gb")
            runs[member.name.removesuffix(".log")] = run
    _, (fit,) = calibrate_runs([runs[n] for n in ("trial1", "mbs1_selective", "trial3",
                                                  "trial4")])
    assert set(fit.parameters) == {"host_op_us", "hbm"}
    assert 0.38 < fit.parameters["hbm"] < 0.46 and 52 < fit.parameters["host_op_us"] < 58
    assert "hbm: fitted in place of gemm, which the runs push out of its range alone" in \
        fit.notes


def test_the_fitted_host_time_is_what_that_host_measures(summary):
    """The host time per operation calibrate fits from the trial's runs alone against the
    machine's own: one eager CUDA operation timed by ``configurator profile``'s loop
    (``bench.kernels.host_dispatch``, twice: 10.4 and 12.8 µs) times the in-training host
    factor is 35-44 µs per training operation, well above the preset (22.1 µs) the runs
    were 35-50 % too fast on, and below the fitted interval (55-60 µs on the runs it
    chooses now, 49.5-60 µs on those it chose when they were taken): with the
    backward one stretch of host and GPU work (the re-run forward of full recompute hidden
    where the backward is GPU-bound) the mbs-1 runs ask 1.3-1.7 times the profiled host
    time for the operations the local count prices (Megatron-LM's 2021 layer, 46 forward
    operations and the two all-reduces; megatron-core 0.16.1's local layer, which these runs
    ran, issues about twice as many ATen operations, ``bench.kernels.host_layer``)."""
    from topology.gpus import host_op_in_training_us

    data = json.loads((DATA / "host_dispatch.json").read_text())
    measured = [host_op_in_training_us(row["dispatch_us"]) for run in data["runs"]
                for row in run["rows"] if row["device"] == "cuda"]
    for t in summary["trials"].values():
        fit, = t["calibration"]["groups"]
        lo, hi = fit["intervals"]["host_op_us"]
        assert fit["before"]["host_op_us"] < min(measured) and max(measured) < lo
        assert fit["parameters"]["host_op_us"] < 1.75 * max(measured)


def test_memory_of_the_plans_that_keep_their_activations(summary):
    """Max reserved memory against the predicted peak: within 6 % for every plan without
    full recompute (−4.4 to +5.7 % measured). The full-recompute plans are 14-20 % under:
    their peak is the temporary FP32 copy of the parameters that torch's AdamW step
    allocates, the optimizer Megatron falls back to without Transformer Engine or Apex
    (docs/accuracy.md, 'Trial and calibrate on one GPU'), which the model does not price."""
    data = json.loads((DATA / "trial_gpu.json").read_text())
    kept = [n for n, r in data["runs"].items() if r["recompute"] != "full"]
    assert len(kept) == 7
    assert all(abs(summary["memory_error"][n]) < 0.06 for n in kept), summary["memory_error"]


def test_kept_figures_are_what_the_logs_say():
    """Every run of trial_gpu.json has its log; the repeat runs are what their logs say and
    within 2 % of the first (the repeatability calibrate's noise floor assumes)."""
    data = json.loads((DATA / "trial_gpu.json").read_text())
    times = _log_times(DATA / "logs.tar.gz")
    assert set(times) == set(data["runs"]) and all(r["exit"] == 0
                                                   for r in data["runs"].values())
    repeat = _log_times(DATA / data["repeat"]["logs"])
    for name, (first, again) in data["repeat"]["iteration_time_s"].items():
        assert times[name] == pytest.approx(first, abs=1e-4)
        assert repeat[name] == pytest.approx(again, abs=1e-4)
        assert abs(again / first - 1) < 0.02


FAKE_TORCHRUN = """#!/bin/sh
# records its arguments, then prints what pretrain_gpt.py logs
printf '%s\\n' "$@" > "$ARGV_DIR/$MASTER_PORT.argv"
echo " [t] iteration        1/      10 | elapsed time per iteration (ms): 500.0 |"
"""


def test_run_step_with_a_stand_in_torchrun(tmp_path, monkeypatch):
    """``run`` runs every plan of plans.json in its order with megatron-core's local layers'
    flags, fewer iterations than the scripts and a learning-rate warm-up shorter than the
    run (Megatron asserts it), and packs each log under the plan's name."""
    checkout, argv_dir = stand_in_megatron(tmp_path, monkeypatch, FAKE_TORCHRUN,
                                           "    HAVE_TE = False\n")
    plans = tmp_path / "plans"
    listed = {"trial1": dict(role="contender", directory="trial/trial1", mbs=4,
                             recompute="none"),
              "mbs2_full": dict(role="check", directory="check/mbs2_full", mbs=2,
                                recompute="full")}
    for p in listed.values():
        (plans / p["directory"]).mkdir(parents=True)
        (plans / p["directory"] / "launch_torchrun.sh").write_text(
            'MEGATRON_ARGS=(\n    --train-iters 30\n    --lr-warmup-iters 10\n)\n'
            'exec torchrun --nproc-per-node 1 "$MEGATRON_LM_DIR/pretrain_gpt.py" '
            '"${MEGATRON_ARGS[@]}" "$@"\n')
    (plans / "plans.json").write_text(json.dumps(listed))
    out = tmp_path / "out"
    assert tg.main(["run", "--plans", str(plans), "--megatron-lm", str(checkout),
                    "--out", str(out)]) == 0
    data = json.loads((out / "trial_gpu.json").read_text())
    assert list(data["runs"]) == list(listed)
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["mbs2_full.log", "trial1.log"]
    for port, name in enumerate(listed, start=29510):
        argv = (argv_dir / f"{port}.argv").read_text().split()
        assert data["runs"][name]["exit"] == 0
        assert all(flag in argv for flag in mg.LOCAL_FLAGS)

        def last(flag):
            return int(argv[len(argv) - 1 - argv[::-1].index(flag) + 1])
        assert last("--train-iters") == tg.ITERATIONS
        assert last("--lr-warmup-iters") < tg.ITERATIONS
    assert tg.main(["run", "--plans", str(plans), "--megatron-lm", str(checkout),
                    "--out", str(out)]) == 2           # never over what is there
