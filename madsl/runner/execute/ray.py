"""Runs on a Ray cluster: the `Executor` that `madsl eval --executor ray` uses.

The driver (the `madsl eval` process) stays the only writer of the results store.
Each run is one Ray task that calls `execute_job`, as a local worker does; its
events travel through an `EventHub` actor pinned to the driver's node, and the
driver drains them.

Checkpoints travel back to the driver: a worker writes its run's checkpoint to a
node-local temporary file (train.py does not change), and every time that file
changes the bytes go to the hub, which keeps the latest one per running run and
passes it on to the driver, which writes it to the store's checkpoint folder.
So a checkpoint outlives the node that wrote it, no shared filesystem is needed,
and the store's folder holds everything to resume, whichever executor resumes.

Faults:
    a node dies      Ray retries the task (`max_retries`) on a live node; the new
                     attempt asks the hub for the run's latest checkpoint and resumes
                     from it. Events of a superseded attempt are dropped by the hub,
                     so nothing is recorded twice.
    the driver dies  Ray ends the job's tasks; the store still says "running" under
                     the dead driver's pid, and the same command resumes those runs
                     from the checkpoints in the store's folder.
    Ctrl-C           `request_stop` raises the hub's stop flag; running tasks
                     checkpoint and report "interrupted", queued ones do not start.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from madsl.errors import MadslError, option
from madsl.runner.execute.jobs import TERMINAL, Event, RunJob, execute_job
from madsl.runner.execute.local import Executor

INSTALL = "pip install 'madsl[ray]'"
NODE_RETRIES = 3  # a run survives this many lost nodes
STOP_CHECK_EVERY_S = 0.25  # how often a worker asks the hub whether to stop
CONNECT_TIMEOUT_S = 5.0
CLOSE_GRACE_S = 120.0  # on close, how long running tasks get to checkpoint and report
SLOTS_REFRESH_S = 10.0


@dataclass(frozen=True)
class RayOptions:
    """How to reach the cluster and what one run asks of it."""

    address: str | None = None  # None: start a local Ray instance; "auto"; or HOST:PORT
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0

    def check(self) -> None:
        if not (self.cpus_per_run > 0 and math.isfinite(self.cpus_per_run)):
            raise MadslError(f"{option('cpus_per_run')} must be a positive number, got {self.cpus_per_run:g}")
        if not (self.gpus_per_run >= 0 and math.isfinite(self.gpus_per_run)):
            raise MadslError(
                f"{option('gpus_per_run')} must be zero or a positive number (fractions share a GPU), "
                f"got {self.gpus_per_run:g}"
            )


def import_ray():
    try:
        import ray
    except ImportError:
        raise MadslError(
            f"{option('executor')} ray needs Ray, which is not installed", hint=f"install it with: {INSTALL}"
        ) from None
    return ray


# --- connecting ----------------------------------------------------------------------------


def connect(address: str | None) -> bool:
    """Connect this process to Ray; returns True when it started a local instance (to shut down)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False, "include_dashboard": False}
    if address is None:
        ray.init(address="local", **options)  # sized to this machine: every core, every GPU
        return True
    resolved = _resolve_address(address)
    _probe(resolved, address)
    try:
        ray.init(address=resolved, **options)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise MadslError(
            f"{option('address')} {address}: cannot connect to a Ray cluster at {resolved}: {err}"
        ) from None
    return False


def _resolve_address(address: str) -> str:
    """HOST:PORT of the cluster; "auto" is the cluster `ray start` last started on this machine
    (or RAY_ADDRESS), as Ray itself resolves it."""
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError:  # Ray moved its helper: let ray.init resolve it
        return address
    try:
        return canonicalize_bootstrap_address_or_die(address)
    except (ConnectionError, ValueError) as err:
        raise MadslError(
            f"{option('address')} {address}: {err}",
            hint=f"start a cluster with `ray start --head`, or give {option('address')} HOST:PORT; "
            f"without {option('address')} a local Ray instance is started",
        ) from None


def _probe(resolved: str, address: str) -> None:
    """ray.init waits minutes for an unreachable cluster; a plain TCP connection answers in seconds."""
    host, _, port = resolved.rpartition(":")
    if not port.isdigit():
        raise MadslError(f"{option('address')} {address}: expected auto or HOST:PORT, got {resolved!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise MadslError(
            f"{option('address')} {address}: no Ray cluster answers at {resolved} ({err})",
            hint="is the head node up (`ray status` on it) and its GCS port reachable from here?",
        ) from None


# --- the hub: events and checkpoints, on the driver's node -----------------------------------


class EventHub:
    """A Ray actor: workers put events and checkpoints, the driver drains them.

    attempts: run id -> the attempt whose events count (a retry supersedes the lost one).
    checkpoints: run id -> the latest checkpoint bytes of a running run, for a retry to resume from.
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self.attempts: dict[str, int] = {}
        self.checkpoints: dict[str, bytes] = {}
        self.stopping = False

    def offer(self, run_id: str, checkpoint: bytes | None) -> None:
        """The driver's checkpoint of a run it submits (a run resumed after a restart)."""
        if checkpoint is None:
            self.checkpoints.pop(run_id, None)
        else:
            self.checkpoints[run_id] = checkpoint

    def begin(self, run_id: str) -> tuple[int, bytes | None]:
        attempt = self.attempts.get(run_id, 0) + 1
        self.attempts[run_id] = attempt
        return attempt, self.checkpoints.get(run_id)

    def put(self, run_id: str, attempt: int, kind: str, data: dict) -> None:
        if attempt != self.attempts.get(run_id):
            return  # from an attempt Ray gave up on (its node was presumed dead)
        self.events.append((run_id, kind, data))
        if kind in TERMINAL:
            self.checkpoints.pop(run_id, None)

    def checkpoint(self, run_id: str, attempt: int, data: bytes) -> None:
        if attempt != self.attempts.get(run_id):
            return
        self.checkpoints[run_id] = data
        self.events.append((run_id, "checkpoint", data))

    def drain(self) -> list[tuple[str, str, Any]]:
        events, self.events = self.events, []
        return events

    def stop(self) -> None:
        self.stopping = True

    def should_stop(self) -> bool:
        return self.stopping


class _HubLink:
    """A worker's side of the hub: emits events, ships the checkpoint file whenever it changed."""

    def __init__(self, ray, hub, run_id: str, attempt: int, checkpoint: Path, keep_best: bool = False):
        self.ray, self.hub, self.run_id, self.attempt, self.path = ray, hub, run_id, attempt, checkpoint
        self.keep_best = keep_best  # the driver keeps the best weights from the final checkpoint
        self.shipped = self._version()  # the checkpoint we started from is the hub's already
        self.last_put = None
        self.stopping, self.asked_at = False, -math.inf

    def _version(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size  # train.py replaces the file atomically

    def emit(self, event: Event) -> None:
        if event.kind != "finished" or self.keep_best:  # a finished run's result travels in its event,
            self._ship_checkpoint()  # its best weights (--keep best) in its final checkpoint
        self.last_put = self.hub.put.remote(self.run_id, self.attempt, event.kind, event.data)

    def _ship_checkpoint(self) -> None:
        version = self._version()
        if version is not None and version != self.shipped:
            self.shipped = version
            self.hub.checkpoint.remote(self.run_id, self.attempt, self.path.read_bytes())

    def should_stop(self) -> bool:
        now = time.monotonic()
        if not self.stopping and now - self.asked_at >= STOP_CHECK_EVERY_S:
            self.asked_at = now
            self.stopping = bool(self.ray.get(self.hub.should_stop.remote()))
        return self.stopping

    def flush(self) -> None:
        """Calls from one caller reach an actor in order: once the last one is in, all are."""
        if self.last_put is not None:
            self.ray.get(self.last_put)


def run_on_ray(job: RunJob, hub: Any, threads: int) -> None:
    """The Ray task of one run (a retry after a lost node runs this again and resumes)."""
    import ray
    import torch

    torch.set_num_threads(threads)  # as many threads as CPUs the task holds
    attempt, checkpoint = ray.get(hub.begin.remote(job.run_id))
    with tempfile.TemporaryDirectory(prefix="madsl-ray-") as workdir:
        local = Path(workdir) / Path(job.checkpoint_path).name
        if checkpoint is not None:
            local.write_bytes(checkpoint)
        link = _HubLink(ray, hub, job.run_id, attempt, local, job.keep_best)
        if attempt > 1:  # Ray lost the node of the attempt before
            link.emit(Event("retried", job.run_id, {"attempt": attempt, "from_checkpoint": checkpoint is not None}))
        if link.should_stop():
            link.emit(Event("interrupted", job.run_id, {"message": "not started"}))
        else:
            execute_job(dataclasses.replace(job, checkpoint_path=str(local)), link.emit, link.should_stop)
        link.flush()


# --- the executor --------------------------------------------------------------------------


class RayExecutor(Executor):
    """Runs each job as a Ray task holding `cpus_per_run` CPUs and `gpus_per_run` GPUs."""

    def __init__(self, options: RayOptions = RayOptions()):
        options.check()
        ray = import_ray()
        self.ray, self.options = ray, options
        self.started_here = connect(options.address)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        self.hub = ray.remote(EventHub).options(num_cpus=0, scheduling_strategy=here).remote()
        self.task = ray.remote(run_on_ray).options(
            num_cpus=options.cpus_per_run,
            num_gpus=options.gpus_per_run,
            max_retries=NODE_RETRIES,
            retry_exceptions=False,
        )  # execute_job reports its own errors; only lost nodes are retried
        self.threads = max(1, int(options.cpus_per_run))
        self.running: dict[Any, RunJob] = {}  # task ref -> its job
        self.jobs: dict[str, RunJob] = {}  # run id -> its job, for every job submitted
        self.reported: set[str] = set()  # run ids whose terminal event came through
        self.leftover: list[Event] = []  # drained while closing, handed out by the last poll
        self.closed = False
        self._slots, self._slots_at = 1, -math.inf

    @property
    def slots(self) -> int:
        """Runs the cluster holds at once, from its resources now (nodes come and go)."""
        if self.closed:
            return 1
        now = time.monotonic()
        if now - self._slots_at > SLOTS_REFRESH_S:
            resources = self.ray.cluster_resources()
            fit = resources.get("CPU", 0.0) / self.options.cpus_per_run
            if self.options.gpus_per_run > 0:
                fit = min(fit, resources.get("GPU", 0.0) / self.options.gpus_per_run)
            self._slots, self._slots_at = max(1, int(fit + 1e-9)), now
        return self._slots

    def submit(self, job: RunJob) -> None:
        path = Path(job.checkpoint_path)
        self.ray.get(self.hub.offer.remote(job.run_id, path.read_bytes() if path.exists() else None))
        self.reported.discard(job.run_id)
        self.jobs[job.run_id] = job
        if not self.options.gpus_per_run and job.device == "auto":
            # a task that holds no GPU still sees the node's GPUs (Ray leaves CUDA_VISIBLE_DEVICES alone)
            job = dataclasses.replace(job, device="cpu")
        self.running[self.task.remote(job, self.hub, self.threads)] = job

    def poll(self, timeout: float) -> list[Event]:
        if self.closed:
            events, self.leftover = self.leftover, []
            return events
        deadline = time.monotonic() + timeout
        while True:
            ended = self._ended_tasks()  # before draining: their last events are with the hub already
            events = self._receive(self.ray.get(self.hub.drain.remote()))
            events += self._silent_ends(ended)
            if events or time.monotonic() >= deadline:
                return events
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _ended_tasks(self) -> list[tuple[RunJob, BaseException | None]]:
        if not self.running:
            return []
        ready, _ = self.ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
        ended = []
        for ref in ready:
            job = self.running.pop(ref)
            try:
                self.ray.get(ref)
                ended.append((job, None))
            except Exception as err:  # noqa: BLE001 - retries exhausted, or the task could not start
                ended.append((job, err))
        return ended

    def _receive(self, raw: list[tuple[str, str, Any]]) -> list[Event]:
        events = []
        for run_id, kind, data in raw:
            if kind == "checkpoint":
                self._store_checkpoint(run_id, data)
                continue
            if kind in TERMINAL:
                self.reported.add(run_id)
            events.append(Event(kind, run_id, data))
        return events

    def _store_checkpoint(self, run_id: str, data: bytes) -> None:
        """Atomically, beside the store: the driver's copy outlives every worker node."""
        job = self.jobs.get(run_id)
        if job is None:
            return
        from madsl.outputs import write_bytes_atomic

        path = Path(job.checkpoint_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, data)

    def _silent_ends(self, ended: list[tuple[RunJob, BaseException | None]]) -> list[Event]:
        """A task that ended without its terminal event: Ray gave up on it (nodes lost, or it never started)."""
        events = []
        for job, err in ended:
            if job.run_id in self.reported:
                self.reported.discard(job.run_id)
                continue
            reason = f"{type(err).__name__}: {err}" if err is not None else "ended without reporting a result"
            events.append(Event("failed", job.run_id, {"error": f"lost on Ray: {reason}"[:2000], "traceback": ""}))
        return events

    def request_stop(self) -> None:
        self.ray.get(self.hub.stop.remote())

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self.running:  # running tasks checkpoint and report; the coordinator records it
                self.request_stop()
                deadline = time.monotonic() + CLOSE_GRACE_S
                while self.running and time.monotonic() < deadline:
                    self.leftover += self.poll(timeout=0.2)
                self.leftover += self.poll(timeout=0.0)
            self.ray.kill(self.hub)
        finally:
            self.closed = True
            if self.started_here:
                self.ray.shutdown()
