"""The search as a library, in the ask/tell style (as optuna's): the search proposes, the caller
scores, the search records and selects. `madsl search` and run_search drive it with the runner
(madsl.search.loop); a caller may score candidates any other way.

    search = Search("specs/search/recall-hybrids.yaml", state_path="my.search.json")
    while not search.complete:
        for proposal in search.ask():                 # the candidates of the next generation to score
            search.tell({proposal.id: train(proposal.spec)})   # a score, or None: the candidate failed
    search.front(); search.history

A generation is recorded, selected from and saved when every candidate `ask` returned has its
result; results told before that are held in memory (a search stopped then asks for the same
batch again). The state is saved as `madsl search` saves it (after each proposal and each recorded
generation) and read back as it reads it: the same state file resumes either, and the same seed
gives the same candidates.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from madsl.errors import Location, MadslError
from madsl.lang.spec import Spec, spec_from_data
from madsl.paths import require_path
from madsl.runner.config import EvalConfig
from madsl.search.algorithms import Breeding, initial_population
from madsl.search.candidates import CandidateBuilder
from madsl.search.config import SearchFile
from madsl.search.hypervolume import generation_hypervolumes
from madsl.search.proposers import check_proposals, check_survivors, proposer_for
from madsl.search.reading import load_search
from madsl.search.record import front
from madsl.search.state import SearchState, json_ready, save_state, state_path_for
from madsl.search.state_check import load_state

WHERE = Location("Search.tell")  # a told result is the caller's input, not a file's


@dataclass(frozen=True)
class Proposal:
    """A candidate to score: its identity (the spec hash its runs are filed under), its model, its lineage."""

    id: str
    name: str
    topology: str
    generation: int
    parents: tuple[str, ...]  # spec hashes
    operator: str
    totals: dict[str, int]
    spec_data: dict[str, Any]  # the spec as a .mad file holds it
    spec: Spec = field(compare=False, repr=False)


def resolve_state_path(search: SearchFile, config: EvalConfig | None, path: str | os.PathLike | None) -> Path:
    """Where a search's state is saved: `path`, else beside the results database (`madsl search`'s default)."""
    if path is None:
        return state_path_for((config or EvalConfig()).execution.db, search.name)
    return require_path(path, "the search state (--state)")


def rng_from(seed: int, saved: dict[str, Any] | None) -> np.random.Generator:
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


class Search:
    """One search, asked for candidates and told their results. `search`: a search file's path or
    a loaded SearchFile; `state_path`: where its state is saved (default: beside `config`'s results
    database, as `madsl search`); `restart`: ignore a saved state; `proposer`: a
    madsl.search.proposers.Proposer in place of the file's algorithm."""

    def __init__(
        self,
        search: SearchFile | str | os.PathLike,
        state_path: str | os.PathLike | None = None,
        *,
        config: EvalConfig | None = None,
        restart: bool = False,
        proposer: Any = None,
    ):
        self.file = search if isinstance(search, SearchFile) else load_search(search)
        self.state_path = resolve_state_path(self.file, config, state_path)
        self.proposer = proposer_for(self.file, proposer)
        self.builder = CandidateBuilder(self.file)
        loaded = None if restart else load_state(self.state_path, self.file)  # checked whole before any use
        self.state, self.loaded = loaded or (SearchState(fingerprint=self.file.fingerprint()), {})
        self.rng = rng_from(self.file.algorithm.seed, self.state.rng)
        self.built: dict[str, Spec] = {}  # specs as built here (for plans; what trains is loaded from the state)
        self.unsaved = False  # a batch proposed and not yet saved
        self.told: dict[str, dict[str, Any]] = {}  # results of the pending batch told so far

    # --- what it holds ---------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        return self.state.complete

    @property
    def generation(self) -> int:
        return self.state.generation

    @property
    def history(self) -> list[dict[str, Any]]:
        """Each finished generation: proposed, new, duplicates, failed, best, median, best so far,
        runs trained and reused, and the hypervolume of the front found by its end."""
        values = generation_hypervolumes(self.file, self.state)["values"]
        return [{**entry, "hypervolume": hv} for entry, hv in zip(self.state.history, values)]

    def front(self) -> list[dict[str, Any]]:
        """The scored candidates no other dominates over the objectives, best score first."""
        return front(self.file, self.state)

    # --- ask and tell ----------------------------------------------------------------------------

    def ask(self) -> list[Proposal]:
        """The candidates of the pending generation still to be told a result, proposing (and
        saving) the next generation where none is pending; [] once the search is complete. A
        generation whose proposals are all identities scored before is recorded at once."""
        while not self.state.complete:
            self.prepare()
            if self.unsaved:
                self.save()
            todo = [spec_hash for spec_hash in self.needed() if spec_hash not in self.told]
            if todo:
                return [self.proposal(spec_hash) for spec_hash in todo]
            self.record({})
        return []

    def tell(self, results: Mapping[str, Any]) -> dict[str, Any] | None:
        """Results of asked candidates, by id: a score (a finite number), None (the candidate
        failed: unscored, ranked last), or {"score": ..., "tasks": {task: score}}. Checked whole
        before any is kept. Returns the generation's history entry once every candidate asked has
        its result (the generation is recorded and saved), else None."""
        if not isinstance(results, Mapping):
            raise MadslError(f"tell() takes a mapping of candidate ids to results, got {type(results).__name__}", WHERE)
        needed = set(self.needed()) if self.state.pending is not None and not self.unsaved else set()
        checked = {key: self.told_result(key, value, needed) for key, value in results.items()}
        self.told.update(checked)
        if needed and needed <= set(self.told):
            return self.record(self.told)
        return None

    def told_result(self, key: Any, value: Any, needed: set[str]) -> dict[str, Any]:
        if key in self.told:
            raise MadslError(f"candidate {key!r} was told a result already", WHERE, hint="tell each candidate once")
        if key not in needed:
            record = self.state.candidates.get(key) if isinstance(key, str) else None
            what = "has its result already" if record is not None else "is not a candidate asked for"
            raise MadslError(f"candidate {key!r} {what}", WHERE, hint="tell the ids of the proposals ask() returned")
        if value is None:
            return {"score": None, "tasks": {}}
        if isinstance(value, Mapping):
            unknown = set(value) - {"score", "tasks"}
            tasks = value.get("tasks", {})
            if unknown or not isinstance(tasks, Mapping):
                raise MadslError(f"candidate {key!r}: a result holds score and tasks only", WHERE)
            return {
                "score": _score(key, value.get("score")),
                "tasks": {str(t): _score(key, s, f"task {t!r}") for t, s in tasks.items()},
            }
        return {"score": _score(key, value), "tasks": {}}

    # --- the steps the loop drives ----------------------------------------------------------------

    def prepare(self, check: Callable[[Spec], Any] | None = None) -> list[dict[str, Any]]:
        """The pending batch, proposed where none is (not saved yet: see save). `check(spec)` sees
        the first candidate of a new search before it enters the state (the evaluation settings'
        check: a refusal leaves nothing behind)."""
        if self.state.pending is None and not self.state.complete:
            self.propose(check)
        return self.state.pending or []

    def propose(self, check: Callable[[Spec], Any] | None = None) -> None:
        state, algorithm = self.state, self.file.algorithm
        context = Breeding(self.file, self.builder, state, self.rng)
        if state.generation == 0:
            batch = initial_population(context)
        else:
            known = set(state.candidates)
            batch = self.proposer.propose(context, algorithm.offspring)
            check_proposals(self.proposer, context, known, batch, algorithm.offspring)
        self.built.update((item["id"], item["candidate"].spec) for item in batch if not item["duplicate"])
        if check is not None and state.generation == 0:
            check(batch[0]["candidate"].spec)
        register(state, batch, state.generation)
        state.rng = self.rng.bit_generator.state
        self.unsaved = True

    def save(self) -> None:
        save_state(self.state_path, self.state)
        self.unsaved = False

    def needed(self) -> list[str]:
        """The pending batch's candidates without a recorded result, each once, in the batch's order."""
        pending = self.state.pending or []
        return list(
            dict.fromkeys(item["id"] for item in pending if self.state.candidates[item["id"]]["status"] == "pending")
        )

    def proposal(self, spec_hash: str) -> Proposal:
        record = self.state.candidates[spec_hash]
        return Proposal(
            id=spec_hash,
            name=record["name"],
            topology=record["topology"],
            generation=record["generation"],
            parents=tuple(record["parents"]),
            operator=record["operator"],
            totals=dict(record["totals"]),
            spec_data=record["spec"],
            spec=self.loaded.get(spec_hash) or spec_from_data(record["spec"]),
        )

    def record(self, results: Mapping[str, Any], trained: int = 0, reused: int = 0) -> dict[str, Any]:
        """The pending batch's results into the state (a candidate missing from `results`, or
        without a number for its score, failed), the survivors chosen, the state saved; returns
        the generation's history entry."""
        state = self.state
        batch = state.pending or []
        for item in batch:
            record = state.candidates[item["id"]]
            if record["status"] == "pending":
                result = json_ready(results.get(item["id"], {"score": None, "tasks": {}}))  # NaN: no score
                status = "scored" if result["score"] is not None else "failed"
                record.update(score=result["score"], tasks=result["tasks"], status=status)
        entry = history_entry(state, batch, trained, reused)
        population = self.proposer.survivors(self.file, state, batch)
        check_survivors(self.proposer, self.file, state, population)
        state.population = population
        state.history.append(entry)
        state.pending = None
        state.generation += 1
        state.complete = state.generation > self.file.algorithm.generations
        self.told = {}
        self.save()
        return entry


def _score(key: str, value: Any, what: str = "score") -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MadslError(
            f"candidate {key!r}: the {what} {value!r} is not a finite number",
            WHERE,
            hint="tell None for a candidate that failed (it stays unscored and ranks last)",
        )
    return float(value)


def register(state: SearchState, batch: list[dict], generation: int) -> None:
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


def history_entry(state: SearchState, batch: list[dict], trained: int, reused: int) -> dict[str, Any]:
    """A recorded generation's line of the history: its proposals, their scores, the best so far."""
    scores = [state.candidates[i["id"]]["score"] for i in batch if state.candidates[i["id"]]["score"] is not None]
    every = [c["score"] for c in state.candidates.values() if c.get("score") is not None]
    return {
        "generation": state.generation,
        "proposed": len(batch),
        "new": sum(not i["duplicate"] for i in batch),
        "duplicates": sum(i["duplicate"] for i in batch),
        "failed": sum(state.candidates[i["id"]]["status"] == "failed" for i in batch),
        "best": max(scores) if scores else None,
        "median": statistics.median(scores) if scores else None,
        "best_so_far": max(every) if every else None,
        "trained": trained,
        "reused": reused,
    }
