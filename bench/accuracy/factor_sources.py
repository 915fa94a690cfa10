"""What each published source alone says of the in-training factors.

The factors of :data:`topology.gpus.IN_TRAINING` (GEMM, attention, host) are fitted on every
published source together (``configurator validate --by-source``, "in sample"), and that
command's "held out" column refits them without one source at a time. Here each source is
fitted alone (:func:`configurator.app.calibrate_jobs.fit_factors` on its runs only), and
Megatron-Bridge's rows also split into its dense and its MoE models: where sources disagree,
a factor is a compromise, and the split shows which rows pull it which way. A factor the
source's runs cannot move by 4 % over its whole range, or that the fit leaves at a bound of it,
stays 1 (printed as ``-``), as in ``fit_factors``. About 75 s on a 2-core machine.

Run: ``python -m bench.accuracy.factor_sources``.
"""

from __future__ import annotations

from bench.common import bench_parser, table_head
from configurator.app.calibrate_jobs import FACTOR_KINDS, fit_factors
from configurator.app.validate_jobs import run_model
from configurator.cost.groundtruth import published_runs
from topology.gpus import IN_TRAINING


def groups(runs) -> list[tuple[str, list]]:
    """``(label, runs)``: every source, then Megatron-Bridge's dense and MoE rows apart, then
    every source but Megatron-Bridge's MoE rows."""
    out = []
    for name in sorted({r.dataset for r in runs}):
        out.append((name, [r for r in runs if r.dataset == name]))
    bridge = [r for r in runs if r.dataset == "Megatron-Bridge"]
    moe = {id(r) for r in bridge if run_model(r).is_moe}
    out.append(("Megatron-Bridge, dense models", [r for r in bridge if id(r) not in moe]))
    out.append(("Megatron-Bridge, MoE models", [r for r in bridge if id(r) in moe]))
    out.append(("every source but Megatron-Bridge's MoE rows",
                [r for r in runs if id(r) not in moe]))
    return out


def main(argv=None) -> None:
    bench_parser(__doc__).parse_args(argv)
    runs, _ = published_runs()
    print(table_head(["fitted on", "runs", *FACTOR_KINDS],
                     ["---", "---:"] + ["---:"] * len(FACTOR_KINDS)))
    print("| every source (the presets, `IN_TRAINING`) | " + str(len(runs)) + " | "
          + " | ".join(f"{IN_TRAINING[k]:.2f}" for k in FACTOR_KINDS) + " |")
    for label, rows in groups(runs):
        fit = fit_factors(rows)
        cells = [f"{fit[k]:.2f}" if fit[k] != 1.0 else "-" for k in FACTOR_KINDS]
        print(f"| {label} | {len(rows)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
