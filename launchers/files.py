"""Write the launch scripts of one plan to a directory, never overwriting without ``force``
and never writing through a symbolic link.

:func:`check_out_dir` refuses an output directory or file that is a symbolic link (also with
``force``); :func:`write_files` then writes without following a link made after that check:
the directory is opened with ``O_NOFOLLOW`` and every file is created relative to it, with
``O_CREAT | O_EXCL | O_NOFOLLOW`` (without ``force``), or as a fresh temporary file in the
same directory renamed over the old name (with ``force``; a rename replaces a link itself,
never its target).
"""

from __future__ import annotations

import errno
import os
import secrets
import shlex
from typing import Any, Iterable, Mapping

from configurator.core.document import PlacementRecord, as_placement
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from launchers.bridge import BRIDGE_FILE, render_bridge_overrides
from launchers.slurm import render_slurm_script
from launchers.torchrun import render_torchrun_script

TORCHRUN_FILE = "launch_torchrun.sh"
SLURM_FILE = "launch_slurm.sbatch"
#: Creation modes (before the umask): the torchrun script is executable.
FILE_MODE, SCRIPT_MODE = 0o666, 0o777

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _plain(out_dir: str) -> str:
    """``out_dir`` without trailing slashes (``link/`` would follow the link ``link``)."""
    return out_dir.rstrip("/") or "/"


def _link_error(path: str, field: str = "out") -> InputError:
    return InputError(field, path, f"{os.path.basename(path)} is a symbolic link; refusing to "
                                   "write through it (also with --force)")


def check_out_dir(out_dir: str, names: Iterable[str], force: bool,
                  field: str = "out") -> None:
    """Raise :class:`InputError` (field ``field``, naming the path) if ``out_dir`` or one of
    ``names`` in it is a symbolic link (with or without ``force``), if ``out_dir`` exists and
    is not a directory, or if one of ``names`` exists and ``force`` is false."""
    out_dir = _plain(out_dir)
    if os.path.islink(out_dir):
        raise InputError(field, out_dir, "the output directory is a symbolic link; refusing to "
                                         "write through it (give the directory itself)")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(field, out_dir, "exists and is not a directory")
    for name in names:
        path = os.path.join(out_dir, name)
        if os.path.islink(path):
            raise _link_error(path, field)
        if not force and os.path.lexists(path):
            raise InputError(field, path, "exists; pass --force to overwrite")


def check_out_file(path: str, force: bool, field: str = "out") -> None:
    """:func:`check_out_dir` for one output file ``path`` (its directory and name), and
    :class:`InputError` (field ``field``) if ``path`` names a directory: run it before the
    work whose result :func:`write_text_file` writes."""
    directory, name = os.path.split(_plain(path))
    if not name or os.path.isdir(path) and not os.path.islink(path):
        raise InputError(field, path, "is a directory; give a file name")
    check_out_dir(directory or ".", [name], force, field)


def write_text_file(path: str, text: str, force: bool) -> str:
    """Write ``text`` (UTF-8) to ``path`` as :func:`write_files` writes (never through a
    symbolic link; an existing file only with ``force``). Returns the path."""
    directory, name = os.path.split(_plain(path))
    return write_files(directory or ".", {name: (text.encode("utf-8"), FILE_MODE)},
                       force=force)[0]


def _write_one(dir_fd: int, out_dir: str, name: str, data: bytes, mode: int,
               force: bool) -> None:
    path = os.path.join(out_dir, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC
    target = f".{name}.{secrets.token_hex(8)}.tmp" if force else name
    try:
        fd = os.open(target, flags, mode, dir_fd=dir_fd)
    except FileExistsError:
        if os.path.islink(path):
            raise _link_error(path) from None
        raise InputError("out", path, "exists; pass --force to overwrite") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if force:
            os.replace(target, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(target, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def write_files(out_dir: str, files: Mapping[str, tuple[bytes, int]], *,
                force: bool = False) -> list[str]:
    """Write ``files`` (``{name: (content, creation mode)}``) into ``out_dir`` (created if
    needed); returns their paths.

    Never follows a symbolic link: not ``out_dir`` itself (its parents may be links) and not
    a file name, even if the link appears after :func:`check_out_dir`. Without ``force`` an
    existing file is refused; with ``force`` it is replaced by a new file (a link by that
    name is replaced, its target left alone). Raises :class:`InputError` (field ``out``).
    """
    out_dir = _plain(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        dir_fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP or os.path.islink(out_dir):
            raise InputError("out", out_dir, "the output directory is a symbolic link; "
                                             "refusing to write through it (give the directory "
                                             "itself)") from None
        if err.errno in (errno.ENOTDIR, errno.EEXIST):
            raise InputError("out", out_dir, "exists and is not a directory") from None
        raise InputError("out", out_dir, f"cannot write ({err.strerror})") from None
    paths = []
    try:
        for name, (data, mode) in files.items():
            if os.sep in name or name in ("", ".", ".."):
                raise InputError("out", name, "must be a plain file name")
            try:
                _write_one(dir_fd, out_dir, name, data, mode, force)
            except OSError as err:
                raise InputError("out", os.path.join(out_dir, name),
                                 f"cannot write ({err.strerror})") from None
            paths.append(os.path.join(out_dir, name))
    finally:
        os.close(dir_fd)
    return paths


#: The renderers' arguments a ``placement`` stands for.
PLACEMENT_ARGS = ("hosts", "cuda_visible_devices", "excluded_hosts")


def placement_kwargs(placement: PlacementRecord | Mapping[str, Any] | None, *,
                     nodes: int | None = None,
                     gpus_per_node: int | None = None) -> dict[str, Any]:
    """The renderers' ``hosts``, ``cuda_visible_devices`` (from ``gpu_order``) and
    ``excluded_hosts`` from a placement: a :class:`PlacementRecord` or a plan.json
    ``placement`` object (:func:`configurator.core.document.placement_record`), validated
    (:func:`configurator.core.document.read_placement`, against ``nodes`` and
    ``gpus_per_node`` when given); ``{}`` for None. Raises :class:`InputError`
    (field ``placement...``)."""
    if placement is None:
        return {}
    rec = as_placement(placement, nodes=nodes, gpus_per_node=gpus_per_node)
    return {"hosts": list(rec.hosts), "cuda_visible_devices": [list(o) for o in rec.gpu_order],
            "excluded_hosts": list(rec.excluded_hosts)}


def launch_files(model: ModelSpec, plan: ParallelPlan,
                 **kwargs: Any) -> dict[str, tuple[bytes, int]]:
    """Render both scripts and the Megatron-Bridge overrides (``bridge_overrides.yaml``,
    :mod:`launchers.bridge`): ``{file name: (UTF-8 text, creation mode)}`` for
    :func:`write_files`; ``kwargs`` as :func:`write_launch_files`."""
    job_name = kwargs.pop("job_name", None)
    placement = kwargs.pop("placement", None)
    if placement is not None:
        given = [k for k in PLACEMENT_ARGS if kwargs.get(k) not in (None, (), [])]
        if given:
            raise InputError("placement", given[0], "give placement or hosts, "
                             "cuda_visible_devices and excluded_hosts, not both")
        shape = {k: kwargs[k] for k in ("nodes", "gpus_per_node")
                 if isinstance(kwargs.get(k), int) and not isinstance(kwargs[k], bool)}
        kwargs.update(placement_kwargs(placement, **shape))
    files = {TORCHRUN_FILE: (render_torchrun_script(model, plan, **kwargs).encode(),
                             SCRIPT_MODE),
             SLURM_FILE: (render_slurm_script(model, plan, job_name=job_name,
                                              **kwargs).encode(), FILE_MODE)}
    # the scripts have checked the shape (nodes, GPUs per node) against the plan
    files[BRIDGE_FILE] = (render_bridge_overrides(
        model, plan, nodes=kwargs["nodes"], gpus_per_node=kwargs["gpus_per_node"],
        summary=kwargs.get("summary")).encode(), FILE_MODE)
    return files


def write_launch_files(out_dir: str, model: ModelSpec, plan: ParallelPlan, *,
                       force: bool = False, **kwargs: Any) -> dict[str, str]:
    """Render and write ``launch_torchrun.sh`` (executable), ``launch_slurm.sbatch`` and
    ``bridge_overrides.yaml`` (the plan as Megatron-Bridge overrides).

    ``kwargs`` are the renderers' keyword arguments (``nodes``, ``gpus_per_node``, ``hosts``,
    ``cuda_visible_devices``, ``excluded_hosts``, ``data_path``, ``tokenizer_model``,
    ``summary``...; ``job_name`` goes to SLURM only). ``placement``: a
    :class:`~configurator.core.document.PlacementRecord` or a plan.json ``placement``
    object (:func:`configurator.core.document.placement_record`) standing for ``hosts``,
    ``cuda_visible_devices`` (its ``gpu_order``) and ``excluded_hosts`` (give one or the
    other; :func:`placement_kwargs`). Creates ``out_dir`` if needed. Both scripts are
    rendered before anything is written. Returns ``{"torchrun": path, "slurm": path,
    "bridge": path}``.
    Raises :class:`InputError` (field ``out``) if a file exists and ``force`` is false, if
    ``out_dir`` or a file is a symbolic link, or if ``out_dir`` is not a directory;
    renderer errors as those functions.
    """
    files = launch_files(model, plan, **kwargs)
    check_out_dir(out_dir, files, force)
    tr, sl, br = write_files(out_dir, files, force=force)
    return {"torchrun": tr, "slurm": sl, "bridge": br}


def start_instructions(out_dir: str, *, nodes: int, placed: bool, data: bool,
                       plan_file: str | None = None) -> list[str]:
    """What to run to start the job the scripts in ``out_dir`` launch, as the scripts' own
    usage lines say (``launchers.torchrun`` and ``launchers.slurm``): the Megatron-LM
    checkout in ``MEGATRON_LM_DIR``; on SLURM one ``sbatch``; with torchrun the script on
    every node with its node rank (from the host name when ``placed``; 0 on one node) and,
    on several nodes without a placement, ``MASTER_ADDR``. Without ``data`` the scripts
    train on ``--mock-data`` for 100 iterations: the last line says how to point them at a
    dataset (``launch --data-path``, from ``plan_file``)."""
    torchrun = shlex.quote(os.path.join(out_dir, TORCHRUN_FILE))
    slurm = shlex.quote(os.path.join(out_dir, SLURM_FILE))
    plan_file = shlex.quote(plan_file or "plan.json")
    env = "MEGATRON_LM_DIR=/path/to/Megatron-LM"
    if nodes == 1 or placed:
        node = f"{env} bash {torchrun}" + ("" if nodes == 1 else "   (on every host of the "
                                                                 "placement)")
    else:
        node = (f"{env} MASTER_ADDR=<node_rank 0's address> bash {torchrun} NODE_RANK   "
                f"(on each of the {nodes} nodes, NODE_RANK 0..{nodes - 1})")
    lines = ["to start the job (a Megatron-LM core_v0.16.1 checkout on every node):",
             f"  SLURM:    {env} sbatch {slurm}",
             f"  torchrun: {node}"]
    if not data:
        lines.append("it trains on --mock-data for 100 iterations; for your dataset: "
                     f"configurator launch --plan {plan_file} --out DIR "
                     "--data-path PREFIX --tokenizer-model TOKENIZER")
    return lines
