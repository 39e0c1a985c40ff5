"""Induction heads (Mamba paper App. E.1, Table 11; the H3/Hyena synthetic it builds on).

A sequence of uniform random tokens contains one trigger token at a random
position; the sequence ends with the trigger again, and the model must output
the token that followed the first trigger. Models are trained at length 256
and evaluated from 2**6 to 2**20 (`eval_seq_lens`): the generator takes any
seq_len, so the runner draws test sets at those lengths.

Training is next-token prediction over every position (as in the H3/Mamba
code: only the answer is predictable, the rest is noise the model must learn
to ignore); the test split scores only the last position.

Mamba draws fresh data every step (batch 8, "epochs" of 8192 steps); madsl
keeps a fixed train set (a runner wanting online data draws a new seed per
epoch). Its validation sets have 256 sequences (Table 11's accuracies are
multiples of 1/256), hence num_test_examples=256.

Layout: tokens [0, V), trigger V, with V = vocab_size.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import IGNORE, Split
from madsl.tasks.draws import row_chunks
from madsl.tasks.sampling import Rows, SampledTask
from madsl.tasks.vocab import Vocab


class InductionHeads(SampledTask):
    name = "induction-heads"
    source = "Mamba paper App. E.1, Table 11"
    baseline = {"vocab_size": 16, "seq_len": 256, "num_train_examples": 12_800, "num_test_examples": 256}
    sweep = {}
    eval_seq_lens = tuple(2**k for k in range(6, 21))

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        return Vocab.of(tokens=s["vocab_size"], trigger=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "vocab_size", 1)
        self.require_int(s, "seq_len", 3)  # trigger, answer, ..., trigger

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        return (s["seq_len"] - 2) * math.log2(s["vocab_size"])

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        seq_len, trigger = s["seq_len"], self.vocab(s).token("trigger")
        inputs = np.empty((num, seq_len), dtype=np.int64)
        targets = np.empty((num, seq_len), dtype=np.int64)
        for chunk in row_chunks(num, seq_len):  # bounds the extra memory at lengths up to 2**20
            n = chunk.stop - chunk.start
            rows = np.arange(n)
            stream = rng.integers(0, s["vocab_size"], (n, seq_len + 1))
            first = rng.integers(0, seq_len - 2, n)  # its answer stays before the final trigger
            stream[rows, first] = trigger
            stream[:, seq_len - 1] = trigger
            stream[:, seq_len] = stream[rows, first + 1]
            inputs[chunk] = stream[:, :-1]
            targets[chunk] = stream[:, 1:]
        if split == "test":
            targets[:, :-1] = IGNORE
        return Rows(inputs, targets)


TASKS = (InductionHeads(),)
