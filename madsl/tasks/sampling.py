"""Seeded splits: independent random streams per split, and test sets disjoint from train.

`SampledTask` implements `Task.generate` once for all tasks. A task only says
how to draw `num` i.i.d. rows (`sample`), which settings are valid (`check`),
and a lower bound on how random one row is (`min_entropy_bits`). From that:

- each split draws from its own stream, `default_rng([seed, split id, task id, attempt])`,
  so train and test are independent and a task's data never depends on which
  other tasks exist;
- test rows whose inputs also occur in the train set are redrawn (vectorized,
  by row hash) until none is left. The check is skipped only where an overlap
  is provably negligible: P(any overlap) <= N_train * N_test * 2**-min_entropy
  < 2**-40. That keeps e.g. induction heads at length 2**20 from having to
  build a train set of that length just to compare against it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import Split, Task, TaskData
from madsl.tasks.vocab import Vocab

SPLIT_STREAMS = {"train": 0, "test": 1}
SHARED_STREAM = 2  # state shared by both splits (the memorization "facts")
NEGLIGIBLE_OVERLAP_LOG2 = -40.0  # skip the overlap check below this union bound
MAX_RESAMPLE_ROUNDS = 100


def task_id(name: str) -> int:
    """A stable 64-bit id of a task name (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def split_rng(task_name: str, seed: int, split: Split, attempt: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, SPLIT_STREAMS[split], task_id(task_name), attempt])


def shared_rng(task_name: str, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, SHARED_STREAM, task_id(task_name)])


def row_hashes(rows: np.ndarray) -> np.ndarray:
    """A uint64 hash per row of any numeric array (N, ...): equal rows hash equal.

    A random linear form over the rows' raw bits, mod 2**64. Collisions of
    distinct rows are astronomically rare, and harmless: they only cause a redraw.
    """
    flat = np.ascontiguousarray(rows).reshape(len(rows), -1)
    bits = flat.view(f"u{flat.dtype.itemsize}").astype(np.uint64)
    weights = np.random.default_rng(0x5EED).integers(1, 2**63, flat.shape[1], dtype=np.uint64) * np.uint64(
        2
    ) + np.uint64(1)
    return (bits * weights).sum(axis=1, dtype=np.uint64)


def log2_binomial(n: int, k: int) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


@dataclass
class Rows:
    """What `SampledTask.sample` returns: `num` rows plus per-row extras (e.g. icl weights)."""

    inputs: np.ndarray
    targets: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    def replace(self, where: np.ndarray, new: "Rows") -> None:
        self.inputs[where] = new.inputs
        self.targets[where] = new.targets
        for key, values in self.extras.items():
            values[where] = new.extras[key]


class SampledTask(Task):
    """A task whose rows are i.i.d. draws.

    Subclasses implement `vocab`, `check_knobs`, `sample` and `min_entropy_bits`
    (and `shared` / `describe` where they have shared state or extra facts).
    """

    def vocab(self, settings: Mapping[str, Any]) -> Vocab:
        raise NotImplementedError

    def vocab_size(self, settings: Mapping[str, Any]) -> int:
        return self.vocab(settings).size

    def check(self, settings: Mapping[str, Any]) -> None:
        """Raise ValueError naming the bad setting and why (the runner calls this before any run)."""
        for split in SPLIT_STREAMS:
            self.require_int(settings, f"num_{split}_examples", 1)
        self.check_knobs(settings)

    def check_knobs(self, settings: Mapping[str, Any]) -> None:
        """The task's own knobs: raise ValueError (via `require`) for a bad one."""

    def describe(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Task-specific facts about a setting for the meta (JSON-friendly)."""
        return {}

    def shared(self, settings: Mapping[str, Any], seed: int) -> dict[str, np.ndarray]:
        """State both splits share (drawn from `shared_rng`); passed to `sample`, stored in meta."""
        return {}

    def sample(
        self,
        settings: Mapping[str, Any],
        split: Split,
        num: int,
        rng: np.random.Generator,
        shared: Mapping[str, np.ndarray],
    ) -> Rows:
        raise NotImplementedError

    def min_entropy_bits(self, settings: Mapping[str, Any]) -> float:
        """Lower bound on -log2 P(likeliest test-split input row); 0 means: always check for overlap.

        A test row equals a given train row with probability at most 2**-bound, whatever
        the train distribution, hence the union bound N_train * N_test * 2**-bound.
        """
        return 0.0

    def require(self, ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(f"task {self.name!r}: {message}")

    def require_int(self, settings: Mapping[str, Any], knob: str, minimum: int) -> int:
        value = settings[knob]
        is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        self.require(is_int and value >= minimum, f"{knob} must be an integer >= {minimum}, got {value!r}")
        return int(value)

    def generate(self, settings: Mapping[str, Any], split: Split, seed: int) -> TaskData:
        s = self.settings(**settings)  # fills unset knobs from the baseline, rejects unknown ones
        self.require(split in SPLIT_STREAMS, f"split must be 'train' or 'test', got {split!r}")
        is_seed = isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0
        self.require(is_seed, f"seed must be a non-negative integer, got {seed!r}")
        self.check(s)
        num = {split_: int(s[f"num_{split_}_examples"]) for split_ in SPLIT_STREAMS}

        shared = self.shared(s, seed)
        rows = self.sample(s, split, num[split], split_rng(self.name, seed, split), shared)
        resampled = 0
        overlap_log2 = math.log2(num["train"]) + math.log2(num["test"]) - self.min_entropy_bits(s)
        if split == "test" and overlap_log2 >= NEGLIGIBLE_OVERLAP_LOG2:
            resampled = self._redraw_overlap(s, seed, rows, shared)

        meta: dict[str, Any] = {
            "task": self.name,
            "split": split,
            "seed": int(seed),
            "settings": s,
            "num_resampled": resampled,
            **self.describe(s),
            **shared,
            **rows.extras,
        }
        if self.input_dim(s) == 0:
            meta["vocab"] = self.vocab(s).layout()
        return TaskData(rows.inputs, rows.targets, meta)

    def _redraw_overlap(self, s: Mapping[str, Any], seed: int, rows: Rows, shared: Mapping[str, np.ndarray]) -> int:
        """Redraw test rows whose inputs occur in the train set; returns how many were redrawn."""
        train = self.sample(s, "train", s["num_train_examples"], split_rng(self.name, seed, "train"), shared)
        train_hashes = row_hashes(train.inputs)
        redrawn = 0
        for attempt in range(1, MAX_RESAMPLE_ROUNDS + 1):
            overlap = np.isin(row_hashes(rows.inputs), train_hashes)
            if not overlap.any():
                return redrawn
            redrawn += int(overlap.sum())
            rng = split_rng(self.name, seed, "test", attempt)
            rows.replace(overlap, self.sample(s, "test", int(overlap.sum()), rng, shared))
        raise ValueError(
            f"task {self.name!r}: cannot draw {len(rows.inputs)} test sequences disjoint from the "
            f"{s['num_train_examples']} train sequences in {MAX_RESAMPLE_ROUNDS} rounds; this setting "
            f"has too few distinct sequences (raise seq_len/vocab_size or lower the split sizes)"
        )
