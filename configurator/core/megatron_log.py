"""Measured runs from Megatron-LM training logs (the text ``pretrain_gpt.py`` prints).

:func:`runs_from_megatron_log` reads a log's text, :func:`load_megatron_log` a log file;
both return :class:`~configurator.core.runs.MeasuredRun` objects built through
:func:`~configurator.core.runs.run_from_mapping` (the same checks as a run file), the model a
:class:`~configurator.core.model.ModelSpec` named after the log.

Lines read (formats of Megatron-LM core_v0.16.1; iteration lines without the leading
timestamp, as older Megatron-LM prints them, read too):

* the arguments dump of ``megatron/training/arguments.py`` ``_print_args``, printed once by
  rank 0 at the job's start, one argument a line, sorted, ``str()`` of each value::

      ------------------------ arguments ------------------------
        tensor_model_parallel_size ...................... 2
        inference_dynamic_batching_cuda_graph_max_tokens  16384
      -------------------- end of arguments ---------------------

  (``48 - len(name)`` dots; a name of 48 or more characters gets two spaces). Each dump
  starts a new run: a log of a job restarted in the same file gives one run per start
  with iteration lines (named ``NAME#k``, k counting those starts; a start with too few
  lines is left out when another has enough).
  It gives the model (:data:`MODEL_ARGS`; ``layernorm_epsilon`` is Megatron's name of
  ``norm_epsilon``; query groups only with ``group_query_attention``; MoE fields only with
  ``num_experts``, MLA fields only with ``multi_latent_attention``) and the plan
  (:data:`PLAN_ARGS`; ``world_size`` is ``num_gpus``; ``None`` virtual-pipeline size = 1,
  ``None`` recompute granularity = none; expert sizes only for MoE models; selective
  recompute's ``recompute_modules`` where the model prices them, else core attention with a
  note; ``fp8_param_gather`` with FP8 and the distributed optimizer only, absent read as
  Megatron's default, off). Precision:
  ``fp8`` (``--fp8-format`` e4m3/hybrid) set means ``fp8``, or ``mxfp8`` with
  ``fp8_recipe`` mxfp8 (other FP8 recipes are read as ``fp8``); else ``bf16``/``fp16`` by
  those flags; FP32 and FP4 are refused.
* the vocabulary: ``padded_vocab_size`` is ``None`` in the dump unless given on the command
  line (the tokenizer is built after the dump), so the tokenizer's line
  ``> padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)`` gives it; without
  either, a ``NullTokenizer``'s ``vocab_size`` + 1 padded as Megatron pads it.
* ``training_log``'s iteration lines, printed by the last rank every ``--log-interval``
  iterations and after the first::

       [2025-11-03 10:14:49.733105] iteration        3/      20 | consumed samples: ... |
       elapsed time per iteration (ms): 4752.4 | throughput per GPU (TFLOP/s/GPU): 354.9 |
       learning rate: ... | global batch size:    64 | lm loss: ... | ...

  (one line). The first lines are warm-up: the first report's timer is not reset, so the
  second report averages over the first iteration too. The first ``skip_iterations``
  logged lines are dropped (default: 10 % of them, at least 2), after those of a smaller
  global batch (``--rampup-batch-size``) and repeated reports; the median of the rest's
  ``elapsed time per iteration (ms)`` is ``iteration_time_s`` and, when logged
  (``--log-throughput``), the median ``throughput per GPU (TFLOP/s/GPU)`` is
  ``tflops_per_gpu`` counted by ``flops_formula`` (default
  ``megatron``: Megatron-LM core_v0.16.1's ``num_floating_point_operations``; logs of
  Megatron-LM before 2025 count full attention: ``megatron-full-attention``).
* ``report_memory``'s lines ``[Rank 0] (after 10 iterations) memory (MB) | allocated: ... |
  max allocated: ... | reserved: ... | max reserved: 62286.00``, printed by the ranks of
  data-parallel rank 0. "MB" is MiB (bytes / 2**20); the largest ``max reserved``
  (``torch.cuda.max_memory_reserved``, a peak since the start) over the ranks and reports
  is ``peak_memory_GiB``.

Every line may carry a prefix (a timestamp, ``[rank0]:``, ``srun -l``'s ``0: ``); other
lines are ignored. Units: seconds, TFLOP/s per GPU, GiB. Bounds: at most
:data:`MAX_LOG_BYTES` bytes and :data:`MAX_LOG_LINES` lines are read, lines longer than
:data:`MAX_LINE_CHARS` are skipped; anything unreadable is an :class:`InputError`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import statistics
from array import array
from typing import Any, Iterable, Iterator, Mapping

from configurator.core.errors import InputError
from configurator.core.model import MODEL_KEYS, ModelSpec, make_model
from configurator.core.plan import (CP_COMM_TYPES, CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES,
                                    MOE_DISPATCHERS, MOE_FLEX_BACKENDS, PLAN_FIELD, PLAN_FIELDS,
                                    is_fp8, recompute_module_list)
from configurator.core.runs import RUN_KEYS, MeasuredRun, run_from_mapping

#: Largest log read (bytes or characters).
MAX_LOG_BYTES = 256 * 2**20
#: Most lines read from one log.
MAX_LOG_LINES = 10_000_000
#: Longer lines are skipped (characters).
MAX_LINE_CHARS = 2**20
#: Most arguments dumps (job starts) in one log.
MAX_SEGMENTS = 1000
#: Most arguments kept from one dump (Megatron-LM core_v0.16.1 prints about 650).
MAX_ARGS = 20_000

#: Model fields read from the arguments dump: (ModelSpec field, Megatron argument names,
#: kind). The first name present is read.
MODEL_ARGS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("num_layers", ("num_layers",), "int"),
    ("hidden_size", ("hidden_size",), "int"),
    ("num_attention_heads", ("num_attention_heads",), "int"),
    ("ffn_hidden_size", ("ffn_hidden_size",), "int"),
    ("kv_channels", ("kv_channels",), "int"),
    ("seq_length", ("seq_length",), "int"),
    ("swiglu", ("swiglu",), "bool"),
    ("untie_embeddings_and_output_weights", ("untie_embeddings_and_output_weights",), "bool"),
    ("normalization", ("normalization",), "str"),
    ("norm_epsilon", ("layernorm_epsilon", "norm_epsilon"), "float"),
    ("hidden_dropout", ("hidden_dropout",), "float"),
    ("attention_dropout", ("attention_dropout",), "float"),
    ("position_embedding_type", ("position_embedding_type",), "str"),
    ("rotary_base", ("rotary_base",), "int"),
    ("add_bias_linear", ("add_bias_linear",), "bool"),
    ("add_qkv_bias", ("add_qkv_bias",), "bool"),
    ("qk_layernorm", ("qk_layernorm",), "bool"),
    ("multi_latent_attention", ("multi_latent_attention",), "bool"),
    ("mtp_num_layers", ("mtp_num_layers",), "int"),
    ("window_size", ("window_size",), "window"),
    ("window_attn_skip_freq", ("window_attn_skip_freq",), "freq"),
)
#: Read only with ``num_experts`` set.
MOE_ARGS = (("num_experts", "int"), ("moe_router_topk", "int"), ("moe_ffn_hidden_size", "int"),
            ("moe_shared_expert_intermediate_size", "int"), ("moe_layer_freq", "freq"))
#: Read only with ``multi_latent_attention`` true.
MLA_ARGS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
#: Plan fields read from the arguments dump: (run key, Megatron argument, default for
#: ``None`` or absence; ``...``: leave out).
PLAN_ARGS: tuple[tuple[str, str, Any], ...] = (
    ("num_gpus", "world_size", ...),
    ("tp", "tensor_model_parallel_size", ...),
    ("pp", "pipeline_model_parallel_size", ...),
    ("dp", "data_parallel_size", ...),
    ("cp", "context_parallel_size", 1),
    ("vp", "virtual_pipeline_model_parallel_size", 1),
    ("micro_batch_size", "micro_batch_size", ...),
    ("global_batch_size", "global_batch_size", ...),
    ("recompute", "recompute_granularity", "none"),
    ("sequence_parallel", "sequence_parallel", ...),
    ("distributed_optimizer", "use_distributed_optimizer", ...),
    ("overlap_grad_reduce", "overlap_grad_reduce", ...),
    ("overlap_param_gather", "overlap_param_gather", ...),
    ("fp8_param_gather", "fp8_param_gather", False),   # Megatron's default; the plan's is on
    ("grad_reduce_in_bf16", "grad_reduce_in_bf16", ...),
    ("tp_comm_overlap", "tp_comm_overlap", ...),
    ("megatron_fsdp", "use_megatron_fsdp", ...),
    ("decoder_first_pipeline_num_layers", "decoder_first_pipeline_num_layers", ...),
    ("decoder_last_pipeline_num_layers", "decoder_last_pipeline_num_layers", ...),
    ("account_for_embedding_in_pipeline_split", "account_for_embedding_in_pipeline_split", ...),
    ("account_for_loss_in_pipeline_split", "account_for_loss_in_pipeline_split", ...),
    ("overlap_moe_expert_parallel_comm", "overlap_moe_expert_parallel_comm", ...),
    ("delay_wgrad_compute", "delay_wgrad_compute", ...),
    ("moe_permute_fusion", "moe_permute_fusion", ...),
    ("moe_router_fusion", "moe_router_fusion", ...),
    ("moe_pad_expert_input_to_capacity", "moe_pad_expert_input_to_capacity", ...),
    ("use_precision_aware_optimizer", "use_precision_aware_optimizer", ...),
)
#: Optimizer-state dtypes as ``validate_args`` leaves them in the dump (torch dtypes;
#: ``fp8`` moments are stored as ``torch.uint8``).
_TORCH_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
                 "torch.uint8": "fp8", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16",
                 "fp8": "fp8"}
_INT_PLAN = {"num_gpus", "tp", "pp", "dp", "cp", "vp", "micro_batch_size", "global_batch_size",
             "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"}

_HEADER = re.compile(r"-{3,} arguments -{3,}")
_END = re.compile(r"-{3,} end of arguments -{3,}")
_ARG = re.compile(r"(?:^|\s)([A-Za-z_]\w*) (\.+) (.*?)\s*$")
_LONG_ARG = re.compile(r"(?:^|\s)([A-Za-z_]\w{47,})  (.*?)\s*$")
_ITERATION = re.compile(r"\biteration\s+(\d{1,15})\s*/\s*(\d{1,15})\s*\|(.*)")
_MAX_RESERVED = re.compile(r"\|\s*max reserved:\s*([0-9][0-9.eE+]*)")
_PADDED = re.compile(r"padded vocab \(size: (\d{1,12})\) with -?\d{1,12} dummy tokens "
                     r"\(new size: (\d{1,12})\)")
_NO_ARGS = ("the log must cover the job's start, where Megatron-LM prints its '---- arguments "
            "----' block (or give model= and overrides= with tp, pp, num_gpus, "
            "micro_batch_size, global_batch_size, precision)")
_INT_TEXT = re.compile(r"-?\d{1,15}")
_LIST_TEXT = re.compile(r"\[\s*(?:-?\d{1,6}\s*(?:,\s*-?\d{1,6}\s*)*)?\]")
_WINDOW_TEXT = re.compile(r"\(\s*(-?\d{1,12})\s*,\s*(-?\d{1,12})\s*\)")


@dataclasses.dataclass
class _Segment:
    """What one job start (arguments dump) and the lines after it hold."""

    args: dict[str, str] | None
    vocab: int | None = None                    # from the tokenizer's "padded vocab" line
    iteration: array = dataclasses.field(default_factory=lambda: array("q"))
    ms: array = dataclasses.field(default_factory=lambda: array("d"))
    tflops: array = dataclasses.field(default_factory=lambda: array("d"))  # nan: not logged
    gbs: array = dataclasses.field(default_factory=lambda: array("q"))     # -1: not logged
    max_reserved_mib: float | None = None
    memory_reports: int = 0


def _number(text: str) -> float | None:
    try:
        val = float(text)
    except ValueError:
        return None
    return val if math.isfinite(val) else None


def _parse(lines: Iterable[str], where: str) -> list[_Segment]:
    segments = [_Segment(args=None)]
    in_args = False
    for count, line in enumerate(lines, start=1):
        if count > MAX_LOG_LINES:
            raise InputError(where, f"{count:,} lines", f"too long: at most {MAX_LOG_LINES:,} "
                             "lines are read")
        if len(line) > MAX_LINE_CHARS:
            continue
        seg = segments[-1]
        if in_args:
            if " arguments " in line and "end of" not in line and _HEADER.search(line):
                in_args = False          # a new dump after one cut short
            elif "end of arguments" in line and _END.search(line):
                in_args = False
                continue
            elif "elapsed time per iteration" in line:
                in_args = False      # a dump cut short: go on with the iteration line
            else:
                m = _ARG.search(line) or _LONG_ARG.search(line)
                if m and len(seg.args) < MAX_ARGS:
                    seg.args[m.group(1)] = m.group(m.lastindex)
                continue
        if " arguments " in line and "end of" not in line and _HEADER.search(line):
            if len(segments) > MAX_SEGMENTS:
                raise InputError(where, f"{len(segments)} arguments blocks",
                                 f"at most {MAX_SEGMENTS} job starts are read")
            segments.append(_Segment(args={}))
            in_args = True
        elif "elapsed time per iteration" in line:
            _iteration_line(seg, line)
        elif "memory (MB)" in line:
            m = _MAX_RESERVED.search(line)
            val = _number(m.group(1)) if m else None
            if val is not None and val >= 0:
                seg.memory_reports += 1
                seg.max_reserved_mib = max(val, seg.max_reserved_mib or 0.0)
        elif "padded vocab" in line:
            m = _PADDED.search(line)
            if m:
                seg.vocab = int(m.group(2))
    return segments


def _iteration_line(seg: _Segment, line: str) -> None:
    m = _ITERATION.search(line)
    if not m:
        return
    it = int(m.group(1))
    if seg.iteration and it <= seg.iteration[-1]:
        return                   # a repeated (or out-of-order) report
    fields = {}
    for part in m.group(3).split("|"):
        key, sep, val = part.partition(":")
        if sep:
            fields[key.strip()] = val.strip()
    ms = _number(fields.get("elapsed time per iteration (ms)", ""))
    if ms is None or ms <= 0:
        return
    tflops = _number(fields.get("throughput per GPU (TFLOP/s/GPU)", ""))
    gbs = fields.get("global batch size", "")
    seg.iteration.append(it)
    seg.ms.append(ms)
    seg.tflops.append(tflops if tflops is not None and tflops > 0 else math.nan)
    seg.gbs.append(int(gbs) if gbs.isdigit() and len(gbs) <= 12 else -1)


def _text_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` (``str.splitlines`` breaks) one at a time, without a copy."""
    start, n = 0, len(text)
    while start < n:
        end = text.find("\n", start)
        if end < 0:
            end = n
        yield from text[start:end].splitlines() or ("",)
        start = end + 1


def _file_lines(fh, where: str) -> Iterator[str]:
    """Lines of a binary file, decoded as UTF-8 (bad bytes replaced); over-long lines are
    left out."""
    total = 0
    while True:
        raw = fh.readline(MAX_LINE_CHARS + 1)
        if not raw:
            return
        total += len(raw)
        if total > MAX_LOG_BYTES:
            raise InputError(where, f"over {MAX_LOG_BYTES >> 20} MiB",
                             f"larger than {MAX_LOG_BYTES >> 20} MiB")
        if len(raw) > MAX_LINE_CHARS:
            while raw and not raw.endswith(b"\n"):       # skip the rest of the line
                raw = fh.readline(MAX_LINE_CHARS + 1)
                total += len(raw)
                if total > MAX_LOG_BYTES:
                    raise InputError(where, f"over {MAX_LOG_BYTES >> 20} MiB",
                                     f"larger than {MAX_LOG_BYTES >> 20} MiB")
            continue
        yield from raw.decode("utf-8", errors="replace").splitlines()


def _check_binary(head: str, where: str) -> None:
    if "\x00" in head:
        raise InputError(where, head[:40], "is binary (NUL bytes), not a Megatron-LM log")


# ---------------------------------------------------------------------------- values


class _Args:
    """Typed access to one arguments dump; errors name ``<where> arguments.<name>``."""

    def __init__(self, args: Mapping[str, str], where: str):
        self.args = args
        self.where = where

    def has(self, name: str) -> bool:
        return name in self.args

    def raw(self, name: str) -> str | None:
        val = self.args.get(name)
        return None if val is None or val == "None" else val

    def error(self, name: str, rule: str) -> InputError:
        return InputError(f"{self.where} arguments.{name}", self.args.get(name), rule)

    def int(self, name: str) -> int | None:
        val = self.raw(name)
        if val is None:
            return None
        if not _INT_TEXT.fullmatch(val):
            raise self.error(name, "must be an integer")
        return int(val)

    def bool(self, name: str) -> bool | None:
        val = self.raw(name)
        if val is None:
            return None
        if val not in ("True", "False"):
            raise self.error(name, "must be True or False")
        return val == "True"

    def float(self, name: str) -> float | None:
        val = self.raw(name)
        if val is None:
            return None
        num = _number(val)
        if num is None:
            raise self.error(name, "must be a number")
        return num

    def freq(self, name: str) -> int | list[int] | None:
        """An int, or a list ``[1, 0, ...]`` (Megatron's ``moe_freq_type``)."""
        val = self.raw(name)
        if val is None:
            return None
        if _INT_TEXT.fullmatch(val):
            return int(val)
        if _LIST_TEXT.fullmatch(val):
            return [int(x) for x in val.strip("[] ").split(",") if x.strip()]
        raise self.error(name, "must be an integer or a list of integers")

    def window(self, name: str) -> int | None:
        """``--window-size (w, 0)``: ``w`` past keys (a causal window)."""
        val = self.raw(name)
        if val is None:
            return None
        m = _WINDOW_TEXT.fullmatch(val)
        if not m or int(m.group(2)) != 0:
            raise self.error(name, "only a causal window (w, 0) is supported")
        return int(m.group(1))

    def get(self, name: str, kind: str) -> Any:
        return {"int": self.int, "bool": self.bool, "float": self.float, "freq": self.freq,
                "window": self.window, "str": self.raw}[kind](name)


def _pad_vocab(size: int, a: _Args) -> int:
    # megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding
    multiple = (a.int("make_vocab_size_divisible_by") or 128) * (
        a.int("tensor_model_parallel_size") or 1)
    return -(-size // multiple) * multiple


def _model_fields(a: _Args, seg: _Segment) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for field, names, kind in MODEL_ARGS:
        name = next((n for n in names if a.has(n)), None)
        if name is not None:
            val = a.get(name, kind)
            if val is not None:
                kw[field] = val
    if kw.get("window_attn_skip_freq") is not None and not isinstance(
            kw["window_attn_skip_freq"], int):
        raise a.error("window_attn_skip_freq", "a list pattern is not supported")
    mla = bool(kw.get("multi_latent_attention"))
    if a.bool("group_query_attention") and not mla and a.int("num_query_groups"):
        kw["num_query_groups"] = a.int("num_query_groups")
    if a.int("num_experts") is not None:
        for name, kind in MOE_ARGS:
            val = a.get(name, kind)
            if val is not None:
                kw[name] = val
    if mla:
        for name in MLA_ARGS:
            if a.int(name) is not None:
                kw[name] = a.int(name)
    vocab = a.int("padded_vocab_size") or seg.vocab
    if vocab is None and a.int("vocab_size") is not None and (
            a.raw("tokenizer_type") == "NullTokenizer"):
        vocab = _pad_vocab(a.int("vocab_size") + 1, a)     # NullTokenizer adds the EOD token
    if vocab is not None:
        kw["vocab_size"] = vocab
    return kw


def _precision(a: _Args) -> str:
    if a.raw("fp4") is not None:
        raise a.error("fp4", "FP4 training is not modelled (bf16, fp16, fp8, mxfp8)")
    if a.raw("fp8") is not None:
        return "mxfp8" if a.raw("fp8_recipe") == "mxfp8" else "fp8"
    if a.bool("bf16"):
        return "bf16"
    if a.bool("fp16"):
        return "fp16"
    if a.has("bf16") or a.has("fp16"):
        raise a.error("bf16", "FP32 training is not modelled (bf16, fp16, fp8, mxfp8)")
    raise InputError(f"{a.where} arguments", "bf16/fp16/fp8", "missing: cannot tell the "
                     "precision")


def _printed_list(text: str) -> list[str]:
    """The words of a list of strings as the arguments dump prints it (``['p2p']``,
    ``['core_attn', 'moe_act']``)."""
    return text.strip("[]").replace("'", "").replace('"', "").replace(",", " ").split()


def _plan_fields(a: _Args, moe: bool) -> tuple[dict[str, Any], list[str]]:
    row: dict[str, Any] = {}
    notes: list[str] = []
    for key, name, default in PLAN_ARGS:
        if not a.has(name):
            if default is not ...:
                row[key] = default
            continue
        val = a.int(name) if key in _INT_PLAN else (
            a.raw(name) if key == "recompute" else a.bool(name))
        if val is None:
            if default is not ...:
                row[key] = default
            continue
        row[key] = val
    if moe:
        for key, name in (("ep", "expert_model_parallel_size"),
                          ("etp", "expert_tensor_parallel_size")):
            if a.int(name) is not None:
                row[key] = a.int(name)
    if a.has("bf16") or a.has("fp16") or a.has("fp8"):
        row["precision"] = _precision(a)
    impl, backend = a.raw("transformer_impl"), a.raw("attention_backend")
    if impl == "local":
        row["attention_backend"] = "local"
    elif backend is not None:
        row["attention_backend"] = backend.rpartition(".")[2]      # AttnBackend.flash
    if a.has("cross_entropy_loss_fusion"):
        row["cross_entropy_fusion"] = (
            "none" if not a.bool("cross_entropy_loss_fusion")
            else "te" if a.raw("cross_entropy_fusion_impl") == "te" else "native")
    layout = a.raw("pipeline_model_parallel_layout")   # the string as given
    if layout:
        row["pipeline_model_parallel_layout"] = layout
    comm = a.raw("cp_comm_type")         # printed as a list: ['p2p'] or one per layer
    if comm is not None:
        kinds = set(_printed_list(comm))
        if len(kinds) == 1 and next(iter(kinds)) in CP_COMM_TYPES:
            row["cp_comm_type"] = kinds.pop()
        elif kinds:
            notes.append(f"cp_comm_type {comm}: priced as p2p")
    if row.get("recompute") == "full" and (a.raw("recompute_method") != "uniform"
                                           or a.int("recompute_num_layers") != 1):
        notes.append(f"recompute full with method {a.raw('recompute_method')} and "
                     f"{a.raw('recompute_num_layers')} layers: priced as uniform, 1 layer")
    modules = a.raw("recompute_modules")    # printed as a list: ['core_attn', 'moe_act']
    if row.get("recompute") == "selective" and modules not in (None, "None", "['core_attn']"):
        names = ",".join(_printed_list(modules))
        try:
            row["recompute_modules"] = ",".join(recompute_module_list(names))
        except InputError as err:
            notes.append(f"selective recompute of {modules}: priced as core attention "
                         f"({err.rule})")
    if not (is_fp8(row.get("precision", "")) and row.get("distributed_optimizer")):
        # the flag applies to FP8 with the distributed optimizer only: elsewhere the plan's
        # default, as the plan that launched the job has it
        row.pop("fp8_param_gather", None)
    recipe = a.raw("fp8_recipe")
    if row.get("precision") == "fp8" and recipe not in (None, "delayed"):
        if recipe in PLAN_FIELD["fp8_recipe"].choices:
            row["fp8_recipe"] = recipe
        else:
            notes.append(f"fp8 recipe {recipe}: priced as delayed scaling")
    if moe:
        dispatcher = a.raw("moe_token_dispatcher_type")
        if dispatcher in MOE_DISPATCHERS:
            row["moe_token_dispatcher_type"] = dispatcher
            backend = a.raw("moe_flex_dispatcher_backend")
            if dispatcher == "flex" and backend in MOE_FLEX_BACKENDS:
                row["moe_flex_dispatcher_backend"] = backend
        elif dispatcher is not None:
            notes.append(f"moe_token_dispatcher_type {dispatcher}: priced as alltoall")
        factor = a.raw("moe_expert_capacity_factor")
        if factor not in (None, "None"):
            try:
                row["moe_expert_capacity_factor"] = max(float(factor), 0.0)
            except ValueError:
                raise a.error("moe_expert_capacity_factor", "must be a number") from None
    impl = a.raw("cuda_graph_impl")
    if impl in CUDA_GRAPH_IMPLS and impl != "none":
        row["cuda_graph_impl"] = impl
        scope = a.raw("cuda_graph_scope")    # printed as [<CudaGraphScope.attn: 2>, ...]
        if scope not in (None, "None", "[]"):
            row["cuda_graph_scope"] = ",".join(re.findall(
                r"\b(" + "|".join(CUDA_GRAPH_SCOPES) + r")\b", scope))
    if row.get("use_precision_aware_optimizer"):
        for key in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                    "exp_avg_sq_dtype"):
            val = a.raw(key)
            if val is not None and val in _TORCH_DTYPES:
                row[key] = _TORCH_DTYPES[val]
    if a.bool("fine_grained_activation_offloading"):
        modules = a.raw("offload_modules")
        if modules not in (None, "None", "[]"):
            row["offload_modules"] = ",".join(_printed_list(modules))
    return row, notes


# ---------------------------------------------------------------------------- runs


def _override_keys() -> dict[str, str]:
    """Accepted override names → canonical key (run keys, their aliases, Megatron's plan
    argument names, model keys)."""
    names = {k: k for k in RUN_KEYS + MODEL_KEYS}
    for f in PLAN_FIELDS:
        if f.alias:
            names[f.alias] = f.name
        if f.megatron_name:
            names[f.megatron_name] = f.name
    names["world_size"] = "num_gpus"
    return names


def _split_overrides(overrides: Mapping[str, Any] | None, model_given: bool
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    run_over: dict[str, Any] = {}
    model_over: dict[str, Any] = {}
    if overrides is None:
        return run_over, model_over
    if not isinstance(overrides, Mapping):
        raise InputError("overrides", type(overrides).__name__, "must be a mapping")
    names = _override_keys()
    for key, val in overrides.items():
        canon = names.get(key) if isinstance(key, str) else None
        if canon in ("model", "cluster"):
            raise InputError(f"overrides.{key}", val, f"give it as {canon}=")
        if canon is None:
            raise InputError(f"overrides.{key}", val, "unknown key: a run key ("
                             + ", ".join(RUN_KEYS) + ") or a model key")
        if canon in RUN_KEYS:
            run_over[canon] = val
        if canon in MODEL_KEYS and canon != "name":
            if model_given and canon != "seq_length":
                raise InputError(f"overrides.{key}", val, "a model field: not with model=")
            model_over[canon] = val
    return run_over, model_over


class _NoIterations(InputError):
    """A job start without enough iteration lines (skipped when other starts have them)."""


def _median(values: Iterable[float]) -> float | None:
    vals = [x for x in values if not math.isnan(x)]
    return statistics.median(vals) if vals else None


def _segment_run(seg: _Segment, *, where: str, cluster: str, name: str, source: str,
                 model: str | None, run_over: Mapping[str, Any],
                 model_over: Mapping[str, Any], skip_iterations: int | None,
                 flops_formula: str) -> MeasuredRun:
    row: dict[str, Any] = {}
    notes: list[str] = []
    if seg.args is None and model is None:
        raise InputError(where, "no arguments block", _NO_ARGS)
    a = _Args(seg.args or {}, where)
    kw: dict[str, Any] = {}
    moe = a.int("num_experts") is not None
    if model is None:
        kw = {**_model_fields(a, seg), **model_over}
        if "vocab_size" not in kw:
            raise InputError(f"{where} arguments.padded_vocab_size", None,
                             "the vocabulary size is not in the log (no '> padded vocab "
                             "(size: ...)' line): give overrides={'vocab_size': N}")
        moe = kw.get("num_experts") is not None
    if seg.args is not None:
        row, notes = _plan_fields(a, moe)
        if a.int("seq_length") is not None:
            row["seq_length"] = a.int("seq_length")
    if "dp" not in run_over and any(k in run_over for k in ("tp", "pp", "cp", "num_gpus")):
        row.pop("dp", None)          # re-derived from the overridden sizes
    row.update(run_over)
    run_name = row.pop("name", name)
    spec: ModelSpec | None = None
    if model is None:
        kw["name"] = run_name
        try:
            spec = make_model(**kw)
        except InputError as exc:
            raise InputError(f"{where} model.{exc.field}", exc.value, exc.rule) from None
    gbs = row.get("global_batch_size", row.get("gbs"))
    gbs = int(gbs) if isinstance(gbs, int) or (isinstance(gbs, str) and gbs.isdigit()) else None
    keep = [i for i in range(len(seg.ms)) if gbs is None or seg.gbs[i] in (-1, gbs)]
    if not keep:
        raise _NoIterations(where, f"{len(seg.ms)} iteration lines", "holds no Megatron-LM "
                         "iteration line ('iteration N/ M | ... | elapsed time per iteration "
                         f"(ms): ...'{' of global batch size %d' % gbs if gbs else ''}): "
                         "was the job logged past its first iteration?")
    if skip_iterations is None:
        skip = max(2, math.ceil(len(keep) / 10))
    elif isinstance(skip_iterations, bool) or not isinstance(skip_iterations, int) or \
            skip_iterations < 0:
        raise InputError("skip_iterations", skip_iterations, "must be a whole number >= 0")
    else:
        skip = skip_iterations
    if skip >= len(keep):
        raise _NoIterations(where, f"{len(keep)} iteration lines", f"too few: the first {skip} "
                         "are skipped as warm-up (skip_iterations); log more iterations or "
                         "a smaller --log-interval")
    used = keep[skip:]
    measured: dict[str, Any] = {"iteration_time_s": _median(seg.ms[i] for i in used) / 1000}
    tflops = _median(seg.tflops[i] for i in used)
    if tflops is not None:
        measured.update(tflops_per_gpu=tflops, flops_formula=flops_formula)
    if seg.max_reserved_mib:
        measured["peak_memory_GiB"] = seg.max_reserved_mib / 1024
    row = {**measured, **row, "model": model or run_name, "cluster": cluster,
           "name": run_name, "source": source or None}
    run = run_from_mapping(row, where)
    extra = {"iterations": (seg.iteration[used[0]], seg.iteration[used[-1]]),
             "iteration_lines": len(used), "skipped_lines": skip,
             "memory_reports": seg.memory_reports, "notes": tuple(notes)}
    return dataclasses.replace(run, model=spec if spec is not None else run.model,
                               extra=extra)


def _runs(lines: Iterable[str], *, where: str, cluster: str, name: str, source: str,
          model: str | None, overrides: Mapping[str, Any] | None,
          skip_iterations: int | None, flops_formula: str) -> list[MeasuredRun]:
    if not isinstance(cluster, str):
        raise InputError("cluster", cluster, "must be a cluster preset name or file")
    if model is not None and not isinstance(model, str):
        raise InputError("model", model, "must be a model preset name or file")
    run_over, model_over = _split_overrides(overrides, model is not None)
    segments = _parse(lines, where)
    started = [s for s in segments if s.args is not None]
    if not started:
        if model is None:
            raise InputError(where, "no arguments block", _NO_ARGS)
        started = segments[:1]
    with_iterations = [s for s in started if len(s.ms)] or started[-1:]
    many = len(with_iterations) > 1
    out: list[MeasuredRun] = []
    first_error: InputError | None = None
    for k, seg in enumerate(with_iterations, start=1):
        try:
            out.append(_segment_run(
                seg, where=f"{where} run {k}" if many else where, cluster=cluster,
                name=f"{name[:120]}#{k}" if many else name, source=source, model=model,
                run_over=run_over, model_over=model_over, skip_iterations=skip_iterations,
                flops_formula=flops_formula))
        except _NoIterations as exc:      # a start that crashed early: the others count
            first_error = first_error or exc
    if not out:
        assert first_error is not None
        raise InputError(first_error.field, first_error.value, first_error.rule)
    return out


def runs_from_megatron_log(text: str, *, cluster: str, name: str | None = None,
                           source: str = "", model: str | None = None,
                           overrides: Mapping[str, Any] | None = None,
                           skip_iterations: int | None = None,
                           flops_formula: str = "megatron") -> list[MeasuredRun]:
    """The measured runs of a Megatron-LM log's text, one per job start (arguments dump)
    followed by iteration lines; see the module docstring for the lines read.

    ``cluster``: the cluster the job ran on (preset or file); ``name``: the runs' and the
    model's name (default ``megatron-log``); ``source``: where the figures come from.
    ``model``: a model preset or file used instead of the arguments' model (needed, with
    ``overrides`` giving the plan, for a log without its arguments dump). ``overrides``:
    run keys (:data:`~configurator.core.runs.RUN_KEYS`, their aliases, or Megatron's plan
    argument names) and model keys merged over what the log says. ``skip_iterations``:
    iteration lines dropped as warm-up (default: 10 %, at least 2). ``flops_formula``: how
    the logged TFLOP/s were counted. Raises :class:`InputError` (one line) for a log that
    holds no run, or values Megatron would not print.
    """
    label = name if name is not None else "megatron-log"
    if not isinstance(text, str):
        raise InputError(label, type(text).__name__, "a Megatron-LM log must be text")
    if len(text) > MAX_LOG_BYTES:
        raise InputError(label, f"{len(text):,} characters",
                         f"larger than {MAX_LOG_BYTES >> 20} MiB")
    _check_binary(text[:65536], label)
    return _runs(_text_lines(text), where=label, cluster=cluster, name=label, source=source,
                 model=model, overrides=overrides, skip_iterations=skip_iterations,
                 flops_formula=flops_formula)


def load_megatron_log(path: str, *, cluster: str, name: str | None = None,
                      source: str | None = None, model: str | None = None,
                      overrides: Mapping[str, Any] | None = None,
                      skip_iterations: int | None = None,
                      flops_formula: str = "megatron") -> list[MeasuredRun]:
    """:func:`runs_from_megatron_log` of the file at ``path`` (read line by line, at most
    :data:`MAX_LOG_BYTES`, bad UTF-8 replaced). ``name`` defaults to the file's name without
    its extension, ``source`` to the file's name."""
    base = "".join(c for c in os.path.basename(str(path)) if c.isprintable()) or "log"
    label = name if name is not None else (os.path.splitext(base)[0] or base)[:128]
    try:
        with open(path, "rb", buffering=65536) as fh:
            _check_binary(fh.peek(65536)[:65536].decode("latin-1"), base)
            return _runs(_file_lines(fh, base), where=base, cluster=cluster, name=label,
                         source=base[-128:] if source is None else source, model=model,
                         overrides=overrides, skip_iterations=skip_iterations,
                         flops_formula=flops_formula)
    except OSError as exc:
        raise InputError("megatron log", path, f"cannot be read ({type(exc).__name__})") \
            from None
