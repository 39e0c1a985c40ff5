"""The runner's Python API: `evaluate` specs on MAD tasks, `report` the results.

    summary = evaluate(["specs/paper/striped-hyena-moe.mad"], protocol="quick", workers=2)
    print(report("madsl-results.db"))
"""
from __future__ import annotations

import math
from dataclasses import dataclass
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from madsl.errors import MadslError, option
from madsl.runner.config import EvalConfig
from madsl.runner.execute.devices import (_check_workers_and_device, _make_executor, _planned_device, _ray_device,
                                          _ray_options, default_batch_grid, place_devices, resolve_cuda_graphs)
from madsl.runner.execute.local import Executor
from madsl.runner.execute.coordinator import Outcome, Reporter, run_jobs
from madsl.runner.plan.evaluation import (EvaluationPlan, _load_specs, _task_registry, cli_overrides, plan_evaluation,
                                          plan_spec)
from madsl.runner.plan.memory import check_fits
from madsl.runner.reports.outputs import load_scores
from madsl.runner.reports.outputs import report as _report
from madsl.runner.store.database import check_database
from madsl.runner.store.files import StoreFiles
from madsl.runner.store.results import DEFAULT_DB, Store


def evaluate(spec_paths: Sequence[Any], config: EvalConfig | None = None, *, reporter: Reporter | None = None,
             stop: Callable[[], bool] | None = None, model_factory: Callable[[Any], Any] | None = None,
             task_registry: Mapping[str, Any] | None = None, **keywords: Any) -> dict:
    """Evaluate specs on tasks under a protocol; finished runs in `db` are never repeated.
    Prints nothing: progress goes to `reporter` (madsl.runner.execute.coordinator.Reporter; the
    command line's is madsl.cli.progress.RichReporter), and `stop` is polled (once true, runs
    checkpoint and stop; the command line sets it on Ctrl-C and SIGTERM).

    spec_paths: .mad files (or Spec objects).
    config: an EvalConfig (madsl.runner.config): the settings of what the runs train
    (madsl.runner.plan.settings: protocol, tasks, set, lr, wd, epochs, batch_size, seed,
    eval_lengths, freeze, precision, conventions, optimizer, schedule, metric, stop_acc,
    patience, min_delta, lm_head) and the options of how they execute
    (madsl.runner.execute.options: db, workers, device, devices, executor, address,
    cpus_per_run, gpus_per_run, batch_grid, cuda_graphs, keep, checkpoint_every, dry_run; the
    executor may be an Executor object). Or the same as keywords: `evaluate(specs,
    protocol="quick", workers=2)`. Settings given here win over the spec's `eval:` section, which
    wins over the protocol (protocol None: the spec's eval.protocol, else "quick"; tasks None: the
    spec's eval.tasks, else all). A dry run returns {"db", "plan", "notes"} (runs, done, pending,
    tokens, FLOPs, estimated time; madsl.runner.plan.cost) without running anything.
    model_factory(spec) -> factory(vocab_size, max_seq_len, num_classes) replaces madsl.compile;
    task_registry: name -> Task instead of madsl's tasks.
    Returns a summary: counts of runs, failures, and the scores of these specs.
    """
    if config is not None and keywords:
        raise TypeError("evaluate() takes a config or keywords, not both (config.replace(...) combines them)")
    config = config or EvalConfig.from_keywords(**keywords)
    run = config.execution
    cli = cli_overrides(**config.settings)
    fit_notes: list[str] = []
    specs = _load_specs(spec_paths, fit_notes)
    if not specs:
        raise MadslError("no spec to evaluate", hint="madsl eval SPEC.mad ...")
    check_database(run.db)  # a bad --db is refused before anything is planned or written
    registry, all_tasks = _task_registry(task_registry)
    for spec, path in specs:  # eval: sections, task names, settings, frozen layers: before torch is imported
        plan_spec(spec, path, cli, registry, all_tasks)
    # the bad input above is answered without torch; what follows may ask the devices
    where = _placement(run)
    plan = plan_evaluation(StoreFiles(run.db), specs, cli, task_registry, model_factory, run.device, where.devices,
                           runs_on=_ray_device(where.ray) if where.ray is not None else None)
    for job in plan.jobs:
        job.keep_best = run.keep == "best"
        job.checkpoint_every_s = None if run.checkpoint_every is None else float(run.checkpoint_every)
    work = plan.work(where.batch_grid, where.devices, where.cuda_graphs)
    if where.ray is None:  # Ray's runs train on machines this one cannot see
        check_fits(work)
    if run.dry_run or (reporter is not None and reporter.shows_plan):
        cost = plan_cost(run.db, plan, at_once=run.workers if where.ray is None else None,
                         executor_name="ray" if where.ray is not None else "local", work=work,
                         threads=_run_threads(run, where), measure_rate=run.measure_rate, reporter=reporter)
        if run.dry_run:
            return {"db": str(run.db), "plan": cost, "notes": fit_notes}
        reporter.plan(cost, fit_notes)
    runner = run.executor if isinstance(run.executor, Executor) else _make_executor(run.workers, where.ray)
    return summarize(run.db, plan, _execute(run.db, plan, work, runner, reporter, stop))


@dataclass(frozen=True)
class _Placement:
    ray: Any  # Ray's options, or None: this machine's executors
    devices: list[str] | None  # where this machine places the runs, round-robin (None on Ray)
    batch_grid: bool
    cuda_graphs: bool


def _placement(run: Any) -> _Placement:
    """Where and how the runs execute, from the execution options, each checked (bad input before
    anything is planned): the executor, devices, grid batching, CUDA graphs, kept weights, checkpoints."""
    from madsl.runner.batched import compile as stacked_compile

    stacked_compile.requested()  # a bad MADSL_COMPILE_STACKED is bad input before anything is planned
    ray = _ray_options(run.executor, run.address, run.cpus_per_run, run.gpus_per_run)
    _check_workers_and_device(run.workers, run.device, on_this_machine=ray is None)
    if ray is not None and run.device == "cuda" and not ray.gpus_per_run:
        raise MadslError(f"{option('device')} cuda on Ray: the runs hold no GPU",
                         hint=f"give them one: {option('gpus_per_run')} 1 (or a fraction, e.g. 0.25)")
    if ray is not None and run.batch_grid:
        raise MadslError(f"{option('batch_grid')} runs with the local executors only: Ray runs each run as its own task",
                         hint=f"drop {option('batch_grid')}, or use {option('executor')} local")
    batch_grid = ray is None and (default_batch_grid(run.device) if run.batch_grid is None else run.batch_grid)
    cuda_graphs = resolve_cuda_graphs(run.cuda_graphs, ray is not None, _planned_device(run.device), batch_grid)
    if run.keep not in (None, "none", "best"):
        raise MadslError(f"{option('keep')} must be 'best' or 'none', got {run.keep!r}")
    if run.keep == "best":  # refused here, not once the first run has trained and is to be kept
        from madsl.runner.store.kept import safetensors_torch

        safetensors_torch(f"{option('keep')} best")
    every = run.checkpoint_every
    if every is not None and (isinstance(every, bool) or not isinstance(every, (int, float))
                              or not math.isfinite(every) or every < 0):
        raise MadslError(f"{option('checkpoint_every')}: expected a non-negative number of seconds, got {every!r}",
                         hint="how often a run writes its checkpoint, e.g. 60; 0: after every epoch")
    devices = place_devices(run.device, run.devices) if ray is None else None  # on Ray, Ray places runs
    return _Placement(ray, devices, batch_grid, cuda_graphs)


def _execute(db: Any, plan: EvaluationPlan, work: list, runner: Executor, reporter: Reporter | None,
             stop: Callable[[], bool] | None) -> Outcome:
    """Register the plan's runs in the database (created only now: bad input leaves none behind)
    and run them; a database that cannot be written is a clear error."""
    store = Store(db)
    try:
        plan.register(store)
        return run_jobs(store, work, runner, reporter, skip_solved_at=plan.skip_solved_at,
                        stop_requested=stop or (lambda: False))
    except sqlite3.OperationalError as err:
        # every write is a transaction: what was recorded stays, and the runs in flight stay
        # claimed by this (now ended) process, so the same command resumes them from their checkpoints
        raise MadslError(f"the results database {db} could not be written: {err}",
                         hint="free disk space (or fix the file system) and rerun the same command: finished "
                              "runs are kept and the others resume") from None
    finally:
        store.close()


def plan_cost(db: str | os.PathLike, plan: "EvaluationPlan", at_once: int | None, executor_name: str,
              work: Sequence[Any] = (), *, threads: int | None = None, measure_rate: bool = False,
              reporter: Reporter | None = None) -> dict:
    """The plan's cost (madsl.runner.plan.cost): what is done is read from `db` when it exists;
    `work`: the units the executor runs (a stacked grid group is costed as one); `threads`: the
    torch threads a run trains on, on the CPU (None: this process's). Its time comes from this
    machine's measured training rate (madsl.runner.plan.rate), cached, measured again with
    `measure_rate`; `reporter.planning` hears of what takes a while (the rate's measurement)."""
    from madsl.runner.plan.cost import estimate, summarize_cost
    from madsl.runner.plan.rate import RateBook

    done: set[str] = set()
    if Path(db).exists():
        store = Store(db, create=False)
        try:
            done = {j.run_id for j in plan.jobs if (row := store.run(j.run_id)) is not None
                    and row["status"] in ("done", "skipped")}
        finally:
            store.close()
    progress = getattr(reporter, "planning", None)  # (a reporter of its own may lack it)
    rates = RateBook.default(remeasure=measure_rate, progress=progress)
    costs = estimate(plan.jobs, done, rates, work=work, threads=threads, progress=progress)
    return summarize_cost(len(plan.jobs), len(done), costs, at_once, executor_name, rates.describe())


def _run_threads(run: Any, where: _Placement) -> int | None:
    """The torch threads each run trains on, as the executor sets them (None: this process's)."""
    if where.ray is not None:
        return max(1, int(where.ray.cpus_per_run))
    return None if run.workers <= 1 else max(1, (os.cpu_count() or 1) // run.workers)


def summarize(db: str | os.PathLike, plan: EvaluationPlan, outcome: Outcome) -> dict:
    """The JSON summary of an evaluation: counts, failures and the scores of its specs."""
    run_ids = [j.run_id for j in plan.jobs]
    scores = load_scores(db, run_ids=run_ids)
    return {
        "db": str(db), "protocols": sorted(plan.protocols), "runs": len(plan.jobs), "done": len(outcome.done),
        "already_done": len(outcome.already_done), "skipped": len(outcome.skipped),
        "failed": dict(outcome.failed), "interrupted": len(outcome.interrupted), "complete": outcome.complete,
        "unkept": dict(outcome.unkept),
        "run_ids": run_ids,
        "scores": [{"spec": s.spec, "spec_hash": s.spec_hash, "score": s.score,
                    "tasks": {t: ts.score for t, ts in s.tasks.items()}} for s in scores],
    }


def report(db: str | os.PathLike = DEFAULT_DB, fmt: str = "text", plot: str | os.PathLike | None = None,
           protocol: str | None = None, rows: str = "tasks", plot_sweeps: str | os.PathLike | None = None) -> str:
    """The leaderboard of a results database (text, json or csv); rows "settings" or "runs":
    json / csv tables for analysis, one row per task setting or per run. `plot` writes a
    heatmap PNG; `plot_sweeps` a folder of figures, per task its score against each knob varied."""
    return _report(db, fmt=fmt, plot=plot, protocol=protocol, rows=rows, plot_sweeps=plot_sweeps)
