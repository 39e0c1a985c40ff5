"""`madsl search` without training: the search file and its located errors, NSGA-II's ranking, the
operators, the candidate builder (budgets, fit, identities), and the loop's determinism and resume
with a stand-in evaluator (a score computed from the topology). tests/test_search_runs.py runs
searches through the runner."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from madsl.cli import main
from madsl.errors import MadslError
from madsl.search.candidates import Candidate, CandidateBuilder, Rejection
from madsl.search.evaluation import BatchOutcome
from madsl.search.genome import Genome, make_block, random_genome
from madsl.search.loop import plan_search, run_search
from madsl.search.nsga2 import crowding_distance, dominates, non_dominated_sort, survivors
from madsl.search.operators import MUTATIONS, crossover, mutate
from madsl.search.reading import load_search
from madsl.search.record import front, spec_text
from madsl.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "specs" / "search" / "recall-hybrids.yaml"

SMALL = """\
name: small
dim: 32
budget:
  params: <= 45000
space:
  sequence_mixers: [H, A, Mb]
  channel_mixers: [Sg, MoE]
  blocks: {min: 1, max: 3}
  shapes: [sequence, motif, striped, parallel]
  hyperparameters:
    A.heads: [1, 2, 4]
objectives:
  score: {protocol: smoke, tasks: [toy-previous]}
  minimize: [params]
algorithm: {name: nsga2, population: 4, generations: 3, offspring: 3, seed: 7}
"""


def write(tmp_path: Path, text: str, name: str = "search.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- NSGA-II ------------------------------------------------------------------------------------


def test_non_dominated_sorting_and_crowding_distance_on_a_known_example():
    # minimised: A(1,5) B(2,3) C(4,1) are non-dominated; D(3,4) is dominated by B only; E(5,5) by A, B, C and D
    points = [(1, 5), (2, 3), (4, 1), (3, 4), (5, 5)]
    assert non_dominated_sort(points) == [[0, 1, 2], [3], [4]]
    # B's neighbours span 3/3 of objective 1 and 4/4 of objective 2: 2.0; the ends are infinite
    assert crowding_distance(points, [0, 1, 2]) == {0: math.inf, 1: 2.0, 2: math.inf}
    # a front of four: (1,6) gets (3-0)/10 + (10-3)/10 = 1.0, (3,3) gets (10-1)/10 + (6-0)/10 = 1.5
    four = [(0, 10), (1, 6), (3, 3), (10, 0)]
    distance = crowding_distance(four, [0, 1, 2, 3])
    assert distance[1] == pytest.approx(1.0) and distance[2] == pytest.approx(1.5)
    assert distance[0] == distance[3] == math.inf
    assert survivors(four, 3) == [0, 3, 2]  # the ends, then the larger crowding distance
    assert survivors(points, 4) == [0, 1, 2, 3]  # whole fronts first


def test_a_failed_candidate_lands_on_the_last_front_whatever_its_state():
    """Deb's constrained domination: an unscored candidate (+inf in the negated score) is
    dominated by every scored one, even with the smallest state, and is never kept over them."""
    points = [(-0.99, 4000), (-0.95, 3000), (-0.5, 2000), (math.inf, 1000), (-0.3, 2500)]
    assert non_dominated_sort(points) == [[0, 1, 2], [4], [3]]
    assert survivors(points, 3) == [0, 1, 2] and survivors(points, 4) == [0, 1, 2, 4]
    assert dominates(points[4], points[3]) and not dominates(points[3], points[4])
    failed = [(math.inf, 10), (math.inf, 5)]  # two failures dominate neither the other: one front
    assert non_dominated_sort(failed) == [[0, 1]]


def test_fronts_partition_the_points_and_each_is_dominated_only_by_earlier_ones():
    rng = np.random.default_rng(0)
    points = [tuple(p) for p in rng.integers(0, 6, (40, 3)).tolist()]
    fronts = non_dominated_sort(points)
    assert sorted(i for f in fronts for i in f) == list(range(len(points)))
    for k, current in enumerate(fronts):
        assert not any(dominates(points[a], points[b]) for a in current for b in current)
        if k:
            assert all(any(dominates(points[a], points[b]) for a in fronts[k - 1]) for b in current)


# --- bad search files: located errors, exit status 2, nothing trained -----------------------------

BAD_FILES = {
    "unknown primitive": (SMALL.replace("[H, A, Mb]", "[H, Hyena, Mb]"), "unknown layer 'Hyena'", 6, 24),
    "empty space": (SMALL.replace("[H, A, Mb]", "[]"), "space.sequence_mixers: the list is empty", 6, 20),
    "unmeetable budget": (SMALL.replace("<= 45000", "<= 100"), "no candidate meets the budget", 4, 11),
    "population of 0": (SMALL.replace("population: 4", "population: 0"), "algorithm.population", 15, 38),
}


@pytest.mark.parametrize("case", list(BAD_FILES), ids=list(BAD_FILES))
def test_bad_search_files_are_located_errors_with_exit_2_before_anything_trains(case, tmp_path, capsys):
    text, message, line, column = BAD_FILES[case]
    path = write(tmp_path, text)
    db = tmp_path / "r.db"
    assert main(["search", str(path), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert message in err and f"{path}:{line}:{column}" in err
    assert "Traceback" not in err
    assert not db.exists() and not list(tmp_path.glob("r.search-*"))  # no database, no state: nothing ran


def test_a_missing_search_file_is_named_as_one(tmp_path, capsys):
    assert main(["search", str(tmp_path / "nowhere.yaml"), "--db", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err
    assert "no such search file" in err and "Traceback" not in err and not (tmp_path / "r.db").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        (("[Sg, MoE]", "[Sg, H]"), "H is a sequence mixer, not a channel mixer"),
        (
            ("params: <= 45000", "params: <= 45000\n  fit: [GDN.head_dim]"),
            "budget.fit: GDN.head_dim: the space has no 'GDN'",
        ),
        (("A.heads: [1, 2, 4]", "A.heads: [1, 3]"), "space.hyperparameters.A.heads"),
        (("seed: 7}", "seed: 7, sample_size: 2}"), "sample_size applies to regularized-evolution only"),
        (("blocks: {min: 1, max: 3}", "blocks: {min: 3, max: 2}"), "blocks.min 3 is larger than blocks.max 2"),
        (("[sequence, motif, striped, parallel]", "[sequence, spiral]"), "unknown shape 'spiral'"),
        (("tasks: [toy-previous]}", "tasks: [toy-previous], lr: -1}"), "objectives.score.lr"),
        (("minimize: [params]", "minimize: [state]"), "unknown quantity 'state'"),
    ],
)
def test_more_bad_search_files_are_located(change, message, tmp_path):
    path = write(tmp_path, SMALL.replace(*change))
    with pytest.raises(MadslError) as caught:
        load_search(path)
    assert message in caught.value.message
    assert caught.value.location.file == str(path) and caught.value.location.line is not None


# --- operators and candidates -------------------------------------------------------------------


def test_every_operator_keeps_children_inside_the_space(tmp_path):
    search = load_search(write(tmp_path, SMALL))
    space = search.space
    rng = np.random.default_rng(1)
    seen_operators = set()
    for _ in range(300):
        genome = random_genome(space, rng)
        assert genome.fits(space)
        result = mutate(genome, space, rng)
        assert result is not None
        child, operator = result
        seen_operators.add(operator)
        other = crossover(child, random_genome(space, rng), space, rng) or child
        for g in (child, other):
            assert g.fits(space) and space.min_blocks <= g.blocks_count <= space.max_blocks
            for block in g.unit:
                mixers = [b.symbol for b in getattr(block.mixer, "branches", [block.mixer])]
                assert set(mixers) <= set(space.sequence_mixers) and len(mixers) <= 2
                channel = block.channel.symbol if block.channel else None
                assert channel in space.channel_choices(tuple(mixers))
            assert dict(g.params)["A.heads"] in (1, 2, 4)
    assert seen_operators == set(MUTATIONS)


def test_candidates_are_solved_into_the_budget_or_rejected_and_keep_their_identity_in_a_mad_file(tmp_path):
    search = load_search(EXAMPLE)
    builder = CandidateBuilder(search)
    four_hyenas = builder.build(Genome("sequence", (make_block(("H",), "Sg"),) * 4, 1))
    assert isinstance(four_hyenas, Candidate)
    assert four_hyenas.solved == {"H.filter_states": 8} and four_hyenas.totals["fixed_state"] == 4096
    attention = builder.build(Genome("motif", (make_block(("mA",), "Sg"),), 3))  # a KV cache of three layers
    assert isinstance(attention, Rejection) and attention.reason == "over budget" and "kv_cache" in attention.message
    # the .mad file written for a candidate is the same model: the same identity, within its budget
    candidate = {
        "name": four_hyenas.name,
        "id": four_hyenas.spec_hash,
        "score": 0.5,
        "tasks": {"t": 0.5},
        "generation": 0,
        "spec": four_hyenas.spec_data,
    }
    written = write(tmp_path, spec_text(search, candidate), f"{four_hyenas.name}.mad")
    assert load_spec(written).hash == four_hyenas.spec_hash
    assert main(["check", str(written), "-q"]) == 0


@pytest.mark.parametrize(
    "paper, genome",
    [
        ("hyena-sg", Genome("motif", (make_block(("H",), "Sg"),), 2)),
        ("mamba", Genome("sequence", (make_block(("Mb",), None),) * 4, 1)),
        ("striped-hyena-moe", Genome("sequence", (make_block(("H",), "MoE"), make_block(("mA",), "MoE")), 1)),
        ("striped-mamba-sg", Genome("sequence", (make_block(("Mb",), None),) * 2 + (make_block(("mA",), "Sg"),), 1)),
        ("mh-attention-sg", Genome("sequence", (make_block(("mA",), "Sg"),) * 2, 1)),
    ],
)
def test_the_example_space_holds_the_papers_hand_written_specs(paper, genome):
    search = load_search(EXAMPLE)
    assert genome.fits(search.space)
    built = CandidateBuilder(search).build(genome)
    assert isinstance(built, Candidate) and built.solved == {}
    assert built.spec_hash == load_spec(REPO / "specs" / "paper" / f"{paper}.mad").hash


# --- the loop, with a stand-in evaluator -------------------------------------------------------


class TopologyScore:
    """A stand-in evaluator: a score computed from the canonical topology; it can interrupt a batch."""

    def __init__(self, interrupt_at: int | None = None):
        self.evaluated: list[str] = []  # spec hashes, each time one is scored
        self.calls, self.interrupt_at = 0, interrupt_at

    def check(self, spec) -> tuple[str, ...]:
        return ("toy-previous",)

    def evaluate(self, specs) -> BatchOutcome:
        self.calls += 1
        if self.calls == self.interrupt_at:
            return BatchOutcome(interrupted=True)
        outcome = BatchOutcome(trained=len(specs))
        for spec in specs:
            spec_hash = spec.hash
            self.evaluated.append(spec_hash)
            text = spec.canonical()
            score = (sum(map(ord, text)) % 89) / 89 + 0.1 * text.count("A")
            outcome.results[spec_hash] = {"score": score, "tasks": {"toy-previous": score}}
        return outcome

    def plan(self, specs) -> dict:
        return {"run_seconds": 2.0 * len(specs)}


def lineage_of(result) -> list[tuple]:
    return [
        (c["name"], c["generation"], tuple(c["parents"]), c["operator"], c["score"])
        for c in result.state.candidates.values()
    ]


@pytest.mark.parametrize("algorithm", ["nsga2", "regularized-evolution", "random"])
def test_the_same_seed_gives_the_same_search_and_an_interrupted_one_resumes_to_it(algorithm, tmp_path):
    text = SMALL.replace("name: nsga2", f"name: {algorithm}")
    search = load_search(write(tmp_path, text))
    first = run_search(search, state_path=tmp_path / "a.json", evaluator=TopologyScore())
    again = run_search(search, state_path=tmp_path / "b.json", evaluator=TopologyScore())
    assert first.state.complete and lineage_of(first) == lineage_of(again)
    assert len(first.state.history) == 4 and first.state.history[-1]["best_so_far"] == max(
        c["score"] for c in first.state.candidates.values()
    )
    # stopped during generation 2's evaluation, then rerun: the same search, nothing scored twice
    stopping = TopologyScore(interrupt_at=3)
    stopped = run_search(search, state_path=tmp_path / "c.json", evaluator=stopping)
    assert stopped.interrupted and not stopped.state.complete
    resumed = run_search(search, state_path=tmp_path / "c.json", evaluator=stopping)
    assert resumed.state.complete and lineage_of(resumed) == lineage_of(first)
    assert len(stopping.evaluated) == len(set(stopping.evaluated)) == len(first.state.candidates)
    assert [c["name"] for c in front(search, resumed.state)] == [c["name"] for c in front(search, first.state)]
    # a finished search reruns to the same result without scoring anything
    done = TopologyScore()
    assert lineage_of(run_search(search, state_path=tmp_path / "c.json", evaluator=done)) == lineage_of(first)
    assert done.calls == 0


def test_a_state_of_another_search_file_is_refused(tmp_path):
    run_search(load_search(write(tmp_path, SMALL)), state_path=tmp_path / "s.json", evaluator=TopologyScore())
    changed = load_search(write(tmp_path, SMALL.replace("seed: 7", "seed: 8")))
    with pytest.raises(MadslError, match="belongs to another search"):
        run_search(changed, state_path=tmp_path / "s.json", evaluator=TopologyScore())
    restarted = run_search(changed, state_path=tmp_path / "s.json", evaluator=TopologyScore(), restart=True)
    assert restarted.state.complete


def test_a_dry_run_plans_the_initial_population_the_search_then_evaluates(tmp_path):
    search = load_search(write(tmp_path, SMALL))
    plan = plan_search(search, state_path=tmp_path / "s.json", evaluator=TopologyScore())
    assert not (tmp_path / "s.json").exists()  # nothing saved
    assert plan["plan"] == {"run_seconds": 8.0} and plan["evaluations"] == 4 + 3 * 3
    assert plan["estimated_run_seconds"] == pytest.approx(2.0 * 13)
    assert plan["estimated_cpu_seconds"] == pytest.approx(2.0 * 13) and plan["startup_seconds"] == 0.0

    class Starting(TopologyScore):  # a plan whose processes take 3 s each to start, two of them
        def plan(self, specs) -> dict:
            return {"run_seconds": 2.0 * len(specs), "startup_seconds": 3.0, "processes": 2}

    started = plan_search(search, state_path=tmp_path / "s.json", evaluator=Starting())
    # the whole search's runs, and its processes' start-up once, not once a candidate
    assert started["estimated_cpu_seconds"] == pytest.approx(2.0 * 13 + 6.0) and started["startup_seconds"] == 6.0
    result = run_search(search, state_path=tmp_path / "s.json", evaluator=TopologyScore())
    initial = [c["name"] for c in result.state.candidates.values() if c["generation"] == 0]
    assert [c["name"] for c in plan["batch"]] == initial


@pytest.mark.parametrize("damage", ["not json", '{"format": "other"}', "state of another search", "damaged"])
def test_a_state_file_that_is_not_this_searchs_is_refused_and_left_as_it_is(damage, tmp_path):
    search = load_search(write(tmp_path, SMALL))
    path = tmp_path / "s.json"
    run_search(search, state_path=path, evaluator=TopologyScore())
    saved = path.read_text()
    text = {
        "not json": "{",
        '{"format": "other"}': '{"format": "other"}',
        "state of another search": saved.replace(search.fingerprint(), "0" * 64),
        "damaged": saved.replace('"population": [{"id": "', '"population": [{"id": "x'),
    }[damage]
    path.write_text(text)
    with pytest.raises(MadslError, match="search state"):
        run_search(search, state_path=path, evaluator=TopologyScore())
    assert path.read_text() == text


def test_regularized_evolution_ages_out_a_re_proposed_identity_instead_of_renewing_it():
    """A duplicate child (an identity proposed before, scored from the store) does not re-enter
    the population young: the queue keeps each identity at the age it first had."""
    from types import SimpleNamespace

    from madsl.search.algorithms import next_population

    search = SimpleNamespace(algorithm=SimpleNamespace(name="regularized-evolution", population=3))
    state = SimpleNamespace(population=[{"id": i, "genome": {}} for i in ("a", "b", "c")])
    batch = [{"id": "a", "genome": {}, "duplicate": True}, {"id": "d", "genome": {}, "duplicate": False}]
    assert [m["id"] for m in next_population(search, state, batch)] == ["b", "c", "d"]
    only_duplicates = [{"id": "c", "genome": {}, "duplicate": True}]
    assert [m["id"] for m in next_population(search, state, only_duplicates)] == ["a", "b", "c"]


def test_a_breeding_that_returns_its_parent_is_counted_and_bred_again():
    from types import SimpleNamespace

    from madsl.search.algorithms import make_child
    from madsl.search.state import SearchState

    hashes = iter(["p", "p", "child"])  # the operator returns the parent twice, then a new identity
    builder = SimpleNamespace(build=lambda genome: SimpleNamespace(spec_hash=next(hashes)))
    genome = SimpleNamespace(to_data=lambda: {})
    ctx = SimpleNamespace(builder=builder, state=SearchState("f"), known={"p"})
    child = make_child(ctx, lambda: (genome, ["p"], "reshape"))
    assert child["id"] == "child" and not child["duplicate"] and ctx.state.counts["parent_returned"] == 2


def test_a_front_file_keeps_its_fit_rule_and_a_study_solves_it_again_at_each_width(tmp_path, capsys):
    """A front spec names the search's free parameters under budget.fit: at its own width the
    solved values meet the budget and stand (the identity the search scored), and a study at
    another width solves them again (the dry run shows the values), never freezing them."""
    import json

    import yaml

    from madsl.fit import fitted
    from madsl.lang.spec import spec_from_data

    search = load_search(Path(__file__).resolve().parents[1] / "specs" / "search" / "recall-hybrids.yaml")
    found = load_spec(
        Path(__file__).resolve().parents[1] / "specs" / "search" / "found" / "recall-hybrids-evidence-891fecbc.mad"
    )
    candidate = {
        "spec": dict(found.data),
        "tasks": {"in-context-recall": 0.99},
        "score": 0.99,
        "generation": 1,
        "name": "f",
    }
    text = spec_text(search, candidate)
    data = yaml.safe_load(text)
    assert data["budget"]["fit"] == ["Mb.d_state", "GDN.head_dim", "DN.head_dim"]  # the used symbols' only
    written = spec_from_data(data)
    assert fitted(written)[0].hash == found.hash
    (tmp_path / "front.mad").write_text(text)
    (tmp_path / "study.yaml").write_text(
        "name: f\ndata: bundled:tinyshakespeare\nseq_len: 64\narchitectures: {found: front.mad}\n"
        "budgets: [1e10]\nsizes: [{dim: 128}, {dim: 256}]\nrecipe: {batch_size: 8, eval_tokens: 1024}\n"
    )
    argv = ["scale", str(tmp_path / "study.yaml"), "--dry-run", "--db", str(tmp_path / "r.db"), "--rate", "1e9"]
    assert main([*argv, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["runs"]
    assert rows[0]["fitted"] == {"Mb.d_state": 3, "GDN.head_dim": 4, "DN.head_dim": 20}
    assert rows[1]["fitted"] != rows[0]["fitted"] and rows[1]["state"] <= 4096 + 32768
    assert main(argv) == 0
    assert "fitted: found d256x1: " in capsys.readouterr().out


def test_a_fill_gene_solves_the_free_parameters_toward_a_fraction_of_the_state_bound(tmp_path):
    """`space.fill`: each candidate's free parameters are solved toward its drawn fraction of the
    state bounds, so the candidates spread over the state axis instead of piling at the bound."""
    from madsl.search.config import FILL

    text = (Path(__file__).resolve().parents[1] / "specs" / "search" / "recall-hybrids.yaml").read_text()
    search = load_search(
        write(
            tmp_path,
            text.replace(
                "  shapes: [sequence, striped, motif]", "  shapes: [sequence, striped, motif]\n  fill: [0.25, 1.0]"
            ),
        )
    )
    assert FILL in {h.name for h in search.space.hyperparameters}
    builder = CandidateBuilder(search)
    rng = np.random.default_rng(0)
    states = {0.25: [], 1.0: []}
    for _ in range(60):
        genome = random_genome(search.space, rng)
        built = {f: builder.build(genome.with_params({**dict(genome.params), FILL: f})) for f in states}
        if all(isinstance(b, Candidate) for b in built.values()) and built[1.0].solved:
            for f, candidate in built.items():
                states[f].append(candidate.totals["fixed_state"])
                assert FILL not in str(candidate.spec_data.get("layers", {}))  # no layer's
    assert len(states[1.0]) >= 5
    assert all(s <= 4096 for s in states[1.0] + states[0.25])
    assert sum(s <= 1024 for s in states[0.25]) > sum(s <= 1024 for s in states[1.0])
    assert np.mean(states[0.25]) < 0.6 * np.mean(states[1.0])


@pytest.mark.parametrize(
    "fill, message",
    [
        ("[0, 0.5]", "expected a fraction above 0 and at most 1, got 0"),
        ("[0.5, 0.5]", "0.5 is given twice"),
        ("0.5", "expected a list of fractions"),
    ],
)
def test_a_bad_fill_is_a_located_error(tmp_path, fill, message):
    text = SMALL.replace(
        "  shapes: [sequence, motif, striped, parallel]",
        f"  shapes: [sequence, motif, striped, parallel]\n  fill: {fill}",
    )
    with pytest.raises(MadslError, match=message) as raised:
        load_search(write(tmp_path, text))
    assert raised.value.location.line == 10
