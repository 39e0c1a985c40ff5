"""Associative recall at long lengths (Hyena paper App. A.1; the H3 synthetic).

(seq_len - 2) / 2 key-value pairs from a per-sequence random dictionary (each
key's value drawn uniformly and independently, as in the H3/Hyena code), then
a separator and one query key taken from the sequence's pairs; the model must
output that key's value. Training is next-token prediction over every
position; the test split scores only the last position (the query).

Hyena sweeps lengths 1024 .. 131072 (written there as 1024, 2048, 4098, 8196,
..., 131136; we use the powers of two) and vocabularies 10, 20, 30, 40; its
headline setting is length 131072 with vocabulary 30 (Table A.2). Its code
counts two special tokens inside the vocabulary; here vocab_size counts keys
and values (as in MAD) and the separator comes on top. Hyena does not state a
test-set size: 200 here (10% of its 2000 training samples, like MAD's 1280/12800).

Layout: keys [0, V/2), values [V/2, V), separator V, with V = vocab_size.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import IGNORE, Split
from madsl.tasks.sampling import Rows, SampledTask
from madsl.tasks.vocab import Vocab

HYENA_SEQ_LENS = tuple(2**k for k in range(10, 18))  # 1024 .. 131072
HYENA_VOCAB_SIZES = (10, 20, 30, 40)


class AssociativeRecall(SampledTask):
    name = "associative-recall"
    source = "Hyena paper App. A.1, Table A.1, A.2"
    baseline = {"vocab_size": 10, "seq_len": 1024, "num_train_examples": 2_000, "num_test_examples": 200}
    sweep = {"seq_len": HYENA_SEQ_LENS, "vocab_size": HYENA_VOCAB_SIZES}

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        half = s["vocab_size"] // 2
        return Vocab.of(keys=half, values=half, separator=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        v = self.require_int(s, "vocab_size", 2)
        self.require(v % 2 == 0, f"vocab_size must be even (split equally into keys and values), got {v}")
        seq_len = self.require_int(s, "seq_len", 4)
        self.require(seq_len % 2 == 0, f"seq_len must be even (pairs, then separator and query), got {seq_len}")

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        return (s["seq_len"] - 2) // 2 * math.log2(s["vocab_size"] // 2)

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        vocab = self.vocab(s)
        num_keys, num_pairs = s["vocab_size"] // 2, (s["seq_len"] - 2) // 2
        rows = np.arange(num)
        keys = rng.integers(0, num_keys, (num, num_pairs))
        mapping = vocab.start("values") + rng.integers(0, num_keys, (num, num_keys))
        query = keys[rows, rng.integers(0, num_pairs, num)]

        stream = np.empty((num, s["seq_len"] + 1), dtype=np.int64)
        stream[:, 0:-3:2] = keys
        stream[:, 1:-3:2] = mapping[rows[:, None], keys]
        stream[:, -3] = vocab.token("separator")
        stream[:, -2] = query
        stream[:, -1] = mapping[rows, query]
        inputs, targets = stream[:, :-1], stream[:, 1:].copy()
        if split == "test":
            targets[:, :-1] = IGNORE
        return Rows(np.ascontiguousarray(inputs), targets)


TASKS = (AssociativeRecall(),)
