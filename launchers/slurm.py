"""Render an ``sbatch`` script that starts Megatron-LM with one ``torchrun`` per node.

``srun`` starts one task per node running ``bash -c '<body>'``; the body is in single quotes
so that ``$SLURM_NODEID`` (or ``hostname``) expands on each node, and every quoted value
(flags, paths) reaches it as positional arguments expanded once on the batch host, so no
value is ever re-parsed by a shell. Without a host placement, node_rank is
``$SLURM_NODEID`` and the master is the first host of ``scontrol show hostnames
"$SLURM_JOB_NODELIST"`` (the node with SLURM_NODEID 0), taken from the whole list captured in
a variable (``scontrol ... | head -n1`` would end scontrol with SIGPIPE on a long host list,
and ``set -o pipefail`` would stop the job with status 141 before torchrun starts). With a
placement, the job asks for exactly those hosts (``--nodelist``) and never the hosts the
placement left out (``--exclude``), node_rank comes from the
host → node_rank table, and the master is the placement's node_rank 0, because SLURM numbers
nodes in its own order, not the placement's. Before ``srun`` the script prints the job's
hosts in node_rank order (the placement's, else that list) and the placement's GPU order for
the log's reader (:func:`launchers.script_parts.hosts_line`,
:func:`launchers.script_parts.gpu_order_line`).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from configurator.core.megatron_log import HOSTS_LINE_PREFIX
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan
from launchers.megatron_flags import TrainingArgs
from launchers.script_parts import (DEFAULT_MASTER_ADDR, LaunchInputs, check_inputs,
                                    data_block, device_pinning, env_default, environment_block,
                                    gpu_order_line, header, host_lookup, hosts_line,
                                    megatron_array, megatron_dir_check, node_rank_check,
                                    torchrun_array)


def render_slurm_script(model: ModelSpec, plan: ParallelPlan, *, nodes: int,
                        gpus_per_node: int, master_addr: str = DEFAULT_MASTER_ADDR,
                        master_port: int = 29500, hosts: Sequence[str] | None = None,
                        cuda_visible_devices: Sequence[Sequence[int]] | None = None,
                        excluded_hosts: Sequence[str] = (),
                        data_path: str | Sequence[str] | None = None,
                        tokenizer_model: str | None = None,
                        extra_args: Sequence[str] = (), training: TrainingArgs | None = None,
                        summary: Mapping[str, Any] | None = None,
                        job_name: str | None = None) -> str:
    """Return the text of ``launch_slurm.sbatch``; arguments as
    :func:`launchers.torchrun.render_torchrun_script`, plus ``job_name`` (default
    ``megatron-<model name>``, reduced to ``[A-Za-z0-9._-]``).

    ``master_addr``: the default takes ``$MASTER_ADDR``, else ``hosts[0]``, else the first
    host of the allocation. Submit with ``MEGATRON_LM_DIR=... sbatch launch_slurm.sbatch
    [extra Megatron flags...]`` (sbatch passes the environment to the job).
    Raises :class:`configurator.core.errors.InputError` for bad inputs or an illegal plan.
    """
    inp = check_inputs(model, plan, nodes=nodes, gpus_per_node=gpus_per_node,
                       master_addr=master_addr, master_port=master_port, hosts=hosts,
                       cuda_visible_devices=cuda_visible_devices,
                       excluded_hosts=excluded_hosts, data_path=data_path,
                       tokenizer_model=tokenizer_model, extra_args=extra_args,
                       training=training, summary=summary)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", job_name or f"megatron-{model.name}").strip("-")
    return "\n".join(_render(inp, name or "megatron")) + "\n"


def _master_addr_lines(inp: LaunchInputs) -> list[str]:
    if inp.master_addr is not None or inp.hosts:
        return [env_default("MASTER_ADDR", inp.master_addr or inp.hosts[0])]
    return ['JOB_HOSTS=""',
            'if [[ -z "${MASTER_ADDR:-}" ]]; then',
            '    if [[ -z "${SLURM_JOB_NODELIST:-}" ]]; then',
            '        echo "error: SLURM_JOB_NODELIST is not set; submit this script with '
            'sbatch" >&2',
            "        exit 2",
            "    fi",
            "    # the whole list, no pipe (head -n1 would kill scontrol with SIGPIPE: exit 141)",
            '    JOB_HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            "    MASTER_ADDR=${JOB_HOSTS%%$'\\n'*}",
            '    if [[ -z "$MASTER_ADDR" ]]; then',
            '        echo "error: scontrol show hostnames listed no host" >&2',
            "        exit 2",
            "    fi",
            "fi"]


def _hosts_lines(inp: LaunchInputs) -> list[str]:
    """The job's hosts in node_rank order, printed for the log (:func:`hosts_line`): the
    placement's, else SLURM's node list (``$SLURM_NODEID`` order), when scontrol gives it."""
    if inp.hosts:
        return hosts_line(inp)
    read = ('JOB_HOSTS=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null) '
            '|| JOB_HOSTS=""')
    lines = ["# the job's hosts in node_rank order, for validate/calibrate --topology"]
    if inp.master_addr is not None:           # no list was read for MASTER_ADDR
        lines.append(read)
    else:                                     # the list read for MASTER_ADDR, else read here
        lines += ['if [[ -z "$JOB_HOSTS" ]]; then', "    " + read, "fi"]
    return lines + ['if [[ -n "$JOB_HOSTS" ]]; then',
                    f"    echo \"{HOSTS_LINE_PREFIX}${{JOB_HOSTS//$'\\n'/ }}\"",
                    "fi"]


def _node_body(inp: LaunchInputs) -> list[str]:
    """The per-node script run by ``srun bash -c '...'`` (must contain no single quote)."""
    ind = "    "
    body = [f"{ind}set -euo pipefail",
            *(f"{ind}{line}" for line in environment_block(inp.plan))]
    if inp.hosts:
        body += [f'{ind}NODE_RANK=""'] + host_lookup(inp, ind)
    else:
        body += [f'{ind}NODE_RANK="$SLURM_NODEID"']
    body += node_rank_check(inp, ind) + device_pinning(inp, ind)
    body += [f'{ind}exec torchrun --node-rank "$NODE_RANK" "$@"']
    assert not any("'" in line for line in body), "srun body must not contain a single quote"
    return body


def _render(inp: LaunchInputs, job_name: str) -> list[str]:
    sbatch = [f"#SBATCH --job-name={job_name}",
              f"#SBATCH --nodes={inp.nodes}",
              "#SBATCH --ntasks-per-node=1",
              f"#SBATCH --gpus-per-node={inp.gpus_per_node}",
              "#SBATCH --exclusive"]
    if inp.hosts:
        sbatch.append(f"#SBATCH --nodelist={','.join(inp.hosts)}")
    if inp.excluded_hosts:
        sbatch.append(f"#SBATCH --exclude={','.join(inp.excluded_hosts)}")
    usage = ["Submit: MEGATRON_LM_DIR=/path/to/Megatron-LM sbatch launch_slurm.sbatch "
             "[extra pretrain_gpt.py flags...]",
             "node_rank: " + ("from hostname via the placement above." if inp.hosts
                              else "$SLURM_NODEID."),
             "Environment: MASTER_ADDR, MASTER_PORT" + (", DATA_PATH, TOKENIZER_TYPE, "
                                                         "TOKENIZER_MODEL" if inp.data_path
                                                         else "")]
    head = header(inp, "SLURM launch", usage)
    lines = [head[0], *sbatch, *head[1:]]
    lines += ["set -euo pipefail", ""]
    lines += ["# exported here and again on each node (in case srun does not pass the "
              "environment)"] + environment_block(inp.plan) + [""]
    lines += megatron_dir_check() + [""]
    lines += _master_addr_lines(inp)
    lines += [env_default("MASTER_PORT", str(inp.master_port)),
              "export MASTER_ADDR MASTER_PORT", ""]
    block = data_block(inp)
    if block:
        lines += block + [""]
    lines += torchrun_array(inp, node_rank_expr="") + [""]
    lines += megatron_array(inp) + [""]
    lines += _hosts_lines(inp) + gpu_order_line(inp) + [""]
    lines += ["# shellcheck disable=SC2016  # single quotes: the body expands on each node",
              f"srun --nodes={inp.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '"]
    lines += _node_body(inp)
    lines += ["' bash \"${TORCHRUN_ARGS[@]}\" \"$MEGATRON_LM_DIR/pretrain_gpt.py\" "
              "\"${MEGATRON_ARGS[@]}\" \"$@\""]
    return lines
