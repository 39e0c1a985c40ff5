"""Executing runs: the executor interface, two local executors, and the coordinator.

An executor takes `RunJob`s and reports `Event`s; it never touches the results
store. The coordinator (`run_jobs`) claims runs in the store, hands them to an
executor, and writes what the events report. A distributed backend (Slurm, Ray,
a job queue) implements `Executor` — `submit`, `poll`, `request_stop`, `close`
— and runs `execute_job` wherever it likes; train.py does not change.

    ThreadExecutor      one run at a time in a background thread of this process (--workers 1)
    ProcessExecutor     a pool of N spawned worker processes (--workers N), each with
                        torch.set_num_threads(max(1, cores // N))

Stopping (Ctrl-C): `request_stop` asks running jobs to checkpoint and report
"interrupted"; the coordinator gives those runs back as pending, so the next
`madsl eval` resumes them.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import multiprocessing as mp
import os
import queue
import signal
import sqlite3
import threading
import time
import traceback
from abc import ABC, abstractmethod
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from madsl.errors import MadslError
from madsl.runner.protocols import TrainSettings
from madsl.runner.store import discard_checkpoint

HEARTBEAT_EVERY_S = 30.0
PROGRESS_EVERY_S = 0.5
SILENT_GRACE_S = 30.0  # a finished worker job's events must arrive within this
TERMINAL = ("finished", "failed", "interrupted", "skipped")


class ModelFactory(Protocol):
    """Builds a fresh backbone with the compiler's interface (picklable for process pools)."""

    def __call__(self, vocab_size: int, max_seq_len: int, num_classes: int | None = None, seed: int = 0) -> Any: ...


@dataclass
class RunJob:
    """Everything a worker needs to execute one run (picklable)."""

    run_id: str
    task: Any  # a madsl.tasks Task
    setting: Mapping[str, Any]
    train: TrainSettings
    model_factory: ModelFactory
    checkpoint_path: str
    data_dir: str | None = None
    device: str = "auto"
    label: str = ""  # for progress displays
    keep_best: bool = False  # keep the best epoch's weights when the run finishes (madsl.runner.kept)
    checkpoint_every_s: float | None = None  # None: train.TrainHooks' default (a minute); 0: every epoch


@dataclass
class Event:
    kind: str  # started | progress | epoch | length | retried | finished | failed | interrupted | skipped
    run_id: str
    data: dict = field(default_factory=dict)


# --- what a worker does --------------------------------------------------------------------

def load_split(task: Any, setting: Mapping[str, Any], split: str, seed: int, data_dir: str | None):
    """Task data from the on-disk cache (generated on a miss)."""
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
    build: dict  # how the model was built, so that a kept model can be rebuilt (madsl.runner.kept)


def job_inputs(job: RunJob, load: Callable[..., Any] = load_split) -> JobInputs:
    """Load a job's splits (through `load(task, setting, split, seed, data_dir)`) and its model builder."""
    from madsl.runner.heads import TaskModel

    task, setting, seed = job.task, dict(job.setting), job.train.seed
    train_data = load(task, setting, "train", seed, job.data_dir)
    test_data = load(task, setting, "test", seed, job.data_dir)
    vocab_size = task.vocab_size(setting)
    num_classes = task.num_classes(setting)
    input_dim = task.input_dim(setting) if hasattr(task, "input_dim") else 0
    seq_len = max([int(train_data.inputs.shape[1]), *job.train.eval_lengths])
    head = getattr(task, "head", "lm")

    def build_model() -> TaskModel:
        # The backbone's own output layer serves lm / classify; compression and regress read features.
        out = num_classes if head in ("lm", "classify") and num_classes != vocab_size else None
        backbone = job.model_factory(vocab_size=vocab_size, max_seq_len=seq_len, num_classes=out, seed=seed)
        if job.train.freeze:  # hybrid fine-tuning: some layers keep their weights
            backbone.freeze(list(job.train.freeze))
        return TaskModel(backbone, head, num_classes=num_classes,
                         target_len=int(train_data.targets.shape[1]) if head == "compression" else None,
                         input_dim=input_dim,
                         compression_position=int(dict(train_data.meta).get("compression_position", -1)),
                         conventions=job.train.conventions, lm_head=job.train.lm_head)

    def length_data(length: int):
        return load(task, {**setting, "seq_len": length}, "test", seed, job.data_dir)

    build = {"vocab_size": vocab_size, "max_seq_len": seq_len, "num_classes": max(num_classes, 1),
             "backbone_num_classes": (num_classes if head in ("lm", "classify") and num_classes != vocab_size
                                      else None),
             "head": head, "input_dim": input_dim,
             "target_len": int(train_data.targets.shape[1]) if head == "compression" else None,
             "compression_position": int(dict(train_data.meta).get("compression_position", -1)),
             "conventions": job.train.conventions, "lm_head": job.train.lm_head}
    return JobInputs(train_data, test_data, max(num_classes, 1), build_model, length_data,
                     job.train.batch_size * max(int(train_data.inputs.shape[1]), 1), build)


def job_hooks(job: RunJob, emit: Callable[[Event], None], should_stop: Callable[[], bool]):
    """TrainHooks that report a job's progress, epochs and length evaluations as events."""
    from madsl.runner.train import TrainHooks

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
    return TrainHooks(on_epoch=on_epoch, on_progress=on_progress, should_stop=should_stop, on_length=on_length,
                      keep_best=job.keep_best, **every)


def execute_job(job: RunJob, emit: Callable[[Event], None], should_stop: Callable[[], bool]) -> None:
    """Run one job (or a grid group, `madsl.runner.grid`) to its end and report through `emit`. Never raises."""
    from madsl.runner.train import RunInterrupted, resolve_device, train_run

    if is_group(job):  # a GroupJob trains its members itself (madsl.runner.grid imports this module)
        return job.execute(emit, should_stop)
    try:
        device = resolve_device(job.device)
        emit(Event("started", job.run_id, {"pid": os.getpid(), "device": str(device)}))
        inputs = job_inputs(job)
        result = train_run(job.train, inputs.build_model, inputs.train_data, inputs.test_data,
                           num_classes=inputs.num_classes, device=device, checkpoint_path=Path(job.checkpoint_path),
                           hooks=job_hooks(job, emit, should_stop), length_data=inputs.length_data,
                           run_id=job.run_id)
        emit(Event("finished", job.run_id, {"result": result.to_dict(), "device": str(device), "build": inputs.build}))
    except RunInterrupted as err:
        emit(Event("interrupted", job.run_id, {"message": str(err)}))
    except BaseException as err:  # noqa: BLE001 - report, never take the executor down
        emit(Event("failed", job.run_id, {"error": f"{type(err).__name__}: {err}",
                                          "traceback": traceback.format_exc()}))


def is_group(job: Any) -> bool:
    """A grid group (`madsl.runner.grid.GroupJob`): several runs executed as one job."""
    return getattr(job, "members", None) is not None


def run_ids(job: Any) -> list[str]:
    """The runs a submitted job stands for: itself, or a group's members."""
    return [m.run_id for m in job.members] if is_group(job) else [job.run_id]


# --- executors -----------------------------------------------------------------------------

class Executor(ABC):
    """Runs jobs somewhere and reports their events. `slots`: how many run at once."""

    slots: int = 1

    @abstractmethod
    def submit(self, job: RunJob) -> None: ...

    @abstractmethod
    def poll(self, timeout: float) -> list[Event]:
        """Events since the last poll (waits up to `timeout` for the first)."""

    @abstractmethod
    def request_stop(self) -> None:
        """Ask running jobs to checkpoint and stop; jobs not yet started report interrupted."""

    @abstractmethod
    def close(self) -> None: ...


def _drain(events: "queue.Queue[Event]", timeout: float) -> list[Event]:
    out: list[Event] = []
    try:
        out.append(events.get(timeout=timeout))
        while True:
            out.append(events.get_nowait())
    except queue.Empty:
        pass
    return out


class ThreadExecutor(Executor):
    """Runs jobs one after another in a background thread of this process."""

    def __init__(self, threads: int | None = None):
        self.slots = 1
        self.threads = threads
        self._events: queue.Queue[Event] = queue.Queue()
        self._stop = threading.Event()
        self._pending: collections.deque[RunJob] = collections.deque()
        self._worker: threading.Thread | None = None

    def submit(self, job: RunJob) -> None:
        self._pending.append(job)
        self._start_next()

    def _start_next(self) -> None:
        if (self._worker is not None and self._worker.is_alive()) or not self._pending:
            return
        job = self._pending.popleft()
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
        self._worker = threading.Thread(target=execute_job, args=(job, self._events.put, self._stop.is_set),
                                        name=f"madsl-run-{job.run_id[:8]}", daemon=True)
        self._worker.start()

    def poll(self, timeout: float) -> list[Event]:
        events = _drain(self._events, timeout)
        if self._worker is not None and not self._worker.is_alive():
            events += _drain(self._events, 0.0)
            self._worker = None
            if self._stop.is_set():
                while self._pending:
                    events += [Event("interrupted", run_id, {"message": "not started"})
                               for run_id in run_ids(self._pending.popleft())]
            self._start_next()
        return events

    def request_stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self._worker is not None:
            self._worker.join()


# Set in each worker process by the pool initializer.
_WORKER_EVENTS: Any = None
_WORKER_STOP: Any = None


def _worker_init(events: Any, stop: Any, threads: int) -> None:
    global _WORKER_EVENTS, _WORKER_STOP
    for signum in (signal.SIGINT, signal.SIGTERM):  # sent to the whole group: the coordinator decides how to stop
        signal.signal(signum, signal.SIG_IGN)
    _WORKER_EVENTS, _WORKER_STOP = events, stop
    import torch

    torch.set_num_threads(threads)


def _worker_main(job: RunJob) -> None:
    execute_job(job, _WORKER_EVENTS.put, _WORKER_STOP.is_set)


class ProcessExecutor(Executor):
    """A pool of `workers` spawned processes; each runs one job at a time."""

    def __init__(self, workers: int, cores: int | None = None):
        cores = cores or os.cpu_count() or 1
        self.slots = workers
        self.threads_per_worker = max(1, cores // workers)
        self._context = mp.get_context("spawn")  # fork after torch has started threads can deadlock
        self._events = self._context.Queue()
        self._stop = self._context.Event()
        self._pool = self._new_pool()
        self._futures: dict[concurrent.futures.Future, Any] = {}  # -> the job (a run or a grid group)
        self._reported: set[str] = set()  # run ids whose terminal event arrived
        self._silent_since: dict[str, float] = {}

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=self.slots, mp_context=self._context, initializer=_worker_init,
            initargs=(self._events, self._stop, self.threads_per_worker))

    def submit(self, job: RunJob) -> None:
        try:
            future = self._pool.submit(_worker_main, job)
        except BrokenProcessPool:
            # a worker died (killed, out of memory): the pool failed its jobs (poll reports them)
            # and takes no more; the other runs go on in a new one
            self._pool.shutdown(wait=True)
            self._pool = self._new_pool()
            future = self._pool.submit(_worker_main, job)
        self._futures[future] = job

    def poll(self, timeout: float) -> list[Event]:
        events = _drain(self._events, timeout)
        self._reported.update(e.run_id for e in events if e.kind in TERMINAL)
        now = time.monotonic()
        for future in [f for f in self._futures if f.done()]:
            ids = run_ids(self._futures[future])
            silent = [run_id for run_id in ids if run_id not in self._reported]
            if not silent:  # its events came through: nothing more to say
                del self._futures[future]
                self._reported.difference_update(ids)
            elif future.cancelled():
                del self._futures[future]
                events += [Event("interrupted", run_id, {"message": "not started"}) for run_id in silent]
            elif future.exception() is not None:  # the worker process died (killed, out of memory)
                del self._futures[future]
                err = future.exception()
                events += [Event("failed", run_id, {"error": f"worker died: {type(err).__name__}: {err}",
                                                    "traceback": ""}) for run_id in silent]
            elif now - self._silent_since.setdefault(ids[0], now) > SILENT_GRACE_S:
                # the job returned but its last events never arrived (the queue's feeder is async)
                del self._futures[future]
                events += [Event("failed", run_id, {"error": "worker ended without reporting a result",
                                                    "traceback": ""}) for run_id in silent]
        return events

    def request_stop(self) -> None:
        self._stop.set()
        for future in self._futures:
            future.cancel()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


def make_executor(workers: int) -> Executor:
    return ThreadExecutor() if workers <= 1 else ProcessExecutor(workers)


# --- the coordinator -----------------------------------------------------------------------

class Reporter:
    """What an evaluation tells the user; the default says nothing. `plan` comes first, before
    any run, where the reporter asks for it (`shows_plan`: the estimate times a few steps)."""

    shows_plan = False

    def plan(self, cost: Mapping[str, Any], notes: Sequence[str]) -> None: ...

    def planned(self, total: int, already_done: int) -> None: ...

    def started(self, job: RunJob) -> None: ...

    def progress(self, job: RunJob, epoch: int, step: int, steps: int) -> None: ...

    def epoch(self, job: RunJob, metrics: Mapping[str, Any]) -> None: ...

    def length(self, job: RunJob, length: int, index: int, count: int) -> None: ...

    def ended(self, job: RunJob, status: str, detail: str = "") -> None: ...

    def message(self, text: str) -> None: ...


@dataclass
class Outcome:
    done: list[str] = field(default_factory=list)  # finished in this call
    already_done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # a sibling grid point solved the setting
    failed: dict[str, str] = field(default_factory=dict)
    interrupted: list[str] = field(default_factory=list)
    unkept: dict[str, str] = field(default_factory=dict)  # done, but --keep best could not keep its weights

    @property
    def complete(self) -> bool:
        return not self.failed and not self.interrupted


def run_jobs(store, jobs: list[RunJob], executor: Executor, reporter: Reporter | None = None,
             skip_solved_at: float | None = None, stop_requested: Callable[[], bool] = lambda: False,
             wait_poll_s: float = 2.0) -> Outcome:
    """Claim, execute and record `jobs` (already registered in `store`).

    skip_solved_at: skip a job when a done run of the same setting (other lr/wd)
    reached this eval accuracy. stop_requested: polled; once true, no new job
    starts and running ones are asked to checkpoint and stop.
    """
    return Coordinator(store, jobs, executor, reporter, skip_solved_at, stop_requested, wait_poll_s).run()


class Coordinator:
    """The one writer of the store during a sweep: it claims runs, hands them to an executor
    and records what the executor's events report."""

    def __init__(self, store, jobs: list[RunJob], executor: Executor, reporter: Reporter | None = None,
                 skip_solved_at: float | None = None, stop_requested: Callable[[], bool] = lambda: False,
                 wait_poll_s: float = 2.0):
        from madsl.runner.store import owner_tag

        self.store, self.executor, self.reporter = store, executor, reporter or Reporter()
        self.skip_solved_at, self.stop_requested, self.wait_poll_s = skip_solved_at, stop_requested, wait_poll_s
        self.owner = owner_tag()
        self.outcome = Outcome()
        self.todo = collections.deque(jobs)  # runs and grid groups (madsl.runner.grid)
        self.waiting: list[RunJob] = []  # claimed by another live process: check back later
        self.active: dict[str, RunJob] = {}
        self.slot_of: dict[str, int] = {}  # active run id -> the submission it runs in (a group: one slot)
        self.submitted = 0
        runs = [run for job in jobs for run in (job.members if is_group(job) else [job])]
        self.by_id = {run.run_id: run for run in runs}
        self.stopping = False
        self.last_heartbeat = time.monotonic()
        self.initially_done = {r.run_id for r in runs
                               if (row := store.run(r.run_id)) is not None and row["status"] == "done"}

    def run(self) -> Outcome:
        self.reporter.planned(len(self.by_id), len(self.initially_done))
        try:
            while self.todo or self.active or self.waiting:
                self._check_stop()
                self._fill_slots()
                if not self.todo and not self.active and self.waiting:
                    time.sleep(self.wait_poll_s)  # another process runs these; take them over if it dies
                    self.todo.extend(self.waiting)
                    self.waiting.clear()
                    continue
                for event in self.executor.poll(timeout=0.2):
                    self.handle(event)
                self._heartbeat()
        except sqlite3.OperationalError:  # the store cannot be written (a full disk)
            self._release_claims()
            raise
        finally:
            # on an abort (second Ctrl-C) the runs stay "running" under our pid: the next
            # eval sees the pid dead and resumes them from their checkpoints
            self.executor.close()
            for event in self.executor.poll(timeout=0.0):
                self.handle(event)
        return self.outcome

    def _release_claims(self) -> None:
        """Best effort, when the store failed: hand the runs in flight back as pending, so that the
        same command resumes them at once (from their checkpoints; a run whose result was not
        recorded finds it in its final checkpoint). On a disk still full this fails too, and the
        next eval takes the runs over once this process has ended, as after kill -9."""
        for run_id in list(self.active):
            try:
                self.store.release(run_id, "pending", None, self.owner)
            except sqlite3.Error:
                return

    # --- steps of the loop ------------------------------------------------------------
    def _check_stop(self) -> None:
        if not self.stopping and self.stop_requested():
            self.stopping = True
            self.executor.request_stop()
            self.reporter.message("stopping: running runs checkpoint and stop (Ctrl-C again to abort)")
        if self.stopping:
            for run_id in (i for j in [*self.todo, *self.waiting] for i in run_ids(j)):
                row = self.store.run(run_id)  # one done (before, or by another process) is not left to do
                done = row is not None and row["status"] == "done"
                (self.outcome.already_done if done else self.outcome.interrupted).append(run_id)
            self.todo.clear()
            self.waiting.clear()

    def _fill_slots(self) -> None:
        while self.todo and len({self.slot_of[r] for r in self.active}) < self.executor.slots:
            self._start(self.todo.popleft())

    def _start(self, job) -> None:
        """Submit a run, or the members of a grid group that `_admit` lets through (a group of one
        runs as that run, except with CUDA graphs: a stack of one, for its graphs)."""
        members = [run for run in (job.members if is_group(job) else [job]) if self._admit(run)]
        if not members:
            return
        self.submitted += 1
        for run in members:
            self.active[run.run_id] = run
            self.slot_of[run.run_id] = self.submitted
        alone = len(members) == 1 and not getattr(job, "graphs", False)
        self.executor.submit(members[0] if alone else dataclasses.replace(job, members=members))

    def _admit(self, job: RunJob) -> bool:
        """Claim `job` unless it is done, solved by a sibling, or claimed by another live process."""
        store, outcome = self.store, self.outcome
        if job.run_id in self.initially_done:
            outcome.already_done.append(job.run_id)
            return False
        if self.skip_solved_at is not None and (sibling := store.solved_sibling(job.run_id, self.skip_solved_at)) \
                and store.mark_skipped(job.run_id, f"solved by {sibling}"):  # else done, or running elsewhere
            discard_checkpoint(job.checkpoint_path)  # of a dead process's attempt
            outcome.skipped.append(job.run_id)
            self.reporter.ended(job, "skipped", "setting solved at another lr/wd")
            return False
        previous = store.claim(job.run_id, self.owner)
        if previous is None:
            if store.run(job.run_id)["status"] == "done":
                outcome.already_done.append(job.run_id)
                self.reporter.ended(job, "done", "finished elsewhere")
            else:
                self.waiting.append(job)
            return False
        if previous == "running":
            self.reporter.message(f"resuming {job.label} (its previous process died)")
        return True

    def _heartbeat(self) -> None:
        if self.active and time.monotonic() - self.last_heartbeat > HEARTBEAT_EVERY_S:
            self.store.heartbeat(list(self.active), self.owner)
            self.last_heartbeat = time.monotonic()

    # --- events -----------------------------------------------------------------------
    def handle(self, event: Event) -> None:
        # only a run in flight reports: one that ended (finished, failed, skipped, interrupted) has
        # no more to say, so a late or stray event (a lost worker's) cannot undo or repeat its end
        job = self.active.get(event.run_id)
        handler = getattr(self, f"_on_{event.kind}", None)
        if job is not None and handler is not None:
            handler(job, event.data)

    def _on_started(self, job: RunJob, data: dict) -> None:
        self.reporter.started(job)

    def _on_progress(self, job: RunJob, data: dict) -> None:
        self.reporter.progress(job, data["epoch"], data["step"], data["steps"])

    def _on_retried(self, job: RunJob, data: dict) -> None:  # its node was lost, or its stack ran out of memory
        where = "its last checkpoint" if data.get("from_checkpoint") else "the start"
        if "reason" in data:
            self.reporter.message(f"retrying {job.label} from {where}: {data['reason']}")
        else:
            self.reporter.message(f"retrying {job.label} (attempt {data['attempt']}, its node was lost) "
                                  f"from {where}")

    def _on_length(self, job: RunJob, data: dict) -> None:
        self.store.heartbeat([job.run_id], self.owner)
        self.reporter.length(job, data["length"], data["index"], data["count"])

    def _on_epoch(self, job: RunJob, data: dict) -> None:
        if self.store.record_epoch(job.run_id, data["metrics"], self.owner):
            self.store.heartbeat([job.run_id], self.owner)
        self.reporter.epoch(job, data["metrics"])

    def _on_finished(self, job: RunJob, data: dict) -> None:
        if not self.store.finish(job.run_id, data["result"], data.get("device"), self.owner):
            self._taken_over(job)
            return
        if job.keep_best:
            self._keep(job, data)
        discard_checkpoint(job.checkpoint_path)  # the store has it all now
        self.active.pop(job.run_id, None)
        self.outcome.done.append(job.run_id)
        self.reporter.ended(job, "done", _fmt_acc(data["result"]["best"].get("eval_macro_acc")))

    def _keep(self, job: RunJob, data: dict) -> None:
        """--keep best: the run's best weights from its final checkpoint, into the results folder."""
        from madsl.runner.kept import keep_best

        spec = getattr(job.model_factory, "spec", None)
        try:
            kept = keep_best(job.run_id, Path(job.checkpoint_path), self.store.files_dir,
                             getattr(spec, "data", None), data.get("build") or {}, data["result"],
                             getattr(job.task, "name", str(job.task)), dict(job.setting))
        except MadslError as err:  # a link planted under models/, a full disk: the run stays done, unkept
            self.reporter.message(f"{job.label}: its best weights were not kept: {err.message}")
            self.outcome.unkept[job.run_id] = err.message
            return
        if kept is None:
            self.reporter.message(f"{job.label}: no best weights to keep (the run finished before --keep best)")

    def _taken_over(self, job: RunJob) -> None:
        """Another process holds the run now: it took it over while this one's heartbeat was stale.
        Its result will be that process's (training is deterministic: the same one); this process
        leaves the checkpoint to it and waits for it, as for any run another live process runs."""
        self.active.pop(job.run_id, None)
        self.waiting.append(job)
        self.reporter.message(f"{job.label}: another process took this run over while this one's heartbeat "
                              f"was stale; waiting for its result")

    def _on_failed(self, job: RunJob, data: dict) -> None:
        self.store.release(job.run_id, "failed", data.get("traceback") or data["error"], self.owner)
        self.active.pop(job.run_id, None)
        self.outcome.failed[job.run_id] = data["error"]
        self.reporter.ended(job, "failed", data["error"])

    def _on_skipped(self, job: RunJob, data: dict) -> None:
        """A grid group stopped this member: a sibling in it solved the setting (skip_solved)."""
        self.store.release(job.run_id, "skipped", data["reason"], self.owner)
        discard_checkpoint(job.checkpoint_path)
        self.active.pop(job.run_id, None)
        self.outcome.skipped.append(job.run_id)
        self.reporter.ended(job, "skipped", "setting solved at another lr/wd")

    def _on_interrupted(self, job: RunJob, data: dict) -> None:
        self.store.release(job.run_id, "pending", None, self.owner)
        self.active.pop(job.run_id, None)
        self.outcome.interrupted.append(job.run_id)
        self.reporter.ended(job, "interrupted")


def _fmt_acc(value: float | None) -> str:
    return "" if value is None else f"acc {value:.3f}"
