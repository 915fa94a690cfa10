"""The Megatron-LM training log ``configurator examples`` writes
(configurator/data/examples/megatron-h200-1gpu): the real run's kept lines
(tests/data/megatron_gpu/dense.log) after an arguments dump that agrees with the argument
lines kept from the run, read by ``validate`` as that run's plan and figures."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.accuracy.megatron_example_log import KEPT_ARGUMENT_LINES
from configurator.core.megatron_log import load_megatron_log
from configurator.core.model_presets import MODEL_PRESETS
from configurator.data import EXAMPLES, data_path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "data" / "megatron_gpu"
FOLDER = data_path(EXAMPLES, "megatron-h200-1gpu")
LOG = FOLDER / "gpt-1.7b_h200_1gpu.log"
CLUSTER = FOLDER / "cluster-h200-1gpu.yaml"


def test_the_log_is_the_run_s_lines_after_its_arguments_dump():
    shipped = LOG.read_text().splitlines()
    kept = (RUN / "dense.log").read_text().splitlines()
    end = next(i for i, ln in enumerate(shipped) if "end of arguments" in ln)
    assert "---- arguments ----" in "".join(shipped[:end])
    dump = shipped[:end + 1]
    assert all(ln in dump for ln in kept[:KEPT_ARGUMENT_LINES])
    assert shipped[end + 1:] == kept[KEPT_ARGUMENT_LINES:]
    assert "one NVIDIA H200" in (FOLDER / "README.md").read_text()


def test_validate_reads_the_run_s_plan_and_figures():
    (run,) = load_megatron_log(str(LOG), cluster=str(CLUSTER))
    measured = json.loads((RUN / "measured.json").read_text())["runs"]["dense"]
    p, want = run.plan, measured["plan"]
    assert (p.tp, p.pp, p.dp, p.micro_batch_size, p.global_batch_size, p.recompute) == (
        want["tp"], want["pp"], want["dp"], want["micro_batch_size"],
        want["global_batch_size"], want["recompute"])
    gpt = MODEL_PRESETS["gpt-1.7b"]
    assert (run.model.num_layers, run.model.hidden_size, run.model.seq_length) == (
        gpt.num_layers, gpt.hidden_size, gpt.seq_length)
    times = measured["log"]["iteration_time_ms"]
    skipped = run.extra["skipped_lines"]
    assert run.iteration_time_s == statistics.median(times[skipped:]) / 1e3
    assert run.peak_memory_bytes == measured["log"]["max_reserved_MB"] * 2**20
