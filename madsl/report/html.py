"""`madsl report --html DIR`: one self-contained static page of a results database, `DIR/index.html`.

Its style and script are inline and its figures inline SVG: it loads nothing, from the network or
from disk, and opens from a file, a mail attachment or a repository's folder alike. Sections: the
sortable leaderboard (per task and aggregate; the settings the scores came from), the per-task
heatmap, every run with its settings, the sweep curves, any studies and searches in the database
(studies.py), and the commands that reproduce it all. The page is a function of the database
alone (no clock in it): the same database gives the same bytes.
"""

from __future__ import annotations

import os
import shlex
from html import escape
from pathlib import Path
from typing import Any

from madsl.outputs import check_output_dir
from madsl.report import sections, studies
from madsl.report.collect import Database, read_database
from madsl.report.page import document
from madsl.runner.reports.leaderboard import mad_task_order
from madsl.runner.reports.outputs import PRETRAIN_TASK, load_runs, task_ceiling
from madsl.runner.reports.scores import spec_scores
from madsl.runner.reports.tables import setting_rows

PAGE = "index.html"


def check_folder(folder: str | os.PathLike, force: bool = False) -> Path:
    """The page's folder, before any work (madsl.outputs.check_output_dir)."""
    return check_output_dir(folder, "--html", {PAGE}.__contains__, force=force, writes=f"the page ({PAGE})")


def _studies(data: Database, scores: dict[str, float]) -> str:
    by_study: dict[str, list[Any]] = {}
    for row in data.runs:
        if row["task"] == PRETRAIN_TASK:
            for name in data.studies(row["run_id"]) or ["(no study label)"]:
                by_study.setdefault(name, []).append(row)
    parts = [studies.study_section(name, rows, data.epochs, scores) for name, rows in sorted(by_study.items())]
    return "".join(parts) or '<p class="empty">No scaling study in this database (madsl scale).</p>'


def _searches(data: Database) -> str:
    parts = [studies.search_section(name, state) for name, state in sorted(data.searches.items())]
    where = escape(f"{data.path.stem}.search-NAME.json")
    return "".join(parts) or f'<p class="empty">No search state beside this database ({where}; madsl search).</p>'


def commands(data: Database, folder: str) -> str:
    """The commands that reproduce the runs and this page."""
    db = shlex.quote(str(data.path))
    lines = ["# this page, and the same numbers as text, CSV and tracker runs"]
    lines += [f"madsl report --db {db} --html {shlex.quote(folder)}", f"madsl report --db {db}"]
    lines += [f"madsl report --db {db} --rows runs --format csv > runs.csv"]
    lines += [f"madsl report --db {db} --export tensorboard tb/ && tensorboard --logdir tb/"]
    by_protocol: dict[str, set[str]] = {}
    spec_paths = {h: row["path"] for h, row in data.specs.items()}
    for row in data.runs:
        for protocol in data.protocols(row["run_id"]):
            by_protocol.setdefault(protocol, set()).add(spec_paths.get(row["spec_hash"]) or f"<{row['spec_name']}>")
    if by_protocol:
        lines.append("# the MAD runs (a run already done is never trained again)")
    for protocol, paths in sorted(by_protocol.items()):
        named = " ".join(shlex.quote(p) if not p.startswith("<") else p for p in sorted(paths))
        if "+" in protocol:
            lines.append(
                f"# {protocol}: runs with settings of their own (see the runs table): madsl eval ... --set ..."
            )
        else:
            lines.append(f"madsl eval {named} --protocol {protocol} --db {db}")
    names = sorted({s for row in data.runs for s in data.studies(row["run_id"])})
    for name in names:
        lines.append(
            f"madsl scale STUDY.yaml --db {db}   # the study named {name}; then madsl report --study STUDY.yaml"
        )
    for name in sorted(data.searches):
        lines.append(f"madsl search SEARCH.yaml --db {db}   # the search named {name} (its state lies beside the db)")
    return f"<pre>{escape(chr(10).join(lines))}</pre>"


def build_page(db: str | os.PathLike, folder: str = "report/") -> str:
    """The page of `db`, as text."""
    from madsl._version import __version__

    data = read_database(db)
    stored = load_runs(db)
    scores = spec_scores(stored.rows, stored.labels, mad_task_order(), stored.length_evals, ceiling=task_ceiling)
    table = setting_rows(stored.rows, stored.labels, stored.length_evals, mad_task_order(), ceiling=task_ceiling)
    by_name = {s.spec: s.score for s in scores if s.score is not None}
    pretrain = sum(row["task"] == PRETRAIN_TASK for row in data.runs)
    searches = len(data.searches)
    subtitle = (
        f"{data.path.name}: {len(data.runs):,} runs ({pretrain:,} of them pretraining), "
        f"{len({s.spec_hash for s in scores})} architectures scored, {searches} search{'es' if searches != 1 else ''}; "
        f"madsl {__version__}"
    )
    parts = [
        ("leaderboard", "Leaderboard", sections.leaderboard(scores)),
        ("heatmap", "Per-task heatmap", sections.heatmap(scores)),
        ("runs", "Runs", sections.runs_table(stored.rows, stored.labels, stored.length_evals)),
        ("sweeps", "Sweep curves", sections.sweeps(table)),
        ("studies", "Scaling studies", _studies(data, by_name)),
        ("searches", "Searches", _searches(data)),
        ("commands", "Commands", commands(data, folder)),
    ]
    return document(f"madsl report: {data.path.name}", subtitle, parts)


def write_page(db: str | os.PathLike, folder: str | os.PathLike, force: bool = False) -> Path:
    """Write `folder/index.html` atomically (the folder checked before any work); its path."""
    from madsl.errors import MadslError
    from madsl.outputs import write_text_atomic

    checked = check_folder(folder, force)
    text = build_page(db, str(folder))
    try:
        checked.mkdir(parents=True, exist_ok=True)
        return write_text_atomic(checked / PAGE, text)
    except OSError as err:
        raise MadslError(f"--html {folder}: cannot be written ({err.strerror or err})") from None
