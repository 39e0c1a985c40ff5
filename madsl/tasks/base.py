"""The task interface: what every synthetic task provides to the runner.

A task is a named, seeded data generator plus the facts the runner needs to
train and score a model on it (vocabulary size, which positions are scored,
which output head it needs). Tasks never import torch: data is numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Mapping

import numpy as np

IGNORE = -100  # target value of positions that are not scored (torch's cross-entropy default)

Split = Literal["train", "test"]
Head = Literal["lm", "compression", "classify", "pooled", "regress"]


@dataclass(frozen=True)
class TaskData:
    """One split of one task setting.

    inputs:  (N, L) int64 token ids; for real-valued tasks (N, L, input_dim) float32.
    targets: (N, L) int64 class ids with IGNORE at unscored positions; for
             head="compression" (N, L_c) the tokens to reconstruct; for
             head="classify" or "pooled" (N,) int64; for head="regress" (N, L) float32 with NaN
             at unscored positions.
    """

    inputs: np.ndarray
    targets: np.ndarray
    meta: Mapping[str, Any] = field(default_factory=dict)


class Task:
    """Base class of a task. Subclasses set the class attributes and implement `generate`."""

    name: ClassVar[str]
    head: ClassVar[Head] = "lm"
    # The paper's baseline setting: every knob the generator takes, with its value.
    baseline: ClassVar[Mapping[str, Any]]
    # The difficulty sweep: knob -> values; one knob changed at a time from the baseline.
    sweep: ClassVar[Mapping[str, tuple]] = {}
    # Where the definition comes from (paper, section/table).
    source: ClassVar[str] = ""
    # Sequence lengths at which a model trained on the baseline is evaluated
    # (test split only; e.g. induction heads' length extrapolation). Empty: none.
    eval_seq_lens: ClassVar[tuple[int, ...]] = ()
    # Whose conventions the generator follows (madsl.conventions): a mad-lab variant of a
    # task has the same name, settings and sweep, and the reference implementation's layout.
    conventions: ClassVar[str] = "madsl"
    # False: the task reads its data from files of the user's (checked as they are read), so the
    # runner neither generates nor caches it; its `data_shape` says what a plan costs.
    generated: ClassVar[bool] = True

    def settings(self, **overrides: Any) -> dict[str, Any]:
        """The baseline with `overrides` applied; unknown knobs are an error."""
        unknown = sorted(set(overrides) - set(self.baseline))
        if unknown:
            raise KeyError(
                f"task {self.name!r} has no setting {unknown[0]!r}; settings: {', '.join(sorted(self.baseline))}"
            )
        return {**self.baseline, **overrides}

    def sweep_settings(self) -> list[dict[str, Any]]:
        """All settings of the difficulty sweep (baseline first, then one knob at a time, no duplicates)."""
        out = [dict(self.baseline)]
        for knob, values in self.sweep.items():
            for value in values:
                s = {**self.baseline, knob: value}
                if s not in out:
                    out.append(s)
        return out

    def vocab_size(self, settings: Mapping[str, Any]) -> int:
        """Size of the model's input embedding (all tokens including special ones)."""
        raise NotImplementedError

    def num_classes(self, settings: Mapping[str, Any]) -> int:
        """Size of the model's output layer; by default the input vocabulary."""
        return self.vocab_size(settings)

    def ceiling(self, settings: Mapping[str, Any], seed: int) -> float | None:
        """The best score any model could reach on this setting's test split, where the data
        bound it below 1 (memorization: facts never shown in training cannot be known); None otherwise."""
        return None

    def input_dim(self, settings: Mapping[str, Any]) -> int:
        """Width of real-valued inputs (N, L, input_dim); 0 for token tasks."""
        return 0

    def generate(self, settings: Mapping[str, Any], split: Split, seed: int) -> TaskData:
        """Vectorized and deterministic: same (settings, split, seed) -> same arrays.

        The train and test splits come from independent random streams, and the
        test set never overlaps the train set.
        """
        raise NotImplementedError


def data_shape(task: Any, settings: Mapping[str, Any]) -> tuple[int, int, int]:
    """(seq_len, train examples, test examples) of a task setting: the task's own `data_shape`
    where it has one (data read from a file), else its seq_len and num_*_examples knobs."""
    if hasattr(task, "data_shape"):
        return task.data_shape(settings)
    return (
        int(settings.get("seq_len", 1)),
        int(settings.get("num_train_examples", 0)),
        int(settings.get("num_test_examples", 0)),
    )
