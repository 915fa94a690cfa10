"""The probe's schedule (circle method), step plan, result → Topology conversion and the
printed torchrun command (no torch)."""

import argparse
import shlex
import shutil
import subprocess
from itertools import combinations

import pytest

from configurator.core.errors import InputError
from topology.probe_plan import (INTER_LINK_CLASS, INTRA_LINK_CLASS, Step, add_probe_options,
                                 build_topology, check_probe_options, circle_rounds,
                                 describe_transfer, missing_for, plan_steps, torchrun_command)


@pytest.mark.parametrize("n", range(2, 18))
def test_circle_every_pair_once_in_disjoint_rounds(n):
    rounds = circle_rounds(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [p for r in rounds for p in r]
    assert sorted(seen) == list(combinations(range(n), 2))  # every pair exactly once
    for r in rounds:
        members = [x for p in r for x in p]
        assert len(members) == len(set(members))            # disjoint within a round
        assert len(r) == n // 2                               # all busy but the bye
        assert all(a < b for a, b in r)


@pytest.mark.parametrize("n", [3, 5, 7, 9])
def test_circle_odd_gives_each_node_one_bye(n):
    idle = [set(range(n)) - {x for p in r for x in p} for r in circle_rounds(n)]
    assert all(len(s) == 1 for s in idle)
    assert sorted(x for s in idle for x in s) == list(range(n))


def test_circle_small_and_bad():
    assert circle_rounds(0) == [] and circle_rounds(1) == []
    assert circle_rounds(2) == [[(0, 1)]]
    with pytest.raises(ValueError):
        circle_rounds(-1)


def _participants(step):
    return [r for t in step.transfers for r in t] + [r for g in step.groups for r in g]


@pytest.mark.parametrize("nodes,G,nccl", [(4, 1, False), (3, 2, False), (2, 4, True),
                                           (5, 3, True), (1, 4, True), (1, 1, False)])
def test_plan_steps_cover_everything_without_sharing_a_rank(nodes, G, nccl):
    steps = plan_steps(nodes, G, intra_p2p=nccl)
    for s in steps:
        ranks = _participants(s)
        assert len(ranks) == len(set(ranks)), s.name          # one role per rank and step
        assert all(0 <= r < nodes * G for r in ranks)
    by_kind = {}
    for s in steps:
        by_kind.setdefault(s.kind, []).extend(s.transfers)
    # host level: local rank 0 of every ordered node pair, once
    host = sorted((s // G, d // G) for s, d in by_kind.get("host", []))
    assert host == sorted((a, b) for a in range(nodes) for b in range(nodes) if a != b)
    assert all(s % G == 0 and d % G == 0 for s, d in by_kind.get("host", []))
    # rails: rail i of every ordered node pair, once, only with G > 1
    rail = sorted((s // G, d // G, s % G) for s, d in by_kind.get("rail", []))
    want = sorted((a, b, i) for a in range(nodes) for b in range(nodes) if a != b
                  for i in range(G)) if G > 1 else []
    assert rail == want
    assert all(s % G == d % G for s, d in by_kind.get("rail", []))
    # intra: every ordered local pair on every node, NCCL only
    intra = sorted((s // G, s % G, d % G) for s, d in by_kind.get("intra", []))
    want = sorted((h, i, j) for h in range(nodes) for i in range(G) for j in range(G)
                  if i != j) if nccl else []
    assert intra == want
    assert all(s // G == d // G for s, d in by_kind.get("intra", []))
    ar = [s for s in steps if s.kind == "all_reduce"]
    assert len(ar) == (1 if G > 1 else 0)
    if ar:
        assert ar[0].groups == tuple(tuple(range(h * G, h * G + G)) for h in range(nodes))


def test_host_rounds_measure_both_directions_in_consecutive_steps():
    steps = [s for s in plan_steps(4, 1, False) if s.kind == "host"]
    assert len(steps) == 2 * 3
    for fwd, bwd in zip(steps[::2], steps[1::2]):
        assert sorted(fwd.transfers) == sorted((d, s) for s, d in bwd.transfers)
        assert len(fwd.transfers) == 2                         # 2 disjoint pairs at once


def test_step_roles_and_reporters():
    s = Step("x", "host", ((0, 2), (3, 1)))
    assert s.role(0) == ("send", 2) and s.role(2) == ("recv", 0)
    assert s.role(1) == ("recv", 3) and s.role(4) is None
    assert s.reporters() == (2, 1)
    g = Step("ar", "all_reduce", groups=((0, 1), (2, 3)))
    assert g.role(3) == ("group", (2, 3)) and g.reporters() == (0, 2)


def test_build_topology_records():
    hosts, G = ["a", "b"], 2
    steps = plan_steps(2, G, intra_p2p=True)
    results = {}
    for k, s in enumerate(steps):
        for src, dst in s.transfers:
            results[(k, dst)] = {"samples_Bps": [3e9, 1e9, 2e9], "latency_s": 5e-6}
        for grp in s.groups:
            results[(k, grp[0])] = {"busbw_samples_Bps": [4e9, 6e9, 5e9]}
    # one transfer without a result is left out (its caller lists it as missing)
    first_host = next(k for k, s in enumerate(steps) if s.kind == "host")
    del results[(first_host, steps[first_host].transfers[0][1])]
    topo = build_topology(hosts=hosts, gpus_per_node=G, steps=steps, results=results,
                          backend="nccl", message_bytes=32_000_000, timestamp="t")
    assert topo.hosts == ("a", "b") and topo.gpus_per_host == 2
    intra = [l for l in topo.links if l.src == l.dst]
    assert len(intra) == 2 * 2 and all(l.link_class == INTRA_LINK_CLASS for l in intra)
    host = [l for l in topo.links if l.src != l.dst and l.src_gpu is None]
    assert len(host) == 1                                       # 2 directions, 1 lost
    assert host[0].gpus_per_host == 1 and host[0].rails_used == 1
    rail = [l for l in topo.links if l.src != l.dst and l.src_gpu is not None]
    assert {(l.src, l.dst, l.src_gpu, l.dst_gpu) for l in rail} == {
        ("a", "b", 0, 0), ("a", "b", 1, 1), ("b", "a", 0, 0), ("b", "a", 1, 1)}
    assert all(l.gpus_per_host == 2 and l.link_class == INTER_LINK_CLASS for l in rail)
    for l in topo.links:
        assert l.bandwidth_Bps == 2e9                           # median of the samples
        assert l.samples_Bps == (3e9, 1e9, 2e9) and l.latency_s == 5e-6
        assert l.method == "probe nccl send/recv" and l.message_bytes == 32_000_000
    assert [(c.hosts, c.busbw_Bps, c.gpus_per_host) for c in topo.collectives] == [
        (("a",), 5e9, 2), (("b",), 5e9, 2)]


def test_missing_and_description():
    hosts, G = ["a", "b", "c"], 2
    step = [s for s in plan_steps(3, G, False) if s.kind == "rail"][0]
    s0, d0 = step.transfers[0]
    assert describe_transfer(step, s0, d0, hosts, G) == \
        f"{hosts[s0 // G]}/gpu{s0 % G} -> {hosts[d0 // G]}/gpu{d0 % G}"
    host_step = [s for s in plan_steps(3, G, False) if s.kind == "host"][0]
    hs, hd = host_step.transfers[0]
    assert describe_transfer(host_step, hs, hd, hosts, G) == f"{hosts[hs // 2]} -> {hosts[hd // 2]}"
    done = {d for _, d in step.transfers[1:]}                   # all but the first reported
    miss = missing_for(step, done, hosts, G, "why")
    assert [(m.src, m.dst, m.reason) for m in miss] == [(hosts[s0 // G], hosts[d0 // G], "why")]
    ar = Step("ar", "all_reduce", groups=((0, 1), (2, 3)))
    assert [(m.src, m.dst) for m in missing_for(ar, {0}, hosts, G, "r")] == [("b", "b")]


# -- the printed torchrun command: quoting ---------------------------------------------------

#: Values a user (or a script) might pass; none may run anything where the command runs.
HOSTILE = ["$(touch PWNED)", "`touch PWNED`", "n001; touch PWNED", "'; touch PWNED; '",
           "$X; touch PWNED", "${IFS}touch${IFS}PWNED", "a b", "$HOME/x", '"$(touch PWNED)"',
           "n001 && touch PWNED #", "$MASTER_ADDR$(touch PWNED)", "~root", "*"]


def _cmd_args(**kw) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_probe_options(p, out_required=False)
    args = p.parse_args([])
    base = dict(nnodes=2, nproc_per_node=4, master_addr="$MASTER_ADDR", master_port=29500,
                slurm=False)
    for k, v in {**base, **kw}.items():
        setattr(args, k, v)
    return args


STUBS = r'''
torchrun() { printf '%s\n' "$@" > "$ARGS_OUT"; }
srun() { shift 2; "$@"; }          # drop --ntasks-per-node 1, run the rest "on the node"
export -f torchrun
'''


def _run_in_bash(line: str, tmp_path, **env) -> list[str]:
    """Run the printed ``line`` in bash with ``torchrun`` (and ``srun``) stubbed: the words
    torchrun receives."""
    args_out = tmp_path / "args.txt"
    full = {"PATH": "/usr/bin:/bin", "ARGS_OUT": str(args_out), "HOME": str(tmp_path), **env}
    res = subprocess.run(["bash", "-c", STUBS + line], cwd=tmp_path, env=full,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return args_out.read_text().split("\n")[:-1]


def _master_addr(words: list[str]) -> str:
    return words[words.index("--master-addr") + 1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("slurm", [False, True])
def test_master_addr_variable_expands_to_one_word_on_the_node(tmp_path, slurm):
    for given, want in (("$MASTER_ADDR", "10.0.0.1 weird"), ("${MASTER_ADDR}", "10.0.0.1 weird"),
                        ("$HEAD_NODE", "n-007")):
        line = torchrun_command(_cmd_args(master_addr=given, slurm=slurm))
        var = given.strip("${}")
        assert f'--master-addr "{given}"' in line
        words = _run_in_bash(line, tmp_path, **{var: want, "NODE_RANK": "1",
                                                "SLURM_NODEID": "1"})
        assert _master_addr(words) == want                     # one word, expanded there
        assert words[words.index("--node-rank") + 1] == "1"
        if not slurm:   # what a shell-unaware reader sees: the variable, as one word
            assert _master_addr(shlex.split(line)) == given


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("slurm", [False, True])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_master_addr_is_one_literal_word(tmp_path, slurm, value):
    line = torchrun_command(_cmd_args(master_addr=value, slurm=slurm, out="o'; touch PWNED",
                                      expected_hosts="$(touch PWNED),b"))
    words = _run_in_bash(line, tmp_path, MASTER_ADDR="m", X="x", NODE_RANK="0",
                         SLURM_NODEID="0")
    assert not (tmp_path / "PWNED").exists(), line
    assert _master_addr(words) == value, line                  # passed on literally
    assert words[words.index("--out") + 1] == "o'; touch PWNED"
    assert words[words.index("--expected-hosts") + 1] == "$(touch PWNED),b"
    if slurm:
        inner = shlex.split(line)
        assert inner[:5] == ["srun", "--ntasks-per-node", "1", "bash", "-c"] and len(inner) == 6
        assert _master_addr(shlex.split(inner[5])) == value
    else:
        assert _master_addr(shlex.split(line)) == value


@pytest.mark.parametrize("field,value", [("master_addr", "n001\ntouch PWNED"),
                                         ("master_addr", ""), ("master_addr", "a\rb"),
                                         ("out", "topo.json\nrm -rf x"),
                                         ("expected_hosts", "h0,h1\u2028x"),
                                         ("expected_hosts", "h0,\x1b[31mh1")])
def test_multi_line_values_are_refused_on_one_line(field, value):
    with pytest.raises(InputError) as exc:
        torchrun_command(_cmd_args(**{field: value}))
    text = str(exc.value)
    assert text.startswith(field) and text.isprintable(), text
    if field != "master_addr":
        with pytest.raises(InputError):
            check_probe_options(_cmd_args(**{field: value}))
