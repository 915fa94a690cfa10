"""Measured per-layer times: the profile ``configurator profile`` writes and the time model
can read in place of its analytic compute (pure data; no torch).

Format (YAML, or JSON for a ``.json`` file)::

    format: configurator-profile/1
    device: NVIDIA H100 80GB HBM3      # torch's device name, or "cpu"
    gpu_preset: h100-80gb              # the GPU preset the device is (null: unknown / CPU)
    torch_version: 2.13.0
    model: llama3-8b                   # the model's name
    model_fingerprint: {hidden_size: 4096, num_layers: 32, ffn_hidden_size: 14336,
                        num_attention_heads: 32, num_query_groups: 8, kv_channels: 128,
                        swiglu: true}
    precision: bf16                    # bf16 or fp8 (FP8 GEMMs; the note names the backend)
    seq_length: 8192                   # the full sequence (each rank holds seq_length / cp)
    note: ...                          # optional: what was not profiled (MoE: dense layer)
    host_op_us: 6.2                    # optional: eager dispatch per operation on this host
    entries:                           # one per shape, (tp, cp, mbs, sp) unique
      - {tp: 1, cp: 1, mbs: 1, sequence_parallel: false,
         forward_s: 0.0123, backward_s: 0.0251}

``forward_s`` / ``backward_s``: median seconds of one decoder layer's forward and of its
backward alone (data and weight gradients) for one microbatch at the rank's shapes, without
tensor- or context-parallel communication (priced separately) — what
:func:`configurator.cost.compute.layer_costs` calls ``fwd`` and ``bwd`` of a dense layer.
``sequence_parallel`` is false whenever ``tp`` is 1. ``host_op_us``: median microseconds the
host takes to issue one eager PyTorch operation with autograd recording
(:func:`configurator.profiler.host_ops.time_host_op_s`); a job priced with the profile takes
its host time per operation from it (:func:`topology.gpus.host_op_in_training_us`) in place of
the preset's. A profile applies to a model whose
:func:`fingerprint_of` and sequence length it records (:meth:`LayerProfile.check_model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec

FORMAT = "configurator-profile/1"
#: Model fields a profile is tied to (a model that differs in one is another model).
FINGERPRINT_KEYS = ("hidden_size", "num_layers", "ffn_hidden_size", "num_attention_heads",
                    "num_query_groups", "kv_channels", "swiglu")
#: Precisions a layer can be profiled in.
PROFILE_PRECISIONS = ("bf16", "fp8")
PROFILE_KEYS_REQUIRED = ("format", "device", "gpu_preset", "torch_version", "model",
                         "model_fingerprint", "precision", "seq_length", "entries")
PROFILE_KEYS_OPTIONAL = ("note", "host_op_us")
#: Largest ``host_op_us`` a profile may hold (µs), the cluster file's bound.
MAX_HOST_OP_US = 1000.0
ENTRY_KEYS = ("tp", "cp", "mbs", "sequence_parallel", "forward_s", "backward_s")
#: Longest ``note`` (characters).
MAX_NOTE_CHARS = 1000
#: Most entries a profile may hold.
MAX_ENTRIES = 10_000


def fingerprint_of(model: ModelSpec) -> dict:
    """The :data:`FINGERPRINT_KEYS` of ``model``."""
    return {k: getattr(model, k) for k in FINGERPRINT_KEYS}


@dataclass(frozen=True, kw_only=True)
class ProfileEntry:
    """One profiled shape: per-rank layer times (s) at ``tp``, ``cp``, ``mbs``, ``sp``."""

    tp: int
    cp: int
    mbs: int
    sequence_parallel: bool
    forward_s: float
    backward_s: float

    @property
    def key(self) -> tuple[int, int, int, bool]:
        return self.tp, self.cp, self.mbs, self.sequence_parallel

    def to_dict(self) -> dict:
        return {"tp": self.tp, "cp": self.cp, "mbs": self.mbs,
                "sequence_parallel": self.sequence_parallel,
                "forward_s": self.forward_s, "backward_s": self.backward_s}


@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    """A validated profile (see the module docstring); ``path``: the file it was read from."""

    device: str
    gpu_preset: str | None
    torch_version: str
    model: str
    model_fingerprint: Mapping[str, Any]
    precision: str
    seq_length: int
    entries: tuple[ProfileEntry, ...]
    note: str | None = None
    host_op_us: float | None = None
    path: str = ""

    def lookup(self, tp: int, cp: int, mbs: int,
               sequence_parallel: bool) -> tuple[float, float] | None:
        """``(forward_s, backward_s)`` of one layer at that shape, or None if the profile has
        no such entry (sequence parallelism counts only with tp > 1)."""
        key = (int(tp), int(cp), int(mbs), bool(sequence_parallel) and int(tp) > 1)
        for e in self.entries:
            if e.key == key:
                return e.forward_s, e.backward_s
        return None

    def matches(self, model: ModelSpec) -> bool:
        """Whether the profile was taken for ``model`` (:meth:`check_model` passes)."""
        try:
            self.check_model(model)
        except InputError:
            return False
        return True

    def check_model(self, model: ModelSpec, field: str = "profile") -> None:
        """Raise :class:`InputError` (field ``field``) naming the first model figure that
        differs from the profile's."""
        fp = fingerprint_of(model)
        for k in FINGERPRINT_KEYS:
            if self.model_fingerprint[k] != fp[k]:
                raise InputError(f"{field}.model_fingerprint.{k}", self.model_fingerprint[k],
                                 f"the profile is of another model: {model.name} has {k} "
                                 f"{fp[k]}")
        if self.seq_length != model.seq_length:
            raise InputError(f"{field}.seq_length", self.seq_length,
                             f"the profile is of another sequence length: the job's is "
                             f"{model.seq_length}")

    def check_job(self, model: ModelSpec, gpu_name: str, precision: str) -> None:
        """Raise :class:`InputError` unless the profile was taken for ``model``
        (:meth:`check_model`), on a GPU of preset ``gpu_name`` and in ``precision``: the
        layer times of another GPU or precision would replace the analytic ones wrongly."""
        self.check_model(model)
        if self.gpu_preset != gpu_name:
            raise InputError("profile.gpu_preset", self.gpu_preset,
                             f"the profile was taken on {self.device!r}; the cluster's GPU "
                             f"is {gpu_name}")
        if self.precision != precision:
            raise InputError("profile.precision", self.precision,
                             f"the plan's precision is {precision}")

    def to_dict(self) -> dict:
        d = {"format": FORMAT, "device": self.device, "gpu_preset": self.gpu_preset,
             "torch_version": self.torch_version, "model": self.model,
             "model_fingerprint": dict(self.model_fingerprint), "precision": self.precision,
             "seq_length": self.seq_length}
        if self.note is not None:
            d["note"] = self.note
        if self.host_op_us is not None:
            d["host_op_us"] = self.host_op_us
        d["entries"] = [e.to_dict() for e in self.entries]
        return d


def _entry(where: str, data: Any) -> ProfileEntry:
    v.exact_keys(where, data, ENTRY_KEYS, ())
    tp = v.int_in_range(f"{where}.tp", data["tp"], "tp")
    sp = v.boolean(f"{where}.sequence_parallel", data["sequence_parallel"])
    if sp and tp == 1:
        raise InputError(f"{where}.sequence_parallel", True, "needs tp > 1")
    return ProfileEntry(tp=tp, cp=v.int_in_range(f"{where}.cp", data["cp"], "cp"),
                        mbs=v.int_in_range(f"{where}.mbs", data["mbs"], "mbs"),
                        sequence_parallel=sp,
                        forward_s=v.positive_float(f"{where}.forward_s", data["forward_s"]),
                        backward_s=v.positive_float(f"{where}.backward_s", data["backward_s"]))


def profile_from_dict(data: Any, path: str = "") -> LayerProfile:
    """Validate and build a :class:`LayerProfile`. Raises :class:`InputError` naming the
    field (``profile.<key>``, ``profile.entries[i].<key>``), its value and the rule."""
    v.exact_keys("profile", data, PROFILE_KEYS_REQUIRED, PROFILE_KEYS_OPTIONAL)
    if data["format"] != FORMAT:
        raise InputError("profile.format", data["format"], f"must be {FORMAT}")
    preset = data["gpu_preset"]
    if preset is not None:
        preset = v.display_name("profile.gpu_preset", preset)
    fp_data = v.exact_keys("profile.model_fingerprint", data["model_fingerprint"],
                           FINGERPRINT_KEYS, ())
    fp = {k: (v.boolean(f"profile.model_fingerprint.{k}", fp_data[k]) if k == "swiglu"
              else v.int_in_range(f"profile.model_fingerprint.{k}", fp_data[k], k))
          for k in FINGERPRINT_KEYS}
    entries = data["entries"]
    if not isinstance(entries, list) or not entries:
        raise InputError("profile.entries", entries, "must be a non-empty list of entries")
    if len(entries) > MAX_ENTRIES:
        raise InputError("profile.entries", len(entries), f"at most {MAX_ENTRIES:,} entries")
    parsed: list[ProfileEntry] = []
    seen: set = set()
    for i, e in enumerate(entries):
        entry = _entry(f"profile.entries[{i}]", e)
        if entry.key in seen:
            raise InputError(f"profile.entries[{i}]", e, "duplicate (tp, cp, mbs, "
                                                         "sequence_parallel)")
        seen.add(entry.key)
        parsed.append(entry)
    note = data.get("note")
    if note is not None:
        note = v.printable_text("profile.note", note)
        if len(note) > MAX_NOTE_CHARS:
            raise InputError("profile.note", note, f"at most {MAX_NOTE_CHARS} characters")
    host_op_us = data.get("host_op_us")
    if host_op_us is not None:
        host_op_us = v.positive_float("profile.host_op_us", host_op_us)
        if host_op_us > MAX_HOST_OP_US:
            raise InputError("profile.host_op_us", host_op_us,
                             f"must be at most {MAX_HOST_OP_US:g} microseconds")
    return LayerProfile(
        device=v.display_name("profile.device", data["device"]), gpu_preset=preset,
        torch_version=v.display_name("profile.torch_version", data["torch_version"]),
        model=v.display_name("profile.model", data["model"]), model_fingerprint=fp,
        precision=v.choice("profile.precision", data["precision"], PROFILE_PRECISIONS),
        seq_length=v.int_in_range("profile.seq_length", data["seq_length"], "seq_length"),
        entries=tuple(parsed), note=note, host_op_us=host_op_us, path=path)


def load_profile(path: str) -> LayerProfile:
    """Read a profile file (YAML, or JSON by its ``.json`` suffix). Raises
    :class:`InputError` (field ``profile``...) for an unreadable or malformed file."""
    return profile_from_dict(v.load_mapping_file("profile", path), path)
