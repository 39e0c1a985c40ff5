"""The leaderboard as text tables (rich), fitted to the terminal's width.

    board     architectures x tasks, the aggregate ("MAD score" over the six MAD tasks, "mean"
              otherwise), runs and time per run
    per task  score, ceiling, settings, runs, best lr / wd, time per run
    lengths   the best model of each setting at every evaluation length (--eval-lengths)

The protocol and the conventions go in the titles when every row shares them; where the
conventions differ, each row's name says them (`mamba [mad-lab]`). A table that
does not fit the width is laid out again, step by step, until it does: names broken after
their hyphens (`fuzzy-in-` / `context-recall`, never cut), the board's runs and time columns
left to the per-task table, a border-less box; a name is never ellipsized, a last resort
folds it across lines.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from madsl.runner.reports.scores import SpecScore


def mad_task_order() -> list[str]:
    try:
        from madsl.tasks import MAD_TASKS

        return list(MAD_TASKS)
    except ImportError:
        return [
            "in-context-recall",
            "fuzzy-in-context-recall",
            "noisy-in-context-recall",
            "selective-copying",
            "compression",
            "memorization",
        ]


def task_columns(scores: Sequence[SpecScore]) -> list[str]:
    order = mad_task_order()
    seen = {t for s in scores for t in s.tasks}
    return [t for t in order if t in seen] + sorted(seen - set(order))


def aggregate_name(columns: Sequence[str]) -> str:
    """'MAD score' where the columns are the six MAD tasks; 'mean' over any other set of tasks."""
    return "MAD score" if sorted(columns) == sorted(mad_task_order()) else "mean"


def protocols_text(scores: Sequence[SpecScore]) -> str:
    """ ", protocol quick" for titles; empty for scores not filed under a protocol (an eval's own summary)."""
    names = sorted({s.protocol for s in scores if s.protocol})
    if not names:
        return ""
    return (", protocol " if len(names) == 1 else ", protocols ") + ", ".join(names)


def shared_conventions(scores: Sequence[SpecScore]) -> str | None:
    """The conventions every row follows, or None where they differ (then each row's name says them)."""
    names = {s.conventions for s in scores}
    return names.pop() if len(names) == 1 else None


def display_names(keys: Sequence[tuple[str, str, str, str]]) -> dict[tuple, str]:
    """(spec, spec_hash, protocol, conventions) -> the name a table row or plot line shows: the
    spec's name, its hash where two versions share the name, and in brackets the protocol where
    the same spec was scored under several, and the conventions where the rows do not all share
    them (where they do, the titles name them)."""
    keys = list(dict.fromkeys(keys))
    several_conventions = len({k[3] for k in keys}) > 1
    names = {}
    for spec, spec_hash, protocol, conventions in keys:
        name = spec
        if any(o[0] == spec and o[1] != spec_hash for o in keys):
            name += f" ({spec_hash[:8]})"  # two versions of a spec with the same name
        tags = []
        if protocol and any(o[1] == spec_hash and o[2] != protocol for o in keys):
            tags.append(protocol)
        if several_conventions:
            tags.append(conventions)
        names[(spec, spec_hash, protocol, conventions)] = name + (f" [{', '.join(tags)}]" if tags else "")
    return names


def _key(s: SpecScore) -> tuple[str, str, str, str]:
    return s.spec, s.spec_hash, s.protocol, s.conventions


def row_name(s: SpecScore, scores: Sequence[SpecScore]) -> str:
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


# --- fitting a table to the width ------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How much a table gives up to fit: names broken after hyphens into lines of at most
    `wrap` characters (None: whole), the board's runs / time columns dropped, a compact box."""

    wrap: int | None = None
    lean: bool = False
    compact: bool = False
    overflow: str = "ellipsis"  # the last resort: "fold" (split across lines, never "…")


LAYOUTS = (
    Layout(),
    Layout(wrap=12),
    Layout(wrap=12, compact=True),
    Layout(wrap=12, lean=True, compact=True),
    Layout(wrap=8, lean=True, compact=True),
    Layout(wrap=1, lean=True, compact=True),
)


def hyphen_wrap(name: str, width: int | None) -> str:
    """`name` broken after the hyphens of its first word into lines of at most `width`
    characters (where a part is longer, it keeps its own line): every character stays, none
    is cut. What follows the first space (`[quick, mad-lab]`) stays whole on the last line."""
    if width is None:
        return name
    head, space, tail = name.partition(" ")
    lines: list[str] = []
    for part in re.findall(r"[^-]*-|[^-]+$", head):
        if lines and len(lines[-1]) + len(part) <= width:
            lines[-1] += part
        else:
            lines.append(part)
    return "\n".join(lines or [""]) + space + tail


def _text(name: str, layout: Layout):
    """A name as plain text (a sweep variant's `hyena-sg[dim=64]` is not rich markup)."""
    from rich.text import Text

    return Text(hyphen_wrap(name, layout.wrap))


def _table(layout: Layout, title: str):
    from rich import box
    from rich.table import Table

    if layout.compact:
        return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    return Table(title=title)


def _render(table, width: int) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(table)
    return console.file.getvalue()


def fitted(build: Callable[[Layout], object], width: int) -> str:
    """The table `build` makes, rendered in the first layout that cuts nothing at `width`."""
    for layout in LAYOUTS:
        text = _render(build(layout), width)
        if "…" not in text:
            return text
    return _render(build(Layout(wrap=1, lean=True, compact=True, overflow="fold")), width)


# --- the tables ------------------------------------------------------------------------------


def context_text(scores: Sequence[SpecScore]) -> str:
    """ ", protocol quick, conventions madsl" for titles: what every row shares."""
    conventions = shared_conventions(scores)
    return protocols_text(scores) + (f", conventions {conventions}" if conventions else "")


def board_table(scores: Sequence[SpecScore], layout: Layout):
    columns = task_columns(scores)
    board = _table(
        layout,
        f"MAD leaderboard{context_text(scores)} (class-averaged eval accuracy; best over lr x wd, mean over settings)",
    )
    board.add_column("architecture", overflow=layout.overflow)
    for t in columns:
        board.add_column(_text(t, layout), justify="right", overflow=layout.overflow)
    board.add_column(aggregate_name(columns), justify="right", style="bold", overflow=layout.overflow)
    if not layout.lean:
        board.add_column("runs", justify="right", overflow=layout.overflow)
        board.add_column("time/run", justify="right", overflow=layout.overflow)
    for s in scores:
        cells = []
        for t in columns:
            ts = s.tasks.get(t)
            cells.append("-" if ts is None else _fmt(ts.score, ts.metric) + ("" if ts.metric == "accuracy" else " mse"))
        extra = (
            []
            if layout.lean
            else [_fmt_runs(s.runs_done, s.runs_total, s.runs_diverged), _fmt_seconds(s.seconds_per_run)]
        )
        board.add_row(_text(row_name(s, scores), layout), *cells, _fmt(s.score), *extra)
    return board


def detail_table(scores: Sequence[SpecScore], layout: Layout):
    detail = _table(
        layout, "per task (ceiling: the best score any model could reach on the test data, where the task has one)"
    )
    names = (
        ("architecture", "left"),
        ("task", "left"),
        ("score", "right"),
        ("ceiling", "right"),
        ("settings", "right"),
        ("runs", "right"),
        ("best lr", "right"),
        ("best wd", "right"),
        ("time per run", "right"),
    )
    for name, justify in names:
        detail.add_column(name, justify=justify, overflow=layout.overflow)
    for s in scores:
        for i, t in enumerate(s.tasks.values()):  # the architecture named on its first row
            detail.add_row(
                _text(row_name(s, scores) if i == 0 else "", layout),
                _text(t.task, layout),
                _fmt(t.score, t.metric),
                _fmt(t.ceiling),
                str(t.settings),
                _fmt_runs(t.runs_done, t.runs_total, t.runs_diverged),
                "-" if t.best_lr is None else f"{t.best_lr:g}",
                "-" if t.best_wd is None else f"{t.best_wd:g}",
                _fmt_seconds(t.seconds_per_run),
                end_section=i == len(s.tasks) - 1,
            )
    return detail


def _length_cell(ev: dict) -> str:
    if ev["status"] == "oom":
        return "OOM"
    if ev["status"] != "ok" or ev["acc"] is None:
        return "error"
    return f"{ev['acc']:.3f}"


def _length_label(length: int) -> str:
    exponent = length.bit_length() - 1
    return f"2^{exponent}" if length == 1 << exponent and length >= 1024 else str(length)


def _length_rows(scores: Sequence[SpecScore]) -> list:
    def key(ev: dict) -> str:
        return json.dumps(ev["setting"], sort_keys=True)

    return [
        (s, t, json.loads(setting), [ev for ev in t.length_evals if key(ev) == setting])
        for s in scores
        for t in s.tasks.values()
        for setting in dict.fromkeys(key(ev) for ev in t.length_evals)
    ]


def length_table(scores: Sequence[SpecScore], layout: Layout = Layout()):
    """Length extrapolation (Mamba paper Table 11): the best run of each setting, evaluated
    at every --eval-lengths length; accuracy = share of scored positions predicted right."""
    rows = _length_rows(scores)
    if not rows:
        return None
    lengths = sorted({ev["length"] for *_, evs in rows for ev in evs})
    table = _table(
        layout, "length extrapolation (accuracy of the best model at each evaluation length; OOM = out of memory)"
    )
    for name in ("architecture", "task", "trained at"):
        table.add_column(name, overflow=layout.overflow)
    for length in lengths:
        table.add_column(_length_label(length), justify="right", overflow=layout.overflow)
    for s, t, setting, evs in rows:
        trained = setting.get("seq_len")
        by_length = {ev["length"]: ev for ev in evs}
        table.add_row(
            _text(row_name(s, scores), layout),
            _text(t.task, layout),
            "-" if trained is None else str(trained),
            *(_length_cell(by_length[n]) if n in by_length else "" for n in lengths),
        )
    return table


def render_text(scores: Sequence[SpecScore], width: int = 160) -> str:
    """The board, the per-task table and (where runs were evaluated at other lengths) the
    length table, each fitted to `width` columns."""
    if not scores:
        return "no runs in the database yet\n"
    out = fitted(lambda layout: board_table(scores, layout), width)
    out += fitted(lambda layout: detail_table(scores, layout), width)
    if _length_rows(scores):
        out += fitted(lambda layout: length_table(scores, layout), width)
    return out
