"""The runner's Python API: `evaluate` specs on MAD tasks, `report` the results.

    summary = evaluate(["specs/paper/striped-hyena-moe.mad"], protocol="quick", workers=2)
    print(report("madsl-results.db"))
"""
from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from madsl.errors import MadslError, option
from madsl.runner.execute.devices import (_check_workers_and_device, _make_executor, _planned_device, _ray_device,
                                          _ray_options, default_batch_grid, place_devices, resolve_cuda_graphs)
from madsl.runner.execute.local import Executor
from madsl.runner.execute.coordinator import Outcome, Reporter, run_jobs
from madsl.runner.plan.evaluation import (EvaluationPlan, _load_specs, _task_registry, cli_overrides, plan_evaluation,
                                          plan_spec)
from madsl.runner.plan.memory import check_fits
from madsl.runner.plan.settings import BY_KEY as SETTINGS_BY_KEY
from madsl.runner.reports.outputs import load_scores
from madsl.runner.reports.outputs import report as _report
from madsl.runner.store.results import DEFAULT_DB, Store, StoreFiles, check_database


def evaluate(spec_paths: Sequence[Any], *, db: str | os.PathLike = DEFAULT_DB, workers: int = 1,
             device: str = "auto", devices: Sequence[str] | None = None, batch_grid: bool | None = None,
             cuda_graphs: bool | None = None, executor: Executor | str | None = None, address: str | None = None,
             cpus_per_run: float = 1.0, gpus_per_run: float = 0.0, keep: str | None = None,
             checkpoint_every: float | None = None, dry_run: bool = False,
             model_factory: Callable[[Any], Any] | None = None, task_registry: Mapping[str, Any] | None = None,
             reporter: Reporter | None = None, stop: Callable[[], bool] | None = None, **settings: Any) -> dict:
    """Evaluate specs on tasks under a protocol; finished runs in `db` are never repeated.
    Prints nothing: progress goes to `reporter` (madsl.runner.execute.coordinator.Reporter; the command
    line's is madsl.cli.progress.RichReporter), and `stop` is polled (once true, runs
    checkpoint and stop; the command line sets it on Ctrl-C and SIGTERM).

    spec_paths: .mad files (or Spec objects).
    settings: what the runs train, by the keys of madsl.runner.plan.settings (protocol, tasks, set,
    lr, wd, epochs, batch_size, seed, eval_lengths, freeze, precision, conventions, optimizer,
    schedule, metric, stop_acc, patience, min_delta, lm_head; `settings_overrides` is `set`).
    Given here they win over the spec's `eval:` section, which wins over the protocol (None:
    the spec's eval.protocol, else "quick"; tasks None: the spec's eval.tasks, else all).
    How they execute:
    db: the results database. workers: local processes. device: auto, cpu or cuda; devices: the
    devices runs are placed on, round-robin.
    executor: "local" (default: `workers` processes of this machine), "ray" (a Ray cluster at
    `address`, each run holding `cpus_per_run` CPUs and `gpus_per_run` GPUs), or an Executor.
    batch_grid: train the runs of a setting that differ only in lr, wd or seed together
    (madsl.runner.batched.grid; local executors only); None: on for CUDA, off on the CPU and on Ray.
    cuda_graphs: every run trains stacked (a run alone as a stack of one), each training step
    and evaluation batch replayed as a CUDA graph (madsl.runner.batched.stacked; CUDA and grid
    batching only); None: on where grid batching is on a CUDA device, else off.
    keep: "best" keeps each run's best weights in the results folder (`madsl export`, madsl.runner.store.kept).
    checkpoint_every: seconds between a run's checkpoints (None: a minute; 0: after every epoch).
    dry_run: plan only: return {"db", "plan", "notes"} (runs, done, pending, tokens, FLOPs,
    estimated time; madsl.runner.plan.cost) without running anything.
    model_factory(spec) -> factory(vocab_size, max_seq_len, num_classes) replaces madsl.compile;
    task_registry: name -> Task instead of madsl's tasks.
    Returns a summary: counts of runs, failures, and the scores of these specs.
    """
    if "settings_overrides" in settings:  # the earlier name of `set`
        settings["set"] = settings.pop("settings_overrides")
    unknown = sorted(set(settings) - set(SETTINGS_BY_KEY))
    if unknown:
        raise TypeError(f"evaluate() got unknown argument(s) {', '.join(unknown)}; the settings are "
                        + ", ".join(SETTINGS_BY_KEY))
    cli = cli_overrides(**settings)
    fit_notes: list[str] = []
    specs = _load_specs(spec_paths, fit_notes)
    if not specs:
        raise MadslError("no spec to evaluate", hint="madsl eval SPEC.mad ...")
    check_database(db)  # a bad --db is refused before anything is planned or written
    registry, all_tasks = _task_registry(task_registry)
    for spec, path in specs:  # eval: sections, task names, settings, frozen layers: before torch is imported
        plan_spec(spec, path, cli, registry, all_tasks)
    # the bad input above is answered without torch; what follows may ask the devices
    from madsl.runner.batched import compile as stacked_compile

    stacked_compile.requested()  # a bad MADSL_COMPILE_STACKED is bad input before anything is planned
    ray_options = _ray_options(executor, address, cpus_per_run, gpus_per_run)
    _check_workers_and_device(workers, device, on_this_machine=ray_options is None)
    if ray_options is not None and device == "cuda" and not ray_options.gpus_per_run:
        raise MadslError(f"{option('device')} cuda on Ray: the runs hold no GPU",
                         hint=f"give them one: {option('gpus_per_run')} 1 (or a fraction, e.g. 0.25)")
    placement = place_devices(device, devices) if ray_options is None else None  # on Ray, Ray places runs
    if ray_options is not None and batch_grid:
        raise MadslError(f"{option('batch_grid')} runs with the local executors only: Ray runs each run as its own task",
                         hint=f"drop {option('batch_grid')}, or use {option('executor')} local")
    batch_grid = ray_options is None and (default_batch_grid(device) if batch_grid is None else batch_grid)
    cuda_graphs = resolve_cuda_graphs(cuda_graphs, ray_options is not None, _planned_device(device), batch_grid)
    if keep not in (None, "none", "best"):
        raise MadslError(f"keep must be 'best' or 'none', got {keep!r}")
    if keep == "best":  # refused here, not once the first run has trained and is to be kept
        from madsl.runner.store.kept import safetensors_torch

        safetensors_torch(f"{option('keep')} best")
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(
            checkpoint_every, (int, float)) or not math.isfinite(checkpoint_every) or checkpoint_every < 0):
        raise MadslError(f"{option('checkpoint_every')}: expected a non-negative number of seconds, got {checkpoint_every!r}",
                         hint="how often a run writes its checkpoint, e.g. 60; 0: after every epoch")
    plan = plan_evaluation(StoreFiles(db), specs, cli, task_registry, model_factory, device, placement,
                           runs_on=_ray_device(ray_options) if ray_options is not None else None)
    for job in plan.jobs:
        job.keep_best = keep == "best"
        job.checkpoint_every_s = None if checkpoint_every is None else float(checkpoint_every)
    work = plan.work(batch_grid, placement, cuda_graphs)
    if ray_options is None:  # Ray's runs train on machines this one cannot see
        check_fits(work)
    if dry_run or (reporter is not None and reporter.shows_plan):
        cost = plan_cost(db, plan, at_once=workers if ray_options is None else None,
                         executor_name="ray" if ray_options is not None else "local", work=work)
        if dry_run:
            return {"db": str(db), "plan": cost, "notes": fit_notes}
        reporter.plan(cost, fit_notes)
    runner = executor if isinstance(executor, Executor) else _make_executor(workers, ray_options)
    store = Store(db)  # created only now: bad input above leaves no database behind
    try:
        plan.register(store)
        outcome = run_jobs(store, work, runner, reporter, skip_solved_at=plan.skip_solved_at,
                           stop_requested=stop or (lambda: False))
    except sqlite3.OperationalError as err:
        # every write is a transaction: what was recorded stays, and the runs in flight stay
        # claimed by this (now ended) process, so the same command resumes them from their checkpoints
        raise MadslError(f"the results database {db} could not be written: {err}",
                         hint="free disk space (or fix the file system) and rerun the same command: finished "
                              "runs are kept and the others resume") from None
    finally:
        store.close()
    return summarize(db, plan, outcome)


def plan_cost(db: str | os.PathLike, plan: "EvaluationPlan", at_once: int | None, executor_name: str,
              work: Sequence[Any] = ()) -> dict:
    """The plan's cost (madsl.runner.plan.cost): what is done is read from `db` when it exists;
    `work`: the units the executor runs (a stacked grid group is costed as one)."""
    from madsl.runner.plan.cost import estimate, summarize_cost

    done: set[str] = set()
    if Path(db).exists():
        store = Store(db, create=False)
        try:
            done = {j.run_id for j in plan.jobs if (row := store.run(j.run_id)) is not None
                    and row["status"] in ("done", "skipped")}
        finally:
            store.close()
    costs = estimate(plan.jobs, done, StoreFiles(db).files_dir, work=work)
    return summarize_cost(len(plan.jobs), len(done), costs, at_once, executor_name)


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
