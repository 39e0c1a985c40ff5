"""Checkpoints are data: a file beside a results database never runs code, and a failed write leaves nothing."""

from __future__ import annotations

import errno
import io
import pickle
import random
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch
from runner_helpers import TOY_TASKS, StandInModel, run_rows, run_toy_eval

from madsl.errors import MadslError
from madsl.runner.execute.coordinator import Reporter
from madsl.runner.plan.runs import TrainSettings
from madsl.runner.store.results import Store
from madsl.runner.train import checkpoint as checkpoints
from madsl.runner.train import state as run_state
from madsl.runner.train.checkpoint import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from madsl.runner.train.heads import TaskModel
from madsl.runner.train.loop import TrainHooks, train_run

torch.set_num_threads(1)


class Planted:
    """A pickle that, if ever unpickled by a full unpickler, creates `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# the run _pending_run stops: a learning rate too small to reach the early stop, and epochs enough
# that the stop, asked at the first epoch's event, arrives long before the run could end on a loaded
# machine (a toy epoch takes milliseconds; at the default rate it early-stops at epoch ~36)
PENDING = {"epochs": 600, "lr": 1e-9}


def _pending_run(db):
    """A run stopped after its first epoch: pending, with a checkpoint the next eval resumes from."""

    class StopAfterOneEpoch(Reporter):
        stop = False

        def epoch(self, job, metrics):
            self.stop = True

    reporter = StopAfterOneEpoch()
    run_toy_eval(db, **PENDING, reporter=reporter, stop=lambda: reporter.stop)
    run = run_rows(db)[0]
    assert run["status"] == "pending"
    path = Store(db).checkpoint_path(run["run_id"])
    assert load_checkpoint(path)["epoch"] >= 1
    return path


@pytest.mark.parametrize("wrapping", ["pickle", "torch.save"])
def test_a_planted_pickle_at_a_pending_runs_checkpoint_never_runs(tmp_path, wrapping):
    db = tmp_path / "r.db"
    path = _pending_run(db)
    marker = tmp_path / "pwned"
    planted = {"format": checkpoints.FORMAT, "version": checkpoints.VERSION, "model": Planted(marker)}
    if wrapping == "pickle":
        path.write_bytes(pickle.dumps(planted))
    else:
        torch.save(planted, path)
    content = path.read_bytes()

    summary = run_toy_eval(db, **PENDING)
    assert not marker.exists()
    assert len(summary["failed"]) == 1 and not summary["complete"]
    run = run_rows(db)[0]
    assert run["status"] == "failed" and str(path) in run["error"] and "not loaded" in run["error"]
    assert path.read_bytes() == content  # left for its owner to look at, not deleted behind their back

    path.unlink()  # as the error says: delete it and the run starts over
    assert run_toy_eval(db, **PENDING)["done"] == 1 and not marker.exists()
    assert run_rows(db)[0]["status"] == "done"


def _real_checkpoint_bytes(tmp_path) -> bytes:
    path = tmp_path / "real.pt"
    save_checkpoint(path, {"epoch": 1, "weights": torch.randn(64, 64)})
    return path.read_bytes()


NOT_CHECKPOINTS = {
    "garbage bytes": lambda tmp: bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)),
    "empty": lambda tmp: b"",
    "truncated": lambda tmp: _real_checkpoint_bytes(tmp)[:3000],
    "text": lambda tmp: b"epoch: 3\n",
    "torch file without the tag": lambda tmp: _torch_bytes({"model": {"w": torch.ones(2)}, "epoch": 1}),
    "format 1": lambda tmp: _torch_bytes({"version": 1, "epoch": 1}),
    "newer format": lambda tmp: _torch_bytes({"format": checkpoints.FORMAT, "version": 99}),
    "a tensor": lambda tmp: _torch_bytes(torch.ones(3)),
}


def _torch_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("kind", sorted(NOT_CHECKPOINTS))
def test_a_file_that_is_not_a_checkpoint_is_an_error_naming_it(tmp_path, kind):
    path = tmp_path / "run.pt"
    path.write_bytes(NOT_CHECKPOINTS[kind](tmp_path))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and "delete it" in str(err.value)
    assert "weights_only=False" not in str(err.value)  # never advise the unsafe way out
    (tmp_path / "dir.pt").mkdir()
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "dir.pt")
    assert load_checkpoint(tmp_path / "missing.pt") is None


def _toy_run(checkpoint, epochs=2, lr=3e-3, run_id=None):
    task = TOY_TASKS["toy-previous"]
    settings = dict(task.baseline)
    train, test = task.generate(settings, "train", 0), task.generate(settings, "test", 0)
    cfg = TrainSettings(lr=lr, wd=0.0, epochs=epochs, batch_size=32, seed=0, min_lr=1e-6, early_stop_acc=0.999)
    return cfg, lambda: train_run(
        cfg,
        lambda: TaskModel(StandInModel(8, 16), "lm"),
        train,
        test,
        num_classes=8,
        checkpoint_path=checkpoint,
        run_id=run_id,
    )


def test_a_tagged_checkpoint_of_another_run_or_with_missing_state_is_refused(tmp_path):
    path = tmp_path / "run.pt"
    cfg, run = _toy_run(path, lr=1e-3)
    other, _ = _toy_run(path, lr=3e-3)
    save_checkpoint(path, {"settings": asdict(other), "epoch": 1})
    with pytest.raises(CheckpointError, match="belongs to another run"):
        run()
    save_checkpoint(path, {"settings": asdict(cfg), "epoch": 1, "result": None})  # the model is missing
    with pytest.raises(CheckpointError, match="does not hold this run's state"):
        run()


def test_a_finished_checkpoint_of_another_run_id_with_the_same_settings_is_refused(tmp_path):
    """Two specs trained with the same settings at one checkpoint path (found in the cost
    benchmark): the second must not take the first's result as its own."""
    path = tmp_path / "run.pt"
    first = _toy_run(path, epochs=1, run_id="spec-a")[1]()
    assert load_checkpoint(path)["run_id"] == "spec-a"
    assert _toy_run(path, epochs=1, run_id="spec-a")[1]().to_dict() == first.to_dict()  # its own: resumed
    with pytest.raises(CheckpointError, match="belongs to another run"):
        _toy_run(path, epochs=1, run_id="spec-b")[1]()


def test_rng_states_round_trip_through_a_data_only_file(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.standard_normal()  # leaves numpy a cached gaussian
    save_checkpoint(tmp_path / "rng.pt", {"rng": rng_state()})
    expected = (torch.rand(3), np.random.standard_normal(3), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    set_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    drawn = (torch.rand(3), np.random.standard_normal(3), random.random())
    assert torch.equal(drawn[0], expected[0]) and np.array_equal(drawn[1], expected[1]) and drawn[2] == expected[2]


@pytest.mark.parametrize("fail_in", ["write", "fsync", "rename"])
def test_a_failed_checkpoint_write_leaves_no_partial_file(tmp_path, monkeypatch, fail_in):
    path = tmp_path / "checkpoints" / "run.pt"
    save_checkpoint(path, {"epoch": 1})
    disk_full = OSError(errno.ENOSPC, "No space left on device")

    def partial_save(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise disk_full

    def fail(*args, **kwargs):
        raise disk_full

    target = {
        "write": (checkpoints.torch, "save", partial_save),
        "fsync": (checkpoints.os, "fsync", fail),
        "rename": (checkpoints.os, "replace", fail),
    }[fail_in]
    monkeypatch.setattr(*target)
    with pytest.raises(CheckpointError, match="could not be written: no space left on device") as err:
        save_checkpoint(path, {"epoch": 2})
    assert str(path) in str(err.value)
    monkeypatch.undo()
    assert [p.name for p in path.parent.iterdir()] == ["run.pt"]
    assert load_checkpoint(path)["epoch"] == 1  # the previous checkpoint, whole


def test_temporaries_of_a_writer_killed_mid_write_are_removed_by_the_next_save(tmp_path):
    path = tmp_path / "run.pt"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()  # a pid that has exited
    stale = path.with_name(f".run.pt.{checkpoints._HOST}.{dead}.tmp")
    other_host = path.with_name(f".run.pt.elsewhere.{dead}.tmp")  # another machine's: not ours to judge
    stale.write_bytes(b"PK half a checkpoint")
    other_host.write_bytes(b"PK half a checkpoint")
    save_checkpoint(path, {"epoch": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["run.pt", other_host.name])


@pytest.mark.parametrize("every_s, saved_epochs", [(0.0, [1, 2, 3, 3]), (3600.0, [3])])
def test_a_run_checkpoints_at_an_epochs_end_only_when_one_is_due(tmp_path, monkeypatch, every_s, saved_epochs):
    """Every `checkpoint_every_s` (0: every epoch), and always at the end, with the result."""
    saved = []
    monkeypatch.setattr(run_state, "save_checkpoint", lambda path, data: saved.append((data["epoch"], data["result"])))
    task = TOY_TASKS["toy-previous"]
    settings = dict(task.baseline)
    train, test = task.generate(settings, "train", 0), task.generate(settings, "test", 0)
    cfg = TrainSettings(lr=3e-3, wd=0.0, epochs=3, batch_size=32, seed=0, min_lr=1e-6, early_stop_acc=1.0)
    result = train_run(
        cfg,
        lambda: TaskModel(StandInModel(8, 16), "lm"),
        train,
        test,
        num_classes=8,
        checkpoint_path=tmp_path / "run.pt",
        hooks=TrainHooks(checkpoint_every_s=every_s),
    )
    assert [epoch for epoch, _ in saved] == saved_epochs
    assert saved[-1][1] is not None and all(r is None for _, r in saved[:-1])  # the last holds the result
    assert len(result.history) == 3


def test_checkpoint_every_is_passed_to_the_runs_and_checked(tmp_path, monkeypatch):
    saved = []
    original = run_state.save_checkpoint
    monkeypatch.setattr(
        run_state, "save_checkpoint", lambda path, data: saved.append(data["epoch"]) or original(path, data)
    )
    run_toy_eval(tmp_path / "every.db", epochs=3, checkpoint_every=0)
    assert saved == [1, 2, 3, 3]
    saved.clear()
    run_toy_eval(tmp_path / "default.db", epochs=3)  # a minute: only the last
    assert saved == [3]
    for bad in (-1.0, float("nan"), float("inf"), "60"):
        with pytest.raises(MadslError, match="checkpoint_every: expected a (non-negative|finite)? ?number"):
            run_toy_eval(tmp_path / "bad.db", epochs=1, checkpoint_every=bad)
    assert not (tmp_path / "bad.db").exists()
