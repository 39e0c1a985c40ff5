"""The synthetic tasks, by name.

Each module in `_MODULES` defines `TASKS`, a tuple of `Task` instances; the
registry is built from that list alone, so adding a task is adding a module
name here.
"""
from __future__ import annotations

import difflib
import importlib

from madsl.tasks.base import IGNORE, Task, TaskData

_MODULES = (
    "recall", "fuzzy_recall", "selective_copying", "compression", "memorization",  # MAD
    "induction_heads", "associative_recall", "majority", "counting", "icl_linear", "arithmetic",
    "mqar",
)

# The six MAD tasks in the paper's order (§3.1).
MAD_TASKS = (
    "in-context-recall", "fuzzy-in-context-recall", "noisy-in-context-recall",
    "selective-copying", "compression", "memorization",
)


def _collect(module_names: tuple[str, ...]) -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    for module_name in module_names:
        for task in importlib.import_module(f"{__name__}.{module_name}").TASKS:
            if task.name in tasks:
                raise RuntimeError(f"task name {task.name!r} is defined twice (module {module_name!r})")
            tasks[task.name] = task
    return tasks


TASKS: dict[str, Task] = _collect(_MODULES)


def get_task(name: str) -> Task:
    """The task called `name`; KeyError with the closest names if there is none."""
    try:
        return TASKS[name]
    except KeyError:
        close = difflib.get_close_matches(name, TASKS, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"no task {name!r}{hint} (tasks: {', '.join(sorted(TASKS))})") from None


__all__ = ["IGNORE", "MAD_TASKS", "TASKS", "Task", "TaskData", "get_task"]
