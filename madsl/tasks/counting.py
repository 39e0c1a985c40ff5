"""Counting (Hyena paper App. A.1, "counting").

seq_len - 2 uniform random tokens, then a query marker and a query token
(uniform over the vocabulary); the answer is how often the query token occurs
before the marker, 0 .. seq_len - 2. The head is "classify": targets are (N,)
counts, num_classes = seq_len - 1, read from the output at the last position.

Hyena names the task but gives no further definition; it sweeps lengths 1024 ..
131072 and vocabularies 10 .. 40 with 2000 training samples, as for
associative recall.

Layout: tokens [0, V), query marker V, with V = vocab_size.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.associative_recall import HYENA_SEQ_LENS, HYENA_VOCAB_SIZES
from madsl.tasks.base import Split
from madsl.tasks.sampling import Rows, SampledTask
from madsl.tasks.vocab import Vocab


class Counting(SampledTask):
    name = "counting"
    head = "classify"
    source = "Hyena paper App. A.1"
    baseline = {"vocab_size": 10, "seq_len": 1024, "num_train_examples": 2_000, "num_test_examples": 200}
    sweep = {"seq_len": HYENA_SEQ_LENS, "vocab_size": HYENA_VOCAB_SIZES}

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        return Vocab.of(tokens=s["vocab_size"], count=1)

    def num_classes(self, s: Mapping[str, Any]) -> int:
        return s["seq_len"] - 1  # counts 0 .. seq_len - 2

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "vocab_size", 1)
        self.require_int(s, "seq_len", 3)

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        return (s["seq_len"] - 1) * math.log2(s["vocab_size"])

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        inputs = rng.integers(0, s["vocab_size"], (num, s["seq_len"]))
        inputs[:, -2] = self.vocab(s).token("count")
        counts = (inputs[:, :-2] == inputs[:, -1:]).sum(axis=1)
        return Rows(inputs, counts.astype(np.int64))


TASKS = (Counting(),)
