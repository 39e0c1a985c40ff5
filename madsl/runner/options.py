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
so the run ids of everything trained before the option existed stay valid.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from madsl.errors import Location, MadslError, did_you_mean

# training seeds every generator with a run's seed (torch's take at most 64 bits, the per-epoch
# one seed x 1,000,003): a 32-bit seed fits them all
MAX_SEED = 2**32 - 1

OPTIMIZERS = ("adamw", "adam")
SCHEDULES = ("cosine", "constant")
METRICS = ("macro", "token")
LM_HEADS = ("conventions", "spec")

# a training setting's value in every run made before the setting existed
IDENTITY_DEFAULTS: Mapping[str, Any] = {
    "precision": "fp32", "conventions": "madsl", "optimizer": "adamw", "schedule": "cosine",
    "metric": "macro", "stop_acc": None, "patience": None, "min_delta": 0.0, "lm_head": "conventions",
}

_CHOICES = {"optimizer": OPTIMIZERS, "schedule": SCHEDULES, "metric": METRICS, "lm_head": LM_HEADS}
_MEANING = {"optimizer": "adamw: decoupled weight decay; adam: plain torch Adam, coupled weight decay",
            "schedule": "cosine: decay to min_lr; constant: the learning rate throughout",
            "metric": "macro: class-averaged accuracy; token: share of scored positions right",
            "lm_head": "conventions: the conventions' LM head; spec: the spec's own output layer"}


def check_choice(key: str, value: object, where: Location | None = None, source: str | None = None) -> str:
    """`value` if it is one of the choices of option `key`; a located MadslError otherwise."""
    choices: Sequence[str] = _CHOICES[key]
    if value not in choices:
        raise MadslError(f"{source or '--' + key}: unknown {key} {value!r}", where, expected=" or ".join(choices),
                         hint=did_you_mean(str(value), choices) or _MEANING[key])
    return str(value)


def _number(value: object) -> object:
    """YAML 1.1 reads 1e-3 as a string: a string that is a number is that number."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def check_stop_acc(value: object, where: Location | None = None, source: str = "--stop-acc") -> float:
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise MadslError(f"{source}: expected an accuracy in [0, 1), got {value!r}", where,
                         hint="training stops once the eval accuracy exceeds it, e.g. 0.99")
    return float(value)


def check_patience(value: object, where: Location | None = None, source: str = "--patience") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MadslError(f"{source}: expected a number of epochs, at least 1, got {value!r}", where,
                         hint="training stops after this many epochs in a row without an eval-loss improvement")
    return value


def check_min_delta(value: object, where: Location | None = None, source: str = "--min-delta") -> float:
    value = _number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise MadslError(f"{source}: expected a non-negative number, got {value!r}", where,
                         hint="the eval-loss decrease that counts as an improvement, e.g. 0.001")
    return float(value)


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
