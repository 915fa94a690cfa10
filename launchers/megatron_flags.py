"""One table from plan and model fields to Megatron-LM ``pretrain_gpt.py`` flags.

Every flag name here is an argument of Megatron-LM core_v0.16.1 (commit 55ac7082,
``megatron/training/arguments.py``: ``add_megatron_arguments`` and the dataclass-derived groups
it adds); ``tests/data/megatron_core_v0_16_flags.txt`` lists them and the tests check every
emitted flag against it. Rules from ``validate_args`` (same file) and
``TransformerConfig.__post_init__`` (megatron/core/transformer/transformer_config.py) decide
when a flag may be emitted:

- ``--overlap-param-gather`` only with ``--use-distributed-optimizer`` and
  ``--overlap-grad-reduce`` (validate_args asserts both);
- ``--recompute-granularity full`` with ``--recompute-method uniform --recompute-num-layers 1``;
  ``selective`` with neither (TransformerConfig raises otherwise), and with
  ``--recompute-modules`` (a list) where its modules are not the default ``core_attn``;
- ``--sequence-parallel`` only when tp > 1 (validate_args switches it off at tp = 1);
- virtual pipeline: ``--num-layers-per-virtual-pipeline-stage = num_layers / pp / vp`` when
  vp > 1 (validate_args derives ``virtual_pipeline_model_parallel_size`` from it;
  ``--num-virtual-stages-per-pipeline-rank`` is accepted too, at most one of them may be set);
- ``--attention-backend local`` asserts ``--spec local`` in validate_args, and pretrain_gpt.py's
  ``gpt_builder`` cannot import a one-word spec, so the ``local`` backend (megatron-core's own
  ``DotProductAttention``) is selected with ``--transformer-impl local`` instead;
- NullTokenizer reports ``vocab_size + 1`` tokens (its EOD id is ``vocab_size``;
  megatron/training/tokenizer/tokenizer.py ``_NullTokenizer``), so mock data passes
  ``--vocab-size V-1`` to give the model exactly V rows before Megatron's padding to a
  multiple of ``128 * tp``.

The plan rows are not written here: each :class:`~configurator.core.plan.ParallelPlan` field
declares its flags and group (``configurator.core.plan.PLAN_FIELDS``) and the table takes them
from there; the model and training rows are this module's. ``--disable-bias-linear`` follows
``model.add_bias_linear``, the field the parameter count (memory_model/params.py) uses.

Values in the table are ``None`` (flag left out), ``True`` (a bare switch), a number or a
string (``--flag value``), a tuple (``--flag a b``, a list argument), or a :class:`ShellVar` (``--flag "$NAME"``, or ``"${NAME[@]}"`` for
an array, resolved by bash when the script runs).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence, Union

from configurator.core import validate as v
from configurator.core.errors import InputError
from configurator.core.model import ModelSpec
from configurator.core.plan import FLAG_GROUPS, PLAN_FIELDS, ParallelPlan, PlanField
from configurator.core.plan_terms import tp_backward_allreduce_exposed

#: The Megatron-LM release whose argument parser the flags were checked against.
MEGATRON_TAG = "core_v0.16.1"
MEGATRON_COMMIT = "55ac7082517c3878ae653c07c09c534b8aed49f6"


@dataclass(frozen=True)
class ShellVar:
    """A reference to a bash variable set at the top of the script: rendered ``"$name"``, or
    ``"${name[@]}"`` (every element, each one word) for an ``array``."""

    name: str
    array: bool = False


#: GPT-OSS's gated MLP adds 1 to its linear half, ``(up + 1) · gate·σ(1.702·gate)`` (Hugging
#: Face ``GptOssMLP``; Megatron-Bridge's GPT-OSS provider: ``glu_linear_offset = 1.0``).
GPT_OSS_GLU_OFFSET = 1.0

Value = Union[None, bool, int, float, str, ShellVar, tuple]
#: ``fn(model, plan)`` of a plan field's ``flags`` entry (configurator.core.plan).
PlanFlagFn = Callable[[ModelSpec, ParallelPlan], Value]


@dataclass(frozen=True, kw_only=True)
class TrainingArgs:
    """Optimiser and run-length settings that every launch needs.

    The defaults are a short benchmark run (100 iterations, log every step, no evaluation)
    with Llama 2's optimiser settings (Touvron et al. 2023, §2.2: AdamW β2 = 0.95, peak lr
    3e-4 decayed by cosine to 10 %, weight decay 0.1, gradient clipping 1.0).
    ``lr_warmup_iters`` counts iterations; ``eval_iters = 0`` runs no evaluation.
    ``eval_interval`` is always passed: core_v0.16.1 no longer defaults it
    (``megatron/training/training_config.py``: ``eval_interval: int | None = None``) and
    ``get_train_valid_test_num_samples`` (``megatron/training/training.py``) divides
    ``train_iters`` by it, so a script without it stops with a ``TypeError`` before the first
    iteration; 1000 is the value Megatron-LM's earlier default and its example scripts use.
    """

    train_iters: int = 100
    lr: float = 3.0e-4
    min_lr: float = 3.0e-5
    lr_decay_style: str = "cosine"
    lr_warmup_iters: int = 10
    weight_decay: float = 0.1
    adam_beta2: float = 0.95
    clip_grad: float = 1.0
    log_interval: int = 1
    eval_iters: int = 0
    eval_interval: int = 1000
    seed: int = 1234
    #: iterations between checkpoints (``--save-interval``; the interval the time-to-train
    #: model chose), or None: no checkpoints
    save_interval: int | None = None
    #: ``--async-save`` (with ``save_interval``; not with Megatron-FSDP plans)
    async_save: bool = False

    def checked(self) -> "TrainingArgs":
        """Return self; raise :class:`InputError` for a value Megatron would reject."""
        v.positive_int("train_iters", self.train_iters)
        v.positive_int("log_interval", self.log_interval)
        v.positive_int("eval_interval", self.eval_interval)
        if self.save_interval is not None:
            v.positive_int("save_interval", self.save_interval)
        v.boolean("async_save", self.async_save)
        v.positive_float("lr", self.lr)
        for name in ("lr_warmup_iters", "eval_iters", "seed"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 0:
                raise InputError(name, val, "must be a non-negative integer")
        if not 0 <= self.min_lr <= self.lr:  # validate_args: assert args.min_lr <= args.lr
            raise InputError("min_lr", self.min_lr, f"must be in [0, lr={self.lr}]")
        if self.lr_warmup_iters >= self.train_iters:
            raise InputError("lr_warmup_iters", self.lr_warmup_iters,
                             f"must be below train_iters ({self.train_iters})")
        v.choice("lr_decay_style", self.lr_decay_style,
                 ("constant", "linear", "cosine", "inverse-square-root", "WSD"))
        for name in ("weight_decay", "clip_grad"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, float)) or val < 0:
                raise InputError(name, val, "must be a non-negative number")
        if not 0 < self.adam_beta2 < 1:
            raise InputError("adam_beta2", self.adam_beta2, "must be in (0, 1)")
        return self


@dataclass(frozen=True)
class FlagRule:
    """One row: the flag, the field(s) it comes from, and how to compute its value."""

    flag: str
    source: str
    value: Callable[[ModelSpec, ParallelPlan, TrainingArgs], Value]
    group: str


def _rows(group: str, *rows: tuple) -> list[FlagRule]:
    return [FlagRule(flag, source, fn, group) for flag, source, fn in rows]


def _plan_rule(field: PlanField, flag: str, fn: PlanFlagFn) -> FlagRule:
    return FlagRule(flag, f"plan.{field.name}", lambda m, p, t: fn(m, p), field.flag_group)


def _plan_rows(group: str) -> list[FlagRule]:
    """The rows of ``group`` declared by the plan schema, in :data:`PLAN_FIELDS` order."""
    return [_plan_rule(f, flag, fn) for f in PLAN_FIELDS if f.flag_group == group
            for flag, fn in f.flags]


#: Rows that come from the model spec. Every field that changes the parameter count
#: (memory_model/params.py) has its flag here, with the meaning the count gives it;
#: tests/test_launch_architecture.py builds megatron-core's GPTModel from these flags.
_MODEL_ROWS = _rows(
    "model",
    ("--num-layers", "model.num_layers", lambda m, p, t: m.num_layers),
    ("--hidden-size", "model.hidden_size", lambda m, p, t: m.hidden_size),
    ("--ffn-hidden-size", "model.ffn_hidden_size", lambda m, p, t: m.ffn_hidden_size),
    ("--num-attention-heads", "model.num_attention_heads",
     lambda m, p, t: m.num_attention_heads),
    ("--group-query-attention", "model.num_query_groups < num_attention_heads",
     lambda m, p, t: m.num_query_groups < m.num_attention_heads or None),
    ("--num-query-groups", "model.num_query_groups",
     lambda m, p, t: m.num_query_groups
     if m.num_query_groups < m.num_attention_heads else None),
    ("--seq-length", "model.seq_length", lambda m, p, t: m.seq_length),
    ("--max-position-embeddings", "model.seq_length", lambda m, p, t: m.seq_length),
    ("--position-embedding-type", "model.position_embedding_type",
     lambda m, p, t: m.position_embedding_type),
    ("--normalization", "model.normalization", lambda m, p, t: m.normalization),
    # a clamped gated MLP is GPT-OSS's: quick-GELU gate and (up + 1), both halves clamped
    # (Hugging Face GptOssMLP; Megatron-Bridge gpt_oss_bridge.py sets activation_func
    # quick_gelu, activation_func_clamp_value 7.0, glu_linear_offset 1.0). core_v0.16.1's
    # --swiglu would train SiLU instead (arguments.py core_transformer_config_from_args), so
    # such a model passes --quick-geglu (gated, quick_gelu) and the offset
    ("--swiglu", "model.swiglu",
     lambda m, p, t: (m.swiglu and m.activation_func_clamp_value is None) or None),
    ("--quick-geglu", "model.activation_func_clamp_value",
     lambda m, p, t: m.activation_func_clamp_value is not None or None),
    # TransformerConfig fields core_v0.16.1's parser exposes (ArgumentGroupFactory)
    ("--activation-func-clamp-value", "model.activation_func_clamp_value",
     lambda m, p, t: m.activation_func_clamp_value),
    ("--glu-linear-offset", "model.activation_func_clamp_value",
     lambda m, p, t: None if m.activation_func_clamp_value is None else GPT_OSS_GLU_OFFSET),
    ("--untie-embeddings-and-output-weights", "model.untie_embeddings_and_output_weights",
     lambda m, p, t: m.untie_embeddings_and_output_weights or None),
    ("--disable-bias-linear", "not model.add_bias_linear",
     lambda m, p, t: not m.add_bias_linear or None),
    ("--hidden-dropout", "model.hidden_dropout", lambda m, p, t: m.hidden_dropout),
    ("--attention-dropout", "model.attention_dropout", lambda m, p, t: m.attention_dropout),
    ("--kv-channels", "model.kv_channels",
     lambda m, p, t: m.kv_channels
     if m.kv_channels * m.num_attention_heads != m.hidden_size else None),
    ("--add-qkv-bias", "model.add_qkv_bias",
     lambda m, p, t: (m.add_qkv_bias and not m.add_bias_linear) or None),
    ("--qk-layernorm", "model.qk_layernorm", lambda m, p, t: m.qk_layernorm or None),
    ("--rotary-base", "model.rotary_base",
     lambda m, p, t: m.rotary_base
     if (m.position_embedding_type == "rope" or m.multi_latent_attention)
     and m.rotary_base != 10000 else None),
    ("--norm-epsilon", "model.norm_epsilon",
     lambda m, p, t: m.norm_epsilon if m.norm_epsilon != 1e-5 else None),
    ("--num-experts", "model.num_experts", lambda m, p, t: m.num_experts),
    ("--moe-router-topk", "model.moe_router_topk",
     lambda m, p, t: m.moe_router_topk if m.is_moe else None),
    ("--moe-ffn-hidden-size", "model.moe_ffn_hidden_size",
     lambda m, p, t: m.moe_ffn_hidden_size if m.is_moe else None),
    ("--moe-shared-expert-intermediate-size", "model.moe_shared_expert_intermediate_size",
     lambda m, p, t: m.moe_shared_expert_intermediate_size),
    ("--moe-layer-freq", "model.moe_layer_freq",
     lambda m, p, t: moe_layer_freq_value(m) if m.is_moe else None),
    ("--moe-router-load-balancing-type", "model.moe_router_load_balancing_type",
     lambda m, p, t: m.moe_router_load_balancing_type
     if m.is_moe and m.moe_router_load_balancing_type != "aux_loss" else None),
    ("--moe-router-enable-expert-bias", "model.moe_router_enable_expert_bias",
     lambda m, p, t: (m.is_moe and m.moe_router_enable_expert_bias) or None),
    # TransformerConfig: the expert bias needs the sigmoid score function (DeepSeek-V3's)
    ("--moe-router-score-function", "model.moe_router_enable_expert_bias",
     lambda m, p, t: "sigmoid" if m.is_moe and m.moe_router_enable_expert_bias else None),
    ("--moe-router-pre-softmax", "model.moe_router_topk",   # TransformerConfig: top-1
     lambda m, p, t: (m.is_moe and m.moe_router_topk == 1) or None),
    ("--moe-grouped-gemm", "model.num_experts", lambda m, p, t: m.is_moe or None),
    ("--multi-latent-attention", "model.multi_latent_attention",
     lambda m, p, t: m.multi_latent_attention or None),
    ("--q-lora-rank", "model.q_lora_rank",
     lambda m, p, t: m.q_lora_rank if m.multi_latent_attention else None),
    ("--kv-lora-rank", "model.kv_lora_rank",
     lambda m, p, t: m.kv_lora_rank if m.multi_latent_attention else None),
    ("--qk-head-dim", "model.qk_head_dim",
     lambda m, p, t: m.qk_head_dim if m.multi_latent_attention else None),
    ("--qk-pos-emb-head-dim", "model.qk_pos_emb_head_dim",
     lambda m, p, t: m.qk_pos_emb_head_dim if m.multi_latent_attention else None),
    ("--v-head-dim", "model.v_head_dim",
     lambda m, p, t: m.v_head_dim if m.multi_latent_attention else None),
    ("--mtp-num-layers", "model.mtp_num_layers", lambda m, p, t: m.mtp_num_layers),
    ("--window-size", "model.window_size",
     lambda m, p, t: f"({m.window_size},0)" if m.window_size else None),
    ("--window-attn-skip-freq", "model.window_attn_skip_freq",
     lambda m, p, t: m.window_attn_skip_freq))


def moe_layer_freq_value(model: ModelSpec) -> int | str:
    """``--moe-layer-freq``: the int, or the 0/1 pattern as Megatron's list expression in
    runs (``([0]*3+[1]*58)``; ``moe_freq_type`` evaluates only digits, brackets, commas,
    ``+`` and ``*``)."""
    if isinstance(model.moe_layer_freq, int):
        return model.moe_layer_freq
    runs: list[list[int]] = []
    for x in model.moe_layer_freq:
        if runs and runs[-1][0] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return "(" + "+".join(f"[{x}]*{n}" for x, n in runs) + ")"

_TRAINING_ROWS = _rows(
    "training",
    ("--train-iters", "training.train_iters", lambda m, p, t: t.train_iters),
    ("--lr", "training.lr", lambda m, p, t: t.lr),
    ("--min-lr", "training.min_lr", lambda m, p, t: t.min_lr),
    ("--lr-decay-style", "training.lr_decay_style", lambda m, p, t: t.lr_decay_style),
    ("--lr-warmup-iters", "training.lr_warmup_iters", lambda m, p, t: t.lr_warmup_iters),
    ("--weight-decay", "training.weight_decay", lambda m, p, t: t.weight_decay),
    ("--adam-beta2", "training.adam_beta2", lambda m, p, t: t.adam_beta2),
    ("--clip-grad", "training.clip_grad", lambda m, p, t: t.clip_grad),
    ("--log-interval", "training.log_interval", lambda m, p, t: t.log_interval),
    ("--eval-iters", "training.eval_iters", lambda m, p, t: t.eval_iters),
    ("--eval-interval", "training.eval_interval", lambda m, p, t: t.eval_interval),
    ("--seed", "training.seed", lambda m, p, t: t.seed),
    # checkpoints (with a save interval): the directory is a script variable; Megatron's
    # distributed format (torch_dist, fully parallel save), the one its --async-save needs
    # (megatron/training/checkpointing.py save_checkpoint: "Async checkpoint save not
    # implemented" for legacy or other formats); Megatron-FSDP plans keep their own format
    # (validate_args: "Megatron FSDP only supports fsdp_dtensor checkpoint format") and save
    # synchronously
    ("--save", "training.save_interval",
     lambda m, p, t: None if t.save_interval is None else ShellVar(CHECKPOINT_DIR_VAR)),
    ("--load", "training.save_interval",
     lambda m, p, t: None if t.save_interval is None else ShellVar(CHECKPOINT_DIR_VAR)),
    ("--save-interval", "training.save_interval", lambda m, p, t: t.save_interval),
    ("--ckpt-format", "plan.megatron_fsdp, training.save_interval",
     lambda m, p, t: "fsdp_dtensor" if p.megatron_fsdp
     else "torch_dist" if t.save_interval is not None else None),
    ("--async-save", "training.async_save",
     lambda m, p, t: (t.async_save and t.save_interval is not None
                      and not p.megatron_fsdp) or None),
    # validate_args switches --async-save off without it ("--async-save is not supported
    # without --use-persistent-ckpt-worker. Disabling --async-save.")
    ("--use-persistent-ckpt-worker", "training.async_save",
     lambda m, p, t: (t.async_save and t.save_interval is not None
                      and not p.megatron_fsdp) or None))

#: The script variable holding the checkpoint directory (``CHECKPOINT_DIR`` from the
#: environment replaces its default, :data:`DEFAULT_CHECKPOINT_DIR`).
CHECKPOINT_DIR_VAR = "CHECKPOINT_DIR"
DEFAULT_CHECKPOINT_DIR = "checkpoints"

_OWN_ROWS = {"model": _MODEL_ROWS, "training": _TRAINING_ROWS}

#: THE table, groups in :data:`FLAG_GROUPS` order. Order is the order of the rendered
#: script. Plan rows come from the plan schema (each field's ``flags``, fields in
#: :data:`PLAN_FIELDS` order); model and training rows are the lists above (a plan field
#: declared in one of those groups would follow them).
FLAG_TABLE: tuple[FlagRule, ...] = tuple(
    rule for group in FLAG_GROUPS for rule in _OWN_ROWS.get(group, []) + _plan_rows(group))

#: Data split used with a real ``--data-path`` (train, valid, test weights; the value
#: Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh passes).
DATA_SPLIT = "949,50,1"
DEFAULT_TOKENIZER_TYPE = "HuggingFaceTokenizer"
#: The bash array holding the words of ``--data-path`` (one path, or weights and paths).
DATA_PATHS_VAR = "DATA_PATHS"


def data_flags(model: ModelSpec,
               data_path: str | Sequence[str] | None) -> list[tuple[str, Value]]:
    """Data and tokenizer flags.

    No ``data_path``: ``--mock-data --tokenizer-type NullTokenizer --vocab-size V-1`` (see the
    module docstring for the -1). With one (a path, or several words of a blend such as
    ``0.3 /a 0.7 /b``): ``--data-path "${DATA_PATHS[@]}"``, ``--split``, ``--tokenizer-type
    "$TOKENIZER_TYPE"`` and ``--tokenizer-model "$TOKENIZER_MODEL"``, the array and the two
    variables being set (overridable from the environment) at the top of the script.
    """
    if data_path is None:
        return [("--mock-data", True), ("--tokenizer-type", "NullTokenizer"),
                ("--vocab-size", model.vocab_size - 1)]
    return [("--data-path", ShellVar(DATA_PATHS_VAR, array=True)), ("--split", DATA_SPLIT),
            ("--tokenizer-type", ShellVar("TOKENIZER_TYPE")),
            ("--tokenizer-model", ShellVar("TOKENIZER_MODEL"))]


def megatron_flags(model: ModelSpec, plan: ParallelPlan, *,
                   training: TrainingArgs | None = None,
                   data_path: str | Sequence[str] | None = None
                   ) -> list[tuple[str, list[tuple[str, Value]]]]:
    """The flags for ``pretrain_gpt.py``, grouped: ``[(group, [(flag, value), ...]), ...]``.

    Entries whose value is ``None`` are left out; ``True`` is a bare switch. Does not check
    the plan (the renderers call :func:`configurator.core.rules.check_plan` first). Raises
    :class:`InputError` for bad ``training`` values.
    """
    if plan.fp8_dot_product_attention:
        raise InputError("fp8_dot_product_attention", True,
                         f"pretrain_gpt.py of {MEGATRON_TAG} has no flag for it "
                         f"(TransformerConfig.fp8_dot_product_attention is left out of its "
                         f"arguments); estimate prices it, a launch script cannot set it")
    if plan.moe_fused_grouped_mlp:
        raise InputError("moe_fused_grouped_mlp", True,
                         f"pretrain_gpt.py of {MEGATRON_TAG} has no such kernel (Transformer "
                         f"Engine's op fuser for the experts came with later Megatron-Core); "
                         f"estimate prices it, a launch script cannot set it")
    if tp_backward_allreduce_exposed(plan.async_tensor_model_parallel_allreduce, plan.tp,
                                     plan.sequence_parallel):
        raise InputError("async_tensor_model_parallel_allreduce", False,
                         f"pretrain_gpt.py of {MEGATRON_TAG} always runs the backward's "
                         f"tensor-parallel all-reduce under the weight-gradient GEMM (the flag "
                         f"that turned it off went after megatron-core 0.8); estimate prices a "
                         f"plan with it exposed (tp > 1, no sequence parallelism), a launch "
                         f"script cannot run one")
    t = (training or TrainingArgs()).checked()
    groups: dict[str, list[tuple[str, Value]]] = {}
    for rule in FLAG_TABLE:
        val = rule.value(model, plan, t)
        groups.setdefault(rule.group, [])
        if val is not None and val is not False:
            groups[rule.group].append((rule.flag, val))
    groups["data"] = data_flags(model, data_path)
    return [(g, flags) for g, flags in groups.items() if flags]


def format_value(val: Value) -> str:
    """One shell word for ``val``: ``"$NAME"`` (``"${NAME[@]}"`` for an array) for a
    ShellVar, else shlex-quoted text."""
    if isinstance(val, ShellVar):
        return f'"${{{val.name}[@]}}"' if val.array else f'"${val.name}"'
    if isinstance(val, tuple):      # a list-valued flag (nargs '+'): one word each
        return " ".join(shlex.quote(str(x)) for x in val)
    if isinstance(val, float):
        return shlex.quote(repr(val))
    return shlex.quote(str(val))


def flag_argv(groups: Iterable[tuple[str, list[tuple[str, Value]]]],
              shell_values: Mapping[str, str | Sequence[str]] | None = None) -> list[str]:
    """Flatten grouped flags to argv words as Megatron receives them.

    A ShellVar becomes its value from ``shell_values`` (a string: one word; a sequence: one
    word per element), else the placeholder ``$NAME``.
    """
    values = shell_values or {}
    out: list[str] = []
    for _group, flags in groups:
        for flag, val in flags:
            out.append(flag)
            if val is True:
                continue
            if isinstance(val, ShellVar):
                got = values.get(val.name, f"${val.name}")
                out += [got] if isinstance(got, str) else list(got)
            elif isinstance(val, tuple):
                out += [str(x) for x in val]
            else:
                out.append(repr(val) if isinstance(val, float) else str(val))
    return out
