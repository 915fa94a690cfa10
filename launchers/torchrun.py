"""Render a bash script that starts Megatron-LM on one node with ``torchrun``.

The same script runs on every node; each node passes its node_rank (first argument, or
``$NODE_RANK``, or, with a host placement, looked up from ``hostname``). Rendezvous is
static (``--node-rank``, ``--master-addr``, ``--master-port``), so node_rank k is exactly the
k-th host of the placement and holds global ranks ``k*G .. k*G+G-1`` (torchrun: RANK = sum of
nproc of lower node ranks + LOCAL_RANK; torch/distributed/run.py). c10d rendezvous would
instead number nodes by sorted host name.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from launchers.megatron_flags import TrainingArgs
from launchers.script_parts import (DEFAULT_MASTER_ADDR, LOOPBACK_PATTERN, LaunchInputs,
                                    check_inputs, data_block, device_pinning, env_default,
                                    environment_block, gpu_order_line, header, host_lookup,
                                    hosts_line, megatron_array, megatron_dir_check,
                                    node_rank_check, torchrun_array)


def render_torchrun_script(model: ModelSpec, plan: ParallelPlan, *, nodes: int,
                           gpus_per_node: int, master_addr: str = DEFAULT_MASTER_ADDR,
                           master_port: int = 29500, hosts: Sequence[str] | None = None,
                           cuda_visible_devices: Sequence[Sequence[int]] | None = None,
                           excluded_hosts: Sequence[str] = (),
                           data_path: str | Sequence[str] | None = None,
                           tokenizer_model: str | None = None,
                           extra_args: Sequence[str] = (),
                           training: TrainingArgs | None = None,
                           summary: Mapping[str, Any] | None = None) -> str:
    """Return the text of ``launch_torchrun.sh`` for ``plan`` on ``nodes × gpus_per_node``.

    ``master_addr``: an address (overridable by ``$MASTER_ADDR``; on several nodes not a
    loopback address); the default takes ``$MASTER_ADDR``, else, on one node, ``localhost``,
    else ``hosts[0]`` (node_rank 0); on several nodes without hosts the script refuses to
    start (exit 2) unless ``$MASTER_ADDR`` is set to an address other than
    localhost/127.x/::1. ``hosts``: host names in node_rank order (the script looks its
    node_rank up from ``hostname``). ``cuda_visible_devices``: per node_rank, the physical
    GPU indices (PCI bus order) for local ranks 0..G-1; none leaves CUDA_VISIBLE_DEVICES
    alone. ``excluded_hosts``: hosts the placement leaves out (the script refuses to run on
    them; SLURM excludes them).
    ``data_path``/``tokenizer_model``: real data (else mock data): one path or the words of
    a blend (``["0.3", "/a", "0.7", "/b"]``), and the tokenizer it requires. ``extra_args``:
    appended to the Megatron flags (argparse keeps the last of a repeated flag). ``summary``: figures
    shown in the header (e.g. predicted iteration time).

    Usage of the script: ``MEGATRON_LM_DIR=... bash launch_torchrun.sh [NODE_RANK]
    [extra Megatron flags...]``. Raises :class:`configurator.core.errors.InputError` for bad
    inputs or a plan Megatron would reject (:func:`configurator.core.rules.check_plan`).
    """
    inp = check_inputs(model, plan, nodes=nodes, gpus_per_node=gpus_per_node,
                       master_addr=master_addr, master_port=master_port, hosts=hosts,
                       cuda_visible_devices=cuda_visible_devices,
                       excluded_hosts=excluded_hosts, data_path=data_path,
                       tokenizer_model=tokenizer_model, extra_args=extra_args,
                       training=training, summary=summary)
    return "\n".join(_render(inp)) + "\n"


def _master_addr_default(inp: LaunchInputs) -> str:
    """The given address, else on one node localhost (the master is the node itself, whose
    placement name may be no name it resolves: ``nvidia-smi topo -m`` output names its host
    after the file), else node_rank 0's host."""
    if inp.master_addr is not None:
        return inp.master_addr
    return "localhost" if inp.nodes == 1 or not inp.hosts else inp.hosts[0]


def _master_addr_lines(inp: LaunchInputs) -> list[str]:
    """``MASTER_ADDR``: the environment's, else the default (:func:`_master_addr_default`).

    On several nodes without a placement there is no default: the script stops (exit 2)
    unless ``$MASTER_ADDR`` is set, and, whatever its source, unless it is an address other
    than localhost/127.x/::1 (:data:`LOOPBACK_PATTERN`), which would leave every other node
    waiting for a master on itself. With a placement the environment's address is used as
    given (stand-in hosts on one machine use 127.0.0.1).
    """
    if inp.nodes == 1 or inp.hosts:
        return [env_default("MASTER_ADDR", _master_addr_default(inp))]
    if inp.master_addr is not None:
        lines = [env_default("MASTER_ADDR", inp.master_addr)]
    else:
        lines = ['MASTER_ADDR="${MASTER_ADDR:-}"',
                 'if [[ -z "$MASTER_ADDR" ]]; then',
                 f'    echo "error: a {inp.nodes}-node run needs MASTER_ADDR, the address of '
                 'node_rank 0 that every node reaches (this script has no host placement to '
                 'take it from); it is not set" >&2',
                 "    exit 2",
                 "fi"]
    return lines + ['case "${MASTER_ADDR,,}" in',
                    f"    {LOOPBACK_PATTERN})",
                    f'        echo "error: a {inp.nodes}-node run needs MASTER_ADDR, the '
                    'address of node_rank 0 that every node reaches, not $MASTER_ADDR (this '
                    'machine only)" >&2',
                    "        exit 2 ;;",
                    "esac"]


def _render(inp: LaunchInputs) -> list[str]:
    if inp.hosts:
        rank_help = "NODE_RANK: first argument, else $NODE_RANK, else looked up from hostname."
    elif inp.nodes == 1:
        rank_help = "NODE_RANK: first argument, else $NODE_RANK, else 0."
    else:
        rank_help = "NODE_RANK: first argument, else $NODE_RANK (required)."
    usage = [
        "Usage on every node: MEGATRON_LM_DIR=/path/to/Megatron-LM bash launch_torchrun.sh "
        "[NODE_RANK] [extra pretrain_gpt.py flags...]",
        rank_help,
        "Environment: MASTER_ADDR" + (" (required: node_rank 0's address)"
                                      if inp.nodes > 1 and not inp.hosts
                                      and inp.master_addr is None else "")
        + ", MASTER_PORT" + (", DATA_PATH, TOKENIZER_TYPE, TOKENIZER_MODEL" if inp.data_path
                             else ""),
    ]
    lines = header(inp, "torchrun launch", usage)
    lines += ["set -euo pipefail", ""]
    lines += environment_block(inp.plan) + [""]
    lines += megatron_dir_check() + [""]
    lines += _master_addr_lines(inp)
    lines += [env_default("MASTER_PORT", str(inp.master_port)), ""]
    lines += ['NODE_RANK="${NODE_RANK:-}"',
              'if [[ $# -gt 0 && "$1" != -* ]]; then',
              '    NODE_RANK="$1"',
              "    shift",
              "fi"]
    if not inp.hosts:
        default = "0" if inp.nodes == 1 else ""
        if default:
            lines.append('NODE_RANK="${NODE_RANK:-0}"')
        else:
            lines += ['if [[ -z "$NODE_RANK" ]]; then',
                      f'    echo "error: pass the node rank (0..{inp.nodes - 1}) as the first '
                      'argument or set NODE_RANK" >&2',
                      "    exit 2",
                      "fi"]
    lines += host_lookup(inp)
    lines += node_rank_check(inp)
    lines += device_pinning(inp) + [""]
    block = data_block(inp)
    if block:
        lines += block + [""]
    lines += torchrun_array(inp) + [""]
    lines += megatron_array(inp) + [""]
    lines += hosts_line(inp) + gpu_order_line(inp)
    lines += ['exec torchrun "${TORCHRUN_ARGS[@]}" "$MEGATRON_LM_DIR/pretrain_gpt.py" '
              '"${MEGATRON_ARGS[@]}" "$@"']
    return lines
