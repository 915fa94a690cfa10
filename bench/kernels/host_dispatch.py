"""The host's time to issue one eager PyTorch operation with autograd, timed on this machine
the way ``configurator profile`` times it (:func:`configurator.profiler.host_ops.time_host_op_s`),
on the CPU device and, where torch sees one, on the CUDA device, next to the presets' prior
(:data:`topology.gpus.HOST_OP_PRIOR`, inside :data:`topology.gpus.EAGER_DISPATCH_US`) and
what a training step's operation costs from each (× the in-training host factor,
:func:`topology.gpus.host_op_in_training_us`).

The CPU figure is the Python, autograd and dispatcher part alone (no CUDA launch): a lower
bound of the CUDA figure on the same host.

Run: ``python -m bench.kernels.host_dispatch [--repeats 50] [--warmup 3] [--json FILE]``.
"""

from __future__ import annotations

import json
import platform

from bench.common import bench_parser, run_cuda_bench, table_head
from configurator.core.units import US


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--repeats", type=int, default=50, help="timed loops (default 50)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed loops (default 3)")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = ap.parse_args()
    from configurator.core import validate as v
    from configurator.profiler.host_ops import time_host_op_s
    from configurator.profiler.timing import import_torch
    from topology.gpus import EAGER_DISPATCH_US, HOST_OP_PRIOR, host_op_in_training_us

    repeats = v.positive_int("--repeats", args.repeats)
    warmup = v.positive_int("--warmup", args.warmup)
    torch = import_torch()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for name in devices:
        us = time_host_op_s(torch, torch.device(name), warmup=warmup, repeats=repeats) / US
        rows.append({"device": name, "dispatch_us": round(us, 3),
                     "in_training_us": round(host_op_in_training_us(us), 3)})
    rows.append({"device": "prior", "dispatch_us": HOST_OP_PRIOR.value,
                 "in_training_us": round(host_op_in_training_us(HOST_OP_PRIOR.value), 3)})
    print(f"host: {platform.processor() or platform.machine()}, torch {torch.__version__}; "
          f"cited range {EAGER_DISPATCH_US[0]:g}-{EAGER_DISPATCH_US[1]:g} us")
    print(table_head(["device", "dispatch µs", "a training step's operation µs"],
                     ["---", "---:", "---:"]))
    for r in rows:
        print(f"| {r['device']} | {r['dispatch_us']:.2f} | {r['in_training_us']:.2f} |")
    if args.json:
        from configurator.core.errors import InputError
        try:
            with open(args.json, "x", encoding="utf-8") as f:
                json.dump({"torch": torch.__version__, "rows": rows}, f, indent=2)
        except FileExistsError:
            raise InputError("--json", args.json, "exists; not overwritten") from None
    return 0


if __name__ == "__main__":
    run_cuda_bench(main, "host_dispatch")
