"""Multi-query associative recall, MQAR (Arora et al. 2023, "Zoology", §4; HazyResearch/zoology
`multiquery_ar`).

A sequence opens with num_kv_pairs key-value pairs (keys distinct, values distinct, both drawn
without replacement), then every key comes back exactly once as a query, and the model must
output the value it was paired with at the next position. The queries sit at even offsets of
the rest of the sequence, in slots drawn without replacement with probability proportional to
power_a * i^(power_a - 1) (slot i = 1, 2, ...): a power law, most queries close after the
pairs, a few far away (the gaps between repeated bigrams in text follow one, the paper notes).
Every other position holds a random token from the whole vocabulary (random_non_queries; zoology's
default) or the blank token 0. Only the positions whose next token is a queried value are scored,
in training as in testing (as zoology's labels).

Layout (zoology's): blank 0, keys [1, V/2), values [V/2, V), V = vocab_size.

Standard settings: zoology's MQAR configs (zoology/experiments/mqar_example_configs/
original_mqar_configs.py): vocabulary 8192, lengths 64 .. 512 with 4 .. 64 pairs, 20000 train
and 1000 test sequences, power_a 0.01. Baseline: length 256 with 16 pairs; the sweep moves the
length (64 .. 512) and the number of pairs (4 .. 64) one at a time, within the rule that the
queries need as many slots as the pairs (4 * num_kv_pairs <= seq_len).

How it differs from MAD's in-context recall: there, keys repeat with replacement in one stream
of pairs, a key's later pairs are the queries, and a small vocabulary (16) is the difficulty; here
the pairs are given once, queried many times, far apart, among noise tokens, over a large
vocabulary (8192), so a model must store num_kv_pairs associations at once (docs/tasks.md).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import IGNORE, Split
from madsl.tasks.draws import distinct_tokens
from madsl.tasks.sampling import Rows, SampledTask
from madsl.tasks.vocab import Vocab

SEQ_LENS = (64, 128, 256, 512)
NUM_KV_PAIRS = (4, 8, 16, 32, 64)


def power_law_slots(rng: np.random.Generator, num: int, space: int, k: int, power_a: float) -> np.ndarray:
    """(num, k) distinct slots of range(space), drawn one after another without replacement with
    P(slot i) proportional to power_a * (i + 1)^(power_a - 1) among those left (what
    numpy's choice(space, k, replace=False, p=p) draws). Vectorized as the top k of
    log p + Gumbel noise, which gives the same ordered draws (the Gumbel-top-k trick)."""
    log_p = (power_a - 1) * np.log(np.arange(1, space + 1, dtype=np.float64))
    scores = log_p + rng.gumbel(size=(num, space))
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < space else np.tile(np.arange(space), (num, 1))
    order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
    return np.take_along_axis(top, order, axis=1)


class MultiQueryAssociativeRecall(SampledTask):
    name = "mqar"
    source = "Arora et al. 2023 (Zoology) §4; HazyResearch/zoology multiquery_ar and its MQAR configs"
    baseline = {
        "vocab_size": 8192,
        "seq_len": 256,
        "num_kv_pairs": 16,
        "power_a": 0.01,
        "random_non_queries": True,
        "num_train_examples": 20_000,
        "num_test_examples": 1_000,
    }
    sweep = {"seq_len": SEQ_LENS, "num_kv_pairs": NUM_KV_PAIRS}

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        half = s["vocab_size"] // 2
        return Vocab.of(blank=1, keys=half - 1, values=s["vocab_size"] - half)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        vocab = self.require_int(s, "vocab_size", 4)
        seq_len = self.require_int(s, "seq_len", 4)
        pairs = self.require_int(s, "num_kv_pairs", 1)
        self.require(seq_len % 2 == 0, f"seq_len must be even (pairs, then query slots), got {seq_len}")
        self.require(
            4 * pairs <= seq_len,
            f"seq_len must be at least 4 x num_kv_pairs (the pairs, then a "
            f"query slot per pair), got seq_len {seq_len} with {pairs} pairs",
        )
        self.require(
            pairs <= vocab // 2 - 1,
            f"num_kv_pairs must be at most vocab_size / 2 - 1 = {vocab // 2 - 1} (keys are distinct), got {pairs}",
        )
        power_a = s["power_a"]
        self.require(
            isinstance(power_a, (int, float)) and not isinstance(power_a, bool) and 0 < power_a <= 1,
            f"power_a must be a number in (0, 1] (1: uniform slots), got {power_a!r}",
        )
        self.require(
            isinstance(s["random_non_queries"], bool),
            f"random_non_queries must be true or false, got {s['random_non_queries']!r}",
        )

    def describe(self, s: Mapping[str, Any]) -> dict[str, Any]:
        return {"query_slots": (s["seq_len"] - 2 * s["num_kv_pairs"]) // 2}

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        """The pairs alone: ordered distinct keys and ordered distinct values."""
        half, pairs = s["vocab_size"] // 2, s["num_kv_pairs"]
        keys = sum(math.log2(half - 1 - i) for i in range(pairs))
        values = sum(math.log2(s["vocab_size"] - half - i) for i in range(pairs))
        return keys + values

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        vocab = self.vocab(s)
        seq_len, pairs = s["seq_len"], s["num_kv_pairs"]
        keys = vocab.start("keys") + distinct_tokens(rng, vocab.block("keys").size, (num,), pairs)
        values = vocab.start("values") + distinct_tokens(rng, vocab.block("values").size, (num,), pairs)
        context = 2 * pairs
        slots = power_law_slots(rng, num, (seq_len - context) // 2, pairs, float(s["power_a"]))

        stream = np.full((num, seq_len + 1), vocab.token("blank"), dtype=np.int64)
        stream[:, 0:context:2], stream[:, 1:context:2] = keys, values
        query_at = context + 2 * slots  # stream positions of the queries
        np.put_along_axis(stream, query_at, keys, axis=1)
        targets = np.full((num, seq_len + 1), IGNORE, dtype=np.int64)
        np.put_along_axis(targets, query_at, values, axis=1)  # the target at a query is its value
        inputs, targets = stream[:, :-1], targets[:, :-1]
        if s["random_non_queries"]:
            blank = inputs == vocab.token("blank")
            inputs[blank] = rng.integers(0, s["vocab_size"], int(blank.sum()))
        return Rows(np.ascontiguousarray(inputs), np.ascontiguousarray(targets))


TASKS = (MultiQueryAssociativeRecall(),)
