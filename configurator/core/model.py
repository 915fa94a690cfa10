"""The model specification: :class:`ModelSpec` (Megatron-LM argument names), built and
validated by :func:`make_model` from exactly the keys of :data:`MODEL_KEYS`.

The presets and :func:`~configurator.core.model_presets.load_model` (a preset name, a
YAML/JSON file or a Hugging Face ``config.json``) are in
:mod:`configurator.core.model_presets`; the Hugging Face import in
:mod:`configurator.core.hf_import`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from configurator.core import validate as v
from configurator.core.errors import InputError


def swiglu_ffn_hidden_size(hidden_size: int) -> int:
    """Megatron's default FFN size with SwiGLU: ``int(8h/3/64)*64``.

    Source: megatron/training/arguments.py (``if args.swiglu: args.ffn_hidden_size =
    int((4 * args.hidden_size * 2 / 3) / 64) * 64``).
    """
    return int((4 * hidden_size * 2 / 3) / 64) * 64


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A GPT-style decoder (dense or mixture of experts), in Megatron-LM's argument names.

    Built and validated by :func:`make_model` (the defaults below are the ones it fills in;
    rules from Megatron-LM core_v0.16.1 ``megatron/training/arguments.py`` ``validate_args``
    and ``megatron/core/transformer/transformer_config.py``). Sizes are counts (layers,
    hidden units, heads, tokens); each field says its Megatron argument and, where it has
    one, its ``TransformerConfig`` field; launchers/megatron_flags.py writes them.
    """

    name: str = "custom"
    """Display name (a preset's, a file's ``name`` key, or ``custom``); printed in outputs,
    not a Megatron argument."""
    num_layers: int
    """Transformer layers (decoder blocks), without the MTP modules. Megatron
    ``--num-layers``; ``TransformerConfig.num_layers``."""
    hidden_size: int
    """Hidden size ``h`` (units per token). Megatron ``--hidden-size``;
    ``TransformerConfig.hidden_size``."""
    num_attention_heads: int
    """Query heads ``a`` per layer (each of ``kv_channels`` units). Megatron
    ``--num-attention-heads``; ``TransformerConfig.num_attention_heads``."""
    num_query_groups: int
    """Key/value heads (grouped-query attention); equal to ``num_attention_heads`` for
    multi-head attention (the default), must divide it. Megatron ``--num-query-groups``
    with ``--group-query-attention``; ``TransformerConfig.num_query_groups``."""
    ffn_hidden_size: int
    """Hidden units of a dense layer's MLP. Default ``4h``, or with ``swiglu``
    :func:`swiglu_ffn_hidden_size` (``int(8h/3/64)*64``), as arguments.py sets them.
    Megatron ``--ffn-hidden-size``; ``TransformerConfig.ffn_hidden_size``."""
    vocab_size: int
    """Rows of the embedding (and output) matrix: the padded vocabulary (tokens). Megatron's
    ``padded_vocab_size`` (the tokenizer's size padded to a multiple of
    ``--make-vocab-size-divisible-by`` × tp, tokenizer.py ``_vocab_size_with_padding``);
    mock-data launch scripts pass ``--vocab-size V-1`` (the NullTokenizer adds EOD)."""
    seq_length: int
    """Tokens per sequence (training context). Megatron ``--seq-length`` (the launch scripts
    also pass it as ``--max-position-embeddings``); not a ``TransformerConfig`` field."""
    kv_channels: int
    """Head dimension (units per attention head). Default ``h / a``, as arguments.py sets
    it. Megatron ``--kv-channels``; ``TransformerConfig.kv_channels``."""
    swiglu: bool = False
    """Gated MLP with SiLU (SwiGLU: two input projections, ``ffn_hidden_size`` each).
    Megatron ``--swiglu``; ``TransformerConfig.gated_linear_unit`` with ``activation_func``
    SiLU."""
    untie_embeddings_and_output_weights: bool = False
    """The output layer has its own ``vocab_size × h`` weights (default: shared with the
    input embedding). Megatron ``--untie-embeddings-and-output-weights``; GPTModel's
    ``share_embeddings_and_output_weights`` is its negation."""
    normalization: str = "LayerNorm"
    """``LayerNorm`` (weight and bias) or ``RMSNorm`` (weight only); default Megatron's.
    Megatron ``--normalization``; ``TransformerConfig.normalization``."""
    norm_epsilon: float = 1e-5
    """The norms' epsilon (dimensionless); default Megatron's 1e-5. Megatron
    ``--norm-epsilon``; ``TransformerConfig.layernorm_epsilon``."""
    hidden_dropout: float = 0.1
    """Dropout probability on the attention and MLP outputs; default Megatron's 0.1
    (Llama-family presets 0.0); 0 stores no mask. Megatron ``--hidden-dropout``;
    ``TransformerConfig.hidden_dropout``."""
    attention_dropout: float = 0.1
    """Dropout probability on the attention probabilities; default Megatron's 0.1
    (Llama-family presets 0.0); 0 stores no mask. Megatron ``--attention-dropout``;
    ``TransformerConfig.attention_dropout``."""
    position_embedding_type: str = "learned_absolute"
    """``learned_absolute`` (GPT: a ``seq_length × h`` table on the first stage; Megatron's
    default), ``rope`` (no parameters) or ``none``. Megatron ``--position-embedding-type``;
    GPTModel's ``position_embedding_type``."""
    rotary_base: int = 10000
    """RoPE's base θ (with ``rope`` or multi-latent attention); default Megatron's 10000.
    Megatron ``--rotary-base``; GPTModel's ``rotary_base``."""
    add_bias_linear: bool = True
    """Biases on every linear layer (default, as Megatron's). Megatron
    ``--disable-bias-linear`` sets it false; ``TransformerConfig.add_bias_linear``."""
    add_qkv_bias: bool = False
    """Biases on the query/key/value projection even with ``add_bias_linear`` false
    (Qwen2-style). Megatron ``--add-qkv-bias``; ``TransformerConfig.add_qkv_bias``."""
    qk_layernorm: bool = False
    """Norms on the query and key heads; with multi-latent attention, the norms on the
    latents (DeepSeek's ``q_a_layernorm``/``kv_a_layernorm``). Megatron ``--qk-layernorm``;
    ``TransformerConfig.qk_layernorm``."""
    num_experts: int | None = None
    """Routed experts per MoE layer (megatron/core/transformer/moe); None: a dense model.
    Megatron ``--num-experts``; ``TransformerConfig.num_moe_experts``."""
    moe_router_topk: int = 2
    """Experts each token is routed to (at most ``num_experts``); default Megatron's 2.
    Megatron ``--moe-router-topk``; ``TransformerConfig.moe_router_topk``."""
    moe_ffn_hidden_size: int | None = None
    """Hidden units of one routed expert's MLP; default ``ffn_hidden_size`` (as
    TransformerConfig's ``__post_init__``); None for a dense model. Megatron
    ``--moe-ffn-hidden-size``; ``TransformerConfig.moe_ffn_hidden_size``."""
    moe_shared_expert_intermediate_size: int | None = None
    """Hidden units of the shared expert(s), all of them together; None: no shared expert.
    Needs ``add_bias_linear`` false (a shared expert has no biases). Megatron
    ``--moe-shared-expert-intermediate-size``;
    ``TransformerConfig.moe_shared_expert_intermediate_size``."""
    moe_router_load_balancing_type: str = "aux_loss"
    """How the router is trained to balance its experts' load: ``aux_loss`` (a loss on each
    micro-batch, Megatron's default), ``seq_aux_loss`` (on each sequence), ``global_aux_loss``
    (on the global batch), ``sinkhorn`` or ``none``. Sets how unevenly one micro-batch's
    tokens fall on the experts under dropless routing
    (:func:`configurator.core.plan_terms.router_balance`). Megatron
    ``--moe-router-load-balancing-type``; ``TransformerConfig.moe_router_load_balancing_type``
    (one type here)."""
    moe_router_enable_expert_bias: bool = False
    """Auxiliary-loss-free balancing: a per-expert bias on the routing scores, updated from
    each global batch's token counts (DeepSeek-V3; needs the sigmoid score function, which
    the launch scripts then pass). Megatron ``--moe-router-enable-expert-bias``;
    ``TransformerConfig.moe_router_enable_expert_bias``."""
    moe_layer_freq: int | tuple[int, ...] = 1
    """Which layers are MoE: an int ``N`` (every N-th layer, counting from layer 0) or one
    0/1 per layer (1 = MoE); the others are dense (``ffn_hidden_size``). Default 1 (every
    layer), Megatron's. Megatron ``--moe-layer-freq``; ``TransformerConfig.moe_layer_freq``
    (expanded by :attr:`moe_layer_pattern`)."""
    multi_latent_attention: bool = False
    """Multi-latent attention (DeepSeek-V2/V3;
    megatron/core/transformer/multi_latent_attention.py): queries, keys and values through
    low-rank latents; no query groups. Megatron ``--multi-latent-attention``;
    ``TransformerConfig.multi_latent_attention`` (sizes in ``MLATransformerConfig``)."""
    q_lora_rank: int | None = None
    """MLA: rank of the query latent (units); None: no query compression. Megatron
    ``--q-lora-rank``; ``MLATransformerConfig.q_lora_rank``."""
    kv_lora_rank: int = 512
    """MLA: rank of the key/value latent (units); default 512, DeepSeek-V2/V3's and
    MLATransformerConfig's. Megatron ``--kv-lora-rank``;
    ``MLATransformerConfig.kv_lora_rank``."""
    qk_head_dim: int = 128
    """MLA: the no-position part of a query/key head (units); default 128, DeepSeek-V2/V3's
    and MLATransformerConfig's (Hugging Face ``qk_nope_head_dim``). Megatron
    ``--qk-head-dim``; ``MLATransformerConfig.qk_head_dim``."""
    qk_pos_emb_head_dim: int = 64
    """MLA: the RoPE part of a query/key head (units); default 64, DeepSeek-V2/V3's and
    MLATransformerConfig's (Hugging Face ``qk_rope_head_dim``). Megatron
    ``--qk-pos-emb-head-dim``; ``MLATransformerConfig.qk_pos_emb_head_dim``."""
    v_head_dim: int = 128
    """MLA: a value head (units); default 128, DeepSeek-V2/V3's and MLATransformerConfig's.
    Megatron ``--v-head-dim``; ``MLATransformerConfig.v_head_dim``."""
    mtp_num_layers: int | None = None
    """Multi-token-prediction modules (DeepSeek-V3), each one more transformer layer, a
    ``2h × h`` projection and three norms, on the last stage; None: none. Needs ``rope`` or
    no position embedding. Megatron ``--mtp-num-layers``; ``TransformerConfig.mtp_num_layers``."""
    window_size: int | None = None
    """Sliding-window attention over this many past keys (tokens); None: full causal
    attention. Megatron ``--window-size (w,0)``; ``TransformerConfig.window_size``."""
    window_attn_skip_freq: int | None = None
    """With ``window_size``: every N-th layer (1-based) keeps full attention, the others are
    windowed (GPT-OSS: 2); None: every layer windowed. Megatron ``--window-attn-skip-freq``;
    ``TransformerConfig.window_attn_skip_freq``."""
    activation_func_clamp_value: float | None = None
    """The gated MLP's inputs are clamped to this before the activation (GPT-OSS: 7.0,
    Hugging Face ``swiglu_limit``); megatron-core clamps them in eager ops ahead of its fused
    activation (``weighted_bias_quick_geglu_impl``). Needs ``swiglu``. Megatron
    ``--activation-func-clamp-value``; ``TransformerConfig.activation_func_clamp_value``."""
    yarn_rotary_scaling_factor: float | None = None
    """RoPE extended by YaRN with this factor (dimensionless; Megatron-Bridge's GPT-OSS: 32,
    Hugging Face ``rope_scaling`` of type ``yarn``); megatron-core's
    ``position_embedding_type='yarn'`` (``YarnRotaryEmbedding``). Its attention
    concentration factor (:attr:`rope_mscale`) scales cos and sin, which Transformer
    Engine's fused RoPE does not take, so megatron-core applies RoPE in eager ops
    (``rope_utils.apply_rotary_pos_emb``). No parameters. Needs ``position_embedding_type``
    ``rope`` and no multi-latent attention. No core_v0.16.1 flag selects it without MLA:
    the launch scripts train plain RoPE and say so (launchers/script_parts.py);
    ``TransformerConfig.yarn_rotary_scaling_factor``."""
    attention_chunk_size: int | None = field(default=None, compare=False)
    """Chunked attention over blocks of this many tokens (Llama 4; Hugging Face
    ``attention_chunk_size``, Megatron-Bridge's ``Llama4SelfAttention``, which splits a
    longer sequence into such chunks, each attending causally within itself); None: none.
    A sequence of at most one chunk is plain causal attention, the only case priced: a
    longer ``seq_length`` is an input error. Like ``max_position_embeddings`` a bound on
    ``seq_length``, so it takes no part in comparing two models; not a Megatron argument
    (megatron-core 0.16.1 has no chunked attention)."""
    max_position_embeddings: int | None = field(default=None, compare=False)
    """The longest sequence the model's positions support (tokens; Megatron's
    ``--max-position-embeddings``; Hugging Face ``max_position_embeddings``): an upper bound
    on ``seq_length``, None when not given. With ``seq_length_source``, what the user is
    told, not what is trained: neither takes part in comparing two models."""
    seq_length_source: str | None = field(default=None, compare=False)
    """Why ``seq_length`` has its value, where it was chosen for the user (a Hugging Face
    config's pretraining length: :func:`configurator.core.hf_import.pretraining_seq_length`;
    ``"given"`` once ``--seq-length`` replaced it); None for a preset or a Megatron-keyed
    file. Not a Megatron argument."""

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def rope_mscale(self) -> float:
        """YaRN's attention concentration factor ``0.1·ln(factor) + 1`` (1 without YaRN or
        with a factor ≤ 1): megatron-core ``yarn_rotary_pos_embedding._yarn_get_mscale``, as
        ``_yarn_get_concentration_factor`` takes it with ``yarn_mscale`` and
        ``yarn_mscale_all_dim`` unset (Megatron-Bridge's GPT-OSS sets both to None)."""
        f = self.yarn_rotary_scaling_factor
        return 1.0 if f is None or f <= 1 else 0.1 * math.log(f) + 1.0

    @property
    def rope_unfused(self) -> bool:
        """megatron-core applies this model's RoPE in eager ops: TE's fused RoPE takes no
        ``mscale`` (core_v0.16.1 ``rope_utils.apply_rotary_pos_emb``: "mscale ... is not
        supported by TE's fused RoPE. Using unfused implementation")."""
        return self.position_embedding_type == "rope" and self.rope_mscale != 1.0

    @property
    def moe_layer_pattern(self) -> tuple[int, ...]:
        """One 0/1 per layer, 1 for an MoE layer (all 0 for a dense model); Megatron's
        ``TransformerConfig.moe_layer_freq`` expansion (int N: ``i % N == 0``)."""
        if not self.num_experts:
            return (0,) * self.num_layers
        if isinstance(self.moe_layer_freq, int):
            return tuple(int(i % self.moe_layer_freq == 0) for i in range(self.num_layers))
        return tuple(self.moe_layer_freq)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_pattern)

    @property
    def attention_heads_dims(self) -> tuple[int, int]:
        """``(query/key head dim, value head dim)``: MLA ``(qk + qk_pos_emb, v)``, else
        ``(kv_channels, kv_channels)``."""
        if self.multi_latent_attention:
            return self.qk_head_dim + self.qk_pos_emb_head_dim, self.v_head_dim
        return self.kv_channels, self.kv_channels

    @property
    def attention_kv_heads(self) -> int:
        """Key/value heads the attention kernel sees: the query groups, or every head with
        multi-latent attention (K and V are up-projected per head)."""
        return self.num_attention_heads if self.multi_latent_attention else self.num_query_groups

    @property
    def num_window_layers(self) -> int:
        """Layers with sliding-window attention (Megatron's ``is_layer_window_attention``:
        every layer, or all but every ``window_attn_skip_freq``-th, 1-based)."""
        if not self.window_size:
            return 0
        if not self.window_attn_skip_freq:
            return self.num_layers
        return self.num_layers - self.num_layers // self.window_attn_skip_freq

    @property
    def attention_layer_kinds(self) -> tuple[tuple[float, float, int | None], ...]:
        """The layers' kinds of self-attention as ``(share of the layers, fraction of the
        s × s query-key pairs computed, window in keys or None)``: full causal attention
        computes ½ of the pairs; a causal window of ``w`` keys ``w/s·(1 − w/(2s))``
        (Megatron ``is_layer_window_attention`` decides which layers,
        :attr:`num_window_layers`). A window of ``s`` keys or more is full attention."""
        s = self.seq_length
        n = self.num_window_layers
        if not n or self.window_size >= s:
            return ((1.0, 0.5, None),)
        w = self.window_size
        window = (n / self.num_layers, w / s * (1 - w / (2 * s)), w)
        if n == self.num_layers:
            return (window,)
        return ((1.0 - n / self.num_layers, 0.5, None), window)

    @property
    def attention_score_fraction(self) -> float:
        """Mean fraction of the ``s × s`` query-key pairs a layer computes, over the layers
        (:attr:`attention_layer_kinds`)."""
        return sum(share * fraction for share, fraction, _ in self.attention_layer_kinds)

    def with_seq_length(self, seq_length: int) -> "ModelSpec":
        """This model at ``seq_length`` tokens (``--seq-length``). Raises
        :class:`InputError` above :attr:`max_position_embeddings` or
        :attr:`attention_chunk_size`."""
        seq = v.int_in_range("seq_length", seq_length)
        _check_context(seq, self.max_position_embeddings, self.attention_chunk_size)
        return dataclasses.replace(
            self, seq_length=seq,
            seq_length_source=None if self.seq_length_source is None else "given")

    @property
    def seq_length_note(self) -> str:
        """How ``seq_length`` was chosen, for the first line of an output: ``""`` for a
        preset or a Megatron-keyed file (the file gives it), else e.g. ``" (pretraining
        length of Llama 3, ...; max context 131072; --seq-length to change)"``."""
        if self.seq_length_source is None:
            return ""
        ctx = ("" if self.max_position_embeddings is None
               else f"; max context {self.max_position_embeddings}")
        if self.seq_length_source == "given":
            return f" (--seq-length{ctx})"
        return f" ({self.seq_length_source}{ctx}; --seq-length to change)"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for key in ("attention_chunk_size", "max_position_embeddings", "seq_length_source"):
            if d[key] is None:     # a preset's or a Megatron file's: no such keys
                del d[key]
        if isinstance(self.moe_layer_freq, tuple):
            d["moe_layer_freq"] = list(self.moe_layer_freq)
        return d


#: Megatron-LM core_v0.16.1 ``TransformerConfig.moe_router_load_balancing_type`` values.
LOAD_BALANCING_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
MODEL_KEYS_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size",
                       "seq_length")
#: Keys with their defaults filled in by :func:`make_model` (Megatron's defaults).
MODEL_KEYS_OPTIONAL = ("name", "num_query_groups", "ffn_hidden_size", "kv_channels", "swiglu",
                       "untie_embeddings_and_output_weights", "normalization", "norm_epsilon",
                       "hidden_dropout", "attention_dropout", "position_embedding_type",
                       "rotary_base", "add_bias_linear", "add_qkv_bias", "qk_layernorm",
                       "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
                       "moe_shared_expert_intermediate_size", "moe_layer_freq",
                       "moe_router_load_balancing_type", "moe_router_enable_expert_bias",
                       "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                       "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers", "window_size",
                       "window_attn_skip_freq", "activation_func_clamp_value",
                       "yarn_rotary_scaling_factor", "attention_chunk_size",
                       "max_position_embeddings", "seq_length_source")
MODEL_KEYS = MODEL_KEYS_REQUIRED + MODEL_KEYS_OPTIONAL


def _check_context(seq_length: int, max_positions: int | None,
                   chunk: int | None = None) -> None:
    """Megatron's rule ``max_position_embeddings >= seq_length`` (arguments.py
    ``validate_args``), and a sequence within one attention chunk
    (:attr:`ModelSpec.attention_chunk_size`)."""
    if max_positions is not None and seq_length > max_positions:
        raise InputError("seq_length", seq_length,
                         f"must be at most the model's max_position_embeddings "
                         f"({max_positions}, its maximum context): lower --seq-length")
    if chunk is not None and seq_length > chunk:
        raise InputError("seq_length", seq_length,
                         f"above the model's attention_chunk_size ({chunk}): chunked "
                         f"attention is priced only within one chunk, where it is causal "
                         f"attention; lower --seq-length")


def _optional_int(kw: Mapping[str, Any], key: str, default=None):
    val = kw.get(key, default)
    return None if val is None else v.int_in_range(key, val)


def _probability(key: str, val: Any) -> float:
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val < 1:
        raise InputError(key, val, "must be a probability in [0, 1)")
    return float(val)


def _layer_freq(val: Any, num_layers: int) -> int | tuple[int, ...]:
    """``moe_layer_freq``: a positive int, or a list of one 0/1 per layer with at least one 1
    (Megatron's ``--moe-layer-freq``, transformer_config.py)."""
    if isinstance(val, (list, tuple)):
        if len(val) != num_layers or any(isinstance(x, bool) or x not in (0, 1) for x in val):
            raise InputError("moe_layer_freq", val,
                             f"a list must hold one 0 or 1 per layer ({num_layers})")
        if not any(val):
            raise InputError("moe_layer_freq", val, "must mark at least one MoE layer")
        return tuple(int(x) for x in val)
    n = v.int_in_range("moe_layer_freq", val)
    if n > num_layers:
        raise InputError("moe_layer_freq", n, f"must be at most num_layers ({num_layers})")
    return n


def make_model(**kw: Any) -> ModelSpec:
    """Build a validated :class:`ModelSpec` from Megatron-named keyword arguments.

    Raises :class:`InputError` naming the field for a non-positive size, heads that do not
    divide the hidden size (when ``kv_channels`` is not given), query groups that do not
    divide the heads, an unknown normalization, MoE fields without ``num_experts``,
    ``moe_router_topk`` above ``num_experts``, MLA fields without
    ``multi_latent_attention``, or a bad ``moe_layer_freq``. Rules from Megatron-LM
    core_v0.16.1 ``megatron/training/arguments.py`` (``validate_args``) and
    ``transformer_config.py`` (``__post_init__``).
    """
    v.exact_keys("model", kw, MODEL_KEYS_REQUIRED, MODEL_KEYS_OPTIONAL)
    n = {k: v.int_in_range(k, kw[k]) for k in MODEL_KEYS_REQUIRED}
    heads, hidden = n["num_attention_heads"], n["hidden_size"]
    if kw.get("kv_channels") is None and hidden % heads:
        raise InputError("num_attention_heads", heads,
                         f"must divide hidden_size ({hidden}) to give the head dimension "
                         "(or give kv_channels)")
    kv_channels = _optional_int(kw, "kv_channels") or hidden // heads
    groups = v.int_in_range("num_query_groups", kw.get("num_query_groups", heads))
    if heads % groups:
        raise InputError("num_query_groups", groups,
                         f"must divide num_attention_heads ({heads})")
    swiglu = v.boolean("swiglu", kw.get("swiglu", False))
    ffn_default = swiglu_ffn_hidden_size(hidden) if swiglu else 4 * hidden
    ffn = v.int_in_range("ffn_hidden_size", kw.get("ffn_hidden_size", ffn_default))
    flags = {k: v.boolean(k, kw.get(k, d)) for k, d in (
        ("untie_embeddings_and_output_weights", False), ("add_bias_linear", True),
        ("add_qkv_bias", False), ("qk_layernorm", False), ("multi_latent_attention", False))}
    norm = v.choice("normalization", kw.get("normalization", "LayerNorm"),
                    ("LayerNorm", "RMSNorm"))
    eps = kw.get("norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise InputError("norm_epsilon", eps, "must be a number in (0, 1)")
    drops = {k: _probability(k, kw.get(k, 0.1)) for k in ("hidden_dropout", "attention_dropout")}
    pos = v.choice("position_embedding_type", kw.get("position_embedding_type",
                                                      "learned_absolute"),
                   ("learned_absolute", "rope", "none"))
    rotary_base = v.int_in_range("rotary_base", kw.get("rotary_base", 10000))
    experts = _optional_int(kw, "num_experts")
    moe = {"moe_router_topk": v.int_in_range("moe_router_topk", kw.get("moe_router_topk", 2)),
           "moe_ffn_hidden_size": _optional_int(kw, "moe_ffn_hidden_size"),
           "moe_shared_expert_intermediate_size": _optional_int(
               kw, "moe_shared_expert_intermediate_size"),
           "moe_layer_freq": _layer_freq(kw.get("moe_layer_freq", 1), n["num_layers"]),
           "moe_router_load_balancing_type": v.choice(
               "moe_router_load_balancing_type",
               kw.get("moe_router_load_balancing_type", "aux_loss"),
               LOAD_BALANCING_TYPES),
           "moe_router_enable_expert_bias": v.boolean(
               "moe_router_enable_expert_bias", kw.get("moe_router_enable_expert_bias", False))}
    if experts is None:
        defaults = {"moe_router_topk": 2, "moe_layer_freq": 1,
                    "moe_router_load_balancing_type": "aux_loss",
                    "moe_router_enable_expert_bias": False}
        given = [k for k in moe if kw.get(k) not in (None, defaults.get(k))]
        if given:
            raise InputError(given[0], kw[given[0]], "needs num_experts (a dense model has "
                             "no experts)")
    else:
        if moe["moe_router_topk"] > experts:
            raise InputError("moe_router_topk", moe["moe_router_topk"],
                             f"must be at most num_experts ({experts})")
        moe["moe_ffn_hidden_size"] = moe["moe_ffn_hidden_size"] or ffn
    mla_keys = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                "v_head_dim")
    if not flags["multi_latent_attention"]:
        mla_defaults = {"kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                        "v_head_dim": 128}
        given = [k for k in mla_keys if kw.get(k) not in (None, mla_defaults.get(k))]
        if given:
            raise InputError(given[0], kw[given[0]], "needs multi_latent_attention: true")
    mla = {"q_lora_rank": _optional_int(kw, "q_lora_rank"),
           **{k: _optional_int(kw, k, d) for k, d in (("kv_lora_rank", 512),
                                                       ("qk_head_dim", 128),
                                                       ("qk_pos_emb_head_dim", 64),
                                                       ("v_head_dim", 128))}}
    mtp = _optional_int(kw, "mtp_num_layers")
    # validate_args / TransformerConfig / SharedExpertMLP rules
    if flags["multi_latent_attention"] and groups != heads:
        raise InputError("num_query_groups", groups, "multi-latent attention has no query "
                         f"groups: leave it at num_attention_heads ({heads})")
    if mtp and pos == "learned_absolute":
        raise InputError("mtp_num_layers", mtp, "multi-token prediction needs rope or no "
                         "position embedding")
    if experts is not None and moe["moe_shared_expert_intermediate_size"] and \
            flags["add_bias_linear"]:
        raise InputError("moe_shared_expert_intermediate_size",
                         moe["moe_shared_expert_intermediate_size"],
                         "a shared expert has no biases: needs add_bias_linear false")
    window = {k: _optional_int(kw, k) for k in ("window_size", "window_attn_skip_freq")}
    if window["window_attn_skip_freq"] and not window["window_size"]:
        raise InputError("window_attn_skip_freq", window["window_attn_skip_freq"],
                         "needs window_size")
    clamp = kw.get("activation_func_clamp_value")
    if clamp is not None:
        clamp = v.positive_float("activation_func_clamp_value", clamp)
        if not swiglu:
            raise InputError("activation_func_clamp_value", clamp,
                             "clamps a gated MLP's inputs: needs swiglu (a gated linear unit)")
    yarn = kw.get("yarn_rotary_scaling_factor")
    if yarn is not None:
        yarn = v.positive_float("yarn_rotary_scaling_factor", yarn)
        if pos != "rope" or flags["multi_latent_attention"]:
            raise InputError("yarn_rotary_scaling_factor", yarn,
                             "scales RoPE: needs position_embedding_type rope and no "
                             "multi-latent attention (MLA has its own rotary embedding)")
    name = v.display_name("name", kw.get("name", "custom"))
    max_positions = _optional_int(kw, "max_position_embeddings")
    chunk = _optional_int(kw, "attention_chunk_size")
    _check_context(n["seq_length"], max_positions, chunk)
    source = kw.get("seq_length_source")
    if source is not None:
        source = v.printable_text("seq_length_source", source)
        if len(source) > 300:
            raise InputError("seq_length_source", source, "must be at most 300 characters")
    return ModelSpec(max_position_embeddings=max_positions, seq_length_source=source,
                     attention_chunk_size=chunk,
                     name=name, num_query_groups=groups, ffn_hidden_size=ffn,
                     activation_func_clamp_value=clamp, yarn_rotary_scaling_factor=yarn,
                     kv_channels=kv_channels, swiglu=swiglu, normalization=norm,
                     norm_epsilon=float(eps), position_embedding_type=pos,
                     rotary_base=rotary_base, num_experts=experts, mtp_num_layers=mtp,
                     **window, **flags, **drops, **moe, **mla, **n)
