"""In-context learning of linear functions (Hyena paper App. A.1, after Garg et al. 2022).

Every sequence has its own weight vector w ~ N(0, I) in R^input_dim. Its
tokens alternate x_1, y_1, x_2, y_2, ... with x_i ~ N(0, I) and y_i = w . x_i;
a y token is written as the vector (y_i, 0, ..., 0) (Garg et al.'s format), so
inputs are (N, seq_len, input_dim) float32. At each x position the model must
regress the y that follows: head "regress", targets (N, seq_len) float32 with
NaN elsewhere. Training scores every x position; the test split only the last
one (with an odd seq_len the sequence ends on that query, "x_n -> w . x_n").
y has variance input_dim (unnormalized, as sampled in the paper); a runner
may divide squared errors by input_dim. The weights are in meta["weights"].
vocab_size() is 1, a placeholder: there are no tokens to embed.

Hyena varies only the dimension (values not given): input_dim 4 .. 32 here,
with 64 examples before the query, so w is determined even at 32 dimensions.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import Split
from madsl.tasks.sampling import Rows, SampledTask


class ICLLinear(SampledTask):
    name = "icl-linear"
    head = "regress"
    source = "Hyena paper App. A.1; Garg et al. 2022"
    baseline = {"input_dim": 4, "seq_len": 129, "num_train_examples": 2_000, "num_test_examples": 200}
    sweep = {"input_dim": (4, 8, 16, 32)}

    def vocab_size(self, s: Mapping[str, Any]) -> int:
        return 1  # a placeholder: inputs are vectors, which the regress head projects to the model width

    def num_classes(self, s: Mapping[str, Any]) -> int:
        return 1  # one regressed number per position

    def input_dim(self, s: Mapping[str, Any]) -> int:
        return s["input_dim"]

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "input_dim", 1)
        self.require_int(s, "seq_len", 1)

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        return float("inf")  # continuous: two draws never coincide

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        seq_len, dim = s["seq_len"], s["input_dim"]
        num_x = (seq_len + 1) // 2
        weights = rng.standard_normal((num, dim), dtype=np.float32)
        x = rng.standard_normal((num, num_x, dim), dtype=np.float32)
        y = np.einsum("npd,nd->np", x, weights)

        inputs = np.zeros((num, seq_len, dim), dtype=np.float32)
        inputs[:, 0::2] = x
        inputs[:, 1::2, 0] = y[:, : seq_len // 2]
        targets = np.full((num, seq_len), np.nan, dtype=np.float32)
        if split == "test":
            targets[:, 2 * (num_x - 1)] = y[:, -1]
        else:
            targets[:, 0::2] = y
        return Rows(inputs, targets, {"weights": weights})


TASKS = (ICLLinear(),)
