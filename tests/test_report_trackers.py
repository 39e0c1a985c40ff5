"""`madsl report --export tensorboard|mlflow DIR` and `--track KIND:DIR` (madsl/report/): the runs,
studies and searches of a small database read back with each tracker's own reader, a second
export writing nothing, the live reporter giving a run the record the export gives it, and bad
input refused before anything is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from report_helpers import make_database

from madsl.cli import main


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return make_database(tmp_path_factory.mktemp("report") / "r.db")


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        rc = main(list(args))
    except SystemExit as stop:
        rc = stop.code
    out, err = capsys.readouterr()
    return rc, out, err


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tensorboard_export_is_read_by_tensorboard_and_idempotent(db, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    out = tmp_path / "tb"
    rc, _, err = run(capsys, "report", "--db", str(db), "--export", "tensorboard", str(out))
    assert rc == 0, err
    assert "0 already there" in err
    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(out))
    mux.Reload()
    runs = mux.Runs()
    mad = [r for r in runs if r.startswith("mad/")]
    assert len(mad) == 54  # 3 specs x (6 tasks + 3 more settings) x 2 lr
    assert len([r for r in runs if r.startswith("study/tiny/")]) == 12
    assert "search/demo" in runs and any(r.startswith("leaderboard/") for r in runs)
    name = next(r for r in mad if r.startswith("mad/mamba/in-context-recall/lr=0.001,wd=0,seed=0,"))
    tags = runs[name]
    assert {"eval/loss", "eval/acc", "train/loss", "final/acc"} <= set(tags["scalars"])
    assert [e.step for e in mux.Scalars(name, "eval/loss")] == [1, 2, 3]
    assert "config" in tags["tensors"]
    study = next(r for r in runs if r.startswith("study/tiny/hyena/"))
    steps = [e.step for e in mux.Scalars(study, "eval/loss")]
    assert steps == sorted(steps) and len(steps) == 4  # a pretraining run: evaluations at optimizer steps
    assert [e.step for e in mux.Scalars("search/demo", "search/best")] == [0, 1, 2]
    before = tree(out)
    rc, _, err = run(capsys, "report", "--db", str(db), "--export", "tensorboard", str(out))
    assert rc == 0 and " 0 records written" in err.replace(":", " ")
    assert tree(out) == before  # nothing new, nothing rewritten


def test_mlflow_export_lists_runs_with_params_and_metrics_and_is_idempotent(db, tmp_path, capsys):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    out = tmp_path / "ml"
    rc, _, err = run(capsys, "report", "--db", str(db), "--export", "mlflow", str(out))
    assert rc == 0, err
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    mad = client.get_experiment_by_name("madsl-mad")
    runs = client.search_runs([mad.experiment_id], max_results=1000)
    assert len(runs) == 54
    one = next(r for r in runs if r.data.tags["spec"] == "hyena" and r.data.tags["task"] == "compression")
    assert one.data.tags["protocol"] == "quick" and one.data.tags["search"] == "demo"
    assert one.info.run_name.startswith("mad/hyena/compression/lr=")
    assert one.data.params["lr"] in ("0.001", "0.0005") and "setting.vocab_size" in one.data.params
    assert {"final/acc", "eval/loss"} <= set(one.data.metrics)
    assert [m.step for m in client.get_metric_history(one.info.run_id, "eval/loss")] == [1, 2, 3]
    study = client.get_experiment_by_name("madsl-study")
    assert len(client.search_runs([study.experiment_id], filter_string="tags.study = 'tiny'")) == 12
    assert client.get_experiment_by_name("madsl-search") is not None
    rc, _, err = run(capsys, "report", "--db", str(db), "--export", "mlflow", str(out))
    assert rc == 0 and "0 records written" in err
    assert len(client.search_runs([mad.experiment_id], max_results=1000)) == 54


def test_live_reporter_gives_a_run_the_exports_record(db, tmp_path):
    pytest.importorskip("tensorboard")
    from madsl.report.export import export
    from madsl.report.live import parse_track, tracked
    from madsl.runner.store.results import Store

    kind, folder = parse_track(f"tensorboard:{tmp_path / 'live'}")
    store = Store(db, create=False)
    run_ids = [row["run_id"] for row in store.runs()][:5]
    store.close()
    reporter = tracked(None, [(kind, folder)], db)

    class Job:
        def __init__(self, run_id: str):
            self.run_id = run_id

    with reporter:
        for run_id in run_ids:
            reporter.epoch(Job(run_id), {})
            reporter.ended(Job(run_id), "done")
    written = tree(folder)
    # the five runs, and when the reporter closes, the leaderboard rows and searches the export has
    assert len([k for k in written if k.startswith("mad/")]) == 5
    assert any(k.startswith("leaderboard/") for k in written) and any(k.startswith("search/") for k in written)
    synced = export(db, "tensorboard", folder)
    assert synced.current == len(written)  # the live records are the export's: left as they are
    assert {k: v for k, v in tree(folder).items() if k in written} == written


@pytest.mark.parametrize(
    "args,message",
    [
        (["--export", "wandb", "{tmp}/x"], "--export 'wandb': no such tracker"),
        (["--export", "tensorboard", "{tmp}/file"], "not a directory"),
        (["--export", "tensorboard", "{tmp}/busy"], "this command did not write (notes.txt)"),
        (["--html", "{tmp}/busy"], "this command did not write (notes.txt)"),
        (["--html", "{tmp}/h", "--format", "json"], "--format cannot go with --export or --html"),
        (["--html", "{tmp}/h", "--db", "{tmp}/none.db"], "no results database"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(db, tmp_path, capsys, args, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    argv = ["report", "--db", str(db)] + [a.replace("{tmp}", str(tmp_path)) for a in args]
    before = sorted(os.listdir(tmp_path))
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and message in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == before


def test_track_is_checked_before_anything_runs(tmp_path, capsys):
    rc, _, err = run(
        capsys, "eval", "specs/paper/mamba.mad", "--dry-run", "--track", "neptune:x", "--db", str(tmp_path / "r.db")
    )
    assert rc == 2 and "--track 'neptune:x': not KIND:DIR" in err
    assert not (tmp_path / "r.db").exists()


def test_a_live_tracked_evaluation_logs_its_runs_and_an_export_after_it_adds_nothing(tmp_path, capsys):
    """`madsl eval --track tensorboard:DIR` through the command line, a real (smoke) run: its curves
    are in TensorBoard's reader when the command returns, and exporting the same database into the
    same folder afterwards writes nothing (the live record is the export's)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    db, out = tmp_path / "r.db", tmp_path / "tb"
    argv = ["eval", "specs/paper/hyena-sg.mad", "--protocol", "smoke", "--task", "in-context-recall"]
    rc, _, err = run(capsys, *argv, "--db", str(db), "--track", f"tensorboard:{out}", "-q")
    assert rc == 0, err
    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(out))
    mux.Reload()
    runs = [r for r in mux.Runs() if r.startswith("mad/hyena-sg/in-context-recall/")]
    assert runs and all("eval/loss" in mux.Runs()[r]["scalars"] for r in runs)
    rc, _, err = run(capsys, "report", "--db", str(db), "--export", "tensorboard", str(out))
    assert rc == 0 and " 0 records written" in err.replace(":", " ")
