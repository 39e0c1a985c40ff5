"""`madsl search --calibrate` (madsl.search.calibration): the references and the initial population
scored by the search's own fitness, in the search's results database, so the search after it
trains none of them again; the `references:` key read against the space, every error located."""

from __future__ import annotations

import csv
import io
import json
import textwrap

import pytest
import torch
from runner_helpers import TOY_TASKS, StandInFactory, tiny_search

from madsl.cli import main
from madsl.errors import MadslError
from madsl.runner.config import EvalConfig
from madsl.search.calibration import CEILING, calibrate, members, table_csv
from madsl.search.loop import run_search
from madsl.search.reading import load_search

torch.set_num_threads(1)

TOY = """\
name: toy
dim: 32
budget: {params: <= 30000}
space: {sequence_mixers: [H, A, Mb], channel_mixers: [Sg], blocks: {min: 1, max: 2}}
objectives:
  score: {protocol: smoke, tasks: [toy-previous], epochs: 1}
  minimize: [params]
algorithm: {name: nsga2, population: 3, generations: 1, offspring: 2, seed: 3}
references:
  mamba: 2Mb
  hyena: H-Sg
  too-large: H:H
"""


def factory(spec):
    return StandInFactory(dim=8 * (2 + int(spec.hash[:2], 16) % 3))


def toy(tmp_path, text: str = TOY):
    path = tmp_path / "toy.yaml"
    path.write_text(textwrap.dedent(text))
    return load_search(path)


def test_references_and_the_initial_population_are_scored_and_the_search_reuses_them(tmp_path):
    search = toy(tmp_path)
    config = EvalConfig.from_keywords(db=str(tmp_path / "r.db"))
    table = calibrate(search, config, model_factory=factory, task_registry=TOY_TASKS)
    kinds = [(r["kind"], r["status"]) for r in table["rows"]]
    # H:H has more than 30,000 parameters: over the budget, shown, not trained
    assert (
        kinds
        == [("reference", "scored"), ("reference", "scored"), ("reference", "over budget")]
        + [("initial", "scored")] * 3
    )
    assert [r["topology"] for r in table["rows"][:3]] == ["2Mb", "H", "2H"]
    assert table["tasks"] == ["toy-previous"] and table["ceiling"] == CEILING
    scores = [r["score"] for r in table["rows"] if r["status"] == "scored"]
    assert all(0 <= s <= 1 for s in scores) and table["initial"]["scored"] == 3
    assert table["references"]["spread"] == pytest.approx(max(scores[:2]) - min(scores[:2]))
    assert table["initial"]["at_ceiling"] == sum(s >= CEILING for s in scores[2:])
    # the initial population is the search's own (the same seed): the search trains none of it again
    result = run_search(search, config, model_factory=factory, task_registry=TOY_TASKS)
    initial = [c for c in result.state.candidates.values() if c["generation"] == 0]
    assert {c["id"] for c in initial} == {r["spec_hash"] for r in table["rows"] if r["kind"] == "initial"}
    assert result.reused >= 3 and result.trained == len(result.state.candidates) - 3 - _known(table, result)
    assert {c["id"]: c["score"] for c in initial} == {
        r["spec_hash"]: r["score"] for r in table["rows"] if r["kind"] == "initial"
    }
    rows = list(csv.DictReader(io.StringIO(table_csv(table))))
    assert [r["name"] for r in rows] == [r["name"] for r in table["rows"]]
    assert float(rows[0]["score"]) == table["rows"][0]["score"] and rows[2]["score"] == ""
    assert rows[0]["toy-previous"] and int(rows[0]["params"]) == table["rows"][0]["totals"]["params"]


def _known(table, result) -> int:
    """Children of generation 1 that are references already scored (trained by the calibration)."""
    scored = {r["spec_hash"] for r in table["rows"] if r["kind"] == "reference" and r["status"] == "scored"}
    return sum(c["generation"] == 1 and c["id"] in scored for c in result.state.candidates.values())


def test_the_references_do_not_change_the_search(tmp_path):
    with_refs = toy(tmp_path)
    (tmp_path / "b").mkdir()
    without = toy(tmp_path / "b", TOY.split("references:")[0])
    assert with_refs.fingerprint() == without.fingerprint() and without.references == {}
    rows = members(without, EvalConfig.from_keywords(db=str(tmp_path / "r.db")))
    assert [r["kind"] for r in rows] == ["initial"] * 3


@pytest.mark.parametrize(
    "reference, message, column",
    [
        ("H:DN", "DN is not among its sequence_mixers (H, A, Mb)", 8),
        ("H-MoE", "MoE is not among the channel mixers of a H block", 8),
        ("(H:A)x2", "has 4 blocks", 8),
        ("H:(A", "the topology ends too early", 12),
        ('"[H | A]"', "a parallel block, and space.shapes does not list parallel", 8),
        ("A>H-Sg", "an injector (A>), which a search does not propose", 8),
    ],
)
def test_a_reference_outside_the_space_is_a_located_error(tmp_path, reference, message, column):
    with pytest.raises(MadslError) as err:
        toy(tmp_path, TOY.replace("too-large: H:H", f"bad: {reference}"))
    assert message in err.value.message
    assert (err.value.location.line, err.value.location.column) == (12, column)


def test_references_must_be_a_mapping_of_topologies(tmp_path):
    with pytest.raises(MadslError) as err:
        toy(tmp_path, TOY.replace("  too-large: H:H", "  bad: [H]"))
    assert "expected a topology string" in err.value.message and err.value.location.line == 12


def test_the_command_plans_and_writes_the_table(tmp_path, capsys):
    tiny = tiny_search("{name: random, population: 1, generations: 0, seed: 0}", "references: {attention: mA-Sg}\n")
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny)
    db, out = tmp_path / "r.db", tmp_path / "out"
    command = ["search", str(path), "--calibrate", "--db", str(db), "--out", str(out)]
    assert main(command + ["--dry-run", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [r["kind"] for r in plan["rows"]] == ["reference", "initial"] and plan["plan"]["runs"] >= 1
    assert not out.exists()
    assert main(command) == 0
    text = capsys.readouterr().out
    assert "calibration of search tiny" in text and "attention" in text and "at the ceiling" in text
    table = json.loads((out / "calibration.json").read_text())
    assert {r["status"] for r in table["rows"]} == {"scored"}
    assert (out / "calibration.csv").read_text().startswith("kind,name,topology,spec_hash,status,score,")


def test_an_interrupted_calibration_marks_its_unscored_rows_incomplete_and_resumes(tmp_path):
    search = toy(tmp_path)
    config = EvalConfig.from_keywords(db=str(tmp_path / "r.db"))
    stopped = calibrate(search, config, model_factory=factory, task_registry=TOY_TASKS, stop=lambda: True)
    assert stopped["interrupted"] and stopped["trained"] == 0
    assert {r["status"] for r in stopped["rows"] if r["kind"] == "initial"} == {"incomplete"}
    resumed = calibrate(search, config, model_factory=factory, task_registry=TOY_TASKS)
    assert not resumed["interrupted"] and resumed["initial"]["scored"] == 3
