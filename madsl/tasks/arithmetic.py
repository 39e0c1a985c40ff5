"""Multi-digit addition (Hyena paper App. A.1, "arithmetic: basic capability check").

"a + b = c" with a and b uniform num_digits-digit numbers (leading zeros kept,
so the layout is fixed) and c = a + b written with num_digits + 1 digits, all
most significant digit first. Inputs are the 3 * num_digits + 2 tokens up to
the one before the last digit of c; at the '=' and at each digit of c the
model must output the next digit of c. Only those positions are scored, in
training and evaluation. Digits are summed column by column, so any
num_digits works (no int64 overflow).

Hyena gives no definition beyond the name; num_digits 2 .. 16 and 2000
training samples (its Table A.1) are our choice. At 2 digits there are only
10**4 problems, so the test set is actually checked against the train set.

Layout: digits 0..9 (token id = digit), '+' 10, '=' 11.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import IGNORE, Split
from madsl.tasks.sampling import Rows, SampledTask
from madsl.tasks.vocab import Vocab


class Arithmetic(SampledTask):
    name = "arithmetic"
    source = "Hyena paper App. A.1"
    baseline = {"num_digits": 2, "num_train_examples": 2_000, "num_test_examples": 200}
    sweep = {"num_digits": (2, 4, 8, 16)}

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        return Vocab.of(digits=10, plus=1, equals=1, symbols={"digits": "", "plus": "+", "equals": "="})

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "num_digits", 1)

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        return 2 * s["num_digits"] * math.log2(10)

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        vocab, d = self.vocab(s), s["num_digits"]
        a = rng.integers(0, 10, (num, d))
        b = rng.integers(0, 10, (num, d))
        total = np.empty((num, d + 1), dtype=np.int64)
        carry = np.zeros(num, dtype=np.int64)
        for i in range(d - 1, -1, -1):  # least significant column first
            carry, total[:, i + 1] = np.divmod(a[:, i] + b[:, i] + carry, 10)
        total[:, 0] = carry

        stream = np.concatenate(
            [a, np.full((num, 1), vocab.token("plus")), b, np.full((num, 1), vocab.token("equals")), total], axis=1
        )
        inputs, targets = stream[:, :-1], stream[:, 1:].copy()
        targets[:, : 2 * d + 1] = IGNORE  # only the digits of the sum are scored
        return Rows(np.ascontiguousarray(inputs), targets)


TASKS = (Arithmetic(),)
