"""The page's MAD sections, from the leaderboard's own numbers (madsl.runner.reports): the sortable
leaderboard, the per-task heatmap, every run with its settings, and the sweep curves (per task,
the score against each knob its settings vary, a line per architecture)."""

from __future__ import annotations

from collections import defaultdict
from html import escape
from typing import Any, Sequence

from madsl.report.page import cell, heat_cell, table
from madsl.report.svg import line_chart
from madsl.runner.reports.leaderboard import aggregate_name, display_names, mad_task_order, row_name, task_columns
from madsl.runner.reports.plots import SETTING_PREFIX, sweep_series
from madsl.runner.reports.scores import SpecScore
from madsl.runner.reports.tables import run_rows

MAX_RUN_ROWS = 20_000  # the runs table beyond this many runs would not be read: the CSV export is for that


def leaderboard(scores: Sequence[SpecScore]) -> str:
    """Architectures x tasks, the aggregate, runs, best lr / wd per task and time per run; sortable."""
    if not scores:
        return '<p class="empty">No finished MAD runs in this database.</p>'
    columns = task_columns(scores)
    headers = ["architecture", "protocol", "conventions", *columns, aggregate_name(columns), "runs", "s / run"]
    rows = []
    for s in sorted(scores, key=lambda s: (s.score is None, -(s.score or 0.0), s.spec)):
        cells = [cell(row_name(s, scores)), cell(s.protocol or ""), cell(s.conventions)]
        for t in columns:
            ts = s.tasks.get(t)
            cells.append(cell(ts.score if ts is not None else None))
        runs = f"{s.runs_done}/{s.runs_total}" + (f" ({s.runs_diverged} diverged)" if s.runs_diverged else "")
        cells += [
            cell(s.score),
            f'<td class="n" data-v="{s.runs_done}">{escape(runs)}</td>',
            cell(s.seconds_per_run, 1),
        ]
        rows.append(cells)
    note = (
        "<p>Per task: the mean over its settings of the best accuracy over the lr &times; wd grid (MSE for a "
        "regression task); the aggregate is the mean over tasks. Click a column to sort.</p>"
    )
    return note + table(headers, rows, "board") + best_settings(scores, columns)


def best_settings(scores: Sequence[SpecScore], columns: Sequence[str]) -> str:
    """Each architecture's best lr / wd and runs per task (the settings the scores came from)."""
    headers = ["architecture", "task", "score", "settings", "runs", "best lr", "best wd", "s / run", "ceiling"]
    rows = []
    for s in scores:
        for t in columns:
            ts = s.tasks.get(t)
            if ts is None:
                continue
            rows.append(
                [cell(row_name(s, scores)), cell(t), cell(ts.score), cell(ts.settings), cell(ts.runs_done)]
                + [cell(ts.best_lr, 5), cell(ts.best_wd, 3), cell(ts.seconds_per_run, 1), cell(ts.ceiling)]
            )
    summary = "<summary>per task: settings, runs, best lr / wd</summary>"
    return f"<details>{summary}{table(headers, rows, 'per-task')}</details>"


def heatmap(scores: Sequence[SpecScore]) -> str:
    """Architectures x tasks as coloured cells, best aggregate on top (the paper's Fig. 3.7)."""
    if not scores:
        return '<p class="empty">No finished MAD runs in this database.</p>'
    columns = task_columns(scores)
    ranked = sorted(scores, key=lambda s: (s.score is None, -(s.score or 0.0), s.spec))
    rows = []
    for s in ranked:
        values = [s.tasks[t].score if t in s.tasks and s.tasks[t].metric == "accuracy" else None for t in columns]
        rows.append([cell(row_name(s, scores)), *(heat_cell(v) for v in values), heat_cell(s.score)])
    return table(["architecture", *columns, aggregate_name(columns)], rows, "heat", "sortable heat")


RUN_COLUMNS = (
    ("run id", "run_id"),
    ("architecture", "spec"),
    ("task", "task"),
    ("protocols", "protocols"),
    ("conventions", "conventions"),
    ("lr", "lr"),
    ("wd", "wd"),
    ("epochs", "epochs"),
    ("batch", "batch_size"),
    ("seed", "seed"),
    ("status", "status"),
    ("accuracy", "accuracy"),
    ("loss", "loss"),
    ("best epoch", "best_epoch"),
    ("seconds", "seconds"),
)


def runs_table(rows: Sequence[Any], labels: dict, lengths: dict) -> str:
    """Every MAD run with its settings (the task setting's knobs as columns) and outcome; sortable."""
    records = [r for r in run_rows(rows, labels, lengths, mad_task_order()) if r["row"] == "run"]
    if not records:
        return '<p class="empty">No MAD runs in this database.</p>'
    shown = records[:MAX_RUN_ROWS]
    knobs = sorted({k for r in shown for k in r if k.startswith(SETTING_PREFIX)})
    headers = [h for h, _ in RUN_COLUMNS] + [k[len(SETTING_PREFIX) :] for k in knobs]
    body = []
    for r in shown:
        cells = [cell(r["run_id"][:12]) if k == "run_id" else cell(r[k], 5 if k == "lr" else 3) for _, k in RUN_COLUMNS]
        body.append(cells + [cell(r.get(k)) for k in knobs])
    more = f" (the first {MAX_RUN_ROWS:,} of {len(records):,})" if len(records) > MAX_RUN_ROWS else ""
    summary = f"{len(records):,} runs{more}: each run's settings and result (sortable)"
    return f"<details><summary>{summary}</summary>{table(headers, body, 'run-table')}</details>"


def sweeps(setting_table: Sequence[dict]) -> str:
    """Per task, a chart per knob its settings vary: the score against the knob, a line per architecture."""
    names = display_names([(r["spec"], r["spec_hash"], r["protocol"], r["conventions"]) for r in setting_table])
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in setting_table:
        if r["row"] == "setting":
            by_task[r["task"]].append(r)
    order = {t: i for i, t in enumerate(mad_task_order())}
    parts, flat = [], []
    for task in sorted(by_task, key=lambda t: (order.get(t, len(order)), t)):
        rows = by_task[task]
        knobs = sorted({k[len(SETTING_PREFIX) :] for r in rows for k in r if k.startswith(SETTING_PREFIX)})
        charts = []
        for knob in knobs:
            series = sweep_series(rows, knob, names)
            numeric = [(label, [(x, y) for x, y in pts if isinstance(x, (int, float))]) for label, pts in series]
            numeric = [(label, pts) for label, pts in numeric if len(pts) >= 2]
            if numeric:
                log = all(x > 0 for _, pts in numeric for x, _ in pts) and _spread(numeric) >= 10
                metric = rows[0]["metric"]
                charts.append(line_chart(numeric, f"{task}: {knob}", knob, metric, logx=log))
        if charts:
            parts.append(f'<h3>{escape(task)}</h3><div class="charts">{"".join(charts)}</div>')
        else:
            flat.append(task)
    if flat:
        parts.append(f'<p class="empty">Evaluated at one setting only (no sweep): {escape(", ".join(flat))}.</p>')
    return "".join(parts) or '<p class="empty">No finished MAD runs in this database.</p>'


def _spread(series: Sequence[tuple[str, Sequence[tuple[float, float]]]]) -> float:
    xs = [x for _, pts in series for x, _ in pts]
    return max(xs) / min(xs) if xs and min(xs) > 0 else 1.0
