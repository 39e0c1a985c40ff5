"""The coordinator (`run_jobs`): claims runs in the results store, hands them to an executor,
writes what their events report, and tells a `Reporter`. Interrupted runs go back to pending,
so the next evaluation resumes them; a run another live process holds is waited for.
"""

from __future__ import annotations

import collections
import dataclasses
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from madsl.errors import MadslError
from madsl.runner.execute.jobs import Event, RunJob, is_group, run_ids
from madsl.runner.execute.local import Executor
from madsl.runner.store.files import discard_checkpoint

HEARTBEAT_EVERY_S = 30.0


class Reporter:
    """What an evaluation tells the user; the default says nothing. `plan` comes first, before
    any run, where the reporter asks for it (`shows_plan`); `planning` reports on the plan's
    slower parts meanwhile (what, done, total: e.g. measuring this machine's training rate)."""

    shows_plan = False

    def planning(self, what: str, done: int, total: int) -> None: ...

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


def run_jobs(
    store,
    jobs: list[RunJob],
    executor: Executor,
    reporter: Reporter | None = None,
    skip_solved_at: float | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
    wait_poll_s: float = 2.0,
) -> Outcome:
    """Claim, execute and record `jobs` (already registered in `store`).

    skip_solved_at: skip a job when a done run of the same setting (other lr/wd)
    reached this eval accuracy. stop_requested: polled; once true, no new job
    starts and running ones are asked to checkpoint and stop.
    """
    return Coordinator(store, jobs, executor, reporter, skip_solved_at, stop_requested, wait_poll_s).run()


class Coordinator:
    """The one writer of the store during a sweep: it claims runs, hands them to an executor
    and records what the executor's events report."""

    def __init__(
        self,
        store,
        jobs: list[RunJob],
        executor: Executor,
        reporter: Reporter | None = None,
        skip_solved_at: float | None = None,
        stop_requested: Callable[[], bool] = lambda: False,
        wait_poll_s: float = 2.0,
    ):
        from madsl.runner.common.process import owner_tag

        self.store, self.executor, self.reporter = store, executor, reporter or Reporter()
        self.skip_solved_at, self.stop_requested, self.wait_poll_s = skip_solved_at, stop_requested, wait_poll_s
        self.owner = owner_tag()
        self.outcome = Outcome()
        self.todo = collections.deque(jobs)  # runs and grid groups (madsl.runner.batched.grid)
        self.waiting: list[RunJob] = []  # claimed by another live process: check back later
        self.active: dict[str, RunJob] = {}
        self.slot_of: dict[str, int] = {}  # active run id -> the submission it runs in (a group: one slot)
        self.submitted = 0
        runs = [run for job in jobs for run in (job.members if is_group(job) else [job])]
        self.by_id = {run.run_id: run for run in runs}
        self.stopping = False
        self.last_heartbeat = time.monotonic()
        self.initially_done = {
            r.run_id for r in runs if (row := store.run(r.run_id)) is not None and row["status"] == "done"
        }

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
        if (
            self.skip_solved_at is not None
            and (sibling := store.solved_sibling(job.run_id, self.skip_solved_at))
            and store.mark_skipped(job.run_id, f"solved by {sibling}")
        ):  # else done, or running elsewhere
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
            self.reporter.message(f"retrying {job.label} (attempt {data['attempt']}, its node was lost) from {where}")

    def _on_length(self, job: RunJob, data: dict) -> None:
        self.store.heartbeat([job.run_id], self.owner)
        self.reporter.length(job, data["length"], data["index"], data["count"])

    def _on_epoch(self, job: RunJob, data: dict) -> None:
        if self.store.record_epoch(job.run_id, data["metrics"], self.owner):
            self.store.heartbeat([job.run_id], self.owner)
        self.reporter.epoch(job, data["metrics"])

    def _on_finished(self, job: RunJob, data: dict) -> None:
        if not self.store.finish(job.run_id, data["result"], data.get("device"), self.owner, data.get("threads")):
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
        from madsl.runner.store.kept import keep_best

        spec = getattr(job.model_factory, "spec", None)
        try:
            kept = keep_best(
                job.run_id,
                Path(job.checkpoint_path),
                self.store.files_dir,
                getattr(spec, "data", None),
                data.get("build") or {},
                data["result"],
                getattr(job.task, "name", str(job.task)),
                dict(job.setting),
            )
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
        self.reporter.message(
            f"{job.label}: another process took this run over while this one's heartbeat "
            f"was stale; waiting for its result"
        )

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
