"""The executor interface and the two local executors. An executor takes `RunJob`s and reports
`Event`s; it never touches the results store. A distributed backend (Slurm, Ray, a job queue)
implements `Executor` (`submit`, `poll`, `request_stop`, `close`) and runs `execute_job` wherever
it likes (madsl.runner.execute.ray does so on Ray).

    ThreadExecutor      one run at a time in a background thread of this process (--workers 1)
    ProcessExecutor     a pool of N spawned worker processes (--workers N), each with
                        torch.set_num_threads(threads): madsl.runner.execute.threads.run_threads

Stopping (Ctrl-C): `request_stop` asks running jobs to checkpoint and report "interrupted".
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing as mp
import queue
import signal
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from madsl.runner.execute.jobs import TERMINAL, Event, RunJob, execute_job, run_ids
from madsl.runner.execute.threads import run_threads

SILENT_GRACE_S = 30.0  # a finished worker job's events must arrive within this


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
        self._worker = threading.Thread(
            target=execute_job,
            args=(job, self._events.put, self._stop.is_set),
            name=f"madsl-run-{job.run_id[:8]}",
            daemon=True,
        )
        self._worker.start()

    def poll(self, timeout: float) -> list[Event]:
        events = _drain(self._events, timeout)
        if self._worker is not None and not self._worker.is_alive():
            events += _drain(self._events, 0.0)
            self._worker = None
            if self._stop.is_set():
                while self._pending:
                    events += [
                        Event("interrupted", run_id, {"message": "not started"})
                        for run_id in run_ids(self._pending.popleft())
                    ]
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

    def __init__(self, workers: int, threads: int | None = None):
        self.slots = workers
        self.threads_per_worker = run_threads(workers, threads)
        self._context = mp.get_context("spawn")  # fork after torch has started threads can deadlock
        self._events = self._context.Queue()
        self._stop = self._context.Event()
        self._pool = self._new_pool()
        self._futures: dict[concurrent.futures.Future, Any] = {}  # -> the job (a run or a grid group)
        self._reported: set[str] = set()  # run ids whose terminal event arrived
        self._silent_since: dict[str, float] = {}

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=self.slots,
            mp_context=self._context,
            initializer=_worker_init,
            initargs=(self._events, self._stop, self.threads_per_worker),
        )

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
                events += [
                    Event("failed", run_id, {"error": f"worker died: {type(err).__name__}: {err}", "traceback": ""})
                    for run_id in silent
                ]
            elif now - self._silent_since.setdefault(ids[0], now) > SILENT_GRACE_S:
                # the job returned but its last events never arrived (the queue's feeder is async)
                del self._futures[future]
                events += [
                    Event("failed", run_id, {"error": "worker ended without reporting a result", "traceback": ""})
                    for run_id in silent
                ]
        return events

    def request_stop(self) -> None:
        self._stop.set()
        for future in self._futures:
            future.cancel()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


def make_executor(workers: int, threads: int | None = None) -> Executor:
    """`workers` local runs at once, each on `threads` torch threads (None: run_threads' default)."""
    threads = run_threads(workers, threads)
    return ThreadExecutor(threads) if workers <= 1 else ProcessExecutor(workers, threads)
