"""Pieces shared by the torchrun and SLURM renderers: input checks, header, bash snippets.

Every value written into a script is one of:

- shell-quoted with :func:`shlex.quote` (paths, tokenizer, master address, extra arguments,
  flag values): one word, never expanded; such strings may not hold NUL, control or
  line-separator characters or surrogates where they must reach Megatron intact
  (:func:`check_inputs`);
- a checked integer (nodes, GPUs, ports, ranks, device indices);
- a host name matching ``[A-Za-z0-9][A-Za-z0-9._-]*`` in full (RFC 1123 letters, digits,
  hyphen, plus dots and underscores; no glob or quote character, so it is safe unquoted in a
  ``case`` pattern and inside the single-quoted ``srun bash -c`` body);
- text in a ``#`` comment passed through :func:`configurator.core.errors.flat`, which keeps printable
  characters only, so no line break (``\\n``, ``\\r``, U+2028/2029, U+0085), escape sequence
  (``\\x1b``) or bidirectional control can end the comment or mislead a reader;
- the SLURM job name, reduced to ``[A-Za-z0-9._-]``.

So no input can change the script's meaning.
"""

from __future__ import annotations

import math
import shlex
import textwrap
import unicodedata
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from configurator.core import validate as v
from configurator.core.document import check_host_name
from configurator.core.errors import InputError, flat
from configurator.core.megatron_log import GPU_ORDER_LINE_PREFIX, HOSTS_LINE_PREFIX
from configurator.core.model import ModelSpec
from configurator.core.plan import ParallelPlan, describe_plan
from configurator.core.runs import gpu_order_text
from configurator.core.rules import check_plan
from launchers.megatron_flags import (CHECKPOINT_DIR_VAR, DATA_PATHS_VAR,
                                      DEFAULT_CHECKPOINT_DIR, DEFAULT_TOKENIZER_TYPE, MEGATRON_TAG,
                                      TrainingArgs, Value, format_value, megatron_flags)

#: The ``master_addr`` default: ``$MASTER_ADDR`` from the environment, else the first host of
#: the placement, else localhost on one node; on several nodes without a placement the
#: torchrun script requires ``$MASTER_ADDR`` (never localhost).
DEFAULT_MASTER_ADDR = "${MASTER_ADDR:-localhost}"

#: Addresses that reach only the machine itself (lower case), as a bash ``case`` pattern:
#: localhost (and ``localhost.<domain>``), 127.0.0.0/8, ::1 and the unspecified 0.0.0.0.
LOOPBACK_PATTERN = r"localhost|localhost.*|127.*|::1|\[::1\]|0:0:0:0:0:0:0:1|0.0.0.0"

#: Unicode categories refused in a path or tokenizer (control, format such as bidirectional
#: overrides, line and paragraph separators, surrogates that UTF-8 cannot encode).
_BAD_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")


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
    excluded_hosts: tuple[str, ...]  # hosts the job must not get (sbatch --exclude)
    cuda_visible_devices: tuple[tuple[int, ...], ...] | None   # per node_rank
    data_path: tuple[str, ...] | None   # the words of --data-path: a path, or weights and paths
    tokenizer_model: str | None
    extra_args: tuple[str, ...]
    training: TrainingArgs
    summary: Mapping[str, Any]


def check_inputs(model: ModelSpec, plan: ParallelPlan, *, nodes: Any, gpus_per_node: Any,
                 master_addr: Any = DEFAULT_MASTER_ADDR, master_port: Any = 29500,
                 hosts: Sequence[str] | None = None,
                 cuda_visible_devices: Sequence[Sequence[int]] | None = None,
                 excluded_hosts: Sequence[str] = (),
                 data_path: str | Sequence[str] | None = None,
                 tokenizer_model: str | None = None,
                 extra_args: Sequence[str] = (), training: TrainingArgs | None = None,
                 summary: Mapping[str, Any] | None = None) -> LaunchInputs:
    """Validate the renderers' arguments; raise :class:`InputError` naming the bad field.

    ``plan`` must satisfy :func:`configurator.core.rules.check_plan` for ``nodes * gpus_per_node``
    GPUs. ``hosts``: ``nodes`` distinct host names in node_rank order.
    ``cuda_visible_devices``: one list per node of ``gpus_per_node`` distinct device indices
    (physical, PCI bus order). ``excluded_hosts``: distinct host names not in ``hosts``
    (the SLURM job excludes them). ``data_path``: one path, or the words of a Megatron blend
    (``["0.3", "/a", "0.7", "/b"]``: weights and paths alternating, or several paths);
    it needs ``tokenizer_model`` (the script's HuggingFaceTokenizer cannot run without one).
    """
    nodes = v.positive_int("nodes", nodes)
    gpus = v.positive_int("gpus_per_node", gpus_per_node)
    check_plan(model, plan, nodes * gpus)
    port = v.positive_int("master_port", master_port)
    if port > 65535:
        raise InputError("master_port", port, "must be a TCP port in 1..65535")
    if master_addr == DEFAULT_MASTER_ADDR or master_addr is None:
        addr = None
    else:
        addr = v.printable_text("master_addr", master_addr)
        if any(c.isspace() for c in addr) or addr.startswith("-"):
            raise InputError("master_addr", addr, "must be a host name or address (printable, "
                             "no white space, not starting with '-')")
        if nodes > 1 and is_loopback(addr):
            raise InputError("master_addr", addr, f"a {nodes}-node run needs node_rank 0's "
                             "address as every node reaches it, not a loopback address")
    host_t = None
    if hosts is not None:
        host_t = tuple(hosts)
        if len(host_t) != nodes:
            raise InputError("hosts", list(host_t), f"must name exactly nodes={nodes} hosts")
        for h in host_t:
            check_host_name("hosts", h)
        if len(set(host_t)) != nodes:
            raise InputError("hosts", list(host_t), "must not repeat a host")
    excluded = tuple(excluded_hosts)
    for h in excluded:
        check_host_name("excluded_hosts", h)
        if host_t and h in host_t:
            raise InputError("excluded_hosts", h, "is one of the hosts that run ranks")
    if len(set(excluded)) != len(excluded):
        raise InputError("excluded_hosts", list(excluded), "must not repeat a host")
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
    data = check_data_path(data_path)
    if tokenizer_model is not None:
        check_word("tokenizer_model", tokenizer_model)
        if data is None:
            raise InputError("tokenizer_model", tokenizer_model,
                             "needs data_path (mock data uses NullTokenizer)")
    elif data is not None:
        raise InputError("tokenizer_model", None,
                         f"required with data_path: the script's {DEFAULT_TOKENIZER_TYPE} needs "
                         "--tokenizer-model (a Hugging Face tokenizer name or path)")
    extra = tuple(extra_args)
    for word in extra:
        if not isinstance(word, str) or "\0" in word or any(
                unicodedata.category(c) == "Cs" for c in word):
            raise InputError("extra_args", word, "must be strings without NUL characters or "
                             "surrogates")
    return LaunchInputs(model=model, plan=plan, nodes=nodes, gpus_per_node=gpus,
                        master_addr=addr, master_port=port, hosts=host_t,
                        excluded_hosts=excluded, cuda_visible_devices=cvd, data_path=data,
                        tokenizer_model=tokenizer_model, extra_args=extra,
                        training=(training or TrainingArgs()).checked(),
                        summary=dict(summary or {}))


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` reaches only this machine (:data:`LOOPBACK_PATTERN`, any case)."""
    a = addr.lower()
    return (a in ("localhost", "::1", "[::1]", "0:0:0:0:0:0:0:1", "0.0.0.0")
            or a.startswith(("localhost.", "127.")))


def check_word(field: str, value: Any) -> str:
    """A path or name passed to Megatron as one argument: a non-empty string without
    control, format, line-separator or surrogate characters, without white space at either
    end (Megatron strips the data paths) and not starting with ``-`` (argparse would read
    a flag). Returns it; raises :class:`InputError` naming ``field``."""
    if not isinstance(value, str) or not value:
        raise InputError(field, value, "must be a non-empty string")
    if any(unicodedata.category(c) in _BAD_CATEGORIES for c in value):
        raise InputError(field, value, "must not hold line breaks, control or format "
                                       "characters")
    if value != value.strip():
        raise InputError(field, value, "must not begin or end with white space")
    if value.startswith("-"):
        raise InputError(field, value, "must not begin with '-' (Megatron would read a flag; "
                                       "write ./-name)")
    return value


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def check_data_path(data_path: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """The words of ``--data-path``: ``None`` (mock data), one path, or a blend as Megatron's
    ``get_blend_from_list`` reads it: several paths, or weight and path alternating
    (``0.3 /a 0.7 /b``; a word is a weight when ``float()`` parses it, as there). Each word
    passes :func:`check_word`; weights must be finite and > 0."""
    if data_path is None:
        return None
    words = (data_path,) if isinstance(data_path, str) else tuple(data_path)
    if not words:
        raise InputError("data_path", [], "must name at least one path")
    for w in words:
        check_word("data_path", w)
    numeric = [_is_number(w) for w in words]
    if any(numeric):
        if len(words) % 2 or not all(numeric[0::2]) or any(numeric[1::2]):
            raise InputError("data_path", list(words), "a blend alternates weights and paths "
                             "(WEIGHT PATH [WEIGHT PATH ...]); a path must not be a number")
        for w in words[0::2]:
            if not (math.isfinite(float(w)) and float(w) > 0):
                raise InputError("data_path", w, "a blend weight must be a finite number > 0")
    return words


def header(inp: LaunchInputs, title: str, usage: Sequence[str]) -> list[str]:
    """Comment lines summarising the model, plan, cluster and predicted figures."""
    p, m = inp.plan, inp.model
    lines = [
        "#!/usr/bin/env bash",
        f"# {title}: Megatron-LM pretrain_gpt.py ({MEGATRON_TAG} flags), rendered by "
        "configurator.",
        f"# model: {flat(m.name)}: layers={m.num_layers} hidden={m.hidden_size} "
        f"ffn={m.ffn_hidden_size} heads={m.num_attention_heads} "
        f"query_groups={m.num_query_groups} seq={m.seq_length} vocab={m.vocab_size}",
        *textwrap.wrap(flat(" ".join(describe_plan(p))), 92,
                       initial_indent="# plan: ", subsequent_indent="#       ",
                       break_long_words=False),
        f"# cluster: nodes={inp.nodes} gpus_per_node={inp.gpus_per_node} "
        f"world_size={inp.nodes * inp.gpus_per_node}",
    ]
    if m.yarn_rotary_scaling_factor is not None:
        # core_v0.16.1's --position-embedding-type has no yarn and its --rope-type yarn is
        # multi-latent attention's (validate_args asserts it)
        lines += textwrap.wrap(
            f"YaRN RoPE (factor {m.yarn_rotary_scaling_factor:g}) has no {MEGATRON_TAG} flag "
            "without multi-latent attention: this script trains plain RoPE; the predicted "
            "figures price megatron-core's unfused YaRN RoPE", 92,
            initial_indent="# note: ", subsequent_indent="#       ")
    if inp.hosts:
        lines.append("# node_rank -> host: " + " ".join(
            f"{r}={h}" for r, h in enumerate(inp.hosts)))
    if inp.excluded_hosts:
        lines.append("# excluded hosts: " + " ".join(inp.excluded_hosts))
    if inp.cuda_visible_devices:
        lines.append("# node_rank -> CUDA_VISIBLE_DEVICES: " + " ".join(
            f"{r}=" + ",".join(map(str, perm)) for r, perm in enumerate(inp.cuda_visible_devices)))
    if inp.summary:
        lines.append("# predicted:")
        lines += [f"#   {flat(k)}: {flat(val)}"
                  for k, val in inp.summary.items()]
    lines += ["#"] + [f"# {flat(u)}" for u in usage]
    assert all(line.startswith("#") and line.isprintable() for line in lines), \
        "header lines must be printable comments"
    return lines


def literal_codes(values: Sequence[str]) -> list[str]:
    """The shellcheck warnings that :func:`shlex.quote`-d literal ``values`` raise: SC2016
    for ``$`` or a backquote (no expansion in single quotes is meant), SC1003 for a
    backslash (``'\\'`` ends the quotes as meant)."""
    return [code for code, chars in (("SC2016", "$`"), ("SC1003", "\\"))
            if any(c in v for v in values for c in chars)]


def literal_directive(values: Sequence[str]) -> list[str]:
    """The shellcheck directive line for quoted literal ``values``, if one is needed
    (:func:`literal_codes`); else nothing."""
    codes = literal_codes(values)
    return [f"# shellcheck disable={','.join(codes)}  # literal values"] if codes else []


def env_default(name: str, value: str) -> str:
    """``NAME=${NAME:-'value'}``: the environment wins, else the quoted literal ``value``.

    A value with ``$``, a backquote or a backslash is preceded by a shellcheck directive
    (:func:`literal_directive`: it is meant literally).
    """
    return "\n".join(literal_directive([value]) + [f"{name}=${{{name}:-{shlex.quote(value)}}}"])


#: CUDA connections of a plan that overlaps the expert all-to-all with compute: more than
#: one, or the communication stream's kernels queue behind the compute stream's
#: (megatron/core/transformer/moe/README.md, "Requirements for EP A2A Overlap"; validate_args
#: then warns instead of asserting 1 with tp or cp > 1). 32: Megatron-Bridge's DeepSeek-V3
#: recipes; Megatron-LM PR #6311 measured +7.8 % with it against +3.7 % with 1.
OVERLAP_CONNECTIONS = 32


def environment_block(plan: ParallelPlan) -> list[str]:
    """Exports every rank needs: one CUDA connection (Megatron validate_args asserts
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tp > 1 or cp > 1 before Blackwell, so that
    communication kernels are queued in issue order), or, with Megatron FSDP, the variable
    unset (validate_args asserts it is not 1 there; megatron-fsdp-user-guide.md: unset), or
    :data:`OVERLAP_CONNECTIONS` with the expert all-to-all overlap; with fine-grained
    activation offloading ``NVTE_CPU_OFFLOAD_V1=1`` (validate_args asserts it with Transformer
    Engine 2.10 and later); and PCI-bus GPU numbering (so that ``CUDA_VISIBLE_DEVICES``
    indices match ``nvidia-smi``)."""
    if plan.megatron_fsdp:
        connections = "unset CUDA_DEVICE_MAX_CONNECTIONS"
    elif plan.overlap_moe_expert_parallel_comm:
        connections = f"export CUDA_DEVICE_MAX_CONNECTIONS={OVERLAP_CONNECTIONS}"
    else:
        connections = "export CUDA_DEVICE_MAX_CONNECTIONS=1"
    offload = ["export NVTE_CPU_OFFLOAD_V1=1"] if plan.offload_modules else []
    return [connections, *offload, "export CUDA_DEVICE_ORDER=PCI_BUS_ID"]


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


def quoted_array(name: str, words: Sequence[str]) -> list[str]:
    """``NAME=(...)``: a bash array of ``words``, one :func:`shlex.quote`-d word per line.

    Preceded by a shellcheck directive (:func:`literal_directive`) when a word holds ``$``,
    a backquote or a backslash (they are meant literally).
    """
    return literal_directive(words) + [f"{name}=(", *(f"    {shlex.quote(w)}" for w in words),
                                       ")"]


def data_block(inp: LaunchInputs) -> list[str]:
    """Data variables when a real data path is used: the ``--data-path`` words in a bash
    array (``$DATA_PATH`` from the environment replaces them by one path), the tokenizer type
    and model (overridable from the environment); and, with a save interval, the checkpoint
    directory (``$CHECKPOINT_DIR`` from the environment replaces it)."""
    ckpt = [] if inp.training.save_interval is None else [
        f"# checkpoints every {inp.training.save_interval} iterations (the interval the time "
        f"to train chose), saved to and resumed from {CHECKPOINT_DIR_VAR}",
        env_default(CHECKPOINT_DIR_VAR, DEFAULT_CHECKPOINT_DIR)]
    if inp.data_path is None:
        return ckpt
    assert inp.tokenizer_model is not None, "check_inputs requires tokenizer_model"
    return ["# data and tokenizer; from the environment, DATA_PATH (one path) replaces "
            f"{DATA_PATHS_VAR},",
            "# TOKENIZER_TYPE and TOKENIZER_MODEL replace theirs",
            *quoted_array(DATA_PATHS_VAR, inp.data_path),
            'if [[ -n "${DATA_PATH:-}" ]]; then',
            f'    {DATA_PATHS_VAR}=("$DATA_PATH")',
            "fi",
            env_default("TOKENIZER_TYPE", DEFAULT_TOKENIZER_TYPE),
            env_default("TOKENIZER_MODEL", inp.tokenizer_model)] + ckpt


def megatron_array(inp: LaunchInputs, name: str = "MEGATRON_ARGS") -> list[str]:
    """A bash array holding every ``pretrain_gpt.py`` flag, one per line, grouped."""
    groups = megatron_flags(inp.model, inp.plan, training=inp.training,
                            data_path=inp.data_path)
    literal = literal_codes(inp.extra_args)          # extra arguments meant literally
    out = [f"# shellcheck disable={','.join(['SC2054', *literal])}  # commas belong to values "
           f"(--split 949,50,1){'; literal values' if literal else ''}",
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


def hosts_line(inp: LaunchInputs) -> list[str]:
    """Bash printing the placement's hosts in node_rank order after
    :data:`~configurator.core.megatron_log.HOSTS_LINE_PREFIX`, the line the log reader takes
    the run's ``hosts`` from (so that ``validate``/``calibrate --topology`` price the log on
    the links it ran on); empty without a placement. Checked host names only: no quote can
    occur."""
    if not inp.hosts:
        return []
    return [f'echo "{HOSTS_LINE_PREFIX}{" ".join(inp.hosts)}"']


def gpu_order_line(inp: LaunchInputs) -> list[str]:
    """Bash printing the placement's GPU order, each node_rank's ``CUDA_VISIBLE_DEVICES``
    in turn, after :data:`~configurator.core.megatron_log.GPU_ORDER_LINE_PREFIX`, the line
    the log reader takes the run's ``gpu_order`` from (so that a log of a placed run is
    priced on the links of the GPUs its ranks ran on); empty without a GPU order. Integers
    only."""
    if not inp.cuda_visible_devices:
        return []
    return [f'echo "{GPU_ORDER_LINE_PREFIX}{gpu_order_text(inp.cuda_visible_devices)}"']


def host_lookup(inp: LaunchInputs, indent: str = "") -> list[str]:
    """Bash setting an empty NODE_RANK from ``hostname`` via the placement table.

    A host matches by its full name or by its short name followed by a domain; an excluded
    host and any other host stop the script (exit 2). Uses only checked host names and
    integers (no single quote), so it can sit inside a single-quoted ``bash -c`` body. Empty
    when no hosts are given.
    """
    if not inp.hosts:
        return []
    out = [f'{indent}if [[ -z "$NODE_RANK" ]]; then',
           f'{indent}    case "$(hostname)" in']
    out += [f"{indent}        {h}|{h}.*) NODE_RANK={r} ;;" for r, h in enumerate(inp.hosts)]
    if inp.excluded_hosts:
        out.append(f"{indent}        " + "|".join(f"{h}|{h}.*" for h in inp.excluded_hosts)
                   + ') echo "error: host $(hostname) is excluded by the placement; run on '
                   f'{" ".join(inp.hosts)}" >&2; exit 2 ;;')
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


__all__ = ["DEFAULT_MASTER_ADDR", "LOOPBACK_PATTERN", "is_loopback", "LaunchInputs", "check_inputs", "check_word",
           "check_data_path", "header", "literal_codes", "literal_directive",
           "env_default",
           "quoted_array",
           "environment_block", "megatron_dir_check", "data_block", "megatron_array",
           "hosts_line", "gpu_order_line", "host_lookup", "device_pinning",
           "node_rank_check", "torchrun_array", "Value"]
