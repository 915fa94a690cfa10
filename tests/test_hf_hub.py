"""``--model`` as a Hugging Face model id (configurator/core/hf_hub.py): read from a local
Hugging Face cache laid out as huggingface_hub lays it out, offline (``HF_HUB_OFFLINE=1``);
never the network. The command runs in a subprocess so that huggingface_hub reads this
environment when it is imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from configurator.core.errors import InputError
from configurator.core.hf_hub import looks_like_hub_id
from configurator.core.model_presets import load_model

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "data" / "hf_configs" / "llama3-8b.json"
REPO = "meta-llama/Meta-Llama-3-8B"
COMMIT = "62bd457b6fe961a42a631306577e622c83876cb6"


def hf_cache(root: Path, repo: str, config: Path) -> Path:
    """A Hugging Face hub cache holding ``repo``'s config.json at its main revision:
    ``models--OWNER--NAME/refs/main`` (the commit) and ``snapshots/COMMIT/config.json``."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(COMMIT)
    snap = repo_dir / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    shutil.copy(config, snap / "config.json")
    return root


@pytest.fixture
def hf_env(tmp_path):
    """The environment of an offline machine whose Hugging Face cache holds the Llama 3 8B
    config.json only."""
    home = tmp_path / "hf"
    hf_cache(home / "hub", REPO, CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(home), HF_HUB_CACHE=str(home / "hub"), HF_HUB_OFFLINE="1",
               PYTHONPATH=str(ROOT), HF_HUB_DISABLE_TELEMETRY="1")
    return env


def cli(argv, env, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "configurator", *argv], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_a_cached_model_id_is_the_same_model_as_its_config_file(hf_env, tmp_path):
    pytest.importorskip("huggingface_hub", reason="the Hugging Face id needs huggingface_hub "
                                                  "(the test extra installs it)")
    code = (f"import json; from configurator.core.model_presets import load_model as l; "
            f"a, b = l({REPO!r}), l({str(CONFIG)!r}); "
            f"print(json.dumps([a.name, a.to_dict() == {{**b.to_dict(), 'name': a.name}}]))")
    res = subprocess.run([sys.executable, "-c", code], env=hf_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [REPO, True]
    argv = ["search", "--model", REPO, "--cluster", "dgx-h100-80gb", "--nodes", "2",
            "--gbs", "128", "--seq-length", "8192", "--top", "1", "--json"]
    by_id = cli(argv, hf_env, tmp_path)
    assert by_id.returncode == 0, by_id.stderr
    by_file = cli([str(CONFIG) if a == REPO else a for a in argv], hf_env, tmp_path)
    assert json.loads(by_id.stdout)["plans"][0] == json.loads(by_file.stdout)["plans"][0]


def test_offline_without_a_cached_copy_is_one_line(hf_env, tmp_path):
    pytest.importorskip("huggingface_hub", reason="the Hugging Face id needs huggingface_hub")
    res = cli(["search", "--model", "meta-llama/Llama-3.1-8B", "--cluster", "dgx-h100-80gb",
               "--nodes", "1", "--gbs", "8"], hf_env, tmp_path)
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert "meta-llama/Llama-3.1-8B" in res.stderr and "HF_HUB_OFFLINE" in res.stderr


def test_without_huggingface_hub_the_error_says_how_to_install_it(hf_env, tmp_path):
    fake = tmp_path / "fake" / "huggingface_hub"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = dict(hf_env, PYTHONPATH=f"{tmp_path / 'fake'}{os.pathsep}{ROOT}")
    res = cli(["search", "--model", REPO, "--cluster", "dgx-h100-80gb", "--nodes", "1",
               "--gbs", "8"], env, tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "pip install huggingface_hub" in res.stderr and REPO in res.stderr
    # the core does not import it for a preset
    res = cli(["search", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--nodes",
               "1", "--gbs", "8", "--top", "1"], env, tmp_path)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("error,words", [
    ("RepositoryNotFoundError", "no such Hugging Face model"),
    ("GatedRepoError", "gated"),
    ("RemoteEntryNotFoundError", "no config.json"),
])
def test_a_missing_or_gated_repository_is_one_line(monkeypatch, error, words):
    hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub import errors

    cls = getattr(errors, error, None)
    if cls is None:
        pytest.skip(f"this huggingface_hub has no {error}")

    def refuse(repo_id, filename, **kw):
        exc = cls.__new__(cls)      # as the Hub's 401/404 answer raises it, without a response
        Exception.__init__(exc, f"{error}: 404 for {repo_id}\nmore lines")
        raise exc

    monkeypatch.setattr(hub, "hf_hub_download", refuse)
    with pytest.raises(InputError) as exc:
        load_model("someone/some-model")
    assert exc.value.field == "model" and words in exc.value.rule
    assert "\n" not in str(exc.value)


def test_a_preset_or_an_existing_path_wins_over_the_id_shape(tmp_path, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")

    def never(*a, **k):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(hub, "hf_hub_download", never)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-org").mkdir()
    # a file named like an id (read as YAML for want of a .json suffix: plain decimals)
    (tmp_path / "my-org" / "llama").write_text(CONFIG.read_text().replace("1e-05", "0.00001"))
    assert load_model("my-org/llama").num_layers == 32
    assert load_model("LLAMA3-8B").name == "llama3-8b"
    with pytest.raises(InputError) as exc:                      # a missing model file
        load_model("models/missing.yaml")
    assert "not a preset name" in exc.value.rule


@pytest.mark.parametrize("ref,is_id", [
    ("meta-llama/Llama-3.1-8B", True), ("Qwen/Qwen3-30B-A3B", True),
    ("deepseek-ai/DeepSeek-V3", True), ("llama3-8b", False), ("a/b/c", False),
    ("dir/model.yaml", False), ("dir/config.json", False), ("/abs/path", False),
    ("../x", False), ("a/..", False), ("-x/y", False), ("", False), ("a b/c", False),
])
def test_the_id_shape(ref, is_id):
    assert looks_like_hub_id(ref) is is_id
