"""The scaling study's Python API: plan a study file (`plan_study_file`), cost it (`study_cost`),
train it (`scale`), read its results back as points of IsoFLOP curves (`study_points`).

    summary = scale("studies/shakespeare.yaml", workers=2)          # trains; resumes where it stopped
    plan = scale("studies/shakespeare.yaml", dry_run=True)["plan"]  # the grid and its cost

A study's runs share the results store, executors and resume of `madsl eval`: each is a run of
the task "pretrain" whose identity is its sized spec, the data's content hash, the budget and the
recipe, filed under the label `scale:<study name>`. Prints nothing (progress goes to `reporter`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from madsl.errors import MadslError, option
from madsl.runner.pretrain.recipe import RECIPE
from madsl.runner.store.results import DEFAULT_DB, RunIdentity, madsl_version
from madsl.scaling.grid import ScaleRun, fitted_values, plan_study
from madsl.scaling.stacks import jobs_of, show_stacks, stacking, stacks
from madsl.scaling.study import Study, load_study, study_location

PRETRAIN_TASK = "pretrain"
LABEL_PREFIX = "scale:"
MAX_LOSS = 1e3  # nats a token: ~45 times a uniform guess over 2^32 tokens; no run ends its budget there
MIN_RATE = 1.0  # FLOP/s: a rate stated below it is a slip of the exponent (and makes the hours overflow)


@dataclass
class StudyPlan:
    """A study with its data opened and every run planned and identified."""

    study: Study
    data_dir: Path
    tokens: Any  # madsl.corpus.TokenData
    runs: list[ScaleRun]
    run_ids: list[str]

    @property
    def label(self) -> str:
        return LABEL_PREFIX + self.study.name

    def identity(self, run: ScaleRun) -> RunIdentity:
        info = self.tokens.info
        setting = {
            "data": info.hash,
            "vocab": info.vocab_size,
            "budget": run.budget,
            "arch": run.arch,
            "size": run.size,
        }
        train = {**run.settings.identity(), "wd": run.settings.wd, "epochs": len(run.settings.evaluation_steps())}
        return RunIdentity(run.spec.hash, PRETRAIN_TASK, setting, train, madsl_version())


def _data_dir(study: Study, files_dir: Path) -> Path:
    """The study's token folder: a bundled corpus is prepared once under the store's files. A
    relative path stays in the study's folder (the path rule, madsl.paths: a study may come from
    someone else, and `..` or a link must not make it read elsewhere); an absolute one is the
    user's whole path."""
    from madsl.corpus import resolve_tokens
    from madsl.paths import inside, require_path

    if study.data.startswith("bundled:"):
        return resolve_tokens(study.data, files_dir / "corpora").path
    where = study_location(study, "data")
    given = require_path(study.data, "data", where)
    home = study.path.parent
    named = given if given.is_absolute() else home / given
    if not given.is_absolute() and not inside(named, home):
        raise MadslError(
            f"data: {study.data} leads out of the study's folder {home.resolve()} (to {named.resolve()}), not read",
            where,
            hint="name a token folder elsewhere by its absolute path",
        )
    path = named.resolve()
    if not path.is_dir():
        raise MadslError(
            f"data: no token folder at {study.data} (looked in {path})",
            where,
            hint="prepare one with `madsl data prepare TEXT... -o DIR`, or name bundled:tinyshakespeare",
        )
    return path


def _check_windows(study: Study, tokens: Any, runs: list[ScaleRun]) -> None:
    """Each split holds a window of the longest run, and an `eval_tokens` given scores that many
    (val_windows would silently score fewer)."""
    longest = max(r.settings.seq_len + 1 for r in runs)
    for split in ("train", "val"):
        if tokens.info.tokens(split) < longest:
            raise MadslError(
                f"data: the {split} split holds {tokens.info.tokens(split):,} tokens, fewer than one "
                f"window of {longest:,}",
                study_location(study, "data"),
                hint="use more text, or a shorter seq_len",
            )
    if "eval_tokens" in study.recipe:
        windows = (tokens.info.tokens("val") - 1) // study.seq_len
        if study.recipe["eval_tokens"] // study.seq_len > windows:
            raise MadslError(
                f"eval_tokens {study.recipe['eval_tokens']:,} is more than the validation split holds: "
                f"{windows:,} windows of {study.seq_len:,} ({windows * study.seq_len:,} tokens)",
                study_location(study, "recipe", "eval_tokens"),
                hint=f"at most {windows * study.seq_len:,}, or leave it out (the split's first "
                f"{RECIPE.by_name['eval_tokens'].default:,} tokens, as many as it holds)",
            )


def plan_study_file(
    path: str | os.PathLike, db: str | os.PathLike = DEFAULT_DB, precision: str | None = None
) -> StudyPlan:
    """Read the study, open (or prepare) its data, plan and identify every run; nothing trains.
    `precision` (fp32 or bf16) replaces the recipe's."""
    from madsl.corpus import open_tokens
    from madsl.runner.store.files import StoreFiles

    study = load_study(path)
    if precision is not None:
        study.recipe["precision"] = precision
    data_dir = _data_dir(study, StoreFiles(db).files_dir)
    tokens = open_tokens(data_dir, dtype=study.data_dtype, vocab_size=study.data_vocab)
    runs = plan_study(study, tokens.info.vocab_size)
    _check_windows(study, tokens, runs)
    plan = StudyPlan(study, data_dir, tokens, runs, [])
    plan.run_ids = [plan.identity(r).run_id for r in runs]
    return plan


def stored_runs(plan: StudyPlan, db: str | os.PathLike) -> dict[str, Any]:
    """The database rows of the plan's runs that it holds (run id -> row)."""
    return _done(db, plan.run_ids)


def _done(db: str | os.PathLike, run_ids: list[str]) -> dict[str, Any]:
    from madsl.runner.store.results import Store

    if not Path(db).exists():
        return {}
    store = Store(db, create=False)
    try:
        return {run_id: row for run_id in run_ids if (row := store.run(run_id)) is not None}
    finally:
        store.close()


def _run_seconds(
    plan: StudyPlan, device: str, remeasure: bool = False, threads: int | None = None
) -> tuple[list[float | None], dict[str, Any]]:
    """Each run's training seconds on `device`, `threads` torch threads a run (None: this
    process's), at this machine's cached per-family rates (the
    plan's, madsl.runner.plan.rate: measured once and cached), by the cost model's estimator
    (madsl.runner.plan.cost.run_seconds), with where the rates come from (and their "interval")."""
    from madsl.runner.plan.cost import Shapes, device_rates, run_seconds
    from madsl.runner.plan.rate import RateBook

    shapes = Shapes()
    vocab = plan.tokens.info.vocab_size
    models = [shapes.of(run.spec, run.settings.seq_len, vocab) for run in plan.runs]
    families = {layer[0] for model in models for layer in model.layers}
    book = RateBook.default(remeasure=remeasure)
    rates = device_rates({device: families}, book, threads).get(device)
    if rates is None:  # a device this machine lacks (cuda, planned on a Ray head without a GPU)
        return [None] * len(plan.runs), {"device": device, "unavailable": book.unavailable.get(device, "")}
    seconds = []
    for run, model in zip(plan.runs, models):
        s = run.settings
        evaluations = len(s.evaluation_steps()) * max(1, s.eval_tokens // s.tokens_per_step)
        steps = (s.steps, s.batch_size), (evaluations, s.batch_size)
        seconds.append(run_seconds(rates, model.layers, s.seq_len, *steps, model=(vocab, model.params)))
    return seconds, rates.describe(sorted(families))


def _startup_hours(rates: dict[str, Any], workers: int, pending: bool) -> tuple[float | None, int, float, float]:
    """(a process's start-up seconds, the processes that pay it, their CPU hours, the wall hours
    before the first step): as madsl.runner.plan.cost plans a command's start-up."""
    from madsl.runner.plan.rate_model import startup_cost

    startup, processes = startup_cost([rates], workers, "local")
    started = (startup or 0.0) * processes / 3600 if pending else 0.0
    return startup, processes, started, started if processes == 1 or not started else 2 * startup / 3600


def study_cost(
    plan: StudyPlan,
    db: str | os.PathLike = DEFAULT_DB,
    workers: int = 1,
    flops_per_second: float | None = None,
    device: str = "auto",
    measure_rate: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """The grid with each run's parameters, tokens, FLOPs, state and estimated hours: at
    `flops_per_second` where given (e.g. a GPU's sustained rate), else at this machine's cached
    per-family training rates on `device` (an evaluation is a forward pass: FORWARD_SHARE of a
    training step's cost, madsl.runner.common.choices), each run on `threads` torch threads on
    the CPU (None: this process's)."""
    interval = [1.0, 1.0]  # the factors around the hours where the rates were measured: [low, high]
    rates: dict[str, Any] = {}
    if flops_per_second:
        seconds, source = [run.flops / flops_per_second for run in plan.runs], "as given"
    else:
        seconds, rates = _run_seconds(plan, device, measure_rate, threads)
        if "unavailable" in rates:
            source = f"not estimated on {rates['device']}: {rates['unavailable']}"
        else:
            when = f"cached, measured {rates['measured']}" if not rates["measured_now"] else "measured now"
            source = f"at the per-layer-family training rates of {rates['device']}, {when}"
            interval = rates.get("interval", interval)
    rows = _cost_rows(plan, seconds, _done(db, plan.run_ids))
    pending = [r for r in rows if r["status"] != "done"]
    hours = sum(r["hours"] or 0.0 for r in pending)
    unknown = [r for r in pending if r["hours"] is None]
    startup, processes, started, wall_start = _startup_hours(rates, workers, bool(pending))
    failed = {} if flops_per_second or "unavailable" in rates else rates.get("failed", {})
    why = "; ".join(f"{family}: {reason}" for family, reason in failed.items()) or source
    return {
        "study": plan.study.name,
        "data": str(plan.data_dir),
        "runs": rows,
        "done": len(rows) - len(pending),
        "flops": sum(r["flops"] for r in rows),
        "rate_source": source,
        "workers": workers,
        "threads": threads,
        "hours": hours,  # training
        "wall_hours": hours / max(1, workers) + wall_start,
        "hours_interval": [hours * factor for factor in interval],
        "wall_hours_interval": [hours * factor / max(1, workers) + wall_start for factor in interval],
        "startup_seconds": startup,
        "processes": processes,
        "cpu_hours": hours + started,  # the command's CPU time: training and each process's start-up
        "cpu_hours_interval": [hours * factor + started for factor in interval],
        "warnings": [
            f"{len(unknown)} of {len(pending)} runs to do have no time estimate ({why}): the hours leave them out"
        ]
        if unknown
        else [],
    }


def _cost_rows(plan: StudyPlan, seconds: list[float | None], stored: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's row of each run: its model, budget, tokens and estimated hours, and its status."""
    rows = []
    for run, run_id, run_seconds in zip(plan.runs, plan.run_ids, seconds):
        row = stored.get(run_id)
        rows.append(
            {
                "run_id": run_id,
                "arch": run.arch,
                "budget": run.budget,
                "size": run.size,
                "dim": run.spec.dim,
                "params": run.params,
                "state": run.state,
                "tokens": run.tokens,
                "steps": run.settings.steps,
                "batch_size": run.settings.batch_size,
                "lr": run.settings.lr,
                "flops": run.flops,
                "hours": None if run_seconds is None else run_seconds / 3600,
                "status": row["status"] if row is not None else "new",
                **({"fitted": fitted_values(run.spec)} if run.spec.fit else {}),
            }
        )
    return rows


def _register(store: Any, plan: StudyPlan) -> None:
    for name, spec in plan.study.architectures.items():
        store.add_spec(spec.hash, name, spec.identity_text, plan.study.spec_paths[name])
    for run in plan.runs:
        store.add_spec(run.spec.hash, run.spec.name, run.spec.identity_text, None)
    store.add_runs([(plan.identity(run), run.spec.name) for run in plan.runs], plan.label)


def _check_options(execution: Any, flops_per_second: float | None) -> None:
    """What a study's runs cannot do, and a training rate that is no rate: refused before any work."""
    if flops_per_second is not None and (
        isinstance(flops_per_second, bool)
        or not isinstance(flops_per_second, (int, float))
        or not MIN_RATE <= flops_per_second < math.inf
    ):
        raise MadslError(
            f"{option('flops_per_second')} {flops_per_second!r}: expected a finite training rate of at "
            f"least {MIN_RATE:g} FLOP/s",
            hint="e.g. 3e14 for a GPU's sustained bf16 rate",
        )
    if execution.keep not in (None, "none"):
        raise MadslError(f"{option('keep')}: a pretraining run keeps no weights")


def scale(
    path: str | os.PathLike,
    execution: Any = None,
    *,
    reporter: Any = None,
    stop: Callable[[], bool] | None = None,
    flops_per_second: float | None = None,
    precision: str | None = None,
    **options: Any,
) -> dict:
    """Train a study's runs (those not done yet); `execution`: an Execution of
    madsl.runner.execute.options (db, workers, device, executor, address, cpus_per_run, gpus_per_run,
    checkpoint_every, dry_run), or the same as keywords. `precision`: fp32, bf16 or auto in place of
    the study recipe's, resolved where the runs train as madsl eval resolves it (auto: bf16 on a CUDA
    device with bf16, else fp32). The runs go through madsl.runner.launch.run, as madsl eval's do.
    A dry run returns {"plan": study_cost(...)}."""
    from madsl.runner.common.choices import PRECISIONS
    from madsl.runner.execute.options import Execution
    from madsl.runner.launch import check_store, place, run, run_precision, run_threads_placed

    execution = execution if execution is not None else Execution(**options)
    _check_options(execution, flops_per_second)
    check_store(execution)
    where = place(execution, stacked=False)
    if precision not in (None, *PRECISIONS):
        raise MadslError(
            f"{option('precision')} must be {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}, got {precision!r}"
        )
    plan = plan_study_file(path, execution.db, None if precision is None else run_precision(precision, where))
    batch = stacking(execution, where)  # (whether, the widest model stacked); after the plan: it may import torch
    groups = stacks(plan, *batch)
    if execution.dry_run or (reporter is not None and reporter.shows_plan):
        cost = study_cost(
            plan,
            execution.db,
            execution.workers if where.ray is None else 1,
            flops_per_second,
            execution.device,
            bool(execution.measure_rate),
            run_threads_placed(execution, where),
        )
        show_stacks(cost, plan, groups, *batch)
        if execution.dry_run:
            return {"db": str(execution.db), "plan": cost}
        reporter.plan(cost, [])
    jobs = jobs_of(plan, execution.db, execution, groups)
    outcome = run(
        jobs, execution, reporter=reporter, stop=stop, register=lambda store: _register(store, plan), placement=where
    )
    return {
        "db": str(execution.db),
        "study": plan.study.name,
        "runs": len(plan.runs),  # runs, not jobs: a stack is one job of several runs
        "jobs": len(jobs),
        "done": len(outcome.done),
        "already_done": len(outcome.already_done),
        "failed": dict(outcome.failed),
        "interrupted": len(outcome.interrupted),
        "complete": outcome.complete,
    }


def study_points(
    plan: StudyPlan,
    db: str | os.PathLike = DEFAULT_DB,
    problems: list[str] | None = None,
    stored: dict[str, Any] | None = None,
    params: str = "total",
) -> list[Any]:
    """The finished runs of a study as IsoFLOP points (madsl.scaling.fits.ScalePoint): the final
    validation loss of each model (architecture, budget, size), with its parameters, tokens and
    total state. Where the study has a learning-rate ladder, a model's loss is its best rate's
    (per seed: the tuned run, as the paper tunes each model); with seed replicates, the mean over
    the seeds that finished. The database is untrusted input: a finished run whose loss is not a
    positive finite number (text, bytes, 0, negative, infinite, missing) is left out and named,
    with the database, in `problems`. `stored`: the runs' rows read elsewhere (a runs file,
    madsl.scaling.raw_runs) in place of the database's. `params`: the points' N, total,
    non-embedding or active (madsl.scaling.optima.run_params)."""
    models, first = _tuned(plan, db, problems, stored)
    return [_point(run, sum(models[key].values()) / len(models[key]), params) for key, run in first.items()]


def study_points_by_seed(
    plan: StudyPlan, db: str | os.PathLike = DEFAULT_DB, stored: dict[str, Any] | None = None, params: str = "total"
) -> dict[int, list[Any]]:
    """Seed -> the IsoFLOP points of the models that seed finished (each its best rate's loss, as
    study_points tunes it, not averaged): the seed replicates' own curves."""
    models, first = _tuned(plan, db, None, stored)
    out: dict[int, list[Any]] = {}
    for key, run in first.items():
        for seed, loss in sorted(models[key].items()):
            out.setdefault(seed, []).append(_point(run, loss, params))
    return out


def _point(run: ScaleRun, loss: float, params: str = "total") -> Any:
    from madsl.scaling.fits import ScalePoint
    from madsl.scaling.optima import run_params

    return ScalePoint(
        arch=run.arch,
        budget=run.budget,
        params=float(run_params(run, params)),
        tokens=float(run.tokens),
        loss=loss,
        state=float(run.state),
    )


def _tuned(
    plan: StudyPlan, db: str | os.PathLike, problems: list[str] | None, stored: dict[str, Any] | None
) -> tuple[dict[tuple, dict[int, float]], dict[tuple, ScaleRun]]:
    """(arch, budget, size) -> seed -> its best rate's final loss, and each model's first run."""
    stored = _done(db, plan.run_ids) if stored is None else stored
    models: dict[tuple, dict[int, float]] = {}  # (arch, budget, size) -> seed -> its best loss
    first: dict[tuple, ScaleRun] = {}
    for run, run_id in zip(plan.runs, plan.run_ids):
        row = stored.get(run_id)
        if row is None or row["status"] != "done" or row["diverged_epoch"] is not None:
            continue  # not finished, or diverged (no loss at its budget): counted as missing by the report
        loss = row["best_eval_loss"]
        why = _bad_loss(loss)
        if why is not None:
            if problems is not None:
                problems.append(
                    f"results database {db}: run {run_id} ({run.arch} {run.size} @ {run.budget:.3g} "
                    f"FLOPs) is done with a final loss of {_shown(loss)}, {why}; left out"
                )
            continue
        key = (run.arch, run.budget, run.size)
        first.setdefault(key, run)
        seeds = models.setdefault(key, {})
        seeds[run.settings.seed] = min(float(loss), seeds.get(run.settings.seed, math.inf))
    return models, first


def _bad_loss(loss: Any) -> str | None:
    """Why a stored loss is no cross-entropy at a budget (None: it is one)."""
    if isinstance(loss, bool) or not isinstance(loss, (int, float)):
        return "not a number" if loss is not None else "which is missing"
    if not math.isfinite(loss):
        return "not finite (and the run is not marked diverged)"
    if loss <= 0:
        return "not above 0"
    return f"above {MAX_LOSS:,.0f} nats (no cross-entropy a run ends its budget with)" if loss > MAX_LOSS else None


def _shown(value: Any) -> str:
    text = repr(value)  # repr: a planted escape sequence is shown, not sent to the terminal
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["StudyPlan", "plan_study_file", "study_cost", "scale", "study_points"]
