"""A search's state, saved atomically beside the results database after every step, so that a
search stopped anyhow (Ctrl-C, SIGTERM, kill -9, a lost machine) resumes where it stopped.

    generation   the generation whose batch is pending, or is proposed next
    rng          the numpy generator's state after the last proposal
    population   the members selection keeps: {"id": spec hash, "genome": ...}
    pending      the batch proposed and not yet recorded (None: none)
    candidates   every candidate proposed, by spec hash: its lineage (generation, parents,
                 operator), topology, totals, spec, and score once recorded
    history      each finished generation's best and median score
    counts       proposals rejected over budget or invalid, duplicates taken from the store, and
                 breedings that returned a parent's own identity (re-drawn: no child is its parent)

A batch is proposed, saved, then evaluated: a search stopped during the evaluation evaluates the
same batch again (its finished runs come from the results store, none is trained again); one
stopped before the save proposes it again, identically, from the saved generator state.
The file is data, read as untrusted: a file that is not a search state of this format, or one of
another search file, is refused (exit status 2) and left as it is; one of this search passes
madsl.search.state_check (every field, every candidate's identity and accounting) before any of
it is used, or is refused whole.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from madsl.errors import Location, MadslError
from madsl.paths import require_path, safe_file_name

FORMAT = "madsl-search-state"
VERSION = 1
MAX_STATE_BYTES = 256 * 1024 * 1024  # a state of a thousand generations is a few MB; more is not one
RESTART = (
    "remove the file, or rerun with --restart to start over (finished runs stay in the results database "
    "and are not trained again), or give --state elsewhere"
)


@dataclass
class SearchState:
    fingerprint: str
    generation: int = 0
    rng: dict[str, Any] = field(default_factory=dict)
    population: list[dict[str, Any]] = field(default_factory=list)
    pending: list[dict[str, Any]] | None = None
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: {"over_budget": 0, "invalid": 0, "duplicates": 0, "parent_returned": 0}
    )
    complete: bool = False

    def scored(self) -> list[dict[str, Any]]:
        """The candidates with a recorded result (a score, or a failure), in the order proposed."""
        return [c for c in self.candidates.values() if c.get("status") in ("scored", "failed")]


def state_path_for(db: str | os.PathLike, name: str) -> Path:
    """Where a search's state goes by default: beside the results database, named after the search
    (a safe file name: the path stays in the database's folder)."""
    db = require_path(db, "the results database")
    return db.with_name(f"{db.stem}.search-{safe_file_name(name, 'the search name')}.json")


def json_ready(value: Any) -> Any:
    """`value` with every float that is not finite as None (JSON has no NaN or Infinity: a file
    holding them is not JSON to most readers), tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def save_state(path: Path, state: SearchState) -> None:
    """Write the state atomically and durably (madsl.outputs.write_text_atomic)."""
    from madsl.outputs import write_text_atomic

    text = json.dumps(
        json_ready({"format": FORMAT, "version": VERSION, **asdict(state)}), allow_nan=False
    )  # candidates in the order proposed
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    except OSError as err:
        raise MadslError(
            f"the search state {path} could not be written: {err.strerror or err}",
            Location(str(path)),
            hint="free disk space or fix the folder, then rerun: the search resumes from its last saved step",
        ) from None


def _no_constant(word: str) -> None:
    raise ValueError(f"{word} is not a JSON number")  # Python's json reads NaN and Infinity unless told not to


def read_state(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The saved state at `path` as data (None where there is none yet): a regular file of JSON of
    this format, saved by the search whose fingerprint is `fingerprint`. Its fields are checked by
    madsl.search.state_check."""
    where = Location(str(path))
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        what = "a symbolic link" if path.is_symlink() else "a folder" if path.is_dir() else "not a regular file"
        raise MadslError(f"the search state {path} is {what}", where, hint="give --state a file's path")
    if path.stat().st_size > MAX_STATE_BYTES:
        raise MadslError(
            f"the search state {path} is larger than a search state can be ({MAX_STATE_BYTES // 2**20} MiB)",
            where,
            hint=RESTART,
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise MadslError(f"the search state {path} cannot be read: {err}", where, hint=RESTART) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise MadslError(
            f"{path} is not a search state of this madsl (format {FORMAT} version {VERSION})", where, hint=RESTART
        )
    if data.get("fingerprint") != fingerprint:
        raise MadslError(
            f"the search state {path} belongs to another search (the search file changed since it was saved)",
            where,
            hint=RESTART,
        )
    return data
