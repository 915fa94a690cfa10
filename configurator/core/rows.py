"""Distinct rows of a few columns, for evaluating a term once per distinct input.

A search holds hundreds of thousands of plans whose terms often depend on a handful of
columns with few distinct values (a layer's activations on tp, cp, micro_batch_size,
sequence_parallel, the recompute code): :func:`row_groups` maps every plan to its row of
distinct values so such a term is computed once per row and gathered back
(``term_of_rows[inverse]``), giving element for element what the whole arrays give.
"""

from __future__ import annotations

import numpy as np

#: Largest value range of a column (max − min + 1) coded with a lookup table rather than
#: a sort; above it, and when the product of the columns' distinct counts exceeds it, the
#: rows are coded with :func:`numpy.unique`.
DENSE_RANGE = 1 << 20
#: Bins of the low bits a column wider than :data:`DENSE_RANGE` is first labelled by (pipeline
#: layouts' 56-bit digests: a few dozen distinct values in a search); where two distinct
#: values share their low bits the column is sorted instead.
LOW_BITS_BINS = 1 << 16


def _low_bits_codes(col: np.ndarray, lo: int) -> tuple[np.ndarray, int] | None:
    """``(codes, count)`` of a wide column from its low bits above ``lo`` (a dense labelling
    in order of those bits, not of the values), or None where the low bits do not tell its
    values apart."""
    low = (col - lo) & (LOW_BITS_BINS - 1)
    present = np.bincount(low, minlength=LOW_BITS_BINS) > 0
    rank = np.cumsum(present) - 1
    codes = rank.take(low)
    count = int(rank[-1]) + 1
    first = np.empty(count, dtype=np.int64)
    first[codes] = np.arange(len(col))
    if not np.array_equal(col.take(first).take(codes), col):
        return None
    return codes, count


def _codes(col: np.ndarray) -> tuple[np.ndarray, int]:
    """``(codes, count)``: a dense labelling of the column's distinct values, ``0 ..
    count − 1`` (each entry's rank among them where the column's range is narrow)."""
    if col.dtype == bool:
        return col.view(np.uint8), 2
    lo, hi = int(col.min()), int(col.max())
    if hi - lo < DENSE_RANGE:
        if lo < 0 or hi >= DENSE_RANGE:
            col, hi, lo = col - lo, hi - lo, 0
        present = np.bincount(col, minlength=hi + 1) > 0   # the values 0..hi present
        if present.all():               # every value from 0 to hi: its own code
            return col, hi + 1
        rank = np.cumsum(present) - 1
        return rank.take(col), int(rank[-1]) + 1
    if lo >= 0:
        labelled = _low_bits_codes(col, lo)
        if labelled is not None:
            return labelled
    values, codes = np.unique(col, return_inverse=True)
    return codes.ravel(), len(values)


def row_groups(*columns) -> tuple[np.ndarray, np.ndarray] | None:
    """``(first, inverse)`` for integer or boolean ``columns`` of one length ``n`` (scalars
    broadcast): ``first`` — the index of one plan (any) per distinct row; ``inverse``
    (shape ``(n,)``) — for each plan the position of its row in ``first``, so
    ``x[first][inverse]`` equals ``x`` for any column ``x`` among ``columns``. ``None`` when
    no column is an array (nothing to group)."""
    arrays = [np.asarray(c) for c in columns]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if len(shape) != 1:
        return None
    key = np.zeros(shape, dtype=np.int64)
    radix = 1
    for a in arrays:
        if a.ndim == 0:
            continue
        codes, count = _codes(a if a.dtype == bool else a.astype(np.int64, copy=False))
        if count == 1:                          # one value: the rows do not differ in it
            continue
        if radix * count >= DENSE_RANGE:        # keep the combined key dense
            key, radix = _codes(key)
        key = key * count + codes
        radix *= count
    if radix < DENSE_RANGE:
        present = np.bincount(key, minlength=radix) > 0
        rank = np.cumsum(present) - 1
        inverse = rank.take(key)
        first = np.empty(int(rank[-1]) + 1, dtype=np.int64)
        first[inverse] = np.arange(len(key))
        return first, inverse
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return first, inverse.ravel()


def distinct_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, inverse)``: the distinct rows of the 2-D array ``a`` in order of first
    appearance (rows equal bit for bit) and, for each row of ``a``, its index among them
    (``rows[inverse]`` equals ``a``). For the tens of rows a placement prices (one per
    data-parallel replica), a dictionary of the rows' bytes is much quicker than
    :func:`numpy.unique` with ``axis=0``, which sorts structured copies."""
    a = np.ascontiguousarray(a)
    index: dict[bytes, int] = {}
    inverse = np.empty(len(a), dtype=np.int64)
    keep: list[int] = []
    for i, row in enumerate(a):
        j = index.setdefault(row.tobytes(), len(keep))
        if j == len(keep):
            keep.append(i)
        inverse[i] = j
    return a[keep], inverse

