"""A search's state, saved atomically beside the results database after every step, so that a
search stopped anyhow (Ctrl-C, SIGTERM, kill -9, a lost machine) resumes where it stopped.

    generation   the generation whose batch is pending, or is proposed next
    rng          the numpy generator's state after the last proposal
    population   the members selection keeps: {"id": spec hash, "genome": ...}
    pending      the batch proposed and not yet recorded (None: none)
    candidates   every candidate proposed, by spec hash: its lineage (generation, parents,
                 operator), topology, totals, spec, and score once recorded
    history      each finished generation's best and median score
    counts       proposals rejected over budget or invalid, and duplicates taken from the store

A batch is proposed, saved, then evaluated: a search stopped during the evaluation evaluates the
same batch again (its finished runs come from the results store, none is trained again); one
stopped before the save proposes it again, identically, from the saved generator state.
The file is data, read as untrusted: a file that is not a search state of this format, or one of
another search file, is refused (exit status 2) and left as it is.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from madsl.errors import MadslError

FORMAT = "madsl-search-state"
VERSION = 1
MAX_STATE_BYTES = 256 * 1024 * 1024  # a state of a thousand generations is a few MB; more is not one


@dataclass
class SearchState:
    fingerprint: str
    generation: int = 0
    rng: dict[str, Any] = field(default_factory=dict)
    population: list[dict[str, Any]] = field(default_factory=list)
    pending: list[dict[str, Any]] | None = None
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"over_budget": 0, "invalid": 0, "duplicates": 0})
    complete: bool = False

    def scored(self) -> list[dict[str, Any]]:
        """The candidates with a recorded result (a score, or a failure), in the order proposed."""
        return [c for c in self.candidates.values() if c.get("status") in ("scored", "failed")]


def state_path_for(db: str | os.PathLike, name: str) -> Path:
    """Where a search's state goes by default: beside the results database, named after the search."""
    db = Path(db)
    return db.with_name(f"{db.stem}.search-{name}.json")


def save_state(path: Path, state: SearchState) -> None:
    """Write the state atomically: a temporary file beside it, fsync, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps({"format": FORMAT, "version": VERSION, **asdict(state)})  # candidates in the order proposed
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise MadslError(f"the search state {path} could not be written: {err.strerror or err}",
                         hint="free disk space or fix the folder, then rerun: the search resumes from its last "
                              "saved step") from None


def load_state(path: Path, fingerprint: str) -> SearchState | None:
    """The saved state at `path` (None where there is none yet), checked to be a state of this search."""
    if not path.exists():
        return None
    if path.is_symlink() or not path.is_file():
        raise MadslError(f"the search state {path} is not a regular file", hint="remove it, or give --state elsewhere")
    if path.stat().st_size > MAX_STATE_BYTES:
        raise MadslError(f"the search state {path} is larger than a search state can be",
                         hint="remove it, or give --state elsewhere")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise MadslError(f"the search state {path} cannot be read: {err}",
                         hint="remove it (the search starts over; finished runs stay in the results database)") \
            from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise MadslError(f"{path} is not a search state of this madsl (format {FORMAT} version {VERSION})",
                         hint="remove it, or give --state elsewhere")
    if data.get("fingerprint") != fingerprint:
        raise MadslError(f"the search state {path} belongs to another search (the search file changed since it "
                         "was saved)", hint="rerun with --restart to start over (finished runs stay in the results "
                                            "database and are not trained again), or give --state elsewhere")
    problem = _damage(data)
    if problem is not None:
        raise MadslError(f"the search state {path} is damaged: {problem}", hint="remove it, or give --state elsewhere")
    return SearchState(**{k: v for k, v in data.items() if k not in ("format", "version")})


def _damage(data: dict[str, Any]) -> str | None:
    """What is wrong with a state's fields, or None: their names and types, and every member of the
    population and the pending batch a candidate of the state."""
    fields = {"fingerprint": str, "generation": int, "rng": dict, "population": list, "candidates": dict,
              "history": list, "counts": dict, "complete": bool}
    unknown = set(data) - set(fields) - {"format", "version", "pending"}
    if unknown or any(not isinstance(data.get(k), t) for k, t in fields.items()):
        return "its fields are not those of a search state"
    pending = data.get("pending")
    if pending is not None and not isinstance(pending, list):
        return "pending is not a list"
    candidates = data["candidates"]
    needed = {"id", "name", "spec", "status", "totals"}
    if not all(isinstance(c, dict) and needed <= set(c) for c in candidates.values()):
        return "a candidate lacks its id, name, spec, status or totals"
    for member in data["population"] + (pending or []):
        if not isinstance(member, dict) or member.get("id") not in candidates \
                or not isinstance(member.get("genome"), dict):
            return "a member of the population or of the pending batch is not a candidate of the state"
    return None
