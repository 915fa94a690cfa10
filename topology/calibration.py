"""Calibrated efficiencies: a file of per-GPU, per-precision overrides of
:class:`topology.gpus.Efficiency` and of the cluster's link efficiencies, written by
``configurator calibrate`` and read by ``search``/``estimate``/``validate --calibration FILE``.

Format (YAML)::

    format: configurator-calibration/1
    gpus:
      h100-80gb:              # GPU name (a preset's, or the name in a cluster file)
        fp8:                  # plan precision the values apply to
          gemm_fp8: 0.55      # fractions in (0, 1]
          flash_attention: 0.62
          host_op_us: 14.0    # microseconds
          inter_node_efficiency: 0.85   # network links: attained / nominal
    intervals:                # optional: each fitted value's interval [low, high]
      h100-80gb:
        fp8:
          gemm_fp8: [0.52, 0.58]
    fit: {...}                # how the values were fitted (runs, errors); informative

A plan in a precision the file does not name for its GPU uses the GPU's own figures. The
parameters that can be fitted are :data:`FIT_PARAMETERS`, each within its physically plausible
range :data:`PARAMETER_RANGES`; ``gemm`` is the 16-bit GEMM efficiency
(``gemm_fp8``/``gemm_mxfp8`` those of FP8/MXFP8 GEMMs); ``intra_node_efficiency`` and
``inter_node_efficiency`` (the cluster file's names) scale a nominal cluster's NVLink and
network links (a cluster with measured links keeps what was measured).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.plan_values import PRECISION
from configurator.core.units import US
from topology.gpus import EAGER_DISPATCH_US, GPUSpec, host_op_in_training_us

if TYPE_CHECKING:
    from configurator.core.profile import LayerProfile
    from topology.cluster import Cluster

FORMAT = "configurator-calibration/1"
#: Efficiency fields a calibration may set: fractions of a GPU's peaks, the cluster's link
#: efficiencies (fractions of the nominal bandwidth), and the host time per operation in
#: microseconds (``host_op_us``).
FRACTIONS = ("gemm", "gemm_fp8", "gemm_mxfp8", "hbm", "flash_attention")
LINK_PARAMETERS = ("intra_node_efficiency", "inter_node_efficiency")
FIT_PARAMETERS = FRACTIONS + ("host_op_us",) + LINK_PARAMETERS

_GEMM_RANGE = (0.38, 1.0, "a fraction of the tensor-core peak, so at most 1; the cost model's "
                          "GEMM efficiency (less the fixed time and the launch each timing "
                          "holds) of the 110 BF16 and 55 FP8 dense GEMMs of "
                          "bench/kernels/gemm_shapes.py (1,024-16,384 "
                          "tokens) is 0.56-0.87 in BF16 and 0.45-0.73 in FP8 on H100 and H200 "
                          "(tests/data/gemm_shapes_dense.csv), 0.50 and 0.40 at the lowest "
                          "with the in-training factor 0.88: 0.38 is below any measured")
#: The physically plausible range ``(low, high, source)`` of every :data:`FIT_PARAMETERS`
#: entry: ``calibrate`` fits within it and judges identifiability over all of it.
PARAMETER_RANGES: dict[str, tuple[float, float, str]] = {
    "gemm": _GEMM_RANGE,
    "gemm_fp8": _GEMM_RANGE,
    "gemm_mxfp8": _GEMM_RANGE,
    "hbm": (0.3, 1.0, "a fraction of the HBM peak; STREAM-like copies attain 0.8-0.92 "
                      "(NVIDIA's H100 and B200 datasheets against babelstream)"),
    "flash_attention": (0.2, 1.0, "a fraction of the tensor-core peak; FlashAttention-2 "
                                  "(Dao 2023, Fig. 4-6) 0.35-0.73 forward+backward on A100, "
                                  "FlashAttention-3 (Shah et al. 2024) 0.6-0.75 on H100; in "
                                  "training the presets attain 0.33 (H100) to 0.85 (B300), "
                                  "so 0.2 is below any measured, as for the GEMMs"),
    "host_op_us": (2.0, 60.0, "PyTorch eager dispatch per operation: about "
                              f"{EAGER_DISPATCH_US[0]:g}-{EAGER_DISPATCH_US[1]:g} us of CPU "
                              "time on a current x86 host (PyTorch's Performance Tuning "
                              "Guide; Lumos, MLSys 2025, per-kernel CPU launch gaps), tens "
                              "of us with Python-side hooks; up to 60: an H200 host whose "
                              "CUDA dispatch measured 10.4-12.8 us fits 51-58 us on its "
                              "runs (tests/data/trial_gpu)"),
    "intra_node_efficiency": (0.3, 1.0, "nccl-tests all_reduce busbw over NVLink's nominal "
                                        "per-GPU bandwidth: 0.7-0.9 on DGX A100/H100"),
    "inter_node_efficiency": (0.3, 1.0, "nccl-tests busbw across nodes over the NICs' line "
                                        "rate: 0.8-0.97 on InfiniBand HDR/NDR"),
}


def gemm_parameter(precision: str) -> str:
    """The GEMM efficiency a plan in ``precision`` runs at."""
    return {"fp8": "gemm_fp8", "mxfp8": "gemm_mxfp8"}.get(precision, "gemm")


def parameter_value(gpu: GPUSpec, name: str, cluster: "Cluster | None" = None) -> float:
    """Current value of a :data:`FIT_PARAMETERS` entry of ``gpu`` (``host_op_us`` in µs; a
    link efficiency from ``cluster``'s spec)."""
    if name in LINK_PARAMETERS:
        key = "intra_efficiency" if name == "intra_node_efficiency" else "inter_efficiency"
        if cluster is None or key not in cluster.spec:
            raise InputError(f"calibration.{gpu.name}.{name}", None,
                             "needs a cluster built from nominal links")
        return float(cluster.spec[key])
    if name == "host_op_us":
        return gpu.efficiency.host_op_s / US
    val = getattr(gpu.efficiency, name)
    if val is None:
        raise InputError(f"calibration.{gpu.name}.{name}", None,
                         f"GPU {gpu.name} has no such rate")
    return float(val)


def with_parameters(gpu: GPUSpec, values: Mapping[str, float], source: str) -> GPUSpec:
    """``gpu`` with efficiencies ``values`` (:data:`FIT_PARAMETERS`; the link efficiencies
    are the cluster's, :func:`with_link_parameters`, and skipped here) replaced."""
    kw = {("host_op_s" if k == "host_op_us" else k): (val * US if k == "host_op_us" else val)
          for k, val in values.items() if k not in LINK_PARAMETERS}
    if not kw:
        return gpu
    eff = dataclasses.replace(gpu.efficiency, **kw, source=source)
    return dataclasses.replace(gpu, efficiency=eff)


def with_link_parameters(cluster: "Cluster", values: Mapping[str, float]) -> "Cluster":
    """``cluster`` with the link efficiencies of ``values`` (:data:`LINK_PARAMETERS`)
    (:meth:`topology.cluster.Cluster.with_link_efficiency`: a measured cluster is kept)."""
    return cluster.with_link_efficiency(values.get("intra_node_efficiency"),
                                        values.get("inter_node_efficiency"))


def with_measurements(cluster: "Cluster", profile: "LayerProfile | None",
                      calibration: "Calibration | None", precision: str) -> "Cluster":
    """``cluster`` with what was measured of the user's hosts: the host time per operation
    of a training step from the dispatch time ``profile`` measured
    (:func:`with_profiled_host`), then ``calibration``'s values for ``precision``
    (:meth:`Calibration.apply_cluster`), which win. Either may be None."""
    if profile is not None and profile.host_op_us is not None:
        cluster = with_profiled_host(cluster, profile)
    if calibration is not None:
        cluster = calibration.apply_cluster(cluster, precision)
    return cluster


def with_profiled_host(cluster: "Cluster", profile: "LayerProfile") -> "Cluster":
    """``cluster`` with the host time per operation of a training step taken from the
    dispatch time ``profile`` measured on the user's host
    (:func:`topology.gpus.host_op_in_training_us`); a calibration applied after it wins."""
    us = host_op_in_training_us(profile.host_op_us)
    gpu = with_parameters(cluster.gpu, {"host_op_us": us},
                          f"{cluster.gpu.efficiency.source}; host_op_us {us:.3g} from the "
                          f"profile {profile.path or 'given'}")
    return cluster.with_gpu(gpu)


@dataclass(frozen=True)
class Calibration:
    """``values[gpu name][precision] = {parameter: value}``; ``intervals``: the same shape,
    ``[low, high]`` per fitted value (empty where not known); ``fit``: how they were fitted;
    ``path``: the file read (for the source line of calibrated GPUs)."""

    values: Mapping[str, Mapping[str, Mapping[str, float]]]
    fit: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""
    intervals: Mapping[str, Mapping[str, Mapping[str, tuple]]] = field(default_factory=dict)

    def apply(self, gpu: GPUSpec, precision: str) -> GPUSpec:
        """``gpu`` with the calibrated values for ``precision``, or ``gpu`` itself."""
        vals = self.values.get(gpu.name, {}).get(precision)
        if not vals:
            return gpu
        return with_parameters(gpu, vals, f"calibrated ({self.path or 'calibration'})")

    def apply_cluster(self, cluster: "Cluster", precision: str) -> "Cluster":
        """``cluster`` with its GPU calibrated (:meth:`apply`), its nominal links at the
        calibrated link efficiencies of its GPU and ``precision``, and those values'
        intervals as its ``calibration_intervals`` (the error bars widen by them,
        :func:`configurator.search.intervals.parameter_spread`)."""
        vals = self.values.get(cluster.gpu.name, {}).get(precision) or {}
        out = with_link_parameters(cluster.with_gpu(self.apply(cluster.gpu, precision)), vals)
        ivs = self.intervals.get(cluster.gpu.name, {}).get(precision) or {}
        out.calibration_intervals = {k: (float(lo), float(hi)) for k, (lo, hi) in ivs.items()
                                     if k in vals}
        return out

    def to_dict(self) -> dict:
        doc = {"format": FORMAT,
               "gpus": {g: {p: dict(vals) for p, vals in by.items()}
                        for g, by in self.values.items()}}
        if self.intervals:
            doc["intervals"] = {g: {p: {k: [float(x) for x in iv] for k, iv in vals.items()}
                                    for p, vals in by.items()}
                                for g, by in self.intervals.items()}
        doc["fit"] = dict(self.fit)
        return doc


def _check_value(name: str, k: str, val) -> float:
    if k in FRACTIONS or k in LINK_PARAMETERS:
        return v.efficiency(name, val)
    x = v.positive_float(name, val)
    if k == "host_op_us" and x > 1000:
        raise InputError(name, val, "must be at most 1000 microseconds")
    return x


def calibration_from_dict(data: Any, path: str = "") -> Calibration:
    """Validate and build a :class:`Calibration`. Raises :class:`InputError` naming the
    field."""
    v.exact_keys("calibration", data, ("format", "gpus"), ("fit", "intervals"))
    if data["format"] != FORMAT:
        raise InputError("calibration.format", data["format"], f"must be {FORMAT}")
    gpus = data["gpus"]
    if not isinstance(gpus, Mapping):   # empty: every preset kept (the runs confirmed them)
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
            values[gname][prec] = {k: _check_value(f"{where}.{prec}.{k}", k, val)
                                   for k, val in vals.items()}
    intervals: dict = {}
    raw = data.get("intervals", {})
    if not isinstance(raw, Mapping):
        raise InputError("calibration.intervals", raw, "must be a mapping like gpus")
    for gname, by in raw.items():
        for prec, vals in (by.items() if isinstance(by, Mapping) else [(None, by)]):
            where = f"calibration.intervals.{gname}.{prec}"
            if prec not in values.get(gname, {}) or not isinstance(vals, Mapping):
                raise InputError(where, vals, "must map a calibrated GPU and precision's "
                                              "parameters to [low, high]")
            v.exact_keys(where, vals, (), tuple(values[gname][prec]))
            out = {}
            for k, iv in vals.items():
                if not isinstance(iv, (list, tuple)) or len(iv) != 2:
                    raise InputError(f"{where}.{k}", iv, "must be [low, high]")
                lo, hi = (_check_value(f"{where}.{k}", k, x) for x in iv)
                if not lo <= values[gname][prec][k] <= hi:
                    raise InputError(f"{where}.{k}", iv, "must contain the value "
                                     f"{values[gname][prec][k]}")
                out[k] = (lo, hi)
            intervals.setdefault(gname, {})[prec] = out
    fit = data.get("fit", {})
    if not isinstance(fit, Mapping):
        raise InputError("calibration.fit", fit, "must be a mapping")
    return Calibration(values=values, fit=dict(fit), path=path, intervals=intervals)


def load_calibration(path: str) -> Calibration:
    """Read a calibration file (YAML or JSON). Raises :class:`InputError`."""
    return calibration_from_dict(v.load_mapping_file("calibration", path), path)
