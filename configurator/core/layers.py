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

Virtual stage ``k = j·pp + r`` (chunk ``j`` of rank ``r``) holds the next layers in model
order. Everything here is exact integer bookkeeping on one split; :func:`split_ok`
broadcasts the legality test over numpy arrays for the search.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from configurator.core.model import ModelSpec


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
                         account_embedding: bool = False,
                         account_loss: bool = False) -> tuple[tuple[int, int], ...]:
    """``(start, count)`` of the decoder layers of each virtual stage ``k = j·pp + r`` in
    model order (``pp·vp`` entries). Raises ValueError for a split :func:`split_ok`
    rejects."""
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
                       account_embedding: bool = False,
                       account_loss: bool = False) -> np.ndarray:
    """``[pp, vp, 2]`` int array: decoder layers and MoE layers of chunk ``j`` of pipeline
    rank ``r`` (virtual stage ``j·pp + r``)."""
    cum = np.concatenate([[0], np.cumsum(model.moe_layer_pattern)])
    out = np.zeros((pp, vp, 2), dtype=np.int64)
    for k, (start, count) in enumerate(virtual_stage_layers(
            model.num_layers, pp, vp, first, last, account_embedding, account_loss)):
        out[k % pp, k // pp] = (count, cum[start + count] - cum[start])
    out.setflags(write=False)
    return out


@lru_cache(maxsize=4096)
def rank_layer_counts(model: ModelSpec, pp: int, vp: int, first: int = 0, last: int = 0,
                      account_embedding: bool = False,
                      account_loss: bool = False) -> np.ndarray:
    """``[pp, 2]`` int array: decoder layers and MoE layers each pipeline rank builds (all
    its virtual stages)."""
    out = chunk_layer_counts(model, pp, vp, first, last, account_embedding,
                             account_loss).sum(axis=1)
    out.setflags(write=False)
    return out


def stage_classes(model: ModelSpec, pp: int, vp: int, first: int = 0, last: int = 0,
                  account_embedding: bool = False, account_loss: bool = False):
    """Pipeline ranks grouped by what they hold: ``[(stage, count, layers, moe_layers)]``,
    one entry per distinct ``(layers, moe_layers, is_first, is_last)``, ``stage`` the lowest
    rank of the class (it holds the most microbatches in flight) and ``count`` its ranks."""
    counts = rank_layer_counts(model, pp, vp, first, last, account_embedding, account_loss)
    seen: dict[tuple, list] = {}
    for r in range(pp):
        key = (int(counts[r, 0]), int(counts[r, 1]), r == 0, r == pp - 1)
        if key in seen:
            seen[key][1] += 1
        else:
            seen[key] = [r, 1, key[0], key[1]]
    return [tuple(x) for x in seen.values()]


def stage_class_arrays(model: ModelSpec, *, pp, vp, first, last, account_embedding,
                       account_loss) -> dict[str, np.ndarray]:
    """:func:`stage_classes` for arrays of plans, padded to the largest class count ``K``:
    ``{"stage", "count", "layers", "moe_layers"}`` each of shape ``[N, K]`` (padding repeats
    class 0 with ``count`` 0). Computed once per distinct split."""
    cols = [np.atleast_1d(np.asarray(x, dtype=np.int64)) for x in (
        pp, vp, first, last, account_embedding, account_loss)]
    n = max(len(c) for c in cols)
    # one int64 key per plan (12 bits each for pp, vp, first, last < 4096; 1 bit per flag):
    # a 1-D unique is an order of magnitude faster than a row-wise one
    key = np.zeros(n, dtype=np.int64)
    for c, bits in zip(cols, (12, 12, 12, 12, 1, 1)):
        key = (key << bits) | np.broadcast_to(c, (n,))
    _, first_of, inverse = np.unique(key, return_index=True, return_inverse=True)
    uniq = np.stack([np.broadcast_to(c, (n,))[first_of] for c in cols], axis=1)
    per = [stage_classes(model, int(k[0]), int(k[1]), int(k[2]), int(k[3]), bool(k[4]),
                         bool(k[5])) for k in uniq]
    K = max(len(c) for c in per)
    table = np.zeros((len(uniq), K, 4), dtype=np.int64)
    for i, classes in enumerate(per):
        for j in range(K):
            stage, count, layers, moe = classes[j] if j < len(classes) else classes[0]
            table[i, j] = (stage, count if j < len(classes) else 0, layers, moe)
    rows = table[np.asarray(inverse).reshape(-1)]
    return {"stage": rows[:, :, 0], "count": rows[:, :, 1], "layers": rows[:, :, 2],
            "moe_layers": rows[:, :, 3]}
