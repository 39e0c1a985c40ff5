"""A results database read once for the trackers and the page: its runs, epochs, length evaluations,
labels and specs, the searches whose state files lie beside it (`<db>.search-<name>.json`,
madsl.search.state), and the tracker records of all of them (records.py).

The database is untrusted input as `madsl report` reads it: a value that is not what madsl writes
is left out of a record (records.number, records.json_object), never a traceback. A search state
beside it that cannot be read is left out with a warning.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from madsl.errors import MadslError
from madsl.report.records import Record, component, json_object, mad_record, number, pretrain_record
from madsl.runner.reports.outputs import PRETRAIN_TASK
from madsl.runner.store.results import Store
from madsl.scaling.api import LABEL_PREFIX
from madsl.search.state import FORMAT, MAX_STATE_BYTES, VERSION

log = logging.getLogger(__name__)
SEARCH_STATE = ".search-"  # <db stem>.search-<name>.json (madsl.search.state.state_path_for)


@dataclass
class Database:
    path: Path
    runs: list[Any] = field(default_factory=list)
    epochs: dict[str, list[Any]] = field(default_factory=dict)
    lengths: dict[str, list[Any]] = field(default_factory=dict)
    labels: dict[str, list[str]] = field(default_factory=dict)
    specs: dict[str, Any] = field(default_factory=dict)
    searches: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> its state (JSON)

    def studies(self, run_id: str) -> list[str]:
        return [p[len(LABEL_PREFIX) :] for p in self.labels.get(run_id, ()) if p.startswith(LABEL_PREFIX)]

    def protocols(self, run_id: str) -> list[str]:
        return [p for p in self.labels.get(run_id, ()) if not p.startswith(LABEL_PREFIX)]


def read_database(db: str | os.PathLike) -> Database:
    """Everything the trackers and the page read of `db` (a MadslError where it is not a database)."""
    path = Path(db)
    if not path.exists():
        raise MadslError(f"no results database at {db}", hint="run `madsl eval` first, or pass --db PATH")
    store = Store(path, create=False)
    try:
        data = Database(path, runs=store.runs(), labels=store.labels(), specs=store.specs())
        for row in store.conn.execute("SELECT * FROM epochs ORDER BY run_id, epoch"):
            data.epochs.setdefault(row["run_id"], []).append(row)
        data.lengths = store.all_length_evals()
    finally:
        store.close()
    data.searches = read_searches(path)
    return data


def read_search(path: Path) -> dict[str, Any] | None:
    """A search state file as data, or None (with a warning) where it is not one."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_STATE_BYTES:
            raise ValueError("not a regular file of a search state's size")
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(f"not a search state (format {FORMAT} version {VERSION})")
        if not isinstance(data.get("candidates"), dict) or not isinstance(data.get("history"), list):
            raise ValueError("no candidates or history")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        log.warning("search state %s left out: %s", path, err)
        return None
    return data


def _no_constant(word: str) -> None:
    raise ValueError(f"{word} is not a JSON number")


def read_searches(db: Path) -> dict[str, dict[str, Any]]:
    """name -> state, of every search whose state lies beside `db` under its default name."""
    prefix = db.stem + SEARCH_STATE
    out = {}
    folder = db.parent if str(db.parent) else Path(".")
    for path in sorted(folder.glob(f"{prefix}*.json")):
        data = read_search(path)
        if data is not None:
            out[path.name[len(prefix) : -len(".json")]] = data
    return out


def search_of(searches: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """spec hash -> the searches that proposed it."""
    out: dict[str, list[str]] = {}
    for name, state in searches.items():
        for spec_hash in state["candidates"]:
            out.setdefault(spec_hash, []).append(name)
    return out


def run_record(row: Any, epochs: list, lengths: list, labels: list[str], spec: Any, searches: list[str]) -> Record:
    """A run's record: a MAD run's or a pretraining run's, with its spec and the searches that proposed it."""
    studies = [p[len(LABEL_PREFIX) :] for p in labels if p.startswith(LABEL_PREFIX)]
    if row["task"] == PRETRAIN_TASK:
        record = pretrain_record(row, epochs, studies)
    else:
        record = mad_record(row, epochs, lengths, [p for p in labels if not p.startswith(LABEL_PREFIX)])
    if searches:
        record.tags["search"] = ",".join(sorted(searches))
    if spec is not None:
        record.text["spec"] = str(spec["identity"])
        if spec["path"]:
            record.tags["spec_path"] = str(spec["path"])
    return record


def run_records(data: Database) -> list[Record]:
    """A record per run: MAD runs and pretraining runs, tagged with their searches."""
    searched = search_of(data.searches)
    return [
        run_record(
            row,
            data.epochs.get(row["run_id"], []),
            data.lengths.get(row["run_id"], []),
            data.labels.get(row["run_id"], []),
            data.specs.get(row["spec_hash"]),
            searched.get(row["spec_hash"], []),
        )
        for row in data.runs
    ]


def search_records(data: Database) -> list[Record]:
    """A record per search: each generation's best, median and best-so-far score, its proposals."""
    out = []
    for name, state in data.searches.items():
        curves = []
        for entry in state["history"]:
            if not isinstance(entry, dict) or not isinstance(entry.get("generation"), int):
                continue
            metrics = {
                f"search/{k}": v
                for k in ("best", "median", "best_so_far", "proposed", "new", "failed", "trained")
                if (v := number(entry.get(k))) is not None
            }
            curves.append((entry["generation"], float(entry["generation"]), metrics))
        scores = [number(c.get("score")) for c in state["candidates"].values() if isinstance(c, dict)]
        scored = [s for s in scores if s is not None]
        finals = {"final/candidates": float(len(scores)), "final/scored": float(len(scored))}
        if scored:
            finals["final/best"] = max(scored)
        out.append(
            Record(
                key=f"search:{name}",
                name=f"search/{component(name)}",
                group="search",
                tags={"search": name, "complete": str(bool(state.get("complete")))},
                config={"fingerprint": str(state.get("fingerprint", ""))},
                curves=curves,
                finals=finals,
            )
        )
    return out


def score_records(db: str | os.PathLike) -> list[Record]:
    """A record per leaderboard row: each task's score and the aggregate (madsl report's numbers)."""
    from madsl.runner.reports.outputs import load_scores

    out = []
    for s in load_scores(db):
        finals = {f"score/{t}": v for t, ts in s.tasks.items() if (v := number(ts.score)) is not None}
        if (total := number(s.score)) is not None:
            finals["score/MAD"] = total
        label = ",".join(component(x) for x in (s.spec, s.protocol or "unlabelled", s.conventions))
        out.append(
            Record(
                key=f"scores:{s.spec_hash}:{s.protocol}:{s.conventions}",
                name=f"leaderboard/{label}",
                group="leaderboard",
                tags={"spec": s.spec, "spec_hash": s.spec_hash, "protocol": s.protocol, "conventions": s.conventions},
                config={"runs_done": s.runs_done, "runs_total": s.runs_total},
                finals=finals,
            )
        )
    return out


def all_records(db: str | os.PathLike, data: Database | None = None) -> list[Record]:
    """Every record of a database: its runs, searches and leaderboard rows."""
    data = data or read_database(db)
    return run_records(data) + search_records(data) + score_records(db)


def config_text(record: Record) -> str:
    """The record's config (tags, settings and the spec's identity) as the JSON a tracker shows."""
    data: dict[str, Any] = {"tags": record.tags, "config": record.config}
    if "spec" in record.text:
        data["spec"] = json_object(record.text["spec"]) or record.text["spec"]
    return json.dumps(data, indent=2, sort_keys=True, default=str)
