"""`madsl eval` and `madsl report` end to end on a bundled spec: the real compiled model, the real task.

Tiny settings (one epoch of 32 sequences of length 32) keep it to a few seconds; what it
checks is the path every user takes — spec file -> CompiledSpecFactory -> training on
the MAD task -> results database -> report — not what the model learns.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import torch

from madsl.cli import main

torch.set_num_threads(1)
SPEC = Path(__file__).resolve().parent.parent / "specs" / "paper" / "hyena-sg.mad"
TINY = [
    "--task",
    "in-context-recall",
    "--protocol",
    "smoke",
    "--epochs",
    "1",
    "--set",
    "seq_len=32",
    "--set",
    "num_train_examples=32",
    "--set",
    "num_test_examples=16",
]


def test_madsl_eval_and_report_of_a_bundled_spec(tmp_path, capsys):
    db = tmp_path / "results.db"
    assert main(["eval", str(SPEC), *TINY, "--db", str(db), "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["complete"] and summary["done"] == 1 and not summary["failed"]
    [run_id] = summary["run_ids"]

    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        run = dict(conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone())
        epochs = conn.execute("SELECT * FROM epochs WHERE run_id = ?", (run_id,)).fetchall()
    assert run["status"] == "done" and run["spec_name"] == "hyena-sg" and run["task"] == "in-context-recall"
    setting = json.loads(run["setting"])
    assert setting["seq_len"] == 32 and setting["num_train_examples"] == 32
    assert run["epochs_done"] == len(epochs) == 1 and run["best_epoch"] == 1
    assert 0.0 <= run["best_eval_acc"] <= 1.0 and run["best_eval_loss"] > 0
    assert not list((tmp_path / "results.files" / "checkpoints").glob("*"))  # removed once recorded

    assert main(["report", "--db", str(db), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    task = next(r for r in records if r["spec"] == "hyena-sg" and r["task"] == "in-context-recall")
    assert task["score"] == run["best_eval_acc"]
    assert next(r for r in records if r["spec"] == "hyena-sg" and r["aggregate"])["score"] == task["score"]
    assert main(["report", "--db", str(db)]) == 0
    assert "hyena-sg" in capsys.readouterr().out

    # the same command again repeats nothing
    assert main(["eval", str(SPEC), *TINY, "--db", str(db), "--format", "json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["done"] == 0 and again["already_done"] == 1 and again["run_ids"] == [run_id]
