"""The one table of ``configurator`` commands: name, help, examples, arguments, and the
function that runs it (which calls one library function in :mod:`configurator.app`).

Every command's ``--help`` opens with its examples (:attr:`Command.examples`), then the
usage line, the description and the options in named groups (:data:`GROUPS`)."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Callable

from configurator.cli import (audit_command, cluster_plan_command, examples_command,
                              plan_commands, probe_command, profile_command, topology_commands,
                              trial_command, validate_commands)
from configurator.app.trial_jobs import PROBE_MAX_SLOWDOWN
from configurator.core.errors import one_line
from configurator.core.validate import did_you_mean

EXIT_OK, EXIT_BUG, EXIT_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3
#: Epilogs: what ``search`` and ``estimate`` accept and return (configurator/core/limits.py),
#: and the exit codes of the commands that can only succeed or refuse their input.
PLAN_EPILOG = ("Every integer has a documented range (docs/cli.md, 'Limits on input'); a "
               "value outside it is refused with the range. Exit codes: 0 ok, 2 bad input "
               "(one line naming the flag, the value and the rule), 3 no plan fits.")
INPUT_EPILOG = ("Exit codes: 0 ok, 2 bad input (one line naming the flag or field, the value "
                "and the rule).")


class Parser(argparse.ArgumentParser):
    """argparse exits with 2 on usage errors already; keep its message to one line, add "did
    you mean" to an unknown option or an invalid choice, and open ``--help`` with the
    command's examples. Options are matched whole, never by a prefix: ``search --tp 8`` is
    an unknown option there, not ``--tp-comm-overlap``."""

    def __init__(self, *args, examples: tuple[str, ...] = (), **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.examples = tuple(examples)

    def format_help(self) -> str:
        text = super().format_help()
        if not self.examples:
            return text
        return "Examples:\n" + "".join(f"  {e}\n" for e in self.examples) + "\n" + text

    def parse_args(self, args=None, namespace=None):  # noqa: D401 - argparse API
        ns, extras = self.parse_known_args(args, namespace)
        if extras:   # named by the (sub)command that was parsed, with its own options
            target = getattr(ns, "command_parser", self)
            hints = [did_you_mean(w.split("=")[0], target.long_options())
                     for w in extras if w.startswith("--")]
            target.error(f"unrecognized arguments: {' '.join(extras)}"
                         + next((h for h in hints if h), ""))
        return ns

    def long_options(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings if s.startswith("--")]

    def error(self, message: str):  # noqa: D401 - argparse API
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m:
            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        self.exit(EXIT_INPUT, f"{self.prog}: error: {one_line(message)}")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    description: str
    add_arguments: Callable
    run: Callable | None      # None: a group whose sub-commands run
    epilog: str | None = None
    examples: tuple[str, ...] = ()
    usage: str | None = None


def add_commands(sub, table) -> None:
    """Add every :class:`Command` of ``table`` to the sub-parsers ``sub``. Each parser is
    its namespace's ``command_parser`` (errors name its flags)."""
    for cmd in table:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description,
                           epilog=cmd.epilog, examples=cmd.examples, usage=cmd.usage)
        cmd.add_arguments(p)
        p.set_defaults(command_parser=p)
        if cmd.run is not None:
            p.add_argument("-q", "--quiet", action="store_true",
                           help="no progress bars (drawn on stderr, and only when it is a "
                                "terminal, for work that takes more than a moment)")
            p.set_defaults(func=cmd.run)


def _topology_group(p) -> None:
    sub = p.add_subparsers(dest="topology_command", required=True, metavar="SUBCOMMAND",
                           parser_class=type(p))
    add_commands(sub, TOPOLOGY_COMMANDS)


#: ``configurator topology <sub-command>``.
TOPOLOGY_COMMANDS: tuple[Command, ...] = (
    Command("import", "import measurement files into one topology file",
            "Import nccl-tests logs (sendrecv_perf pairs become per-direction links, other "
            "tests collectives), 'nvidia-smi topo -m' output (nominal intra-node links) and "
            "topology files; files or directories, format detected per file. Duplicate links "
            "are merged with --merge.",
            topology_commands.add_import_arguments, topology_commands.run_import,
            INPUT_EPILOG,
            examples=("configurator topology import ex/h100-17node-nccl-tests -o topo.json",
                      "configurator topology import logs/ nvidia-smi-topo.txt -o topo.yaml "
                      "--merge median")),
)

COMMANDS: tuple[Command, ...] = (
    Command("search", "rank every legal plan that fits in memory",
            "Enumerate every plan Megatron-LM accepts (tp, pp, dp, cp, vp, ep, etp, layer "
            "split, micro batch size, recompute, sequence parallel, distributed optimizer), "
            "drop those that do not fit, rank the rest by predicted iteration time. The "
            "recipe mechanisms the cluster allows (Transformer Engine's cross entropy, the "
            "BF16 gradient reduction, the tensor-parallel overlap, the flex dispatcher, the "
            "fused MoE permutation and routing, the delayed expert weight gradients, the "
            "precision-aware optimizer) are turned on where their option is not given, and "
            "the output names those plan 1 runs. --out writes the best plan's launch scripts "
            "and plan.json.",
            plan_commands.add_search_arguments, plan_commands.run_search, PLAN_EPILOG,
            examples=(
                "configurator search --model llama3-70b --cluster dgx-h100-80gb --nodes 16 "
                "--gbs 512",
                "configurator search --model llama3-70b --cluster dgx-h100-80gb --gbs 512 "
                "--topology topo.json --nodes 16 --out plan/",
                "configurator search --model llama4-maverick --cluster gb200-nvl72 --nodes 32 "
                "--gbs 1024 --precision fp8 --tp 1 2 --pp 2 4 --mbs 1"),
            usage="configurator search --model M --cluster C --gbs G [--nodes N] [options]"),
    Command("estimate", "predict memory and iteration time of one plan",
            "Predict per-stage memory and iteration time of one plan (dp is derived from the "
            "GPU count). Estimates also plans that do not fit (then fits is false); --out "
            "saves the plan document for 'explain' and 'launch'.",
            plan_commands.add_estimate_arguments, plan_commands.run_estimate, PLAN_EPILOG,
            examples=(
                "configurator estimate --model llama3-70b --cluster dgx-h100-80gb --nodes 16 "
                "--gbs 512 --tp 4 --pp 4 --mbs 1",
                "configurator estimate --model llama3-70b --cluster dgx-h100-80gb --nodes 16 "
                "--gbs 512 --tp 8 --pp 4 --vp 5 --mbs 1 --recompute selective --json",
                "configurator estimate ... --out mine.json && configurator explain mine.json "
                "plan/plan.json"),
            usage="configurator estimate --model M --cluster C --gbs G --tp T --pp P --mbs B "
                  "[--nodes N] [options]"),
    Command("launch", "write launch scripts from a saved plan",
            "Write the torchrun and SLURM launch scripts of a saved plan document (plan.json "
            "of 'search --out', or 'estimate --out').The scripts need MEGATRON_LM_DIR (a "
            "Megatron-LM checkout) on every node; without --data-path they train on "
            "--mock-data for 100 iterations.",
            plan_commands.add_launch_arguments, plan_commands.run_launch, INPUT_EPILOG,
            examples=(
                "configurator launch --plan plan/plan.json --out run/",
                "configurator launch --plan plan/plan.json --out run/ --data-path "
                "/data/corpus_text_document --tokenizer-model meta-llama/Meta-Llama-3-70B")),
    Command("explain", "show where two saved plans differ in time and memory",
            "Compare two saved plans (plan.json of 'search --out' or 'estimate --out', or "
            "entry N of a plans.json as plans.json:N):a headline (which is faster, by how "
            "much, the terms that differ most), then iteration time and each term of its "
            "breakdown, each stage's simulated time, throughput and memory per pipeline "
            "stage, with B - A.",
            plan_commands.add_explain_arguments, plan_commands.run_explain, INPUT_EPILOG,
            examples=("configurator explain plan/plans.json:1 plan/plans.json:2",
                      "configurator explain plan/plan.json mine.json --json")),
    Command("validate", "compare predicted with measured iteration times of real runs",
            "Price measured runs (run files or Megatron-LM logs; default: the published runs "
            "that ship with the tool) as 'estimate' would and report, per group, the mean "
            "absolute percentage error, the worst run and Spearman's rank correlation; "
            "--out writes an HTML report with a predicted-vs-measured scatter plot.",
            validate_commands.add_validate_arguments, validate_commands.run_validate,
            INPUT_EPILOG,
            examples=("configurator validate",
                      "configurator validate my-runs.csv --all-runs",
                      "configurator validate --cluster dgx-h100-80gb train.log --out "
                      "report.html")),
    Command("calibrate", "fit a GPU's efficiencies to measured runs",
            "Fit, per GPU type and precision, the GEMM and fused-attention efficiencies, "
            "the host time per operation and the intra- and inter-node link efficiencies "
            "(and the attained HBM fraction of the memory-bound kernels beside one that "
            "alone would leave its range) to "
            "measured runs by bounded, multi-start least squares within each parameter's "
            "physically plausible range (no efficiency above 1; runs of one plan count as "
            "one, at the geometric mean of their times); report each fitted value "
            "with its 95 % interval, the error before and after and the leave-one-out error; "
            "refuse what the runs cannot determine over that whole range and name the kind "
            "of run that would (and, where nothing is fitted, each run's error at the "
            "presets); where the presets already predict the runs as well as a "
            "measured time repeats (a chi-squared test), or what the runs "
            "determine predicts the runs left out no better than the presets, keep every "
            "preset (an empty calibration, exit 0). Use "
            "the file with search/estimate/validate --calibration.",
            validate_commands.add_calibrate_arguments, validate_commands.run_calibrate,
            INPUT_EPILOG,
            examples=("configurator calibrate -o calib.yaml",
                      "configurator calibrate my-runs.csv -o calib.yaml && configurator "
                      "validate my-runs.csv --calibration calib.yaml")),
    Command("trial", "choose the few short runs that best settle the ranking",
            "For a job (model, cluster, global batch), from the plans the search keeps or "
            "those of --plans: the best plans whose predicted times are within the "
            "uncertainty of their difference, plus the runs that pin down the parameters "
            "their order depends on (GEMM-bound, attention-bound, host-bound, "
            "communication-heavy), chosen by the sensitivity of every plan's time to each "
            "parameter in the cost model, none more than "
            f"{PROBE_MAX_SLOWDOWN:g} times the best plan's time. --out "
            "writes their launch scripts (mock data, a few dozen iterations; an MoE plan "
            "routed by its scores runs with --moe-router-force-load-balancing, as a router "
            "so young does not route as a trained one); then calibrate on their logs and "
            "search "
            "--calibration re-ranks.",
            trial_command.add_trial_arguments, trial_command.run_trial_command, PLAN_EPILOG,
            examples=("configurator trial --model llama3-8b --cluster dgx-h100-80gb "
                      "--nodes 2 --gbs 128 --out trial/",
                      "configurator trial --model llama3-70b --cluster dgx-h100-80gb "
                      "--nodes 16 --gbs 512 --plans plan/plans.json --runs 4 --out trial/"),
            usage="configurator trial --model M --cluster C --gbs G [--nodes N] [--plans "
                  "FILE] [--runs K] [--out DIR] [options]"),
    Command("profile", "time one transformer layer with torch (CUDA or CPU)",
            "Time one transformer layer's forward and backward with torch on the local device "
            "(CUDA when present, else the CPU) at the per-rank shapes of each --tp/--cp/--mbs "
            "and the host's time to issue one eager operation, write the profile "
            "(estimate/search --profile use it instead of the analytic layer compute and the "
            "preset host time per operation) and, on a GPU, compare it with the analytic "
            "layer time.",
            profile_command.add_profile_arguments, profile_command.run_profile, INPUT_EPILOG,
            examples=("configurator profile --model llama3-8b --tp 1 2 4 8",
                      "configurator profile --model llama3-8b --tp 1 2 --precision fp8 "
                      "-o prof.yaml && configurator search ... --profile prof.yaml")),
    Command("topology", "import and inspect measured cluster topologies",
            "Measured topology files: import nccl-tests logs, nvidia-smi topo -m output and "
            "probe results.",
            _topology_group, None,
            examples=("configurator topology import ex/h100-17node-nccl-tests -o topo.json",)),
    Command("probe", "print the torchrun command that measures links (or run it under "
            "torchrun)",
            "Print the torchrun command that runs the bandwidth probe on every node "
            "(node_rank from $NODE_RANK, or $SLURM_NODEID with --slurm).Started by torchrun "
            "itself (torchrun ... --no-python configurator probe --out FILE) it runs the "
            "probe, python -m topology.probe.",
            probe_command.add_probe_arguments, probe_command.run_probe, INPUT_EPILOG,
            examples=("configurator probe --nnodes 4 --nproc-per-node 8",
                      "configurator probe --nnodes 4 --nproc-per-node 8 --slurm")),
    Command("audit", "audit measured cluster links (slow links, slow nodes, missing pairs)",
            "Audit a measured topology: per link class (intra/inter-node, method, GPUs per "
            "host) a robust baseline (median, scaled MAD); flag slow links (< 80 % of the "
            "median and robust z < -4), asymmetric pairs (> 20 % apart), hosts slow with "
            "half or more of their partners, and host pairs never measured. Exit 0 with a "
            "report even when problems are found.",
            audit_command.add_audit_arguments, audit_command.run_audit, INPUT_EPILOG,
            examples=("configurator audit --topology topo.json",
                      "configurator audit ex/h100-17node-nccl-tests --out audit/",
                      "configurator audit --topology topo.json --model llama3-70b --gbs 512 "
                      "--json")),
    Command("plan", "from measured links to launch scripts in one command",
            "Import nccl-tests logs (or read a topology file), audit them, search with the "
            "ranks placed on the measured links (leaving out the hosts the audit flags when "
            "that is faster), price what each finding costs the chosen plan, and write the "
            "launch scripts, plan.json and report.html (the audit with its structure and "
            "costs, the placement on the islands, the schedule, the scaling curve).",
            cluster_plan_command.add_plan_arguments, cluster_plan_command.run_plan_command,
            PLAN_EPILOG,
            examples=(
                "configurator plan --model llama3-70b --gbs 512 --logs "
                "ex/h100-17node-nccl-tests --out job/",
                "configurator plan --model llama3-70b --gbs 512 --topology topo.json "
                "--nodes 16 --precision fp8 --out job/"),
            usage="configurator plan --model M --gbs G (--logs PATH... | --topology FILE) "
                  "--out DIR [--nodes N] [options]"),
    Command("examples", "copy the example inputs that ship with the tool",
            "List the example inputs that ship with the tool, or copy them into a directory "
            "(--out): real nccl-tests logs of a 17-node H100 cluster,a small measured "
            "topology, a model file, a cluster file and the published runs as a run file.",
            examples_command.add_examples_arguments, examples_command.run_examples,
            INPUT_EPILOG,
            examples=("configurator examples", "configurator examples --out ex")),
)
