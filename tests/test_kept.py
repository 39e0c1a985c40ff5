"""Kept models: `madsl eval --keep best`, `madsl export RUN_ID -o DIR`, `madsl.load_run(DIR)`.

The loaded model must be the run's best epoch: evaluated on the run's test split the way
training evaluates, it gives the accuracy the store recorded for that epoch."""

from __future__ import annotations

import json
import pickle
import sqlite3
import sys
from pathlib import Path

import pytest
import torch

import madsl
from madsl.cli import main
from madsl.runner.execute.jobs import load_split
from madsl.runner.train.metrics import EVAL_BATCH, evaluate
from madsl.runner.train.state import to_tensor
from madsl.tasks import get_task

torch.set_num_threads(1)
SPEC = Path(__file__).resolve().parent.parent / "specs" / "paper" / "hyena-sg.mad"
TINY = [
    "--task",
    "in-context-recall",
    "--protocol",
    "smoke",
    "--epochs",
    "2",
    "--batch-size",
    "8",
    "--set",
    "seq_len=32",
    "--set",
    "num_train_examples=32",
    "--set",
    "num_test_examples=16",
]


def test_keep_best_export_and_load_give_the_recorded_accuracy(tmp_path, capsys):
    db = tmp_path / "results.db"
    assert main(["eval", str(SPEC), *TINY, "--db", str(db), "--keep", "best", "--format", "json"]) == 0
    [run_id] = json.loads(capsys.readouterr().out)["run_ids"]
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        run = dict(conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone())

    out = tmp_path / "best-hyena"
    assert main(["export", run_id[:12], "-o", str(out), "--db", str(db)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    model = madsl.load_run(out)
    config = model.config
    assert config["run_id"] == run_id and config["best_epoch"] == run["best_epoch"]

    task = get_task(config["task"])
    test = load_split(task, config["setting"], "test", 0, str(tmp_path / "results.files" / "data"))
    x, y = to_tensor(test.inputs, torch.device("cpu")), to_tensor(test.targets, torch.device("cpu"))
    metrics = evaluate(model, x, y, max(8, EVAL_BATCH), config["build"]["num_classes"])
    assert metrics["macro_acc"] == pytest.approx(run["best_eval_acc"], abs=1e-9)
    assert metrics["loss"] == pytest.approx(config["metrics"]["eval_loss"], rel=1e-5)


def test_keep_best_without_safetensors_is_refused_before_anything_trains(tmp_path, capsys, monkeypatch):
    """Without safetensors (an install without the torch extra's full list) --keep best used to
    train every run and then end in a traceback when the first was to be kept."""
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    db = tmp_path / "results.db"
    assert main(["eval", str(SPEC), *TINY, "--db", str(db), "--keep", "best"]) == 2
    err = capsys.readouterr().err
    assert "--keep best needs safetensors" in err and "pip install safetensors" in err and "Traceback" not in err
    assert not db.exists()  # refused before the database was created, so before any run


def test_export_errors_are_bad_input(tmp_path, capsys):
    db = tmp_path / "results.db"
    assert main(["export", "abc", "-o", str(tmp_path / "out"), "--db", str(db)]) == 2
    assert "no results database at" in capsys.readouterr().err  # not 'no kept model': --db is mistyped
    db.touch()
    assert main(["export", "abcd", "-o", str(tmp_path / "out"), "--db", str(db)]) == 2
    assert "no kept model" in capsys.readouterr().err


def test_loading_never_unpickles(tmp_path):
    """A folder with a pickle where the weights should be is refused, and the pickle never runs."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    folder = tmp_path / "planted"
    folder.mkdir()
    build = {
        "vocab_size": 8,
        "max_seq_len": 16,
        "num_classes": 8,
        "backbone_num_classes": None,
        "head": "lm",
        "input_dim": 0,
        "target_len": None,
        "compression_position": -1,
        "conventions": "madsl",
    }
    spec = madsl.spec_from_topology("Mb", dim=16).data
    (folder / "config.json").write_text(json.dumps({"format": "madsl-run-model/1", "spec": spec, "build": build}))
    (folder / "model.safetensors").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(madsl.MadslError, match="not a safetensors file"):
        madsl.load_run(folder)
    assert not marker.exists()
    with pytest.raises(madsl.MadslError, match="not an exported madsl model"):
        madsl.load_run(tmp_path)


def test_best_weights_kept_only_for_the_best_epoch_when_keep_best_changes_between_resumes():
    # started with --keep best, resumed without it (a better epoch comes, unkept), resumed with it
    # again: the checkpoint must not offer the first best epoch's weights as the later one's
    from runner_helpers import StandInModel

    from madsl.runner.plan.runs import TrainSettings
    from madsl.runner.train.heads import TaskModel
    from madsl.runner.train.metrics import EpochMetrics
    from madsl.runner.train.state import RunState

    settings = TrainSettings(lr=1e-3, wd=0.0, epochs=5, batch_size=8, seed=0, min_lr=1e-6, early_stop_acc=0.999)
    state = RunState.start(settings, lambda: TaskModel(StandInModel(8, 16), "lm"), torch.device("cpu"), 16, 8)

    def epoch(n: int, eval_loss: float) -> EpochMetrics:
        return EpochMetrics(
            epoch=n,
            lr=1e-3,
            seconds=0.0,
            train_loss=1.0,
            train_ppl=None,
            train_acc=None,
            train_macro_acc=None,
            eval_loss=eval_loss,
            eval_ppl=None,
            eval_acc=0.5,
            eval_macro_acc=0.5,
        )

    state.keep_best = True
    state.end_epoch(epoch(1, 1.0))
    assert state.best_state is not None
    state.keep_best = False
    state.end_epoch(epoch(2, 0.5))  # the new best: its weights are not kept
    state.keep_best = True
    state.end_epoch(epoch(3, 0.9))
    assert state.best.epoch == 2 and state.best_state is None


def test_exported_weights_are_readable_as_the_config_is(tmp_path, capsys):
    """safetensors writes its file owner-only; an exported model's two files share one mode."""
    import os

    db = tmp_path / "results.db"
    assert main(["eval", str(SPEC), *TINY, "--db", str(db), "--keep", "best", "--format", "json"]) == 0
    [run_id] = json.loads(capsys.readouterr().out)["run_ids"]
    previous = os.umask(0o022)
    try:
        assert main(["export", run_id, "-o", str(tmp_path / "out"), "--db", str(db)]) == 0
    finally:
        os.umask(previous)
    assert {(p.name, p.stat().st_mode & 0o777) for p in (tmp_path / "out").iterdir()} == {
        ("config.json", 0o644),
        ("model.safetensors", 0o644),
    }
