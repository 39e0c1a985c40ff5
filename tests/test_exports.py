"""Tables for analysis (`madsl report --rows runs|settings`) and the sweep figures
(`--plot-sweeps`), read back and checked against the results database they come from.

The database is made by the runner itself (stand-in model, toy tasks; tests/runner_helpers.py):
two specs, a task with a two-point difficulty sweep (seq_len 16, 24) and one without, two
weight decays, two seeds and two evaluation lengths.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from runner_helpers import TOY_TASKS, FakeSpec, run_toy_eval, standin_factory

from madsl.cli import main
from madsl.runner.api import evaluate
from madsl.runner.reports.outputs import report
from madsl.runner.reports.tables import RUN_COLUMNS, SETTING_COLUMNS

torch.set_num_threads(1)
SPECS = [FakeSpec("standin", "standin-v1"), FakeSpec("other", "standin-v2")]


@pytest.fixture(scope="module")
def sweep_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("exports") / "r.db"
    summary = evaluate(
        SPECS,
        tasks=["toy-previous", "toy-classify"],
        protocol="paper",
        conventions="madsl",
        db=db,
        lr=[3e-3],
        wd=[0.0, 0.1],
        seed=[0, 1],
        epochs=2,
        eval_lengths=(8, 32),
        model_factory=standin_factory,
        task_registry=TOY_TASKS,
    )
    assert summary["complete"] and summary["runs"] == 2 * 3 * 2 * 2
    return db


def _db_rows(db, query):
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(query)]


def _csv(text):
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    return header, [dict(zip(header, row)) for row in reader]


def test_runs_table_has_a_row_per_run_and_per_evaluated_length(sweep_db):
    runs = {r["run_id"]: r for r in _db_rows(sweep_db, "SELECT * FROM runs")}
    lengths = _db_rows(sweep_db, "SELECT * FROM length_evals")
    header, rows = _csv(report(sweep_db, fmt="csv", rows="runs"))
    knobs = sorted(f"setting.{k}" for k in TOY_TASKS["toy-previous"].baseline)
    assert header == [*RUN_COLUMNS, *knobs]  # fixed columns, then the knobs by name
    records = json.loads(report(sweep_db, fmt="json", rows="runs"))
    assert [list(r) for r in records] == [header] * len(records) and len(records) == len(rows)

    run_rows = [r for r in rows if r["row"] == "run"]
    assert sorted(r["run_id"] for r in run_rows) == sorted(runs)  # one row per run
    for row, record in zip(rows, records):
        assert row["run_id"] == record["run_id"] and row["row"] == record["row"]
    for row in run_rows:
        stored = runs[row["run_id"]]
        assert (row["spec"], row["task"], row["status"]) == (stored["spec_name"], stored["task"], "done")
        assert float(row["accuracy"]) == stored["best_eval_acc"]
        assert float(row["token_accuracy"]) == stored["best_eval_token_acc"]
        assert (float(row["lr"]), float(row["wd"]), int(row["seed"])) == (stored["lr"], stored["wd"], stored["seed"])
        assert row["protocols"] == "paper+custom" and row["conventions"] == "madsl"
        assert row["early_stopped"] == ("true" if stored["early_stopped"] else "false")
        assert row["diverged"] == "false" and row["length"] == "" and row["length_status"] == ""
        setting = json.loads(stored["setting"])
        assert {k: int(row[f"setting.{k}"]) for k in setting} == setting
    by_run = defaultdict(dict)
    for ev in lengths:
        by_run[ev["run_id"]][ev["length"]] = ev
    length_rows = [r for r in rows if r["row"] == "length"]
    assert len(length_rows) == len(lengths) == 2 * len(runs)
    for row in length_rows:
        ev = by_run[row["run_id"]][int(row["length"])]
        assert row["length_status"] == ev["status"] == "ok"
        assert float(row["accuracy"]) == ev["macro_acc"] and float(row["token_accuracy"]) == ev["acc"]
        assert row["setting.seq_len"] == str(json.loads(runs[row["run_id"]]["setting"])["seq_len"])  # as trained
    # in JSON the same values, typed: booleans are true / false, a missing value is null
    first = next(r for r in records if r["row"] == "run")
    assert isinstance(first["early_stopped"], bool) and first["length"] is None
    assert isinstance(first["setting.seq_len"], int)


def test_settings_table_scores_each_setting_as_the_leaderboard_does(sweep_db):
    runs = _db_rows(sweep_db, "SELECT * FROM runs")
    header, rows = _csv(report(sweep_db, fmt="csv", rows="settings"))
    assert header[: len(SETTING_COLUMNS)] == list(SETTING_COLUMNS)
    setting_rows = [r for r in rows if r["row"] == "setting"]
    assert len(setting_rows) == 2 * 3  # per spec: seq_len 16 and 24 of toy-previous, toy-classify's baseline
    for row in setting_rows:
        group = [
            r
            for r in runs
            if r["spec_name"] == row["spec"] and r["task"] == row["task"] and r["setting_hash"] == row["setting_hash"]
        ]
        best_per_seed = [max(r["best_eval_acc"] for r in group if r["seed"] == seed) for seed in (0, 1)]
        assert float(row["score"]) == pytest.approx(statistics.fmean(best_per_seed))
        assert (row["seeds"], row["runs_done"], row["runs_total"]) == ("2", "4", "4")
        best = next(r for r in group if r["run_id"] == row["best_run_id"])
        assert best["seed"] == 0 and best["best_eval_acc"] == best_per_seed[0]
        assert json.loads(best["setting"])["seq_len"] == int(row["setting.seq_len"])
        # the length rows are the best run's evaluations, right after the setting
        lengths = [r for r in rows if r["row"] == "length" and r["best_run_id"] == row["best_run_id"]]
        assert [int(r["length"]) for r in lengths] == [8, 32]
    # a task's leaderboard score is the mean of its setting scores
    leaderboard = json.loads(report(sweep_db, fmt="json"))
    for record in (r for r in leaderboard if not r["aggregate"]):
        scores = [float(r["score"]) for r in setting_rows if (r["spec"], r["task"]) == (record["spec"], record["task"])]
        assert record["score"] == pytest.approx(statistics.fmean(scores))
    assert {r["task"]: r for r in setting_rows}["toy-previous"]["setting.seq_len"] in {"16", "24"}


def test_the_leaderboard_csv_writes_booleans_as_true_and_false(sweep_db):
    _, rows = _csv(report(sweep_db, fmt="csv"))
    assert {r["aggregate"] for r in rows} == {"true", "false"}


def test_plot_sweeps_writes_a_figure_per_task_with_a_sweep(sweep_db, tmp_path, capsys):
    out = tmp_path / "figures" / "sweeps"  # folders that do not exist yet are made
    assert main(["report", "--db", str(sweep_db), "--plot-sweeps", str(out), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)  # the report itself still goes to stdout
    figure = out / "toy-previous.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {figure}" in captured.err
    assert "no sweep to plot for toy-classify" in captured.err
    assert sorted(p.name for p in out.iterdir()) == ["toy-previous.png"]  # no temporaries left


def test_a_sweep_panel_has_a_line_per_architecture_with_its_setting_scores(sweep_db):
    from madsl.runner.reports.outputs import display_names, load_runs
    from madsl.runner.reports.plots import sweep_series
    from madsl.runner.reports.tables import setting_rows

    stored = load_runs(sweep_db)
    table = [
        r
        for r in setting_rows(stored.rows, stored.labels, stored.length_evals)
        if r["row"] == "setting" and r["task"] == "toy-previous"
    ]
    names = display_names([(r["spec"], r["spec_hash"], r["protocol"], r["conventions"]) for r in table])
    series = dict(sweep_series(table, "seq_len", names))
    assert sorted(series) == ["other", "standin"]
    for name, points in series.items():
        expected = sorted((r["setting.seq_len"], r["score"]) for r in table if r["spec"] == name)
        assert points == expected and [x for x, _ in points] == [16, 24]
    assert sweep_series(table, "vocab_size", names) == []  # one value: no line


@pytest.mark.parametrize("kind", ["a file", "under a file", "unwritable"])
def test_plot_sweeps_into_a_place_that_is_not_a_writable_folder_is_bad_input(sweep_db, tmp_path, capsys, kind):
    if kind == "unwritable":
        if not Path("/proc/self").exists():
            pytest.skip("needs /proc, a place no one can create files in")
        out = Path("/proc/madsl-test-sweeps")
    else:
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" if kind == "a file" else tmp_path / "file" / "sweeps"
    assert main(["report", "--db", str(sweep_db), "--plot-sweeps", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "Traceback" not in err
    assert (tmp_path / "file").read_text() == "x" if kind != "unwritable" else True


def test_plot_sweeps_without_matplotlib_names_the_extra(sweep_db, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if madsl[plot] were not installed
    assert main(["report", "--db", str(sweep_db), "--plot-sweeps", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "madsl[plot]" in err and "Traceback" not in err and not (tmp_path / "out").exists()


def test_plot_sweeps_of_runs_at_one_setting_each_is_bad_input(tmp_path, capsys):
    db = tmp_path / "r.db"
    run_toy_eval(db, epochs=1)
    assert main(["report", "--db", str(db), "--plot-sweeps", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "nothing to plot" in err and "toy-previous" in err and not (tmp_path / "out").exists()


def test_rows_for_analysis_need_json_or_csv(sweep_db, capsys):
    assert main(["report", "--db", str(sweep_db), "--rows", "runs"]) == 2
    assert "--format json or csv" in capsys.readouterr().err


def test_a_figure_write_that_fails_is_bad_input_and_leaves_no_partial_file(sweep_db, tmp_path, capsys, monkeypatch):
    import errno

    from madsl import outputs

    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs.os, "replace", disk_full)
    out = tmp_path / "sweeps"
    assert main(["report", "--db", str(sweep_db), "--plot-sweeps", str(out)]) == 2
    assert main(["report", "--db", str(sweep_db), "--plot", str(tmp_path / "scores.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("No space left") == 2 and "Traceback" not in err
    assert list(out.iterdir()) == [] and [p.name for p in tmp_path.iterdir()] == ["sweeps"]  # no temporaries
