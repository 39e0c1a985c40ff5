"""`madsl report`: the leaderboard of a results database (text tables: madsl.runner.reports.leaderboard).

text   a table architectures x tasks with the MAD score (the protocol and the conventions
       the runs followed, madsl.conventions, in its title), then per task: score, the
       task's ceiling (the best score any model could reach, where the data bound it:
       memorization), settings, runs (and how many diverged: loss NaN / inf), best lr / wd,
       time per run; where runs were evaluated at other sequence lengths (--eval-lengths),
       a length-extrapolation table; fitted to the terminal's width
json   a list of records: one per (spec, task) with `spec`, `task`, `score`, ...,
       `length_evals` (the best run's accuracy per evaluation length, per setting),
       and one per spec with `task: "MAD"` and `aggregate: true`
csv    the same records as rows (`length_evals` as JSON text, booleans as true / false)
rows   settings / runs: json or csv tables for analysis instead, one row per task setting
       or per run, with the setting's knobs as columns (madsl.runner.reports.tables)
plot   a heatmap PNG like Fig. 3.7 of the MAD paper; plot_sweeps: per task, the score
       against each difficulty knob (madsl.runner.reports.plots; both need matplotlib: madsl[plot])
"""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from madsl.errors import MadslError, did_you_mean, option
from madsl.outputs import check_output_dir, check_output_path, json_text, output_error
from madsl.runner.reports.leaderboard import (
    aggregate_name,
    context_text,
    display_names,
    mad_task_order,
    render_text,
    row_name,
    task_columns,
)
from madsl.runner.reports.scores import SpecScore, spec_scores
from madsl.runner.reports.tables import csv_cell
from madsl.runner.store.results import Store

log = logging.getLogger(__name__)
FORMATS = ("text", "json", "csv")
ROWS = ("tasks", "settings", "runs")  # one record per (spec, task), per setting, per run
PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".webp")
AGGREGATE = "MAD"
RECORD_FIELDS = (
    "spec",
    "protocol",
    "task",
    "aggregate",
    "score",
    "metric",
    "settings",
    "runs_done",
    "runs_total",
    "best_lr",
    "best_wd",
    "seconds_per_run",
    "spec_hash",
    "length_evals",
    "runs_diverged",
    "conventions",
    "ceiling",
)  # new fields go last: csv readers by position keep working


@dataclass
class StoredRuns:
    """What the report reads of a database: the runs, their protocol labels, their length evaluations."""

    rows: list
    labels: dict[str, list[str]]
    length_evals: dict[str, list]


PRETRAIN_TASK = "pretrain"  # the task name of a pretraining run in the results store (madsl.runner.pretrain)


# the columns a report computes with: a number (or nothing) each, whatever a planted row holds
NUMBER_COLUMNS = (
    "lr",
    "wd",
    "seed",
    "epochs",
    "batch_size",
    "train_seconds",
    "epochs_done",
    "best_epoch",
    "best_eval_loss",
    "best_eval_ppl",
    "best_eval_acc",
    "best_eval_token_acc",
    "max_eval_acc",
)
ACCURACY_COLUMNS = ("best_eval_acc", "best_eval_token_acc", "max_eval_acc")
JSON_COLUMNS = ("setting", "train_config")  # JSON objects


def _row_problem(row: Any) -> str | None:
    """Why a stored run cannot be reported as it is (None: it can). The database is untrusted
    input: another program, or a hand, may have written text where a number belongs."""
    present = set(row.keys())  # (a database from before a column lacks it)
    for column in NUMBER_COLUMNS:
        value = row[column] if column in present else None
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{column} is {type(value).__name__}, not a number"
        if column in ACCURACY_COLUMNS and value is not None and not 0 <= value <= 1:
            return f"{column} {value!r} is not an accuracy in [0, 1]"
    for column in JSON_COLUMNS:
        try:
            if column in present and not isinstance(json.loads(row[column]), dict):
                raise ValueError
        except (TypeError, ValueError, RecursionError):
            return f"{column} is not a JSON object"
    return None


def _trusted(rows: list, db: str | os.PathLike) -> list:
    """The rows a report can use; the others are left out with one warning naming them."""
    kept, refused = [], []
    for row in rows:
        problem = _row_problem(row)
        if problem is None:
            kept.append(row)
        else:
            refused.append(f"run {row['run_id']!r}: {problem}")
    if refused:
        shown = "; ".join(refused[:3]) + (f"; and {len(refused) - 3} more" if len(refused) > 3 else "")
        log.warning(
            "results database %s: %d run(s) left out of the report, their stored results are not "
            "what madsl writes (%s)",
            db,
            len(refused),
            shown,
        )
    return kept


def load_runs(
    db: str | os.PathLike,
    protocol: str | None = None,
    spec_hashes: Sequence[str] | None = None,
    run_ids: Sequence[str] | None = None,
) -> StoredRuns:
    """The runs of a database (optionally only some protocols, specs or runs)."""
    if not Path(db).exists():
        raise MadslError(f"no results database at {db}", hint="run `madsl eval` first, or pass --db PATH")
    store = Store(db, create=False)
    try:
        # a store shared with `madsl scale` also holds pretraining runs: not MAD runs (madsl.scaling.report)
        rows = _trusted([r for r in store.runs() if r["task"] != PRETRAIN_TASK], db)
        labels = store.labels()
        length_evals = store.all_length_evals()
    finally:
        store.close()
    if spec_hashes is not None:
        rows = [r for r in rows if r["spec_hash"] in set(spec_hashes)]
    if run_ids is not None:  # exactly these runs, whichever protocols asked for them
        wanted = set(run_ids)
        rows = [r for r in rows if r["run_id"] in wanted]
        labels = {}
    if protocol is not None:
        check_protocol_label(protocol, {p for v in labels.values() for p in v}, db)
        labels = {k: [p for p in v if p == protocol] for k, v in labels.items()}
        rows = [r for r in rows if labels.get(r["run_id"])]
    return StoredRuns(rows, labels, length_evals)


def load_scores(
    db: str | os.PathLike,
    protocol: str | None = None,
    spec_hashes: Sequence[str] | None = None,
    run_ids: Sequence[str] | None = None,
) -> list[SpecScore]:
    """Scores of the specs in a database (optionally only some protocols, specs or runs)."""
    stored = load_runs(db, protocol, spec_hashes, run_ids)
    return spec_scores(stored.rows, stored.labels, mad_task_order(), stored.length_evals, ceiling=task_ceiling)


def check_protocol_label(name: str, stored: set[str], db: str | os.PathLike) -> None:
    """A --protocol filter names a protocol, or a label runs are filed under (`quick+custom`)."""
    from madsl.runner.plan.protocols import PROTOCOLS

    if name in PROTOCOLS or name in stored:
        return
    known = sorted(set(PROTOCOLS) | stored)
    raise MadslError(
        f"{option('protocol')} {name}: no such protocol, and no runs in {db} are filed under it",
        expected=", ".join(known),
        hint=did_you_mean(name, known),
    )


@functools.lru_cache(maxsize=256)
def _ceiling(task: str, conventions: str, setting: str, seed: int) -> float | None:
    try:
        from madsl.tasks import TASKS, get_task
    except ImportError:
        return None
    if task not in TASKS:
        return None
    try:
        return get_task(task, conventions).ceiling(json.loads(setting), seed)
    except (ValueError, KeyError):  # a setting this version's task no longer accepts: no ceiling to show
        return None


def task_ceiling(task: str, conventions: str, setting: dict, seed: int) -> float | None:
    """The best score any model could reach on a task setting (`Task.ceiling`), where the task has one."""
    return _ceiling(task, conventions, json.dumps(setting, sort_keys=True), int(seed))


def records(scores: Sequence[SpecScore]) -> list[dict]:
    out: list[dict] = []
    for s in scores:
        for t in s.tasks.values():
            out.append({**{k: None for k in RECORD_FIELDS}, **t.record(), "aggregate": False})
        out.append(
            {
                **{k: None for k in RECORD_FIELDS},
                "spec": s.spec,
                "spec_hash": s.spec_hash,
                "protocol": s.protocol,
                "conventions": s.conventions,
                "task": AGGREGATE,
                "aggregate": True,
                "score": s.score,
                "metric": "accuracy",
                "settings": sum(t.settings for t in s.tasks.values()),
                "runs_done": s.runs_done,
                "runs_total": s.runs_total,
                "runs_diverged": s.runs_diverged,
                "seconds_per_run": s.seconds_per_run,
                "length_evals": [],
            }
        )
    return [{k: r[k] for k in RECORD_FIELDS} for r in out]


def render(scores: Sequence[SpecScore], fmt: str = "text") -> str:
    if fmt == "json":
        return json_text(records(scores), indent=2) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(RECORD_FIELDS)
        writer.writerows(
            [json.dumps(r[k]) if k == "length_evals" else csv_cell(r[k]) for k in RECORD_FIELDS]
            for r in records(scores)
        )
        return buffer.getvalue()
    if fmt == "text":
        return render_text(scores)
    raise MadslError(f"unknown report format {fmt!r}", expected=", ".join(FORMATS))


def plot_heatmap(scores: Sequence[SpecScore], path: str | os.PathLike) -> Path:
    """A heatmap architectures x (tasks + aggregate), best architecture on top (like Fig. 3.7)."""
    import numpy as np

    from madsl.runner.reports.plots import heatmap, pyplot

    pyplot(option("plot"))
    if not scores:
        raise MadslError("nothing to plot: the database has no finished runs")
    columns = task_columns(scores)
    values = np.full((len(scores), len(columns) + 1), np.nan)
    for i, s in enumerate(scores):
        for j, t in enumerate(columns):
            ts = s.tasks.get(t)
            if ts is not None and ts.score is not None and ts.metric == "accuracy":
                values[i, j] = ts.score
        values[i, -1] = np.nan if s.score is None else s.score
    return heatmap(
        [row_name(s, scores) for s in scores],
        [*columns, aggregate_name(columns)],
        values,
        f"MAD{context_text(scores)}: eval accuracy per task (best over lr x wd, mean over settings)",
        Path(path),
    )


def check_plot_dir(path: str | os.PathLike, force: bool = False) -> Path:
    """The folder the sweep figures go into (symlinks resolved; it may not exist yet), before any
    work: refused where it holds anything but task figures, unless `force` (madsl.outputs)."""
    from madsl.runner.reports.plots import figure_file_name
    from madsl.tasks import TASKS

    figures = {figure_file_name(task) for task in TASKS}
    return check_output_dir(path, option("plot_sweeps"), figures.__contains__, force=force, writes="one PNG per task")


def _check_arguments(
    fmt: str, rows: str, plot: str | os.PathLike | None, plot_sweeps: str | os.PathLike | None, force: bool
) -> Path | None:
    """`report_outputs`' arguments checked before any work, its outputs included; the sweep
    figures' folder as checked (None: no sweep figures)."""
    if fmt not in FORMATS:
        raise MadslError(f"unknown report format {fmt!r}", expected=", ".join(FORMATS))
    if rows not in ROWS:
        raise MadslError(f"unknown report rows {rows!r}", expected=", ".join(ROWS))
    if rows != "tasks" and fmt == "text":
        raise MadslError(
            f"{option('rows')} {rows} is a table for analysis: it needs {option('fmt')} json or csv",
            hint=f"madsl report --rows {rows} --format csv > {rows}.csv",
        )
    if plot is not None:
        check_output_path(plot, option("plot"))  # before any work
        if Path(plot).suffix.lower() not in PLOT_SUFFIXES:
            raise MadslError(
                f"{option('plot')} {plot}: matplotlib cannot write {Path(plot).suffix!r} images",
                expected="a file ending in " + ", ".join(PLOT_SUFFIXES),
            )
    if plot_sweeps is not None:
        from madsl.runner.reports.plots import pyplot

        plot_sweeps = check_plot_dir(plot_sweeps, force)
        pyplot(option("plot_sweeps"))
    return plot_sweeps


def report_outputs(
    db: str | os.PathLike = "madsl-results.db",
    fmt: str = "text",
    plot: str | os.PathLike | None = None,
    protocol: str | None = None,
    rows: str = "tasks",
    plot_sweeps: str | os.PathLike | None = None,
    force: bool = False,
) -> tuple[str, list[Path], list[str]]:
    """`report` and the files it wrote: (text, figures written, tasks without a sweep to plot).
    `force`: write the sweep figures into a folder that holds other files too (left untouched)."""
    plot_sweeps = _check_arguments(fmt, rows, plot, plot_sweeps, force)
    stored = load_runs(db, protocol=protocol)
    scores = spec_scores(stored.rows, stored.labels, mad_task_order(), stored.length_evals, ceiling=task_ceiling)
    written: list[Path] = []
    flat: list[str] = []
    if plot is not None:
        try:
            written.append(plot_heatmap(scores, plot))
        except OSError as err:
            raise output_error(err, plot, option("plot")) from None
    if plot_sweeps is not None:
        more, flat = plot_sweep_figures(stored, Path(plot_sweeps))
        written += more
    if rows == "tasks":
        if fmt == "text" and protocol is not None and not stored.rows:  # the database may hold other runs
            return (
                (
                    f"no runs in {db} are filed under protocol {protocol} yet "
                    "(`madsl report` without --protocol shows every run)\n"
                ),
                written,
                flat,
            )
        return render(scores, fmt), written, flat
    from madsl.runner.reports import tables as export

    table = (
        export.run_rows(stored.rows, stored.labels, stored.length_evals, mad_task_order())
        if rows == "runs"
        else export.setting_rows(
            stored.rows, stored.labels, stored.length_evals, mad_task_order(), ceiling=task_ceiling
        )
    )
    return (export.as_json if fmt == "json" else export.as_csv)(rows, table), written, flat


def plot_sweep_figures(stored: StoredRuns, out_dir: Path) -> tuple[list[Path], list[str]]:
    """Per task, the score against each knob its settings vary, one line per architecture."""
    from madsl.runner.reports.plots import sweep_figures
    from madsl.runner.reports.tables import setting_rows

    table = setting_rows(stored.rows, stored.labels, stored.length_evals, mad_task_order())
    if not table:
        raise MadslError("nothing to plot: the database has no finished runs")
    keys = [(r["spec"], r["spec_hash"], r["protocol"], r["conventions"]) for r in table]
    protocols = sorted({r["protocol"] for r in table if r["protocol"]})
    conventions = {r["conventions"] for r in table}
    suffix = (
        (", protocol " if len(protocols) == 1 else ", protocols ") + ", ".join(protocols) if protocols else ""
    ) + (f", conventions {conventions.pop()}" if len(conventions) == 1 else "")
    try:
        written, flat = sweep_figures(table, display_names(keys), mad_task_order(), out_dir, suffix)
    except OSError as err:
        raise output_error(err, out_dir, option("plot_sweeps")) from None
    if not written:
        raise MadslError(
            f"nothing to plot: no task's runs vary a setting (each of {', '.join(flat)} was "
            "evaluated at one setting only)",
            hint="evaluate a difficulty sweep: --protocol paper, a sweep file, or runs with other --set values",
        )
    return written, flat


def report(
    db: str | os.PathLike = "madsl-results.db",
    fmt: str = "text",
    plot: str | os.PathLike | None = None,
    protocol: str | None = None,
    rows: str = "tasks",
    plot_sweeps: str | os.PathLike | None = None,
) -> str:
    """The leaderboard of `db` as text, json or csv (rows: "tasks", the leaderboard's records;
    "settings" or "runs", tables for analysis, madsl.runner.reports.tables); with `plot`, also write a
    heatmap there; with `plot_sweeps`, a figure per task of its difficulty sweeps into that folder."""
    return report_outputs(db, fmt, plot, protocol, rows, plot_sweeps)[0]
