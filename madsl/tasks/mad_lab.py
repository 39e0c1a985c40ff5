"""The MAD tasks as the reference implementation generates them (`--conventions mad-lab`).

github athms/mad-lab, `mad/data/instances.py` and `configs/tasks/*.yml`, read as its
benchmark runs them (multi-query recall). Each class below keeps its madsl task's
name, settings, sweep and scored positions, and changes only what the reference
does differently (docs/tasks.md, "Conventions", says why both exist):

in-context recall      the stream is seq_len // 2 two-token slots: every slot but the last
                       is a key-value pair or, with probability frac_noise, two noise tokens
                       (one random slot is never noise), so keys sit at even positions; the
                       last slot repeats a key already shown (uniform over the distinct keys
                       shown) with its value. Inputs are the stream without its last token:
                       seq_len - 1 tokens ending with that repeated key.
fuzzy recall           vocab_size counts keys, values and the pad token: (V-1)//2 keys, the
                       rest values, pad V-1; one probe pair is placed at a random point and
                       repeated at the end; a repeated key takes its first value.
selective copying      vocab_size counts the blank and the copy token (V-2 data tokens);
                       blanks go before data tokens only, so the last data token sits right
                       before the copy token, which is followed by num_tokens_to_copy blanks:
                       at those blanks the model outputs the data tokens in order.
compression            vocab_size counts the compression token (V-1 data tokens); the decoder
                       reconstructs every position, the compression token included.
memorization           vocab_size counts the insert token: (V-1)//2 keys, the other values,
                       each key mapped to its own value (one value is never used).
"""

from __future__ import annotations

import math
import random
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import IGNORE, Split
from madsl.tasks.compression import Compression
from madsl.tasks.draws import first_index
from madsl.tasks.fuzzy_recall import FuzzyInContextRecall
from madsl.tasks.memorization import Memorization
from madsl.tasks.recall import InContextRecall, NoisyInContextRecall
from madsl.tasks.sampling import Rows
from madsl.tasks.selective_copying import SelectiveCopying
from madsl.tasks.vocab import Vocab

CONVENTIONS = "mad-lab"


class MadLabRecall:
    """In-context recall (noisy or not) in the reference's slot layout (mixed into the madsl classes)."""

    conventions = CONVENTIONS

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        super().check_knobs(s)  # type: ignore[misc]
        seq_len = s["seq_len"]
        self.require(
            seq_len % 2 == 0 and seq_len >= 4,  # type: ignore[attr-defined]
            f"seq_len must be even and >= 4 (two-token slots, the last one a repeated key), got {seq_len}",
        )

    def noise_share(self, s: Mapping[str, Any]) -> float:
        return float(s.get("frac_noise", 0.0))

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        # every slot but the last: a pair (a uniform key) or, with probability f, two uniform noise tokens
        f, keys = self.noise_share(s), s["vocab_size"] // 2
        noise_vocab = max(1, s.get("noise_vocab_size", 1))
        likeliest_slot = max((1 - f) / keys, f / noise_vocab**2)
        slots = s["seq_len"] // 2 - 1
        return (slots - 1) * -math.log2(likeliest_slot)  # (one slot left out: the never-noise one may be it)

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        vocab = self.vocab(s)  # type: ignore[attr-defined]
        num_keys, slots = s["vocab_size"] // 2, s["seq_len"] // 2 - 1  # the last slot is the probe
        frac = self.noise_share(s)
        rows = np.arange(num)
        noisy = _noise_slots(rng, num, slots, frac)
        keys = rng.integers(0, num_keys, (num, slots))
        while True:  # the probe repeats a key shown in a pair: rows of noise only (the reference fails on
            shown = _shown(keys, noisy, num_keys)  # them; rare but possible) get their noise drawn again
            empty = ~shown.any(axis=1)
            if not empty.any():
                break
            noisy[empty] = _noise_slots(rng, int(empty.sum()), slots, frac)
        mapping = vocab.start("values") + rng.integers(0, num_keys, (num, num_keys))  # this row's key -> value
        noise = vocab.start("noise") + rng.integers(0, max(1, vocab.block("noise").size), (num, slots, 2))
        probe = np.argmax(np.where(shown, rng.random(shown.shape), -1.0), axis=1)  # uniform over shown keys

        stream = np.empty((num, 2 * slots + 2), dtype=np.int64)
        stream[:, 0:-2:2] = np.where(noisy, noise[..., 0], keys)
        stream[:, 1:-2:2] = np.where(noisy, noise[..., 1], mapping[rows[:, None], keys])
        stream[:, -2], stream[:, -1] = probe, mapping[rows, probe]
        # scored (test): values of pairs whose key was shown in an earlier pair, and the probe's value
        codes = np.where(noisy, num_keys + np.arange(slots), keys)  # a noise slot matches nothing
        scored = np.zeros(stream.shape, dtype=bool)
        scored[:, 1:-2:2] = (first_index(codes) < np.arange(slots)) & ~noisy
        scored[:, -1] = True
        inputs, targets = stream[:, :-1], stream[:, 1:].copy()
        if split == "test":
            targets[~scored[:, 1:]] = IGNORE
        return Rows(np.ascontiguousarray(inputs), targets)


def _noise_slots(rng: np.random.Generator, num: int, slots: int, frac: float) -> np.ndarray:
    """(num, slots) bool: which slots hold noise; one random slot of slots + 1 (the probe's included) never does."""
    if frac <= 0:
        return np.zeros((num, slots), dtype=bool)
    never = rng.integers(0, slots + 1, num)
    return (rng.random((num, slots)) < frac) & (np.arange(slots) != never[:, None])


def _shown(keys: np.ndarray, noisy: np.ndarray, num_keys: int) -> np.ndarray:
    """(num, num_keys) bool: the keys each row shows in a key-value pair."""
    num = len(keys)
    codes = np.where(noisy, num_keys, keys) + (num_keys + 1) * np.arange(num)[:, None]
    counts = np.bincount(codes.ravel(), minlength=num * (num_keys + 1)).reshape(num, num_keys + 1)
    return counts[:, :num_keys] > 0


class MadLabInContextRecall(MadLabRecall, InContextRecall):
    def noise_share(self, s: Mapping[str, Any]) -> float:
        return 0.0


class MadLabNoisyInContextRecall(MadLabRecall, NoisyInContextRecall):
    pass


class MadLabFuzzyInContextRecall(FuzzyInContextRecall):
    """The reference's loop, one row at a time (its control flow does not vectorize cleanly)."""

    conventions = CONVENTIONS

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        tokens = s["vocab_size"] - 1  # the pad token is inside vocab_size
        return Vocab.of(keys=tokens // 2, values=tokens - tokens // 2, pad=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        v = self.require_int(s, "vocab_size", 3)
        a = self.require_int(s, "max_key_len", 1)
        b = self.require_int(s, "max_value_len", 1)
        vocab = self.vocab(s)
        self.require(
            vocab.block("keys").size >= a and vocab.block("values").size >= b,
            f"vocab_size={v} gives {vocab.block('keys').size} key and {vocab.block('values').size} value "
            f"tokens (the pad token counts), too few for keys of {a} and values of {b} distinct tokens",
        )
        seq_len = self.require_int(s, "seq_len", 1)
        self.require(
            seq_len > 2 * (a + b),
            f"seq_len must be > {2 * (a + b)} (room for the probe pair before and at the end), got {seq_len}",
        )

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        # test rows: at least this many pairs besides the probe, each key an ordered draw of max_key_len tokens
        a, pair = s["max_key_len"], s["max_key_len"] + s["max_value_len"]
        keys = self.vocab(s).block("keys").size
        pairs = max(0, (s["seq_len"] - 2 * pair) // pair - 1)
        return pairs * sum(math.log2(keys - i) for i in range(a))

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        vocab = self.vocab(s)
        stream = s["seq_len"] + 1
        tokens = np.full((num, stream), vocab.token("pad"), dtype=np.int64)
        scored = np.zeros((num, stream), dtype=bool)
        draw = random.Random(int(rng.integers(0, 2**63)))  # seeded from the split's stream: deterministic
        for row in range(num):
            row_tokens, row_scored = self._row(s, split, vocab, draw)
            tokens[row, stream - len(row_tokens) :] = row_tokens  # left-padded, as the reference pads
            scored[row, stream - len(row_tokens) :] = row_scored
        inputs, targets = tokens[:, :-1], tokens[:, 1:].copy()
        if split == "test":
            targets[~scored[:, 1:]] = IGNORE
        return Rows(np.ascontiguousarray(inputs), targets)

    def _row(self, s: Mapping[str, Any], split: Split, vocab: Vocab, draw: random.Random) -> tuple[list, list]:
        a, b, seq_len = s["max_key_len"], s["max_value_len"], s["seq_len"]
        keys, values = vocab.block("keys"), vocab.block("values")
        key_lens = range(1, a + 1) if split == "train" else range(a, a + 1)  # the test prompts full-length keys

        def key(size: int) -> tuple:
            return tuple(draw.sample(range(keys.start, keys.stop), size))

        def value(size: int) -> tuple:
            return tuple(draw.sample(range(values.start, values.stop), size))

        k_probe, v_probe = key(draw.choice(key_lens)), value(draw.randint(1, b))
        probe_len = len(k_probe) + len(v_probe)
        probe_at = draw.randrange(seq_len - 2 * probe_len)  # the probe pair goes in once the row is this long
        probe_placed = False
        kv: dict[tuple, tuple] = {}  # key -> its value (the first one drawn for it)
        shown: set[tuple] = set()
        tokens: list[int] = []
        scored: list[bool] = []
        while len(tokens) < seq_len - probe_len - (a + b):
            k_size, v_size = draw.choice(key_lens), draw.randint(1, b)
            if len(tokens) >= probe_at and not probe_placed:
                tokens += [*k_probe, *v_probe]
                scored += [False] * probe_len
                kv[k_probe], probe_placed = v_probe, True
                shown.add(k_probe)
                continue
            k = key(k_size)
            if k == k_probe:
                v, probe_placed = v_probe, True
            else:
                v = kv.setdefault(k, value(v_size))
            tokens += [*k, *v]
            scored += [False] * len(k) + [k in shown] * len(v)  # a value is asked for once its key was shown
            shown.add(k)
        tokens += [*k_probe, *v_probe]  # the probe again, at the end: its value is always scored
        scored += [False] * len(k_probe) + [True] * len(v_probe)
        return tokens, scored


class MadLabSelectiveCopying(SelectiveCopying):
    conventions = CONVENTIONS

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        return Vocab.of(data=s["vocab_size"] - 2, blank=1, copy=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "vocab_size", 3)
        seq_len = self.require_int(s, "seq_len", 4)
        copies = self.require_int(s, "num_tokens_to_copy", 1)
        self.require(
            seq_len > 2 * copies + 1,
            f"num_tokens_to_copy={copies} does not fit in seq_len={seq_len}: the data tokens, the copy "
            f"token and as many blanks after it need more than 2 * {copies} + 1 = {2 * copies + 1}",
        )

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        return s["num_tokens_to_copy"] * math.log2(s["vocab_size"] - 2)

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        vocab = self.vocab(s)
        seq_len, copies = s["seq_len"], s["num_tokens_to_copy"]
        blanks = seq_len - 2 * copies - 1  # blanks among the data tokens
        data = rng.integers(0, vocab.block("data").size, (num, copies))
        # each blank goes in front of a uniformly chosen data token (never after the last one)
        in_front = rng.multinomial(blanks, np.full(copies, 1.0 / copies), size=num)
        at = np.cumsum(in_front, axis=1) + np.arange(copies)
        inputs = np.full((num, seq_len), vocab.token("blank"), dtype=np.int64)
        np.put_along_axis(inputs, at, data, axis=1)
        inputs[:, seq_len - copies - 1] = vocab.token("copy")
        targets = np.full((num, seq_len), IGNORE, dtype=np.int64)
        targets[:, seq_len - copies :] = data  # at the blanks after the copy token, in order
        return Rows(inputs, targets)


class MadLabCompression(Compression):
    conventions = CONVENTIONS

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        return Vocab.of(tokens=s["vocab_size"] - 1, compress=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "vocab_size", 2)
        self.require_int(s, "seq_len", 2)

    def min_entropy_bits(self, s: Mapping[str, Any]) -> float:
        return (s["seq_len"] - 1) * math.log2(s["vocab_size"] - 1)

    def sample(
        self, s: Mapping[str, Any], split: Split, num: int, rng: np.random.Generator, shared: Mapping[str, np.ndarray]
    ) -> Rows:
        inputs = np.empty((num, s["seq_len"]), dtype=np.int64)
        inputs[:, :-1] = rng.integers(0, s["vocab_size"] - 1, (num, s["seq_len"] - 1))
        inputs[:, -1] = self.vocab(s).token("compress")
        return Rows(inputs, inputs.copy())  # every position is reconstructed, the compression token too


class MadLabMemorization(Memorization):
    conventions = CONVENTIONS

    def vocab(self, s: Mapping[str, Any]) -> Vocab:
        tokens = s["vocab_size"] - 1  # the insert token is inside vocab_size
        return Vocab.of(keys=tokens // 2, values=tokens - tokens // 2, insert=1)

    def check_knobs(self, s: Mapping[str, Any]) -> None:
        self.require_int(s, "vocab_size", 3)
        seq_len = self.require_int(s, "seq_len", 2)
        self.require(seq_len % 2 == 0, f"seq_len must be even (pairs of key and insert token), got {seq_len}")


VARIANTS = (
    MadLabInContextRecall(),
    MadLabNoisyInContextRecall(),
    MadLabFuzzyInContextRecall(),
    MadLabSelectiveCopying(),
    MadLabCompression(),
    MadLabMemorization(),
)
