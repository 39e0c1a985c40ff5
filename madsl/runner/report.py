"""`madsl report`: the leaderboard of a results database.

    text   a table architectures x tasks with the MAD score and the conventions the runs
           followed (madsl.conventions), then per task: score, the task's ceiling (the best
           score any model could reach, where the data bound it: memorization), settings, runs (and how many diverged: loss NaN / inf), best lr / wd, seconds
           per run; where runs were evaluated at other sequence lengths (--eval-lengths),
           a length-extrapolation table
    json   a list of records: one per (spec, task) with `spec`, `task`, `score`, ...,
           `length_evals` (the best run's accuracy per evaluation length, per setting),
           and one per spec with `task: "MAD"` and `aggregate: true`
    csv    the same records as rows (`length_evals` as JSON text, booleans as true / false)
    rows   settings / runs: json or csv tables for analysis instead, one row per task setting
           or per run, with the setting's knobs as columns (madsl.runner.export)
    plot   a heatmap PNG like Fig. 3.7 of the MAD paper; plot_sweeps: per task, the score
           against each difficulty knob (madsl.runner.plots; both need matplotlib: madsl[plot])
"""
from __future__ import annotations

import csv
import functools
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from madsl.errors import MadslError, did_you_mean
from madsl.outputs import check_output_path, output_error
from madsl.runner.export import csv_cell
from madsl.runner.scores import SpecScore, spec_scores
from madsl.runner.store import Store

FORMATS = ("text", "json", "csv")
ROWS = ("tasks", "settings", "runs")  # one record per (spec, task), per setting, per run
PLOT_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".webp")
AGGREGATE = "MAD"
RECORD_FIELDS = ("spec", "protocol", "task", "aggregate", "score", "metric", "settings", "runs_done", "runs_total",
                 "best_lr", "best_wd", "seconds_per_run", "spec_hash", "length_evals",
                 "runs_diverged", "conventions", "ceiling")  # new fields go last: csv readers by position keep working


def mad_task_order() -> list[str]:
    try:
        from madsl.tasks import MAD_TASKS

        return list(MAD_TASKS)
    except ImportError:
        return ["in-context-recall", "fuzzy-in-context-recall", "noisy-in-context-recall",
                "selective-copying", "compression", "memorization"]


@dataclass
class StoredRuns:
    """What the report reads of a database: the runs, their protocol labels, their length evaluations."""

    rows: list
    labels: dict[str, list[str]]
    length_evals: dict[str, list]


def load_runs(db: str | os.PathLike, protocol: str | None = None,
              spec_hashes: Sequence[str] | None = None, run_ids: Sequence[str] | None = None) -> StoredRuns:
    """The runs of a database (optionally only some protocols, specs or runs)."""
    if not Path(db).exists():
        raise MadslError(f"no results database at {db}", hint="run `madsl eval` first, or pass --db PATH")
    store = Store(db, create=False)
    try:
        rows = store.runs()
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


def load_scores(db: str | os.PathLike, protocol: str | None = None,
                spec_hashes: Sequence[str] | None = None, run_ids: Sequence[str] | None = None) -> list[SpecScore]:
    """Scores of the specs in a database (optionally only some protocols, specs or runs)."""
    stored = load_runs(db, protocol, spec_hashes, run_ids)
    return spec_scores(stored.rows, stored.labels, mad_task_order(), stored.length_evals, ceiling=task_ceiling)


def check_protocol_label(name: str, stored: set[str], db: str | os.PathLike) -> None:
    """A --protocol filter names a protocol, or a label runs are filed under (`quick+custom`)."""
    from madsl.runner.protocols import PROTOCOLS

    if name in PROTOCOLS or name in stored:
        return
    known = sorted(set(PROTOCOLS) | stored)
    raise MadslError(f"--protocol {name}: no such protocol, and no runs in {db} are filed under it",
                     expected=", ".join(known), hint=did_you_mean(name, known))


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
        out.append({**{k: None for k in RECORD_FIELDS},
                    "spec": s.spec, "spec_hash": s.spec_hash, "protocol": s.protocol, "conventions": s.conventions,
                    "task": AGGREGATE,
                    "aggregate": True, "score": s.score, "metric": "accuracy",
                    "settings": sum(t.settings for t in s.tasks.values()),
                    "runs_done": s.runs_done, "runs_total": s.runs_total, "runs_diverged": s.runs_diverged,
                    "seconds_per_run": s.seconds_per_run,
                    "length_evals": []})
    return [{k: r[k] for k in RECORD_FIELDS} for r in out]


def _cell(name: str):
    """A name as plain text: a sweep variant's `hyena-sg[dim=64]` is not rich markup."""
    from rich.text import Text

    return Text(name)


def display_names(keys: Sequence[tuple[str, str, str, str]]) -> dict[tuple, str]:
    """(spec, spec_hash, protocol, conventions) -> the name a table row or plot line shows: the
    spec's name, its hash where two versions share the name, and in brackets the protocol and
    conventions where the same spec was scored under several."""
    keys = list(dict.fromkeys(keys))
    names = {}
    for spec, spec_hash, protocol, conventions in keys:
        name = spec
        if any(o[0] == spec and o[1] != spec_hash for o in keys):
            name += f" ({spec_hash[:8]})"  # two versions of a spec with the same name
        tags = []
        if protocol and any(o[1] == spec_hash and o[2] != protocol for o in keys):
            tags.append(protocol)
        if any(o[1] == spec_hash and o[3] != conventions for o in keys):
            tags.append(conventions)
        names[(spec, spec_hash, protocol, conventions)] = name + (f" [{', '.join(tags)}]" if tags else "")
    return names


def _key(s: SpecScore) -> tuple[str, str, str, str]:
    return s.spec, s.spec_hash, s.protocol, s.conventions


def _row_name(s: SpecScore, scores: Sequence[SpecScore]) -> str:
    return display_names([_key(o) for o in scores])[_key(s)]


def _fmt(value: float | None, metric: str = "accuracy") -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if metric == "accuracy" else f"{value:.3g}"


def _fmt_runs(done: int, total: int, diverged: int) -> str:
    return f"{done}/{total}" + (f" ({diverged} diverged)" if diverged else "")


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"


def task_columns(scores: Sequence[SpecScore]) -> list[str]:
    order = mad_task_order()
    seen = {t for s in scores for t in s.tasks}
    return [t for t in order if t in seen] + sorted(seen - set(order))


def aggregate_name(columns: Sequence[str]) -> str:
    """'MAD score' where the columns are the six MAD tasks; 'mean' over any other set of tasks."""
    return "MAD score" if sorted(columns) == sorted(mad_task_order()) else "mean"


def protocols_text(scores: Sequence[SpecScore]) -> str:
    """", protocol quick" for titles; empty for scores not filed under a protocol (an eval's own summary)."""
    names = sorted({s.protocol for s in scores if s.protocol})
    if not names:
        return ""
    return (", protocol " if len(names) == 1 else ", protocols ") + ", ".join(names)


def render_text(scores: Sequence[SpecScore], width: int = 160) -> str:
    from rich.console import Console
    from rich.table import Table

    if not scores:
        return "no runs in the database yet\n"
    columns = task_columns(scores)
    board = Table(title=f"MAD leaderboard{protocols_text(scores)} (class-averaged eval accuracy; "
                        "best over lr x wd, mean over settings)")
    board.add_column("architecture")
    for t in columns:
        board.add_column(t, justify="right")
    board.add_column(aggregate_name(columns), justify="right", style="bold")
    board.add_column("conventions")
    board.add_column("runs", justify="right")
    board.add_column("time/run", justify="right")
    for s in scores:
        cells = []
        for t in columns:
            ts = s.tasks.get(t)
            cells.append("-" if ts is None else _fmt(ts.score, ts.metric) + ("" if ts.metric == "accuracy" else " mse"))
        board.add_row(_cell(_row_name(s, scores)), *cells, _fmt(s.score), s.conventions,
                      _fmt_runs(s.runs_done, s.runs_total, s.runs_diverged), _fmt_seconds(s.seconds_per_run))
    detail = Table(title="per task (ceiling: the best score any model could reach on the test data, "
                         "where the task has one)")
    for name, justify in (("architecture", "left"), ("conventions", "left"), ("task", "left"), ("score", "right"),
                          ("ceiling", "right"), ("settings", "right"),
                          ("runs", "right"), ("best lr", "right"), ("best wd", "right"), ("time/run", "right")):
        detail.add_column(name, justify=justify)
    for s in scores:
        for t in s.tasks.values():
            detail.add_row(_cell(_row_name(s, scores)), s.conventions, t.task, _fmt(t.score, t.metric),
                           _fmt(t.ceiling), str(t.settings),
                           _fmt_runs(t.runs_done, t.runs_total, t.runs_diverged),
                           "-" if t.best_lr is None else f"{t.best_lr:g}",
                           "-" if t.best_wd is None else f"{t.best_wd:g}", _fmt_seconds(t.seconds_per_run))
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(board)
    console.print(detail)
    lengths = length_table(scores)
    if lengths is not None:
        console.print(lengths)
    return console.file.getvalue()


def _length_cell(ev: dict) -> str:
    if ev["status"] == "oom":
        return "OOM"
    if ev["status"] != "ok" or ev["acc"] is None:
        return "error"
    return f"{ev['acc']:.3f}"


def length_table(scores: Sequence[SpecScore]):
    """Length extrapolation (Mamba paper Table 11): the best run of each setting, evaluated
    at every --eval-lengths length; accuracy = share of scored positions predicted right."""
    from rich.table import Table

    def key(ev: dict) -> str:
        return json.dumps(ev["setting"], sort_keys=True)

    rows = [(s, t, json.loads(setting), [ev for ev in t.length_evals if key(ev) == setting])
            for s in scores for t in s.tasks.values()
            for setting in dict.fromkeys(key(ev) for ev in t.length_evals)]
    if not rows:
        return None
    lengths = sorted({ev["length"] for *_, evs in rows for ev in evs})
    table = Table(title="length extrapolation (accuracy of the best model at each evaluation length; "
                        "OOM = out of memory)")
    for name in ("architecture", "task", "trained at"):
        table.add_column(name)
    for length in lengths:
        table.add_column(_length_label(length), justify="right")
    for s, t, setting, evs in rows:
        trained = setting.get("seq_len")
        by_length = {ev["length"]: ev for ev in evs}
        table.add_row(_cell(_row_name(s, scores)), t.task, "-" if trained is None else str(trained),
                      *(_length_cell(by_length[n]) if n in by_length else "" for n in lengths))
    return table


def _length_label(length: int) -> str:
    exponent = length.bit_length() - 1
    return f"2^{exponent}" if length == 1 << exponent and length >= 1024 else str(length)


def render(scores: Sequence[SpecScore], fmt: str = "text") -> str:
    if fmt == "json":
        return json.dumps(records(scores), indent=2) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(RECORD_FIELDS)
        writer.writerows([json.dumps(r[k]) if k == "length_evals" else csv_cell(r[k]) for k in RECORD_FIELDS]
                         for r in records(scores))
        return buffer.getvalue()
    if fmt == "text":
        return render_text(scores)
    raise MadslError(f"unknown report format {fmt!r}", expected=", ".join(FORMATS))


def plot_heatmap(scores: Sequence[SpecScore], path: str | os.PathLike) -> Path:
    """A heatmap architectures x (tasks + aggregate), best architecture on top (like Fig. 3.7)."""
    import numpy as np

    from madsl.runner.plots import heatmap, pyplot

    pyplot("--plot")
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
    return heatmap([_row_name(s, scores) for s in scores], [*columns, aggregate_name(columns)], values,
                   f"MAD{protocols_text(scores)}: eval accuracy per task (best over lr x wd, mean over settings)",
                   Path(path))


def check_plot_dir(path: str | os.PathLike) -> Path:
    """A folder the sweep figures can be written into (it may not exist yet), before any work."""
    path = Path(path)
    if str(path).strip() == "":
        raise MadslError("--plot-sweeps: the path is empty")
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        what = "is" if ancestor == path else f"lies under {ancestor}, which is"
        raise MadslError(f"--plot-sweeps {path}: {what} not a directory",
                         hint="name a folder: the figures go into it, one PNG per task")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise MadslError(f"--plot-sweeps {path}: {ancestor} is not writable")
    return path


def report_outputs(db: str | os.PathLike = "madsl-results.db", fmt: str = "text",
                   plot: str | os.PathLike | None = None, protocol: str | None = None, rows: str = "tasks",
                   plot_sweeps: str | os.PathLike | None = None) -> tuple[str, list[Path], list[str]]:
    """`report` and the files it wrote: (text, figures written, tasks without a sweep to plot)."""
    if fmt not in FORMATS:
        raise MadslError(f"unknown report format {fmt!r}", expected=", ".join(FORMATS))
    if rows not in ROWS:
        raise MadslError(f"unknown report rows {rows!r}", expected=", ".join(ROWS))
    if rows != "tasks" and fmt == "text":
        raise MadslError(f"--rows {rows} is a table for analysis: it needs --format json or csv",
                         hint=f"madsl report --rows {rows} --format csv > {rows}.csv")
    if plot is not None:
        check_output_path(plot, "--plot")  # before any work
        if Path(plot).suffix.lower() not in PLOT_SUFFIXES:
            raise MadslError(f"--plot {plot}: matplotlib cannot write {Path(plot).suffix!r} images",
                             expected="a file ending in " + ", ".join(PLOT_SUFFIXES))
    if plot_sweeps is not None:
        from madsl.runner.plots import pyplot

        check_plot_dir(plot_sweeps)
        pyplot("--plot-sweeps")
    stored = load_runs(db, protocol=protocol)
    scores = spec_scores(stored.rows, stored.labels, mad_task_order(), stored.length_evals, ceiling=task_ceiling)
    written: list[Path] = []
    flat: list[str] = []
    if plot is not None:
        try:
            written.append(plot_heatmap(scores, plot))
        except OSError as err:
            raise output_error(err, plot, "--plot") from None
    if plot_sweeps is not None:
        more, flat = plot_sweep_figures(stored, Path(plot_sweeps))
        written += more
    if rows == "tasks":
        return render(scores, fmt), written, flat
    from madsl.runner import export

    table = (export.run_rows(stored.rows, stored.labels, stored.length_evals, mad_task_order()) if rows == "runs"
             else export.setting_rows(stored.rows, stored.labels, stored.length_evals, mad_task_order(),
                                      ceiling=task_ceiling))
    return (export.as_json if fmt == "json" else export.as_csv)(rows, table), written, flat


def plot_sweep_figures(stored: StoredRuns, out_dir: Path) -> tuple[list[Path], list[str]]:
    """Per task, the score against each knob its settings vary, one line per architecture."""
    from madsl.runner.export import setting_rows
    from madsl.runner.plots import sweep_figures

    table = setting_rows(stored.rows, stored.labels, stored.length_evals, mad_task_order())
    if not table:
        raise MadslError("nothing to plot: the database has no finished runs")
    keys = [(r["spec"], r["spec_hash"], r["protocol"], r["conventions"]) for r in table]
    protocols = sorted({r["protocol"] for r in table if r["protocol"]})
    suffix = (", protocol " if len(protocols) == 1 else ", protocols ") + ", ".join(protocols) if protocols else ""
    try:
        written, flat = sweep_figures(table, display_names(keys), mad_task_order(), out_dir, suffix)
    except OSError as err:
        raise output_error(err, out_dir, "--plot-sweeps") from None
    if not written:
        raise MadslError(f"nothing to plot: no task's runs vary a setting (each of {', '.join(flat)} was "
                         "evaluated at one setting only)",
                         hint="evaluate a difficulty sweep: --protocol paper, a sweep file, or runs with "
                              "other --set values")
    return written, flat


def report(db: str | os.PathLike = "madsl-results.db", fmt: str = "text", plot: str | os.PathLike | None = None,
           protocol: str | None = None, rows: str = "tasks", plot_sweeps: str | os.PathLike | None = None) -> str:
    """The leaderboard of `db` as text, json or csv (rows: "tasks", the leaderboard's records;
    "settings" or "runs", tables for analysis, madsl.runner.export); with `plot`, also write a
    heatmap there; with `plot_sweeps`, a figure per task of its difficulty sweeps into that folder."""
    return report_outputs(db, fmt, plot, protocol, rows, plot_sweeps)[0]
