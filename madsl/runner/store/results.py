"""The results store: one SQLite database (WAL mode) with every run, its status,
its per-epoch metrics and the specs they belong to (its tables and the check of a --db
path: `madsl.runner.store.database`).

A run is registered under its identity (`RunIdentity`: spec, task, setting, training
settings, madsl version), whose hash is its run id: the same identity always gives the
same run id and result.

Status: pending -> running -> done | failed (| skipped). A run marked done is
never run again. A "running" run whose owner process died (same host, pid gone)
or whose heartbeat is older than `stale_after_s` can be claimed again and
resumes from its checkpoint. Checkpoints live in a folder beside the database:
`<db without suffix>.files/checkpoints/<run_id>.pt`; generated task data is
cached in `<...>.files/data/` (that folder and its rules: `madsl.runner.store.files`).

Every write is one transaction; only the coordinating process writes (workers
report through events), so concurrency is limited to several `madsl eval`
processes sharing a database, which claims make safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from madsl.oserrors import os_error_words
from madsl.runner.common.process import owner_is_dead, owner_tag, pid_alive  # noqa: F401 (also theirs from here)
from madsl.runner.store.database import (
    ADDED_RUN_COLUMNS,
    EPOCH_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    TABLES,
    StoreError,
    check_database,
)
from madsl.runner.store.files import StoreFiles

DEFAULT_DB = "madsl-results.db"

STALE_AFTER_S = 600.0  # a running run whose heartbeat is this old is presumed dead


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"not JSON serializable: {value!r}")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def madsl_version() -> str:
    """madsl's version, as run ids record it: the package's own, installed or not (a source
    checkout and its install give a run the same id)."""
    from madsl._version import __version__

    return __version__


@dataclass(frozen=True)
class RunIdentity:
    """What makes a run: the same identity always gives the same run id and result."""

    spec_hash: str
    task: str
    setting: Mapping[str, Any]
    train_config: Mapping[str, Any]  # lr, wd, epochs, batch size, seed, min lr, early stop, eval lengths
    madsl_version: str

    @property
    def run_id(self) -> str:
        return sha256(
            canonical_json(
                {
                    "spec": self.spec_hash,
                    "task": self.task,
                    "setting": self.setting,
                    "train": self.train_config,
                    "madsl": self.madsl_version,
                }
            )
        )


class Store(StoreFiles):
    """Access to one results database. Not shared across processes: open one per process.

    create=False (reading, as `madsl report`): the database must exist. Either way a
    path that is not a madsl results database raises StoreError and is left untouched.
    """

    def __init__(self, path: str | os.PathLike = DEFAULT_DB, stale_after_s: float = STALE_AFTER_S, create: bool = True):
        super().__init__(path)
        self.stale_after_s = stale_after_s
        check_database(self.path, create)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)  # we manage transactions
            self.conn.row_factory = sqlite3.Row
            self._open(create)
        except OSError as err:
            raise StoreError(self.path, f"cannot be opened: {os_error_words(err)} ({err})") from None
        except sqlite3.Error as err:
            raise StoreError(self.path, f"cannot be opened ({err})") from None

    def _open(self, create: bool) -> None:
        if create:
            self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        tables = {row[0] for row in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if create and not set(TABLES) <= tables:
            self.conn.executescript(f"BEGIN IMMEDIATE;{SCHEMA}COMMIT;")  # idempotent: IF NOT EXISTS
        elif not create:  # a reader writes nothing: tables the file lacks read as empty ones of its own
            for table in set(TABLES) - tables:
                self.conn.execute(TABLES[table].replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
        for column in ADDED_RUN_COLUMNS:  # added within schema 1; readers do without
            if create and column not in self._run_columns():
                with self.transaction() as c:
                    if column not in self._run_columns():  # another eval may have just added it
                        c.execute(f"ALTER TABLE runs ADD COLUMN {column} INTEGER")
        if create and self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() is None:
            with self.transaction() as c:  # a new database (reading one changes nothing)
                c.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _run_columns(self) -> set[str]:
        return {row[1] for row in self.conn.execute("PRAGMA table_info(runs)")}

    # --- plumbing ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error): writes are all or nothing."""
        if self.conn.in_transaction:
            yield self.conn
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    # --- registering ------------------------------------------------------------------
    def add_spec(self, spec_hash: str, name: str, identity: str, path: str | None) -> None:
        with self.transaction() as c:
            c.execute(
                "INSERT INTO specs (spec_hash, name, identity, path, created) VALUES (?,?,?,?,?) "
                "ON CONFLICT(spec_hash) DO UPDATE SET name=excluded.name, "
                "path=COALESCE(excluded.path, specs.path)",
                (spec_hash, name, identity, path, time.time()),
            )

    def add_runs(self, runs: Sequence[tuple[RunIdentity, str]], protocol: str) -> None:
        """Register runs (identity, spec name) as pending unless they exist; label them with the protocol."""
        now = time.time()
        with self.transaction() as c:
            for identity, spec_name in runs:
                tc = identity.train_config
                setting = canonical_json(identity.setting)
                c.execute(
                    "INSERT OR IGNORE INTO runs (run_id, spec_hash, spec_name, task, setting, setting_hash, lr, wd, "
                    "epochs, batch_size, seed, train_config, madsl_version, status, created) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,'pending',?)",
                    (
                        identity.run_id,
                        identity.spec_hash,
                        spec_name,
                        identity.task,
                        setting,
                        sha256(setting),
                        tc["lr"],
                        tc["wd"],
                        tc["epochs"],
                        tc["batch_size"],
                        tc["seed"],
                        canonical_json(tc),
                        identity.madsl_version,
                        now,
                    ),
                )
                c.execute("INSERT OR IGNORE INTO run_labels VALUES (?,?)", (identity.run_id, protocol))

    # --- claiming and status ----------------------------------------------------------
    def claim(self, run_id: str, owner: str | None = None, retry_failed: bool = True) -> str | None:
        """Atomically take a run to execute. Returns the previous status ('pending', 'failed',
        'skipped' or 'running' for a dead owner's run), or None if it is done or taken."""
        owner = owner or owner_tag()
        now = time.time()
        with self.transaction() as c:
            row = c.execute("SELECT status, owner, heartbeat FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                raise KeyError(run_id)
            status = row["status"]
            if status == "done" or (status == "failed" and not retry_failed):
                return None
            if status == "running" and not owner_is_dead(row["owner"], row["heartbeat"], self.stale_after_s, now):
                return None
            c.execute(
                "UPDATE runs SET status='running', owner=?, heartbeat=?, attempts=attempts+1, "
                "started=COALESCE(started, ?), error=NULL WHERE run_id=?",
                (owner, now, now, run_id),
            )
            return status

    def heartbeat(self, run_ids: Sequence[str], owner: str | None = None) -> None:
        owner = owner or owner_tag()
        with self.transaction() as c:
            c.executemany(
                "UPDATE runs SET heartbeat=? WHERE run_id=? AND owner=? AND status='running'",
                [(time.time(), r, owner) for r in run_ids],
            )

    def release(self, run_id: str, status: str = "pending", error: str | None = None, owner: str | None = None) -> None:
        """Give a claimed run back (interrupted -> pending, or failed with its error)."""
        owner = owner or owner_tag()
        with self.transaction() as c:
            c.execute(
                "UPDATE runs SET status=?, owner=NULL, heartbeat=NULL, error=? "
                "WHERE run_id=? AND owner=? AND status='running'",
                (status, error, run_id, owner),
            )

    def mark_skipped(self, run_id: str, reason: str) -> bool:
        """Skip a run that no live process runs (pending, failed, or a dead owner's); whether it is skipped."""
        with self.transaction() as c:
            row = c.execute("SELECT status, owner, heartbeat FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                raise KeyError(run_id)
            status = row["status"]
            if status == "running" and owner_is_dead(row["owner"], row["heartbeat"], self.stale_after_s, time.time()):
                status = "pending"  # its process died: nobody will finish it
            if status in ("pending", "failed"):
                c.execute(
                    "UPDATE runs SET status='skipped', owner=NULL, heartbeat=NULL, error=? WHERE run_id=?",
                    (reason, run_id),
                )
                return True
            return status == "skipped"

    def record_epoch(self, run_id: str, metrics: Mapping[str, Any], owner: str | None = None) -> bool:
        """Write one epoch's metrics; with `owner`, only while that process holds the run (whether written)."""
        with self.transaction() as c:
            if owner is not None and not self._holds(c, run_id, owner):
                return False
            self._write_epoch(c, run_id, metrics)
            return True

    @staticmethod
    def _holds(c: sqlite3.Connection, run_id: str, owner: str) -> bool:
        """Whether `owner` runs `run_id` now. A process whose heartbeat went stale while it lived (it
        was suspended, or its host lost the shared disk) may have been taken over: then the run and
        what it records are the new owner's, and the old one's late epochs and result are not."""
        row = c.execute("SELECT status, owner FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return row is not None and row["status"] == "running" and row["owner"] == owner

    @staticmethod
    def _write_epoch(c: sqlite3.Connection, run_id: str, m: Mapping[str, Any]) -> None:
        c.execute(
            f"INSERT OR REPLACE INTO epochs (run_id, epoch, {', '.join(EPOCH_COLUMNS)}) "
            f"VALUES (?, ?, {', '.join('?' * len(EPOCH_COLUMNS))})",
            (run_id, m["epoch"], *(m.get(k) for k in EPOCH_COLUMNS)),
        )

    def finish(
        self,
        run_id: str,
        result: Mapping[str, Any],
        device: str | None = None,
        owner: str | None = None,
        threads: int | None = None,
    ) -> bool:
        """One transaction: every epoch, the length evaluations, the best metrics, status done.
        With `owner`, only if that process still holds the run (see `_holds`); whether it was recorded."""
        best = result["best"]
        with self.transaction() as c:
            if owner is not None and not self._holds(c, run_id, owner):
                return False
            for m in result["history"]:
                self._write_epoch(c, run_id, m)
            # an attempt resumed from an older checkpoint can end sooner than the lost one that reported
            # further epochs (checkpoints are once a minute): the run's epochs are its result's
            c.execute(
                "DELETE FROM epochs WHERE run_id=? AND epoch>?",
                (run_id, max((int(m["epoch"]) for m in result["history"]), default=0)),
            )
            for ev in result.get("length_evals", []):
                c.execute(
                    "INSERT OR REPLACE INTO length_evals VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        run_id,
                        ev["length"],
                        ev["status"],
                        ev.get("seconds"),
                        ev.get("loss"),
                        ev.get("ppl"),
                        ev.get("acc"),
                        ev.get("macro_acc"),
                        ev.get("error"),
                    ),
                )
            c.execute(
                "UPDATE runs SET status='done', owner=NULL, heartbeat=NULL, finished=?, device=COALESCE(?, device), "
                "train_seconds=?, epochs_done=?, best_epoch=?, best_eval_loss=?, best_eval_ppl=?, best_eval_acc=?, "
                "best_eval_token_acc=?, max_eval_acc=?, early_stopped=?, diverged_epoch=?, threads=?, error=NULL "
                "WHERE run_id=?",
                (
                    time.time(),
                    device,
                    result["train_seconds"],
                    result["epochs_done"],
                    result["best_epoch"],
                    best["eval_loss"],
                    best["eval_ppl"],
                    best["eval_macro_acc"],
                    best["eval_acc"],
                    result["max_eval_macro_acc"],
                    int(result["early_stopped"]),
                    result.get("diverged_epoch"),
                    threads,
                    run_id,
                ),
            )
            return True

    # --- reading ----------------------------------------------------------------------
    def run(self, run_id: str) -> sqlite3.Row | None:
        return self.conn.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()

    def runs(self, status: str | None = None) -> list[sqlite3.Row]:
        if status is None:
            return self.conn.execute("SELECT * FROM runs ORDER BY created, run_id").fetchall()
        return self.conn.execute("SELECT * FROM runs WHERE status=? ORDER BY created, run_id", (status,)).fetchall()

    def epochs(self, run_id: str) -> list[sqlite3.Row]:
        return self.conn.execute("SELECT * FROM epochs WHERE run_id=? ORDER BY epoch", (run_id,)).fetchall()

    def length_evals(self, run_id: str) -> list[sqlite3.Row]:
        return self.conn.execute("SELECT * FROM length_evals WHERE run_id=? ORDER BY length", (run_id,)).fetchall()

    def all_length_evals(self) -> dict[str, list[sqlite3.Row]]:
        """run_id -> its length evaluations, by length."""
        out: dict[str, list[sqlite3.Row]] = {}
        for row in self.conn.execute("SELECT * FROM length_evals ORDER BY run_id, length"):
            out.setdefault(row["run_id"], []).append(row)
        return out

    def labels(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for row in self.conn.execute("SELECT run_id, protocol FROM run_labels ORDER BY protocol"):
            out.setdefault(row[0], []).append(row[1])
        return out

    def specs(self) -> dict[str, sqlite3.Row]:
        return {row["spec_hash"]: row for row in self.conn.execute("SELECT * FROM specs")}

    def solved_sibling(self, run_id: str, threshold: float) -> str | None:
        """A done run of the same spec, task, setting, seed and budget that reached `threshold`."""
        row = self.run(run_id)
        if row is None:
            return None
        hit = self.conn.execute(
            "SELECT run_id FROM runs WHERE spec_hash=? AND task=? AND setting_hash=? AND seed=? AND epochs=? "
            "AND batch_size=? AND status='done' AND best_eval_acc>=? AND run_id!=? LIMIT 1",
            (
                row["spec_hash"],
                row["task"],
                row["setting_hash"],
                row["seed"],
                row["epochs"],
                row["batch_size"],
                threshold,
                run_id,
            ),
        ).fetchone()
        return hit[0] if hit else None
