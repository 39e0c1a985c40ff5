"""What `madsl eval` shows on the terminal and how it stops: the presentation of the runner.

The runner (madsl.runner) prints nothing: it tells a Reporter what happens and polls a stop
callable. Here are the command line's answers to both: rich progress bars and the plan
(`RichReporter`), what a dry run's plan is doing once it takes more than a second
(`PlanProgress`), the score table after an evaluation (`print_summary`), and Ctrl-C / SIGTERM
turned into a polite stop (`stop_on_signals`: the first asks the runs to checkpoint and stop,
the second aborts).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from madsl.runner.execute.coordinator import Reporter
from madsl.runner.execute.jobs import RunJob

PLANNING_SHOWN_AFTER_S = 1.0  # a plan that takes longer says what it is doing


class PlanProgress(Reporter):
    """A dry run's reporter: once the plan has taken PLANNING_SHOWN_AFTER_S, a line on stderr
    saying what it is at (`what`, then each stage the runner reports: accounting the runs,
    measuring this machine's training rate)."""

    def __init__(self, what: str) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
        self.what, self.said = what, set()
        self.started = time.monotonic()
        self.timer = threading.Timer(PLANNING_SHOWN_AFTER_S, self._say, args=(what,))
        self.timer.daemon = True

    def __enter__(self) -> "PlanProgress":
        self.started = time.monotonic()
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()

    def planning(self, what: str, done: int, total: int) -> None:
        stage = what.partition(":")[0]
        if time.monotonic() - self.started >= PLANNING_SHOWN_AFTER_S:
            self._say(f"{self.what}: {stage}")

    def _say(self, text: str) -> None:
        if text not in self.said:
            self.said.add(text)
            self.console.print(f"{text}...", highlight=False)


class RichReporter(Reporter):
    """Progress bars: one for all runs, one per running run (epochs), a line per finished run;
    the plan first."""

    shows_plan = True

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
        self.view = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.overall = None
        self.bars: dict[str, Any] = {}
        self.started_at: dict[str, float] = {}
        self.planning_bar: Any = None  # the plan's row, while it takes more than a second
        self.planned_yet = threading.Event()
        self.planning_lock = threading.Lock()  # the timer's thread and the plan's both report
        self.timer = threading.Timer(PLANNING_SHOWN_AFTER_S, self.planning, args=("planning", 0, 0))
        self.timer.daemon = True

    def __enter__(self) -> "RichReporter":
        self.view.start()
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.cancel()
        self._planned()
        self.view.stop()

    def planning(self, what: str, done: int, total: int) -> None:
        with self.planning_lock:
            if self.planned_yet.is_set():
                return
            if self.planning_bar is None:
                self.planning_bar = self.view.add_task(what, total=total or None, completed=done, info="")
            else:
                self.view.update(self.planning_bar, description=what, total=total or None, completed=done)

    def _planned(self) -> None:
        """The plan is shown (or the evaluation ends): its row goes."""
        self.timer.cancel()
        with self.planning_lock:
            self.planned_yet.set()
            if self.planning_bar is not None:
                self.view.remove_task(self.planning_bar)
                self.planning_bar = None

    def planned(self, total: int, already_done: int) -> None:
        self._planned()  # (a subclass's plan() may not say so)
        self.overall = self.view.add_task(
            "runs", total=total, completed=already_done, info=f"{already_done} already done" if already_done else ""
        )

    def started(self, job: RunJob) -> None:
        if job.run_id in self.bars:  # started again: retried after its node was lost
            self.view.remove_task(self.bars.pop(job.run_id))
        self.started_at[job.run_id] = time.monotonic()
        self.bars[job.run_id] = self.view.add_task(f"  {job.label}", total=job.train.epochs, info="starting")

    def progress(self, job: RunJob, epoch: int, step: int, steps: int) -> None:
        bar = self.bars.get(job.run_id)
        if bar is not None:
            self.view.update(
                bar, completed=epoch - 1 + step / steps, info=f"epoch {epoch}/{job.train.epochs} step {step}/{steps}"
            )

    def epoch(self, job: RunJob, metrics: Mapping[str, Any]) -> None:
        bar = self.bars.get(job.run_id)
        acc = metrics.get("eval_macro_acc")
        if bar is not None:
            self.view.update(
                bar,
                completed=metrics["epoch"],
                info=f"epoch {metrics['epoch']}"
                + (f" acc {acc:.3f}" if acc is not None else f" loss {metrics['eval_loss']:.3g}"),
            )

    def length(self, job: RunJob, length: int, index: int, count: int) -> None:
        bar = self.bars.get(job.run_id)
        if bar is not None:
            self.view.update(bar, info=f"evaluating at length {length:,} ({index + 1}/{count})")

    def ended(self, job: RunJob, status: str, detail: str = "") -> None:
        bar = self.bars.pop(job.run_id, None)
        if bar is not None:
            self.view.remove_task(bar)
        if self.overall is not None and status in ("done", "skipped", "failed"):
            self.view.advance(self.overall)
        mark = {
            "done": "[green]done[/]",
            "failed": "[red]failed[/]",
            "skipped": "[dim]skipped[/]",
            "interrupted": "[yellow]interrupted[/]",
        }.get(status, status)
        took = time.monotonic() - self.started_at.pop(job.run_id, time.monotonic())
        self.console.print(
            f"{mark} {job.label}"
            + (f"  {detail}" if detail else "")
            + (f"  ({took:.0f} s)" if status == "done" and took else ""),
            highlight=False,
        )

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def plan(self, cost: Mapping[str, Any], notes: Sequence[str]) -> None:
        """The plan (runs, tokens, FLOPs, estimated time) and how budgets were fitted, before any run."""
        from madsl.runner.plan.cost import render_cost

        self._planned()
        for note in notes:
            self.console.print(note, highlight=False)
        self.console.print(render_cost(cost), end="", highlight=False)


def print_summary(db: str | os.PathLike, summary: Mapping[str, Any]) -> None:
    """The score table and what is left to do, on the terminal."""
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)
    from madsl.runner.reports.outputs import load_scores, render_text

    console.print(
        render_text(load_scores(db, run_ids=summary["run_ids"]), width=console.width), end="", highlight=False
    )
    if summary["failed"]:
        console.print(
            f"[red]{len(summary['failed'])} run(s) failed[/]; rerun `madsl eval` to retry them "
            f"(errors are in the runs table of {db})",
            highlight=False,
        )
    if summary["interrupted"]:
        console.print(
            f"[yellow]interrupted[/]: {summary['interrupted']} run(s) left; rerun the same command to resume",
            highlight=False,
        )


# Ctrl-C, and the polite stop of batch systems and containers (SLURM's scancel and time limit,
# Kubernetes, `timeout`): SIGTERM, then SIGKILL after a grace period (SLURM: 30 s by default).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_on_signals(stop_requested: Callable[[], bool] | None = None) -> Iterator[Callable[[], bool]]:
    """Ctrl-C (or SIGTERM) handling while runs execute: the first asks runs to checkpoint and
    stop (the callable yielded turns true), the second aborts (KeyboardInterrupt)."""
    stop = threading.Event()
    previous_handlers: dict[int, Any] = {}

    def on_stop_signal(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    if threading.current_thread() is threading.main_thread():
        previous_handlers = {signum: signal.signal(signum, on_stop_signal) for signum in STOP_SIGNALS}
    try:
        yield (lambda: stop.is_set() or stop_requested()) if stop_requested else stop.is_set
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
