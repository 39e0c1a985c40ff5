"""Jobs: what every job an executor runs is (`Job`), a MAD run as one (`RunJob`), what a job
reports back (`Event`), and how a worker trains a run (`execute_job`, with its data and model from
`job_inputs`). Nothing here touches the results store; a grid group (madsl.runner.batched.grid) and
a pretraining run (madsl.runner.pretrain.job) are jobs too, and madsl.runner.launch.run runs them all.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from madsl.runner.common.records import TrainSettings

PROGRESS_EVERY_S = 0.5
TERMINAL = ("finished", "failed", "interrupted", "skipped")  # the events that end a run


class ModelFactory(Protocol):
    """Builds a fresh backbone with the compiler's interface (picklable for process pools)."""

    def __call__(self, vocab_size: int, max_seq_len: int, num_classes: int | None = None, seed: int = 0) -> Any: ...


class Job(Protocol):
    """A job of the runner (madsl.runner.launch.run): one run, picklable, that executes itself.
    MAD runs (`RunJob`), pretraining runs (madsl.runner.pretrain.job.PretrainJob) and the runs of
    a search's candidates (RunJobs, through madsl.runner.api.evaluate) are Jobs; a grid group
    (madsl.runner.batched.grid.GroupJob) is one job standing for its `members`, each a Job. What a
    run is registered under in the results store (its identity, spec and label) is the planner's:
    it writes it through run's `register`."""

    run_id: str  # the hash of its identity (madsl.runner.store.results.RunIdentity)
    label: str  # for progress displays
    device: str  # where it trains: auto, cpu, cuda or cuda:N
    checkpoint_path: str  # its checkpoint, resumed from after a stop or a crash
    keep_best: bool  # keep the best epoch's weights when it finishes (madsl.runner.store.kept)
    checkpoint_every_s: float | None  # None: the loop's default (a minute); 0: at every evaluation

    def execute(self, emit: Callable[["Event"], None], should_stop: Callable[[], bool]) -> None:
        """Train to the end (or a stop: checkpoint and report interrupted), reporting through `emit`; never raises."""


@dataclass
class RunJob:
    """Everything a worker needs to execute one run (picklable): a Job."""

    run_id: str
    task: Any  # a madsl.tasks Task
    setting: Mapping[str, Any]
    train: TrainSettings
    model_factory: ModelFactory
    checkpoint_path: str
    data_dir: str | None = None
    device: str = "auto"
    label: str = ""  # for progress displays
    keep_best: bool = False  # keep the best epoch's weights when the run finishes (madsl.runner.store.kept)
    checkpoint_every_s: float | None = None  # None: train.TrainHooks' default (a minute); 0: every epoch

    def execute(self, emit: Callable[["Event"], None], should_stop: Callable[[], bool]) -> None:
        train_job(self, emit, should_stop)


@dataclass
class Event:
    kind: str  # started | progress | epoch | length | retried | finished | failed | interrupted | skipped
    run_id: str
    data: dict = field(default_factory=dict)


def load_split(task: Any, setting: Mapping[str, Any], split: str, seed: int, data_dir: str | None):
    """Task data from the on-disk cache (generated on a miss)."""
    if not getattr(task, "generated", True):  # data from files of the user's, checked as they are read
        return task.generate(setting, split, seed)
    try:
        from madsl.tasks.cache import load_or_generate
    except ImportError:  # the cache module is optional for stand-in tasks
        return task.generate(setting, split, seed)
    return load_or_generate(task, setting, split, seed, data_dir)


@dataclass
class JobInputs:
    """What training a job needs besides its settings: its data, how to build its model, where."""

    train_data: Any
    test_data: Any
    num_classes: int
    build_model: Callable[[], Any]  # a fresh TaskModel (call it after seeding)
    length_data: Callable[[int], Any]  # the test split at another sequence length
    tokens_per_batch: int
    build: dict  # how the model was built, so that a kept model can be rebuilt (madsl.runner.store.kept)


def job_inputs(job: RunJob, load: Callable[..., Any] = load_split) -> JobInputs:
    """Load a job's splits (through `load(task, setting, split, seed, data_dir)`) and its model builder."""
    from madsl.runner.train.heads import TaskModel

    task, setting, seed = job.task, dict(job.setting), job.train.seed
    train_data = load(task, setting, "train", seed, job.data_dir)
    test_data = load(task, setting, "test", seed, job.data_dir)
    vocab_size = task.vocab_size(setting)
    num_classes = task.num_classes(setting)
    input_dim = task.input_dim(setting) if hasattr(task, "input_dim") else 0
    # the longest sequence the model meets; a layer sized by the length (a `seq_len` value,
    # docs/language.md) is built for the task setting's, as the reference builds it, also where
    # the inputs are a token shorter (the recall tasks' next-token inputs)
    seq_len = max([int(setting.get("seq_len", 0)), int(train_data.inputs.shape[1]), *job.train.eval_lengths])
    head = getattr(task, "head", "lm")

    def build_model() -> TaskModel:
        # The backbone's own output layer serves lm / classify; compression and regress read features.
        out = num_classes if head in ("lm", "classify") and num_classes != vocab_size else None
        backbone = job.model_factory(vocab_size=vocab_size, max_seq_len=seq_len, num_classes=out, seed=seed)
        if job.train.freeze:  # hybrid fine-tuning: some layers keep their weights
            backbone.freeze(list(job.train.freeze))
        return TaskModel(
            backbone,
            head,
            num_classes=num_classes,
            target_len=int(train_data.targets.shape[1]) if head == "compression" else None,
            input_dim=input_dim,
            compression_position=int(dict(train_data.meta).get("compression_position", -1)),
            conventions=job.train.conventions,
            lm_head=job.train.lm_head,
        )

    def length_data(length: int):
        return load(task, {**setting, "seq_len": length}, "test", seed, job.data_dir)

    build = {
        "vocab_size": vocab_size,
        "max_seq_len": seq_len,
        "num_classes": max(num_classes, 1),
        "backbone_num_classes": (num_classes if head in ("lm", "classify") and num_classes != vocab_size else None),
        "head": head,
        "input_dim": input_dim,
        "target_len": int(train_data.targets.shape[1]) if head == "compression" else None,
        "compression_position": int(dict(train_data.meta).get("compression_position", -1)),
        "conventions": job.train.conventions,
        "lm_head": job.train.lm_head,
    }
    return JobInputs(
        train_data,
        test_data,
        max(num_classes, 1),
        build_model,
        length_data,
        job.train.batch_size * max(int(train_data.inputs.shape[1]), 1),
        build,
    )


def job_hooks(job: RunJob, emit: Callable[[Event], None], should_stop: Callable[[], bool]):
    """TrainHooks that report a job's progress, epochs and length evaluations as events."""
    from madsl.runner.train.loop import TrainHooks

    last_progress = [0.0]

    def on_progress(epoch: int, step: int, steps: int) -> None:
        now = time.monotonic()
        if now - last_progress[0] >= PROGRESS_EVERY_S or step == steps:
            last_progress[0] = now
            emit(Event("progress", job.run_id, {"epoch": epoch, "step": step, "steps": steps}))

    def on_epoch(metrics) -> None:
        emit(Event("epoch", job.run_id, {"metrics": vars(metrics).copy()}))

    def on_length(length: int, index: int, count: int) -> None:
        emit(Event("length", job.run_id, {"length": length, "index": index, "count": count}))

    every = {} if job.checkpoint_every_s is None else {"checkpoint_every_s": job.checkpoint_every_s}
    return TrainHooks(
        on_epoch=on_epoch,
        on_progress=on_progress,
        should_stop=should_stop,
        on_length=on_length,
        keep_best=job.keep_best,
        **every,
    )


def execute_job(job: Job, emit: Callable[[Event], None], should_stop: Callable[[], bool]) -> None:
    """Run one job (a run, a grid group of madsl.runner.batched.grid, a pretraining run) to its end and
    report through `emit`, as a worker does. Never raises."""
    job.execute(emit, should_stop)


def train_job(job: RunJob, emit: Callable[[Event], None], should_stop: Callable[[], bool]) -> None:
    """Train a MAD run to its end and report through `emit`. Never raises."""
    from madsl.runner.train.loop import train_run

    def train(device: Any) -> tuple[Any, dict]:
        inputs = job_inputs(job)
        result = train_run(
            job.train,
            inputs.build_model,
            inputs.train_data,
            inputs.test_data,
            num_classes=inputs.num_classes,
            device=device,
            checkpoint_path=Path(job.checkpoint_path),
            hooks=job_hooks(job, emit, should_stop),
            length_data=inputs.length_data,
            run_id=job.run_id,
        )
        return result, {"build": inputs.build}

    report_run(job.run_id, job.device, emit, train)


def report_run(
    run_id: str, device_name: str, emit: Callable[[Event], None], train: Callable[[Any], tuple[Any, dict]]
) -> None:
    """Train one run with `train(device)` -> (its RunResult, more of the finished event's data) and
    report it: started, then finished, interrupted (a stop: its checkpoint holds it) or failed. Never raises."""
    import torch

    from madsl.runner.train.device import resolve_device
    from madsl.runner.train.loop import RunInterrupted

    try:
        device = resolve_device(device_name)
        emit(Event("started", run_id, {"pid": os.getpid(), "device": str(device)}))
        result, more = train(device)
        emit(
            Event(
                "finished",
                run_id,
                {"result": result.to_dict(), "device": str(device), **more, "threads": torch.get_num_threads()},
            )
        )
    except RunInterrupted as err:
        emit(Event("interrupted", run_id, {"message": str(err)}))
    except BaseException as err:  # noqa: BLE001 - report, never take the executor down
        emit(Event("failed", run_id, {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}))


def is_group(job: Any) -> bool:
    """A grid group (`madsl.runner.batched.grid.GroupJob`): several runs executed as one job."""
    return getattr(job, "members", None) is not None


def run_ids(job: Any) -> list[str]:
    """The runs a submitted job stands for: itself, or a group's members."""
    return [m.run_id for m in job.members] if is_group(job) else [job.run_id]
