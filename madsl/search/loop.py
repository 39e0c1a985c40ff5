"""The search loop: propose a generation, save, evaluate, record, select, save; resumable at every step.

    result = run_search(load_search("specs/search/recall-hybrids.yaml"), EvalConfig.from_keywords(workers=2))

Generation 0 is the initial population; generations 1..G are `offspring` children each. Every
proposal is built, checked and accounted before anything trains (madsl.search.candidates), and
the batch goes through madsl.runner.api.evaluate with the search file's settings and the caller's
execution options. The state (madsl.search.state) is saved after each proposal and each recorded
batch: rerunning the same search resumes it, and the same seed gives the same candidates.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from madsl.errors import MadslError
from madsl.lang.spec import Spec, spec_from_data
from madsl.paths import require_path
from madsl.runner.config import EvalConfig
from madsl.search.algorithms import PROPOSERS, Breeding, initial_population, next_population
from madsl.search.candidates import CandidateBuilder
from madsl.search.config import SearchFile
from madsl.search.evaluation import BatchOutcome, RunnerEvaluator
from madsl.search.state import SearchState, json_ready, save_state, state_path_for
from madsl.search.state_check import load_state


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


def _rng(seed: int, saved: dict[str, Any] | None) -> np.random.Generator:
    rng = np.random.Generator(np.random.PCG64(seed))
    if saved:
        try:
            rng.bit_generator.state = saved
        except (TypeError, ValueError, KeyError) as err:
            raise MadslError(
                f"the search state's generator state is damaged: {err}",
                hint="remove the state file, or rerun with --restart",
            ) from None
    return rng


def _register(state: SearchState, batch: list[dict], generation: int) -> None:
    """Add a proposed batch to the state: new candidates with their lineage; duplicates noted."""
    for item in batch:
        entry = {"generation": generation, "parents": item["parents"], "operator": item["operator"]}
        if item["duplicate"]:
            state.counts["duplicates"] += 1
            state.candidates[item["id"]].setdefault("proposed_again", []).append(entry)
            continue
        candidate = item["candidate"]
        state.candidates[item["id"]] = {
            "id": item["id"],
            "name": candidate.name,
            "topology": candidate.topology,
            **entry,
            "totals": candidate.totals,
            "solved": candidate.solved,
            "spec": candidate.spec_data,
            "status": "pending",
            "score": None,
            "tasks": {},
        }
    state.pending = [{k: v for k, v in item.items() if k != "candidate"} for item in batch]


def _propose(search: SearchFile, builder: CandidateBuilder, state: SearchState, rng: np.random.Generator) -> list[dict]:
    ctx = Breeding(search, builder, state, rng)
    if state.generation == 0:
        return initial_population(ctx)
    return PROPOSERS[search.algorithm.name](ctx, search.algorithm.offspring)


def _preflight(search: SearchFile, evaluator: Any, spec: Any) -> None:
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


def _evaluate(search: SearchFile, state: SearchState, evaluator: Any, loaded: dict[str, Spec]) -> BatchOutcome:
    """Score the pending batch's new candidates (those without a result yet; duplicates are not sent).
    `loaded`: specs the state check loaded from the state (the same data, not parsed again)."""
    todo = list(
        dict.fromkeys(item["id"] for item in state.pending if state.candidates[item["id"]]["status"] == "pending")
    )
    if not todo:
        return BatchOutcome()
    specs = [loaded.get(spec_hash) or spec_from_data(state.candidates[spec_hash]["spec"]) for spec_hash in todo]
    try:
        return evaluator.evaluate(specs)
    except MadslError as err:
        raise _located(search, state, err) from None


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


def _record(search: SearchFile, state: SearchState, outcome: BatchOutcome) -> dict:
    """The batch's results into the state; selection; the generation's history entry."""
    batch = state.pending or []
    for item in batch:
        record = state.candidates[item["id"]]
        if record["status"] != "pending":
            continue
        result = json_ready(outcome.results.get(item["id"], {"score": None, "tasks": {}}))  # NaN: no score
        record.update(
            score=result["score"], tasks=result["tasks"], status="scored" if result["score"] is not None else "failed"
        )
    scores = [state.candidates[i["id"]]["score"] for i in batch if state.candidates[i["id"]]["score"] is not None]
    every = [c["score"] for c in state.candidates.values() if c.get("score") is not None]
    entry = {
        "generation": state.generation,
        "proposed": len(batch),
        "new": sum(not i["duplicate"] for i in batch),
        "duplicates": sum(i["duplicate"] for i in batch),
        "failed": sum(state.candidates[i["id"]]["status"] == "failed" for i in batch),
        "best": max(scores) if scores else None,
        "median": statistics.median(scores) if scores else None,
        "best_so_far": max(every) if every else None,
        "trained": outcome.trained,
        "reused": outcome.reused,
    }
    state.population = next_population(search, state, batch)
    state.history.append(entry)
    state.pending = None
    state.generation += 1
    state.complete = state.generation > search.algorithm.generations
    return entry


def _start(
    search: SearchFile,
    builder: CandidateBuilder,
    evaluator: Any,
    fingerprint: str,
    specs: dict[str, Spec] | None = None,
) -> tuple[SearchState, np.random.Generator]:
    """A new state with the initial population proposed (nothing saved yet); `specs` gets each
    candidate's spec as built (for a plan: not for training, which loads the spec it saved)."""
    state = SearchState(fingerprint=fingerprint)
    rng = _rng(search.algorithm.seed, None)
    batch = _propose(search, builder, state, rng)
    if specs is not None:
        specs.update((item["id"], item["candidate"].spec) for item in batch)
    _preflight(search, evaluator, batch[0]["candidate"].spec)
    _register(state, batch, 0)
    state.rng = rng.bit_generator.state
    return state, rng


def _state_path(search: SearchFile, config: EvalConfig, state_path: str | Path | None) -> Path:
    if state_path is None:  # beside the database, named after the search (a safe file name)
        return state_path_for(config.execution.db, search.name)
    return require_path(state_path, "the search state (--state)")


def run_search(
    search: SearchFile,
    config: EvalConfig | None = None,
    *,
    state_path: str | Path | None = None,
    restart: bool = False,
    evaluator: Any = None,
    observer: Observer | None = None,
    **evaluator_options: Any,
) -> SearchResult:
    """Run (or resume) a search to its last generation, or until its evaluation is interrupted.
    `evaluator_options` (reporter, stop, model_factory, task_registry) go to RunnerEvaluator."""
    if evaluator is not None and evaluator_options:
        raise TypeError("run_search() takes an evaluator or the RunnerEvaluator's options, not both")
    config = search_config(search, config)
    evaluator = evaluator or RunnerEvaluator(config, **evaluator_options)
    observer = observer or Observer()
    path = _state_path(search, config, state_path)
    builder = CandidateBuilder(search)
    loaded = None if restart else load_state(path, search)  # checked whole before any of it is used
    if loaded is None:
        state, rng = _start(search, builder, evaluator, search.fingerprint())
        specs: dict[str, Spec] = {}
        save_state(path, state)
        observer.proposed(0, state.pending)
    else:
        state, specs = loaded
        _preflight(search, evaluator, next(iter(specs.values())))  # a checked state holds a candidate
        rng = _rng(search.algorithm.seed, state.rng)
    result = SearchResult(search, state, path)
    while not state.complete:
        if state.pending is None:
            batch = _propose(search, builder, state, rng)
            _register(state, batch, state.generation)
            state.rng = rng.bit_generator.state
            save_state(path, state)
            observer.proposed(state.generation, state.pending)
        outcome = _evaluate(search, state, evaluator, specs)
        result.failed.update(outcome.failed)
        result.trained += outcome.trained
        result.reused += outcome.reused
        if outcome.interrupted:  # the batch stays pending: rerunning evaluates it again
            result.interrupted = True
            return result
        entry = _record(search, state, outcome)
        save_state(path, state)
        observer.recorded(entry["generation"], entry)
    return result


def plan_search(
    search: SearchFile,
    config: EvalConfig | None = None,
    *,
    state_path: str | Path | None = None,
    restart: bool = False,
    evaluator: Any = None,
    **evaluator_options: Any,
) -> dict[str, Any]:
    """A dry run: the batch the search would evaluate next (the initial population of a new search) and
    its cost (madsl.runner.plan.cost), with the whole search's estimated from it. Nothing is saved or trained."""
    config = search_config(search, config)
    evaluator = evaluator or RunnerEvaluator(config, **evaluator_options)
    path = _state_path(search, config, state_path)
    builder = CandidateBuilder(search)
    loaded = None if restart else load_state(path, search)
    specs: dict[str, Spec] = {}  # each candidate's spec as built or loaded: none is parsed again for the plan
    if loaded is None:
        state, rng = _start(search, builder, evaluator, search.fingerprint(), specs)
    else:
        (state, specs), rng = loaded, _rng(search.algorithm.seed, loaded[0].rng)
    if state.pending is None and not state.complete:
        batch = _propose(search, builder, state, rng)
        specs.update((item["id"], item["candidate"].spec) for item in batch if not item["duplicate"])
        _register(state, batch, state.generation)
    batch = state.pending or []
    new = [i for i in batch if state.candidates[i["id"]]["status"] == "pending"]
    plan_specs = [specs.get(i["id"]) or spec_from_data(state.candidates[i["id"]]["spec"]) for i in new]
    try:
        cost = evaluator.plan(plan_specs) if plan_specs else None
    except MadslError as err:
        raise _located(search, state, err) from None
    return _plan(search, state, path, batch, cost, len(plan_specs))


def _plan(
    search: SearchFile, state: SearchState, path: Path, batch: list[dict], cost: dict | None, count: int
) -> dict[str, Any]:
    remaining = search.algorithm.evaluations - len(state.scored())
    per = cost["run_seconds"] / count if cost and cost.get("run_seconds") is not None else None
    # where the batch's time is uncertain, the whole search's interval at the same factors
    between = (cost or {}).get("run_seconds_interval") if per is not None else None
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
        "rejected": dict(state.counts),
    }
