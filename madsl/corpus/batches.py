"""Batches from a token split, deterministic and vectorised.

train_batch draws random windows whose starts come from a generator seeded by (seed, step)
alone: a run resumed at step s sees the batches an uninterrupted one saw, whatever ran before.
val_windows cuts the validation split into fixed, contiguous, non-overlapping windows from its
start (the same every call), so every evaluation scores the same tokens. Only the windows' tokens
are read from a memmap; the split is never loaded whole. unigram_entropy is the loss of the best
model that ignores context: a model that learned anything from context scores below it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from madsl.errors import Location, MadslError

ENTROPY_CHUNK = 1 << 24  # tokens counted per step of unigram_entropy (bounds its memory)


class ValWindows(NamedTuple):
    """Evaluation windows: inputs x and targets y (int64, (N, L); y is x shifted by one token)
    and how many tokens they score (N x L)."""

    x: np.ndarray
    y: np.ndarray
    tokens_scored: int


def _where(tokens: np.ndarray) -> Location:
    return Location(file=str(tokens.filename)) if getattr(tokens, "filename", None) else Location()


def _name(tokens: np.ndarray) -> str:
    return f"{tokens.filename}: " if getattr(tokens, "filename", None) else ""


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise MadslError(f"{name} {value!r}: not a positive integer")


def train_batch(
    tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int
) -> tuple[np.ndarray, np.ndarray]:
    """`batch_size` random windows of `seq_len` tokens from the 1-D array `tokens`: inputs x and
    targets y (int64, (batch_size, seq_len)), y = x shifted by one. Their starts depend on
    (seed, step) only."""
    _check_sizes(batch_size=batch_size, seq_len=seq_len)
    for name, value in (("seed", seed), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise MadslError(f"{name} {value!r}: not a non-negative integer")
    if len(tokens) < seq_len + 1:
        raise MadslError(
            f"{_name(tokens)}{len(tokens):,} tokens, fewer than the {seq_len + 1:,} one window of {seq_len:,} needs",
            _where(tokens),
            hint="use a shorter sequence length, or more text",
        )
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(step)]))
    starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)  # start + seq_len is the last target
    windows = np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)]).astype(np.int64)
    return windows[:, :-1], windows[:, 1:]


def val_windows(tokens: np.ndarray, seq_len: int, max_tokens: int | None) -> ValWindows:
    """The first windows of `seq_len` tokens of `tokens`, back to back (window k scores the
    tokens k*L+1 .. k*L+L), as many as fit in the split and in `max_tokens` scored tokens
    (None: the whole split, read into memory as int64: bound it for a large split)."""
    _check_sizes(seq_len=seq_len, **({} if max_tokens is None else {"max_tokens": max_tokens}))
    count = (len(tokens) - 1) // seq_len
    if max_tokens is not None:
        count = min(count, max_tokens // seq_len)
    if count < 1:
        short = max_tokens is not None and max_tokens < seq_len
        raise MadslError(
            f"max_tokens {max_tokens:,} is fewer than one window of {seq_len:,}"
            if short
            else f"{_name(tokens)}{len(tokens):,} tokens, fewer than the {seq_len + 1:,} one window of "
            f"{seq_len:,} needs",
            None if short else _where(tokens),
        )
    span = np.asarray(tokens[: count * seq_len + 1]).astype(np.int64)
    return ValWindows(span[:-1].reshape(count, seq_len), span[1:].reshape(count, seq_len), count * seq_len)


def unigram_entropy(tokens: np.ndarray) -> float:
    """The entropy of the tokens' frequencies in `tokens`, in nats per token (counted in chunks)."""
    if len(tokens) == 0:
        raise MadslError(f"{_name(tokens)}no tokens", _where(tokens))
    counts = np.zeros(0, dtype=np.int64)
    for start in range(0, len(tokens), ENTROPY_CHUNK):
        chunk = np.bincount(np.asarray(tokens[start : start + ENTROPY_CHUNK]))
        if len(chunk) > len(counts):
            counts = np.concatenate([counts, np.zeros(len(chunk) - len(counts), dtype=np.int64)])
        counts[: len(chunk)] += chunk
    p = counts[counts > 0] / len(tokens)
    return float(max(0.0, -(p * np.log(p)).sum()))  # (one distinct token: 0.0, not -0.0)
