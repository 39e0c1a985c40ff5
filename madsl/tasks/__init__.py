"""The synthetic tasks, by name.

Each module in `_MODULES` defines `TASKS`, a tuple of `Task` instances; the
registry is built from that list alone, so adding a task is adding a module
name here. `mad_lab` defines `VARIANTS`: the MAD tasks as the reference
implementation generates them (`get_task(name, conventions="mad-lab")`).
"""

from __future__ import annotations

import difflib
import importlib

from madsl.tasks.base import IGNORE, Task, TaskData

_MODULES = (
    "recall",
    "fuzzy_recall",
    "selective_copying",
    "compression",
    "memorization",  # MAD
    "induction_heads",
    "associative_recall",
    "majority",
    "counting",
    "icl_linear",
    "arithmetic",
    "mqar",
    "text_classification",  # a labelled text set of the user's (seed 004's IMDB setting)
)

# The six MAD tasks in the paper's order (§3.1).
MAD_TASKS = (
    "in-context-recall",
    "fuzzy-in-context-recall",
    "noisy-in-context-recall",
    "selective-copying",
    "compression",
    "memorization",
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
# (task name, conventions) -> the task generated as those conventions have it
VARIANTS: dict[tuple[str, str], Task] = {
    (t.name, t.conventions): t for t in importlib.import_module(f"{__name__}.mad_lab").VARIANTS
}


def get_task(name: str, conventions: str = "madsl") -> Task:
    """The task called `name` under `conventions` (a task without a variant for them is
    the same under every convention); KeyError with the closest names if there is none."""
    try:
        task = TASKS[name]
    except KeyError:
        close = difflib.get_close_matches(name, TASKS, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise KeyError(f"no task {name!r}{hint} (tasks: {', '.join(sorted(TASKS))})") from None
    return VARIANTS.get((name, conventions), task)


def with_conventions(task: Task, conventions: str) -> Task:
    """A registered task as `conventions` generate it; any other task (a caller's own) is left as it is."""
    if TASKS.get(task.name) is not task:
        return task
    return VARIANTS.get((task.name, conventions), task)


__all__ = ["IGNORE", "MAD_TASKS", "TASKS", "Task", "TaskData", "VARIANTS", "get_task", "with_conventions"]
