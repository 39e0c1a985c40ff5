"""Compression (MAD paper §3.1.5, App. B.1.5).

The model reads seq_len - 1 uniform random tokens followed by one compression
token (seq_len tokens in all) and must pack the whole sequence into its output
at that last position: a decoder (a two-layer MLP fed that output plus a fixed
sin-cos embedding of position i) has to recover the i-th token, for every i.
The head is "compression"; targets are the (N, seq_len - 1) tokens to recover
(the compression token itself is not asked back). Train and test score the same.

Layout: tokens [0, V), compression token V, with V = vocab_size.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import Split
from madsl.tasks.sampling import Rows, SampledTask
from madsl.tasks.vocab import Vocab


class Compression(SampledTask):
    name = "compression"
    head = "compression"
    source = "MAD paper §3.1.5, App. B.1.5, B.2"
    baseline = {"vocab_size": 16, "seq_len": 32, "num_train_examples": 12_800, "num_test_examples": 1_280}
    sweep = {
        "seq_len": (32, 64, 128, 256),
        "vocab_size": (16, 32, 64, 128),
        "num_train_examples": (12_800, 6_400, 3_200, 1_600, 800),
    }

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        return Vocab.of(tokens=s["vocab_size"], compress=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "vocab_size", 1)
        self.require_int(s, "seq_len", 2)

    def describe(self, s: Mapping[str, Any]) -> dict[str, Any]:
        return {"compression_position": s["seq_len"] - 1}  # where the decoder reads the model's output

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        return (s["seq_len"] - 1) * math.log2(s["vocab_size"])

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        tokens = rng.integers(0, s["vocab_size"], (num, s["seq_len"] - 1))
        inputs = np.empty((num, s["seq_len"]), dtype=np.int64)
        inputs[:, :-1] = tokens
        inputs[:, -1] = self.vocab(s).token("compress")
        return Rows(inputs, tokens)


TASKS = (Compression(),)
