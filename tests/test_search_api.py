"""The search as a library (issue 40): ask/tell (the same search as run_search, resumable, its
input checked), a proposer plugged in from outside, the hypervolume (exact, against brute force)
and each generation's in the outputs, and the command line's cost guard. A stand-in score
computed from the topology (tests/test_search.py) stands in for training throughout."""

from __future__ import annotations

import io
import itertools
import json
import math
import random

import pytest
from test_search import SMALL, TopologyScore, lineage_of, write

import madsl.search.loop as loop_module
from madsl.cli import main
from madsl.errors import MadslError
from madsl.lang.budget import upper_bound
from madsl.search import BuiltinProposer, Proposer, Search, load_search, run_search
from madsl.search.algorithms import Breeding, children, mutated
from madsl.search.genome import from_data
from madsl.search.hypervolume import generation_hypervolumes, hypervolume
from madsl.search.record import front, record, render_text


def stand_in(proposal) -> dict:
    """TopologyScore's score of a proposal, as a told result."""
    text = proposal.spec.canonical()
    score = (sum(map(ord, text)) % 89) / 89 + 0.1 * text.count("A")
    return {"score": score, "tasks": {"toy-previous": score}}


def told_to_the_end(search: Search) -> None:
    while not search.complete:
        search.tell({p.id: stand_in(p) for p in search.ask()})


# --- hypervolume ---------------------------------------------------------------------------------


def brute_force(points, reference) -> float:
    """The dominated volume cell by cell: the grid of every point's coordinates and the reference's,
    a cell counted where some point weakly dominates its lower corner."""
    axes = [sorted({p[k] for p in points if p[k] < reference[k]} | {reference[k]}) for k in range(len(reference))]
    volume = 0.0
    for cell in itertools.product(*(range(len(a) - 1) for a in axes)):
        low = [axes[k][i] for k, i in enumerate(cell)]
        if any(all(p[k] <= low[k] for k in range(len(low))) for p in points):
            volume += math.prod(axes[k][i + 1] - axes[k][i] for k, i in enumerate(cell))
    return volume


def test_the_hypervolume_of_a_known_front():
    # minimised: (1,3) (2,2) (3,1) under (4,4): 3x1 + 2x1 + 1x1 = 6; a dominated point adds nothing
    assert hypervolume([(1, 3), (2, 2), (3, 1)], (4, 4)) == 6.0
    assert hypervolume([(1, 3), (2, 2), (3, 1), (3, 3)], (4, 4)) == 6.0
    assert hypervolume([(4, 1), (5, 0)], (4, 4)) == 0.0  # on or past the reference: nothing
    assert hypervolume([], (1, 1)) == 0.0 and hypervolume([(0.25,)], (1,)) == 0.75
    assert hypervolume([(0, 0, 0)], (1, 2, 3)) == 6.0


@pytest.mark.parametrize("dimensions", [2, 3, 4])
def test_the_hypervolume_is_exact_against_brute_force_on_random_points(dimensions):
    rng = random.Random(dimensions)
    for _ in range(40):
        points = [tuple(rng.choice([rng.random(), rng.randint(0, 4) / 4]) for _ in range(dimensions)) for _ in range(7)]
        reference = tuple(rng.uniform(0.6, 1.2) for _ in range(dimensions))
        assert hypervolume(points, reference) == pytest.approx(brute_force(points, reference), abs=1e-12)


def test_bad_hypervolume_input_is_an_error():
    with pytest.raises(MadslError, match="a point of 3 objectives"):
        hypervolume([(1, 2, 3)], (4, 4))
    with pytest.raises(MadslError, match="must be finite"):
        hypervolume([(1, 2)], (math.inf, 4))


# --- ask and tell --------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["nsga2", "regularized-evolution"])
def test_ask_and_tell_is_the_search_run_search_runs(algorithm, tmp_path):
    search = load_search(write(tmp_path, SMALL.replace("name: nsga2", f"name: {algorithm}")))
    reference = run_search(search, state_path=tmp_path / "run.json", evaluator=TopologyScore())
    asked = Search(search, tmp_path / "asked.json")
    first = asked.ask()
    assert [p.generation for p in first] == [0] * 4 and asked.ask() == first  # asking again: the same batch
    told_to_the_end(asked)
    assert asked.complete and asked.ask() == [] and lineage_of(asked) == lineage_of(reference)
    ignored = ("hypervolume", "trained", "reused")  # told results train nothing here
    assert [{k: v for k, v in h.items() if k not in ignored} for h in asked.history] == [
        {k: v for k, v in h.items() if k not in ignored} for h in reference.state.history
    ]
    assert [c["name"] for c in asked.front()] == [c["name"] for c in front(search, reference.state)]


def test_an_ask_tell_search_resumes_from_its_state_file(tmp_path):
    search = load_search(write(tmp_path, SMALL))
    whole = Search(search, tmp_path / "whole.json")
    told_to_the_end(whole)
    path = tmp_path / "stopped.json"
    stopped = Search(search, path)
    stopped.tell({p.id: stand_in(p) for p in stopped.ask()})  # generation 0 recorded and saved
    batch = stopped.ask()
    stopped.tell({batch[0].id: stand_in(batch[0])})  # held in memory only: the generation is not complete
    resumed = Search(search, path)
    assert resumed.generation == 1 and [p.id for p in resumed.ask()] == [p.id for p in batch]
    told_to_the_end(resumed)
    assert lineage_of(resumed) == lineage_of(whole)
    # the state is `madsl search`'s: run_search reads it and finds the search complete
    done = TopologyScore()
    assert lineage_of(run_search(search, state_path=path, evaluator=done)) == lineage_of(whole) and done.calls == 0


def test_told_results_are_checked_whole(tmp_path):
    search = Search(load_search(write(tmp_path, SMALL)), tmp_path / "s.json")
    batch = search.ask()
    a, b = batch[0].id, batch[1].id
    cases = [
        ({"0" * 64: 0.5}, "is not a candidate asked for"),
        ({a: math.nan}, "not a finite number"),
        ({a: math.inf}, "not a finite number"),
        ({a: True}, "not a finite number"),
        ({a: "0.9"}, "not a finite number"),
        ({a: {"score": 0.5, "tasks": {"t": -math.inf}}}, "task 't'"),
        ({a: {"score": 0.5, "loss": 1}}, "score and tasks only"),
        ({a: 0.5, b: math.nan}, "not a finite number"),  # refused whole: a is not kept
    ]
    for results, message in cases:
        with pytest.raises(MadslError, match=message):
            search.tell(results)
    with pytest.raises(MadslError, match="mapping"):
        search.tell([(a, 0.5)])
    assert search.tell({a: 0.5}) is None
    with pytest.raises(MadslError, match="told a result already"):
        search.tell({a: 0.6})
    entry = search.tell({p.id: None for p in batch[1:]})  # failures: unscored, ranked last
    assert entry["generation"] == 0 and entry["failed"] == 3 and entry["best"] == 0.5
    with pytest.raises(MadslError, match="has its result already"):
        search.tell({a: 0.7})


# --- a proposer from outside ----------------------------------------------------------------------


class FirstMember:
    """Every child a mutation of the population's first member; the population: the best scores."""

    def propose(self, context: Breeding, count: int) -> list[dict]:
        first = context.state.population[0]
        return children(context, count, lambda: mutated(context, from_data(first["genome"]), [first["id"]]))

    def survivors(self, search, state, batch) -> list[dict]:
        pool = list(
            {m["id"]: m for m in state.population + [{"id": p["id"], "genome": p["genome"]} for p in batch]}.values()
        )
        pool.sort(key=lambda m: -(state.candidates[m["id"]]["score"] or -1))
        return pool[: search.algorithm.population]


def test_an_outside_proposer_drives_a_search_and_its_state_resumes(tmp_path):
    search = load_search(write(tmp_path, SMALL))
    assert isinstance(FirstMember(), Proposer) and isinstance(BuiltinProposer("nsga2"), Proposer)
    result = run_search(search, state_path=tmp_path / "s.json", evaluator=TopologyScore(), proposer=FirstMember())
    children_ = [c for c in result.state.candidates.values() if c["generation"] > 0]
    assert result.state.complete and children_
    assert all(len(c["parents"]) == 1 or c["operator"] == "random" for c in children_)
    again = run_search(search, state_path=tmp_path / "b.json", evaluator=TopologyScore(), proposer=FirstMember())
    assert lineage_of(again) == lineage_of(result)  # deterministic through the search's generator
    resumed = Search(search, tmp_path / "s.json", proposer=FirstMember())  # the saved state loads again
    assert resumed.complete and lineage_of(resumed) == lineage_of(result)


class Broken(FirstMember):
    def propose(self, context, count):
        return super().propose(context, count)[:-1]


def test_an_outside_proposer_that_breaks_the_rules_is_refused(tmp_path):
    search = load_search(write(tmp_path, SMALL))
    with pytest.raises(MadslError, match="is not a proposer"):
        Search(search, tmp_path / "a.json", proposer=object())
    with pytest.raises(MadslError, match="proposer Broken: returned list of 2 proposals; 3 were asked for"):
        run_search(search, state_path=tmp_path / "b.json", evaluator=TopologyScore(), proposer=Broken())


# --- hypervolume in the outputs --------------------------------------------------------------------


def test_each_generations_hypervolume_is_in_the_history_the_record_and_the_table(tmp_path):
    search = load_search(write(tmp_path, SMALL))
    result = run_search(search, state_path=tmp_path / "s.json", evaluator=TopologyScore())
    data = json.loads(json.dumps(record(result)))
    assert data["hypervolume"]["reference"] == {"score": 0.0, "params": 45000.0}  # the budget's bound
    volumes = [g["hypervolume"] for g in data["generations"]]
    assert len(volumes) == 4 and volumes == sorted(volumes) and 0 < volumes[-1] <= 1
    scored = [c for c in result.state.candidates.values() if c["score"] is not None]
    direct = hypervolume([(-c["score"], c["totals"]["params"] / 45000) for c in scored], (0, 1))
    assert volumes[-1] == pytest.approx(direct)
    assert [h["hypervolume"] for h in Search(search, tmp_path / "s.json").history] == volumes
    text = render_text(search, result.state)
    assert "best so far  hypervolume" in text and f"{volumes[-1]:.4f}" in text
    assert "to (score 0, params 45,000) the front dominates" in text
    unbounded = load_search(write(tmp_path, SMALL.replace("params: <= 45000", "fixed_state: <= 100000")))
    state = run_search(unbounded, state_path=tmp_path / "u.json", evaluator=TopologyScore()).state
    largest = max(c["totals"]["params"] for c in state.candidates.values())
    assert generation_hypervolumes(unbounded, state)["reference"]["params"] == pytest.approx(1.1 * largest)


def test_total_state_is_bounded_by_its_parts_where_it_has_no_bound_of_its_own(tmp_path):
    budget = {"fixed_state": "<= 4096", "kv_cache": "<= 32768"}
    assert upper_bound(budget, "total_state") == 36864  # issue 40's comparison's box
    assert upper_bound({**budget, "total_state": "<= 10000"}, "total_state") == 10000  # its own bound first
    assert upper_bound({"fixed_state": "<= 4096"}, "total_state") == math.inf  # a part unbounded
    assert upper_bound(budget, "params") == math.inf
    text = SMALL.replace("params: <= 45000", "fixed_state: <= 4096\n  kv_cache: <= 32768").replace(
        "minimize: [params]", "minimize: [total_state]"
    )
    search = load_search(write(tmp_path, text))
    state = run_search(search, state_path=tmp_path / "s.json", evaluator=TopologyScore()).state
    assert generation_hypervolumes(search, state)["reference"] == {"score": 0.0, "total_state": 36864.0}


# --- the cost guard --------------------------------------------------------------------------------


class Expensive(TopologyScore):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def plan(self, specs) -> dict:
        return {"run_seconds": 3000.0 * len(specs)}  # 13 candidates at 50 minutes each


def test_the_cost_rule():
    over = loop_module.over_cost
    assert over({"estimated_run_seconds": 3600.0, "remaining": 5}) is None
    assert "estimated at 1.5 h of run time" in over({"estimated_run_seconds": 5400.0, "remaining": 5})
    assert over({"estimated_run_seconds": None, "remaining": loop_module.COST_GUARD_CANDIDATES}) is None
    assert "no estimate" in over({"estimated_run_seconds": None, "remaining": loop_module.COST_GUARD_CANDIDATES + 1})


@pytest.mark.parametrize(
    "terminal, answer, yes", [(False, "", False), (True, "n\n", False), (True, "y\n", False), (False, "", True)]
)
def test_a_costly_search_asks_first_and_refuses_without_yes_where_nobody_can_answer(
    terminal, answer, yes, tmp_path, monkeypatch, capsys
):
    path = write(tmp_path, SMALL.replace("toy-previous", "in-context-recall"))
    monkeypatch.setattr(loop_module, "RunnerEvaluator", Expensive)
    stdin = io.StringIO(answer)
    stdin.isatty = lambda: terminal
    monkeypatch.setattr("sys.stdin", stdin)
    db = tmp_path / "r.db"
    code = main(["search", str(path), "--db", str(db), "--format", "json"] + (["--yes"] if yes else []))
    err = capsys.readouterr().err
    runs = yes or answer == "y\n"
    assert code == (0 if runs else 2)
    assert ("Train it? [y/N]" in err) == terminal
    if not runs:  # refused: named --yes and the estimate, nothing saved
        assert "--yes" in err and "10.8 h of run time" in err
        assert not (tmp_path / "r.search-small.json").exists()
    else:
        assert json.loads((tmp_path / "r.search-small" / "search.json").read_text())["complete"]
