"""Selective copying (MAD paper §3.1.4, App. B.1.4) and its long Mamba variant (Mamba paper App. E.1).

The first seq_len - num_tokens_to_copy positions hold num_tokens_to_copy data
tokens (uniform, with replacement) at random positions, every other position
a blank; the last num_tokens_to_copy positions are insert tokens. At the i-th
insert token the model must output the i-th data token: only those positions
are scored, in training and in evaluation alike. Where the data tokens sit
changes from sequence to sequence, so the model has to remember them, in
order, while skipping the blanks.

Layout: data [0, V), blank V, insert V + 1, with V = vocab_size (the data
tokens the paper counts; the Mamba variant's 14 + blank + insert makes the 16
tokens that paper counts).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import IGNORE, Split
from madsl.tasks.draws import random_subset_mask, row_chunks
from madsl.tasks.sampling import Rows, SampledTask, log2_binomial
from madsl.tasks.vocab import Vocab


class SelectiveCopying(SampledTask):
    name = "selective-copying"
    source = "MAD paper §3.1.4, App. B.1.4, B.2"
    baseline = {
        "vocab_size": 16,
        "seq_len": 256,
        "num_tokens_to_copy": 16,
        "num_train_examples": 12_800,
        "num_test_examples": 1_280,
    }
    sweep = {
        "seq_len": (256, 512, 1024),
        "num_train_examples": (12_800, 6_400, 3_200, 1_600, 800),
        "vocab_size": (16, 32, 64, 128),
        "num_tokens_to_copy": (16, 32, 64, 96),
    }

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        return Vocab.of(data=s["vocab_size"], blank=1, insert=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "vocab_size", 1)
        seq_len = self.require_int(s, "seq_len", 2)
        copies = self.require_int(s, "num_tokens_to_copy", 1)
        self.require(
            2 * copies <= seq_len,
            f"num_tokens_to_copy={copies} does not fit in seq_len={seq_len}: the data tokens and "
            f"as many insert tokens need 2 * {copies} = {2 * copies} positions",
        )

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        copies = s["num_tokens_to_copy"]
        return copies * math.log2(s["vocab_size"]) + log2_binomial(s["seq_len"] - copies, copies)

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        vocab = self.vocab(s)
        seq_len, copies = s["seq_len"], s["num_tokens_to_copy"]
        region = seq_len - copies  # where data tokens and blanks go
        inputs = np.full((num, seq_len), vocab.token("blank"), dtype=np.int64)
        inputs[:, region:] = vocab.token("insert")
        targets = np.full((num, seq_len), IGNORE, dtype=np.int64)
        for chunk in row_chunks(num, region):  # bounds the (rows, region) random draw at length 4096
            n = chunk.stop - chunk.start
            data = rng.integers(0, s["vocab_size"], (n, copies))
            at_data = random_subset_mask(rng, n, region, copies)
            inputs[chunk, :region][at_data] = data.ravel()  # row-major: each row's tokens in order
            targets[chunk, region:] = data
        return Rows(inputs, targets)


class SelectiveCopyingLong(SelectiveCopying):
    """The Mamba paper's setting: length 4096, 16 tokens in all (with blank and insert), 16 to copy.

    Mamba draws fresh data at every step (400K steps of batch 64); madsl keeps
    a fixed train set, so a runner that wants online data draws a new seed per epoch.
    """

    name = "selective-copying-long"
    source = "Mamba paper App. E.1 (Selective Copying)"
    baseline = {
        "vocab_size": 14,
        "seq_len": 4096,
        "num_tokens_to_copy": 16,
        "num_train_examples": 2_048,
        "num_test_examples": 256,
    }
    sweep = {}


TASKS = (SelectiveCopying(), SelectiveCopyingLong())
