"""In-context recall and noisy in-context recall (MAD paper §3.1.1, §3.1.3, App. B.1.1, B.1.3).

A sequence is a stream of key-value pairs, keys drawn uniformly with
replacement; each sequence has its own random key -> value map (every key's
value drawn uniformly and independently, as in the reference implementation),
so a value can only be predicted from an earlier pair with the same key. The
noisy variant places single noise tokens from a separate noise vocabulary
between the pairs, at random: exactly round(frac_noise * (seq_len + 1)) of
the stream's tokens are noise.

Training is next-token prediction over every position (targets = inputs
shifted by one). The test split scores only positions whose next token is the
value of a key already seen earlier in the sequence; every other target is
IGNORE.

Layout: keys [0, V/2), values [V/2, V), noise [V, V + noise_vocab_size),
where V = vocab_size counts keys and values as the paper does.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import IGNORE, Split
from madsl.tasks.draws import first_index, random_subset_mask
from madsl.tasks.sampling import Rows, SampledTask
from madsl.tasks.vocab import Vocab

SEQ_LENS = (128, 256, 512, 1024)
TRAIN_SIZES = (12_800, 6_400, 3_200, 1_600, 800)
VOCAB_SIZES = (16, 32, 64, 128)


class InContextRecall(SampledTask):
    name = "in-context-recall"
    source = "MAD paper §3.1.1, App. B.1.1, B.2"
    baseline = {"vocab_size": 16, "seq_len": 128, "num_train_examples": 12_800, "num_test_examples": 1_280}
    sweep = {"seq_len": SEQ_LENS, "num_train_examples": TRAIN_SIZES, "vocab_size": VOCAB_SIZES}

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        half = s["vocab_size"] // 2
        return Vocab.of(keys=half, values=half, noise=s.get("noise_vocab_size", 0))

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        v = self.require_int(s, "vocab_size", 2)
        self.require(v % 2 == 0, f"vocab_size must be even (split equally into keys and values), got {v}")
        self.require_int(s, "seq_len", 2)

    def noise_tokens(self, s: Mapping[str, Any]) -> int:
        """How many of the seq_len + 1 stream tokens are noise."""
        return 0

    def _layout(self, s: Mapping[str, Any]) -> tuple[int, int]:
        """(number of pairs, number of noise tokens) of one stream of seq_len + 1 tokens (or one more)."""
        stream = s["seq_len"] + 1  # one longer than the inputs: targets are the stream shifted by one
        noise = self.noise_tokens(s)
        return math.ceil((stream - noise) / 2), noise

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        # every pair but a possibly truncated last one shows a uniform key
        pairs, _ = self._layout(s)
        return (pairs - 1) * math.log2(s["vocab_size"] // 2)

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        vocab = self.vocab(s)
        num_keys = s["vocab_size"] // 2
        num_pairs, num_noise = self._layout(s)
        items = num_pairs + num_noise
        rows = np.arange(num)[:, None]

        # random order of pair items (2 tokens) and noise items (1 token)
        is_pair = random_subset_mask(rng, num, items, num_pairs) if num_noise else np.ones((num, items), dtype=bool)
        lengths = 1 + is_pair
        starts = np.cumsum(lengths, axis=1) - lengths
        key_pos = starts[is_pair].reshape(num, num_pairs)
        noise_pos = starts[~is_pair].reshape(num, num_noise)

        keys = rng.integers(0, num_keys, (num, num_pairs))
        mapping = rng.integers(0, num_keys, (num, num_keys))  # this sequence's key -> value map
        values = vocab.start("values") + mapping[rows, keys]
        noise_vocab = max(1, vocab.block("noise").size)  # without noise nothing is drawn: shape (num, 0)
        noise = vocab.start("noise") + rng.integers(0, noise_vocab, (num, num_noise))

        stream = np.empty((num, 2 * num_pairs + num_noise), dtype=np.int64)
        stream[rows, key_pos] = keys
        stream[rows, key_pos + 1] = values
        stream[rows, noise_pos] = noise
        scored = np.zeros(stream.shape, dtype=bool)
        scored[rows, key_pos + 1] = first_index(keys) < np.arange(num_pairs)  # key seen in an earlier pair

        stream, scored = stream[:, : s["seq_len"] + 1], scored[:, : s["seq_len"] + 1]
        inputs, targets = stream[:, :-1], stream[:, 1:].copy()
        if split == "test":
            targets[~scored[:, 1:]] = IGNORE
        return Rows(np.ascontiguousarray(inputs), targets)


class NoisyInContextRecall(InContextRecall):
    name = "noisy-in-context-recall"
    source = "MAD paper §3.1.3, App. B.1.3, B.2"
    baseline = {
        "vocab_size": 16,
        "seq_len": 128,
        "noise_vocab_size": 16,
        "frac_noise": 0.2,
        "num_train_examples": 12_800,
        "num_test_examples": 1_280,
    }
    sweep = {**InContextRecall.sweep, "frac_noise": (0.2, 0.4, 0.6, 0.8)}

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        super().check_knobs(s)
        frac = s["frac_noise"]
        self.require(
            isinstance(frac, (int, float)) and 0 <= frac < 1, f"frac_noise must be a share in [0, 1), got {frac!r}"
        )
        noise_vocab = self.require_int(s, "noise_vocab_size", 0)
        self.require(noise_vocab > 0 or frac == 0, "noise_vocab_size must be >= 1 when frac_noise > 0")
        pairs, _ = self._layout(s)
        self.require(pairs >= 1, f"frac_noise={frac} leaves no key-value pair in seq_len={s['seq_len']}")

    def noise_tokens(self, s: Mapping[str, Any]) -> int:
        return round(s["frac_noise"] * (s["seq_len"] + 1))


TASKS = (InContextRecall(), NoisyInContextRecall())
