"""Evaluation protocols: which task settings to run and how to train on each.

A protocol is data: a choice of task settings (the paper's full difficulty
sweep, or the baseline setting of each task), a learning-rate x weight-decay
grid, a number of epochs and a few knobs. `madsl.runner.plan.runs.build_plan` turns a
protocol plus the user's overrides (`madsl.runner.plan.overrides`) into the concrete list
of runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from madsl.errors import MadslError, did_you_mean
from madsl.runner.plan.task_settings import apply_setting_overrides

SettingsChoice = Literal["sweep", "baseline"]


@dataclass(frozen=True)
class Protocol:
    name: str
    description: str
    settings: SettingsChoice  # "sweep": baseline + difficulty sweep; "baseline": the baseline only
    lrs: tuple[float, ...]
    wds: tuple[float, ...]
    epochs: int
    batch_size: int = 128
    seeds: tuple[int, ...] = (0,)
    # Task-setting overrides the protocol itself applies (a reduced budget), by task
    # name or "*" for every task; a knob a task does not have is skipped.
    task_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    task_epochs: Mapping[str, int] = field(default_factory=dict)  # per-task epochs instead of `epochs`
    min_lr: float = 1e-6  # cosine decay floor (the reference implementation's default)
    early_stop_acc: float = 0.999  # stop once eval (class-averaged) accuracy reaches this
    # Skip the remaining grid points of a setting once one grid point reached
    # early_stop_acc: the best accuracy over the grid can then gain at most 0.001.
    skip_solved: bool = False
    # Whose task layouts and training details (madsl.conventions): the protocols that
    # reproduce the publication follow its reference implementation.
    conventions: str = "madsl"


PAPER_GRID_LR = (1e-4, 5e-4, 1e-3)

PAPER_GRID_WD = (0.0, 0.1)

PROTOCOLS: dict[str, Protocol] = {
    "paper": Protocol(
        name="paper",
        description="MAD paper Table B.1: every setting of every difficulty sweep, lr x wd grid, 200 epochs, "
        "as the reference implementation runs it (conventions mad-lab)",
        settings="sweep",
        lrs=PAPER_GRID_LR,
        wds=PAPER_GRID_WD,
        epochs=200,
        conventions="mad-lab",
    ),
    "baseline": Protocol(
        name="baseline",
        description="the baseline setting of each task, full lr x wd grid, 200 epochs (conventions mad-lab)",
        settings="baseline",
        lrs=PAPER_GRID_LR,
        wds=PAPER_GRID_WD,
        epochs=200,
        conventions="mad-lab",
    ),
    # Chosen from measurements on 2 CPU cores (docs/runner.md, "The quick protocol"): about
    # 320 optimizer steps of batch 32 per recall task (multi-head Hyena solves in-context
    # recall within 256), ~1.3M training tokens per long task, one grid point.
    "quick": Protocol(
        name="quick",
        description="baseline settings, reduced budget: ~10 minutes for one 4-layer width-128 "
        "architecture on 2 CPU cores",
        settings="baseline",
        lrs=(1e-3,),
        wds=(0.0,),
        epochs=5,
        batch_size=32,
        task_settings={
            "*": {"num_test_examples": 512},
            "in-context-recall": {"num_train_examples": 2048},
            "fuzzy-in-context-recall": {"num_train_examples": 2048},
            "noisy-in-context-recall": {"num_train_examples": 2048},
            "selective-copying": {"num_train_examples": 1024},
            "compression": {"num_train_examples": 4096},
        },
        task_epochs={"compression": 6, "memorization": 32},
        skip_solved=True,
    ),
    "smoke": Protocol(
        name="smoke",
        description="seconds: tiny data, 2 epochs; for tests",
        settings="baseline",
        lrs=(1e-3,),
        wds=(0.0,),
        epochs=2,
        task_settings={"*": {"num_train_examples": 64, "num_test_examples": 32}},
        skip_solved=True,
    ),
}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise MadslError(
            f"unknown protocol {name!r}", expected="one of " + ", ".join(PROTOCOLS), hint=did_you_mean(name, PROTOCOLS)
        )
    return PROTOCOLS[name]


def budgeted_baseline(task, protocol: Protocol) -> dict[str, Any]:
    """The task's baseline with the protocol's own budget overrides (e.g. quick's smaller train set)."""
    setting = dict(task.baseline)
    for scope in ("*", task.name):
        budget = {k: v for k, v in protocol.task_settings.get(scope, {}).items() if k in task.baseline}
        setting = apply_setting_overrides(task, setting, budget, f"protocol {protocol.name}")
    return setting
