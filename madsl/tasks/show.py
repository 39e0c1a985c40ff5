"""Print one generated sequence in readable form (for docs, debugging and the CLI)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from madsl.tasks.base import Split, Task, TaskData
from madsl.tasks.sampling import SampledTask


def example(
    task: Task, settings: Mapping[str, Any] | None = None, split: Split = "test", seed: int = 0, row: int = 0
) -> str:
    """Inputs and targets of one row; token ids print via the task's vocabulary, IGNORE as '.'."""
    s = task.settings(**(settings or {}))
    return render_row(task, s, task.generate(s, split, seed), row)


def render_row(task: Task, settings: Mapping[str, Any], data: TaskData, row: int = 0) -> str:
    """Inputs and targets of row `row` of generated `data` (of `task` at the full `settings`)."""
    s = settings
    inputs, targets = data.inputs[row], data.targets[row]
    if task.head == "regress":
        lines = [f"{'pos':>4} {'input':<{8 * task.input_dim(s)}} target"]
        for pos, (vector, target) in enumerate(zip(inputs, targets)):
            lines.append(
                f"{pos:>4} " + "".join(f"{v:8.2f}" for v in vector) + ("" if np.isnan(target) else f"   {target:.2f}")
            )
        return "\n".join(lines)
    if task.head == "pooled":  # a prepared text: token ids as the tokenizer gave them, padding as '.'
        ids = " ".join("." if int(t) < 0 else str(int(t)) for t in inputs)
        return f"inputs:  {ids}\ntarget:  class {int(targets)}"
    assert isinstance(task, SampledTask)
    vocab = task.vocab(s)
    if task.head == "classify":
        return f"inputs:  {vocab.render(inputs)}\ntarget:  class {int(targets)}"
    return f"inputs:  {vocab.render(inputs)}\ntargets: {vocab.render(targets)}"
