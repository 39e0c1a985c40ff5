"""Memorization (MAD paper §3.1.6, App. B.1.6).

One fixed key -> value dictionary (a random bijection between the V/2 keys
and the V/2 values) holds the "facts". It is drawn from the run's seed on a
stream of its own, so train and test share it. A sequence is seq_len / 2
pairs "key [insert]" with keys drawn uniformly with replacement; the value
never appears in the input. At each insert token the model must output the
key's value: only those positions are scored, in training and evaluation.
The dictionary is in `meta["facts"]` (facts[k] = value id of key k).

Layout: keys [0, V/2), values [V/2, V), insert V, with V = vocab_size.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import IGNORE, Split
from madsl.tasks.sampling import Rows, SampledTask, shared_rng
from madsl.tasks.vocab import Vocab


class Memorization(SampledTask):
    name = "memorization"
    source = "MAD paper §3.1.6, App. B.1.6, B.2"
    baseline = {"vocab_size": 256, "seq_len": 32, "num_train_examples": 256, "num_test_examples": 1_280}
    sweep = {"vocab_size": (256, 512, 1_024, 2_048, 4_096, 8_192)}

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        half = s["vocab_size"] // 2
        return Vocab.of(keys=half, values=half, insert=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        v = self.require_int(s, "vocab_size", 2)
        self.require(v % 2 == 0, f"vocab_size must be even (split equally into keys and values), got {v}")
        seq_len = self.require_int(s, "seq_len", 2)
        self.require(seq_len % 2 == 0, f"seq_len must be even (pairs of key and insert token), got {seq_len}")

    def shared(self, s: Mapping[str, Any], seed: int) -> dict[str, np.ndarray]:
        vocab = self.vocab(s)
        keys, values = vocab.block("keys").size, vocab.block("values")
        rng = shared_rng(self.name, seed)  # each key its own value: shuffled values, one per key
        return {"facts": values.start + rng.permutation(values.size)[:keys]}

    def ceiling(self, settings: Mapping[str, Any], seed: int) -> float | None:
        """The share of the test split's distinct facts (key -> value) whose key occurs in the
        training split: a fact never shown cannot be recalled, so no model's class-averaged
        accuracy exceeds this (the paper's ~0.89 on memorization is this ceiling, averaged over
        its vocabulary sweep, not a shortfall of the architectures)."""
        s = self.settings(**settings)
        shown = np.unique(self.generate(s, "train", seed).inputs[:, 0::2])
        asked = np.unique(self.generate(s, "test", seed).inputs[:, 0::2])
        return float(np.isin(asked, shown).mean())

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        return s["seq_len"] // 2 * math.log2(self.vocab(s).block("keys").size)

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        keys = rng.integers(0, self.vocab(s).block("keys").size, (num, s["seq_len"] // 2))
        inputs = np.empty((num, s["seq_len"]), dtype=np.int64)
        inputs[:, 0::2] = keys
        inputs[:, 1::2] = self.vocab(s).token("insert")
        targets = np.full((num, s["seq_len"]), IGNORE, dtype=np.int64)
        targets[:, 1::2] = shared["facts"][keys]
        return Rows(inputs, targets)


TASKS = (Memorization(),)
