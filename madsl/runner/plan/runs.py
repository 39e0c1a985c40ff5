"""The plan: the concrete runs of a protocol for some tasks, with the user's overrides
applied (`build_plan`), each a task setting and its training settings (`TrainSettings`),
filed under the protocol that asked for it.

`TrainSettings` is everything about how one run trains (task setting and model aside):
what `madsl.runner.train` trains by and what a run's identity holds (a record of
madsl.runner.common.records, below every room that reads it).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from madsl.errors import MadslError
from madsl.runner.common.choices import MAX_SEED
from madsl.runner.common.records import TrainSettings
from madsl.runner.plan.overrides import Overrides
from madsl.runner.plan.protocols import Protocol, budgeted_baseline, get_protocol
from madsl.runner.plan.settings import RUN_OPTIONS
from madsl.runner.plan.task_settings import apply_setting_overrides, check_setting_keys

# Runs that the protocol alone would not make (a setting, lr, wd, epochs, batch size, seed or
# frozen layers of the user's) are filed under "<protocol>+custom", not under the protocol.
CUSTOM_SUFFIX = "+custom"


@dataclass(frozen=True)
class PlannedRun:
    task: str
    settings: Mapping[str, Any]
    train: TrainSettings
    label: str = ""  # the protocol the run is filed under in the results store (run_labels)

    def key(self) -> tuple:
        """What the run trains (its label aside)."""
        return self.task, json.dumps(self.settings, sort_keys=True, default=str), self.train


@dataclass(frozen=True)
class Plan:
    protocol: Protocol
    runs: tuple[PlannedRun, ...]


def build_plan(tasks: Sequence, overrides: Overrides, source: str = "--set") -> Plan:
    """The runs of a protocol for `tasks` (Task objects), with `overrides` applied. Each run
    is labelled with the protocol where the protocol alone (under the same conventions,
    precision and evaluation lengths, which do not change what it trains) makes it, else
    with `<protocol>+custom`."""
    plan = _plan_runs(tasks, overrides, source)
    changes_training = (
        dataclasses.replace(overrides, protocol=None, tasks=None, conventions=None, precision=None, eval_lengths=None)
        != Overrides()
    )
    own = plan.protocol.name
    if not changes_training:
        return Plan(plan.protocol, tuple(dataclasses.replace(r, label=own) for r in plan.runs))
    reference = _plan_runs(
        tasks,
        Overrides(
            protocol=own,
            conventions=overrides.conventions,
            precision=overrides.precision,
            eval_lengths=overrides.eval_lengths,
        ),
    )
    protocol_runs = {r.key() for r in reference.runs}
    return Plan(
        plan.protocol,
        tuple(
            dataclasses.replace(r, label=own if r.key() in protocol_runs else own + CUSTOM_SUFFIX) for r in plan.runs
        ),
    )


def _check_numbers(epochs: int, batch_size: int, seeds: Sequence, lrs: Sequence, wds: Sequence) -> None:
    """The numbers every run of a plan shares, each in its range (a MadslError naming it otherwise)."""
    for name, value in (("epochs", epochs), ("batch size", batch_size)):
        if value < 1:
            raise MadslError(f"{name} must be at least 1, got {value}")
    if any(not 0 <= int(seed) <= MAX_SEED for seed in seeds):  # a sweep's train.seed, the Python API's
        raise MadslError(
            f"seed must be from 0 to {MAX_SEED:,} (2^32 - 1), got {', '.join(map(str, seeds))}",
            hint="every generator of a run is seeded from it",
        )
    for name, values in (("lr", lrs), ("wd", wds)):
        if not all(math.isfinite(v) for v in values):
            raise MadslError(f"{name} must be a finite number, got {', '.join(map(str, values))}")
        if any(v < 0 for v in values) or (name == "lr" and any(v == 0 for v in values)):
            raise MadslError(f"{name} must be positive, got {', '.join(map(str, values))}")


def _task_settings(task, protocol, overrides: Overrides, source: str) -> list[dict]:
    """A task's distinct settings under the protocol: its baseline or sweep points, each with the
    protocol's budget (where the sweep point keeps the baseline value), then the user's knobs."""
    base = [dict(task.baseline)] if protocol.settings == "baseline" else task.sweep_settings()
    seen: list[dict] = []
    budget = {k: v for k, v in budgeted_baseline(task, protocol).items() if task.baseline[k] != v}
    for setting in base:
        setting = {**setting, **{k: v for k, v in budget.items() if setting[k] == task.baseline[k]}}
        setting = apply_setting_overrides(task, setting, overrides.settings, source)
        if hasattr(task, "resolve_settings"):  # data of the user's: identified by its bytes
            setting = task.resolve_settings(setting)
        if setting in seen:  # an override can collapse sweep points onto each other
            continue
        seen.append(setting)
    return seen


def _plan_runs(tasks: Sequence, overrides: Overrides, source: str = "--set") -> Plan:
    protocol = get_protocol(overrides.protocol or "quick")
    check_setting_keys(tasks, overrides.settings, source)
    lrs = overrides.lrs or protocol.lrs
    wds = overrides.wds or protocol.wds

    def epochs_for(task):
        return (
            overrides.epochs if overrides.epochs is not None else protocol.task_epochs.get(task.name, protocol.epochs)
        )

    batch_size = overrides.batch_size if overrides.batch_size is not None else protocol.batch_size
    seeds = overrides.seeds or protocol.seeds
    conventions = overrides.conventions or protocol.conventions
    # the reference trains in bf16 on its GPUs: "auto" gives that on CUDA, fp32 on a CPU
    precision = overrides.precision or ("auto" if conventions == "mad-lab" else "fp32")
    options = {key: getattr(overrides, key) for key in RUN_OPTIONS if getattr(overrides, key) is not None}
    if options.get("min_delta") and options.get("patience") is None:
        raise MadslError(
            f"min_delta {options['min_delta']} has no effect without patience",
            hint="min_delta is how much the eval loss must improve to count for patience: set "
            "patience as well (--patience N or the spec's eval.patience), or drop min_delta",
        )
    if options.get("lm_head") == "spec" and conventions != "mad-lab":
        options["lm_head"] = "conventions"  # the madsl conventions' LM head is the spec's: one run, one run id
    _check_numbers(epochs_for(tasks[0]) if tasks else 1, batch_size, seeds, lrs, wds)
    runs: list[PlannedRun] = []
    for task in tasks:
        lengths = overrides.eval_lengths if overrides.eval_lengths is not None else tuple(task.eval_seq_lens)
        for setting in _task_settings(task, protocol, overrides, source):
            for seed in seeds:
                for lr in sorted(lrs, reverse=True):  # large lr first: solves soonest (skip_solved)
                    for wd in wds:
                        runs.append(
                            PlannedRun(
                                task.name,
                                setting,
                                TrainSettings(
                                    lr=float(lr),
                                    wd=float(wd),
                                    epochs=int(epochs_for(task)),
                                    batch_size=int(batch_size),
                                    seed=int(seed),
                                    min_lr=protocol.min_lr,
                                    early_stop_acc=protocol.early_stop_acc,
                                    eval_lengths=tuple(int(x) for x in lengths),
                                    freeze=tuple(overrides.freeze or ()),
                                    precision=precision,
                                    conventions=conventions,
                                    **options,
                                ),
                            )
                        )
    return Plan(protocol, tuple(runs))
