"""The search loop: propose a generation, save, evaluate, record, select, save; resumable at every step.

    result = run_search(load_search("specs/search/recall-hybrids.yaml"), EvalConfig.from_keywords(workers=2))

Generation 0 is the initial population; generations 1..G are `offspring` children each. Every
proposal is built, checked and accounted before anything trains (madsl.search.candidates), and
the batch goes through madsl.runner.api.evaluate with the search file's settings and the caller's
execution options. The search itself is madsl.search.ask_tell.Search (asked for each batch, told
its results); this module drives it with the runner (`drive`), so `madsl search`, run_search and
an ask/tell caller share one loop. The state (madsl.search.state) is saved after each proposal and
each recorded batch: rerunning the same search resumes it, and the same seed gives the same
candidates.

The cost guard (`madsl search` asks before it trains, or refuses without --yes where nobody can
answer): a search whose rest is estimated at more than COST_GUARD_SECONDS of run time, or, where
the plan has no estimate of time, has more than COST_GUARD_CANDIDATES candidates left to train.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

from madsl.errors import MadslError
from madsl.lang.spec import spec_from_data
from madsl.runner.config import EvalConfig
from madsl.search.ask_tell import Search
from madsl.search.config import SearchFile
from madsl.search.evaluation import BatchOutcome, RunnerEvaluator
from madsl.search.state import SearchState

COST_GUARD_SECONDS = 3600.0  # an hour of estimated run time: more asks first
COST_GUARD_CANDIDATES = 100  # candidates left to train where the plan has no time estimate


@dataclass
class SearchResult:
    search: SearchFile
    state: SearchState
    state_path: Path
    interrupted: bool = False
    failed: dict[str, str] = field(default_factory=dict)  # run id -> error, over this call
    trained: int = 0  # runs trained by this call
    reused: int = 0  # runs the results store already held


class Observer:
    """What a search tells its caller; the default says nothing (the library prints nothing)."""

    def proposed(self, generation: int, batch: list[dict]) -> None: ...

    def recorded(self, generation: int, entry: dict) -> None: ...


def search_config(search: SearchFile, config: EvalConfig | None) -> EvalConfig:
    """The search file's evaluation settings with the caller's execution options."""
    if config is not None and config.settings:
        raise MadslError(
            "a search trains what its file says: give the evaluation settings under objectives.score",
            hint="the command line sets only how runs execute (--db, --workers, --executor, ...)",
        )
    execution = config.execution if config is not None else EvalConfig().execution
    return EvalConfig(settings=dict(search.objectives.settings), execution=execution)


def preflight(search: SearchFile, evaluator: Any, spec: Any) -> None:
    """The evaluation settings and task names checked on a candidate, located in the search file."""
    try:
        evaluator.check(spec)
    except MadslError as err:  # at the setting the message names (tasks, set, ...), else at score:
        named = [
            key
            for key in search.objectives.settings
            if re.search(rf"\b({re.escape(key)}|{re.escape(key.rstrip('s'))})\b", err.message)
        ]
        where = search.where("objectives", "score", *named[:1])
        raise MadslError(f"objectives.score: {err.message}", where, expected=err.expected, hint=err.hint) from None


def _located(search: SearchFile, state: SearchState, err: MadslError) -> MadslError:
    """The runner's refusal of a candidate it names (a model too large for the machine: a huge
    hyperparameter value, or no bound on size), located in the search file where the space lets
    it in; any other error as it is."""
    named = [r for r in state.candidates.values() if r["name"] in err.message] if err.location.file is None else []
    if not named:
        return err
    record, hypers = named[0], search.space.hyperparameters
    layers = record["spec"].get("layers", {})
    values = ", ".join(f"{h.name}={layers.get(h.symbol, {}).get(h.param)!r}" for h in hypers)
    where: tuple[str, ...] = ("space",)
    if hypers:  # at the one hyperparameter searched, else at them all
        where = ("space", "hyperparameters") + ((hypers[0].name,) if len(hypers) == 1 else ())
    size = "does not fit" in err.message  # the runner's memory check: the one refusal of a model's size
    hint = (
        (
            "bound the candidates' size under budget: (e.g. params: <= N) so that such a candidate is rejected "
            "before it trains, or narrow " + ".".join(where[:2])
        )
        if size
        else err.hint
    )
    return MadslError(
        f"candidate {record['name']} ({record['topology']}{'; ' + values if values else ''}) cannot be "
        f"trained: {err.message}",
        search.where(*where),
        expected=err.expected,
        hint=hint,
    )


def drive(driver: Search, evaluator: Any, observer: Observer | None = None, check: Any = None) -> SearchResult:
    """The loop: each generation proposed (and saved), its new candidates evaluated, their results
    told to `driver` (recorded, selected from, saved), to the last generation, or until an
    evaluation is interrupted (the batch stays pending: rerunning evaluates it again).
    `check(spec)` sees a new search's first candidate before anything is saved."""
    observer = observer or Observer()
    search, state = driver.file, driver.state
    result = SearchResult(search, state, driver.state_path)
    while not driver.complete:
        driver.prepare(check)
        if driver.unsaved:
            driver.save()
            observer.proposed(state.generation, state.pending or [])
        todo = driver.needed()
        # specs as the state check loaded them, else as saved: what trains is what the state holds
        specs = [driver.loaded.get(h) or spec_from_data(state.candidates[h]["spec"]) for h in todo]
        try:
            outcome = evaluator.evaluate(specs) if specs else BatchOutcome()
        except MadslError as err:
            raise _located(search, state, err) from None
        result.failed.update(outcome.failed)
        result.trained += outcome.trained
        result.reused += outcome.reused
        if outcome.interrupted:
            result.interrupted = True
            return result
        entry = driver.record(outcome.results, outcome.trained, outcome.reused)
        observer.recorded(entry["generation"], entry)
    return result


def run_search(
    search: SearchFile,
    config: EvalConfig | None = None,
    *,
    state_path: str | Path | None = None,
    restart: bool = False,
    evaluator: Any = None,
    observer: Observer | None = None,
    proposer: Any = None,
    confirm: Callable[[dict[str, Any]], Any] | None = None,
    **evaluator_options: Any,
) -> SearchResult:
    """Run (or resume) a search to its last generation, or until its evaluation is interrupted.
    `evaluator_options` (reporter, stop, model_factory, task_registry) go to RunnerEvaluator;
    `proposer` replaces the file's algorithm (madsl.search.proposers.Proposer); `confirm(plan)`,
    where given, sees the plan of the rest of the search (plan_search's) before anything is saved
    or trained, and refuses it by raising."""
    if evaluator is not None and evaluator_options:
        raise TypeError("run_search() takes an evaluator or the RunnerEvaluator's options, not both")
    config = search_config(search, config)
    evaluator = evaluator or RunnerEvaluator(config, **evaluator_options)
    driver = Search(search, state_path, config=config, restart=restart, proposer=proposer)
    check = partial(preflight, search, evaluator)
    if confirm is not None and not driver.complete:
        confirm(plan_of(driver, evaluator, check))
    return drive(driver, evaluator, observer, check)


def plan_search(
    search: SearchFile,
    config: EvalConfig | None = None,
    *,
    state_path: str | Path | None = None,
    restart: bool = False,
    evaluator: Any = None,
    proposer: Any = None,
    **evaluator_options: Any,
) -> dict[str, Any]:
    """A dry run: the batch the search would evaluate next (the initial population of a new search) and
    its cost (madsl.runner.plan.cost), with the whole search's estimated from it. Nothing is saved or trained."""
    config = search_config(search, config)
    evaluator = evaluator or RunnerEvaluator(config, **evaluator_options)
    driver = Search(search, state_path, config=config, restart=restart, proposer=proposer)
    return plan_of(driver, evaluator, partial(preflight, search, evaluator))


def plan_of(driver: Search, evaluator: Any, check: Any = None) -> dict[str, Any]:
    """The plan of `driver`'s next batch (proposed where none is pending, not saved) and of the rest of its search."""
    state = driver.state
    batch = driver.prepare(check)
    new = [i for i in batch if state.candidates[i["id"]]["status"] == "pending"]
    # each spec as built or loaded: none is parsed again for the plan
    plan_specs = [
        driver.built.get(i["id"]) or driver.loaded.get(i["id"]) or spec_from_data(state.candidates[i["id"]]["spec"])
        for i in new
    ]
    try:
        cost = evaluator.plan(plan_specs) if plan_specs else None
    except MadslError as err:
        raise _located(driver.file, state, err) from None
    return _plan(driver.file, state, driver.state_path, batch, cost, len(plan_specs))


def over_cost(plan: dict[str, Any]) -> str | None:
    """Why a search's plan asks for a confirmation before it trains (None: it does not): its
    estimated run time above COST_GUARD_SECONDS, or, without an estimate, more than
    COST_GUARD_CANDIDATES candidates left to train."""
    seconds, remaining = plan.get("estimated_run_seconds"), plan.get("remaining", 0)
    if seconds is not None and seconds > COST_GUARD_SECONDS:
        return (
            f"the rest of the search ({remaining} candidates) is estimated at {seconds / 3600:.3g} h of run time, "
            f"more than {COST_GUARD_SECONDS / 3600:g} h"
        )
    if seconds is None and remaining > COST_GUARD_CANDIDATES:
        return (
            f"the rest of the search trains up to {remaining} candidates (more than {COST_GUARD_CANDIDATES}) "
            "and their run time has no estimate"
        )
    return None


def _plan(
    search: SearchFile, state: SearchState, path: Path, batch: list[dict], cost: dict | None, count: int
) -> dict[str, Any]:
    remaining = search.algorithm.evaluations - len(state.scored())
    per = cost["run_seconds"] / count if cost and cost.get("run_seconds") is not None else None
    # where the batch's time is uncertain, the whole search's interval at the same factors
    between = (cost or {}).get("run_seconds_interval") if per is not None else None
    # the command's processes start once whatever the candidates (madsl.runner.plan.cost.startup_cost)
    started = ((cost or {}).get("startup_seconds") or 0.0) * (cost or {}).get("processes", 1)
    return {
        "search": search.name,
        "state": str(path),
        "complete": state.complete,
        "generation": state.generation,
        "generations": search.algorithm.generations,
        "evaluations": search.algorithm.evaluations,
        "evaluated": len(state.scored()),
        "remaining": remaining,
        "batch": [
            {
                "name": state.candidates[i["id"]]["name"],
                "topology": state.candidates[i["id"]]["topology"],
                "totals": state.candidates[i["id"]]["totals"],
                "duplicate": i["duplicate"],
            }
            for i in batch
        ],
        "plan": cost,
        "estimated_run_seconds": None if per is None else per * remaining,
        "estimated_run_seconds_interval": None if not between else [t / count * remaining for t in between],
        "startup_seconds": started,
        "estimated_cpu_seconds": None if per is None else per * remaining + started,
        "estimated_cpu_seconds_interval": None if not between else [t / count * remaining + started for t in between],
        "rejected": dict(state.counts),
    }
