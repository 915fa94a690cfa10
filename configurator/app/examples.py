"""``configurator examples``: the example inputs that ship with the tool, listed or copied
into a directory so a newcomer can try every command on real data.

Copied from the package data (``configurator/data/examples``): the real nccl-tests logs of
a 17-node H100 cluster (with their licence and attribution), a small measured topology
imported from four of its hosts, and a real Megatron-LM training log of one H200 with its
one-GPU cluster file (its README says how it was made). Written from the tool's own definitions (so they always
read back as they are): a model file (the ``llama3-8b`` preset in Megatron's keys), a
cluster file (the ``dgx-h100-80gb`` preset on 4 nodes) and the published runs as a run file
(what ``configurator validate`` prices by default, one row per run with its citation), with
the models of those runs that are no preset as model files in :data:`RUN_MODELS_DIR` (so
the file prices every run as plain ``validate`` does).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from configurator.core.errors import InputError
from configurator.data import EXAMPLES, data_path

#: The logs folder and the small topology, copied as they ship.
LOGS, TOPOLOGY = "h100-17node-nccl-tests", "topology-4host.yaml"
#: The Megatron-LM training log folder (the log, its cluster file, its README), copied too.
TRAIN_LOG_DIR = "megatron-h200-1gpu"
TRAIN_LOG = f"{TRAIN_LOG_DIR}/gpt-1.7b_h200_1gpu.log"
TRAIN_LOG_CLUSTER = f"{TRAIN_LOG_DIR}/cluster-h200-1gpu.yaml"
#: The folders copied whole.
FOLDERS = (LOGS, TRAIN_LOG_DIR)
#: Files written from the tool's definitions.
MODEL_FILE, CLUSTER_FILE, RUNS_FILE = "model-llama3-8b.yaml", "cluster-dgx-h100.yaml", \
    "published-runs.csv"
#: Folder (beside the run file, which names its files) of the published runs' models that
#: are no preset (``gpt-22b``) or a preset changed (DeepSeek-V3 without its MTP layer).
RUN_MODELS_DIR = "published-runs-models"
#: Model keys that only a mixture of experts or multi-latent attention uses: left out of a
#: dense model's example file (they keep their defaults).
_MOE_MLA_KEYS = ("moe_router_topk", "moe_layer_freq", "moe_router_load_balancing_type",
                 "moe_router_enable_expert_bias", "multi_latent_attention", "kv_lora_rank",
                 "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


@dataclass(frozen=True)
class Example:
    """One example: its name in the output directory and what it is for."""

    name: str
    what: str
    try_it: str


EXAMPLE_FILES: tuple[Example, ...] = (
    Example(LOGS, "real nccl-tests logs of a 17-node H100 cluster (alltoall and sendrecv, "
                  "1/4/8 GPUs per node; Apache-2.0, see its README)",
            f"configurator topology import {LOGS} -o topo.json"),
    Example(TOPOLOGY, "a measured topology of 4 of those hosts (a slow pair included)",
            f"configurator audit --topology {TOPOLOGY}"),
    Example(TRAIN_LOG_DIR, "a real Megatron-LM training log (GPT 1.7B on one H200, "
                           "core_v0.16.1) and the cluster it ran on; see its README",
            f"configurator validate --cluster {TRAIN_LOG_CLUSTER} {TRAIN_LOG}"),
    Example(MODEL_FILE, "a model file in Megatron's keys (Llama-3 8B)",
            f"configurator search --model {MODEL_FILE} --cluster dgx-h100-80gb --nodes 2 "
            f"--gbs 128"),
    Example(CLUSTER_FILE, "a cluster file (4 DGX H100 nodes)",
            f"configurator search --model llama3-8b --cluster {CLUSTER_FILE} --gbs 128"),
    Example(RUNS_FILE, "the published runs as a run file (one row per run, its source cited)",
            f"configurator validate {RUNS_FILE}"),
    Example(RUN_MODELS_DIR, "the models of those runs that are no preset, as model files "
                            "(the run file names them)",
            f"configurator search --model {RUN_MODELS_DIR}/gpt-22b.yaml --cluster "
            f"dgx-a100-80gb --nodes 8 --gbs 256"),
)


def _yaml(header: str, data: dict) -> bytes:
    import yaml

    return (header + yaml.safe_dump(data, sort_keys=False)).encode()


def model_file() -> bytes:
    """The ``llama3-8b`` preset as a model file (its non-empty keys; no MoE/MLA keys)."""
    from configurator.core.model_presets import MODEL_PRESETS

    data = {k: val for k, val in MODEL_PRESETS["llama3-8b"].to_dict().items()
            if val is not None and k not in _MOE_MLA_KEYS}
    return _yaml("# Llama-3 8B in Megatron's names (docs/formats.md, 'Models'); edit and use\n"
                 "# with --model model-llama3-8b.yaml\n", data)


def cluster_file() -> bytes:
    """The ``dgx-h100-80gb`` preset as a cluster file on 4 nodes."""
    from topology.cluster_files import CLUSTER_PRESETS

    data = dict(CLUSTER_PRESETS["dgx-h100-80gb"], name="my-dgx-h100", nodes=4)
    return _yaml("# 4 DGX H100 nodes (docs/formats.md, 'Clusters and GPUs'); bandwidths in "
                 "GB/s per\n# direction, latencies in us; use with --cluster "
                 "cluster-dgx-h100.yaml\n", data)


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() or c in "._" else " " for c in text.lower())
                    .split())


def run_models(runs) -> tuple[list[str], dict[str, bytes]]:
    """Each run's model as its run file names it: the preset's name where the run's model is
    the preset (at the run's sequence length), else a model file of :data:`RUN_MODELS_DIR`
    (``gpt-22b.yaml``; a preset changed: ``deepseek-v3-mtp_num_layers-none.yaml``, or, where
    more than two keys differ, the preset's name and the run's collection). Returns the
    references, one per run, and the files (name → bytes)."""
    from configurator.core.model_presets import MODEL_PRESETS

    refs, files, names = [], {}, {}
    for r in runs:
        m = r.model
        preset = None if isinstance(m, str) else MODEL_PRESETS.get(m.name)
        if isinstance(m, str) or (preset is not None
                                  and preset.with_seq_length(m.seq_length) == m):
            refs.append(m if isinstance(m, str) else m.name)
            continue
        if m not in names:
            if preset is None:
                base = _slug(m.name)
            else:
                diff = [k for k in m.__dataclass_fields__ if k not in ("name", "seq_length")
                        and getattr(m, k) != getattr(preset, k)]
                base = _slug(m.name + "-" + ("-".join(f"{k}-{getattr(m, k)}" for k in diff)
                                             if len(diff) <= 2 else (r.dataset or r.group or
                                                                     "variant")))
            name, n = f"{base}.yaml", 1
            while name in files:
                n += 1
                name = f"{base}-{n}.yaml"
            names[m] = name
            data = {k: val for k, val in m.to_dict().items() if val is not None}
            files[name] = _yaml(f"# {m.name} as the published run {r.name!r} ran it ("
                                f"{RUNS_FILE} names this file)\n", data)
        refs.append(f"{RUN_MODELS_DIR}/{names[m]}")
    return refs, files


def runs_file() -> tuple[bytes, dict[str, bytes]]:
    """The published runs (:func:`configurator.cost.groundtruth.published_runs`) as a run
    file (:func:`configurator.core.runs.runs_to_rows`): what ``validate`` prices by
    default, in the format it reads from a user; and the model files it names
    (:func:`run_models`, name in :data:`RUN_MODELS_DIR` → bytes)."""
    import csv
    import io

    from configurator.core.runs import RUN_KEYS, runs_to_rows
    from configurator.cost.groundtruth import published_runs

    runs = published_runs()[0]
    rows = runs_to_rows(runs)
    refs, models = run_models(runs)
    for row, ref, r in zip(rows, refs, runs):
        row["model"] = ref
        if r.seq_length is None and not isinstance(r.model, str):
            row["seq_length"] = r.model.seq_length     # a preset at another length
    keys = [k for k in ("name", "group", "source", *RUN_KEYS) if any(k in r for r in rows)]
    keys = list(dict.fromkeys(keys))
    buf = io.StringIO()
    buf.write("# The published runs configurator validate prices by default, as a run file "
              "(docs/formats.md, 'Measured runs').\n")
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode(), models


def write_examples(out: str, force: bool = False) -> list[str]:
    """Copy and write every :data:`EXAMPLE_FILES` entry into ``out`` (created if needed).
    Nothing is written when one of them exists and ``force`` is false, nor through a
    symbolic link. Returns the paths written. Raises :class:`InputError` (field ``out``)."""
    from launchers import FILE_MODE, check_out_dir, write_files

    names = [e.name for e in EXAMPLE_FILES]
    check_out_dir(out, names, force)
    for folder in (*FOLDERS, RUN_MODELS_DIR):
        if os.path.islink(os.path.join(out, folder)):
            raise InputError("out", os.path.join(out, folder),
                             "is a symbolic link; not written through")
    runs, models = runs_file()
    files = {TOPOLOGY: (data_path(EXAMPLES, TOPOLOGY).read_bytes(), FILE_MODE),
             MODEL_FILE: (model_file(), FILE_MODE), CLUSTER_FILE: (cluster_file(), FILE_MODE),
             RUNS_FILE: (runs, FILE_MODE)}
    model_dir = os.path.join(out, RUN_MODELS_DIR)
    for folder in (*FOLDERS, RUN_MODELS_DIR):
        path = os.path.join(out, folder)
        if os.path.exists(path) and force:
            shutil.rmtree(path)
    for folder in FOLDERS:
        shutil.copytree(data_path(EXAMPLES, folder), os.path.join(out, folder))
    write_files(model_dir, {n: (b, FILE_MODE) for n, b in models.items()}, force=force)
    write_files(out, files, force=force)
    return [os.path.join(out, n) for n in names]
