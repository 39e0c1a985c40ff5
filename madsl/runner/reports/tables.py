"""Tables for analysis (`madsl report --rows runs|settings`): one row per run or per task setting.

The leaderboard (madsl.runner.reports.outputs) has a row per (spec, task); studies of the paper's
difficulty sweeps need the level below: each run, or each setting's score, with the task
setting's knobs as columns of their own (`setting.seq_len`, `setting.vocab_size`, ...).

    runs      one row per run (row "run": its best epoch), then one per length it was
              evaluated at (row "length": the best checkpoint at `length`, --eval-lengths)
    settings  one row per (spec, protocol, conventions, task, setting) with its score: the
              best accuracy over the lr x wd grid, mean over seeds (as the leaderboard scores
              it); then one per evaluation length of the setting's best run (row "length")

Column order is fixed (RUN_COLUMNS / SETTING_COLUMNS, then the setting knobs sorted by
name); new columns go after the fixed ones, never between them. docs/runner.md lists them.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from typing import Any, Callable, Mapping, Sequence

from madsl.outputs import json_text
from madsl.runner.reports.scores import diverged, group_runs, is_regression, run_conventions, setting_score

SETTING_PREFIX = "setting."
ROW_KINDS = ("runs", "settings")

RUN_COLUMNS = (
    "row",
    "run_id",
    "spec",
    "spec_hash",
    "protocols",
    "conventions",
    "task",
    "setting_hash",
    "lr",
    "wd",
    "epochs",
    "batch_size",
    "seed",
    "precision",
    "status",
    "accuracy",
    "token_accuracy",
    "max_accuracy",
    "loss",
    "ppl",
    "length",
    "length_status",
    "best_epoch",
    "epochs_done",
    "early_stopped",
    "diverged",
    "diverged_epoch",
    "seconds",
    "device",
    "madsl_version",
    "error",
    "threads",
)
SETTING_COLUMNS = (
    "row",
    "spec",
    "spec_hash",
    "protocol",
    "conventions",
    "task",
    "setting_hash",
    "metric",
    "score",
    "token_accuracy",
    "ceiling",
    "length",
    "length_status",
    "seeds",
    "runs_done",
    "runs_total",
    "runs_diverged",
    "best_run_id",
    "best_lr",
    "best_wd",
    "seconds_per_run",
)


def _train_config(row: Mapping[str, Any]) -> dict:
    try:
        config = json.loads(row["train_config"] or "{}")
    except (TypeError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _with_setting(out: dict, setting_json: str) -> dict:
    for knob, value in json.loads(setting_json).items():
        out[SETTING_PREFIX + knob] = value
    return out


def _length_fields(ev: Mapping[str, Any]) -> dict:
    """A length evaluation in the columns both tables share (accuracy class-averaged, as a run's)."""
    return {
        "length": ev["length"],
        "length_status": ev["status"],
        "loss": ev["loss"],
        "ppl": ev["ppl"],
        "token_accuracy": ev["acc"],
    }


def _run_row(r: Mapping[str, Any], labels: Mapping[str, Sequence[str]]) -> dict:
    """A run's row of `run_rows`: its identity, settings and outcome, its task setting as columns."""
    config = _train_config(r)
    return _with_setting(
        {
            "row": "run",
            "run_id": r["run_id"],
            "spec": r["spec_name"],
            "spec_hash": r["spec_hash"],
            "protocols": ",".join(sorted(labels.get(r["run_id"], ()))),
            "conventions": run_conventions(r),
            "task": r["task"],
            "setting_hash": r["setting_hash"],
            "lr": r["lr"],
            "wd": r["wd"],
            "epochs": r["epochs"],
            "batch_size": r["batch_size"],
            "seed": r["seed"],
            "precision": config.get("precision", "fp32"),
            "status": r["status"],
            "accuracy": r["best_eval_acc"],
            "token_accuracy": r["best_eval_token_acc"],
            "max_accuracy": r["max_eval_acc"],
            "loss": r["best_eval_loss"],
            "ppl": r["best_eval_ppl"],
            "length": None,
            "length_status": None,
            "best_epoch": r["best_epoch"],
            "epochs_done": r["epochs_done"],
            "early_stopped": None if r["early_stopped"] is None else bool(r["early_stopped"]),
            "diverged": diverged(r) if r["status"] == "done" else None,
            "diverged_epoch": _get(r, "diverged_epoch"),
            "seconds": r["train_seconds"],
            "device": r["device"],
            "madsl_version": r["madsl_version"],
            "error": r["error"],
            "threads": _get(r, "threads"),
        },
        r["setting"],
    )


def run_rows(
    rows: Sequence[Mapping[str, Any]],
    labels: Mapping[str, Sequence[str]],
    length_evals: Mapping[str, Sequence[Mapping[str, Any]]],
    task_order: Sequence[str] = (),
) -> list[dict]:
    """One row per run, and one per length each run was evaluated at (after it)."""
    out: list[dict] = []
    for r in sorted(rows, key=_run_sort_key(task_order)):
        run = _run_row(r, labels)
        out.append(run)
        for ev in length_evals.get(r["run_id"], ()):
            out.append(
                {
                    **run,
                    "row": "length",
                    **_length_fields(ev),
                    "accuracy": ev["macro_acc"],
                    "max_accuracy": None,
                    "seconds": ev["seconds"],
                    "error": ev["error"],
                }
            )
    return out


def setting_rows(
    rows: Sequence[Mapping[str, Any]],
    labels: Mapping[str, Sequence[str]],
    length_evals: Mapping[str, Sequence[Mapping[str, Any]]],
    task_order: Sequence[str] = (),
    ceiling: Callable[[str, str, Mapping[str, Any], int], float | None] | None = None,
) -> list[dict]:
    """One row per scored setting of each (spec, protocol, conventions, task), as the
    leaderboard scores it; the evaluation lengths of the setting's best run after it."""
    order = {t: i for i, t in enumerate(task_order)}
    out: list[dict] = []
    groups = group_runs(rows, labels)
    for spec_hash, protocol, conventions in sorted(groups, key=lambda k: (groups[k][0]["spec_name"], *k)):
        group = groups[(spec_hash, protocol, conventions)]
        tasks = sorted({r["task"] for r in group}, key=lambda t: (order.get(t, len(order)), t))
        for task in tasks:
            task_rows = [r for r in group if r["task"] == task]
            regression = is_regression(task_rows)
            for setting in sorted({r["setting"] for r in task_rows}, key=_setting_sort_key):
                runs = [r for r in task_rows if r["setting"] == setting]
                score, best, bests = setting_score(runs, regression, with_bests=True)
                if score is None:
                    continue  # nothing finished yet: no score to show
                done = [r for r in runs if r["status"] == "done"]
                seconds = [r["train_seconds"] for r in done if r["train_seconds"] is not None]
                token = [b["best_eval_token_acc"] for b in bests if b["best_eval_token_acc"] is not None]
                seeds = sorted({b["seed"] for b in bests})
                row = _with_setting(
                    {
                        "row": "setting",
                        "spec": best["spec_name"],
                        "spec_hash": spec_hash,
                        "protocol": protocol,
                        "conventions": conventions,
                        "task": task,
                        "setting_hash": best["setting_hash"],
                        "metric": "mse" if regression else "accuracy",
                        "score": score,
                        "token_accuracy": None if regression or len(token) != len(bests) else statistics.fmean(token),
                        "ceiling": _setting_ceiling(ceiling, task, conventions, setting, seeds),
                        "length": None,
                        "length_status": None,
                        "seeds": len(seeds),
                        "runs_done": len(done),
                        "runs_total": len([r for r in runs if r["status"] != "skipped"]),
                        "runs_diverged": sum(map(diverged, done)),
                        "best_run_id": best["run_id"],
                        "best_lr": best["lr"],
                        "best_wd": best["wd"],
                        "seconds_per_run": statistics.fmean(seconds) if seconds else None,
                    },
                    setting,
                )
                out.append(row)
                for ev in length_evals.get(best["run_id"], ()):
                    out.append(
                        {**row, "row": "length", **_length_fields(ev), "score": ev["macro_acc"], "ceiling": None}
                    )
    return out


def _setting_ceiling(ceiling, task: str, conventions: str, setting: str, seeds: Sequence[int]) -> float | None:
    if ceiling is None or not seeds:
        return None
    values = [ceiling(task, conventions, json.loads(setting), seed) for seed in seeds]
    return None if any(v is None for v in values) else statistics.fmean(values)


def _get(row: Mapping[str, Any], key: str) -> Any:
    try:  # databases from before the column have no such key
        return row[key]
    except (KeyError, IndexError):
        return None


def _sortable(value: Any) -> tuple:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, json.dumps(value, sort_keys=True))


def _setting_sort_key(setting: str) -> tuple:
    return tuple((k, _sortable(v)) for k, v in sorted(json.loads(setting).items()))


def _run_sort_key(task_order: Sequence[str]):
    order = {t: i for i, t in enumerate(task_order)}
    return lambda r: (
        r["spec_name"],
        r["spec_hash"],
        order.get(r["task"], len(order)),
        r["task"],
        _setting_sort_key(r["setting"]),
        r["seed"],
        -r["lr"],
        r["wd"],
        r["run_id"],
    )


def columns(kind: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The fixed columns of a table kind, then every setting knob that occurs, by name."""
    fixed = RUN_COLUMNS if kind == "runs" else SETTING_COLUMNS
    knobs = sorted({k for r in records for k in r if k.startswith(SETTING_PREFIX)})
    return [*fixed, *knobs]


def as_json(kind: str, records: Sequence[Mapping[str, Any]]) -> str:
    """A list of objects, each with every column (null where a row has no value)."""
    names = columns(kind, records)
    return json_text([{k: r.get(k) for k in names} for r in records], indent=2) + "\n"


def csv_cell(value: Any) -> Any:
    """Booleans as true / false, lists and mappings as JSON text, nothing as an empty cell."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return "" if value is None else value


def as_csv(kind: str, records: Sequence[Mapping[str, Any]]) -> str:
    names = columns(kind, records)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(names)
    writer.writerows([csv_cell(r.get(k)) for k in names] for r in records)
    return buffer.getvalue()
