"""``configurator plan`` on the shipped 17-node H100 nccl-tests logs, end to end: the wall time
of the whole command (interpreter start, import of the 408 logs, audit, search with
placement on every host and without the flagged one, the cost of every finding, the
scripts and report.html), best of ``--repeat`` runs, and what it decided; then
``configurator search --topology`` on the topology those logs import to (the search and
the placement of its 10 best plans, interpreter start included), best of ``--repeat``.

Run: ``python -m bench.speed.plan_17node [--model llama3-70b] [--gbs 512] [--repeat 3]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

from bench.common import bench_parser
from configurator.data import EXAMPLES, data_path


def _best_wall(argv: list[str], repeat: int) -> tuple[list[float], str]:
    """Wall times of ``repeat`` runs of ``python -m configurator argv`` and the last stdout;
    SystemExit with its error when it fails."""
    walls, out = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "configurator", *argv],
                             capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if res.returncode != 0:
            raise SystemExit(res.stderr.strip() or res.returncode)
        out = res.stdout
    return walls, out


def _walls(walls: list[float]) -> str:
    return f"wall {min(walls):.2f} s best of {len(walls)} ({', '.join(f'{w:.2f}' for w in walls)})"


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--gbs", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    logs = data_path(EXAMPLES, "h100-17node-nccl-tests")
    walls, summary = [], None
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "configurator", "plan", "--model",
                                  args.model, "--gbs", str(args.gbs), "--logs", str(logs),
                                  "--out", f"{tmp}/job", "--json"],
                                 capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
                return res.returncode
            summary = json.loads(res.stdout)["summary"]
    print(f"configurator plan --model {args.model} --gbs {args.gbs} --logs <17-node logs>: "
          f"{_walls(walls)}")
    for line in summary:
        print("  " + line)
    with tempfile.TemporaryDirectory() as tmp:
        _best_wall(["topology", "import", str(logs), "-o", f"{tmp}/topo.json"], 1)
        walls, out = _best_wall(["search", "--model", args.model, "--cluster",
                                 "dgx-h100-80gb", "--topology", f"{tmp}/topo.json", "--gbs",
                                 str(args.gbs), "--json"], args.repeat)
    placed = sum(1 for p in json.loads(out)["plans"] if p.get("placement"))
    print(f"configurator search --model {args.model} --gbs {args.gbs} --topology <17-node "
          f"topology> ({placed} plans placed): {_walls(walls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
