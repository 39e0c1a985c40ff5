"""Scoring candidates: through `madsl.runner.api.evaluate`, the same machinery as `madsl eval`
(its executors: local workers or Ray; its results store: a run finished once is never trained
again; its stop: runs checkpoint and go back to pending). A candidate's score is its MAD score
on the search's tasks, counted only where every task has one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from madsl.runner.config import EvalConfig


@dataclass
class BatchOutcome:
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # spec hash -> {"score", "tasks"}
    failed: dict[str, str] = field(default_factory=dict)  # run id -> its error
    interrupted: bool = False
    trained: int = 0  # runs finished by this evaluation
    reused: int = 0  # runs the results store already held


class RunnerEvaluator:
    """Evaluates batches of candidate specs under one EvalConfig (the search's settings, the
    command line's execution options). `reporter` makes each batch's runner Reporter (or None);
    `stop` is polled as `madsl eval` polls it; `model_factory` and `task_registry` replace
    madsl.compile and madsl's tasks, as in `evaluate`."""

    def __init__(
        self,
        config: EvalConfig,
        *,
        reporter: Callable[[], Any] | None = None,
        stop: Callable[[], bool] | None = None,
        model_factory: Callable[[Any], Any] | None = None,
        task_registry: Mapping[str, Any] | None = None,
    ):
        self.config, self.reporter, self.stop = config, reporter, stop
        self.model_factory, self.task_registry = model_factory, task_registry
        self.tasks: tuple[str, ...] = ()

    def check(self, spec: Any) -> tuple[str, ...]:
        """The tasks a candidate is scored on, from the runs `madsl eval` would plan for it: bad
        settings or task names raise MadslError here, before anything trains."""
        from madsl.runner.plan.evaluation import cli_overrides, plan_spec

        registry = dict(self.task_registry) if self.task_registry is not None else None
        plan = plan_spec(
            spec,
            None,
            cli_overrides(**self.config.settings),
            registry,
            list(registry) if registry is not None else None,
        )
        self.tasks = tuple(dict.fromkeys(run.task for run in plan.runs))
        return self.tasks

    def evaluate(self, specs: Sequence[Any]) -> BatchOutcome:
        from madsl.runner.api import evaluate

        reporter = self.reporter() if self.reporter is not None else None
        context = reporter if hasattr(reporter, "__enter__") else contextlib.nullcontext()
        with context:
            summary = evaluate(
                list(specs),
                self.config,
                reporter=reporter,
                stop=self.stop,
                model_factory=self.model_factory,
                task_registry=self.task_registry,
            )
        outcome = BatchOutcome(
            failed=dict(summary["failed"]),
            interrupted=bool(summary["interrupted"]),
            trained=summary["done"],
            reused=summary["already_done"],
        )
        for row in summary["scores"]:
            tasks = {t: s for t, s in row["tasks"].items()}
            complete = all(tasks.get(t) is not None for t in self.tasks)
            outcome.results[row["spec_hash"]] = {"score": row["score"] if complete else None, "tasks": tasks}
        return outcome

    def plan(self, specs: Sequence[Any]) -> dict[str, Any]:
        """What evaluating `specs` would cost (madsl.runner.plan.cost), without training."""
        from madsl.runner.api import evaluate

        return evaluate(
            list(specs),
            self.config.replace(dry_run=True),
            model_factory=self.model_factory,
            task_registry=self.task_registry,
        )["plan"]
