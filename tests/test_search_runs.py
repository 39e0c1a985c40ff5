"""Searches that train, through madsl.runner.api.evaluate: stand-in models on a toy task
(tests/runner_helpers.py) for what the results store must show (nothing over budget trained, no
identity trained twice, a kill -9 resumed to the uninterrupted search's front), and one tiny
search of real compiled models on in-context recall through the command line."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from runner_helpers import TOY_TASKS, StandInFactory, tiny_search

from madsl.cli import main
from madsl.graph import account
from madsl.lang.budget import check
from madsl.runner.config import EvalConfig
from madsl.search.loop import run_search
from madsl.search.reading import load_search
from madsl.search.record import front
from madsl.spec import load_spec, spec_from_data

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]

# 8 of the 12 architectures fit the budget: H:H, H:A, A:H and A:A have more than 30,000 parameters
TOY = """\
name: toy
dim: 32
budget: {params: <= 30000}
space: {sequence_mixers: [H, A, Mb], channel_mixers: [Sg], blocks: {min: 1, max: 2}}
objectives:
  score: {protocol: smoke, tasks: [toy-previous], epochs: 1}
  minimize: [params]
algorithm: {name: nsga2, population: 3, generations: GENERATIONS, offspring: OFFSPRING, seed: 3}
"""


@dataclass
class LoggedStandIn(StandInFactory):
    """A stand-in model whose width follows the candidate (so scores differ), that logs each model it
    builds to train (one line: the spec hash), and kills its process at build `kill_at`, once."""

    spec_hash: str = ""
    log: str = ""
    kill_at: int = 0

    def __call__(self, vocab_size, max_seq_len, num_classes=None, seed=0):
        log = Path(self.log)
        built = log.read_text().splitlines() if log.exists() else []
        marker = log.with_suffix(".killed")
        if self.kill_at and len(built) + 1 == self.kill_at and not marker.exists():
            marker.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        with log.open("a") as f:
            f.write(self.spec_hash + "\n")
        return super().__call__(vocab_size, max_seq_len, num_classes, seed)


def toy_search(
    folder: Path, generations: int, offspring: int, db: str, log: str, kill_at: int = 0, restart: bool = False
):
    path = folder / "toy.yaml"
    path.write_text(TOY.replace("GENERATIONS", str(generations)).replace("OFFSPRING", str(offspring)))

    def factory(spec):
        spec_hash = spec.hash
        return LoggedStandIn(dim=8 * (2 + int(spec_hash[:2], 16) % 3), spec_hash=spec_hash, log=log, kill_at=kill_at)

    search = load_search(path)
    return search, run_search(
        search, EvalConfig.from_keywords(db=db), model_factory=factory, task_registry=TOY_TASKS, restart=restart
    )


def built(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_nothing_over_budget_is_trained_and_no_identity_is_trained_twice(tmp_path):
    db, log = tmp_path / "r.db", tmp_path / "built.log"
    search, result = toy_search(tmp_path, 3, 3, str(db), str(log))
    counts = result.state.counts
    assert result.state.complete and counts["over_budget"] > 0 and counts["duplicates"] > 0
    assert len(built(log)) == len(set(built(log))) == len(result.state.candidates) == result.trained
    # the store: every spec it holds is a candidate of the search, and within the budget
    with sqlite3.connect(db) as conn:
        stored = [row[0] for row in conn.execute("SELECT spec_hash FROM specs")]
        runs = conn.execute("SELECT COUNT(*), SUM(attempts) FROM runs WHERE status = 'done'").fetchone()
    assert sorted(stored) == sorted(result.state.candidates) and runs == (len(stored), len(stored))
    for spec_hash in stored:
        spec = spec_from_data(result.state.candidates[spec_hash]["spec"])
        assert spec.hash == spec_hash
        assert not check(account(spec).totals, spec.budget)
    # the same search again, from the start, in the same store: every score comes from it, nothing trains
    _, again = toy_search(tmp_path, 3, 3, str(db), str(log), restart=True)
    assert again.trained == 0 and len(built(log)) == len(stored)

    def scores(r):
        return [c["score"] for c in r.state.candidates.values()]

    assert scores(again) == scores(result)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    whole = tmp_path_factory.mktemp("whole")
    return toy_search(whole, 2, 2, str(whole / "r.db"), str(whole / "built.log"))


# killed as it builds model 2 (inside the initial population) or 5 (the second child of generation 1,
# the first one finished and recorded in the store, the generation not yet)
@pytest.mark.parametrize("kill_at", [2, 5])
def test_a_search_killed_with_sigkill_resumes_to_the_uninterrupted_front_training_nothing_twice(
    kill_at, uninterrupted, tmp_path
):
    search, reference = uninterrupted
    killed = tmp_path
    code = (
        "import sys; sys.path[:0] = ['tests']; from pathlib import Path; import test_search_runs as t; "
        f"t.toy_search(Path({str(killed)!r}), 2, 2, {str(killed / 'r.db')!r}, {str(killed / 'built.log')!r}, "
        f"{kill_at})"
    )
    process = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert process.returncode == -signal.SIGKILL, process.stderr
    assert len(built(killed / "built.log")) == kill_at - 1 and (killed / "built.log").with_suffix(".killed").exists()
    _, resumed = toy_search(killed, 2, 2, str(killed / "r.db"), str(killed / "built.log"))
    assert resumed.state.complete and resumed.trained == len(reference.state.candidates) - (kill_at - 1)
    log = built(killed / "built.log")
    assert len(log) == len(set(log)) == len(reference.state.candidates)

    def lineage(r):
        return [
            (c["name"], c["generation"], c["parents"], c["operator"], c["score"]) for c in r.state.candidates.values()
        ]

    assert lineage(resumed) == lineage(reference)
    assert [c["name"] for c in front(search, resumed.state)] == [c["name"] for c in front(search, reference.state)]


TINY = tiny_search("{name: regularized-evolution, population: 1, generations: 1, offspring: 1, seed: 0}")


def test_a_tiny_search_of_compiled_models_through_the_command_line(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(textwrap.dedent(TINY))
    db, out = tmp_path / "r.db", tmp_path / "out"
    command = ["search", str(path), "--db", str(db), "--out", str(out), "--format", "json"]
    assert main(command + ["--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["plan"]["runs"] == 1 and plan["evaluations"] == 2 and not (tmp_path / "r.search-tiny.json").exists()
    assert main(command) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["complete"] and record["counts"]["runs_trained"] == 2 and len(record["lineage"]) == 2
    assert record["lineage"][0]["name"] == plan["batch"][0]["name"]
    assert {Path(p).name for p in record["written"]} >= {"front.png", "generations.png", "search.json"}
    best = [p for p in record["written"] if p.endswith(".mad")]
    assert len(best) == len(record["front"]) >= 1
    spec = load_spec(best[0])  # ready for madsl eval: the same model, within its budget
    assert spec.hash == record["front"][0]["spec_hash"] and main(["check", best[0], "-q"]) == 0
    capsys.readouterr()
    assert main(command) == 0  # a finished search: nothing more to train
    assert json.loads(capsys.readouterr().out)["counts"]["runs_trained"] == 0
