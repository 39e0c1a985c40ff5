"""Vectorized building blocks the generators share (no per-sample Python loops)."""
from __future__ import annotations

import numpy as np


def distinct_tokens(rng: np.random.Generator, vocab: int, shape: tuple[int, ...], k: int) -> np.ndarray:
    """`k` distinct ids from range(vocab) for every entry of `shape` -> shape + (k,).

    Uniform over ordered k-tuples without repetition (what itertools.permutations
    enumerates), drawn one slot at a time: the i-th id is a uniform rank among
    the vocab - i ids not yet taken, mapped past the taken ones in ascending order.
    """
    out = np.empty(shape + (k,), dtype=np.int64)
    for i in range(k):
        rank = rng.integers(0, vocab - i, shape)
        for taken in np.sort(out[..., :i], axis=-1).transpose(-1, *range(len(shape))):
            rank += rank >= taken
        out[..., i] = rank
    return out


def random_subset_mask(rng: np.random.Generator, rows: int, n: int, k: int) -> np.ndarray:
    """(rows, n) bool with exactly `k` True per row, the subset uniform at random."""
    mask = np.zeros((rows, n), dtype=bool)
    if k:
        chosen = np.argpartition(rng.random((rows, n)), k - 1, axis=1)[:, :k]
        np.put_along_axis(mask, chosen, True, axis=1)
    return mask


def first_index(codes: np.ndarray) -> np.ndarray:
    """For (N, P) integer codes: the column of the first occurrence of each entry's code in its row."""
    n, p = codes.shape
    order = np.argsort(codes, axis=1, kind="stable")  # stable: a group's first member is its earliest column
    ordered = np.take_along_axis(codes, order, axis=1)
    starts = np.ones((n, p), dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(p), 0), axis=1)
    first = np.empty_like(order)
    np.put_along_axis(first, order, np.take_along_axis(order, group_start, axis=1), axis=1)
    return first


def row_chunks(num: int, row_cost: int, budget: int = 1 << 22) -> list[slice]:
    """Row slices whose intermediates stay near `budget` elements (bounds peak memory at long lengths)."""
    step = max(1, budget // max(1, row_cost))
    return [slice(i, min(num, i + step)) for i in range(0, num, step)]
