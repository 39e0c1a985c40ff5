"""The MAD runner: protocols, training, the results store, executors, scores and reports.

    from madsl.runner import evaluate, report
    evaluate(["specs/paper/mamba.mad"], protocol="quick")
    print(report("madsl-results.db"))

Importing this package is cheap; torch is imported when a run starts.
"""
from __future__ import annotations

from typing import Any

# The submodule `madsl.runner.report` is loaded before the function of the same name is
# defined below: importing it later would rebind `madsl.runner.report` to the module.
from madsl.runner import report as _report_module  # noqa: F401

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
        from madsl.runner.protocols import PROTOCOLS

        return PROTOCOLS
    raise AttributeError(name)
