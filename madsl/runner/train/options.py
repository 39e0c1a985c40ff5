"""Training options every run has, each with a default that is what runs did before it existed.

    optimizer   adamw (default): torch.optim.AdamW, decoupled weight decay, Table B.1's betas
                (0.9, 0.98) under the madsl conventions; adam: torch.optim.Adam as constructed
                with its defaults (betas (0.9, 0.999), eps 1e-8), weight decay added to the
                gradient (coupled), on the same parameter groups
    schedule    cosine (default): cosine decay to min_lr over the run; constant: lr throughout
    metric      macro (default): the class-averaged accuracy over scored positions (MAD's);
                token: the share of scored positions predicted right. The stopping rule reads
                it, and a run's score is its value at the best epoch
    stop_acc    stop once the eval accuracy (of `metric`) exceeds this (strictly); unset: the
                protocol's early_stop_acc, as the conventions compare it
    patience    stop once the eval loss has not improved by more than `min_delta` for this
                many epochs in a row (the first epoch always improves on nothing); unset: never
    min_delta   see patience (default 0); an error without patience, where it would do nothing
    lm_head     conventions (default): the LM head the conventions give (mad-lab: an untied
                Linear with a bias); spec: the spec's own output layer under any conventions
                (tied to the embedding where the spec says so), e.g. to train a Hugging Face
                model's layout on the reference implementation's data. Under the madsl
                conventions the two are one head, so they plan one run (one run id)

A run's identity names an option only when it is off its default (`train_config_identity`),
so the run ids of everything trained before the option existed stay valid. Each option is
declared, with its checks, in madsl.runner.plan.settings; its choices and identity default in
madsl.runner.common.
"""

from __future__ import annotations

import math
from typing import Sequence

# defined once, below every room: madsl.runner.common (each option's setting: madsl.runner.plan.settings)
from madsl.runner.common.choices import LM_HEADS, MAX_SEED, METRICS, OPTIMIZERS, SCHEDULES  # noqa: F401
from madsl.runner.common.records import IDENTITY_DEFAULTS


def train_config_identity(train_config: dict) -> dict:
    """A run's training settings as they enter its identity: each option of IDENTITY_DEFAULTS
    only when off its default (the value of every run made before the option existed)."""
    config = dict(train_config)
    for key, before in IDENTITY_DEFAULTS.items():
        if config.get(key, before) == before:
            config.pop(key, None)
    return config


def stale_epochs(eval_losses: Sequence[float], min_delta: float) -> int:
    """Epochs in a row, up to the last, whose eval loss did not improve on the best before it by
    more than `min_delta` (a NaN never improves)."""
    best, stale = math.inf, 0
    for loss in eval_losses:
        if loss < best - min_delta:
            best, stale = loss, 0
        else:
            stale += 1
    return stale
