"""One training run: a model, one task setting, one point of the lr x wd grid.

MAD paper Table B.1: AdamW with betas (0.9, 0.98), batch 128, cosine decay, no
dropout, cross-entropy on the target positions (IGNORE = -100 elsewhere), plus
the model's auxiliary loss (MoE load balancing). After every epoch the model is
evaluated on the test split; the run's result is the epoch with the lowest
evaluation perplexity (the reference implementation keeps that checkpoint), and
training stops early once evaluation accuracy reaches `early_stop_acc` (under the
reference implementation's conventions, once it exceeds it: its EarlyStopping threshold
is strict).

The loop reads as its steps: `train_step` is one optimizer step, `train_epoch` trains the
rest of an epoch and evaluates it (`epoch_metrics`), `RunState.end_epoch` records it, and
`train_run` strings them together, then evaluates the best weights at other sequence
lengths (`evaluate_lengths`); a caller follows and steers the run through `TrainHooks`.
What the loop uses lives beside it, each in its own module of this package: the metrics
(`metrics`), the optimizer and schedule (`optim`), the run's state and its checkpoints
(`state`), and the device (`device`).

Resumable and deterministic: model init and data order derive from the seed
(the data order of epoch e from (seed, e) alone), and a checkpoint (model,
optimizer, scheduler, RNG states, position, history) is written atomically every
`checkpoint_every_s` seconds (at the end of an epoch, or inside a long one), when
asked to stop and when the run ends. A run resumed from its checkpoint ends exactly
where an uninterrupted run ends.

This module knows nothing of the results store or of executors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from madsl.conventions import MAD_LAB
from madsl.runner.common.records import TrainSettings
from madsl.runner.train.device import is_out_of_memory, release_device_memory
from madsl.runner.train.heads import TaskModel
from madsl.runner.train.metrics import EpochMetrics, RunResult, eval_batch_size, evaluate, task_loss
from madsl.runner.train.precision import autocast, configure_device
from madsl.runner.train.state import Checkpointer, RunData, RunState, open_run, to_tensor


class RunInterrupted(Exception):
    """Training stopped on request; the checkpoint holds everything to resume."""


@dataclass
class TrainHooks:
    """Callbacks of a run. `on_epoch` is called after the epoch's checkpoint, where one was due, is written."""

    on_epoch: Callable[[EpochMetrics], None] | None = None
    on_progress: Callable[[int, int, int], None] | None = None  # (epoch, step, steps per epoch)
    should_stop: Callable[[], bool] | None = None
    on_length: Callable[[int, int, int], None] | None = None  # (length, index, count): evaluating at it
    # checkpoint this often (at an epoch's end, or inside a long epoch): a crash loses at most this
    # much training; not every epoch: six members' saves a few times a second would cost a GPU more
    # than their training
    checkpoint_every_s: float = 60.0
    keep_best: bool = False  # hold the best epoch's weights (in the checkpoint) for `--keep best`


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The data order of an epoch depends on (seed, epoch) only, so a resumed run sees the same."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def train_step(state: RunState, x: torch.Tensor, y: torch.Tensor) -> None:
    """One optimizer step on the batch (x, y): forward, backward, AdamW, the schedule (per
    step; mad-lab's per epoch, in epoch_metrics) and the epoch's train-metric sums."""
    model = state.model
    with autocast(state.settings.precision, x.device):  # the forward only; backward follows its dtypes
        outputs = model(x)
    loss, loss_sum = task_loss(model, outputs, y)
    state.optimizer.zero_grad(set_to_none=True)
    (loss + model.aux_loss()).backward()
    state.optimizer.step()
    if state.settings.conventions != MAD_LAB:
        state.scheduler.step()
    state.train_metrics.update(outputs.detach(), y, loss_sum)


def train_epoch(state: RunState, data: RunData, hooks: TrainHooks, checkpointer: Checkpointer) -> EpochMetrics:
    """Train the rest of `state.epoch` from `state.step`, then evaluate; raises RunInterrupted on a stop."""
    settings = state.settings
    order = epoch_order(data.train_x.shape[0], settings.seed, state.epoch).to(data.train_x.device)
    started = time.monotonic()

    def bank_time() -> None:  # move the time since `started` into the run's clocks
        nonlocal started
        elapsed = time.monotonic() - started
        state.epoch_seconds += elapsed
        state.train_seconds += elapsed
        started = time.monotonic()

    while state.step < state.steps_per_epoch:
        if hooks.should_stop is not None and hooks.should_stop():
            bank_time()
            checkpointer.save(state)
            raise RunInterrupted(f"stopped at epoch {state.epoch + 1}, step {state.step}")
        index = order[state.step * settings.batch_size : (state.step + 1) * settings.batch_size]
        train_step(state, data.train_x[index], data.train_y[index])
        state.step += 1
        if hooks.on_progress is not None:
            hooks.on_progress(state.epoch + 1, state.step, state.steps_per_epoch)
        if checkpointer.due() and state.step < state.steps_per_epoch:  # long epochs: checkpoint mid-way
            bank_time()
            checkpointer.save(state)

    return epoch_metrics(state, data, started)


def epoch_metrics(
    state: RunState, data: RunData, started: float, evaluation: Mapping[str, float | None] | None = None
) -> EpochMetrics:
    """Close the epoch's training: evaluate (unless `evaluation` is given: a stacked group's,
    madsl.runner.batched.stacked) and return its metrics; the time since `started` (not yet banked)
    counts towards the epoch and the run."""
    settings = state.settings
    mad_lab = settings.conventions == MAD_LAB
    if mad_lab:
        state.scheduler.step()  # once per epoch, after its last step
    train = state.train_metrics.compute()
    if evaluation is None:
        evaluation = evaluate(
            state.model,
            data.test_x,
            data.test_y,
            eval_batch_size(settings),
            state.num_classes,
            settings.precision,
            mad_lab,
        )
    elapsed = time.monotonic() - started
    state.train_seconds += elapsed
    return EpochMetrics(
        epoch=state.epoch + 1,
        lr=state.scheduler.get_last_lr()[0],
        seconds=state.epoch_seconds + elapsed,
        train_loss=train["loss"],
        train_ppl=train["ppl"],
        train_acc=train["acc"],
        train_macro_acc=train["macro_acc"],
        eval_loss=evaluation["loss"],
        eval_ppl=evaluation["ppl"],
        eval_acc=evaluation["acc"],
        eval_macro_acc=evaluation["macro_acc"],
    )


def evaluate_lengths(
    state: RunState,
    length_data: Callable[[int], Any],
    tokens_per_batch: int,
    device: torch.device,
    hooks: TrainHooks,
    checkpointer: Checkpointer,
) -> None:
    """Evaluate the best weights at each of settings.eval_lengths not yet done, appending to state.length_evals.

    One length at a time, each checkpointed: long lengths can take hours (attention is
    quadratic), and a stop or a crash must not lose the lengths already done.
    """
    if state.best_state is not None:
        state.model.load_state_dict(state.best_state)
    lengths = state.settings.eval_lengths
    for index in range(len(state.length_evals), len(lengths)):
        if hooks.should_stop is not None and hooks.should_stop():
            checkpointer.save(state)
            raise RunInterrupted(
                f"stopped before evaluating at length {lengths[index]} ({index} of {len(lengths)} lengths done)"
            )
        if hooks.on_length is not None:
            hooks.on_length(lengths[index], index, len(lengths))
        state.length_evals.append(
            _evaluate_length(
                state.model,
                lengths[index],
                length_data,
                tokens_per_batch,
                state.num_classes,
                device,
                state.settings.precision,
            )
        )
        checkpointer.save(state)


def _evaluate_length(
    model: TaskModel,
    length: int,
    length_data: Callable[[int], Any],
    tokens_per_batch: int,
    num_classes: int,
    device: torch.device,
    precision: str = "fp32",
) -> dict:
    """Evaluate the best model at another sequence length; running out of memory is a result, not a crash."""
    started = time.monotonic()
    try:
        data = length_data(length)
        x, y = to_tensor(data.inputs, device), to_tensor(data.targets, device)
        metrics = evaluate(model, x, y, max(1, tokens_per_batch // max(length, 1)), num_classes, precision)
        status = "ok"
    except Exception as err:  # noqa: BLE001 - any failure at one length must not lose the run
        if not is_out_of_memory(err):
            metrics, status = {"error": f"{type(err).__name__}: {err}"}, "error"
        else:
            metrics, status = {}, "oom"
        release_device_memory()
    return {"length": length, "status": status, "seconds": time.monotonic() - started, **metrics}


def train_run(
    settings: TrainSettings,
    build_model: Callable[[], TaskModel],
    train_data,
    test_data,
    *,
    num_classes: int,
    device: torch.device | str = "cpu",
    checkpoint_path: Path | None = None,
    hooks: TrainHooks | None = None,
    length_data: Callable[[int], Any] | None = None,
    run_id: str | None = None,
) -> RunResult:
    """Train one run to the end (or raise RunInterrupted), resuming from `checkpoint_path` if it exists.

    build_model: returns a fresh TaskModel; called after seeding, so its init is deterministic.
    train_data, test_data: TaskData (numpy inputs / targets).
    length_data: for settings.eval_lengths, returns the test TaskData at a sequence length.
    run_id: written into the checkpoint; a checkpoint at `checkpoint_path` of another run id is refused.
    """
    hooks = hooks or TrainHooks()
    device = torch.device(device) if isinstance(device, str) else device
    checkpoint_path = Path(checkpoint_path) if checkpoint_path is not None else None
    state = open_run(
        settings, build_model, device, train_data.inputs.shape[0], num_classes, checkpoint_path, hooks.keep_best, run_id
    )
    if isinstance(state, RunResult):
        return state
    data = RunData.from_tasks(train_data, test_data, device)
    checkpointer = Checkpointer(checkpoint_path, hooks.checkpoint_every_s)
    configure_device(device)

    state.model.train()
    while not state.finished:
        metrics = train_epoch(state, data, hooks, checkpointer)
        state.end_epoch(metrics)
        checkpointer.save_if_due(state)
        if hooks.on_epoch is not None:
            hooks.on_epoch(metrics)

    if settings.eval_lengths and length_data is not None:
        tokens_per_batch = settings.batch_size * max(int(train_data.inputs.shape[1]), 1)
        evaluate_lengths(state, length_data, tokens_per_batch, device, hooks, checkpointer)

    result = state.result()
    checkpointer.save(state, result)
    return result
