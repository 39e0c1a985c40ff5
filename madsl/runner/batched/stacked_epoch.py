"""One epoch of a stack (`StackedMembers`): every member's steps, schedules, progress and
mid-epoch checkpoints, as `madsl.runner.train.loop.train_epoch` does for one run.

Apart from the stack because the stack is the members' arithmetic (one step, one
evaluation), and this is the epoch's bookkeeping around it, which a grid group
(`madsl.runner.batched.grid`) drives between its per-member epoch ends.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from madsl.conventions import MAD_LAB
from madsl.runner.batched.stacked import StackedMembers, member_batch


@contextmanager
def schedulers_without_steps() -> Iterator[None]:
    """The members' own optimizers never step (the stack does): their schedulers' warning
    about it is silenced while they step (per step, or per epoch under mad-lab's conventions)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
        yield


def train_stacked_epoch(
    stack: StackedMembers,
    datas: Sequence[Any],
    hooks: Sequence[Any],
    checkpoint: Callable[[], None],
    checkpoint_due: Callable[[], bool],
    should_stop: Callable[[], bool],
    interrupted: type,
    epoch_order: Callable[[int, int, int], torch.Tensor],
) -> None:
    """Train the rest of the members' (common) epoch from their (common) step, as
    train.train_epoch does for one run: scheduler steps, train metrics and progress per
    member; `checkpoint()` (after writing the members back) when due mid-epoch and on a
    stop, which then raises `interrupted`. Ends with the members written back."""
    states = stack.states
    batch_size = states[0].settings.batch_size
    per_step_schedule = states[0].settings.conventions != MAD_LAB  # mad-lab steps it per epoch (epoch_metrics)
    orders: dict[tuple, torch.Tensor] = {}  # members with the same data and seed share an order
    for data, state in zip(datas, states):
        key = (id(data), state.settings.seed)
        if key not in orders:
            orders[key] = epoch_order(data.train_x.shape[0], state.settings.seed, state.epoch).to(data.train_x.device)
    started = time.monotonic()

    def bank_time() -> None:
        nonlocal started
        elapsed = time.monotonic() - started
        for state in states:
            state.epoch_seconds += elapsed
            state.train_seconds += elapsed
        started = time.monotonic()

    def save() -> None:
        bank_time()
        stack.sync()
        checkpoint()

    stack.load_metrics()
    with schedulers_without_steps():
        while states[0].step < states[0].steps_per_epoch:
            if should_stop():
                save()
                raise interrupted(f"stopped at epoch {states[0].epoch + 1}, step {states[0].step}")
            window = slice(states[0].step * batch_size, (states[0].step + 1) * batch_size)
            rows = {key: order[window] for key, order in orders.items()}
            rows = [rows[(id(data), state.settings.seed)] for data, state in zip(datas, states)]
            stack.step(
                member_batch([data.train_x for data in datas], rows),
                member_batch([data.train_y for data in datas], rows),
            )
            for state, member_hooks in zip(states, hooks):
                if per_step_schedule:  # the member's cosine schedule, on its own optimizer's groups
                    state.scheduler.step()
                state.step += 1
                if member_hooks.on_progress is not None:
                    member_hooks.on_progress(state.epoch + 1, state.step, state.steps_per_epoch)
            if checkpoint_due() and states[0].step < states[0].steps_per_epoch:
                save()
    bank_time()
    stack.sync()
