"""``configurator profile``: time one decoder layer with torch on the local device
(:mod:`configurator.profiler.layer`) at every requested shape, write a profile
(:mod:`configurator.core.profile`) the time model can use in place of its analytic compute,
with the host's time to issue one eager operation (:mod:`configurator.profiler.host_ops`),
and, on a GPU, compare with the analytic layer time
(:func:`configurator.cost.compute.layer_costs`).

torch (and Transformer Engine) are imported only inside :func:`run_profile`, through the
profiler, never on the tool's import path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.model_presets import load_model
from configurator.core.plan import ParallelPlan
from configurator.core.profile import (PROFILE_PRECISIONS, LayerProfile, ProfileEntry,
                                       fingerprint_of)
from configurator.profiler.host_ops import time_host_op_s
from configurator.profiler.layer import check_fp8_sizes, fp8_backend, layer_shapes, time_layer
from configurator.profiler.timing import import_torch, torch_device
from configurator.core.units import US
from topology.gpus import guess_gpu_preset

DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 10
MAX_WARMUP = 1000
MAX_REPEATS = 10_000
#: Distinct values of each of --tp, --cp, --mbs.
MAX_VALUES = 64


@dataclass(frozen=True, kw_only=True)
class ProfileRequest:
    """``configurator profile``: the model (preset, YAML/JSON file or HF config.json) at
    ``seq_length`` (default its own), the shapes (every combination of ``tp``, ``cp``,
    ``mbs``; ``sequence_parallel`` None: on when tp > 1), the precision, the device
    (``auto``: CUDA when torch sees one, else the CPU), the analytic GPU preset (``gpu``;
    None: guessed from the CUDA device's name), warm-up and timed runs, and the file to
    write (``out``; None: none), refused if it exists unless ``force``."""

    model: str
    tp: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)
    mbs: tuple[int, ...] = (1,)
    sequence_parallel: bool | None = None
    seq_length: int | None = None
    precision: str = "bf16"
    device: str = "auto"
    gpu: str | None = None
    warmup: int = DEFAULT_WARMUP
    repeats: int = DEFAULT_REPEATS
    out: str | None = "profile.yaml"
    force: bool = False
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Profiled against analytic per-layer times (s) of one entry."""

    entry: ProfileEntry
    analytic_forward_s: float
    analytic_backward_s: float

    def to_dict(self) -> dict:
        return {**self.entry.to_dict(), "analytic_forward_s": self.analytic_forward_s,
                "analytic_backward_s": self.analytic_backward_s}


@dataclass(frozen=True, kw_only=True)
class Profile:
    """What ``profile`` measured: the profile (as written), the analytic comparison (GPU
    preset and one row per entry; empty with the reason in ``no_comparison`` when there is
    none), the run settings and the file written (None: none)."""

    layer: LayerProfile
    analytic_gpu: str | None = None
    comparison: tuple[Comparison, ...] = ()
    no_comparison: str | None = None
    warmup: int = DEFAULT_WARMUP
    repeats: int = DEFAULT_REPEATS
    written: str | None = None


def moe_note(model: ModelSpec) -> str | None:
    if not model.is_moe:
        return None
    return (f"mixture of experts: the dense layer only (attention and a dense MLP of "
            f"ffn_hidden_size {model.ffn_hidden_size}); the {model.num_moe_layers} MoE "
            f"layers' router and experts are not profiled")


def _note(model: ModelSpec, backend: str | None) -> str | None:
    """The profile's note: the FP8 backend and, for an MoE model, :func:`moe_note`."""
    parts = [moe_note(model)]
    if backend == "transformer_engine":
        parts.append("fp8: Transformer Engine Linear, delayed scaling (hybrid)")
    elif backend == "torch":
        parts.append("fp8: torch._scaled_mm GEMMs (hybrid E4M3/E5M2, unit scales; casts and "
                     "transposes as separate torch kernels; Transformer Engine not used)")
    return "; ".join(p for p in parts if p) or None


def _values(field_name: str, values: Iterable[int], key: str) -> tuple[int, ...]:
    vals = tuple(values)
    if not vals:
        raise InputError(field_name, vals, "give at least one value")
    if len(vals) > MAX_VALUES:
        raise InputError(field_name, len(vals), f"at most {MAX_VALUES} values")
    out = []
    for x in vals:
        x = v.int_in_range(field_name, x, key)
        if x not in out:
            out.append(x)
    return tuple(out)


def _count(field_name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(field_name, value, f"must be an integer in {lo:,}..{hi:,}")
    return value


def _write(out: str, profile: LayerProfile, force: bool) -> str:
    import yaml

    from launchers.files import write_text_file

    data = profile.to_dict()
    text = (json.dumps(data, indent=2, allow_nan=False) + "\n" if out.endswith(".json")
            else yaml.safe_dump(data, sort_keys=False))
    return write_text_file(out, text, force)


def run_profile(req: ProfileRequest, progress: Callable | None = None) -> Profile:
    """Profile one decoder layer at every requested shape (see the module docstring), write
    the profile to ``req.out`` (checked before anything runs) and, on a CUDA device with a
    GPU preset, compare with the analytic layer time. ``progress`` wraps the list of shapes
    (e.g. a tqdm bar). Raises :class:`InputError` for bad input, a shape Megatron would
    refuse, fp8 without CUDA and Transformer Engine, or a layer that does not fit."""
    v.choice("precision", req.precision, PROFILE_PRECISIONS)
    warmup = _count("warmup", req.warmup, 0, MAX_WARMUP)
    repeats = _count("repeats", req.repeats, 1, MAX_REPEATS)
    tps = _values("tp", req.tp, "tp")
    cps = _values("cp", req.cp, "cp")
    mbss = _values("mbs", req.mbs, "mbs")
    if req.gpu is not None:
        from topology.gpus import gpu_from_config

        gpu_from_config(req.gpu)          # an unknown preset is an error before any run
    model = load_model(req.model)
    if req.seq_length is not None:
        model = model.with_seq_length(req.seq_length)
    sp_of = {tp: (tp > 1 if req.sequence_parallel is None else req.sequence_parallel)
             for tp in tps}
    shapes = [layer_shapes(model, tp, cp, mbs, sp_of[tp])
              for tp in tps for cp in cps for mbs in mbss]
    if req.out is not None:
        from launchers.files import check_out_file

        check_out_file(req.out, req.force)

    torch = import_torch()
    device = torch_device(torch, req.device)
    backend, te = fp8_backend(torch, device, req.precision)
    if backend == "torch":
        for shape in shapes:
            check_fp8_sizes(shape)
    entries = []
    for shape in (progress(shapes) if progress else shapes):
        fwd, bwd = time_layer(torch, (backend, te), model, shape, device, warmup=warmup,
                              repeats=repeats, seed=req.seed)
        entries.append(ProfileEntry(tp=shape.tp, cp=shape.cp, mbs=shape.batch,
                                    sequence_parallel=shape.sequence_parallel,
                                    forward_s=fwd, backward_s=bwd))
    host_op_us = time_host_op_s(torch, device, warmup=warmup, repeats=repeats) / US
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    preset = (req.gpu or guess_gpu_preset(name)) if cuda else None
    layer = LayerProfile(device=" ".join(name.split())[:128] or "cuda", gpu_preset=preset,
                         torch_version=str(torch.__version__)[:128] or "unknown",
                         model=model.name, model_fingerprint=fingerprint_of(model),
                         precision=req.precision, seq_length=model.seq_length,
                         entries=tuple(entries), note=_note(model, backend),
                         host_op_us=round(host_op_us, 3))
    comparison, why = (), None
    if not cuda:
        why = "the analytic comparison needs a GPU (profiled on the CPU)"
    elif preset is None:
        why = (f"no GPU preset for {name!r}: give --gpu PRESET for the analytic comparison")
    else:
        comparison, why = analytic_comparison(model, layer, preset)
    written = _write(req.out, layer, req.force) if req.out is not None else None
    return Profile(layer=layer, analytic_gpu=preset if comparison else None,
                   comparison=comparison, no_comparison=why, warmup=warmup, repeats=repeats,
                   written=written)


def analytic_comparison(model: ModelSpec, layer: LayerProfile,
                        gpu_preset: str) -> tuple[tuple[Comparison, ...], str | None]:
    """The analytic per-layer ``fwd``/``bwd`` (:func:`configurator.cost.compute.layer_costs`)
    of every entry of ``layer`` on ``gpu_preset``: ``(rows, None)``, or ``((), reason)``
    when the GPU cannot run the precision."""
    from configurator.core.plan_batch import PlanBatch
    from configurator.cost.compute import layer_costs
    from topology.gpus import gpu_from_config

    gpu = gpu_from_config(gpu_preset)
    plans = [ParallelPlan(tp=e.tp, cp=e.cp, micro_batch_size=e.mbs, global_batch_size=e.mbs,
                          sequence_parallel=e.sequence_parallel, precision=layer.precision)
             for e in layer.entries]
    try:
        costs = layer_costs(model, PlanBatch.from_plans(plans), gpu)
    except InputError as err:
        return (), f"no analytic comparison: {err}"
    n = len(plans)
    fwd = np.broadcast_to(np.asarray(costs["fwd"], dtype=float), (n,))
    # like for like: the profiled layer writes fresh gradients, Megatron accumulates them
    bwd = np.broadcast_to(np.asarray(costs["bwd"] - costs["main_grad_acc"], dtype=float), (n,))
    return tuple(Comparison(entry=e, analytic_forward_s=float(fwd[i]),
                            analytic_backward_s=float(bwd[i]))
                 for i, e in enumerate(layer.entries)), None
