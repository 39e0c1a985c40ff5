"""A study's raw data as files: every run as a CSV row and the MAD scores as a CSV, written from
the results databases and read back in their place, so that a study's every number refits from
committed files with one `madsl report` command and no training (docs/scaling.md).

    write_runs_csv / read_runs_csv     one row per run of the study with a stored result: what
                                       it trained (architecture, size, budget, seed, rate, the
                                       three N conventions, tokens, epochs) and how it ended
    write_scores_csv / read_scores_csv the MAD score of each architecture (and its spec hash)

RUN_COLUMNS declares the runs file once: the writer writes it, the reader requires it. A file
read back is untrusted input: a missing column, a value that is not a number, a run the study
does not plan or one whose recorded design or counts (N under each convention, D) disagree with
the plan's is a located error (file, line, column). Torch-free.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from madsl.errors import Location, MadslError


@dataclass(frozen=True)
class Column:
    name: str
    meaning: str
    value: Callable[[Any, Any, dict], Any]  # (run, plan, stored row) -> the cell


def _epochs(run: Any, plan: Any, row: dict) -> float:
    return run.tokens / max(plan.tokens.info.tokens("train"), 1)


RUN_COLUMNS = (
    Column("run_id", "the run's identity in the results database", lambda r, p, s: s["run_id"]),
    Column("arch", "the architecture's name in the study", lambda r, p, s: r.arch),
    Column("size", "the size as the study writes it", lambda r, p, s: r.size),
    Column("dim", "the model's width", lambda r, p, s: r.spec.dim),
    Column("budget", "the IsoFLOP group's training FLOPs", lambda r, p, s: repr(float(r.budget))),
    Column("seed", "the run's seed", lambda r, p, s: r.settings.seed),
    Column("lr", "the peak learning rate", lambda r, p, s: repr(float(r.settings.lr))),
    Column("params", "N with embeddings (the paper's Table C.2 convention)", lambda r, p, s: r.params),
    Column("non_embedding_params", "N without the embedding and head", lambda r, p, s: r.params - r.embedding_params),
    Column("active_params", "N a token reads (routed layers' chosen experts)", lambda r, p, s: r.active_params),
    Column("tokens", "training tokens D", lambda r, p, s: r.tokens),
    Column("steps", "optimizer steps", lambda r, p, s: r.settings.steps),
    Column("epochs", "passes over the training split", lambda r, p, s: f"{_epochs(r, p, s):.4f}"),
    Column("state", "total state: fixed state + KV cache at the training length", lambda r, p, s: r.state),
    Column("status", "done, failed, running, ...", lambda r, p, s: s["status"]),
    Column(
        "loss", "the final validation loss in nats per token (empty: none)", lambda r, p, s: _cell(s["best_eval_loss"])
    ),
    Column(
        "diverged_epoch",
        "the evaluation at which the loss became NaN or inf (empty: none)",
        lambda r, p, s: _cell(s["diverged_epoch"]),
    ),
    Column("threads", "torch threads it trained on", lambda r, p, s: _cell(s.get("threads"))),
)
# what a row must share with the plan's run (its design, and the N and D the fits take from the
# plan: a file whose counts differ was written by another accounting, and would not refit its numbers)
CHECKED = {
    "arch": str,
    "size": str,
    "budget": float,
    "seed": int,
    "lr": float,
    "params": int,
    "non_embedding_params": int,
    "active_params": int,
    "tokens": int,
}
SAME_STUDY = "a runs file refits the study it was written from (same study file, same data, same madsl accounting)"
COLUMNS = {c.name: c for c in RUN_COLUMNS}
SCORE_COLUMNS = ("arch", "spec_hash", "score")


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    return repr(float(value)) if isinstance(value, float) else value


def runs_csv_text(plan: Any, stored: dict[str, dict]) -> str:
    """The CSV of every run of `plan` that `stored` (run id -> its database row) holds, in plan order."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([c.name for c in RUN_COLUMNS])
    for run, run_id in zip(plan.runs, plan.run_ids):
        row = stored.get(run_id)
        if row is not None:
            writer.writerow([c.value(run, plan, {**dict(row), "run_id": run_id}) for c in RUN_COLUMNS])
    return out.getvalue()


def write_runs_csv(plan: Any, stored: dict[str, dict], path: str | os.PathLike) -> Path:
    from madsl.outputs import write_text_atomic

    return write_text_atomic(path, runs_csv_text(plan, stored))


def _rows(path: Path, required: tuple[str, ...], what: str) -> list[tuple[int, dict[str, str]]]:
    """(line, row) of a CSV file whose header holds `required`; a located error otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MadslError(f"no {what} at {path}", hint="write one with madsl report --study ... --export-runs") from None
    except (OSError, UnicodeDecodeError) as err:
        raise MadslError(f"cannot read {what} {path}: {err}") from None
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise MadslError(
            f"{what} {path}: no column {missing[0]!r}",
            Location(str(path), 1, 1),
            expected="the columns " + ", ".join(required),
        )
    rows = []
    for row in reader:
        if None in row or any(value is None for value in row.values()):
            raise MadslError(
                f"{what} {path}: the row has {len(header)} cells expected", Location(str(path), reader.line_num, 1)
            )
        rows.append((reader.line_num, row))
    return rows


def _number(path: Path, line: int, header: list[str], row: dict, column: str, kind: type, empty: bool = False) -> Any:
    text = row[column].strip()
    where = Location(str(path), line, _column_of(row, header, column))
    if text == "" and empty:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise MadslError(f"runs file {path}: {column} {text!r} is not a number", where) from None
    if isinstance(value, float) and math.isnan(value) and not empty:
        raise MadslError(f"runs file {path}: {column} is NaN", where)
    return value


def _column_of(row: dict, header: list[str], column: str) -> int:
    """The 1-based character column where `column`'s cell starts (cells quoted by the writer never contain commas)."""
    position = 1
    for name in header:
        if name == column:
            return position
        position += len(str(row.get(name, ""))) + 1
    return 1


def read_runs_csv(plan: Any, path: str | os.PathLike) -> dict[str, dict]:
    """The stored rows of a runs file (run id -> status, best_eval_loss, diverged_epoch, threads),
    each checked against the plan's run of that id."""
    path = Path(path)
    runs = dict(zip(plan.run_ids, plan.runs))
    stored: dict[str, dict] = {}
    rows = _rows(path, tuple(c.name for c in RUN_COLUMNS), "runs file")
    header = list(rows[0][1]) if rows else []
    for line, row in rows:
        run_id = row["run_id"].strip()
        run = runs.get(run_id)
        if run is None:
            raise MadslError(
                f"runs file {path}: run {run_id[:16]}... is not a run of study {plan.study.name}",
                Location(str(path), line, 1),
                hint=SAME_STUDY,
            )
        for column, kind in CHECKED.items():
            planned = kind(COLUMNS[column].value(run, plan, {}))  # the writer's cell, read back
            value = row[column].strip() if kind is str else _number(path, line, header, row, column, kind)
            if value != planned:
                raise MadslError(
                    f"runs file {path}: run {run_id[:16]}... has {column} {row[column]!r}; the study plans {planned!r}",
                    Location(str(path), line, _column_of(row, header, column)),
                    hint=SAME_STUDY,
                )
        if run_id in stored:
            raise MadslError(f"runs file {path}: run {run_id[:16]}... is listed twice", Location(str(path), line, 1))
        stored[run_id] = {
            "status": row["status"].strip(),
            "best_eval_loss": _number(path, line, header, row, "loss", float, empty=True),
            "diverged_epoch": _number(path, line, header, row, "diverged_epoch", int, empty=True),
            "threads": _number(path, line, header, row, "threads", int, empty=True),
        }
    return stored


def write_scores_csv(plan: Any, scores: dict[str, float], path: str | os.PathLike) -> Path:
    """The MAD scores the report used, one row an architecture (with its spec's hash)."""
    from madsl.outputs import write_text_atomic

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SCORE_COLUMNS)
    for arch, score in sorted(scores.items()):
        writer.writerow([arch, plan.study.architectures[arch].hash, repr(float(score))])
    return write_text_atomic(path, out.getvalue())


def read_scores_csv(plan: Any, path: str | os.PathLike) -> dict[str, float]:
    """arch -> MAD score from a scores file; an architecture the study lacks, or whose spec hash
    is not the study's spec's (another spec scored under that name), is a located error."""
    path = Path(path)
    scores: dict[str, float] = {}
    rows = _rows(path, SCORE_COLUMNS, "MAD scores file")
    header = list(rows[0][1]) if rows else []
    for line, row in rows:
        arch = row["arch"].strip()
        spec = plan.study.architectures.get(arch)
        if spec is None or row["spec_hash"].strip() != spec.hash:
            why = (
                "is not an architecture of the study"
                if spec is None
                else "was scored as another spec (its hash differs)"
            )
            raise MadslError(f"MAD scores file {path}: {arch!r} {why}", Location(str(path), line, 1))
        score = _number(path, line, header, row, "score", float)
        if not 0 <= score <= 1:
            raise MadslError(
                f"MAD scores file {path}: score {score!r} is not an accuracy in [0, 1]",
                Location(str(path), line, _column_of(row, header, "score")),
            )
        scores[arch] = score
    return scores
