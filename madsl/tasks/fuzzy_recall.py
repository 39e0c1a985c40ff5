"""Fuzzy in-context recall (MAD paper §3.1.2, App. B.1.2).

In-context recall where a key is a run of 1..max_key_len adjacent key tokens
and a value a run of 1..max_value_len value tokens (lengths uniform; tokens
within one key or value distinct, i.e. a uniform random permutation prefix as
in the reference implementation). Keys and values come from disjoint token
sets, so the runs delimit themselves. Within a sequence a key always maps to
the same value; keys of different lengths are different keys.

Like the reference implementation, every sequence ends with a repeat of one
of its earlier pairs (the probe), so each test sequence has at least one
scored value, and sequences are left-padded with the pad token to exactly
seq_len. The test split uses keys of maximal length only (the paper's way to
disambiguate a key token that is part of keys of different values).

Training is next-token prediction over every position; the test split scores
the tokens of values whose key occurred earlier in the sequence.

Layout: keys [0, V/2), values [V/2, V), pad V, with V = vocab_size.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import IGNORE, Split
from madsl.tasks.draws import distinct_tokens, first_index, row_chunks
from madsl.tasks.recall import SEQ_LENS, TRAIN_SIZES, VOCAB_SIZES
from madsl.tasks.sampling import Rows, SampledTask
from madsl.tasks.vocab import Vocab


class FuzzyInContextRecall(SampledTask):
    name = "fuzzy-in-context-recall"
    source = "MAD paper §3.1.2, App. B.1.2, B.2"
    baseline = {
        "vocab_size": 16,
        "seq_len": 128,
        "max_key_len": 3,
        "max_value_len": 3,
        "num_train_examples": 12_800,
        "num_test_examples": 1_280,
    }
    sweep = {"seq_len": SEQ_LENS, "num_train_examples": TRAIN_SIZES, "vocab_size": VOCAB_SIZES}

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        half = s["vocab_size"] // 2
        return Vocab.of(keys=half, values=half, pad=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        v = self.require_int(s, "vocab_size", 2)
        self.require(v % 2 == 0, f"vocab_size must be even (split equally into keys and values), got {v}")
        a = self.require_int(s, "max_key_len", 1)
        b = self.require_int(s, "max_value_len", 1)
        self.require(
            v // 2 >= max(a, b),
            f"vocab_size={v} gives {v // 2} key and value tokens, too few for "
            f"keys/values of {max(a, b)} distinct tokens",
        )
        self.require((v // 2 + 1) ** a < 2**62, f"max_key_len={a} is too long to encode keys as integers")
        seq_len = self.require_int(s, "seq_len", 1)
        self.require(
            seq_len + 1 >= 2 * (a + b),
            f"seq_len must be >= {2 * (a + b) - 1} to fit a pair and its repeat of up to {a + b} "
            f"tokens each, got {seq_len}",
        )

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        # a test row holds at least this many whole pairs before the probe, each key a uniform
        # ordered choice of max_key_len distinct key tokens
        a, num_keys = s["max_key_len"], s["vocab_size"] // 2
        pair = a + s["max_value_len"]
        pairs = (s["seq_len"] + 1 - pair) // pair
        return pairs * sum(math.log2(num_keys - i) for i in range(a))

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        stream = s["seq_len"] + 1
        min_key_len = s["max_key_len"] if split == "test" else 1
        max_pairs = stream // (min_key_len + 1) + 1  # enough pairs to overfill the stream
        row_cost = (max_pairs + 1) * (s["max_key_len"] + s["max_value_len"])
        tokens = np.empty((num, stream), dtype=np.int64)
        scored = np.empty((num, stream), dtype=bool)
        for chunk in row_chunks(num, row_cost):
            tokens[chunk], scored[chunk] = self._streams(s, chunk.stop - chunk.start, min_key_len, max_pairs, rng)
        inputs, targets = tokens[:, :-1], tokens[:, 1:].copy()
        if split == "test":
            targets[~scored[:, 1:]] = IGNORE
        return Rows(np.ascontiguousarray(inputs), targets)

    def _streams(
        self, s: Mapping[str, Any], num: int, min_key_len: int, max_pairs: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """`num` token streams of seq_len + 1 tokens, and where the scored value tokens are."""
        vocab = self.vocab(s)
        a, b = s["max_key_len"], s["max_value_len"]
        num_keys, stream = s["vocab_size"] // 2, s["seq_len"] + 1
        rows, pair_ids = np.arange(num), np.arange(max_pairs)

        # candidate pairs: lengths, distinct tokens, and each key's identity as one integer
        key_len = rng.integers(min_key_len, a + 1, (num, max_pairs), dtype=np.int32)
        value_len = rng.integers(1, b + 1, (num, max_pairs), dtype=np.int32)
        key_tokens = distinct_tokens(rng, num_keys, (num, max_pairs), a, np.int32)
        value_tokens = distinct_tokens(rng, num_keys, (num, max_pairs), b, np.int32) + np.int32(vocab.start("values"))
        codes = np.zeros((num, max_pairs), dtype=np.int64)
        for i in range(a):  # base num_keys + 1, digit num_keys = "no token": lengths differ -> codes differ
            codes = codes * (num_keys + 1) + np.where(i < key_len, key_tokens[..., i], num_keys)

        # a repeated key takes the value of its first occurrence
        first = first_index(codes)
        repeated = first < pair_ids
        value_len = np.take_along_axis(value_len, first, axis=1)
        value_tokens = np.take_along_axis(value_tokens, first[..., None], axis=1)

        # how many pairs fit: the probe repeats pair p, drawn among pairs that fit even with a longest probe
        ends = np.cumsum(key_len + value_len, axis=1)
        surely_fit = (ends <= stream - (a + b)).sum(axis=1)
        probe = (rng.random(num) * surely_fit).astype(np.int64)
        probe_len = key_len[rows, probe] + value_len[rows, probe]
        kept = (ends <= (stream - probe_len)[:, None]).sum(axis=1)
        pad = stream - ends[rows, kept - 1] - probe_len

        # every (pair, token slot) of a row in order -- kept pairs, then the probe -- with a flag
        # bit on scored slots (values of repeated keys; the probe is a repeat) so one compaction moves both
        flag = 1 << int(vocab.size).bit_length()
        slots = np.empty((num, max_pairs + 1, a + b), dtype=np.int32)
        slots[:, :-1, :a] = key_tokens
        slots[:, :-1, a:] = value_tokens + np.int32(flag) * repeated[..., None]
        slots[:, -1] = slots[rows, probe]
        slots[:, -1, a:] |= flag
        used = np.empty(slots.shape, dtype=bool)
        used[:, :-1, :a] = np.arange(a) < key_len[..., None]
        used[:, :-1, a:] = np.arange(b) < value_len[..., None]
        used[:, -1] = used[rows, probe]
        used[:, :-1] &= (pair_ids < kept[:, None])[..., None]

        # used slots, in row-major order, fill each row after its pad: both masks hold stream - pad per row
        flagged = np.full((num, stream), vocab.token("pad"), dtype=np.int32)
        flagged[np.arange(stream) >= pad[:, None]] = slots[used]
        return flagged & (flag - 1), flagged >= flag


TASKS = (FuzzyInContextRecall(),)
