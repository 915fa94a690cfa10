"""Tests for launchers/: torchrun and SLURM scripts, fake runs, file writing."""

from __future__ import annotations

import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from configurator.core.errors import InputError
from launchers import (SLURM_FILE, TORCHRUN_FILE, render_slurm_script, render_torchrun_script,
                       write_launch_files)
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
    {"data_path": "/data/x", "master_addr": "10.0.0.1", "master_port": 1234,
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
                                  text=True, env={**env, **extra_env}, timeout=30)

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
    res = fake.run(text, NODE_RANK="1")                      # from the environment
    assert res.returncode == 0, res.stderr
    check_torchrun_argv(fake.argv(1), nodes=2, gpus=4, rank=1, addr="localhost", port=29500,
                        mdir=fake.megatron_dir)
    res = fake.run(text, ["0", "--train-iters", "5"])        # trailing flags pass through
    assert res.returncode == 0, res.stderr
    assert fake.argv(0)[-2:] == ["--train-iters", "5"]
    for args, env, msg in (([], {}, "pass the node rank"),
                           (["2"], {}, "node rank must be an integer in 0..1"),
                           (["x1"], {}, "node rank must be an integer"),
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
    res = fake.run(text, FAKE_HOSTNAME="gpu-c")
    assert res.returncode == 2 and "not in the placement" in res.stderr
    res = fake.run(text, ["1"], FAKE_HOSTNAME="gpu-c")        # explicit rank wins
    assert res.returncode == 0 and fake.env(1)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_fake_torchrun_quotes_data_path(fake):
    data = "/data/my corpus/$HOME `id` it's_text_document"
    tok = "/tok dir/$USER"
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, data_path=data,
                                  tokenizer_model=tok, extra_args=["--note", "a b; $(id)"])
    assert shlex.quote(data) in text
    res = fake.run(text, ["0"])
    assert res.returncode == 0, res.stderr
    a = fake.argv(0)
    assert a[a.index("--data-path") + 1] == data
    assert a[a.index("--tokenizer-model") + 1] == tok
    assert a[a.index("--tokenizer-type") + 1] == "HuggingFaceTokenizer"
    assert a[-2:] == ["--note", "a b; $(id)"] and "--mock-data" not in a
    res = fake.run(text, ["0"], DATA_PATH="/other")           # environment overrides
    assert fake.argv(0)[fake.argv(0).index("--data-path") + 1] == "/other"


def test_fake_torchrun_requires_tokenizer_model_at_run_time(fake):
    text = render_torchrun_script(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4,
                                  data_path="/d/x")
    res = fake.run(text, ["0"])
    assert res.returncode == 2 and "TOKENIZER_MODEL" in res.stderr
    res = fake.run(text, ["0"], TOKENIZER_MODEL="gpt2")
    assert res.returncode == 0 and fake.argv(0)[-1] == "gpt2"


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
    res = fake.run(text)                                       # not under SLURM
    assert res.returncode == 2 and "sbatch" in res.stderr


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


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean(tmp_path):
    kw = {"hosts": ["n1", "n2"], "cuda_visible_devices": [[1, 0, 3, 2], [0, 1, 2, 3]],
          "data_path": "/data/a b/$x", "extra_args": ["--x", "a,b"]}
    for render, name in ((render_torchrun_script, "t.sh"), (render_slurm_script, "s.sbatch")):
        for extra in ({}, kw):
            path = tmp_path / name
            path.write_text(render(SMALL, SMALL_PLAN, nodes=2, gpus_per_node=4, **extra))
            res = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
            assert res.returncode == 0, res.stdout
