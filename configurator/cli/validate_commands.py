"""``configurator validate`` and ``configurator calibrate``: the cost model against measured
runs, and a GPU's efficiencies fitted to them."""

from __future__ import annotations

import sys

from configurator.app.calibrate_jobs import calibrate_runs
from configurator.app.validate_jobs import load_run_files, validate_runs
from configurator.core import jsonout
from configurator.core.errors import InputError
from configurator.cli.options import add_force, add_json, add_out, option_groups
from launchers.files import check_out_file, write_text_file

RUNS_HELP = ("measured runs: CSV/YAML/JSON run files (schema: docs/formats.md, 'Measured runs'; "
             "configurator examples writes one) or Megatron-LM logs (.log/.txt/.out, with "
             "--cluster); none: the published runs that ship with the tool (SC'21, NeMo "
             "long context, Megatron-Bridge)")


def _progress(total_label):
    from configurator.core.progress import progress

    def wrap(items):
        return progress(items, desc=total_label, unit="run")
    return wrap


def _groups_progress(items):
    """A bar over calibrate's (GPU, precision) groups counting their runs, naming the group
    being fitted (a group's fit is the long step)."""
    from configurator.core.progress import progress

    items = list(items)
    with progress(desc="calibrate", unit="run",
                  total=sum(len(prepared) for _, (_, prepared) in items)) as bar:
        for item in items:
            (gpu, precision), (_, prepared) = item
            bar.set_postfix_str(f"{gpu} {precision}")
            yield item
            bar.update(len(prepared))


def _runs_options(p):
    p.add_argument("runs", nargs="*", metavar="RUNS", help=RUNS_HELP)
    groups = option_groups(p)
    g = groups["model and cluster"]
    g.add_argument("--cluster", metavar="PRESET_OR_FILE",
                   help="cluster the Megatron logs ran on")
    groups["topology and placement"].add_argument(
        "--topology", metavar="FILE",
        help="topology file of the hosts the runs ran on (configurator topology import of "
             "nccl-tests logs or 'nvidia-smi topo -m', or probe): the runs are priced on "
             "its links, a run on N nodes on the hosts its run file (hosts) or its log "
             "(the launch scripts' hosts line) names, else the first N, a run on part of a "
             "host on its first GPUs; the link efficiencies are then not fitted")
    return groups


def _topology(path):
    if not path:
        return None
    from configurator.app.inputs import load_measured_topology

    return load_measured_topology(path)


def add_validate_arguments(p) -> None:
    groups = _runs_options(p)
    groups["model and cluster"].add_argument(
        "--calibration", metavar="FILE",
        help="calibrated efficiencies (configurator calibrate -o FILE)")
    groups["fit"].add_argument(
        "--by-source", action="store_true",
        help="per dataset (run file, or the published tables): the error with the presets, "
             "fitted on every dataset (in sample) and fitted on the others, this one held out "
             "(leave one source out; the run-fitted efficiencies start from their values "
             "before any run)")
    g = groups["output"]
    add_out(g, "write an HTML report with the predicted-vs-measured scatter plot")
    g.add_argument("--all-runs", action="store_true", help="print every run, not only groups")
    add_json(g, "the report")
    add_force(g, "an existing --out file")


def _calibration(path):
    if not path:
        return None
    from topology.calibration import load_calibration

    return load_calibration(path)


def run_validate(args) -> int:
    if args.out:
        check_out_file(args.out, args.force)
    runs, skipped = load_run_files(args.runs, args.cluster)
    if args.by_source:
        if args.calibration or args.out or args.topology:
            raise InputError("by_source", True, "fits its own calibrations on the runs' own "
                             "clusters and writes no report: not with --calibration, "
                             "--topology or --out")
        from configurator.app.by_source import validate_by_source

        from configurator.core.progress import progress

        with progress(desc="fitting (runs priced)", unit="pass") as bar:
            rep = validate_by_source(runs, skipped, progress=bar.update)
        print(jsonout.dumps(rep.to_dict(), indent=2) if args.json else format_by_source(rep))
        return 0
    report = validate_runs(runs, _calibration(args.calibration), skipped,
                           progress=_progress("validate"), topology=_topology(args.topology))
    if args.out:
        from configurator.report.validate_html import render_validation_html

        path = write_text_file(args.out, render_validation_html(
            report, "configurator validate: predicted vs measured iteration time"), args.force)
        print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(jsonout.dumps(report.to_dict(), indent=2))
        return 0
    print(format_validation(report, all_runs=args.all_runs))
    return 0


def format_validation(report, all_runs: bool = False) -> str:
    """Per-group table (runs, MAPE, worst row, Spearman ρ), then runs that could not be
    priced, then (``all_runs``) every run."""
    lines = [f"{'group':<14} {'runs':>5} {'MAPE':>7} {'worst':>8}  {'rho':>6}  worst run"]
    for g in list(report.groups) + ([report.overall] if report.overall else []):
        rho = "-" if g.spearman is None else f"{g.spearman:.3f}"
        lines.append(f"{g.group:<14} {g.rows:>5} {100 * g.mape:>6.1f}% "
                     f"{100 * g.worst_error:>+7.1f}%  {rho:>6}  {g.worst_name}")
        if g.memory_mape is not None:
            lines.append(f"{'':<14} memory: {g.memory_rows} runs, MAPE "
                         f"{100 * g.memory_mape:.1f} %")
    problems = [c for c in report.checks if c.problem]
    if problems:
        lines.append(f"\n{len(problems)} run(s) could not be priced:")
        lines += [f"  {c.run.name}: {c.problem}" for c in problems]
    unfit = [c for c in report.checks if c.fits is False]
    if unfit:
        lines.append(f"\n{len(unfit)} run(s) predicted not to fit in GPU memory:")
        lines += [f"  {c.run.name}: {c.predicted_peak_memory_bytes / 2**30:.1f} of "
                  f"{c.memory_capacity_bytes / 2**30:.1f} GiB" for c in unfit]
    if all_runs:
        lines.append(f"\n{'run':<58} {'measured s':>10} {'predicted s':>11} {'error':>8}")
        for c in report.checks:
            if c.error is not None:
                lines.append(f"{c.run.name[:58]:<58} {c.measured_iteration_time_s:>10.3f} "
                             f"{c.predicted_iteration_time_s:>11.3f} {100 * c.error:>+7.1f}%")
    if report.skipped:
        lines.append(f"\n{len(report.skipped)} published row(s) skipped (--json lists them).")
    return "\n".join(lines)


def format_by_source(rep) -> str:
    """One line per dataset, then all: runs; MAPE with the presets, fitted on every dataset
    (in sample) and on the others (held out); the held-out mean signed error and worst run."""
    def pct(g, attr="mape"):
        return "-" if g is None else f"{100 * getattr(g, attr):+.1f}%" if attr == "mean_error" \
            else f"{100 * getattr(g, attr):.1f}%"

    width = max(len(r.dataset) for r in rep.rows + [rep.overall])
    lines = [f"{'dataset':<{width}} {'runs':>5} {'presets':>8} {'in sample':>10} "
             f"{'held out':>9} {'bias':>7}  worst held-out run"]
    for r in rep.rows + [rep.overall]:
        worst = "-" if r.held_out is None else (f"{r.held_out.worst_name} "
                                                f"({100 * r.held_out.worst_error:+.1f}%)")
        lines.append(f"{r.dataset:<{width}} {r.runs:>5} {pct(r.presets):>8} "
                     f"{pct(r.in_sample):>10} {pct(r.held_out):>9} "
                     f"{pct(r.held_out, 'mean_error'):>7}  {worst}")
    def factors(f):
        return ", ".join(f"{k} {v:.3f}" for k, v in f.items())

    lines.append(f"\nin sample: the in-training factors (topology/gpus.py IN_TRAINING) fitted "
                 f"on every dataset: {factors(rep.in_sample_factors)}")
    lines += [f"held out {name}: {factors(f)}" for name, f in rep.held_out_factors.items()]
    lines.append("held out: fitted on the other datasets, from the figures before any run; "
                 "bias: the held-out mean signed error (negative: too fast)")
    return "\n".join(lines)


def add_calibrate_arguments(p) -> None:
    from topology.calibration import FIT_PARAMETERS

    groups = _runs_options(p)
    groups["fit"].add_argument(
        "--params", metavar="P1,P2",
        help="parameters to fit, of: " + ", ".join(FIT_PARAMETERS)
             + " (default: the precision's GEMM efficiency, flash_attention, host_op_us and "
               "the intra- and inter-node link efficiencies, each only where the runs "
               "determine it, and hbm only beside one of them that alone sits at a bound of "
               "its range; an explicit parameter the runs cannot determine is an error "
               "naming the run that would)")
    g = groups["output"]
    add_out(g, "calibration file to write (YAML); refused if it exists without --force",
            required=True)
    add_json(g, "the fits")
    add_force(g, "an existing --out file")


def run_calibrate(args) -> int:
    import yaml

    check_out_file(args.out, args.force)
    params = None
    if args.params is not None:
        params = tuple(x.strip() for x in args.params.split(",") if x.strip())
        if not params:
            raise InputError("params", args.params, "name at least one parameter")
    runs, _ = load_run_files(args.runs, args.cluster)
    source = ", ".join(args.runs) or "published runs"
    cal, fits = calibrate_runs(runs, params, progress=_groups_progress,
                               source=source + (f" on the links of {args.topology}"
                                                if args.topology else ""),
                               topology=_topology(args.topology))
    path = write_text_file(args.out, yaml.safe_dump(jsonout.finite(cal.to_dict()),
                                                sort_keys=False), args.force)
    if args.json:
        print(jsonout.dumps({"out": path, "groups": [f.to_dict() for f in fits]}, indent=2))
        return 0
    print(f"{'gpu':<14} {'precision':<9} {'runs':>4} {'MAPE before':>11} {'after':>7} "
          f"{'leave-one-out':>13}  fitted [95 % interval]")
    for f in fits:
        loo = "-" if f.loo_mape is None else f"{100 * f.loo_mape:.1f}%"
        fitted = ", ".join(f"{k} {f.before[k]:.3g} -> {v:.3g} [{f.intervals[k][0]:.3g}, "
                           f"{f.intervals[k][1]:.3g}]" for k, v in f.parameters.items())
        print(f"{f.gpu:<14} {f.precision:<9} {f.runs:>4} {100 * f.mape_before:>10.1f}% "
              f"{100 * f.mape_after:>6.1f}% {loo:>13}  {fitted or 'nothing determined'}")
        for n in f.notes:
            print(f"{'':<14} note: {n}")
    if not cal.values:
        print("every preset kept: the presets predict these runs as well as a measured time "
              "repeats, or what the runs determine predicts the runs left out no better (the "
              "notes say which and why)")
    print(f"wrote {path}")
    return 0
