"""The runner's Python API: `evaluate` specs on MAD tasks, `report` the results.

summary = evaluate(["specs/paper/striped-hyena-moe.mad"], protocol="quick", workers=2)
print(report("madsl-results.db"))
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from madsl.errors import MadslError
from madsl.runner.config import EvalConfig
from madsl.runner.execute.coordinator import Outcome, Reporter
from madsl.runner.launch import Placement, check_store, place, run, run_threads_placed
from madsl.runner.plan.cost import Shapes
from madsl.runner.plan.evaluation import (
    EvaluationPlan,
    cli_overrides,
    load_specs,
    plan_evaluation,
    plan_spec,
    tasks_by_name,
)
from madsl.runner.plan.memory import check_fits
from madsl.runner.reports import outputs as report_outputs
from madsl.runner.store.files import StoreFiles
from madsl.runner.store.results import DEFAULT_DB, Store


def evaluate(
    spec_paths: Sequence[Any],
    config: EvalConfig | None = None,
    *,
    reporter: Reporter | None = None,
    stop: Callable[[], bool] | None = None,
    model_factory: Callable[[Any], Any] | None = None,
    task_registry: Mapping[str, Any] | None = None,
    **keywords: Any,
) -> dict:
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
    execution = config.execution
    fit_notes: list[str] = []
    plan, where = _plan(spec_paths, config, fit_notes, model_factory, task_registry)
    work = plan.work(where.batch_grid, where.devices, where.cuda_graphs)
    shapes = Shapes()  # the plan's accounting: its memory check and its cost account each shape once
    if where.ray is None:  # Ray's runs train on machines this one cannot see
        check_fits(work, shapes)
    if execution.dry_run or (reporter is not None and reporter.shows_plan):
        cost = _execution_cost(execution, plan, where, work, reporter, shapes)
        if execution.dry_run:
            return {"db": str(execution.db), "plan": cost, "notes": fit_notes}
        reporter.plan(cost, fit_notes)
    outcome = run(
        work,
        execution,
        reporter=reporter,
        stop=stop,
        register=plan.register,
        placement=where,
        skip_solved_at=plan.skip_solved_at,
    )
    return summarize(execution.db, plan, outcome)


def _plan(
    spec_paths: Sequence[Any],
    config: EvalConfig,
    fit_notes: list[str],
    model_factory: Callable[[Any], Any] | None,
    task_registry: Mapping[str, Any] | None,
) -> tuple[EvaluationPlan, Placement]:
    """`evaluate`'s plan and where it runs: its bad input (specs, the database, eval: sections,
    task names, settings, frozen layers) refused before torch is imported, then the devices asked."""
    execution = config.execution
    cli = cli_overrides(**config.settings)
    specs = load_specs(spec_paths, fit_notes)
    if not specs:
        raise MadslError("no spec to evaluate", hint="madsl eval SPEC.mad ...")
    check_store(execution)  # a bad --db is refused before anything is planned or written
    registry, all_tasks = tasks_by_name(task_registry)
    for spec, path in specs:  # eval: sections, task names, settings, frozen layers: before torch is imported
        plan_spec(spec, path, cli, registry, all_tasks)
    # the bad input above is answered without torch; what follows may ask the devices
    where = place(execution)
    plan = plan_evaluation(
        StoreFiles(execution.db),
        specs,
        cli,
        task_registry,
        model_factory,
        execution.device,
        where.devices,
        runs_on=where.runs_on,
    )
    for job in plan.jobs:
        job.keep_best = execution.keep == "best"
        job.checkpoint_every_s = None if execution.checkpoint_every is None else float(execution.checkpoint_every)
    return plan, where


def plan_cost(
    db: str | os.PathLike,
    plan: "EvaluationPlan",
    at_once: int | None,
    executor_name: str,
    work: Sequence[Any] = (),
    *,
    threads: int | None = None,
    measure_rate: bool = False,
    reporter: Reporter | None = None,
    shapes: Shapes | None = None,
) -> dict:
    """The plan's cost (madsl.runner.plan.cost): what is done is read from `db` when it exists;
    `work`: the units the executor runs (a stacked grid group is costed as one); `threads`: the
    torch threads a run trains on, on the CPU (None: this process's). Its time comes from this
    machine's measured training rate (madsl.runner.plan.rate), cached, measured again with
    `measure_rate`; `reporter.planning` hears of what takes a while (the rate's measurement); `shapes`:
    the plan's accounting, where its memory check made it already."""
    from madsl.runner.plan.cost import estimate, summarize_cost
    from madsl.runner.plan.rate import RateBook

    done: set[str] = set()
    if Path(db).exists():
        store = Store(db, create=False)
        try:
            done = {
                j.run_id
                for j in plan.jobs
                if (row := store.run(j.run_id)) is not None and row["status"] in ("done", "skipped")
            }
        finally:
            store.close()
    progress = getattr(reporter, "planning", None)  # (a reporter of its own may lack it)
    rates = RateBook.default(remeasure=measure_rate, progress=progress)
    costs = estimate(plan.jobs, done, rates, work=work, threads=threads, progress=progress, shapes=shapes)
    return summarize_cost(len(plan.jobs), len(done), costs, at_once, executor_name, rates.describe())


def _execution_cost(
    execution: Any, plan: EvaluationPlan, where: Placement, work: list, reporter: Reporter | None, shapes: Shapes
) -> dict:
    """`plan_cost` of the plan as this execution runs it (its workers or Ray, its threads)."""
    return plan_cost(
        execution.db,
        plan,
        at_once=execution.workers if where.ray is None else None,
        executor_name="ray" if where.ray is not None else "local",
        work=work,
        threads=run_threads_placed(execution, where),
        measure_rate=execution.measure_rate,
        reporter=reporter,
        shapes=shapes,
    )


def summarize(db: str | os.PathLike, plan: EvaluationPlan, outcome: Outcome) -> dict:
    """The JSON summary of an evaluation: counts, failures and the scores of its specs."""
    run_ids = [j.run_id for j in plan.jobs]
    scores = report_outputs.load_scores(db, run_ids=run_ids)
    return {
        "db": str(db),
        "protocols": sorted(plan.protocols),
        "runs": len(plan.jobs),
        "done": len(outcome.done),
        "already_done": len(outcome.already_done),
        "skipped": len(outcome.skipped),
        "failed": dict(outcome.failed),
        "interrupted": len(outcome.interrupted),
        "complete": outcome.complete,
        "unkept": dict(outcome.unkept),
        "run_ids": run_ids,
        "scores": [
            {
                "spec": s.spec,
                "spec_hash": s.spec_hash,
                "score": s.score,
                "tasks": {t: ts.score for t, ts in s.tasks.items()},
            }
            for s in scores
        ],
    }


def report(
    db: str | os.PathLike = DEFAULT_DB,
    fmt: str = "text",
    plot: str | os.PathLike | None = None,
    protocol: str | None = None,
    rows: str = "tasks",
    plot_sweeps: str | os.PathLike | None = None,
) -> str:
    """The leaderboard of a results database (text, json or csv); rows "settings" or "runs":
    json / csv tables for analysis, one row per task setting or per run. `plot` writes a
    heatmap PNG; `plot_sweeps` a folder of figures, per task its score against each knob varied."""
    return report_outputs.report(db, fmt=fmt, plot=plot, protocol=protocol, rows=rows, plot_sweeps=plot_sweeps)
