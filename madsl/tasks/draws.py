"""Vectorized building blocks the generators share (no per-sample Python loops)."""

from __future__ import annotations

import numpy as np


def distinct_tokens(
    rng: np.random.Generator, vocab: int, shape: tuple[int, ...], k: int, dtype: type = np.int64
) -> np.ndarray:
    """`k` distinct ids from range(vocab) for every entry of `shape` -> shape + (k,).

    Uniform over ordered k-tuples without repetition (what itertools.permutations
    enumerates), drawn one slot at a time: the i-th id is a uniform rank among
    the vocab - i ids not yet taken, mapped past the taken ones in ascending order.
    """
    columns: list[np.ndarray] = []
    taken_ascending: list[np.ndarray] = []
    for i in range(k):
        token = rng.integers(0, vocab - i, shape, dtype=dtype)
        for taken in taken_ascending:
            token += token >= taken
        columns.append(token)
        # insert the new column into the ascending list (one compare-swap pass)
        merged, carry = [], token
        for taken in taken_ascending:
            merged.append(np.minimum(taken, carry))
            carry = np.maximum(taken, carry)
        taken_ascending = merged + [carry]
    return np.stack(columns, axis=-1) if columns else np.empty(shape + (0,), dtype=dtype)


def random_subset_mask(rng: np.random.Generator, rows: int, n: int, k: int) -> np.ndarray:
    """(rows, n) bool with exactly `k` True per row, the subset uniform at random."""
    mask = np.zeros((rows, n), dtype=bool)
    if k:
        chosen = np.argpartition(rng.random((rows, n)), k - 1, axis=1)[:, :k]
        np.put_along_axis(mask, chosen, True, axis=1)
    return mask


def first_index(codes: np.ndarray) -> np.ndarray:
    """For (N, P) non-negative integer codes: the column of the first occurrence of each entry's code in its row."""
    n, p = codes.shape
    top = (int(codes.max(initial=0)) + 1) * p
    if top < 2**63:  # sort (code, column) packed in one integer: faster than a stable argsort
        packed_type = np.int32 if top < 2**31 else np.int64
        packed = np.sort(codes.astype(packed_type) * p + np.arange(p, dtype=packed_type), axis=1)
        code, column = np.divmod(packed, p)
    else:
        column = np.argsort(codes, axis=1, kind="stable")
        code = np.take_along_axis(codes, column, axis=1)
    starts = np.ones((n, p), dtype=bool)
    starts[:, 1:] = code[:, 1:] != code[:, :-1]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(p), 0), axis=1)
    first = np.empty((n, p), dtype=np.int64)
    np.put_along_axis(first, column, np.take_along_axis(column, group_start, axis=1), axis=1)
    return first


def row_chunks(num: int, row_cost: int, budget: int = 1 << 22) -> list[slice]:
    """Row slices whose intermediates stay near `budget` elements (bounds peak memory at long lengths)."""
    step = max(1, budget // max(1, row_cost))
    return [slice(i, min(num, i + step)) for i in range(0, num, step)]
