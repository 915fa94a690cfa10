"""Fuzz every input format through the real CLI and report what breaks.

Run::

    python -m bench.robustness.fuzz --examples N [--targets model,cluster,...] [--seed S]
        [--save [DIR]] [--strict] [--no-shrink] [--out-percent P]

Per target (:mod:`tests.support.fuzzing`: model, cluster, hf_config, topofile, nccl, nvsmi,
plan, argv, runs, calibration) it runs N generated CLI calls in a worker subprocess and prints one row: inputs tried,
tracebacks, hangs (> 10 s), over-memory (> 2 GiB or MemoryError), multi-line errors (exit
2/3 without exactly one stderr line) and non-strict JSON. Failures are grouped by root-cause
signature; each group's first input is shrunk to a small reproducer and printed (argv and
file contents). ``--save DIR`` (default ``fuzz-failures``) writes each reproducer as
``DIR/<target>/<n>-<signature>/{input/, argv.json, command.sh, outcome.txt}``.

Exit code 0 (it is a report); with ``--strict``, 1 when anything failed.
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from pathlib import Path

from bench.common import bench_parser, table_head
from tests.support.fuzzing import (CATEGORIES, TARGETS, Runner, describe_files, run_target,
                                   save_case, shrink, slug)

COLUMNS = {"traceback": "tracebacks", "hang": "hangs", "memory": "over-memory",
           "multiline": "multi-line errors", "json": "non-strict JSON"}


def parse_args(argv=None):
    p = bench_parser(__doc__)
    p.add_argument("--examples", type=int, default=300, help="inputs per target (default 300)")
    p.add_argument("--targets", default=",".join(TARGETS),
                   help=f"comma-separated subset of {','.join(TARGETS)}")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    p.add_argument("--save", nargs="?", const="fuzz-failures", default=None, metavar="DIR",
                   help="write one reproducer directory per failure group (default DIR "
                        "fuzz-failures)")
    p.add_argument("--strict", action="store_true", help="exit 1 if anything failed")
    p.add_argument("--no-shrink", action="store_true", help="report inputs as found")
    p.add_argument("--shrink-seconds", type=float, default=60.0,
                   help="time to shrink each failure group (default 60)")
    p.add_argument("--out-percent", type=int, default=None,
                   help="share of calls writing --out files (default: each target's own)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--stats", action="store_true",
                   help="also print, per target, how the calls ended (exit codes, the most "
                        "common error fields): how deep the inputs reach")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        print(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}",
              file=sys.stderr)
        return 2
    rows, groups, stats = [], [], []   # groups: (target, signature, category, count, outcome)
    with Runner() as runner:
        for target in targets:
            t0 = time.monotonic()
            counts = dict.fromkeys(CATEGORIES, 0)
            endings: Counter = Counter()
            first: dict[str, tuple] = {}
            tried = 0

            def seen(o, target=target):
                nonlocal tried
                tried += 1
                endings[_ending(o)] += 1
                for cat in {f.category for f in o.failures}:
                    counts[cat] += 1
                for f in o.failures:
                    n, _, _ = first.get(f.signature, (0, None, None))
                    keep = first[f.signature][1] if n else o
                    first[f.signature] = (n + 1, keep, f.category)
                if not args.quiet and tried % 50 == 0:
                    print(f"  {target}: {tried} inputs, {time.monotonic() - t0:.0f} s",
                          file=sys.stderr)

            if not args.quiet:
                print(f"{target}: running {args.examples} inputs", file=sys.stderr)
            run_target(runner, target, args.examples, seed=args.seed,
                       out_p=args.out_percent, on_outcome=seen)
            rows.append((target, tried, counts, time.monotonic() - t0))
            if args.stats:
                stats.append((target, endings))
            for sig, (n, outcome, cat) in first.items():
                if not args.no_shrink:
                    if not args.quiet:
                        print(f"  shrinking: {sig[:100]}", file=sys.stderr)
                    outcome = shrink(runner, outcome, sig, max_seconds=args.shrink_seconds)
                groups.append((target, sig, cat, n, outcome))
            runner.close_target(target)

    print_table(rows)
    for target, endings in stats:
        print(f"{target}: " + "; ".join(f"{k} x{n}" for k, n in endings.most_common(12)))
    if stats:
        print()
    print_groups(groups, args.save)
    failed = any(sum(c.values()) for _, _, c, _ in rows)
    return 1 if failed and args.strict else 0


def _ending(o) -> str:
    """How a call ended, for --stats: exit code and the error's field (or the failure)."""
    r = o.result
    if o.failures:
        return o.failures[0].category
    code = r.get("code") or 0
    if "Warning: " in (r.get("stderr") or ""):
        return f"exit {code} with a Python warning on stderr"
    if code in (2, 3):
        line = (r.get("stderr") or "").strip().splitlines()[0]
        m = re.match(r"^\S+: (?:error|no feasible plan): (argument \S+|[^=:]*)", line)
        field = re.sub(r"\[\d+\]", "[i]", m.group(1)) if m else line[:30]
        return f"exit {code} {field[:40]}"
    return f"exit {code}" + (" (help/version)" if r.get("kind") == "exit" else "")


def print_table(rows) -> None:
    head = ["target", "inputs", *COLUMNS.values(), "seconds"]
    print(table_head(head))
    for target, tried, counts, secs in rows:
        print("| " + " | ".join([target, str(tried), *(str(counts[c]) for c in COLUMNS),
                                 f"{secs:.0f}"]) + " |")
    print()


def print_groups(groups, save: str | None) -> None:
    if not groups:
        print("No failures.")
        return
    print(f"{len(groups)} failure group(s) (signature = exception and deepest product frame, "
          "or category and command):")
    for i, (target, sig, cat, n, outcome) in enumerate(groups, 1):
        print(f"\n## {i}. [{target}] [{cat}] {sig}  ({n} input(s))")
        print("argv: " + outcome.case.command())
        print(describe_files(outcome.case))
        r = outcome.result
        detail = [f.detail for f in outcome.failures if f.signature == sig]
        if detail and detail[0]:
            print("detail: " + detail[0][:400])
        if r.get("stderr") and cat == "multiline":
            print("stderr: " + repr(r["stderr"][:400]))
        if save:
            d = save_case(outcome, Path(save) / target / f"{i:03d}-{slug(sig)}", sig)
            print(f"saved: {d}")


if __name__ == "__main__":
    sys.exit(main())
