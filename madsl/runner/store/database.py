"""What a madsl results database is: its tables, and the check that a path holds one (or
can become one) before anything is written to it.

Tables (docs/runner.md has the full schema):
    specs         spec_hash -> name, identity text, path
    runs          one row per run identity: settings, status, owner, timings, best metrics
    epochs        (run_id, epoch) -> train/eval loss, perplexity, accuracies, lr, seconds
    length_evals  (run_id, length) -> evaluation of the best model at another sequence length
    run_labels    (run_id, protocol): which protocols asked for a run (a run can serve several)

Apart from the store (`madsl.runner.store.results`) because a command refuses a bad --db
(a folder, another program's SQLite file, a newer schema) by reading at most the file's
header and table list: nothing opened for writing, nothing changed.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from madsl.errors import Location, MadslError
from madsl.runner.store.files import check_files_dir, store_files_dir

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS specs (
    spec_hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    identity TEXT NOT NULL,
    path TEXT,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    spec_hash TEXT NOT NULL REFERENCES specs(spec_hash),
    spec_name TEXT NOT NULL,
    task TEXT NOT NULL,
    setting TEXT NOT NULL,          -- canonical JSON of the task setting
    setting_hash TEXT NOT NULL,
    lr REAL NOT NULL,
    wd REAL NOT NULL,
    epochs INTEGER NOT NULL,
    batch_size INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    train_config TEXT NOT NULL,     -- canonical JSON of all training settings
    madsl_version TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending','running','done','failed','skipped')),
    owner TEXT,                     -- host:pid of the process running it
    heartbeat REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    started REAL,
    finished REAL,
    device TEXT,
    train_seconds REAL,
    epochs_done INTEGER,
    best_epoch INTEGER,
    best_eval_loss REAL,
    best_eval_ppl REAL,
    best_eval_acc REAL,             -- class-averaged accuracy at the best (lowest eval ppl) epoch
    best_eval_token_acc REAL,       -- per-token accuracy at that epoch
    max_eval_acc REAL,              -- best class-averaged eval accuracy over all epochs
    early_stopped INTEGER,
    error TEXT,
    diverged_epoch INTEGER,         -- the epoch whose loss became NaN / inf (training stopped there)
    threads INTEGER                 -- torch's intra-op threads in the process that finished it (CPU sums differ by it)
);
CREATE INDEX IF NOT EXISTS runs_by_group ON runs (spec_hash, task, setting_hash, seed);
CREATE TABLE IF NOT EXISTS epochs (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    epoch INTEGER NOT NULL,
    lr REAL, seconds REAL,
    train_loss REAL, train_ppl REAL, train_acc REAL, train_macro_acc REAL,
    eval_loss REAL, eval_ppl REAL, eval_acc REAL, eval_macro_acc REAL,
    PRIMARY KEY (run_id, epoch)
);
CREATE TABLE IF NOT EXISTS length_evals (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    length INTEGER NOT NULL,
    status TEXT NOT NULL,           -- ok | oom | error
    seconds REAL, loss REAL, ppl REAL, acc REAL, macro_acc REAL, error TEXT,
    PRIMARY KEY (run_id, length)
);
CREATE TABLE IF NOT EXISTS run_labels (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    protocol TEXT NOT NULL,
    PRIMARY KEY (run_id, protocol)
);
"""

# columns of `runs` added after databases of schema 1 were written: added on open, read as NULL before
ADDED_RUN_COLUMNS = ("diverged_epoch", "threads")

# table name -> its CREATE TABLE statement
TABLES = {
    statement.split()[5]: statement
    for statement in (part.strip() for part in SCHEMA.split(";"))
    if statement.startswith("CREATE TABLE")
}

EPOCH_COLUMNS = (
    "lr",
    "seconds",
    "train_loss",
    "train_ppl",
    "train_acc",
    "train_macro_acc",
    "eval_loss",
    "eval_ppl",
    "eval_acc",
    "eval_macro_acc",
)


class StoreError(MadslError):
    """A --db path that cannot be (or become) a madsl results database; nothing was changed."""

    def __init__(self, path: Path, problem: str, hint: str | None = None):
        super().__init__(f"results database {path} {problem}", Location(file=str(path)), hint=hint)


SQLITE_HEADER = b"SQLite format 3\x00"

MADSL_TABLES = ("meta", "runs")  # what every madsl results database has had since schema 1


def check_database(path: str | os.PathLike, create: bool = True) -> None:
    """Raise StoreError unless `path` is a madsl results database (or, with `create`, can become one).

    Reads at most the file's header and its table list; creates and changes nothing, so a
    command can refuse a bad --db before it writes anything, and a file that belongs to
    something else is left exactly as it was.
    """
    path = Path(path)
    if path.is_dir():
        raise StoreError(path, "is a directory", hint="pass a file path, e.g. --db results/madsl-results.db")
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise StoreError(path, f"is under {ancestor}, which is not a directory")
    if not path.exists():
        if not create:
            raise StoreError(path, "does not exist", hint="run `madsl eval` first, or pass --db PATH")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise StoreError(path, f"cannot be created: {ancestor} is not writable")
        _check_files(path)
        return
    if not path.is_file():
        raise StoreError(path, "is not a regular file")
    if not os.access(path, os.R_OK) or (create and not os.access(path, os.W_OK)):
        raise StoreError(path, f"is not {'readable and writable' if create else 'readable'} (permissions)")
    if create:
        _check_files(path)
    with open(path, "rb") as f:
        header = f.read(len(SQLITE_HEADER))
    if not header:
        return  # an empty file: SQLite reads it as an empty database
    if header != SQLITE_HEADER:
        raise StoreError(path, "is not an SQLite database", hint="madsl leaves it untouched; pass another --db")
    _check_madsl_schema(path)


def _check_files(path: Path) -> None:
    """The results folder beside a database to be written: a folder (or none yet), whose own
    entries are no symbolic links (`check_files_dir`)."""
    files_dir = store_files_dir(path)
    if files_dir.exists() and not files_dir.is_dir():
        raise StoreError(path, f"cannot keep its checkpoints and data: {files_dir} is a file")
    if files_dir.is_dir() and (problem := check_files_dir(files_dir)) is not None:
        raise StoreError(path, problem, hint="remove it (or put a real folder in its place) and rerun")


def _check_madsl_schema(path: Path) -> None:
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            version = None
            if "meta" in tables:
                row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                version = row[0] if row else None
        finally:
            conn.close()
    except sqlite3.Error as err:
        raise StoreError(path, f"cannot be read as an SQLite database ({err})") from None
    if not tables:
        return  # an empty SQLite database: nothing to take over
    if not set(MADSL_TABLES) <= tables or version is None:
        shown = ", ".join(sorted(tables)[:8]) + (", ..." if len(tables) > 8 else "")
        raise StoreError(
            path,
            f"is an SQLite database of something else (tables: {shown})",
            hint="madsl leaves it untouched; pass another --db",
        )
    if not str(version).isdigit():
        raise StoreError(path, f"has a schema_version that is not a number: {version!r}")
    if int(version) != SCHEMA_VERSION:
        newer = int(version) > SCHEMA_VERSION
        raise StoreError(
            path,
            f"has schema version {version}; this madsl reads {SCHEMA_VERSION}",
            hint="it was written by a newer madsl: upgrade madsl to use it" if newer else None,
        )
