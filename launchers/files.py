"""Write the launch scripts of one plan to a directory, never overwriting without ``force``."""

from __future__ import annotations

import os
import stat
from typing import Any

from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from launchers.slurm import render_slurm_script
from launchers.torchrun import render_torchrun_script

TORCHRUN_FILE = "launch_torchrun.sh"
SLURM_FILE = "launch_slurm.sbatch"


def write_launch_files(out_dir: str, model: ModelSpec, plan: ParallelPlan, *,
                       force: bool = False, **kwargs: Any) -> dict[str, str]:
    """Render and write ``launch_torchrun.sh`` (executable) and ``launch_slurm.sbatch``.

    ``kwargs`` are the renderers' keyword arguments (``nodes``, ``gpus_per_node``, ``hosts``,
    ``cuda_visible_devices``, ``data_path``, ``summary``...; ``job_name`` goes to SLURM only).
    Creates ``out_dir`` if needed. Both scripts are rendered before anything is written.
    Returns ``{"torchrun": path, "slurm": path}``. Raises :class:`InputError` (field
    ``out``) if a file exists and ``force`` is false, or if ``out_dir`` is not a directory;
    renderer errors as those functions.
    """
    job_name = kwargs.pop("job_name", None)
    texts = {"torchrun": render_torchrun_script(model, plan, **kwargs),
             "slurm": render_slurm_script(model, plan, job_name=job_name, **kwargs)}
    paths = {"torchrun": os.path.join(out_dir, TORCHRUN_FILE),
             "slurm": os.path.join(out_dir, SLURM_FILE)}
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError("out", out_dir, "is not a directory")
    if not force:
        for path in paths.values():
            if os.path.lexists(path):
                raise InputError("out", path, "exists; pass --force to overwrite")
    try:
        os.makedirs(out_dir, exist_ok=True)
        for key, path in paths.items():
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(texts[key])
    except OSError as err:
        raise InputError("out", out_dir, f"cannot write ({err.strerror})") from None
    mode = os.stat(paths["torchrun"]).st_mode
    os.chmod(paths["torchrun"], mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return paths
