"""`--track tensorboard:DIR` / `--track mlflow:DIR` on `madsl eval`, `scale` and `search`: a runner
Reporter that syncs a run's tracker record (records.py) each time one of its epochs, or its end,
is recorded. It reads the run back from the results database the coordinator has just written, so
a run tracked live and the same run exported later (`madsl report --export`) are one record: an
export after a finished live run writes nothing new. It runs on the driver, where the coordinator
records events, so it works the same under Ray. A tracker that fails is said once, and the
evaluation goes on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from madsl.errors import MadslError
from madsl.report.export import KINDS, check_folder, sink
from madsl.runner.execute.coordinator import Reporter

log = logging.getLogger(__name__)


def parse_track(value: str, option: str = "--track") -> tuple[str, Path]:
    """`KIND:DIR` -> (kind, the checked folder); a MadslError naming the option otherwise."""
    kind, sep, folder = value.partition(":")
    if not sep or kind not in KINDS or not folder:
        raise MadslError(
            f"{option} {value!r}: not KIND:DIR",
            expected=", ".join(f"{k}:DIR" for k in KINDS),
            hint="e.g. --track tensorboard:runs/tb (then: tensorboard --logdir runs/tb)",
        )
    return kind, check_folder(kind, folder, option, force=True)


class TrackingReporter(Reporter):
    """Syncs each run's record into a tracker as the coordinator records it."""

    def __init__(self, kind: str, folder: Path, db: str | os.PathLike):
        self.kind, self.folder, self.db = kind, folder, Path(db)
        self.sink: Any = None
        self.store: Any = None
        self.failed: str | None = None
        self.searched: dict[str, list[str]] = {}

    def _sync(self, run_id: str) -> None:
        if self.failed is not None:
            return
        try:
            from madsl.report.collect import config_text, read_searches, run_record, search_of
            from madsl.runner.store.results import Store

            if self.sink is None:
                self.sink = sink(self.kind, self.folder)
                self.store = Store(self.db, create=False)
                self.searched = search_of(read_searches(self.db))
            row = self.store.run(run_id)
            if row is None:
                return
            record = run_record(
                row,
                self.store.epochs(run_id),
                self.store.length_evals(run_id),
                self.store.labels().get(run_id, []),
                self.store.specs().get(row["spec_hash"]),
                self.searched.get(row["spec_hash"], []),
            )
            self.sink.sync(record, config_text(record))
        except (MadslError, OSError, ImportError, RuntimeError, ValueError) as err:
            self.failed = str(err)
            log.warning("--track %s: stopped tracking (%s); the runs go on", self.kind, err)

    def epoch(self, job: Any, metrics: Mapping[str, Any]) -> None:
        self._sync(job.run_id)

    def ended(self, job: Any, status: str, detail: str = "") -> None:
        self._sync(job.run_id)

    def _sync_summaries(self) -> None:
        """The leaderboard rows and searches the runs changed, as the export writes them: after a
        tracked command, `madsl report --export` into the same folder writes nothing new."""
        if self.failed is not None:
            return
        try:
            from madsl.report.collect import config_text, read_database, score_records, search_records

            if self.sink is None:
                self.sink = sink(self.kind, self.folder)
            for record in search_records(read_database(self.db)) + score_records(self.db):
                self.sink.sync(record, config_text(record))
        except (MadslError, OSError, ImportError, RuntimeError, ValueError) as err:
            self.failed = str(err)
            log.warning("--track %s: stopped tracking (%s); the runs go on", self.kind, err)

    def close(self) -> None:
        if self.db.exists():
            self._sync_summaries()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.sink is not None:
            self.sink.close()


class Tee(Reporter):
    """Several reporters as one: each call goes to every one of them, in order."""

    def __init__(self, reporters: Sequence[Reporter]):
        self.reporters = list(reporters)
        self.shows_plan = any(r.shows_plan for r in self.reporters)

    def __getattribute__(self, name: str) -> Any:
        if name in ("planning", "plan", "planned", "started", "progress", "epoch", "length", "ended", "message"):
            reporters = object.__getattribute__(self, "reporters")
            if name == "plan":
                reporters = [r for r in reporters if r.shows_plan]
            return lambda *args, **kwargs: [getattr(r, name)(*args, **kwargs) for r in reporters] and None
        return object.__getattribute__(self, name)

    def __enter__(self) -> "Tee":
        for r in self.reporters:
            if hasattr(r, "__enter__"):
                r.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for r in reversed(self.reporters):
            if hasattr(r, "__exit__"):
                r.__exit__(*exc)
            if isinstance(r, TrackingReporter):
                r.close()


def tracked(reporter: Reporter | None, tracks: Sequence[tuple[str, Path]], db: str | os.PathLike) -> Reporter | None:
    """`reporter` with a TrackingReporter per `--track` (None and no tracks: None)."""
    trackers: list[Reporter] = [TrackingReporter(kind, folder, db) for kind, folder in tracks]
    if not trackers:
        return reporter
    return Tee(([reporter] if reporter is not None else []) + trackers)
