"""The MAD runner: plans evaluations of specs, trains their runs, records and scores them.

    from madsl.runner import evaluate, report
    evaluate(["specs/paper/mamba.mad"], protocol="quick")
    print(report("madsl-results.db"))

Its rooms, one concern each (data flows down the list; nothing imports the command line):

    plan/       what an evaluation trains and what it costs: the settings, declared once; the
                protocols, the user's overrides and task settings; sweep files; the plan of
                runs; cost and memory estimates
    train/      one run's training: the loop, its metrics, optimizer, state and device; options,
                precision, checkpoints, task heads
    batched/    runs trained together: grid groups, stacked members and their epoch, the
                replayed and compiled step
    pretrain/   one pretraining run on text (madsl scale): its recipe and FLOP budget, its loop,
                its job for the executors
    execute/    where runs execute: jobs, local executors, the coordinator, Ray, devices
    store/      the results database and its folder; kept models
    reports/    scores, the leaderboard, tables for analysis, figures
    config.py   EvalConfig: an evaluation's settings and execution options, as one record
    api.py      `evaluate` and `report`, the entry points (they print nothing)

Importing this package is cheap; torch is imported when a run starts.
"""
from __future__ import annotations

from typing import Any

__all__ = ["evaluate", "report", "PROTOCOLS"]


def evaluate(*args: Any, **kwargs: Any) -> dict:
    """Evaluate specs on tasks under a protocol (`madsl.runner.api.evaluate`)."""
    from madsl.runner.api import evaluate as run

    return run(*args, **kwargs)


def report(*args: Any, **kwargs: Any) -> str:
    """The leaderboard of a results database (`madsl.runner.api.report`)."""
    from madsl.runner.api import report as leaderboard

    return leaderboard(*args, **kwargs)



def __getattr__(name: str) -> Any:
    if name == "PROTOCOLS":
        from madsl.runner.plan.protocols import PROTOCOLS

        return PROTOCOLS
    raise AttributeError(name)
