"""A pretraining run as a job of the runner's executors: `PretrainJob` carries what a worker needs
(picklable: the sized Spec, the settings, the token folder) and executes itself, reporting the
same events as a MAD run (started, progress, an "epoch" per evaluation, finished), so the
coordinator, the results store, the local and Ray executors, resume after a kill and Ctrl-C work
for it unchanged. `PretrainStackJob` is runs of one shape trained together as one stacked model
(madsl.runner.pretrain.stacked), a group job whose members report as themselves. Nothing here
touches the results store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from madsl.runner.pretrain.recipe import PretrainSettings


class TokenBatches:
    """A run's batches from a token folder: the training batch of each step (from (seed, step)
    alone) and the fixed validation windows, `batch_size` at a time."""

    def __init__(self, tokens: Any, settings: PretrainSettings):
        from madsl.corpus import val_windows

        self.tokens, self.settings = tokens, settings
        self.windows = val_windows(tokens.val, settings.seq_len, settings.eval_tokens)

    def train_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        from madsl.corpus import train_batch

        s = self.settings
        return train_batch(self.tokens.train, s.batch_size, s.seq_len, s.seed, step)

    def eval_batches(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        x, y = self.windows[0], self.windows[1]
        for start in range(0, x.shape[0], self.settings.batch_size):
            yield x[start : start + self.settings.batch_size], y[start : start + self.settings.batch_size]


def open_text(data_dir: str, dtype: str | None, vocab_size: int | None) -> Any:
    """The token folder a run trains on (validated: madsl.corpus.open_tokens)."""
    from madsl.corpus import open_tokens

    return open_tokens(Path(data_dir), dtype=dtype, vocab_size=vocab_size)


@dataclass
class PretrainJob:
    """One pretraining run for an executor; `execute` trains it and never raises."""

    run_id: str
    spec: Any  # the sized Spec (madsl.scaling.grid)
    settings: PretrainSettings
    data_dir: str
    checkpoint_path: str
    data_dtype: str | None = None
    data_vocab: int | None = None
    device: str = "auto"
    label: str = ""
    keep_best: bool = False  # the coordinator's: pretraining keeps no weights
    checkpoint_every_s: float | None = None

    def build_model(self, vocab_size: int) -> Callable[[], Any]:
        from madsl.compiler import compile_spec

        return lambda: compile_spec(
            self.spec, vocab_size=vocab_size, max_seq_len=self.settings.seq_len, seed=self.settings.seed
        )

    def train_alone(self, tokens: Any, device: Any, hooks: Any) -> Any:
        """Train this run by itself (the one-by-one loop) from its checkpoint; its RunResult."""
        from madsl.runner.pretrain.loop import pretrain_run

        return pretrain_run(
            self.settings,
            self.build_model(tokens.info.vocab_size),
            TokenBatches(tokens, self.settings),
            device=device,
            checkpoint_path=Path(self.checkpoint_path),
            hooks=hooks,
            run_id=self.run_id,
        )

    def execute(self, emit: Callable[[Any], None], should_stop: Callable[[], bool]) -> None:
        from madsl.runner.execute.jobs import job_hooks, report_run  # a MAD run's events, the same way

        def train(device: Any) -> tuple[Any, dict]:
            tokens = open_text(self.data_dir, self.data_dtype, self.data_vocab)
            return self.train_alone(tokens, device, job_hooks(self, emit, should_stop)), {}

        report_run(self.run_id, self.device, emit, train)


@dataclass
class PretrainStackJob:
    """Pretraining runs of one shape (`members`, PretrainJobs) trained as one stacked model; the
    coordinator and the store see the members' run ids only. Members that cannot stack (a layer
    without a stacked form, or resumed at different steps) train in stacks of their own step, or
    alone."""

    run_id: str  # names the stack for executors
    members: list[PretrainJob] = field(default_factory=list)
    device: str = "auto"
    label: str = ""

    def execute(self, emit: Callable[[Any], None], should_stop: Callable[[], bool]) -> None:
        execute_stack(self, emit, should_stop)


def execute_stack(stack: PretrainStackJob, emit: Callable[[Any], None], should_stop: Callable[[], bool]) -> None:
    """Open every member (a finished one reports its result), train the others in stacks of one
    step each (a member that stacks with none trains alone), and report each member as it
    finishes, stops or fails. Never raises."""
    import os
    import traceback

    from madsl.runner.execute.jobs import Event
    from madsl.runner.train.device import resolve_device
    from madsl.runner.train.loop import RunInterrupted

    finished: set[str] = set()
    try:
        device = resolve_device(stack.device)
        for job in stack.members:
            emit(Event("started", job.run_id, {"pid": os.getpid(), "device": str(device)}))
        _train_members(stack, emit, should_stop, device, finished)
    except RunInterrupted as err:
        for job in stack.members:
            if job.run_id not in finished:
                emit(Event("interrupted", job.run_id, {"message": str(err)}))
    except BaseException as err:  # noqa: BLE001 - report, never take the executor down
        for job in stack.members:
            if job.run_id not in finished:
                error = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
                emit(Event("failed", job.run_id, error))


def _train_members(
    stack: PretrainStackJob, emit: Callable[[Any], None], should_stop: Callable[[], bool], device: Any, finished: set
) -> None:
    from madsl.runner.execute.jobs import job_hooks
    from madsl.runner.pretrain.loop import open_pretrain
    from madsl.runner.pretrain.stacked import pretrain_stack, stackable
    from madsl.runner.train.checkpoint import save_checkpoint
    from madsl.runner.train.metrics import RunResult
    from madsl.runner.train.precision import configure_device

    configure_device(device)
    first = stack.members[0]
    tokens = open_text(first.data_dir, first.data_dtype, first.data_vocab)
    jobs, by_step = {job.run_id: job for job in stack.members}, {}
    for job in stack.members:
        path, build = Path(job.checkpoint_path), job.build_model(tokens.info.vocab_size)
        state = open_pretrain(job.settings, build, device, path, job.run_id)
        if isinstance(state, RunResult):
            _finished(emit, job.run_id, state, device, 1, finished)
        else:
            by_step.setdefault(state.step, []).append(state)

    def save(state: Any, done: bool, size: int) -> None:
        result = state.result() if done else None
        save_checkpoint(Path(jobs[state.run_id].checkpoint_path), state.to_checkpoint(result))
        if done:
            _finished(emit, state.run_id, result, device, size, finished)

    for states in by_step.values():
        if len(states) > 1 and stackable(states):
            datas = [TokenBatches(tokens, s.settings) for s in states]
            hooks = [job_hooks(jobs[s.run_id], emit, should_stop) for s in states]
            pretrain_stack(states, datas, hooks, lambda s, done, n=len(states): save(s, done, n), device)
            continue
        for state in states:  # alone: the one-by-one loop, from the checkpoint it opened
            job = jobs[state.run_id]
            result = job.train_alone(tokens, device, job_hooks(job, emit, should_stop))
            _finished(emit, job.run_id, result, device, 1, finished)


def _finished(emit: Callable[[Any], None], run_id: str, result: Any, device: Any, stacked: int, done: set) -> None:
    import torch

    from madsl.runner.execute.jobs import Event

    data = {"result": result.to_dict(), "device": str(device), "threads": torch.get_num_threads(), "stacked": stacked}
    emit(Event("finished", run_id, data))
    done.add(run_id)
