"""Threads that fit the cores: one rule for the torch threads of a run (madsl.runner.execute.threads),
set by the executors, costed by the plans, recorded with each run, and a warning where runs
oversubscribe the cores."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from madsl.cli import main
from madsl.runner.execute import threads
from madsl.runner.execute.local import ProcessExecutor, ThreadExecutor, make_executor

STUDY = """\
name: t
data: bundled:tinyshakespeare
seq_len: 32
architectures:
  hyena: bundled:paper/hyena-sg
budgets: [1e9]
sizes: [{dim: 16}]
recipe: {batch_size: 8, eval_tokens: 1024, eval_every: 20}
"""


@pytest.mark.parametrize(
    "workers, requested, available, expected",
    [
        (1, None, 2, 1),  # one worker on 2 cores: 1 thread (measured: benchmarks/threads.py)
        (2, None, 2, 1),
        (3, None, 2, 1),  # more workers than cores: still one thread each (and a warning)
        (1, None, 64, threads.DEFAULT_MAX_THREADS),
        (1, 2, 2, 2),  # asked for: as asked
        (4, 3, 2, 3),
    ],
)
def test_a_runs_threads_follow_from_the_cores_and_the_workers(workers, requested, available, expected):
    assert threads.run_threads(workers, requested, available) == expected


def test_the_executors_set_the_rules_threads():
    one = make_executor(1)
    assert isinstance(one, ThreadExecutor) and one.threads == threads.run_threads(1)
    assert make_executor(1, 2).threads == 2
    pool = ProcessExecutor(2, 3)
    try:
        assert pool.threads_per_worker == 3
    finally:
        pool.close()


def test_oversubscribing_the_cores_is_warned_of():
    assert threads.oversubscribed(1, 1, available=2, load=0.1) is None
    assert threads.oversubscribed(2, 1, available=2, load=None) is None
    too_many = threads.oversubscribed(2, 2, available=2)
    assert too_many.startswith("2 worker(s) x 2 torch thread(s) = 4 threads on 2 core(s)")
    busy = threads.oversubscribed(1, 1, available=2, load=3.2)
    assert busy.startswith("the machine is busy (load 3.2 on 2 core(s)) and the runs add 1 thread(s)")


def test_a_bad_thread_count_is_a_located_error(tmp_path, capsys):
    study = tmp_path / "s.yaml"
    study.write_text(STUDY)
    with pytest.raises(SystemExit) as stopped:
        main(["scale", str(study), "--threads", "0", "--dry-run", "--db", str(tmp_path / "r.db")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --threads: expected a positive integer, got 0" in err and "Traceback" not in err
    from madsl.errors import MadslError
    from madsl.runner.api import evaluate

    with pytest.raises(MadslError, match="threads"):
        evaluate(["specs/paper/hyena-sg.mad"], threads=0, dry_run=True, db=tmp_path / "e.db")


def test_a_run_trains_on_the_threads_asked_for_and_records_them(tmp_path, capsys, monkeypatch):
    """The plan is costed at the runs' threads, the run trains on them (the database records it),
    and asking for more threads than cores is warned of before the runs start."""
    from runner_helpers import stand_in_rates

    stand_in_rates(monkeypatch, tmp_path / "cache")
    monkeypatch.setattr(threads, "cores", lambda: 1)
    study = tmp_path / "s.yaml"
    study.write_text(STUDY)
    db = str(tmp_path / "r.db")
    assert main(["scale", str(study), "--db", db, "--dry-run", "--threads", "2", "--format", "json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["threads"] == 2
    assert main(["scale", str(study), "--db", db, "--threads", "2"]) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "warning: 1 worker(s) x 2 torch thread(s) = 2 threads on 1 core(s)" in out
    (recorded,) = sqlite3.connect(db).execute("SELECT threads FROM runs").fetchall()
    assert recorded == (2,)


def test_the_default_is_the_measured_one(tmp_path, capsys):
    """Without --threads, one worker trains on run_threads(1) threads whatever this process has."""
    study = tmp_path / "s.yaml"
    study.write_text(STUDY)
    db = str(tmp_path / "r.db")
    assert main(["scale", str(study), "--db", db, "-q"]) == 0
    (recorded,) = sqlite3.connect(db).execute("SELECT threads FROM runs").fetchall()
    assert recorded == (threads.run_threads(1),)
    assert os.cpu_count() >= 1
