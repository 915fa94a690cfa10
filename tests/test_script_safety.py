"""Script safety: ``configurator launch --plan plan.json`` fed plan documents and data paths
that carry shell-injection payloads.

Every field of a plan document (model name and sizes, plan fields, cluster name and GPU,
estimate figures, tool fields, the placement's hosts, GPU order, excluded hosts, figures and
method, and extra keys) and every ``--data-path`` / ``--tokenizer-model`` word (of a plan with
and without a placement) gets each payload of :data:`PAYLOADS` in turn. Each case is either

(a) refused: exit code 2, exactly one line on stderr (no control character, escape or Unicode
    line separator), nothing written; or
(b) rendered: the torchrun and SLURM scripts are then run with stand-in ``torchrun``,
    ``srun``, ``scontrol`` and ``hostname`` (and logging shims for ``touch``, ``id``, ``rm``, ``sh``…) in a
    fresh directory, and must exit 0 with empty stderr, create no file ``PWNED`` (every
    payload creates one if any part of it runs), call nothing but the stand-ins, and hand
    torchrun exactly the intended argv (:func:`launchers.megatron_flags.flag_argv` of the
    plan, with the data words as given).

Many accepted cases render byte-identical scripts (a payload in a field the scripts do not
show, such as ``cluster.name``); each distinct pair of scripts (with its data words) is run
once and its result stands for every case that rendered it. ``SCRIPT_SAFETY_RUN_ALL=1`` runs
the scripts of every accepted case instead (slower). The accepted scripts also pass
``shellcheck`` where it is installed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from configurator.core.document import placement_record, read_plan_document
from launchers import SLURM_FILE, TORCHRUN_FILE
from launchers.megatron_flags import (DATA_PATHS_VAR, DEFAULT_TOKENIZER_TYPE, flag_argv,
                                      megatron_flags)
from tests.test_launchers import FAKE_HOSTNAME, FAKE_SCONTROL, FAKE_SRUN, FAKE_TORCHRUN

ROOT = Path(__file__).resolve().parents[1]

#: Each payload creates a file ``PWNED`` (by ``touch`` or a redirection) if any part of it
#: is ever run by a shell, or changes torchrun's argv if it is expanded (globs, ``~``).
PAYLOADS: tuple[str, ...] = (
    "$(touch PWNED)",
    "`touch PWNED`",
    "x;touch PWNED",
    "x; touch PWNED #",
    "x && touch PWNED",
    "x || touch PWNED",
    "x | touch PWNED",
    "x & touch PWNED &",
    "x > PWNED",
    "x\ntouch PWNED",
    "x\r\ntouch PWNED",
    "x\rtouch PWNED",
    "x\u2028touch PWNED",
    "x\u2029touch PWNED",
    "x\x85touch PWNED",
    "x\x0btouch PWNED",
    "x\x1b[2J\x1b]0;$(touch PWNED)\x07",
    "x\x00touch PWNED",
    "'; touch PWNED; '",
    "\"; touch PWNED; \"",
    "\\'$(touch PWNED)\\'",
    "'\"$(touch PWNED)\"'",
    "${IFS}$(touch${IFS}PWNED)",
    "$((0))$(touch PWNED)",
    "x\u202e$(touch PWNED)",
    "$'\\ntouch PWNED'",
    "*",
    "~",
    "-x;touch PWNED",
    "a b\tc; touch PWNED",
    "' \" ` $ \\ ; & | < > ( ) { } [ ] * ? ~ ! # $(touch PWNED)",
)

#: Commands a payload might run; each is a shim on PATH that logs its call (``touch`` also
#: creates the file, so that an injected ``touch PWNED`` is seen twice).
SHIMS = ("touch", "id", "rm", "sh", "cat", "curl", "wget", "whoami", "uname", "ls", "x", "a")

LOG_CALL = 'printf "%s\\n" "{name}" >> "$FAKE_OUT/calls"\n'
SHIM = """#!/bin/bash
printf "%s\\n" "$(basename "$0") $*" >> "$FAKE_OUT/calls"
if [[ "$(basename "$0")" == touch ]]; then exec /usr/bin/touch "$@"; fi
"""


def _stand_in(name: str, text: str) -> str:
    first, rest = text.split("\n", 1)
    return first + "\n" + LOG_CALL.format(name=name) + rest.replace("env -0", "/usr/bin/env -0")


@dataclass
class Case:
    """One payload case: what was changed, the CLI result and, if rendered, the runs."""

    where: str
    payload: str
    argv: list[str]
    data: list[str] | None = None
    tokenizer: str | None = None
    code: int | None = None
    stderr: str = ""
    out: Path | None = None
    placed: bool = False                  # the plan document carries a placement
    runs: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, val in obj.items():
            yield from _leaves(val, path + (k,))
    elif isinstance(obj, list):
        for i, val in enumerate(obj):
            yield from _leaves(val, path + (i,))
    else:
        yield path


def _mappings(obj, path=()):
    if isinstance(obj, dict):
        yield path
        for k, val in obj.items():
            yield from _mappings(val, path + (k,))


def _get(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def _cli(argv: list[str]) -> tuple[int, str]:
    """``configurator <argv>`` in this process: exit code and stderr."""
    from configurator.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:             # argparse's own errors
            code = exc.code
    return code, err.getvalue()


class Harness:
    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.mdir = root / "Megatron LM $(touch PWNED) `x`"
        for d in (self.bin, self.mdir):
            d.mkdir()
        (self.mdir / "pretrain_gpt.py").write_text("")
        for name, text in (("torchrun", FAKE_TORCHRUN), ("srun", FAKE_SRUN),
                           ("scontrol", FAKE_SCONTROL), ("hostname", FAKE_HOSTNAME)):
            (self.bin / name).write_text(_stand_in(name, text))
        for name in SHIMS:
            (self.bin / name).write_text(SHIM)
        for p in self.bin.iterdir():
            p.chmod(0o755)
        code, err = _cli(["search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                          "--nodes", "2", "--gbs", "64", "--top", "1", "--out",
                          str(root / "base")])
        assert code == 0, err
        self.doc = json.loads((root / "base" / "plan.json").read_text())
        base = read_plan_document(self.doc)
        self.model, self.plan = base.model, base.plan
        self.nodes, self.gpus = base.nodes, base.gpus_per_node
        assert self.nodes == 2
        # node_rank 0 on n1 (not SLURM's first node), GPUs reversed on it, n2 left out
        g = self.gpus
        self.placed_doc = dict(self.doc, placement=placement_record(
            ["n1", "n0"], [list(range(g))[::-1], list(range(g))], ["n2"], "optimized",
            iteration_time_s=1.0, default_iteration_time_s=1.5,
            random_median_iteration_time_s=2.0))

    def flags(self, data, tok) -> list[str]:
        groups = megatron_flags(self.model, self.plan, data_path=data)
        return flag_argv(groups, {DATA_PATHS_VAR: data or [],
                                  "TOKENIZER_TYPE": DEFAULT_TOKENIZER_TYPE,
                                  "TOKENIZER_MODEL": tok or ""})

    def cases(self) -> list[Case]:
        out: list[Case] = []
        n = 0

        def new_dir():
            nonlocal n
            n += 1
            d = self.root / "cases" / str(n)
            d.mkdir(parents=True)
            return d

        def plan_case(where, doc, payload):
            d = new_dir()
            (d / "plan.json").write_text(json.dumps(doc))
            out.append(Case(where, payload, ["launch", "--plan", str(d / "plan.json"),
                                             "--out", str(d / "out")], out=d / "out",
                            placed="placement" in doc))

        for payload in PAYLOADS:
            placement = self.placed_doc["placement"]
            for path in _leaves(placement, ("placement",)):
                doc = copy.deepcopy(self.placed_doc)
                _get(doc, path[:-1])[path[-1]] = payload
                plan_case(".".join(map(str, path)), doc, payload)
            for key in ("hosts", "gpu_order", "excluded_hosts"):  # a whole list replaced
                doc = copy.deepcopy(self.placed_doc)
                doc["placement"][key] = payload
                plan_case(f"placement.{key}", doc, payload)
            doc = copy.deepcopy(self.placed_doc)                  # an unknown key
            doc["placement"][payload] = "x"
            plan_case("placement.<key>", doc, payload)
            for host_list in ("hosts", "excluded_hosts"):  # an extra hostile host
                doc = copy.deepcopy(self.placed_doc)
                doc["placement"][host_list].append(payload)
                plan_case(f"placement.{host_list}.<extra>", doc, payload)
            for path in _leaves(self.doc):
                doc = copy.deepcopy(self.doc)
                _get(doc, path[:-1])[path[-1]] = payload
                plan_case(".".join(map(str, path)), doc, payload)
            for path in _mappings(self.doc):
                doc = copy.deepcopy(self.doc)
                _get(doc, path)[payload] = "x"
                plan_case(".".join(map(str, path)) + ".<key>", doc, payload)
            for where, data, tok in (("data_path", [payload], "tok"),
                                     ("data_path blend", ["0.5", payload, "0.5", "/b c"], "t"),
                                     ("data_path paths", ["/a", payload], "t"),
                                     ("tokenizer_model", ["/data/x"], payload)):
                d = new_dir()
                (d / "plan.json").write_text(json.dumps(self.doc))
                out.append(Case(where, payload,
                                ["launch", "--plan", str(d / "plan.json"), "--out",
                                 str(d / "out"), "--data-path", *data, "--tokenizer-model",
                                 tok], data=data, tokenizer=tok, out=d / "out"))
            d = new_dir()                          # data words with a placement too
            (d / "plan.json").write_text(json.dumps(self.placed_doc))
            out.append(Case("placed data_path", payload,
                            ["launch", "--plan", str(d / "plan.json"), "--out", str(d / "out"),
                             "--data-path", "0.5", payload, "0.5", "/b", "--tokenizer-model",
                             payload], data=["0.5", payload, "0.5", "/b"], tokenizer=payload,
                            out=d / "out", placed=True))
        return out

    def run(self, case: Case, script: str, args: list[str], extra_env: dict) -> None:
        """Run one generated script in its case directory; record problems."""
        fake_out = case.out.parent / f"fake_{script}"
        fake_out.mkdir()
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", "MEGATRON_LM_DIR": str(self.mdir),
               "FAKE_OUT": str(fake_out), "HOME": str(case.out.parent), **extra_env}
        res = subprocess.run(["bash", str(case.out / script), *args], capture_output=True,
                             text=True, env=env, cwd=case.out.parent, timeout=60)
        case.runs.append(script)
        if res.returncode != 0 or res.stderr:
            case.problems.append(f"{script}: exit {res.returncode}: {res.stderr[-300:]!r}")
            return
        calls = (fake_out / "calls").read_text().splitlines()
        slurm = script == SLURM_FILE
        if case.placed:       # node ranks from hostname; the master is node_rank 0's host
            want = (["srun"] + ["hostname", "torchrun"] * 2 if slurm
                    else ["hostname", "torchrun"])
        else:
            want = ["scontrol", "srun", "torchrun", "torchrun"] if slurm else ["torchrun"]
        if calls != want:
            case.problems.append(f"{script}: commands run {calls}, expected {want}")
        flags = self.flags(case.data, case.tokenizer)
        main = ["--nnodes", str(self.nodes), "--nproc-per-node", str(self.gpus)]
        ranks = ["0", "1"] if slurm else (["1"] if case.placed else ["0"])
        master = "n1" if case.placed else "n0"
        for rank in ranks:
            if slurm:
                want_argv = ["--node-rank", rank, *main, "--master-addr", master,
                             "--master-port", "29500"]
            else:
                want_argv = [*main, "--node-rank", rank, "--master-addr", master,
                             "--master-port", "29500"]
            want_argv += [f"{self.mdir}/pretrain_gpt.py", *flags]
            got_file = fake_out / f"argv.{rank}"
            got = ([w.decode() for w in got_file.read_bytes().split(b"\0")[:-1]]
                   if got_file.exists() else None)
            if got != want_argv:
                case.problems.append(f"{script} rank {rank}: argv differs: {got!r}")


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    import configurator.cli as cli

    root = tmp_path_factory.mktemp("safety")
    h = Harness(root)
    cases = h.cases()
    parser = cli.build_parser()       # main() unchanged, its parser built once (argparse
    real_build = cli.build_parser     # parsers are reusable): 4x faster
    cli.build_parser = lambda: parser
    try:
        for case in cases:
            case.code, case.stderr = _cli(case.argv)
    finally:
        cli.build_parser = real_build
    accepted = [c for c in cases if c.code == 0]
    run_all = os.environ.get("SCRIPT_SAFETY_RUN_ALL") == "1"
    groups: dict[object, list[Case]] = {}
    for i, c in enumerate(accepted):
        key = i if run_all else ((c.out / TORCHRUN_FILE).read_bytes(),
                                 (c.out / SLURM_FILE).read_bytes(), tuple(c.data or ()),
                                 c.tokenizer)
        groups.setdefault(key, []).append(c)

    def run_both(group: list[Case]) -> None:
        case = group[0]
        if case.placed:                  # this "node" is n0: node_rank 1 by the table
            h.run(case, TORCHRUN_FILE, [], {"FAKE_HOSTNAME": "n0"})
        else:
            h.run(case, TORCHRUN_FILE, ["0"], {"MASTER_ADDR": "n0"})
        h.run(case, SLURM_FILE, [], {"SLURM_JOB_NODELIST": "n0,n1", "FAKE_NODES": "n0 n1"})
        for other in group[1:]:                  # byte-identical scripts, same data words
            other.problems = case.problems

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        list(ex.map(run_both, groups.values()))
    pwned = sorted(str(p.relative_to(root)) for p in root.rglob("*PWNED*"))
    # the fake Megatron directory's own name holds "$(touch PWNED)": not a created file
    pwned = [p for p in pwned if not p.startswith("Megatron LM")]
    runs = sum(len(c.runs) for c in accepted)
    summary = (f"script safety: {len(PAYLOADS)} payloads x {len(cases) // len(PAYLOADS)} "
               f"places = {len(cases)} payload cases; {len(cases) - len(accepted)} refused "
               f"(exit 2, one line); {len(accepted)} rendered, {len(groups)} distinct script "
               f"pairs run ({runs} script executions); {len(pwned)} PWNED files; "
               f"{sum(bool(c.problems) for c in accepted)} cases with problems")
    print("\n" + summary)
    return {"harness": h, "cases": cases, "accepted": accepted, "pwned": pwned,
            "runs": runs, "groups": len(groups), "summary": summary}


def test_payload_cases_cover_every_field(outcome):
    h, cases = outcome["harness"], outcome["cases"]
    places = {c.where for c in cases}
    for path in _leaves(h.doc):
        assert ".".join(map(str, path)) in places
    for must in ("model.name", "cluster.name", "cluster.gpu", "plan.tp",
                 "plan.sequence_parallel", "estimate.iteration_time_s", "estimate.mfu",
                 "data_path", "data_path blend", "tokenizer_model"):
        assert must in places
    assert len(cases) >= 2000
    placement_leaves = {".".join(map(str, p))
                        for p in _leaves(h.placed_doc["placement"], ("placement",))}
    assert placement_leaves <= places and "placement.hosts.1" in places
    assert "placement.gpu_order.0.0" in places and "placement.method" in places
    # no payload is a host name, GPU index, figure or method: every one is refused
    assert all(c.code == 2 for c in cases if c.where.startswith("placement"))
    placed = [c for c in outcome["accepted"] if c.placed]
    assert placed and all(c.where == "placed data_path" for c in placed)
    # both outcomes are exercised: printable names and data paths are accepted
    assert {c.where for c in outcome["accepted"]} >= {"model.name", "cluster.name",
                                                        "data_path", "data_path blend",
                                                        "tokenizer_model"}


def test_refused_payloads_exit_2_with_one_line(outcome):
    bad = []
    for c in outcome["cases"]:
        if c.code == 0:
            continue
        lines = c.stderr.splitlines()
        if (c.code != 2 or len(lines) != 1 or not c.stderr.endswith("\n")
                or "\x1b" in c.stderr or not lines[0].startswith("configurator")):
            bad.append((c.where, c.payload, c.code, c.stderr))
        elif c.out.exists():
            bad.append((c.where, c.payload, "wrote files", sorted(os.listdir(c.out))))
    assert bad == [], bad[:5]


def test_line_breaks_and_controls_are_refused_in_data_words(outcome):
    for c in outcome["cases"]:
        if c.where in ("data_path", "data_path blend", "data_path paths", "tokenizer_model",
                       "model.name", "cluster.name", "cluster.gpu"):
            if any(ch in c.payload for ch in "\n\r\x00\x0b\x1b\x85\u2028\u2029\u202e\t"):
                assert c.code == 2, (c.where, c.payload)


def test_no_payload_ever_runs(outcome):
    assert outcome["pwned"] == []
    problems = [(c.where, c.payload, c.problems) for c in outcome["accepted"] if c.problems]
    assert problems == [], problems[:5]
    assert outcome["runs"] == 2 * outcome["groups"] and outcome["groups"] > 50
    print(outcome["summary"])


def test_real_entry_point_matches(outcome, tmp_path):
    """A sample through the installed command line (a subprocess), not only main()."""
    h = outcome["harness"]
    doc = copy.deepcopy(h.doc)
    doc["model"]["name"] = "$(touch PWNED)`touch PWNED`;x"
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    res = subprocess.run([sys.executable, "-m", "configurator", "launch", "--plan",
                          str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"),
                          "--data-path", "0.5", "/a $(touch PWNED)", "0.5", "/b;c",
                          "--tokenizer-model", "`touch PWNED`"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    doc["model"]["name"] = "x\ntouch PWNED"
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    res = subprocess.run([sys.executable, "-m", "configurator", "launch", "--plan",
                          str(tmp_path / "plan.json"), "--out", str(tmp_path / "o2")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
    assert not list(tmp_path.rglob("PWNED")) and not (tmp_path / "o2").exists()


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck not installed (apt-get install shellcheck)")
def test_accepted_scripts_pass_shellcheck(outcome, tmp_path):
    texts = {}
    for c in outcome["accepted"]:
        for name in (TORCHRUN_FILE, SLURM_FILE):
            text = (c.out / name).read_text()
            texts.setdefault(text, f"{len(texts)}_{name}")
    paths = []
    for text, name in texts.items():
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    for i in range(0, len(paths), 200):
        res = subprocess.run(["shellcheck", *paths[i:i + 200]], capture_output=True, text=True,
                             timeout=600)
        assert res.returncode == 0, res.stdout[:3000]
    assert len(paths) > 10
