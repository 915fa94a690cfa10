"""Megatron-LM's own pretrain_gpt.py on one GPU (``bench.accuracy.megatron_gpu``): the kept
measurements parse from the log lines they came from, the run step's fixes to a script and a
checkout do what they say, and the memory model stays where the measurement puts it."""

import json
from pathlib import Path

import pytest

from bench.accuracy import megatron_gpu as mg
from tests.megatron_stub import stand_in_megatron

DATA = Path(__file__).parent / "data" / "megatron_gpu"


@pytest.fixture(scope="module")
def measured():
    return json.loads((DATA / "measured.json").read_text())


@pytest.mark.parametrize("name", list(mg.PLANS))
def test_kept_figures_are_what_the_logs_say(measured, name):
    parsed = mg.parse_log((DATA / f"{name}.log").read_text())
    run = measured["runs"][name]
    assert parsed == run["log"]
    assert len(parsed["iteration_time_ms"]) == measured["train_iterations"] == 30
    assert parsed["memory_after_iterations"] == 30
    assert mg.summary(parsed) == pytest.approx(
        {"iteration_time_s": run["iteration_time_s"],
         "max_memory_allocated_bytes": run["max_memory_allocated_bytes"]})
    assert run["exit"] == 0 and run["plan"]["attention_backend"] == "unfused"


def test_parse_log_reads_megatron_lines():
    log = "\n".join([
        " [2026-11-27 03:14:15.1] iteration        2/       3 | consumed samples:   16 | "
        "elapsed time per iteration (ms): 900.5 | learning rate: 3.0E-05 |",
        " [2026-11-27 03:14:14.1] iteration        1/       3 | consumed samples:    8 | "
        "elapsed time per iteration (ms): 2000.0 | learning rate: 3.0E-05 |",
        " [2026-11-27 03:14:16.1] iteration        3/       3 | consumed samples:   24 | "
        "elapsed time per iteration (ms): 800.5 |",
        "[Rank 0] (after 1 iterations) memory (MB) | allocated: 10.00 | max allocated: 20.00 | "
        "reserved: 30.00 | max reserved: 30.00",
        "[Rank 0] (after 3 iterations) memory (MB) | allocated: 11.00 | max allocated: 25.50 | "
        "reserved: 32.00 | max reserved: 33.00",
        "Theoretical memory footprints: weight and optimizer=1.50 MB, activation=2.25 MB, "
        "total=3.75 MB"])
    got = mg.parse_log(log)
    assert got["iteration_time_ms"] == [2000.0, 900.5, 800.5]      # in iteration order
    assert (got["memory_after_iterations"], got["max_allocated_MB"],
            got["max_reserved_MB"]) == (3, 25.5, 33.0)               # the last report
    assert got["megatron_theoretical_MB"]["total"] == 3.75
    with pytest.raises(ValueError, match="elapsed time per iteration"):
        mg.parse_log("Traceback (most recent call last):\n")


def test_summary_leaves_the_warmup_iterations_out():
    times = [5000.0] * mg.WARMUP_ITERATIONS + [100.0, 300.0, 200.0]
    got = mg.summary({"iteration_time_ms": times, "max_allocated_MB": 1024.0})
    assert got == {"iteration_time_s": 0.2, "max_memory_allocated_bytes": 2**30}


def test_script_for_run_drops_only_the_grouped_gemm(tmp_path):
    plan = tmp_path / "moe"
    plan.mkdir()
    (plan / "launch_torchrun.sh").write_text("MEGATRON_ARGS=(\n    --num-experts 8\n"
                                             "    --moe-grouped-gemm\n    --bf16\n)\n")
    script, dropped = mg._script_for_run(plan, tmp_path)
    assert dropped == ["--moe-grouped-gemm"]
    assert script.read_text() == "MEGATRON_ARGS=(\n    --num-experts 8\n    --bf16\n)\n"


def test_megatron_copy_defines_the_missing_gemm_once(tmp_path):
    src = tmp_path / "Megatron-LM"
    moe_utils = src / mg.MOE_UTILS
    moe_utils.parent.mkdir(parents=True)
    (src / "docs").mkdir()
    (src / "pretrain_gpt.py").write_text("# entry\n")
    moe_utils.write_text("try:\n    from te import te_general_gemm\n\n    HAVE_TE = True\n"
                         "except ImportError:\n    HAVE_TE = False\n\n\ndef f():\n"
                         "    HAVE_TE = False\n")
    dst, changes = mg.megatron_copy(src, tmp_path / "a")
    text = (dst / mg.MOE_UTILS).read_text()
    assert text.count("te_general_gemm = None") == 1 and len(changes) == 1
    assert text.index("te_general_gemm = None") < text.index("def f")
    assert (dst / "pretrain_gpt.py").exists() and not (dst / "docs").exists()
    assert "te_general_gemm = None" not in moe_utils.read_text()      # the user's checkout
    again, changes = mg.megatron_copy(dst, tmp_path / "b")            # already fixed
    assert changes == [] and (again / mg.MOE_UTILS).read_text() == text


@pytest.mark.parametrize("name,preset", [("NVIDIA H200, 143771 MiB, 580.159.04",
                                          "dgx-h200-141gb"),
                                         ("NVIDIA H100 80GB HBM3", "dgx-h100-80gb"),
                                         ("NVIDIA A100-SXM4-80GB", "dgx-a100-80gb")])
def test_gpu_preset(name, preset):
    assert mg.gpu_preset(name) == preset


def test_gpu_preset_refuses_an_unknown_gpu():
    with pytest.raises(ValueError, match="Tesla V100"):
        mg.gpu_preset("Tesla V100-SXM2-32GB")


def test_memory_model_against_the_measured_runs(capsys):
    """The measured H200 runs (docs/accuracy.md, 'Megatron-LM on one GPU'): the predicted
    state and activations stay within 7 % of torch's max_memory_allocated, and the predicted
    peak (with its allowance) within 6 % of what the allocator reserved, never 2 % under."""
    rows = mg.compare(mg.MEASURED)
    assert [r["plan"] for r in rows] == list(mg.PLANS)
    for r in rows:
        measured, predicted = r["allocated_bytes"]
        assert abs(predicted / measured - 1) < 0.07, r
        measured, predicted = r["reserved_bytes"]
        assert -0.02 < predicted / measured - 1 < 0.06, r
        assert r["predicted_s"] < r["measured_s"]     # TE-kernel rates; the runs had neither
    assert "priced as dgx-h200-141gb" in capsys.readouterr().out


def test_steps_refuse_to_write_over_what_is_there(tmp_path, capsys):
    """prepare refuses a non-empty --out and run an --out that already holds measurements
    (exit 2, one line), before doing anything."""
    (tmp_path / "mine.txt").write_text("keep me")
    assert mg.main(["prepare", "--out", str(tmp_path)]) == 2
    (tmp_path / "megatron_gpu.json").write_text("{}")
    assert mg.main(["run", "--plans", str(tmp_path), "--megatron-lm", str(tmp_path),
                    "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "--force" in err[0] and "megatron_gpu.json" in err[1]
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    assert (tmp_path / "megatron_gpu.json").read_text() == "{}"


FAKE_TORCHRUN = """#!/bin/sh
# records its arguments, then prints what pretrain_gpt.py logs
printf '%s\\n' "$@" > "$ARGV_DIR/$MASTER_PORT.argv"
i=1
while [ $i -le 30 ]; do
  head=" [t] iteration        $i/      30 | consumed samples: 8 |"
  echo "$head elapsed time per iteration (ms): 500.0 |"
  i=$((i + 1))
done
memory="allocated: 1.00 | max allocated: 2048.00 | reserved: 3.00 | max reserved: 4.00"
echo "[Rank 0] (after 30 iterations) memory (MB) | $memory"
"""


@pytest.mark.parametrize("impl", ["local", "te"])
def test_run_step_end_to_end_with_a_stand_in_torchrun(tmp_path, monkeypatch, impl):
    """``run`` on plans and a checkout laid out as prepare and Megatron-LM lay them out, with
    a torchrun that records its arguments: local layers get LOCAL_FLAGS and lose the
    grouped GEMM, Transformer Engine runs keep the script as written; the checkout's MoE fix
    goes to a copy; each run's figures land in megatron_gpu.json."""
    checkout, argv_dir = stand_in_megatron(
        tmp_path, monkeypatch, FAKE_TORCHRUN,
        "try:\n    pass\nexcept ImportError:\n    HAVE_TE = False\n")
    plans = tmp_path / "plans"
    for name in mg.PLANS:
        (plans / name).mkdir(parents=True)
        (plans / name / "plan.json").write_text(json.dumps({"plan": {"tp": 1}}))
        (plans / name / "launch_torchrun.sh").write_text(     # as the launchers lay it out
            'MEGATRON_ARGS=(\n    --num-experts 8\n    --moe-grouped-gemm\n)\n'
            'exec torchrun --nproc-per-node 1 "$MEGATRON_LM_DIR/pretrain_gpt.py" '
            '"${MEGATRON_ARGS[@]}" "$@"\n')
    out = tmp_path / "out"
    assert mg.main(["run", "--plans", str(plans), "--megatron-lm", str(checkout),
                    "--out", str(out), "--impl", impl]) == 0
    data = json.loads((out / "megatron_gpu.json").read_text())
    assert data["transformer_impl"] == ("local" if impl == "local" else "transformer_engine")
    assert "te_general_gemm = None" not in (checkout / mg.MOE_UTILS).read_text()
    assert len(data["megatron_changes"]) == 1
    for port, name in enumerate(mg.PLANS, start=29510):
        argv = (argv_dir / f"{port}.argv").read_text().split()
        run = data["runs"][name]
        assert run["iteration_time_s"] == 0.5 and run["max_memory_allocated_bytes"] == 2**31
        assert ("--moe-grouped-gemm" in argv) == (impl == "te")
        assert ("--transformer-impl" in argv) == (impl == "local")
        assert argv[argv.index("--train-iters") + 1] == str(mg.TRAIN_ITERATIONS)
