"""The results store refuses every --db that is not (and cannot become) a madsl results database.

`madsl eval` and `madsl report` exit 2 with a message naming the path and no traceback;
a file that belongs to something else is left byte for byte as it was, and `eval`
creates no database before it has checked its input.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from madsl.cli import main
from madsl.runner.store.database import SCHEMA_VERSION
from madsl.runner.store.results import Store

SPEC = str(Path(__file__).resolve().parent.parent / "specs" / "paper" / "hyena-sg.mad")
EVAL = ["eval", SPEC, "--task", "memorization", "--protocol", "smoke", "--quiet"]


def _sqlite(path: Path, *statements: str) -> None:
    with sqlite3.connect(path) as conn:
        for statement in statements:
            conn.execute(statement)


def _make(kind: str, tmp: Path) -> Path:
    """A bad --db of the given kind; returns the path to pass."""
    if kind == "directory":
        (tmp / "dir.db").mkdir()
        return tmp / "dir.db"
    if kind == "under a file":
        (tmp / "file").write_text("x")
        return tmp / "file" / "r.db"
    path = tmp / "r.db"
    if kind == "random bytes":
        path.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)))
    elif kind == "text file":
        path.write_text("name,score\nhyena,0.8\n")
    elif kind == "another program's SQLite":
        _sqlite(path, "CREATE TABLE users (name TEXT)", "INSERT INTO users VALUES ('ada')")
    elif kind == "newer schema":
        _sqlite(
            path,
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY)",
            f"INSERT INTO meta VALUES ('schema_version', '{SCHEMA_VERSION + 1}')",
        )
    elif kind == "files folder is a file":
        Store(path).close()
        (tmp / "r.files").write_text("x")
    return path


BAD = [
    "directory",
    "under a file",
    "random bytes",
    "text file",
    "another program's SQLite",
    "newer schema",
    "files folder is a file",
]


@pytest.mark.parametrize("kind", BAD)
def test_an_unusable_db_is_a_clear_error_for_eval_and_report(tmp_path, capsys, kind):
    db = _make(kind, tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    commands = [[*EVAL, "--db", str(db)]]
    if kind != "files folder is a file":  # report only reads: it needs no files folder
        commands.append(["report", "--db", str(db)])
    for argv in commands:
        assert main(argv) == 2, argv[0]
        err = capsys.readouterr().err
        assert str(db) in err and "Traceback" not in err, err
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # left untouched: no tables added, no WAL switch, no -wal / -shm files


def test_a_newer_schema_asks_for_a_newer_madsl(tmp_path, capsys):
    db = _make("newer schema", tmp_path)
    assert main(["report", "--db", str(db)]) == 2
    assert f"schema version {SCHEMA_VERSION + 1}" in capsys.readouterr().err


def test_eval_creates_no_database_before_it_rejects_bad_input(tmp_path, capsys):
    db = tmp_path / "new.db"
    assert main([*EVAL, "--set", "no_such_knob=1", "--db", str(db)]) == 2
    assert "no_such_knob" in capsys.readouterr().err
    assert not db.exists() and not (tmp_path / "new.files").exists()


def test_an_empty_file_becomes_a_database_and_report_only_reads_it(tmp_path, capsys):
    db = tmp_path / "r.db"
    db.touch()  # e.g. made by mktemp: SQLite reads an empty file as an empty database
    Store(db).close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta").fetchone() == (str(SCHEMA_VERSION),)
    conn.close()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["report", "--db", str(db)]) == 0
    assert "no runs" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("kind", ["empty file", "sqlite without tables"])
def test_report_on_an_empty_database_writes_nothing(tmp_path, capsys, kind):
    db = tmp_path / "r.db"
    db.touch()
    if kind == "sqlite without tables":  # e.g. a database another program has just created
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA user_version=7")
        conn.close()
    before = db.read_bytes()
    assert main(["report", "--db", str(db)]) == 0
    assert "no runs" in capsys.readouterr().out
    assert db.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["r.db"]


def test_a_database_from_before_the_divergence_flag_keeps_working(tmp_path):
    from runner_helpers import run_toy_eval

    from madsl.runner.reports.outputs import report

    db = tmp_path / "r.db"
    run_toy_eval(db, epochs=1)
    with sqlite3.connect(db) as conn:  # as madsl wrote schema 1 before runs.diverged_epoch existed
        conn.execute("ALTER TABLE runs DROP COLUMN diverged_epoch")
    conn.close()
    [task] = [r for r in json.loads(report(db, fmt="json")) if not r["aggregate"]]  # report only reads
    assert task["runs_diverged"] == 0 and task["runs_done"] == 1
    with sqlite3.connect(db) as conn:
        assert "diverged_epoch" not in {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    conn.close()
    assert run_toy_eval(db, epochs=2)["done"] == 1  # eval adds the column and records into it
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runs WHERE diverged_epoch IS NULL").fetchone() == (2,)
    conn.close()


def test_finishing_a_run_drops_the_epochs_of_an_abandoned_attempt(tmp_path, monkeypatch):
    """A run resumed from a checkpoint older than its last reported epoch (checkpoints are once a
    minute) may end sooner than the attempt that was lost: its epochs are its result's, no more."""
    from runner_helpers import run_toy_eval

    results = []
    finish = Store.finish
    monkeypatch.setattr(
        Store,
        "finish",
        lambda self, run_id, result, device=None, owner=None, threads=None: (
            results.append(result) or finish(self, run_id, result, device, owner, threads)
        ),
    )
    db = tmp_path / "r.db"
    run_toy_eval(db, epochs=3)
    store = Store(db)
    [run], [result] = store.runs(), results
    for epoch in (4, 5):  # reported by an attempt that trained further before it was lost
        store.record_epoch(run["run_id"], {**result["history"][-1], "epoch": epoch})
    assert len(store.epochs(run["run_id"])) == 5
    store.finish(run["run_id"], result)
    assert [row["epoch"] for row in store.epochs(run["run_id"])] == [1, 2, 3]


class _StrayEvents:
    """A ThreadExecutor whose runs, once ended, are followed by what a lost worker might still
    send: an epoch and a contradicting end."""

    def __new__(cls, final_kind: str):
        from madsl.runner.execute.jobs import Event
        from madsl.runner.execute.local import ThreadExecutor

        class Stray(ThreadExecutor):
            def poll(self, timeout):
                events = super().poll(timeout)
                stray = []
                for event in events:
                    if event.kind == "finished":
                        last = event.data["result"]["history"][-1]
                        stray += [
                            Event("epoch", event.run_id, {"metrics": {**last, "epoch": 99}}),
                            Event(final_kind, event.run_id, {"error": "a late report", "reason": "late"}),
                        ]
                return events + stray

        return Stray()


@pytest.mark.parametrize("final_kind", ["failed", "skipped", "interrupted", "finished"])
def test_a_run_that_ended_takes_no_more_events(tmp_path, final_kind):
    """A run's first end is its end: a stray epoch or end after it (a lost worker's) changes
    nothing in the store or in the eval's counts."""
    from runner_helpers import epoch_rows, run_rows, run_toy_eval

    db = tmp_path / "r.db"
    summary = run_toy_eval(db, epochs=2, executor=_StrayEvents(final_kind))
    assert summary["done"] == 1 and not summary["failed"]
    [run] = run_rows(db)
    assert run["status"] == "done" and run["error"] is None
    assert [row[1] for row in epoch_rows(db)] == [1, 2]


def test_a_run_taken_over_keeps_the_new_owners_record(tmp_path, monkeypatch):
    """A process whose run was taken over (its heartbeat went stale while it lived) records
    neither the run's epochs nor its result; it waits for the new owner's."""
    from runner_helpers import run_rows, run_toy_eval

    from madsl.runner.execute import coordinator as executor

    db = tmp_path / "r.db"
    real_record = Store.record_epoch
    takeover, written = {}, []

    def record_epoch(self, run_id, metrics, owner=None):
        if not takeover:  # another process takes the run over after the first epoch
            with self.transaction() as c:
                c.execute("UPDATE runs SET owner='elsewhere:1' WHERE run_id=?", (run_id,))
            takeover["run_id"] = run_id
        written.append(real_record(self, run_id, metrics, owner))
        return written[-1]

    monkeypatch.setattr(Store, "record_epoch", record_epoch)

    def finish_elsewhere(self, run_id, result, device=None, owner=None, threads=None):  # the new owner finishes
        written = Store._finish(self, run_id, result, device, owner, threads)
        if not written:
            Store._finish(self, run_id, {**result, "epochs_done": 7}, "elsewhere")
        return written

    monkeypatch.setattr(Store, "_finish", Store.finish, raising=False)
    monkeypatch.setattr(Store, "finish", finish_elsewhere)
    monkeypatch.setattr(executor.Coordinator, "__init__", _fast_wait(executor.Coordinator.__init__))
    messages = []

    class Recording(executor.Reporter):
        def message(self, text):
            messages.append(text)

    summary = run_toy_eval(db, epochs=2, reporter=Recording())
    [run] = run_rows(db)
    assert run["epochs_done"] == 7 and run["device"] == "elsewhere"  # the new owner's result, not overwritten
    assert written == [False, False]  # neither of this process's epochs
    assert summary["already_done"] == 1 and summary["done"] == 0 and not summary["failed"]  # done elsewhere
    assert any("took this run over" in m for m in messages)


def _fast_wait(init):
    def fast(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.wait_poll_s = 0.01

    return fast
