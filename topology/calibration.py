"""Calibrated GPU efficiencies: a file of per-GPU, per-precision overrides of
:class:`topology.gpus.Efficiency`, written by ``configurator calibrate`` and read by
``search``/``estimate``/``validate --calibration FILE``.

Format (YAML)::

    format: configurator-calibration/1
    gpus:
      h100-80gb:              # GPU name (a preset's, or the name in a cluster file)
        fp8:                  # plan precision the values apply to
          gemm_fp8: 0.55      # fractions in (0, 1]
          flash_attention: 0.62
          host_op_us: 14.0    # microseconds
    fit: {...}                # how the values were fitted (runs, errors); informative

A plan in a precision the file does not name for its GPU uses the GPU's own figures. The
parameters that can be fitted are :data:`FIT_PARAMETERS`; ``gemm`` is the 16-bit GEMM
efficiency (``gemm_fp8``/``gemm_mxfp8`` those of FP8/MXFP8 GEMMs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.plan_values import PRECISION
from configurator.core.units import US
from topology.gpus import GPUSpec

FORMAT = "configurator-calibration/1"
#: Efficiency fields a calibration may set: fractions, and the host time per operation in
#: microseconds (``host_op_us``).
FRACTIONS = ("gemm", "gemm_fp8", "gemm_mxfp8", "hbm", "flash_attention")
FIT_PARAMETERS = FRACTIONS + ("host_op_us",)


def gemm_parameter(precision: str) -> str:
    """The GEMM efficiency a plan in ``precision`` runs at."""
    return {"fp8": "gemm_fp8", "mxfp8": "gemm_mxfp8"}.get(precision, "gemm")


def parameter_value(gpu: GPUSpec, name: str) -> float:
    """Current value of a :data:`FIT_PARAMETERS` entry of ``gpu`` (``host_op_us`` in µs)."""
    if name == "host_op_us":
        return gpu.efficiency.host_op_s / US
    val = getattr(gpu.efficiency, name)
    if val is None:
        raise InputError(f"calibration.{gpu.name}.{name}", None,
                         f"GPU {gpu.name} has no such rate")
    return float(val)


def with_parameters(gpu: GPUSpec, values: Mapping[str, float], source: str) -> GPUSpec:
    """``gpu`` with efficiencies ``values`` (:data:`FIT_PARAMETERS`) replaced."""
    kw = {("host_op_s" if k == "host_op_us" else k): (val * US if k == "host_op_us" else val)
          for k, val in values.items()}
    eff = dataclasses.replace(gpu.efficiency, **kw, source=source)
    return dataclasses.replace(gpu, efficiency=eff)


@dataclass(frozen=True)
class Calibration:
    """``values[gpu name][precision] = {parameter: value}``; ``fit``: how they were fitted;
    ``path``: the file read (for the source line of calibrated GPUs)."""

    values: Mapping[str, Mapping[str, Mapping[str, float]]]
    fit: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""

    def apply(self, gpu: GPUSpec, precision: str) -> GPUSpec:
        """``gpu`` with the calibrated values for ``precision``, or ``gpu`` itself."""
        vals = self.values.get(gpu.name, {}).get(precision)
        if not vals:
            return gpu
        return with_parameters(gpu, vals, f"calibrated ({self.path or 'calibration'})")

    def to_dict(self) -> dict:
        return {"format": FORMAT,
                "gpus": {g: {p: dict(vals) for p, vals in by.items()}
                         for g, by in self.values.items()},
                "fit": dict(self.fit)}


def calibration_from_dict(data: Any, path: str = "") -> Calibration:
    """Validate and build a :class:`Calibration`. Raises :class:`InputError` naming the
    field."""
    v.exact_keys("calibration", data, ("format", "gpus"), ("fit",))
    if data["format"] != FORMAT:
        raise InputError("calibration.format", data["format"], f"must be {FORMAT}")
    gpus = data["gpus"]
    if not isinstance(gpus, Mapping) or not gpus:
        raise InputError("calibration.gpus", gpus, "must map GPU names to precisions")
    values: dict = {}
    for gname, by in gpus.items():
        where = f"calibration.gpus.{gname}"
        if not isinstance(gname, str) or not isinstance(by, Mapping) or not by:
            raise InputError(where, by, "must map precisions to parameter values")
        values[gname] = {}
        for prec, vals in by.items():
            v.choice(f"{where}.precision", prec, PRECISION)
            v.exact_keys(f"{where}.{prec}", vals, (), FIT_PARAMETERS)
            out = {}
            for k, val in vals.items():
                name = f"{where}.{prec}.{k}"
                x = v.efficiency(name, val) if k in FRACTIONS else v.positive_float(name, val)
                if k == "host_op_us" and x > 1000:
                    raise InputError(name, val, "must be at most 1000 microseconds")
                out[k] = x
            values[gname][prec] = out
    fit = data.get("fit", {})
    if not isinstance(fit, Mapping):
        raise InputError("calibration.fit", fit, "must be a mapping")
    return Calibration(values=values, fit=dict(fit), path=path)


def load_calibration(path: str) -> Calibration:
    """Read a calibration file (YAML or JSON). Raises :class:`InputError`."""
    return calibration_from_dict(v.load_mapping_file("calibration", path), path)
