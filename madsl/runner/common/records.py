"""A run's training settings (`TrainSettings`): everything about how one run trains (task
setting and model aside), what madsl.runner.train trains by and what a run's identity holds;
and the options its identity names only off their defaults (`IDENTITY_DEFAULTS`).

Here, below every room, because the plan makes them, training reads them, and the executors'
jobs carry them (madsl.runner.plan.runs builds them; madsl.runner.plan.settings declares the
setting each field comes from).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class TrainSettings:
    """Everything about how one run trains (task setting and model aside)."""

    lr: float
    wd: float
    epochs: int
    batch_size: int
    seed: int
    min_lr: float
    early_stop_acc: float
    eval_lengths: tuple[int, ...] = ()
    freeze: tuple[str, ...] = ()
    precision: str = "fp32"  # fp32 or bf16 once planned for a device; "auto" before
    conventions: str = "madsl"  # whose task layouts and training details (madsl.conventions)
    # madsl.runner.train.options: each default is what runs did before the option existed
    optimizer: str = "adamw"
    schedule: str = "cosine"
    metric: str = "macro"
    stop_acc: float | None = None
    patience: int | None = None
    min_delta: float = 0.0
    lm_head: str = "conventions"


# the options added after runs were first stored: a run's identity names each only when off its
# default above, the value every run made before the option existed had (so older run ids stay valid)
IDENTITY_OPTIONS = (
    "precision",
    "conventions",
    "optimizer",
    "schedule",
    "metric",
    "stop_acc",
    "patience",
    "min_delta",
    "lm_head",
)
IDENTITY_DEFAULTS: Mapping[str, Any] = {
    f.name: f.default for f in dataclasses.fields(TrainSettings) if f.name in IDENTITY_OPTIONS
}
