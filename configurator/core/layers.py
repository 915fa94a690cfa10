"""Which decoder layers each pipeline rank builds: even, uneven and embedding/loss-aware
splits, and how many of a rank's layers are mixture-of-experts layers.

Megatron-LM core_v0.16.1 ``megatron/core/transformer/transformer_block.py``
(``get_num_layers_to_build``, ``get_transformer_layer_offset``) and
``megatron/training/arguments.py`` (``validate_args``):

* even: ``L / pp`` layers per rank, ``L / (pp·vp)`` per virtual stage;
* uneven (``decoder_first_pipeline_num_layers`` ``F``, ``decoder_last_pipeline_num_layers``
  ``E``, 0 = not given): the first rank builds ``F``, the last ``E``, the other ranks split
  the rest evenly; with ``vp`` virtual stages each rank's layers are split evenly over its
  chunks (so ``F``, ``E`` and the middle layers per rank must divide by ``vp``);
* ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: the
  embedding (loss) counts as one layer, so ``L + e + l`` splits evenly over ``pp·vp``
  virtual stages and the first (last) virtual stage builds one decoder layer fewer, none
  where a stage holds one slot (``get_num_layers_to_build`` asserts only ``>= 0``).

* a pipeline layout (``pipeline_model_parallel_layout``, Megatron
  ``--pipeline-model-parallel-layout``, megatron/core/transformer/
  pipeline_parallel_layer_layout.py): ``pp·vp`` virtual stages separated by ``|``, each a
  run of ``E`` (embedding), ``t`` (decoder layer), ``m`` (multi-token-prediction layer) and
  ``L`` (loss), with ``(…)*n`` and ``x*n`` repeats and cosmetic commas; ``vp`` is the
  number of stages over ``pp``. The embedding opens the first stage and the loss closes the
  last, each exactly once; the decoder layers count ``num_layers`` and the MTP layers
  ``mtp_num_layers`` (:func:`layout_problem`).

Virtual stage ``k = j·pp + r`` (chunk ``j`` of rank ``r``) holds the next layers in model
order. Everything here is exact integer bookkeeping on one split; :func:`split_ok`
broadcasts the legality test over numpy arrays for the search.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

import numpy as np

from configurator.core.model import ModelSpec
from configurator.core.rows import row_groups

#: Characters of a pipeline layout: layers ``E``, ``t``, ``m``, ``L``, the stage separator,
#: the repeats ``(…)*n`` / ``x*n`` and cosmetic commas (Megatron's ``parse_str_to_list``).
LAYOUT_CHARACTERS = frozenset("ELtm|()*,0123456789")
#: Longest expanded layout accepted (layers and separators): far above any real model, and
#: a bound on what ``(t|)*999999999`` would otherwise allocate.
LAYOUT_MAX_EXPANDED = 100_000
#: Megatron's two unrolling patterns, applied in order: ``(…)*n`` (no nesting), then ``x*n``.
_LAYOUT_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))


#: Pipeline layouts seen in this process by their :func:`layout_code` (for :func:`layout_text`).
_LAYOUT_TEXTS: dict[int, str] = {0: ""}


def layout_code(layout: str) -> int:
    """The integer standing for ``layout`` in column stores: 0 for "" (no layout), else the
    first 7 bytes of the text's BLAKE2b digest (a positive int64). The code depends on the
    text alone, never on what else this process has seen, so a column of codes sorts and
    compares the same in every run. Raises :class:`ValueError` on a digest collision (two
    layouts one code; at 56 bits not expected in any search)."""
    if not layout:
        return 0
    code = int.from_bytes(hashlib.blake2b(layout.encode(), digest_size=7).digest(), "big")
    seen = _LAYOUT_TEXTS.setdefault(code, layout)
    if seen != layout:
        raise ValueError(f"pipeline layouts {seen!r} and {layout!r} share code {code}")
    return code


def layout_text(code: int) -> str:
    """The layout :func:`layout_code` gave ``code`` (a layout encoded in this process)."""
    return _LAYOUT_TEXTS[int(code)]


class LayoutError(ValueError):
    """A pipeline layout Megatron would refuse; the message names the rule."""


@lru_cache(maxsize=256)
def parse_layout(layout: str) -> tuple[str, ...]:
    """The virtual stages of a pipeline layout string, each as its run of layer characters
    (``"Et*2|(tt|)*2tmL"`` → ``("Ett", "tt", "tt", "tmL")``), unrolled as Megatron's
    ``PipelineParallelLayerLayout.parse_str_to_list`` does (commas dropped, ``(…)*n`` then
    ``x*n``). Raises :class:`LayoutError` for a character outside
    :data:`LAYOUT_CHARACTERS`, a repeat left over after unrolling, or an expansion longer than
    :data:`LAYOUT_MAX_EXPANDED`."""
    bad = sorted(set(layout) - LAYOUT_CHARACTERS)
    if bad:
        raise LayoutError(f"character {bad[0]!r} is not one of E, L, t, m, |, (, ), *, digits "
                          f"or commas")
    text = layout.replace(",", "")
    for pattern in _LAYOUT_REPEATS:
        size, pos, parts = 0, 0, []
        for mt in pattern.finditer(text):
            # n is bounded before the repeat is built, so a huge count fails fast
            count = int(mt.group(2)) if len(mt.group(2)) < 7 else LAYOUT_MAX_EXPANDED + 1
            size += (mt.start() - pos) + len(mt.group(1)) * count
            if size > LAYOUT_MAX_EXPANDED:
                raise LayoutError(f"unrolls to more than {LAYOUT_MAX_EXPANDED:,} layers")
            parts += [text[pos:mt.start()], mt.group(1) * count]
            pos = mt.end()
        text = "".join(parts) + text[pos:]
    left = sorted(set(text) - set("ELtm|"))
    if left:
        raise LayoutError(f"{left[0]!r} left after unrolling the repeats (a repeat is "
                          f"'(stages)*n' or 'x*n', not nested)")
    return tuple(text.split("|"))


def layout_problem(layout: str, num_layers: int, mtp_num_layers: int, pp: int,
                   vp: int) -> str | None:
    """Why Megatron refuses ``layout`` for a model of ``num_layers`` decoder layers and
    ``mtp_num_layers`` MTP layers on ``pp`` ranks with ``vp`` virtual stages each, or None
    (megatron/training/arguments.py ``validate_args``: stages divisible by pp, vp = stages /
    pp; pipeline_parallel_layer_layout.py ``validate_layer_layout``). Also refused: MTP
    layers anywhere but the loss's stage, which this cost model does not price."""
    try:
        stages = parse_layout(layout)
    except LayoutError as exc:
        return str(exc)
    n = len(stages)
    if n % pp:
        return f"its {n} stages must be divisible by pp ({pp})"
    if n // pp != vp:
        return f"its {n} stages over pp={pp} make vp {n // pp}, not {vp}"
    flat = "".join(stages)
    if not flat.startswith("E") or flat.count("E") != 1:
        return "the embedding 'E' must open the first stage, exactly once"
    if not flat.endswith("L") or flat.count("L") != 1:
        return "the loss 'L' must close the last stage, exactly once"
    if flat.count("t") != num_layers:
        return f"it has {flat.count('t')} decoder layers 't'; the model has {num_layers}"
    if flat.count("m") != mtp_num_layers:
        return f"it has {flat.count('m')} MTP layers 'm'; the model has {mtp_num_layers}"
    if "m" in flat and ("m" not in stages[-1] or "t" in flat[flat.index("m"):]):
        return "MTP layers 'm' must follow every decoder layer, in the loss's stage"
    return None


def layout_stage_layers(layout: str, num_layers: int) -> tuple[tuple[int, int], ...]:
    """``(start, count)`` of the decoder layers of each virtual stage of a valid layout (the
    stages in virtual-stage order ``k = j·pp + r``, as Megatron lists them)."""
    counts = [stage.count("t") for stage in parse_layout(layout)]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    assert sum(counts) == num_layers, (layout, num_layers)
    return tuple(zip((int(s) for s in starts), counts))


def format_layout(counts, mtp_num_layers: int = 0) -> str:
    """The layout string of decoder-layer ``counts`` per virtual stage, the embedding on the
    first and the MTP layers and loss on the last: ``[5, 4, 4, 4, 2]`` →
    ``"Et*5|(t*4|)*3t*2L"``. Runs of equal middle stages are written ``(…|)*n``;
    :func:`parse_layout` reads it back to the same stages."""
    def run(k):
        return "t" * k if k < 3 else f"t*{k}"
    body = [run(int(k)) for k in counts]
    body[0] = "E" + body[0]
    body[-1] = body[-1] + "m" * int(mtp_num_layers) + "L"
    if len(body) == 1:
        return body[0]
    out, i = [body[0] + "|"], 1
    while i < len(body) - 1:
        j = i
        while j + 1 < len(body) - 1 and body[j + 1] == body[i]:
            j += 1
        out.append(f"({body[i]}|)*{j - i + 1}" if j > i else body[i] + "|")
        i = j + 1
    return "".join(out) + body[-1]


def split_ok(num_layers: int, *, pp, vp, first, last, account_embedding, account_loss):
    """Whether Megatron accepts the layer split (arrays broadcast; the rules in the module
    docstring). ``first``/``last`` of 0 mean "not given"; uneven and embedding/loss-aware
    splits do not mix (``validate_args``)."""
    pp, vp, first, last = (np.asarray(x, dtype=np.int64) for x in (pp, vp, first, last))
    ae, al = np.asarray(account_embedding, dtype=np.int64), np.asarray(account_loss,
                                                                      dtype=np.int64)
    uneven = (first > 0) | (last > 0)
    accounted = (ae + al) > 0
    total = num_layers + ae + al
    even_ok = (((vp == 1) | (pp > 1)) & (total % (pp * vp) == 0)
               & (total >= pp * vp))
    mid = num_layers - first - last
    mid_ranks = pp - (first > 0) - (last > 0)
    mid_div = np.maximum(mid_ranks, 1) * vp
    uneven_ok = ((pp > 1) & (mid >= 0) & (first % vp == 0) & (last % vp == 0)
                 & np.where(mid_ranks > 0, (mid % mid_div == 0) & (mid >= mid_div), mid == 0)
                 & ~accounted)
    return np.where(uneven, uneven_ok, even_ok)


@lru_cache(maxsize=4096)
def virtual_stage_layers(num_layers: int, pp: int, vp: int, first: int = 0, last: int = 0,
                         account_embedding: bool = False, account_loss: bool = False,
                         layout: str = "") -> tuple[tuple[int, int], ...]:
    """``(start, count)`` of the decoder layers of each virtual stage ``k = j·pp + r`` in
    model order (``pp·vp`` entries); ``layout``: a pipeline layout (the other split
    arguments then unset), taken as given (:func:`layout_problem` checks it). Raises
    ValueError for a split :func:`split_ok` rejects."""
    if layout:
        stages = layout_stage_layers(layout, num_layers)
        if len(stages) != pp * vp:
            raise ValueError(f"layout {layout!r} has {len(stages)} stages, not pp*vp = "
                             f"{pp * vp}")
        return stages
    if not bool(split_ok(num_layers, pp=pp, vp=vp, first=first, last=last,
                         account_embedding=account_embedding, account_loss=account_loss)):
        raise ValueError(f"illegal layer split of {num_layers} layers over pp={pp} vp={vp} "
                         f"first={first} last={last}")
    n = pp * vp
    if first or last:
        mid_ranks = pp - (first > 0) - (last > 0)
        per_mid = (num_layers - first - last) // max(mid_ranks * vp, 1)
        counts = []
        for k in range(n):
            r = k % pp
            if r == 0 and first:
                counts.append(first // vp)
            elif r == pp - 1 and last:
                counts.append(last // vp)
            else:
                counts.append(per_mid)
    else:
        per = (num_layers + account_embedding + account_loss) // n
        counts = [per] * n
        counts[0] -= int(account_embedding)
        counts[-1] -= int(account_loss)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
    return tuple(zip((int(s) for s in starts), counts))


@lru_cache(maxsize=4096)
def chunk_layer_counts(model: ModelSpec, pp: int, vp: int, first: int = 0, last: int = 0,
                       account_embedding: bool = False, account_loss: bool = False,
                       layout: str = "") -> np.ndarray:
    """``[pp, vp, 2]`` int array: decoder layers and MoE layers of chunk ``j`` of pipeline
    rank ``r`` (virtual stage ``j·pp + r``)."""
    cum = np.concatenate([[0], np.cumsum(model.moe_layer_pattern)])
    out = np.zeros((pp, vp, 2), dtype=np.int64)
    for k, (start, count) in enumerate(virtual_stage_layers(
            model.num_layers, pp, vp, first, last, account_embedding, account_loss,
            layout)):
        out[k % pp, k // pp] = (count, cum[start + count] - cum[start])
    out.setflags(write=False)
    return out


@lru_cache(maxsize=4096)
def rank_layer_counts(model: ModelSpec, pp: int, vp: int, first: int = 0, last: int = 0,
                      account_embedding: bool = False, account_loss: bool = False,
                      layout: str = "") -> np.ndarray:
    """``[pp, 2]`` int array: decoder layers and MoE layers each pipeline rank builds (all
    its virtual stages)."""
    out = chunk_layer_counts(model, pp, vp, first, last, account_embedding,
                             account_loss, layout).sum(axis=1)
    out.setflags(write=False)
    return out


def stage_classes(model: ModelSpec, pp: int, vp: int, first: int = 0, last: int = 0,
                  account_embedding: bool = False, account_loss: bool = False,
                  layout: str = ""):
    """Pipeline ranks grouped by what they hold: ``[(stage, count, layers, moe_layers)]``,
    one entry per distinct ``(layers, moe_layers, is_first, is_last)``, ``stage`` the lowest
    rank of the class (it holds the most microbatches in flight) and ``count`` its ranks."""
    counts = rank_layer_counts(model, pp, vp, first, last, account_embedding, account_loss,
                               layout)
    seen: dict[tuple, list] = {}
    for r in range(pp):
        key = (int(counts[r, 0]), int(counts[r, 1]), r == 0, r == pp - 1)
        if key in seen:
            seen[key][1] += 1
        else:
            seen[key] = [r, 1, key[0], key[1]]
    return [tuple(x) for x in seen.values()]


def stage_class_arrays(model: ModelSpec, *, pp, vp, first, last, account_embedding,
                       account_loss, layout="") -> dict[str, np.ndarray]:
    """:func:`stage_classes` for arrays of plans, padded to the largest class count ``K``:
    ``{"stage", "count", "layers", "moe_layers"}`` each of shape ``[N, K]`` (padding repeats
    class 0 with ``count`` 0). Computed once per distinct split; ``layout``: a pipeline
    layout per plan, as text or :func:`layout_code` codes (or one for all; "" or 0 where
    the other split arguments apply)."""
    codes = np.atleast_1d(np.asarray(layout_code(layout) if isinstance(layout, str)
                                     else layout, dtype=np.int64))
    cols = [np.atleast_1d(np.asarray(x, dtype=np.int64)) for x in (
        pp, vp, first, last, account_embedding, account_loss)] + [codes]
    n = max(len(c) for c in cols)
    # the distinct splits by a lookup table of their values (no sort)
    first_of, inverse = row_groups(*(np.broadcast_to(c, (n,)) for c in cols))
    uniq = np.stack([np.broadcast_to(c, (n,))[first_of] for c in cols], axis=1)
    per = [stage_classes(model, int(k[0]), int(k[1]), int(k[2]), int(k[3]), bool(k[4]),
                         bool(k[5]), layout_text(k[6])) for k in uniq]
    K = max(len(c) for c in per)
    table = np.zeros((len(uniq), K, 4), dtype=np.int64)
    for i, classes in enumerate(per):
        for j in range(K):
            stage, count, layers, moe = classes[j] if j < len(classes) else classes[0]
            table[i, j] = (stage, count if j < len(classes) else 0, layers, moe)
    rows = table[np.asarray(inverse).reshape(-1)]
    return {"stage": rows[:, :, 0], "count": rows[:, :, 1], "layers": rows[:, :, 2],
            "moe_layers": rows[:, :, 3]}
