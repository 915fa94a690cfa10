"""Measured training runs: the schema of a run file (CSV or YAML) and its reader.

A *measured run* is one training job someone ran: the model, the cluster, the plan, and what
was measured. ``configurator validate`` compares the cost model with such runs and
``configurator calibrate`` fits a GPU's efficiencies to them.

Schema (one row of a CSV, or one mapping of a YAML list / of a YAML mapping's ``runs`` list;
Megatron's names, with the short aliases the plan JSON uses):

=========================  =========================================================  ========
key                        meaning                                                    required
=========================  =========================================================  ========
model                      model preset, or a model YAML / HF ``config.json`` path    yes
                           (relative to the run file)
cluster                    cluster preset or cluster file (relative to the run file)  yes
num_gpus                   GPUs the job ran on (a whole number of the cluster's       yes
                           nodes)
tp, pp                     tensor / pipeline model-parallel size                      yes
micro_batch_size (mbs)     sequences per microbatch                                   yes
global_batch_size (gbs)    sequences per iteration                                    yes
precision                  bf16, fp16, fp8 or mxfp8                                   yes
seq_length                 sequence length (default: the model's)                     no
cp, vp, ep, etp            context / virtual-pipeline / expert / expert-tensor sizes  no (1)
dp                         checked against num_gpus / (tp·pp·cp)                      no
recompute                  none, selective or full                                    no (none)
recompute_modules          selective recompute's modules, comma-separated:            no
                           core_attn, layernorm, moe_act                              (core_attn)
sequence_parallel,         booleans; defaults as ``configurator estimate``'s (on      no
distributed_optimizer,     with tp > 1; on with dp·cp > 1; on; on with the
overlap_grad_reduce,       distributed optimizer; ``--fp8-param-gather`` on with FP8
overlap_param_gather,      and the distributed optimizer)
fp8_param_gather,          (``--grad-reduce-in-bf16``,
grad_reduce_in_bf16,       ``--tp-comm-overlap``, ``--megatron-fsdp``: default off)
tp_comm_overlap,
megatron_fsdp
attention_backend          Megatron ``--attention-backend`` (default auto)            no
cp_comm_type               Megatron ``--cp-comm-type``: p2p, a2a or all_gather        no (p2p)
cross_entropy_fusion       the loss's cross entropy: none, native or te               no (none)
decoder_first/last_        uneven pipeline split, as Megatron's flags                 no
pipeline_num_layers,
account_for_embedding/
loss_in_pipeline_split
iteration_time_s           measured seconds per iteration                             one of
tokens_per_s_per_gpu       measured tokens / s / GPU                                  these
tflops_per_gpu             measured TFLOP/s / GPU, with ``flops_formula``             four
flops_formula              how those FLOPs were counted: :data:`FLOPS_FORMULAS`       with
                                                                                      tflops
peak_memory_GiB            peak memory per GPU (``torch.cuda.max_memory_reserved``)   
name, group, source        label, group for statistics, where the figure comes from  no
dataset                    the collection the run belongs to (a paper's table, one    no
                           team's runs): ``validate --by-source`` holds each out in
                           turn (default: the run file's name)
hosts                      the hosts it ran on, in node_rank order (a list, or names  no
                           separated by spaces, commas or semicolons): with
                           ``--topology``, the run is priced on their links (default:
                           the topology's first hosts)
gpu_order                  per node_rank, the physical GPUs (PCI bus order, as        no
                           ``CUDA_VISIBLE_DEVICES`` lists them) of local ranks 0,
                           1, …: a list of lists (one node: its list), or one
                           string of comma-separated lists separated by spaces or
                           semicolons (``0,4,1,5 0,4,1,5``); with ``--topology``,
                           each local rank takes its GPU's links (default: local
                           rank k on GPU k)
=========================  =========================================================  ========

Every measurement given is compared; a row's iteration time comes from the first present
of ``iteration_time_s``, ``tokens_per_s_per_gpu``, ``tflops_per_gpu``. CSV cells that are
empty count as absent; booleans are ``true``/``false`` (also ``1``/``0``, ``yes``/``no``).
Lines starting with ``#`` are comments. Unknown keys are an error naming the key.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.plan import PLAN_FIELD, PLAN_FIELDS, ParallelPlan
from configurator.core.rules import plan_for_world
from configurator.core.units import GiB

#: How a run's TFLOP/s were counted (:mod:`configurator.cost.flops`):
#: ``megatron``: Megatron-LM core_v0.16.1 ``num_floating_point_operations`` (causal
#: attention at half); ``megatron-full-attention``: the same with the attention scores over
#: all ``s²`` query-key pairs (Megatron-LM before 2025, NeMo's ``flops_formulas``);
#: ``sc21``: Narayanan et al. SC'21 §5.1, which counts the recompute forward.
FLOPS_FORMULAS = ("megatron", "megatron-full-attention", "sc21")
#: Measurement keys, in the order a run's iteration time is taken from.
MEASURED_KEYS = ("iteration_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu",
                 "peak_memory_GiB")
_LABEL_KEYS = ("name", "group", "source", "dataset")
_REQUIRED = ("model", "cluster", "num_gpus", "tp", "pp", "micro_batch_size",
             "global_batch_size", "precision")
_PLAN_KEYS = tuple(f.name for f in PLAN_FIELDS)
_ALIASES = {f.alias: f.name for f in PLAN_FIELDS if f.alias}
RUN_KEYS = (_REQUIRED + ("seq_length", "flops_formula") + tuple(
    k for k in _PLAN_KEYS if k not in _REQUIRED) + MEASURED_KEYS + _LABEL_KEYS
    + ("hosts", "gpu_order"))
#: Longest ``source`` (a citation: paper, table, file and commit).
MAX_SOURCE_CHARS = 1024
#: Upper bounds that keep a hostile file from asking for absurd figures.
_MAX_FIGURE = {"iteration_time_s": 1e7, "tokens_per_s_per_gpu": 1e9, "tflops_per_gpu": 1e6,
               "peak_memory_GiB": 1e5}


@dataclass(frozen=True, kw_only=True)
class MeasuredRun:
    """One measured training run. ``model``/``cluster``: a preset name, a path (resolved
    against the run file's folder) or, for the model, a :class:`ModelSpec`; ``plan``: the
    plan on ``num_gpus`` GPUs (dp derived); measurements in SI (``peak_memory_bytes``), each
    ``None`` when not measured."""

    name: str
    group: str | None
    source: str
    model: str | ModelSpec
    cluster: str
    num_gpus: int
    seq_length: int | None
    plan: ParallelPlan
    iteration_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    flops_formula: str | None = None
    peak_memory_bytes: float | None = None
    #: the collection it belongs to (``validate --by-source`` holds each out in turn)
    dataset: str | None = None
    #: the hosts it ran on, in node_rank order (a topology's names), or None: not known
    hosts: tuple[str, ...] | None = None
    #: per node_rank, the physical GPU index of each local rank (``CUDA_VISIBLE_DEVICES``,
    #: PCI bus order; a placement's ``gpu_order``), or None: local rank k on GPU k
    gpu_order: tuple[tuple[int, ...], ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def has_time(self) -> bool:
        return any(x is not None for x in (self.iteration_time_s, self.tokens_per_s_per_gpu,
                                           self.tflops_per_gpu))


def _hosts(where: str, value: Any, num_gpus: int) -> tuple[str, ...]:
    """A run's host names, in node_rank order: a list of names, or one string of them
    separated by spaces, commas or semicolons; 1 to ``num_gpus`` of them, each a display
    name (:func:`configurator.core.validate.display_name`) without those separators, no
    name twice. Raises
    :class:`InputError` naming ``where``."""
    if isinstance(value, str):
        names: list = [x for x in re.split(r"[\s,;]+", value.strip()) if x]
    elif isinstance(value, (list, tuple)):
        names = list(value)
    else:
        raise InputError(where, value, "must be a list of host names or one string of them")
    if not 1 <= len(names) <= num_gpus:
        raise InputError(where, value, f"must name 1 to num_gpus ({num_gpus}) hosts")
    out = tuple(v.display_name(f"{where}[{i}]", n) for i, n in enumerate(names))
    for i, n in enumerate(out):
        if re.search(r"[\s,;]", n):
            raise InputError(f"{where}[{i}]", n, "must hold no space, comma or semicolon "
                                                 "(they separate host names)")
    if len(set(out)) != len(out):
        raise InputError(where, value, "host names must be unique")
    return out


def _truthy(where: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no"):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InputError(where, value, "must be true or false")


def _integer(where: str, value: Any, key: str) -> int:
    if isinstance(value, str):
        num = v.integer_text(value)
        if num is None:
            raise InputError(where, value, "must be an integer")
        value = num
    return v.int_in_range(where, value, key=key)


def _figure(where: str, key: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise InputError(where, value, "must be a number") from None
    val = v.positive_float(where, value)
    if not math.isfinite(val) or val > _MAX_FIGURE[key]:
        raise InputError(where, value, f"must be at most {_MAX_FIGURE[key]:g}")
    return val


def gpu_order_text(order) -> str:
    """A GPU order as run files, logs and the launch scripts write it: each node's GPUs
    comma-separated, the nodes (node_rank order) separated by spaces, ``0,4,1,5 0,4,1,5``;
    what :func:`_gpu_order` reads back."""
    return " ".join(",".join(map(str, gpus)) for gpus in order)


def _gpu_order(where: str, value: Any, num_gpus: int) -> tuple[tuple[int, ...], ...]:
    """A run's GPU order: per node_rank, the physical GPU index of each local rank. A list
    of lists of integers (or of comma-separated strings; one node's: its list alone), or one
    string of comma-separated lists separated by spaces or semicolons; 1 to ``num_gpus``
    nodes of the same number of GPUs, together ``num_gpus``, each list distinct indices
    (``INT_RANGES["gpu_order"]``). Raises :class:`InputError` naming ``where``."""
    if isinstance(value, str):
        nodes: list = [x for x in re.split(r"[\s;]+", value.strip()) if x]
    elif isinstance(value, (list, tuple)):
        flat = value and all(isinstance(g, int) and not isinstance(g, bool) for g in value)
        nodes = [list(value)] if flat else list(value)     # one node's list alone
    else:
        raise InputError(where, value, "must be a list of per-node GPU lists or one string "
                                       "of them ('0,4,1,5 0,4,1,5')")
    if not 1 <= len(nodes) <= num_gpus:
        raise InputError(where, value, f"must give 1 to num_gpus ({num_gpus}) nodes")
    out = []
    for i, node in enumerate(nodes):
        here = f"{where}[{i}]"
        if isinstance(node, str):
            node = [x.strip() for x in node.split(",")]
        if not isinstance(node, (list, tuple)) or not 1 <= len(node) <= num_gpus:
            raise InputError(here, node, f"must be a list of 1 to num_gpus ({num_gpus}) GPU "
                                         f"indices")
        gpus = tuple(_integer(f"{here}[{j}]", g, "gpu_order") for j, g in enumerate(node))
        if len(set(gpus)) != len(gpus):
            raise InputError(here, list(gpus), "must not repeat a GPU")
        out.append(gpus)
    if len({len(g) for g in out}) != 1 or len(out) * len(out[0]) != num_gpus:
        raise InputError(where, value, f"must give every node the same number of GPUs, "
                                       f"num_gpus ({num_gpus}) in all")
    return tuple(out)


def run_from_mapping(data: Any, where: str = "run") -> MeasuredRun:
    """One :class:`MeasuredRun` from a mapping of :data:`RUN_KEYS` (aliases ``mbs``,
    ``gbs``, ``first``, ``last``, ``acct_emb``, ``acct_loss`` accepted). CSV strings are
    converted by the field's type. Raises :class:`InputError` naming ``where.key``."""
    if not isinstance(data, Mapping):
        raise InputError(where, type(data).__name__, "must be a mapping of keys to values")
    row = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise InputError(where, key, "keys must be strings")
        name = _ALIASES.get(key.strip(), key.strip())
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if name in row:
            raise InputError(f"{where}.{key}", value, f"given twice (as {name})")
        row[name] = value
    v.exact_keys(where, row, _REQUIRED, tuple(k for k in RUN_KEYS if k not in _REQUIRED))

    def text(key, default=None):
        if key not in row:
            return default
        val = row[key]
        if not isinstance(val, str):
            raise InputError(f"{where}.{key}", val, "must be a string")
        if key == "source":     # a citation: printable, up to MAX_SOURCE_CHARS
            if len(val) > MAX_SOURCE_CHARS:
                raise InputError(f"{where}.{key}", val,
                                 f"must be at most {MAX_SOURCE_CHARS} characters")
            return v.printable_text(f"{where}.{key}", val.strip())
        return v.display_name(f"{where}.{key}", val.strip())

    fields: dict[str, Any] = {}
    for key in _PLAN_KEYS:
        if key not in row:
            continue
        spec = PLAN_FIELD[key]
        val = row[key]
        if spec.type is int:
            fields[key] = _integer(f"{where}.{key}", val, key)
        elif spec.type is bool:
            fields[key] = _truthy(f"{where}.{key}", val)
        elif spec.type is float:
            try:
                num = float(val) if isinstance(val, str) else val
            except ValueError:
                num = val
            fields[key] = v.float_in_range(f"{where}.{key}", num, key=key)
        elif spec.choices is None:    # free text: the pipeline layout, checked by its rule
            fields[key] = str(val).strip()
        else:
            fields[key] = v.choice(f"{where}.{key}", str(val).strip(), spec.choices)
    num_gpus = _integer(f"{where}.num_gpus", row["num_gpus"], "num_gpus")
    given_dp = fields.pop("dp", None)
    try:   # fields not given take the schema's defaults there (vp: a layout's, if any)
        plan = plan_for_world(fields, num_gpus)
    except InputError as exc:
        raise InputError(f"{where}.{exc.field}", exc.value, exc.rule) from None
    if given_dp is not None and given_dp != plan.dp:
        raise InputError(f"{where}.dp", given_dp,
                         f"must equal num_gpus / (tp·pp·cp) = {plan.dp}")
    figures = {k: _figure(f"{where}.{k}", k, row[k]) for k in MEASURED_KEYS if k in row}
    formula = text("flops_formula")
    if formula is not None:
        v.choice(f"{where}.flops_formula", formula, FLOPS_FORMULAS)
    if "tflops_per_gpu" in figures and formula is None:
        raise InputError(f"{where}.flops_formula", None, "required with tflops_per_gpu: one of "
                         + ", ".join(FLOPS_FORMULAS))
    if not figures:
        raise InputError(where, None, "no measurement: give at least one of "
                         + ", ".join(MEASURED_KEYS))
    seq = _integer(f"{where}.seq_length", row["seq_length"], "seq_length") \
        if "seq_length" in row else None
    mem = figures.pop("peak_memory_GiB", None)
    hosts = _hosts(f"{where}.hosts", row["hosts"], num_gpus) if "hosts" in row else None
    order = (_gpu_order(f"{where}.gpu_order", row["gpu_order"], num_gpus)
             if "gpu_order" in row else None)
    if hosts is not None and order is not None and len(order) != len(hosts):
        raise InputError(f"{where}.gpu_order", row["gpu_order"],
                         f"must give one GPU list per host ({len(hosts)})")
    return MeasuredRun(
        name=text("name", where), group=text("group"), source=text("source", ""),
        dataset=text("dataset"), hosts=hosts, gpu_order=order,
        model=text("model"), cluster=text("cluster"), num_gpus=num_gpus, seq_length=seq,
        plan=plan, flops_formula=formula,
        peak_memory_bytes=None if mem is None else mem * GiB, **figures)


def _rows_from_text(text: str, suffix: str, where: str) -> list[tuple[str, Any]]:
    if suffix == ".csv":
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        reader = csv.DictReader(io.StringIO("\n".join(lines)))
        rows = []
        for i, r in enumerate(reader, start=1):
            if None in r:
                raise InputError(f"{where} row {i}", r[None], "more cells than header columns")
            rows.append((f"{where} row {i}", r))
        return rows
    data = v.parse_text("runs", where, text, as_json=False)     # JSON is YAML here
    if isinstance(data, Mapping) and set(data) == {"runs"}:
        data = data["runs"]
    if not isinstance(data, list):
        raise InputError(where, type(data).__name__, "must be a list of runs (or {runs: [...]})")
    return [(f"{where} run {i}", r) for i, r in enumerate(data, start=1)]


#: Largest run file read (bytes): ample for thousands of rows.
MAX_RUN_FILE_BYTES = 32 * 2**20


def load_runs(path: str) -> list[MeasuredRun]:
    """Read a run file (``.csv``, ``.yaml``/``.yml``/``.json``). Relative model and cluster
    paths are made relative to the file's folder. Raises :class:`InputError` naming the
    file, row and key."""
    where = os.path.basename(path) or path
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".csv", ".yaml", ".yml", ".json"):
        raise InputError("runs", path, "must be a .csv, .yaml, .yml or .json file")
    try:
        if os.path.getsize(path) > MAX_RUN_FILE_BYTES:
            raise InputError("runs", path, f"larger than {MAX_RUN_FILE_BYTES // 2**20} MiB")
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("runs", path, f"cannot be read ({type(exc).__name__})") from None
    runs = [run_from_mapping(r, w) for w, r in _rows_from_text(text, suffix, where)]
    if not runs:
        raise InputError("runs", path, "holds no run")
    base = os.path.dirname(os.path.abspath(path))

    def local(ref):
        if isinstance(ref, str) and not os.path.isabs(ref) and os.path.exists(
                os.path.join(base, ref)):
            return os.path.join(base, ref)
        return ref

    return [MeasuredRun(**{**run.__dict__, "model": local(run.model),
                           "cluster": local(run.cluster), "dataset": run.dataset or where})
            for run in runs]


def runs_to_rows(runs: Iterable[MeasuredRun]) -> list[dict]:
    """Runs as flat mappings of :data:`RUN_KEYS` (what :func:`run_from_mapping` reads back;
    a :class:`ModelSpec` model is written as its name)."""
    out = []
    for r in runs:
        row = {"name": r.name, "group": r.group, "source": r.source, "dataset": r.dataset,
               "hosts": None if r.hosts is None else " ".join(r.hosts),
               "gpu_order": None if r.gpu_order is None else gpu_order_text(r.gpu_order),
               "model": r.model if isinstance(r.model, str) else r.model.name,
               "cluster": r.cluster, "num_gpus": r.num_gpus, "seq_length": r.seq_length}
        row.update({k: getattr(r.plan, k) for k in _PLAN_KEYS})
        row.update(iteration_time_s=r.iteration_time_s,
                   tokens_per_s_per_gpu=r.tokens_per_s_per_gpu,
                   tflops_per_gpu=r.tflops_per_gpu, flops_formula=r.flops_formula,
                   peak_memory_GiB=None if r.peak_memory_bytes is None
                   else r.peak_memory_bytes / GiB)
        out.append({k: val for k, val in row.items() if val is not None})
    return out
