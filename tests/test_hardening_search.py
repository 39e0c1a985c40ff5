"""`madsl search` on hostile input (issue 36): a search's name and a state's names never write
outside the folder given; the saved state is checked whole (types, ranges, sizes before anything
is built, every candidate's identity and accounting recomputed) and refused whole, located at the
state file; a dry run parses each candidate once; JSON holds no NaN; the command line's paths
and messages. Everything here runs with a stand-in evaluator or stops before anything trains."""

from __future__ import annotations

import copy
import json
import math
import os
from argparse import Namespace
from pathlib import Path

import pytest
from test_search import TopologyScore

import madsl.search.candidates as candidates_module
import madsl.search.loop as loop_module
from madsl.cli import main
from madsl.errors import MadslError
from madsl.search.config import Space
from madsl.search.evaluation import BatchOutcome
from madsl.search.loop import plan_search, run_search
from madsl.search.reading import load_search

# SMALL of tests/test_search.py on a task of the runner's registry, so the command line takes it
SEARCH = """\
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
  score: {protocol: smoke, tasks: [in-context-recall], set: {num_train_examples: 16, num_test_examples: 8}}
  minimize: [params]
algorithm: {name: nsga2, population: 4, generations: 3, offspring: 3, seed: 7}
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The search file, a complete state of it and one stopped in generation 1's evaluation."""
    folder = tmp_path_factory.mktemp("saved")
    path = folder / "search.yaml"
    path.write_text(SEARCH)
    search = load_search(path)
    run_search(search, state_path=folder / "complete.json", evaluator=TopologyScore())
    run_search(search, state_path=folder / "stopped.json", evaluator=TopologyScore(interrupt_at=2))
    return {
        "file": path,
        "search": search,
        "complete": json.loads((folder / "complete.json").read_text()),
        "stopped": json.loads((folder / "stopped.json").read_text()),
    }


def files_under(folder: Path) -> set[str]:
    return {str(p) for p in folder.rglob("*")}


# --- names that become file names ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name, message",
    [
        ("../../evil", "holds a path separator"),
        ("a/b", "holds a path separator"),
        ("smäll", "not safe in a file name"),
        (".small", "starts with '.'"),
        ("x" * 150, "longer than a search's name can be"),
        (None, "needs name:"),
    ],
)
def test_a_search_name_that_is_not_a_plain_file_name_is_refused_at_its_line(name, message, tmp_path, capsys):
    text = SEARCH.replace("name: small\n", "" if name is None else f"name: {json.dumps(name)}\n")
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    (work / "search.yaml").write_text(text)
    before = files_under(tmp_path)
    assert main(["search", str(work / "search.yaml"), "--db", str(work / "r.db"), "--out", str(work / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and f"{work / 'search.yaml'}:1:" in err and "Traceback" not in err
    assert files_under(tmp_path) == before  # nothing written, above --out or anywhere


def test_a_candidate_name_in_the_state_never_becomes_a_path(saved, tmp_path, capsys):
    data = copy.deepcopy(saved["complete"])
    best = max(data["candidates"].values(), key=lambda c: c["score"])
    best["name"] = best["spec"]["name"] = "../../evil"
    state = tmp_path / "a" / "b" / "s.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps(data))
    before = files_under(tmp_path)
    command = [
        "search",
        str(saved["file"]),
        "--db",
        str(state.parent / "r.db"),
        "--state",
        str(state),
        "--out",
        str(state.parent / "out"),
    ]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert f'candidates["{best["id"]}"].name' in err and f"--> {state}" in err and "restart" in err
    assert files_under(tmp_path) == before and not list(tmp_path.rglob("evil*"))


# --- the saved state: one check, whole ------------------------------------------------------------


def _first(data: dict) -> dict:
    return next(iter(data["candidates"].values()))


def _best(data: dict) -> dict:
    return max(data["candidates"].values(), key=lambda c: c["score"] or -1)


def _other_model(data: dict) -> None:
    """The best candidate's spec replaced by another candidate's model (its name kept): it would be
    reported, and written, with the score of a model it is not."""
    best = _best(data)
    other = next(c for c in data["candidates"].values() if c["id"] != best["id"])
    best["spec"] = {**copy.deepcopy(other["spec"]), "name": best["name"]}
    best["topology"] = other["topology"]


TAMPERED = {  # name: (the change, the field the error names)
    "generation -5": (lambda d: d.update(generation=-5), "generation"),
    "generation text": (lambda d: d.update(generation="1"), "generation"),
    "no counts": (lambda d: d.pop("counts"), "the file: lacks counts"),
    "counts negative": (lambda d: d["counts"].update(invalid=-1), "counts.invalid"),
    "counts not numbers": (lambda d: d["counts"].update(over_budget="a"), "counts.over_budget"),
    "generator state empty": (lambda d: d.update(rng={}), "rng"),
    "generator state too large": (lambda d: d["rng"]["state"].update(state=2**200), "rng.state.state"),
    "history entry junk": (lambda d: d["history"].__setitem__(0, 1), "history[0]"),
    "history entry lacks a field": (lambda d: d["history"][0].pop("best"), "history[0]: lacks best"),
    "candidate lacks a total": (lambda d: _first(d)["totals"].pop("params"), ".totals"),
    "totals edited": (lambda d: _best(d)["totals"].update(params=1), ".totals"),
    "score text": (lambda d: _best(d).update(score="x"), ".score"),
    "parents not a list": (lambda d: _first(d).update(parents=5), ".parents"),
    "parent unknown": (lambda d: _first(d).update(parents=["f" * 64]), ".parents[0]"),
    "status unknown": (lambda d: _first(d).update(status="weird"), ".status"),
    "operator unknown": (lambda d: _first(d).update(operator="rm -rf"), ".operator"),
    "id not its key": (lambda d: _first(d).update(id="0" * 64), ".id"),
    "spec of another model": (_other_model, ".spec: builds another model"),
    "spec does not compile": (
        lambda d: (_best(d)["spec"].update(topology="Hyena"), _best(d).update(topology="Hyena")),
        ".spec: does not build",
    ),
    "spec of another width": (lambda d: _best(d)["spec"].update(dim=4096), ".spec.dim"),
    "hyperparameter out of the space": (
        lambda d: _best(d)["spec"]["layers"]["A"].update(heads=32),
        ".spec.layers.A.heads",
    ),
    "member not a candidate": (lambda d: d["population"][0].update(id="e" * 64), "population[0].id"),
    "genome count 1e12": (lambda d: d["population"][0]["genome"].update(count=1e12), "population[0].genome.count"),
    "genome of another candidate": (
        lambda d: d["population"][0].update(
            genome=copy.deepcopy(
                next(m["genome"] for m in d["population"] if m["genome"] != d["population"][0]["genome"])
            )
        ),
        "population[0].genome",
    ),
    "more candidates than the search proposes": (
        lambda d: d["candidates"].update({"%064x" % i: {**_first(d), "id": "%064x" % i} for i in range(40)}),
        "candidates: holds",
    ),
    "a pending batch in a complete search": (lambda d: d.update(pending=d["population"]), "pending"),
    "unknown field": (lambda d: _first(d).update(extra=1), "unknown field 'extra'"),
}


@pytest.mark.parametrize("case", list(TAMPERED), ids=list(TAMPERED))
def test_a_tampered_state_is_refused_whole_located_at_the_state_file(case, saved, tmp_path):
    change, field = TAMPERED[case]
    data = copy.deepcopy(saved["complete"])
    change(data)
    path = tmp_path / "s.json"
    path.write_text(text := json.dumps(data))
    with pytest.raises(MadslError) as caught:
        run_search(saved["search"], state_path=path, evaluator=TopologyScore())
    err = caught.value
    assert field in err.message and err.location.file == str(path), err.render()
    assert "--restart" in err.hint and "Traceback" not in err.render()
    assert path.read_text() == text and list(tmp_path.iterdir()) == [path]  # left as it is, nothing written


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_state_holding_a_number_json_has_not_is_refused(constant, saved, tmp_path):
    best = _best(saved["complete"])
    path = tmp_path / "s.json"
    path.write_text(json.dumps(saved["complete"]).replace(json.dumps(best["score"]), constant, 1))
    with pytest.raises(MadslError, match="is not a JSON number") as caught:
        run_search(saved["search"], state_path=path, evaluator=TopologyScore())
    assert caught.value.location.file == str(path)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d["pending"][0]["genome"].update(count=1e12), "pending[0].genome.count"),
        (lambda d: d["pending"].pop(), "pending: holds 2 proposals"),
        (lambda d: d["pending"][0].update(duplicate="no"), "pending[0].duplicate"),
        (lambda d: d.update(generation=0), "history: holds 1 entries at generation 0"),
    ],
)
def test_a_stopped_state_is_checked_before_a_dry_run_uses_it(change, field, saved, tmp_path):
    data = copy.deepcopy(saved["stopped"])
    change(data)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MadslError) as caught:
        plan_search(saved["search"], state_path=path, evaluator=TopologyScore())
    assert field in caught.value.message and caught.value.location.file == str(path)


def test_a_state_is_checked_through_the_command_line_with_exit_2_and_nothing_written(saved, tmp_path, capsys):
    data = copy.deepcopy(saved["complete"])
    _other_model(data)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    before = files_under(tmp_path)
    assert (
        main(
            [
                "search",
                str(saved["file"]),
                "--db",
                str(tmp_path / "r.db"),
                "--state",
                str(path),
                "--out",
                str(tmp_path / "out"),
                "--format",
                "json",
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    assert "builds another model" in captured.err and f"--> {path}" in captured.err and captured.out == ""
    assert files_under(tmp_path) == before


def test_a_state_is_checked_once_per_candidate(saved, tmp_path, monkeypatch):
    """Every candidate loaded and accounted once (a 10,000-candidate state takes about 15 s of CPU)."""
    import madsl.search.state_check as state_check_module

    path = tmp_path / "s.json"
    path.write_text(json.dumps(saved["complete"]))
    counts = {"spec": 0, "account": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(state_check_module, "spec_from_data", counted("spec", state_check_module.spec_from_data))
    monkeypatch.setattr(state_check_module, "account", counted("account", state_check_module.account))
    state, specs = state_check_module.load_state(path, saved["search"])
    assert counts == {"spec": len(state.candidates), "account": len(state.candidates)} and set(specs) == set(
        state.candidates
    )


# --- bounded work: a dry run parses each candidate once -------------------------------------------


def test_a_dry_run_parses_each_candidate_once(saved, tmp_path, monkeypatch):
    parsed: list[str] = []

    def counting(original):
        def spec_from_data(data):
            parsed.append(data["topology"])
            return original(data)

        return spec_from_data

    monkeypatch.setattr(candidates_module, "spec_from_data", counting(candidates_module.spec_from_data))
    monkeypatch.setattr(loop_module, "spec_from_data", counting(loop_module.spec_from_data))
    plan = plan_search(saved["search"], state_path=tmp_path / "s.json", evaluator=TopologyScore())
    assert len(plan["batch"]) == 4 and len(parsed) == len(set(parsed))  # each genome drawn built once, none again


# --- messages and JSON ------------------------------------------------------------------------------


class NotANumber(TopologyScore):
    """Scores every candidate NaN (a diverged run), one task infinite."""

    def evaluate(self, specs) -> BatchOutcome:
        outcome = super().evaluate(specs)
        for result in outcome.results.values():
            result.update(score=math.nan, tasks={"toy-previous": math.inf})
        return outcome


def test_a_score_that_is_not_a_number_is_no_score_and_no_json_holds_nan(saved, tmp_path, capsys):
    from madsl.cli.search import _json, _print_result
    from madsl.search.record import record

    path = tmp_path / "s.json"
    result = run_search(saved["search"], state_path=path, evaluator=NotANumber())
    assert result.state.complete and all(c["status"] == "failed" for c in result.state.candidates.values())
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    run_search(saved["search"], state_path=path, evaluator=NotANumber())  # the saved state reads back
    assert "NaN" not in _json(record(result)) and "Infinity" not in _json(record(result))
    _print_result(Namespace(format="json", quiet=False), result, [])
    assert json.loads(capsys.readouterr().out)["complete"]


def test_an_interrupted_search_says_so_on_stderr_with_json_too(saved, tmp_path, capsys):
    from madsl.cli.search import _print_result

    result = run_search(saved["search"], state_path=tmp_path / "s.json", evaluator=TopologyScore(interrupt_at=1))
    assert result.interrupted
    _print_result(Namespace(format="json", quiet=False), result, [])
    captured = capsys.readouterr()
    assert json.loads(captured.out)["interrupted"] and "interrupted: rerun the same command" in captured.err


def test_a_candidate_too_large_to_train_is_located_at_the_space(tmp_path, capsys):
    """A hyperparameter value the layer takes but no machine trains (10^15 inner units): the runner's
    refusal, located where the space lets it in."""
    text = SEARCH.replace("params: <= 45000", "fixed_state: <= 100000000000000000").replace(
        "A.heads: [1, 2, 4]", "Sg.inner: [1000000000000000]"
    )
    path = tmp_path / "search.yaml"
    path.write_text(text)
    assert main(["search", str(path), "--db", str(tmp_path / "r.db"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "cannot be trained" in err and "Sg.inner=1000000000000000" in err and f"{path}:11:" in err
    assert "Traceback" not in err


# --- command-line paths -----------------------------------------------------------------------------


def test_state_and_out_paths_that_cannot_be_used_are_located_errors(saved, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder").mkdir()
    os.symlink(tmp_path / "afile", tmp_path / "link.json")
    cases = [
        (["--state", str(tmp_path / "folder")], "is a directory", "folder"),
        (["--state", str(tmp_path / "folder"), "--dry-run"], "is a folder", "folder"),
        (["--state", str(tmp_path / "link.json")], "symbolic link", "link.json"),
        (["--state", str(tmp_path / "link.json"), "--dry-run"], "symbolic link", "link.json"),
        (["--state", str(tmp_path / "afile" / "s.json")], "is not a directory", "afile/s.json"),
        (["--out", str(tmp_path / "afile")], "is not a directory", "afile"),
        (["--state", ""], "the path is empty", None),
    ]
    for extra, message, where in cases:
        before = files_under(tmp_path)
        assert main(["search", str(saved["file"]), "--db", str(tmp_path / "r.db"), *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (extra, err)
        assert where is None or f"--> {tmp_path / where}" in err, (extra, err)
        assert files_under(tmp_path) == before, extra


def test_space_holds_is_sizes_by_arithmetic():
    for low, high in [(1, 1), (1, 3), (2, 4), (3, 9), (5, 5), (1, 12)]:
        space = Space(("X",), ("Y",), (), low, high, (), False)
        for shape in ("sequence", "motif", "striped"):
            pairs = set(space.sizes(shape))
            assert {(n, c) for n in range(15) for c in range(15) if space.holds(shape, n, c)} == pairs


FILLED_SEARCH = """\
name: filled
dim: 32
seq_len: 64
budget:
  fixed_state: <= 2048
  fit: [Mb.d_state, H.filter_states]
space:
  sequence_mixers: [H, Mb]
  channel_mixers: [Sg]
  blocks: {min: 1, max: 2}
  fill: [0.25, 0.5, 1.0]
objectives:
  score: {protocol: smoke, tasks: [in-context-recall], set: {num_train_examples: 16, num_test_examples: 8}}
  minimize: [total_state]
algorithm: {name: nsga2, population: 4, generations: 2, offspring: 3, seed: 3}
"""


def test_a_search_with_fill_genes_resumes_and_a_fill_outside_the_space_is_refused(tmp_path):
    """The fill gene is no layer's setting: a complete state of a search with `space.fill` is read
    back (it was refused as 'not its candidate's', so such a search could never resume), while a
    member whose fill is not one of space.fill is refused at that gene."""
    path = tmp_path / "search.yaml"
    path.write_text(FILLED_SEARCH)
    search = load_search(path)
    first = run_search(search, state_path=tmp_path / "s.json", evaluator=TopologyScore())
    data = json.loads((tmp_path / "s.json").read_text())
    fills = [m["genome"]["params"].get("budget.fill") for m in data["population"]]
    assert first.state.complete and set(fills) <= {0.25, 0.5, 1.0} and None not in fills
    again = run_search(search, state_path=tmp_path / "s.json", evaluator=TopologyScore())
    assert again.state.candidates == first.state.candidates
    data["population"][0]["genome"]["params"]["budget.fill"] = 0.3
    (tmp_path / "t.json").write_text(json.dumps(data))
    with pytest.raises(MadslError) as caught:
        run_search(search, state_path=tmp_path / "t.json", evaluator=TopologyScore())
    assert 'population[0].genome.params["budget.fill"]' in caught.value.message
    assert "0.3 is not a value of space.fill" in caught.value.message
