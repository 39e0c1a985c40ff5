"""MAD scores from finished runs (MAD paper §3.2, App. B.4).

    run accuracy    class-averaged eval accuracy of the run's best epoch (lowest eval perplexity);
                    the token accuracy for runs with `metric: token`
    setting score   the best run accuracy over the lr x wd grid (mean over seeds if several)
    task score      mean over the task's settings (baseline + difficulty sweep) of the setting scores
    MAD score       mean over tasks of the task scores

Runs under different conventions (madsl.conventions) are scored apart, like runs of
different protocols: a (spec, protocol, conventions) triple is one row of the report.

Regression tasks (head "regress") have no accuracy: their score is the eval MSE
(lower is better; best over the grid = lowest), reported with metric "mse" and
left out of the MAD score.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence


@dataclass
class TaskScore:
    spec_hash: str
    spec: str
    protocol: str
    task: str
    score: float | None
    metric: str  # "accuracy" or "mse"
    settings: int  # settings with at least one finished run
    runs_done: int
    runs_total: int
    best_lr: float | None
    best_wd: float | None
    seconds_per_run: float | None
    setting_scores: dict[str, float] = field(default_factory=dict)  # setting JSON -> score
    best_runs: dict[str, str] = field(default_factory=dict)  # setting JSON -> run_id of its best run
    # The best run's evaluations at other sequence lengths (--eval-lengths), per setting:
    # {"setting": {knob: value}, "length", "status" (ok | oom | error), "acc", "macro_acc", "loss", "seconds"}
    length_evals: list[dict[str, Any]] = field(default_factory=list)
    runs_diverged: int = 0  # finished runs whose loss became NaN / inf (their best finite epoch counts)
    conventions: str = "madsl"
    # the best score any model could reach, mean over the settings scored (where the task has one)
    ceiling: float | None = None

    def record(self) -> dict:
        out = asdict(self)
        out.pop("setting_scores")
        out.pop("best_runs")
        return out


@dataclass
class SpecScore:
    spec_hash: str
    spec: str
    protocol: str
    score: float | None  # MAD score: mean over the accuracy-scored tasks
    tasks: dict[str, TaskScore]
    runs_done: int
    runs_total: int
    seconds_per_run: float | None
    runs_diverged: int = 0
    conventions: str = "madsl"


def diverged(row: Mapping[str, Any]) -> bool:
    """The run's loss became NaN / inf (databases from before the flag have no such column)."""
    try:
        return row["diverged_epoch"] is not None
    except (KeyError, IndexError):
        return False


def _train_option(row: Mapping[str, Any], key: str, default: Any) -> Any:
    try:
        config = json.loads(row["train_config"] or "{}")
    except (KeyError, IndexError, TypeError, ValueError):
        return default
    return config.get(key, default) if isinstance(config, dict) else default


def run_conventions(row: Mapping[str, Any]) -> str:
    """The conventions a run trained under (runs from before they existed: madsl)."""
    return _train_option(row, "conventions", "madsl")


def _task_ceiling(
    ceiling: Callable[[str, str, Mapping[str, Any], int], float | None],
    ts: "TaskScore",
    rows: Sequence[Mapping[str, Any]],
) -> float | None:
    per_setting = []
    for setting in ts.setting_scores:
        seeds = sorted({r["seed"] for r in rows if r["setting"] == setting and r["status"] == "done"})
        values = [ceiling(ts.task, ts.conventions, json.loads(setting), seed) for seed in seeds]
        if not values or any(v is None for v in values):
            return None
        per_setting.append(statistics.fmean(values))
    return statistics.fmean(per_setting) if per_setting else None


def run_accuracy(row: Mapping[str, Any]) -> float | None:
    """The run's accuracy at its best epoch: class-averaged, or the token accuracy for runs
    with `metric: token` (madsl.runner.train.options)."""
    if _train_option(row, "metric", "macro") == "token":
        return row["best_eval_token_acc"]
    return row["best_eval_acc"]


def is_regression(rows: Sequence[Mapping[str, Any]]) -> bool:
    """A regression task's runs: finished, with neither accuracy nor perplexity (scored by MSE)."""
    done = [r for r in rows if r["status"] == "done" and not diverged(r)]  # a diverged run has neither metric
    return bool(done) and all(r["best_eval_acc"] is None and r["best_eval_ppl"] is None for r in done)


def setting_score(rows: Sequence[Mapping[str, Any]], regression: bool = False, with_bests: bool = False) -> tuple:
    """Best over the grid (per seed), mean over seeds. Returns (score, the best run of the first seed),
    and with `with_bests` also the best run of every seed."""
    by_seed: dict[int, list] = defaultdict(list)
    for r in rows:
        if r["status"] != "done":
            continue
        value = r["best_eval_loss"] if regression else run_accuracy(r)
        if value is not None:
            by_seed[r["seed"]].append((value, r))
    if not by_seed:
        return (None, None, []) if with_bests else (None, None)
    pick = min if regression else max
    bests = [pick(values, key=lambda vr: vr[0]) for _, values in sorted(by_seed.items())]
    score = statistics.fmean(v for v, _ in bests)
    return (score, bests[0][1], [r for _, r in bests]) if with_bests else (score, bests[0][1])


def task_score(rows: Sequence[Mapping[str, Any]], spec_hash: str, spec: str, protocol: str, task: str) -> TaskScore:
    """The task score of one spec from its runs of that task (any status)."""
    regression = is_regression(rows)
    by_setting: dict[str, list] = defaultdict(list)
    for r in rows:
        by_setting[r["setting"]].append(r)
    setting_scores: dict[str, float] = {}
    best_runs: dict[str, str] = {}
    best_grid_points: list[tuple[float, float]] = []
    for setting, group in by_setting.items():
        score, best = setting_score(group, regression)
        if score is not None:
            setting_scores[setting] = score
            best_runs[setting] = best["run_id"]
            best_grid_points.append((best["lr"], best["wd"]))
    done = [r for r in rows if r["status"] == "done"]
    seconds = [r["train_seconds"] for r in done if r["train_seconds"] is not None]
    # The grid point that is best in most settings (ties: the first seen).
    best_lr, best_wd = Counter(best_grid_points).most_common(1)[0][0] if best_grid_points else (None, None)
    return TaskScore(
        spec_hash=spec_hash,
        spec=spec,
        protocol=protocol,
        task=task,
        score=statistics.fmean(setting_scores.values()) if setting_scores else None,
        metric="mse" if regression else "accuracy",
        settings=len(setting_scores),
        runs_done=len(done),
        runs_total=len([r for r in rows if r["status"] != "skipped"]),
        best_lr=best_lr,
        best_wd=best_wd,
        seconds_per_run=statistics.fmean(seconds) if seconds else None,
        setting_scores=setting_scores,
        best_runs=best_runs,
        runs_diverged=sum(map(diverged, done)),
    )


def mad_score(task_scores: Iterable[TaskScore]) -> float | None:
    values = [t.score for t in task_scores if t.metric == "accuracy" and t.score is not None]
    return statistics.fmean(values) if values else None


def group_runs(
    rows: Iterable[Mapping[str, Any]], labels: Mapping[str, Sequence[str]] | None = None
) -> dict[tuple[str, str, str], list]:
    """(spec_hash, protocol, conventions) -> its runs: a run counts under each protocol that
    asked for it (labels: run_id -> protocols; none: protocol "")."""
    groups: dict[tuple[str, str, str], list] = defaultdict(list)
    for r in rows:
        for protocol in (labels or {}).get(r["run_id"], None) or [""]:
            groups[(r["spec_hash"], protocol, run_conventions(r))].append(r)
    return groups


def _best_length_evals(ts: TaskScore, length_evals: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The length evaluations of a task score's best run at each setting, with the setting."""
    return [
        {
            "setting": json.loads(setting),
            "length": ev["length"],
            "status": ev["status"],
            "acc": ev["acc"],
            "macro_acc": ev["macro_acc"],
            "loss": ev["loss"],
            "seconds": ev["seconds"],
        }
        for setting, run_id in ts.best_runs.items()
        for ev in length_evals.get(run_id, ())
    ]


def spec_scores(
    rows: Iterable[Mapping[str, Any]],
    labels: Mapping[str, Sequence[str]] | None = None,
    task_order: Sequence[str] = (),
    length_evals: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ceiling: Callable[[str, str, Mapping[str, Any], int], float | None] | None = None,
) -> list[SpecScore]:
    """Scores of every (spec, protocol) in `rows`, best MAD score first.

    labels: run_id -> protocols that asked for it; a run counts in each of them.
    length_evals: run_id -> its rows of the store's length_evals table; the best run of
    each setting lends its rows to the task score.
    ceiling(task, conventions, setting, seed): the task's ceiling at a setting, or None;
    a task score's ceiling is its mean over the scored settings (over seeds within one).
    """
    rows = list(rows)
    groups = group_runs(rows, labels)
    names = {r["spec_hash"]: r["spec_name"] for r in rows}
    out: list[SpecScore] = []
    order = {t: i for i, t in enumerate(task_order)}
    for (spec_hash, protocol, conventions), group in groups.items():
        by_task: dict[str, list] = defaultdict(list)
        for r in group:
            by_task[r["task"]].append(r)
        tasks = {
            t: task_score(by_task[t], spec_hash, names[spec_hash], protocol, t)
            for t in sorted(by_task, key=lambda t: (order.get(t, len(order)), t))
        }
        for ts in tasks.values():
            ts.conventions = conventions
            if ceiling is not None:
                ts.ceiling = _task_ceiling(ceiling, ts, by_task[ts.task])
            ts.length_evals = _best_length_evals(ts, length_evals or {})
        done = [r for r in group if r["status"] == "done"]
        seconds = [r["train_seconds"] for r in done if r["train_seconds"] is not None]
        out.append(
            SpecScore(
                spec_hash=spec_hash,
                spec=names[spec_hash],
                protocol=protocol,
                score=mad_score(tasks.values()),
                tasks=tasks,
                runs_done=len(done),
                runs_total=len([r for r in group if r["status"] != "skipped"]),
                seconds_per_run=statistics.fmean(seconds) if seconds else None,
                runs_diverged=sum(map(diverged, done)),
                conventions=conventions,
            )
        )
    out.sort(key=lambda s: (s.score is None, -(s.score or 0.0), s.spec, s.protocol, s.conventions))
    return out
