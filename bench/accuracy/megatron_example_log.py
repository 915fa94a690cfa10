"""Rebuild the Megatron-LM training log that ``configurator examples`` writes
(``configurator/data/examples/megatron-h200-1gpu/gpt-1.7b_h200_1gpu.log``).

The run: ``bench.accuracy.megatron_gpu``'s ``dense`` plan (GPT 1.7B, tp = pp = dp = 1, mbs 2,
gbs 8, seq 2048, bf16), Megatron-LM core_v0.16.1 ``pretrain_gpt.py`` through the
``launch_torchrun.sh`` that ``configurator search --out`` wrote, on one NVIDIA H200
(2026-11-27; tests/data/megatron_gpu/measured.json). What was kept of its output are the
lines ``tests/data/megatron_gpu/dense.log`` holds: eight lines of its arguments dump, the
parameter count, every iteration line, Megatron's theoretical memory and every memory report.

The log is those lines after the job's arguments dump, where the dump is Megatron-LM
core_v0.16.1's own ``parse_args`` + ``validate_args`` run (on a CPU) on the exact argv the
run's script passed to ``pretrain_gpt.py`` (the script ``megatron_gpu prepare`` writes, plus
the run's ``extra_flags`` from measured.json): the dump prints each argument's value, so
it is the text the run printed; the eight argument lines kept from the run are checked
against it. Usage (needs torch, six, regex and a Megatron-LM core_v0.16.1 checkout)::

    python -m bench.accuracy.megatron_example_log /path/to/Megatron-LM
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "tests" / "data" / "megatron_gpu"
OUT = ROOT / "configurator" / "data" / "examples" / "megatron-h200-1gpu" / \
    "gpt-1.7b_h200_1gpu.log"
#: Lines of tests/data/megatron_gpu/dense.log that come from the run's arguments dump.
KEPT_ARGUMENT_LINES = 8


def run_argv(plans: Path, megatron_lm: str) -> list[str]:
    """The argv ``pretrain_gpt.py`` received in the ``dense`` run: the script's own flags
    (recorded by a ``torchrun`` stand-in) and the run's extra flags."""
    extra = json.loads((RUN / "measured.json").read_text())["runs"]["dense"]["extra_flags"]
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp) / "torchrun"
        record = Path(tmp) / "argv.json"
        fake.write_text(f"#!/bin/sh\n{sys.executable} -c 'import json, sys; "
                        f"print(json.dumps(sys.argv[1:]))' \"$@\" > {record}\n")
        fake.chmod(0o755)
        env = dict(os.environ, PATH=f"{tmp}:{os.environ['PATH']}", MEGATRON_LM_DIR=megatron_lm)
        subprocess.run(["bash", str(plans / "dense" / "launch_torchrun.sh"), *extra], env=env,
                       check=True)
        argv = json.loads(record.read_text())
    return argv[[a.endswith("pretrain_gpt.py") for a in argv].index(True) + 1:]


def arguments_dump(megatron_lm: str, argv: list[str]) -> list[str]:
    """What Megatron-LM's ``validate_args`` prints for ``argv`` on one rank of a Hopper
    GPU (the lines before the dump and the dump)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from megatron_argv import megatron_arguments_preamble

    code = megatron_arguments_preamble(megatron_lm) + textwrap.dedent(f"""
        os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0",
                          CUDA_DEVICE_MAX_CONNECTIONS="1")
        sys.argv = ["pretrain_gpt.py"] + {argv!r}
        A.validate_args(A.parse_args())
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, check=True)
    lines = res.stdout.splitlines()
    if not lines or "end of arguments" not in lines[-1]:
        raise SystemExit(f"no arguments dump: {res.stderr[-2000:]}")
    return lines


def main(megatron_lm: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "bench.accuracy.megatron_gpu", "prepare", "--out",
                        tmp, "--force"], cwd=ROOT, check=True, capture_output=True)
        dump = arguments_dump(megatron_lm, run_argv(Path(tmp), megatron_lm))
    kept = (RUN / "dense.log").read_text().splitlines()
    missing = [ln for ln in kept[:KEPT_ARGUMENT_LINES] if ln not in dump]
    if missing:
        raise SystemExit(f"the run's argument lines differ from the dump: {missing}")
    OUT.write_text("\n".join(dump + kept[KEPT_ARGUMENT_LINES:]) + "\n")
    print(f"wrote {OUT}: {len(dump)} lines of arguments dump, "
          f"{len(kept) - KEPT_ARGUMENT_LINES} lines of the run")


if __name__ == "__main__":
    main(sys.argv[1])
