"""One way to run jobs (madsl.runner.launch.run): any Job (here the least one: it reports and ends)
goes through the same database check, placement, store, registration, coordinator and error
mapping as `madsl eval`'s and `madsl scale`'s; one precision rule for both."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import pytest

import madsl.runner
from madsl.errors import MadslError
from madsl.runner import launch
from madsl.runner.execute.jobs import Event
from madsl.runner.execute.options import Execution
from madsl.runner.store.results import RunIdentity, Store


@dataclass
class EchoJob:
    """A Job that trains nothing: it starts, then fails with a known error."""

    run_id: str
    label: str = "echo"
    device: str = "cpu"
    checkpoint_path: str = ""
    keep_best: bool = False
    checkpoint_every_s: float | None = None

    def execute(self, emit, should_stop) -> None:
        emit(Event("started", self.run_id, {}))
        emit(Event("failed", self.run_id, {"error": "echoed", "traceback": ""}))


def identity(seed: int) -> RunIdentity:
    return RunIdentity("s" * 64, "echo", {}, {"lr": 1.0, "wd": 0.0, "epochs": 1, "batch_size": 1, "seed": seed}, "v")


def register(identities):
    def write(store: Store) -> None:
        store.add_spec("s" * 64, "echo", "{}", None)
        store.add_runs([(i, "echo") for i in identities], "echo")

    return write


def test_any_job_runs_through_the_store_and_the_coordinator(tmp_path):
    db = tmp_path / "r.db"
    identities = [identity(0), identity(1)]
    execution = Execution(db=str(db), device="cpu")
    outcome = madsl.runner.run([EchoJob(i.run_id) for i in identities], execution, register=register(identities))
    assert outcome.failed == {i.run_id: "echoed" for i in identities} and not outcome.complete
    store = Store(db, create=False)
    try:
        assert [store.run(i.run_id)["status"] for i in identities] == ["failed", "failed"]
    finally:
        store.close()


def test_a_database_that_cannot_be_written_is_a_clear_error(tmp_path):
    def full(store):
        raise sqlite3.OperationalError("database or disk is full")

    with pytest.raises(MadslError, match="could not be written: database or disk is full") as info:
        launch.run([], Execution(db=str(tmp_path / "r.db"), device="cpu"), register=full)
    assert "rerun the same command" in info.value.render()


def test_bad_execution_options_are_refused_before_a_store_exists(tmp_path):
    db = tmp_path / "r.db"
    with pytest.raises(MadslError, match="must be at least 1, got 0"):
        launch.run([], Execution(db=str(db), workers=0))
    with pytest.raises(MadslError, match="expected a non-negative number of seconds"):
        launch.place(Execution(db=str(db), checkpoint_every=-1), stacked=False)
    assert not db.exists()


def test_one_precision_rule():
    where = launch.place(Execution(device="cpu"), stacked=False)
    assert where.runs_on == "cpu" and not where.batch_grid and where.devices is None
    assert [launch.run_precision(name, where) for name in ("fp32", "bf16", "auto")] == ["fp32", "bf16", "fp32"]
    with pytest.raises(MadslError, match="unknown precision 'fp16'"):
        launch.run_precision("fp16", where)
