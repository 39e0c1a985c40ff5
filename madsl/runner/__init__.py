"""The MAD runner: protocols, training, the results store, executors, scores and reports.

    from madsl.runner import evaluate, report
    evaluate(["specs/paper/mamba.mad"], protocol="quick")
    print(report("madsl-results.db"))

Importing this package is cheap; torch is imported when a run starts.
"""
from __future__ import annotations

from typing import Any

__all__ = ["evaluate", "report", "PROTOCOLS"]


def __getattr__(name: str) -> Any:
    if name in ("evaluate", "report"):
        from madsl.runner import api

        return getattr(api, name)
    if name == "PROTOCOLS":
        from madsl.runner.protocols import PROTOCOLS

        return PROTOCOLS
    raise AttributeError(name)
