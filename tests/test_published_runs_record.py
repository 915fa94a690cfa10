"""The published runs as read from their tables (:func:`configurator.cost.groundtruth.
published_runs`: SC'21, Korthikanti, Megatron-LM, NeMo and Megatron-Bridge; every plan field,
model, cluster, measured figure, and each skipped row's reason) against the recorded
``tests/data/published_runs.json``, so that a change to how a table row becomes a plan (a
recipe field, a layout, a precision) shows as the runs it moves. Each run's prediction is
checked elsewhere (tests/test_sc21_accuracy.py, ``validate``).

Record after an intended change (and say why in the commit)::

    python -m tests.test_published_runs_record --record
"""

import json
import sys
from pathlib import Path

from configurator.cost.groundtruth import published_runs

RECORD = Path(__file__).resolve().parent / "data" / "published_runs.json"


def runs_record() -> dict:
    """Every published run's fields (JSON-ready) and the skipped rows' reasons."""
    runs, skipped = published_runs()
    out = []
    for r in runs:
        out.append(dict(name=r.name, group=r.group, source=r.source,
                        model=r.model if isinstance(r.model, str) else r.model.to_dict(),
                        cluster=r.cluster if isinstance(r.cluster, str) else r.cluster.name,
                        num_gpus=r.num_gpus, seq_length=r.seq_length, plan=r.plan.to_dict(),
                        iteration_time_s=r.iteration_time_s,
                        tokens_per_s_per_gpu=r.tokens_per_s_per_gpu,
                        tflops_per_gpu=r.tflops_per_gpu, flops_formula=r.flops_formula,
                        peak_memory_bytes=r.peak_memory_bytes, dataset=r.dataset,
                        extra=r.extra))
    return json.loads(json.dumps({"runs": out, "skipped": skipped}, sort_keys=True,
                                 default=str))


def test_published_runs_match_the_record():
    got, want = runs_record(), json.loads(RECORD.read_text())
    assert [r["name"] for r in got["runs"]] == [r["name"] for r in want["runs"]]
    for g, w in zip(got["runs"], want["runs"]):
        assert g == w, g["name"]
    assert got["skipped"] == want["skipped"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        print("usage: python -m tests.test_published_runs_record --record", file=sys.stderr)
        sys.exit(2)
    RECORD.write_text(json.dumps(runs_record(), indent=1, sort_keys=True) + "\n")
    print(f"recorded {RECORD}")
