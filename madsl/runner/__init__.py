"""The MAD runner: plans evaluations of specs, trains their runs, records and scores them.

    from madsl.runner import evaluate, report
    evaluate(["specs/paper/mamba.mad"], protocol="quick")
    print(report("madsl-results.db"))

Every job runs one way, `run(jobs, execution)` (launch.py): MAD runs and grid groups (`evaluate`,
and a search's candidates through it), pretraining runs (`madsl.scaling.scale`) are Jobs
(execute/jobs.py) that their planner plans, then hands to `run`.

Its rooms, one concern each, bottom first: a room imports only the rooms above it in this list
(and `common/` every room may import); nothing imports the command line (tests/test_layers.py):

    common/     the shared records: a run's training settings and the options its identity names
                off their defaults, the choices and numbers defined once (precisions, MAX_SEED,
                the cost of a training step in forward passes), command-line words, run owners
    train/      one run's training: the loop, its metrics, optimizer, state and device; options,
                precision, checkpoints, task heads
    store/      the results database and its folder; kept models (rebuilt with train/'s heads)
    execute/    where runs execute: jobs (the Job protocol, RunJob), local executors, the
                coordinator, Ray, devices; options.py: the execution options, declared once
    batched/    runs trained together: grid groups (jobs of their members), stacked members and
                their epoch, the replayed and compiled step
    pretrain/   one pretraining run on text (madsl scale): its recipe and FLOP budget, its loop,
                its job for the executors; runs of one shape trained as one stack (stacked.py)
    plan/       what an evaluation trains and what it costs: the settings, declared once; the
                protocols, the user's overrides and task settings; sweep files; the plan of
                runs; cost (the one step-time estimator) and memory estimates
    reports/    scores, the leaderboard, tables for analysis, figures
    config.py   EvalConfig: an evaluation's settings and execution options, as one record
    launch.py   `run` (jobs -> Outcome: the database check, placement, the store, registration,
                the coordinator, its errors), `place` and `run_precision` (the one precision rule)
    api.py      `evaluate` and `report`, the entry points (they print nothing)

Importing this package is cheap; torch is imported when a run starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from madsl.runner.execute.coordinator import Outcome

__all__ = ["evaluate", "report", "run", "PROTOCOLS"]


def evaluate(*args: Any, **kwargs: Any) -> dict:
    """Evaluate specs on tasks under a protocol (`madsl.runner.api.evaluate`)."""
    from madsl.runner.api import evaluate as run

    return run(*args, **kwargs)


def report(*args: Any, **kwargs: Any) -> str:
    """The leaderboard of a results database (`madsl.runner.api.report`)."""
    from madsl.runner.api import report as leaderboard

    return leaderboard(*args, **kwargs)


def run(jobs: Sequence[Any], execution: Any, **options: Any) -> "Outcome":
    """Run Jobs under an Execution (reporter, stop, register, placement, skip_solved_at: keywords)
    and return their Outcome (`madsl.runner.launch.run`)."""
    from madsl.runner.launch import run as run_jobs

    return run_jobs(jobs, execution, **options)


def __getattr__(name: str) -> Any:
    if name == "PROTOCOLS":
        from madsl.runner.plan.protocols import PROTOCOLS

        return PROTOCOLS
    if name in ("Job", "Outcome", "Placement", "place"):
        from madsl.runner import launch

        return getattr(launch, name)
    if name == "Execution":
        from madsl.runner.execute.options import Execution

        return Execution
    raise AttributeError(name)
