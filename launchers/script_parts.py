"""Pieces shared by the torchrun and SLURM renderers: input checks, header, bash snippets.

Every value written into a script is either shell-quoted with :func:`shlex.quote`, a checked
integer, or a host name restricted to ``[A-Za-z0-9._-]`` (RFC 1123 letters, digits, hyphen,
plus dots and underscores), so no value can change the script's meaning.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan, describe_plan
from configurator.core.rules import check_plan
from launchers.megatron_flags import (DEFAULT_TOKENIZER_TYPE, MEGATRON_TAG, TrainingArgs,
                                      Value, format_value, megatron_flags)

#: The ``master_addr`` default: ``$MASTER_ADDR`` from the environment, else the first host of
#: the placement, else localhost.
DEFAULT_MASTER_ADDR = "${MASTER_ADDR:-localhost}"

_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True, kw_only=True)
class LaunchInputs:
    """Checked inputs of one launch script (see :func:`check_inputs`)."""

    model: ModelSpec
    plan: ParallelPlan
    nodes: int
    gpus_per_node: int
    master_addr: str | None          # None: environment, else hosts[0], else localhost
    master_port: int
    hosts: tuple[str, ...] | None    # in node_rank order
    cuda_visible_devices: tuple[tuple[int, ...], ...] | None   # per node_rank
    data_path: str | None
    tokenizer_model: str | None
    extra_args: tuple[str, ...]
    training: TrainingArgs
    summary: Mapping[str, Any]


def check_inputs(model: ModelSpec, plan: ParallelPlan, *, nodes: Any, gpus_per_node: Any,
                 master_addr: Any = DEFAULT_MASTER_ADDR, master_port: Any = 29500,
                 hosts: Sequence[str] | None = None,
                 cuda_visible_devices: Sequence[Sequence[int]] | None = None,
                 data_path: str | None = None, tokenizer_model: str | None = None,
                 extra_args: Sequence[str] = (), training: TrainingArgs | None = None,
                 summary: Mapping[str, Any] | None = None) -> LaunchInputs:
    """Validate the renderers' arguments; raise :class:`InputError` naming the bad field.

    ``plan`` must satisfy :func:`configurator.core.plan.check_plan` for ``nodes * gpus_per_node``
    GPUs. ``hosts``: ``nodes`` distinct host names in node_rank order.
    ``cuda_visible_devices``: one list per node of ``gpus_per_node`` distinct device indices
    (physical, PCI bus order).
    """
    nodes = v.positive_int("nodes", nodes)
    gpus = v.positive_int("gpus_per_node", gpus_per_node)
    check_plan(model, plan, nodes * gpus)
    port = v.positive_int("master_port", master_port)
    if port > 65535:
        raise InputError("master_port", port, "must be a TCP port in 1..65535")
    if master_addr == DEFAULT_MASTER_ADDR or master_addr is None:
        addr = None
    elif not isinstance(master_addr, str) or not master_addr.strip():
        raise InputError("master_addr", master_addr, "must be a non-empty host name or address")
    else:
        addr = master_addr
    host_t = None
    if hosts is not None:
        host_t = tuple(hosts)
        if len(host_t) != nodes:
            raise InputError("hosts", list(host_t), f"must name exactly nodes={nodes} hosts")
        for h in host_t:
            if not isinstance(h, str) or not _HOST_RE.match(h):
                raise InputError("hosts", h, "must be a host name of letters, digits, '.', "
                                 "'-' and '_'")
        if len(set(host_t)) != nodes:
            raise InputError("hosts", list(host_t), "must not repeat a host")
    cvd = None
    if cuda_visible_devices is not None:
        cvd = tuple(tuple(perm) for perm in cuda_visible_devices)
        if len(cvd) != nodes:
            raise InputError("cuda_visible_devices", [list(p) for p in cvd],
                             f"must give one device list per node ({nodes})")
        for perm in cvd:
            if (len(perm) != gpus or len(set(perm)) != gpus
                    or any(isinstance(d, bool) or not isinstance(d, int) or d < 0
                           for d in perm)):
                raise InputError("cuda_visible_devices", list(perm),
                                 f"must list {gpus} distinct non-negative device indices")
    for name, val in (("data_path", data_path), ("tokenizer_model", tokenizer_model)):
        if val is not None and (not isinstance(val, str) or not val):
            raise InputError(name, val, "must be a non-empty string")
    if tokenizer_model is not None and data_path is None:
        raise InputError("tokenizer_model", tokenizer_model,
                         "needs data_path (mock data uses NullTokenizer)")
    extra = tuple(extra_args)
    for word in extra:
        if not isinstance(word, str):
            raise InputError("extra_args", word, "must be strings")
    return LaunchInputs(model=model, plan=plan, nodes=nodes, gpus_per_node=gpus,
                        master_addr=addr, master_port=port, hosts=host_t,
                        cuda_visible_devices=cvd, data_path=data_path,
                        tokenizer_model=tokenizer_model, extra_args=extra,
                        training=(training or TrainingArgs()).checked(),
                        summary=dict(summary or {}))


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def header(inp: LaunchInputs, title: str, usage: Sequence[str]) -> list[str]:
    """Comment lines summarising the model, plan, cluster and predicted figures."""
    p, m = inp.plan, inp.model
    lines = [
        "#!/usr/bin/env bash",
        f"# {title}: Megatron-LM pretrain_gpt.py ({MEGATRON_TAG} flags), rendered by "
        "configurator.",
        f"# model: {_one_line(m.name)}: layers={m.num_layers} hidden={m.hidden_size} "
        f"ffn={m.ffn_hidden_size} heads={m.num_attention_heads} "
        f"query_groups={m.num_query_groups} seq={m.seq_length} vocab={m.vocab_size}",
        *textwrap.wrap(" ".join(describe_plan(p)), 92, initial_indent="# plan: ",
                       subsequent_indent="#       ", break_long_words=False),
        f"# cluster: nodes={inp.nodes} gpus_per_node={inp.gpus_per_node} "
        f"world_size={inp.nodes * inp.gpus_per_node}",
    ]
    if inp.hosts:
        lines.append("# node_rank -> host: " + " ".join(
            f"{r}={h}" for r, h in enumerate(inp.hosts)))
    if inp.cuda_visible_devices:
        lines.append("# node_rank -> CUDA_VISIBLE_DEVICES: " + " ".join(
            f"{r}=" + ",".join(map(str, perm)) for r, perm in enumerate(inp.cuda_visible_devices)))
    if inp.summary:
        lines.append("# predicted:")
        lines += [f"#   {_one_line(k)}: {_one_line(val)}" for k, val in inp.summary.items()]
    lines += ["#"] + [f"# {_one_line(u)}" for u in usage]
    return lines


def env_default(name: str, value: str) -> str:
    """``NAME=${NAME:-'value'}``: the environment wins, else the quoted literal ``value``.

    A value with ``$`` or a backquote is preceded by a shellcheck directive (SC2016: it is
    meant literally).
    """
    line = f"{name}=${{{name}:-{shlex.quote(value)}}}"
    if "$" in value or "`" in value:
        return "# shellcheck disable=SC2016  # a literal value\n" + line
    return line


def environment_block() -> list[str]:
    """Exports every rank needs: one CUDA connection (Megatron validate_args asserts
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tp > 1 or cp > 1 before Blackwell, so that
    communication kernels are queued in issue order) and PCI-bus GPU numbering (so that
    ``CUDA_VISIBLE_DEVICES`` indices match ``nvidia-smi``)."""
    return ["export CUDA_DEVICE_MAX_CONNECTIONS=1", "export CUDA_DEVICE_ORDER=PCI_BUS_ID"]


def megatron_dir_check() -> list[str]:
    """Fail with a clear message unless ``$MEGATRON_LM_DIR/pretrain_gpt.py`` exists."""
    return [
        'if [[ -z "${MEGATRON_LM_DIR:-}" ]]; then',
        f'    echo "error: MEGATRON_LM_DIR is not set; point it at a Megatron-LM checkout '
        f'({MEGATRON_TAG})" >&2',
        "    exit 2",
        "fi",
        'if [[ ! -f "$MEGATRON_LM_DIR/pretrain_gpt.py" ]]; then',
        '    echo "error: $MEGATRON_LM_DIR/pretrain_gpt.py not found; MEGATRON_LM_DIR must be '
        'a Megatron-LM checkout" >&2',
        "    exit 2",
        "fi",
    ]


def data_block(inp: LaunchInputs) -> list[str]:
    """Data variables (environment overrides them) when a real data path is used."""
    if inp.data_path is None:
        return []
    out = ["# data and tokenizer (override from the environment)",
           env_default("DATA_PATH", inp.data_path),
           env_default("TOKENIZER_TYPE", DEFAULT_TOKENIZER_TYPE)]
    if inp.tokenizer_model is not None:
        out.append(env_default("TOKENIZER_MODEL", inp.tokenizer_model))
    else:
        out += ['if [[ -z "${TOKENIZER_MODEL:-}" ]]; then',
                '    echo "error: set TOKENIZER_MODEL (a Hugging Face tokenizer name or path) '
                'for --data-path" >&2',
                "    exit 2",
                "fi"]
    return out


def megatron_array(inp: LaunchInputs, name: str = "MEGATRON_ARGS") -> list[str]:
    """A bash array holding every ``pretrain_gpt.py`` flag, one per line, grouped."""
    groups = megatron_flags(inp.model, inp.plan, training=inp.training,
                            data_path=inp.data_path)
    out = ["# shellcheck disable=SC2054  # commas belong to values (--split 949,50,1)",
           f"{name}=("]
    for group, flags in groups:
        out.append(f"    # {group}")
        for flag, val in flags:
            out.append(f"    {flag}" if val is True else f"    {flag} {format_value(val)}")
    if inp.extra_args:
        out.append("    # extra arguments")
        out += [f"    {shlex.quote(w)}" for w in inp.extra_args]
    out.append(")")
    return out


def host_lookup(inp: LaunchInputs, indent: str = "") -> list[str]:
    """Bash setting an empty NODE_RANK from ``hostname`` via the placement table.

    A host matches by its full name or by its short name followed by a domain. Uses only
    checked host names and integers (no single quote), so it can sit inside a single-quoted
    ``bash -c`` body. Empty when no hosts are given.
    """
    if not inp.hosts:
        return []
    out = [f'{indent}if [[ -z "$NODE_RANK" ]]; then',
           f'{indent}    case "$(hostname)" in']
    out += [f"{indent}        {h}|{h}.*) NODE_RANK={r} ;;" for r, h in enumerate(inp.hosts)]
    out += [f'{indent}        *) echo "error: host $(hostname) is not in the placement '
            f'({" ".join(inp.hosts)}); pass the node rank" >&2; exit 2 ;;',
            f"{indent}    esac",
            f"{indent}fi"]
    return out


def device_pinning(inp: LaunchInputs, indent: str = "") -> list[str]:
    """Bash exporting this node's CUDA_VISIBLE_DEVICES (PCI bus order) by NODE_RANK.

    Local rank k of torchrun uses ``cuda:k``, the k-th listed device. Empty when no
    permutation is given (CUDA_VISIBLE_DEVICES is then left as the environment has it).
    """
    if not inp.cuda_visible_devices:
        return []
    out = [f'{indent}case "$NODE_RANK" in']
    out += [f"{indent}    {r}) export CUDA_VISIBLE_DEVICES={','.join(map(str, perm))} ;;"
            for r, perm in enumerate(inp.cuda_visible_devices)]
    out.append(f"{indent}esac")
    return out


def node_rank_check(inp: LaunchInputs, indent: str = "") -> list[str]:
    """Fail unless NODE_RANK is an integer in ``[0, nodes)``; strip leading zeros.

    Contains no single quote, so it can sit inside a single-quoted ``bash -c`` body.
    """
    return [f'{indent}if ! [[ "$NODE_RANK" =~ ^[0-9]+$ ]] || (( 10#$NODE_RANK >= {inp.nodes} )); '
            "then",
            f'{indent}    echo "error: node rank must be an integer in 0..{inp.nodes - 1}, '
            'got \\"$NODE_RANK\\"" >&2',
            f"{indent}    exit 2",
            f"{indent}fi",
            f"{indent}NODE_RANK=$(( 10#$NODE_RANK ))"]


def torchrun_array(inp: LaunchInputs, node_rank_expr: str = '"$NODE_RANK"') -> list[str]:
    """The torchrun rendezvous arguments (static rendezvous: deterministic node ranks)."""
    return ["TORCHRUN_ARGS=(",
            f"    --nnodes {inp.nodes}",
            f"    --nproc-per-node {inp.gpus_per_node}",
            *([f"    --node-rank {node_rank_expr}"] if node_rank_expr else []),
            '    --master-addr "$MASTER_ADDR"',
            '    --master-port "$MASTER_PORT"',
            ")"]


__all__ = ["DEFAULT_MASTER_ADDR", "LaunchInputs", "check_inputs", "header", "env_default",
           "environment_block", "megatron_dir_check", "data_block", "megatron_array",
           "host_lookup", "device_pinning", "node_rank_check", "torchrun_array", "Value"]
