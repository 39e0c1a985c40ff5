"""scripts/chaos_resume.py's verdict can fail: its comparison of two results databases finds a
difference in any run or epoch metric, and none between a database and its copy."""

from __future__ import annotations

import importlib.util
import shutil
import sqlite3
from pathlib import Path

import pytest
from runner_helpers import run_toy_eval

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "chaos_resume.py"


@pytest.fixture(scope="module")
def chaos():
    spec = importlib.util.spec_from_file_location("chaos_resume", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("table,column", [("epochs", "eval_loss"), ("runs", "best_epoch"), ("runs", "status")])
def test_the_comparison_finds_a_changed_metric_and_nothing_in_a_copy(tmp_path, chaos, table, column):
    reference = tmp_path / "reference.db"
    run_toy_eval(reference, epochs=2, lr=[3e-3, 1e-2])
    copy = tmp_path / "copy.db"
    shutil.copy(reference, copy)
    assert chaos.differences(reference, copy) == []
    runs, epochs = chaos.results(reference)
    assert len(runs) == 2 and len(epochs) == 4  # there is something to compare
    with sqlite3.connect(copy) as connection:
        value = "'failed'" if column == "status" else f"{column} + 1"
        connection.execute(f"UPDATE {table} SET {column} = {value} WHERE rowid = (SELECT min(rowid) FROM {table})")
    [found] = chaos.differences(reference, copy)
    assert column in found
