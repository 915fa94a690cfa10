"""``configurator profile``: time one transformer layer's forward and backward with torch on
the local device (CUDA when present, else the CPU) at the per-rank shapes of each ``--tp``,
``--cp``, ``--mbs``, write the profile (``--out``, default ``profile.yaml``; never over an
existing file without ``--force``) and, on a GPU, compare with the analytic layer time.

torch is imported only when the command runs (:mod:`configurator.profiler`).
"""

from __future__ import annotations

import argparse
import sys

from configurator.app.profile_jobs import (DEFAULT_REPEATS, DEFAULT_WARMUP, ProfileRequest,
                                           run_profile as profile_job)
from configurator.cli.options import (add_force, add_json, add_out, integer,
                                      option_groups)
from configurator.core import jsonout
from configurator.core.model_presets import MODEL_PRESETS
from configurator.core.profile import PROFILE_PRECISIONS
from configurator.profiler.timing import DEVICES
from topology.gpus import GPU_PRESETS


def add_profile_arguments(p) -> None:
    groups = option_groups(p)
    g = groups["model and cluster"]
    g.add_argument("--model", required=True,
                   help="preset name, any case (" + ", ".join(MODEL_PRESETS) + "), a YAML/JSON "
                        "file with Megatron keys, a Hugging Face config.json, or a Hugging "
                        "Face model id (owner/name)")
    g.add_argument("--seq-length", type=integer,
                   help="override the model's sequence length (a Hugging Face config's "
                        "default: its family's pretraining length, stated in the output)")
    p = groups["plan"]
    p.add_argument("--tp", type=integer, nargs="+", default=[1], metavar="T",
                   help="tensor_model_parallel_size values to profile (default 1)")
    p.add_argument("--cp", type=integer, nargs="+", default=[1], metavar="C",
                   help="context_parallel_size values to profile (default 1)")
    p.add_argument("--mbs", type=integer, nargs="+", default=[1], metavar="B",
                   help="micro_batch_size values to profile (default 1)")
    p.add_argument("--sequence-parallel", dest="sequence_parallel",
                   action=argparse.BooleanOptionalAction, default=None,
                   help="sequence parallelism (default: on when tp > 1)")
    p = groups["precision and kernels"]
    p.add_argument("--precision", choices=PROFILE_PRECISIONS, default="bf16",
                   help="bf16 (default) or fp8 (FP8 GEMMs: Transformer Engine where installed, "
                        "else torch._scaled_mm; the profile's note names which)")
    p = groups["measurement"]
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where to run: auto (CUDA when torch sees it, else the CPU; default), "
                        "cuda or cpu")
    p.add_argument("--gpu", choices=tuple(GPU_PRESETS), metavar="PRESET",
                   help="GPU preset of the analytic comparison (" + ", ".join(GPU_PRESETS)
                        + "; default: guessed from the CUDA device's name)")
    p.add_argument("--warmup", type=integer, default=DEFAULT_WARMUP, metavar="N",
                   help=f"untimed runs per shape (default {DEFAULT_WARMUP})")
    p.add_argument("--repeats", type=integer, default=DEFAULT_REPEATS, metavar="N",
                   help=f"timed runs per shape, the median reported (default {DEFAULT_REPEATS})")
    g = groups["output"]
    add_out(g, "profile to write (YAML; JSON for a .json name; default profile.yaml); "
               "refused if it exists without --force", default="profile.yaml")
    add_force(g, "an existing --out file")
    add_json(g, "the profile")


def _progress(shapes):
    from configurator.core.progress import progress

    return progress(shapes, desc="profile", unit="shape")


def run_profile(args) -> int:
    out = profile_job(ProfileRequest(
        model=args.model, tp=tuple(args.tp), cp=tuple(args.cp), mbs=tuple(args.mbs),
        sequence_parallel=args.sequence_parallel, seq_length=args.seq_length,
        precision=args.precision, device=args.device, gpu=args.gpu, warmup=args.warmup,
        repeats=args.repeats, out=args.out, force=args.force), progress=_progress)
    if args.json:
        print(jsonout.dumps(out.layer.to_dict(), indent=2))
        if out.written:
            print(f"wrote {out.written}", file=sys.stderr)
        return 0
    print(format_profile(out))
    if out.written:
        print(f"wrote {out.written}")
    return 0


def format_profile(out) -> str:
    """A header line, the table (tp, cp, mbs, sp, profiled forward/backward ms and, with a
    comparison, the analytic ones and profiled / analytic), then the note and why there is
    no comparison."""
    from configurator.report.table import plain_table

    prof = out.layer
    lines = [f"profiled one layer of {prof.model} (seq {prof.seq_length}, {prof.precision}) "
             f"on {prof.device}, torch {prof.torch_version}: median of {out.repeats} runs "
             f"after {out.warmup} warm-up"
             + (f"; analytic: {out.analytic_gpu}" if out.comparison else "")]
    heads = ["tp", "cp", "mbs", "sp", "fwd (ms)", "bwd (ms)"]
    if out.comparison:
        heads += ["analytic fwd (ms)", "analytic bwd (ms)", "fwd ratio", "bwd ratio"]
    rows = []
    for e, c in zip(prof.entries, out.comparison or [None] * len(prof.entries)):
        cells = [str(e.tp), str(e.cp), str(e.mbs), "yes" if e.sequence_parallel else "no",
                 f"{1e3 * e.forward_s:.3f}", f"{1e3 * e.backward_s:.3f}"]
        if c is not None:
            cells += [f"{1e3 * c.analytic_forward_s:.3f}", f"{1e3 * c.analytic_backward_s:.3f}",
                      f"{e.forward_s / c.analytic_forward_s:.2f}",
                      f"{e.backward_s / c.analytic_backward_s:.2f}"]
        rows.append(cells)
    lines += plain_table(heads, rows)
    if prof.host_op_us is not None:
        from topology.gpus import host_op_in_training_us

        lines.append(f"host: {prof.host_op_us:.2f} us to issue one eager operation; "
                     f"{host_op_in_training_us(prof.host_op_us):.2f} us per operation of a "
                     f"training step, what jobs priced with --profile use (or put "
                     f"host_op_us under the GPU's efficiency in a cluster file)")
    if prof.note:
        lines.append(f"note: {prof.note}")
    if out.no_comparison:
        lines.append(out.no_comparison)
    return "\n".join(lines)
