"""A stand-in for torchrun and a Megatron-LM checkout, for the one-GPU benches' ``run`` steps
(``bench.accuracy.megatron_gpu``, ``bench.accuracy.trial_gpu``) on a machine without a GPU."""

from __future__ import annotations

import os
from pathlib import Path

from bench.accuracy import megatron_gpu as mg


def stand_in_megatron(tmp_path: Path, monkeypatch, torchrun: str,
                      moe_utils: str) -> tuple[Path, Path]:
    """Put ``torchrun`` (a shell script, which may record its arguments under
    ``$ARGV_DIR/$MASTER_PORT.argv``) first on the ``PATH`` and lay out a Megatron-LM checkout
    as the benches read it (:data:`~bench.accuracy.megatron_gpu.MOE_UTILS` holding
    ``moe_utils``, an empty ``pretrain_gpt.py``). Returns the checkout and the argv folder."""
    bin_dir, argv_dir = tmp_path / "bin", tmp_path / "argv"
    bin_dir.mkdir(), argv_dir.mkdir()
    (bin_dir / "torchrun").write_text(torchrun)
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("ARGV_DIR", str(argv_dir))
    checkout = tmp_path / "Megatron-LM"
    (checkout / mg.MOE_UTILS).parent.mkdir(parents=True)
    (checkout / mg.MOE_UTILS).write_text(moe_utils)
    (checkout / "pretrain_gpt.py").write_text("# entry\n")
    return checkout, argv_dir
