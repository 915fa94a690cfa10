"""Tests for launchers/: torchrun and SLURM scripts, fake runs, file writing."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from configurator.core.errors import InputError
from launchers import (BRIDGE_FILE, SLURM_FILE, TORCHRUN_FILE, render_slurm_script, render_torchrun_script,
                       write_launch_files)
from launchers import files as launcher_files
from launchers.megatron_flags import flag_argv, megatron_flags
from tests.megatron_argv import (GPT3, GPT3_PLAN, SMALL, SMALL_PLAN,
                                 assert_validate_args_rules, parse_argv)


def bash_syntax_ok(text: str, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("kw", [
    {},
    {"hosts": ["node-a", "node-b"]},
    {"hosts": ["n1", "n2"], "cuda_visible_devices": [[3, 2, 1, 0], [0, 1, 2, 3]]},
    {"data_path": "/data/my corpus/$x", "tokenizer_model": "meta-llama/Llama-3 'x'"},
    {"data_path": ["0.3", "/data/a b", "0.7", "/data/$(c)"], "tokenizer_model": "gpt2"},
    {"data_path": "/data/x", "tokenizer_model": "gpt2", "master_addr": "10.0.0.1",
     "master_port": 1234,
     "extra_args": ["--log-throughput", "--exit-duration-in-mins", "5"],
     "summary": {"iteration_time_s": 1.5, "note": "multi\nline $(id)"}},
])
def test_scripts_pass_bash_n(kw, tmp_path):
    for render, name in ((render_torchrun_script, "t.sh"), (render_slurm_script, "s.sbatch")):
        text = render(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, **kw)
        bash_syntax_ok(text, tmp_path, name)
        assert text.startswith("#!/usr/bin/env bash\n")
        assert "set -euo pipefail" in text
        assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
        assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in text
        assert "tp=2 pp=2 dp=2 cp=1 vp=2 mbs=1 gbs=8" in text


def test_header_summary_is_comment_only(tmp_path):
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4,
                                  summary={"iteration_time_s": 1.25, "x": "a\nrm -rf /"})
    assert "#   iteration_time_s: 1.25" in text
    assert "\nrm -rf" not in text and "#   x: a rm -rf /" in text


def test_header_says_yarn_is_trained_as_plain_rope(tmp_path):
    """core_v0.16.1's pretrain_gpt.py cannot build YaRN RoPE without multi-latent attention
    (--position-embedding-type has no yarn, --rope-type yarn is MLA's): the script says it
    trains plain RoPE; a model without YaRN gets no such line."""
    yarn = dataclasses.replace(SMALL, position_embedding_type="rope",
                               yarn_rotary_scaling_factor=32.0)
    plain = dataclasses.replace(yarn, yarn_rotary_scaling_factor=None)
    for render, name in ((render_torchrun_script, "t.sh"), (render_slurm_script, "s.sbatch")):
        text = render(yarn, SMALL_PLAN, nodes=2, gpus_per_node=4)
        bash_syntax_ok(text, tmp_path, name)
        note = " ".join(line[2:].strip() for line in text.splitlines()
                        if line.startswith(("# note:", "#       ")) and "plan" not in line)
        assert "YaRN RoPE (factor 32) has no core_v0.16.1 flag" in note
        assert "trains plain RoPE" in note
        assert "# note:" not in render(plain, SMALL_PLAN, nodes=2, gpus_per_node=4)
        assert flag_argv(megatron_flags(yarn, SMALL_PLAN)) == \
            flag_argv(megatron_flags(plain, SMALL_PLAN))


@pytest.mark.parametrize("kw, field", [
    ({"nodes": 3}, "dp"),                                 # 12 GPUs do not fit tp2 pp2 dp2
    ({"nodes": 0}, "nodes"),
    ({"hosts": ["a"]}, "hosts"),
    ({"hosts": ["a", "a"]}, "hosts"),
    ({"hosts": ["a", "b c"]}, "hosts"),
    ({"hosts": ["a", "b'c"]}, "hosts"),
    ({"cuda_visible_devices": [[0, 1, 2, 3]]}, "cuda_visible_devices"),
    ({"cuda_visible_devices": [[0, 1, 2, 2], [0, 1, 2, 3]]}, "cuda_visible_devices"),
    ({"master_port": 70000}, "master_port"),
    ({"tokenizer_model": "gpt2"}, "tokenizer_model"),
    ({"data_path": ""}, "data_path"),
    ({"hosts": ["a\n", "b"]}, "hosts"),                  # re's $ would accept the newline
    ({"data_path": "/d"}, "tokenizer_model"),            # HuggingFaceTokenizer needs a model
    ({"data_path": "/a\nb", "tokenizer_model": "t"}, "data_path"),
    ({"data_path": "/a\u2028b", "tokenizer_model": "t"}, "data_path"),
    ({"data_path": "/a\x1bb", "tokenizer_model": "t"}, "data_path"),
    ({"data_path": " /a", "tokenizer_model": "t"}, "data_path"),
    ({"data_path": "-a", "tokenizer_model": "t"}, "data_path"),
    ({"data_path": [], "tokenizer_model": "t"}, "data_path"),
    ({"data_path": ["0.3", "/a", "/b"], "tokenizer_model": "t"}, "data_path"),
    ({"data_path": ["/a", "0.3", "/b", "0.7"], "tokenizer_model": "t"}, "data_path"),
    ({"data_path": ["-1", "/a"], "tokenizer_model": "t"}, "data_path"),
    ({"data_path": ["nan", "/a"], "tokenizer_model": "t"}, "data_path"),
    ({"data_path": "/a", "tokenizer_model": "t\nx"}, "tokenizer_model"),
    ({"master_addr": "a b"}, "master_addr"),
    ({"master_addr": "localhost"}, "master_addr"),       # 2 nodes: never a loopback default
    ({"master_addr": "127.0.1.1"}, "master_addr"),
    ({"master_addr": "LOCALHOST"}, "master_addr"),
    ({"excluded_hosts": ["c d"]}, "excluded_hosts"),
    ({"excluded_hosts": ["-c"]}, "excluded_hosts"),
    ({"excluded_hosts": ["c", "c"]}, "excluded_hosts"),
    ({"hosts": ["a", "b"], "excluded_hosts": ["b"]}, "excluded_hosts"),
    ({"extra_args": ["a\0b"]}, "extra_args"),
])
def test_bad_inputs_raise_input_error(kw, field):
    args = {"nodes": 2, "gpus_per_node": 4, **kw}
    for render in (render_torchrun_script, render_slurm_script):
        with pytest.raises(InputError) as err:
            render(SMALL, SMALL_PLAN, **args)
        assert err.value.field == field


# --------------------------------------------------------------------- fake runs -----------

FAKE_TORCHRUN = """#!/usr/bin/env bash
# fake torchrun: record argv (NUL-separated) and environment, keyed by --node-rank
rank=unknown
prev=""
for a in "$@"; do
    if [[ "$prev" == "--node-rank" ]]; then rank="$a"; fi
    prev="$a"
done
printf '%s\\0' "$@" > "$FAKE_OUT/argv.$rank"
env -0 > "$FAKE_OUT/env.$rank"
"""
FAKE_HOSTNAME = """#!/usr/bin/env bash
echo "$FAKE_HOSTNAME"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
# fake scontrol: 'show hostnames LIST' prints the comma-separated LIST one per line
[[ "$1 $2" == "show hostnames" ]] || exit 9
tr ',' '\\n' <<< "$3"
"""
FAKE_SRUN = """#!/usr/bin/env bash
# fake srun: run the command once per node with SLURM_NODEID (and FAKE_HOSTNAME from
# FAKE_NODES, a space-separated list, in SLURM's order)
echo "$@" > "$FAKE_OUT/srun_cmdline"
while [[ "$1" == -* ]]; do shift; done
read -r -a nodes <<< "$FAKE_NODES"
for i in "${!nodes[@]}"; do
    SLURM_NODEID=$i FAKE_HOSTNAME="${nodes[$i]}" "$@" || exit $?
done
"""


@pytest.fixture()
def fake(tmp_path):
    bin_dir, out, mdir = tmp_path / "bin", tmp_path / "out", tmp_path / "Megatron LM $dir"
    for d in (bin_dir, out, mdir):
        d.mkdir()
    (mdir / "pretrain_gpt.py").write_text("")
    for name, text in (("torchrun", FAKE_TORCHRUN), ("hostname", FAKE_HOSTNAME),
                       ("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MEGATRON_LM_DIR": str(mdir),
           "FAKE_OUT": str(out), "FAKE_HOSTNAME": "elsewhere"}

    class Fake:
        dir, megatron_dir = tmp_path, mdir

        def run(self, text, args=(), **extra_env):
            script = tmp_path / "script.sh"
            script.write_text(text)
            return subprocess.run(["bash", str(script), *args], capture_output=True,
                                  text=True, env={**env, **extra_env}, timeout=30,
                                  cwd=tmp_path)

        def argv(self, rank):
            raw = (out / f"argv.{rank}").read_bytes().split(b"\0")[:-1]
            return [w.decode() for w in raw]

        def env(self, rank):
            items = (out / f"env.{rank}").read_bytes().split(b"\0")[:-1]
            return dict(i.decode().split("=", 1) for i in items)

        def ranks(self):
            return sorted(p.name.split(".", 1)[1] for p in out.glob("argv.*"))
    return Fake()


def check_torchrun_argv(argv, *, nodes, gpus, rank, addr, port, mdir):
    from torch.distributed.run import get_args_parser
    a = get_args_parser().parse_args(argv)   # torch's own torchrun parser
    assert (a.nnodes, a.nproc_per_node, a.node_rank) == (str(nodes), str(gpus), rank)
    assert (a.master_addr, a.master_port) == (addr, port)
    assert a.training_script == f"{mdir}/pretrain_gpt.py"
    return a.training_script_args


def test_fake_torchrun_two_nodes(fake):
    text = render_torchrun_script(GPT3, GPT3_PLAN, nodes=16, gpus_per_node=8,
                                  master_port=29511)
    expected = flag_argv(megatron_flags(GPT3, GPT3_PLAN))
    for rank in (0, 1):
        res = fake.run(text, [str(rank)], MASTER_ADDR="10.1.2.3")
        assert res.returncode == 0, res.stderr
        margs = check_torchrun_argv(fake.argv(rank), nodes=16, gpus=8, rank=rank,
                                    addr="10.1.2.3", port=29511, mdir=fake.megatron_dir)
        assert margs == expected
        assert_validate_args_rules(parse_argv(margs), 16 * 8)
        env = fake.env(rank)
        assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert "CUDA_VISIBLE_DEVICES" not in env


def test_fake_torchrun_rank_sources_and_errors(fake):
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4)
    res = fake.run(text, NODE_RANK="1", MASTER_ADDR="10.0.0.7")   # from the environment
    assert res.returncode == 0, res.stderr
    check_torchrun_argv(fake.argv(1), nodes=2, gpus=4, rank=1, addr="10.0.0.7", port=29500,
                        mdir=fake.megatron_dir)
    res = fake.run(text, ["0", "--train-iters", "5"], MASTER_ADDR="node-0")   # flags pass
    assert res.returncode == 0, res.stderr
    assert fake.argv(0)[-2:] == ["--train-iters", "5"]
    # several nodes, no placement: never localhost, the environment must say
    for addr in ({"MASTER_ADDR": ""}, {"MASTER_ADDR": "localhost"},
                 {"MASTER_ADDR": "127.0.1.1"}):
        res = fake.run(text, ["0"], **addr)
        assert res.returncode == 2 and "needs MASTER_ADDR" in res.stderr, res.stderr
    one = render_torchrun_script(SMALL, SMALL_PLAN.__class__(
        **{**SMALL_PLAN.__dict__, "dp": SMALL_PLAN.dp // 2}), nodes=1, gpus_per_node=4)
    res = fake.run(one, [], MASTER_ADDR="")                  # one node: localhost is right
    assert res.returncode == 0, res.stderr
    check_torchrun_argv(fake.argv(0), nodes=1, gpus=4, rank=0, addr="localhost", port=29500,
                        mdir=fake.megatron_dir)
    for args, env, msg in (([], {"MASTER_ADDR": "n0"}, "pass the node rank"),
                           (["2"], {"MASTER_ADDR": "n0"}, "node rank must be an integer in 0..1"),
                           (["x1"], {"MASTER_ADDR": "n0"}, "node rank must be an integer"),
                           (["0"], {"MEGATRON_LM_DIR": ""}, "MEGATRON_LM_DIR is not set"),
                           (["0"], {"MEGATRON_LM_DIR": str(fake.dir)}, "pretrain_gpt.py not "
                                                                        "found")):
        res = fake.run(text, args, **env)
        assert res.returncode == 2 and msg in res.stderr, (args, res.stderr)


def test_fake_torchrun_host_table_and_device_pinning(fake):
    hosts = ["gpu-b", "gpu-a"]                       # placement order differs from sorted order
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, hosts=hosts,
                                  cuda_visible_devices=[[3, 1, 2, 0], [0, 1, 2, 3]])
    for host, rank, devices in (("gpu-b.cluster.local", 0, "3,1,2,0"), ("gpu-a", 1, "0,1,2,3")):
        res = fake.run(text, FAKE_HOSTNAME=host)
        assert res.returncode == 0, res.stderr
        check_torchrun_argv(fake.argv(rank), nodes=2, gpus=4, rank=rank, addr="gpu-b",
                            port=29500, mdir=fake.megatron_dir)
        assert fake.env(rank)["CUDA_VISIBLE_DEVICES"] == devices
        assert fake.env(rank)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    res = fake.run(text, FAKE_HOSTNAME="gpu-c")
    assert res.returncode == 2 and "not in the placement" in res.stderr
    res = fake.run(text, ["1"], FAKE_HOSTNAME="gpu-c")        # explicit rank wins
    assert res.returncode == 0 and fake.env(1)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_fake_torchrun_placement_excluded_hosts_and_master(fake):
    """With a placement: the header lists it, an excluded host is refused by name, the
    master defaults to node_rank 0's host and the environment's address is used as given
    (stand-in hosts on one machine use 127.0.0.1)."""
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4,
                                  hosts=["gpu-b", "gpu-a"], excluded_hosts=["gpu-c", "gpu-d"],
                                  cuda_visible_devices=[[3, 1, 2, 0], [0, 1, 2, 3]])
    assert "# node_rank -> host: 0=gpu-b 1=gpu-a\n# excluded hosts: gpu-c gpu-d\n" in text
    for host in ("gpu-d", "gpu-c.cluster.local"):
        res = fake.run(text, FAKE_HOSTNAME=host)
        assert res.returncode == 2 and f"host {host} is excluded by the placement" in \
            res.stderr, res.stderr
        assert not fake.ranks()
    res = fake.run(text, FAKE_HOSTNAME="gpu-a", MASTER_ADDR="127.0.0.1")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    check_torchrun_argv(fake.argv(1), nodes=2, gpus=4, rank=1, addr="127.0.0.1", port=29500,
                        mdir=fake.megatron_dir)


def test_fake_torchrun_multi_node_master_addr(fake):
    """Several nodes, no placement: a given address is the default (the environment may
    replace it, but not by a loopback address); without one the environment must say."""
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4,
                                  master_addr="node-0.lab")
    res = fake.run(text, ["1"])
    assert res.returncode == 0 and res.stderr == "", res.stderr
    check_torchrun_argv(fake.argv(1), nodes=2, gpus=4, rank=1, addr="node-0.lab", port=29500,
                        mdir=fake.megatron_dir)
    for addr in ("127.0.0.1", "localhost", "Localhost", "0.0.0.0", "[::1]"):
        res = fake.run(text, ["1"], MASTER_ADDR=addr)
        assert res.returncode == 2 and f"not {addr} (this machine only)" in res.stderr, \
            (addr, res.stderr)
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4)
    assert "# Environment: MASTER_ADDR (required: node_rank 0's address)" in text
    res = fake.run(text, ["1"], MASTER_ADDR="10.1.2.3")
    assert res.returncode == 0 and fake.argv(1)[fake.argv(1).index("--master-addr") + 1] \
        == "10.1.2.3"
    res = fake.run(text, ["1"])
    assert res.returncode == 2 and "needs MASTER_ADDR" in res.stderr and "not set" in \
        res.stderr


def test_fake_torchrun_quotes_data_path(fake):
    data = "/data/my corpus/$HOME `id` it's_text_document"
    tok = "/tok dir/$USER"
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, data_path=data,
                                  tokenizer_model=tok, extra_args=["--note", "a b; $(id)"])
    assert shlex.quote(data) in text
    res = fake.run(text, ["0"], MASTER_ADDR="n0")
    assert res.returncode == 0, res.stderr
    a = fake.argv(0)
    assert a[a.index("--data-path") + 1] == data
    assert a[a.index("--tokenizer-model") + 1] == tok
    assert a[a.index("--tokenizer-type") + 1] == "HuggingFaceTokenizer"
    assert a[-2:] == ["--note", "a b; $(id)"] and "--mock-data" not in a
    res = fake.run(text, ["0"], DATA_PATH="/other", MASTER_ADDR="n0")   # env overrides
    assert fake.argv(0)[fake.argv(0).index("--data-path") + 1] == "/other"


def test_data_path_requires_tokenizer_model_at_render_time():
    """The script's HuggingFaceTokenizer cannot start without --tokenizer-model: refused when
    the script is rendered, not when Megatron starts."""
    for render in (render_torchrun_script, render_slurm_script):
        with pytest.raises(InputError) as err:
            render(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, data_path="/d/x")
        assert err.value.field == "tokenizer_model" and "\n" not in str(err.value)
        assert "HuggingFaceTokenizer" in str(err.value)


HOSTILE_PATHS = ["/data/my corpus/it's \"quoted\"", "/d/$(touch PWNED)", "/d/`touch PWNED`",
                 "/d/x; touch PWNED", "/d/$HOME * ?", "/d/a\\nb", "/d/${IFS}x|y&z>w"]


def test_fake_runs_pass_blended_hostile_data_paths(fake):
    """Several --data-path words (Megatron blend: weight, path, ...) reach torchrun as
    exactly those words, whatever quotes, $(...), backquotes, ';' or globs they hold."""
    blend = [w for i, p in enumerate(HOSTILE_PATHS) for w in (f"0.{i + 1}", p)]
    tok = "/tok/$(touch PWNED) `x`"
    for data in (blend, HOSTILE_PATHS, HOSTILE_PATHS[1:2]):
        for render, args, env, ranks in (
                (render_torchrun_script, ["1"], {}, ["1"]),
                (render_slurm_script, [], {"SLURM_JOB_NODELIST": "n0,n1",
                                           "FAKE_NODES": "n0 n1"}, ["0", "1"])):
            text = render(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, data_path=data,
                          tokenizer_model=tok)
            res = fake.run(text, args, **{"MASTER_ADDR": "n0", **env})
            assert res.returncode == 0 and res.stderr == "", res.stderr
            for rank in ranks:
                a = fake.argv(rank)
                i = a.index("--data-path")
                assert a[i + 1:i + 1 + len(data)] == list(data)
                assert a[i + 1 + len(data)] == "--split"
                assert a[a.index("--tokenizer-model") + 1] == tok
            assert not list(fake.dir.rglob("PWNED"))


def test_data_path_from_the_environment_is_one_word(fake):
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4,
                                  data_path=["0.5", "/a", "0.5", "/b"], tokenizer_model="t")
    res = fake.run(text, ["0"], DATA_PATH="/other path/$(x)", MASTER_ADDR="n0")
    assert res.returncode == 0, res.stderr
    a = fake.argv(0)
    assert a[a.index("--data-path") + 1:a.index("--split")] == ["/other path/$(x)"]


def test_cli_launch_data_path_words_and_tokenizer_required(tmp_path, fake):
    plan = _plan_json(tmp_path)
    code, err = _cli(["launch", "--plan", plan, "--out", str(tmp_path / "o"),
                      "--data-path", "/d"])
    assert code == 2 and err.count("\n") == 1 and "--tokenizer-model" in err, err
    assert not (tmp_path / "o").exists()
    code, err = _cli(["launch", "--plan", plan, "--out", str(tmp_path / "o"),
                      "--data-path", "0.3", "/a b", "0.7", "/c;d", "--tokenizer-model", "t"])
    assert code == 0, err
    res = fake.run((tmp_path / "o" / TORCHRUN_FILE).read_text(), ["0"], MASTER_ADDR="n0")
    assert res.returncode == 0, res.stderr
    a = fake.argv(0)
    assert a[a.index("--data-path") + 1:a.index("--split")] == ["0.3", "/a b", "0.7", "/c;d"]


def test_header_comments_hold_no_line_break_or_escape(tmp_path, fake):
    """Header text from any input (model name, summary) is printable: it cannot end the
    comment, even for a ModelSpec built without make_model's checks."""
    name = "m\n$(touch PWNED)\r\u2028touch PWNED\u2029\x85\x1b[31m\u202e`touch PWNED`;x"
    model = dataclasses.replace(SMALL, name=name)
    for render in (render_torchrun_script, render_slurm_script):
        text = render(model, SMALL_PLAN, nodes=2, gpus_per_node=4, hosts=["h0", "h1"],
                      summary={"k\ney": "v\u2028touch PWNED\x1b"})
        head = text[:text.index("set -euo pipefail")]
        for line in head.splitlines():
            assert line.startswith("#") and line.isprintable(), repr(line)
        assert "\r" not in head and "\x1b" not in head and "\u2028" not in head
        res = fake.run(text, ["0"], SLURM_JOB_NODELIST="h0,h1", FAKE_NODES="h0 h1")
        assert res.returncode == 0 and res.stderr == "", res.stderr
        assert not list(fake.dir.rglob("PWNED"))
    assert "#SBATCH --job-name=megatron-m-touch-PWNED-touch-PWNED-31m-touch-PWNED-x" in text


def test_fake_slurm_nodeid_and_scontrol_master(fake):
    text = render_slurm_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4,
                               data_path="/data/a b/$x", tokenizer_model="gpt2")
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=4\n" \
           "#SBATCH --exclusive\n" in text
    assert "bash -c '" in text and "--node-rank \"$NODE_RANK\"" in text
    res = fake.run(text, ["--train-iters", "3"], SLURM_JOB_NODELIST="nodeX,nodeY",
                   FAKE_NODES="nodeX nodeY")
    assert res.returncode == 0, res.stderr
    assert fake.ranks() == ["0", "1"]
    expected = flag_argv(megatron_flags(SMALL, SMALL_PLAN, data_path="/d"))
    for rank in (0, 1):
        margs = check_torchrun_argv(fake.argv(rank), nodes=2, gpus=4, rank=rank, addr="nodeX",
                                    port=29500, mdir=fake.megatron_dir)
        assert margs[margs.index("--data-path") + 1] == "/data/a b/$x"
        assert [w for w in margs if w.startswith("--")] == \
            [w for w in expected if w.startswith("--")] + ["--train-iters"]
        assert_validate_args_rules(parse_argv(margs[:-2]), 8)
        assert fake.env(rank)["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "--nodes=2 --ntasks-per-node=1" in (fake.dir / "out" / "srun_cmdline").read_text()
    # the job's hosts in SLURM's (node_rank) order, for the log's reader
    assert res.stdout.splitlines()[0] == "configurator: hosts nodeX nodeY"
    res = fake.run(text)                                       # not under SLURM
    assert res.returncode == 2 and "sbatch" in res.stderr
    res = fake.run(text, MASTER_ADDR="nodeX", FAKE_NODES="nodeX nodeY")
    assert res.returncode == 0 and "configurator: hosts" not in res.stdout  # no node list


def test_every_library_input_is_quoted_or_checked(fake):
    """Item by item, every renderer input that reaches the script text: free text (model
    name, summary, plan strings) only in comments, made printable; words (data paths,
    tokenizer, master address, extra arguments) quoted; job name reduced; hosts checked."""
    evil = "$(touch PWNED)`touch PWNED`;touch PWNED|x>PWNED'\"\\"
    model = dataclasses.replace(SMALL, name=evil + "\n" + evil + "\u2028\x1b")
    data = ["0.5", "/d/" + evil, "0.5", "/e/" + evil]
    extra = ["--note", evil, "--multi", "line1\nline2 " + evil]
    kw = dict(nodes=2, gpus_per_node=4, data_path=data, tokenizer_model="/t/" + evil,
              master_addr="m" + evil.replace(" ", ""), extra_args=extra,
              summary={evil: evil + "\n" + evil})
    want = flag_argv(megatron_flags(SMALL, SMALL_PLAN, data_path=data),
                     {"DATA_PATHS": data, "TOKENIZER_TYPE": "HuggingFaceTokenizer",
                      "TOKENIZER_MODEL": "/t/" + evil}) + extra
    for render, args, env, ranks in (
            (render_torchrun_script, ["1"], {}, [1]),
            (render_slurm_script, [], {"SLURM_JOB_NODELIST": "a,b", "FAKE_NODES": "a b"},
             [0, 1])):
        extra_kw = {"job_name": evil} if render is render_slurm_script else {}
        text = render(model, SMALL_PLAN, **kw, **extra_kw)
        res = fake.run(text, args, **env)
        assert res.returncode == 0 and res.stderr == "", res.stderr
        for rank in ranks:
            margs = check_torchrun_argv(fake.argv(rank), nodes=2, gpus=4, rank=rank,
                                        addr=kw["master_addr"], port=29500,
                                        mdir=fake.megatron_dir)
            assert margs == want
        assert not list(fake.dir.rglob("PWNED")) and not list(fake.dir.rglob("x"))
    assert "#SBATCH --job-name=touch-PWNED-touch-PWNED-touch-PWNED-x-PWNED\n" in text


FAKE_SCONTROL_MANY = """#!/usr/bin/env bash
# fake scontrol: 'show hostnames ...' prints 100,000 host names (far more than a pipe buffer)
[[ "$1 $2" == "show hostnames" ]] || exit 9
seq -f 'node%06g' 0 99999
"""


def test_fake_slurm_long_host_list_reaches_torchrun(fake):
    """SIGPIPE regression: 'scontrol show hostnames | head -n1' under 'set -o pipefail' ended
    the job with status 141 on a long host list before torchrun started."""
    (fake.dir / "bin" / "scontrol").write_text(FAKE_SCONTROL_MANY)
    env = {"SLURM_JOB_NODELIST": "node[000000-099999]", "FAKE_NODES": "node000000 node000001"}
    old = fake.run('set -euo pipefail\nX=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | '
                   'head -n1)\necho "$X"\n', **env)
    assert old.returncode == 141          # the stand-in does trigger SIGPIPE with a pipe
    text = render_slurm_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4)
    res = fake.run(text, **env)
    assert res.returncode == 0 and res.stderr == "", (res.returncode, res.stderr)
    for rank in (0, 1):
        check_torchrun_argv(fake.argv(rank), nodes=2, gpus=4, rank=rank, addr="node000000",
                            port=29500, mdir=fake.megatron_dir)
    (fake.dir / "bin" / "scontrol").write_text("#!/usr/bin/env bash\nexit 0\n")
    res = fake.run(text, **env)                   # no host listed: a clear error
    assert res.returncode == 2 and "listed no host" in res.stderr
    (fake.dir / "bin" / "scontrol").write_text("#!/usr/bin/env bash\nexit 7\n")
    assert fake.run(text, **env).returncode == 7  # scontrol's failure stops the job


def test_fake_slurm_host_placement(fake):
    hosts = ["nodeY", "nodeX"]        # SLURM numbers nodeX first; the placement wants nodeY
    text = render_slurm_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, hosts=hosts,
                               cuda_visible_devices=[[1, 0, 3, 2], [0, 1, 2, 3]])
    assert "#SBATCH --nodelist=nodeY,nodeX" in text
    res = fake.run(text, SLURM_JOB_NODELIST="nodeX,nodeY", FAKE_NODES="nodeX nodeY")
    assert res.returncode == 0, res.stderr
    for rank, devices in ((0, "1,0,3,2"), (1, "0,1,2,3")):
        check_torchrun_argv(fake.argv(rank), nodes=2, gpus=4, rank=rank, addr="nodeY",
                            port=29500, mdir=fake.megatron_dir)
        env = fake.env(rank)
        assert env["CUDA_VISIBLE_DEVICES"] == devices and env["SLURM_NODEID"] == str(1 - rank)
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "#SBATCH --exclude" not in text
    text = render_slurm_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, hosts=hosts,
                               excluded_hosts=["nodeZ", "nodeW"])
    assert "#SBATCH --nodelist=nodeY,nodeX\n#SBATCH --exclude=nodeZ,nodeW\n" in text
    res = fake.run(text, SLURM_JOB_NODELIST="nodeX,nodeY", FAKE_NODES="nodeX nodeY")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    res = fake.run(text, SLURM_JOB_NODELIST="nodeX,nodeZ", FAKE_NODES="nodeX nodeZ")
    assert res.returncode == 2 and "nodeZ is excluded by the placement" in res.stderr
    text = render_slurm_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4,
                               excluded_hosts=["bad-node"])     # without a host table
    assert "#SBATCH --exclude=bad-node\n" in text and "--nodelist" not in text


def test_write_launch_files_with_a_placement(tmp_path):
    """``placement=`` (a plan.json placement object or a PlacementRecord) stands for hosts,
    cuda_visible_devices and excluded_hosts; it is checked against the node shape."""
    from configurator.core.document import PlacementRecord, placement_record, read_placement
    from launchers import launch_files, placement_kwargs

    rec = placement_record(["gpu-b", "gpu-a"], [[3, 1, 2, 0], [0, 1, 2, 3]], ["gpu-c"],
                           "optimized", iteration_time_s=1.0)
    kw = dict(nodes=2, gpus_per_node=4)
    want = launch_files(SMALL, SMALL_PLAN, hosts=["gpu-b", "gpu-a"], excluded_hosts=["gpu-c"],
                        cuda_visible_devices=[[3, 1, 2, 0], [0, 1, 2, 3]], **kw)
    assert launch_files(SMALL, SMALL_PLAN, placement=rec, **kw) == want
    assert launch_files(SMALL, SMALL_PLAN, placement=read_placement(rec), **kw) == want
    assert isinstance(read_placement(rec), PlacementRecord)
    assert placement_kwargs(None) == {}
    paths = write_launch_files(str(tmp_path / "o"), SMALL, SMALL_PLAN, placement=rec, **kw)
    assert "#SBATCH --exclude=gpu-c" in Path(paths["slurm"]).read_text()
    with pytest.raises(InputError) as err:
        launch_files(SMALL, SMALL_PLAN, placement=rec, hosts=["x", "y"], **kw)
    assert err.value.field == "placement"
    with pytest.raises(InputError) as err:                  # a 2-node placement on 1 node
        launch_files(SMALL, SMALL_PLAN.__class__(**{**SMALL_PLAN.__dict__, "dp": 1}),
                     placement=rec, nodes=1, gpus_per_node=4)
    assert err.value.field == "placement.hosts"
    with pytest.raises(InputError) as err:                  # 4 GPUs listed, 8 per node
        launch_files(SMALL, SMALL_PLAN.__class__(**{**SMALL_PLAN.__dict__, "dp": 4}),
                     placement=rec, nodes=2, gpus_per_node=8)
    assert err.value.field == "placement.gpu_order[0]"


# ------------------------------------------------------------------------- files ----------

def test_write_launch_files(tmp_path):
    out = tmp_path / "launch"
    paths = write_launch_files(str(out), SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4,
                               job_name="my job")
    tr, sl = Path(paths["torchrun"]), Path(paths["slurm"])
    assert (tr.name, sl.name) == (TORCHRUN_FILE, SLURM_FILE)
    assert tr.stat().st_mode & stat.S_IXUSR and not sl.stat().st_mode & stat.S_IXUSR
    assert "#SBATCH --job-name=my-job" in sl.read_text()
    bash_syntax_ok(tr.read_text(), tmp_path, "a.sh")
    with pytest.raises(InputError) as err:
        write_launch_files(str(out), SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4)
    assert err.value.field == "out" and "--force" in err.value.rule
    tr.write_text("mine")
    sl.unlink()                                  # one file left is enough to refuse
    with pytest.raises(InputError):
        write_launch_files(str(out), SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4)
    assert tr.read_text() == "mine" and not sl.exists()
    write_launch_files(str(out), SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, force=True)
    assert tr.read_text().startswith("#!/usr/bin/env bash") and sl.exists()


def test_write_launch_files_bad_plan_writes_nothing(tmp_path):
    with pytest.raises(InputError):
        write_launch_files(str(tmp_path / "o"), SMALL, SMALL_PLAN, nodes=3, gpus_per_node=4)
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------- symbolic links -------

def _cli(argv):
    from configurator.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


def _plan_json(tmp_path) -> str:
    """A plan.json of SMALL on 2 x 4 GPUs, as search --out writes it."""
    from configurator.core.document import plan_document
    estimate = {"iteration_time_s": 1.0, "model_tflops_per_gpu": 100.0, "mfu": 0.5,
                "peak_memory_bytes": 2**30}
    doc = plan_document(model=SMALL, cluster={"name": "c", "gpu": "g", "gpus_per_node": 4,
                                              "nodes": 2, "num_gpus": 8},
                        plan=SMALL_PLAN, estimate=estimate)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("force", [False, True])
def test_out_symlinks_refused(tmp_path, monkeypatch, force):
    """An output directory or file that is a symbolic link is refused (also with --force):
    one line naming the path, exit 2, the link's target untouched."""
    monkeypatch.chdir(tmp_path)
    tmp_path = Path(".")                  # short paths: the error echoes at most 80 characters
    plan = _plan_json(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim"
    victim.write_text("keep")
    flag = ["--force"] if force else []
    link_dir = tmp_path / "link_dir"
    link_dir.symlink_to(elsewhere)
    for out in (str(link_dir), str(link_dir) + "/"):
        code, err = _cli(["launch", "--plan", plan, "--out", out, *flag])
        assert code == 2 and err.count("\n") == 1, err
        assert "symbolic link" in err and str(link_dir) in err
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim"]
    out = tmp_path / "out"
    out.mkdir()
    (out / TORCHRUN_FILE).symlink_to(victim)
    code, err = _cli(["launch", "--plan", plan, "--out", str(out), *flag])
    assert code == 2 and err.count("\n") == 1, err
    assert "symbolic link" in err and str(out / TORCHRUN_FILE) in err
    assert victim.read_text() == "keep" and not (out / SLURM_FILE).exists()
    with pytest.raises(InputError) as exc:
        write_launch_files(str(out), SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, force=force)
    assert exc.value.field == "out" and "symbolic link" in exc.value.rule
    assert victim.read_text() == "keep"


@pytest.mark.parametrize("name", ["plan.json", "plans.png", "launch_slurm.sbatch"])
def test_search_out_symlinks_refused(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    tmp_path = Path(".")
    elsewhere = tmp_path / "victim"
    elsewhere.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(elsewhere)
    argv = ["search", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
            "--gbs", "8", "--top", "1", "--out", str(out), "--force"]
    code, err = _cli(argv)
    assert code == 2 and err.count("\n") == 1 and "symbolic link" in err, err
    assert str(out / name) in err and elsewhere.read_text() == "keep"
    link = tmp_path / "link"
    link.symlink_to(out)
    code, err = _cli(argv[:-2] + [str(link), "--force"])
    assert code == 2 and "symbolic link" in err and str(link) in err
    assert sorted(p.name for p in out.iterdir()) == [name]


@pytest.mark.parametrize("force", [False, True])
def test_link_made_after_the_check_is_not_followed(tmp_path, monkeypatch, force):
    """A symbolic link that appears between the check and the write (simulated by skipping
    the check) is never written through: refused without --force, replaced with --force."""
    from configurator.app import outputs
    monkeypatch.setattr(launcher_files, "check_out_dir", lambda *a, **k: None, raising=False)
    monkeypatch.setattr(outputs, "check_out", lambda *a, **k: None)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    for name in (TORCHRUN_FILE, SLURM_FILE):
        (out / name).symlink_to(victim)
    if force:
        write_launch_files(str(out), SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, force=True)
        for name in (TORCHRUN_FILE, SLURM_FILE):
            assert not (out / name).is_symlink()
            assert (out / name).read_text().startswith("#!/usr/bin/env bash")
        assert os.access(out / TORCHRUN_FILE, os.X_OK)
    else:
        with pytest.raises(InputError) as exc:
            write_launch_files(str(out), SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4)
        assert "symbolic link" in exc.value.rule
    assert victim.read_text() == "keep"
    # no temporary file left; with --force the Megatron-Bridge overrides beside the scripts
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [SLURM_FILE, TORCHRUN_FILE] + ([BRIDGE_FILE] if force else []))
    link_dir = tmp_path / "link_dir"                       # the directory itself
    link_dir.symlink_to(out)
    with pytest.raises(InputError) as exc:
        launcher_files.write_files(str(link_dir), {"x": (b"", 0o666)}, force=force)
    assert "symbolic link" in exc.value.rule and not (out / "x").exists()
    # search's files (plan.json ...) go through the same writer
    (out / "extra").symlink_to(victim)
    with pytest.raises(InputError):
        launcher_files.write_files(str(out), {"extra": (b"x", 0o666)}, force=False)
    launcher_files.write_files(str(out), {"extra": (b"x", 0o666)}, force=True)
    assert victim.read_text() == "keep" and (out / "extra").read_bytes() == b"x"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean(tmp_path):
    kw = {"hosts": ["n1", "n2"], "cuda_visible_devices": [[1, 0, 3, 2], [0, 1, 2, 3]],
          "excluded_hosts": ["n3", "n4"], "data_path": "/data/a b/$x", "tokenizer_model": "gpt2", "extra_args": ["--x", "a,b"]}
    blend = {"data_path": ["0.3", "/a b/$x", "0.7", "/c`d`"], "tokenizer_model": "/t/$y"}
    evil = "$(touch PWNED)`touch PWNED`;'\"\\"
    hostile = {"data_path": ["1", "/a" + evil], "tokenizer_model": "/t" + evil,
               "extra_args": ["--x", evil, "a\nb"], "master_addr": "m" + evil.replace(" ", ""),
               "summary": {evil: evil}}
    for render, name in ((render_torchrun_script, "t.sh"), (render_slurm_script, "s.sbatch")):
        for extra in ({}, kw, blend, hostile):
            path = tmp_path / name
            path.write_text(render(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, **extra))
            res = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
            assert res.returncode == 0, res.stdout


@pytest.mark.parametrize("field, value", [("async_tensor_model_parallel_allreduce", False),
                                          ("fp8_dot_product_attention", True),
                                          ("moe_fused_grouped_mlp", True)])
def test_a_plan_the_scripts_megatron_cannot_run_is_refused(field, value):
    """Fields ``estimate`` prices but pretrain_gpt.py of the scripts' Megatron has no flag
    for: the flags refuse the plan naming the field (the scripts would run something else),
    and the Megatron-Bridge overrides write a line for it, none at its default."""
    from launchers.bridge import NOT_CARRIED

    # the backward's all-reduce runs exposed only at tp > 1 without sequence parallelism
    base = (dataclasses.replace(SMALL_PLAN, sequence_parallel=False)
            if field == "async_tensor_model_parallel_allreduce" else SMALL_PLAN)
    plan = dataclasses.replace(base, **{field: value})
    with pytest.raises(InputError) as err:
        megatron_flags(SMALL, plan)
    assert err.value.field == field and "launch script" in str(err.value)
    megatron_flags(SMALL, base)            # the same plan with the field at its default runs
    assert NOT_CARRIED[field](SMALL, plan) and NOT_CARRIED[field](SMALL, base) is None


def test_a_plan_whose_backward_all_reduce_the_flag_does_not_change_launches():
    """Without the backward all-reduce's overlap a plan runs as with it where there is no
    tensor-parallel all-reduce (tp 1) or sequence parallelism overlaps its own: such a plan
    (as every plan of a search run with ``--no-async-tensor-model-parallel-allreduce``
    carries the field) is priced the same and launches; at tp > 1 without sequence
    parallelism it is priced slower and refused."""
    from configurator.core.model_presets import load_model
    from configurator.core.plan import ParallelPlan
    from configurator.search.evaluate import evaluate_plan
    from launchers.bridge import NOT_CARRIED
    from topology.cluster_files import load_cluster

    off = dict(async_tensor_model_parallel_allreduce=False)
    for same in (SMALL_PLAN, dataclasses.replace(SMALL_PLAN, tp=1, dp=4,
                                                 sequence_parallel=False)):
        megatron_flags(SMALL, dataclasses.replace(same, **off))
        assert NOT_CARRIED["async_tensor_model_parallel_allreduce"](
            SMALL, dataclasses.replace(same, **off)) is None
    # priced on a model whose tensor-parallel all-reduces outlast the host's issue time
    big, cluster = load_model("llama3-8b"), load_cluster("dgx-a100-80gb", nodes=1)
    tp8 = ParallelPlan(tp=8, pp=1, dp=1, micro_batch_size=1, global_batch_size=8,
                       sequence_parallel=True)

    def time_s(plan, **kw):
        return evaluate_plan(big, cluster, dataclasses.replace(plan, **kw)).iteration_time_s
    for same in (tp8, dataclasses.replace(tp8, tp=1, dp=8, sequence_parallel=False)):
        assert time_s(same, **off) == time_s(same)
    plain = dataclasses.replace(tp8, sequence_parallel=False)
    assert time_s(plain, **off) > time_s(plain)
