"""Majority (Hyena paper App. A.1, "majority voting").

seq_len - 1 uniform random tokens, then a query token; the answer is the token
that occurs most often. Sequences whose top count is shared by two tokens are
redrawn, so the answer is always unique. The head is "classify": targets are
(N,) class ids (= token ids of the answer, num_classes = vocab_size), to be
read from the output at the last position (the query token).

Hyena names the task but gives no further definition; it sweeps lengths 1024 ..
131072 and vocabularies 10 .. 40 with 2000 training samples, as for
associative recall. Uniform tokens make the margin of the winner small
(about sqrt(seq_len / vocab_size)), so the model has to count densely.

Layout: tokens [0, V), query V, with V = vocab_size.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.associative_recall import HYENA_SEQ_LENS, HYENA_VOCAB_SIZES
from madsl.tasks.base import Split
from madsl.tasks.sampling import Rows, SampledTask
from madsl.tasks.vocab import Vocab

MAX_TIE_REDRAWS = 1_000


def token_counts(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """(N, L) tokens in [0, vocab_size) -> (N, vocab_size) occurrence counts, one bincount for all rows."""
    offsets = np.arange(len(tokens))[:, None] * vocab_size
    return np.bincount((tokens + offsets).ravel(), minlength=len(tokens) * vocab_size).reshape(-1, vocab_size)


class Majority(SampledTask):
    name = "majority"
    head = "classify"
    source = "Hyena paper App. A.1"
    baseline = {"vocab_size": 10, "seq_len": 1024, "num_train_examples": 2_000, "num_test_examples": 200}
    sweep = {"seq_len": HYENA_SEQ_LENS, "vocab_size": HYENA_VOCAB_SIZES}

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        return Vocab.of(tokens=s["vocab_size"], query=1)

    def num_classes(self, s: Mapping[str, Any]) -> int:
        return s["vocab_size"]

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "vocab_size", 1)
        self.require_int(s, "seq_len", 2)

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        # halved: a generous allowance for redrawing tied sequences (which makes the rest likelier)
        return (s["seq_len"] - 1) * math.log2(s["vocab_size"]) / 2

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        body = rng.integers(0, s["vocab_size"], (num, s["seq_len"] - 1))
        for _ in range(MAX_TIE_REDRAWS):
            counts = token_counts(body, s["vocab_size"])
            tied = (counts == counts.max(axis=1, keepdims=True)).sum(axis=1) > 1
            if not tied.any():
                break
            body[tied] = rng.integers(0, s["vocab_size"], (int(tied.sum()), body.shape[1]))
        else:
            raise ValueError(
                f"task {self.name!r}: seq_len={s['seq_len']} and vocab_size={s['vocab_size']} "
                f"rarely give a unique majority; use a longer sequence"
            )
        inputs = np.empty((num, s["seq_len"]), dtype=np.int64)
        inputs[:, :-1] = body
        inputs[:, -1] = self.vocab(s).token("query")
        return Rows(inputs, counts.argmax(axis=1))


TASKS = (Majority(),)
