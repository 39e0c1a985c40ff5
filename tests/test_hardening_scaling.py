"""Issue 36, the scaling surface: study files, `madsl scale --dry-run`, `madsl report --study` and the
plan's rate cache under hostile or absurd input. Each case answers in bounded memory and time with
exit 0 (legitimate) or exit 2 and a located message, never a traceback; JSON is strict JSON."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from runner_helpers import stand_in_rates

from madsl.cli import main
from madsl.runner.pretrain.recipe import EvaluationSchedule, PretrainSettings

STUDY = """\
name: tiny
data: bundled:tinyshakespeare
seq_len: 32
architectures:
  transformer: bundled:paper/mh-attention-sg
  hyena: bundled:paper/hyena-sg
budgets: [2e9, 4e9]
sizes:
  - {dim: 16}
  - {dim: 32}
  - {dim: 48}
recipe: {batch_size: 8, eval_tokens: 1024}
"""


def _strict(text: str) -> object:
    """JSON as a strict parser reads it: NaN and Infinity are not JSON."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> Path:
    """A results database path whose folder holds the bundled corpus once, shared by the dry runs."""
    return tmp_path_factory.mktemp("shared") / "r.db"


@pytest.fixture
def rates(tmp_path, monkeypatch) -> list[str]:
    return stand_in_rates(monkeypatch, tmp_path / "cache")


def _study(tmp_path: Path, text: str = STUDY) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def _scale(study: Path, db: Path, *extra: str) -> int:
    return main(["scale", str(study), "--dry-run", "--db", str(db), *extra])


# --- 1. the evaluation schedule is arithmetic ---------------------------------------------------


@pytest.mark.parametrize(
    "steps, every", [(1, 0), (7, 0), (10, 0), (95, 0), (1000, 0), (10, 3), (9, 3), (5, 7), (1, 1), (12, 1), (100, 25)]
)
def test_the_schedule_is_the_old_list_of_evaluations(steps, every):
    """The same steps as the list it replaces, so a run's identity (its evaluation count) is unchanged."""
    settings = PretrainSettings(seq_len=8, batch_size=2, steps=steps, lr=1e-3, eval_every=every)
    period = every or max(1, math.ceil(steps / 10))
    listed = sorted({*range(period, steps, period), steps})
    schedule = settings.evaluation_steps()
    assert list(schedule) == listed and len(schedule) == len(listed) and schedule[-1] == steps
    assert [s for s in range(steps + 2) if s in schedule] == listed
    assert [schedule.next_after(s) for s in range(steps + 1)] == [
        next((e for e in listed if e > s), None) for s in range(steps + 1)
    ]


def test_eval_every_1_over_a_huge_budget_is_computed_not_listed():
    """In a process allowed 1 GiB: the old list of 10^15 steps raised MemoryError after 4.5 GB."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from madsl.runner.pretrain.recipe import PretrainSettings\n"
        "s = PretrainSettings(seq_len=8, batch_size=2, steps=10**15, lr=1e-3, eval_every=1).evaluation_steps()\n"
        "print(len(s), 10**15 in s, 12345 in s, s.next_after(41), s[-2])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.split() == [str(10**15), "True", "True", "42", str(10**15 - 1)]
    assert EvaluationSchedule(3, 10)[1:] == [6, 9, 10]


def test_a_dry_run_of_eval_every_1_over_1e17_flops_answers(tmp_path, corpora):
    """The plan identifies each run by its evaluation count: in a process allowed 2 GiB."""
    text = STUDY.replace("[2e9, 4e9]", "[1e17]").replace("eval_tokens: 1024}", "eval_tokens: 1024, eval_every: 1}")
    argv = [
        "scale",
        str(_study(tmp_path, text)),
        "--dry-run",
        "--db",
        str(corpora),
        "--rate",
        "1e12",
        "--format",
        "json",
    ]
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        f"from madsl.cli import main; sys.exit(main({argv!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MADSL_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert all(row["steps"] > 10**8 and row["hours"] > 0 for row in _strict(done.stdout)["runs"])


# --- 2. a results database's rows are untrusted -------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The study's runs, 'done' with losses from a scaling law (no training)."""
    from madsl.runner.store.results import Store
    from madsl.scaling.api import _register, plan_study_file

    folder = tmp_path_factory.mktemp("finished")
    study, db = folder / "study.yaml", folder / "r.db"
    study.write_text(STUDY)
    plan = plan_study_file(study, db)
    store = Store(db)
    _register(store, plan)
    store.close()
    with sqlite3.connect(db) as c:
        for run, run_id in zip(plan.runs, plan.run_ids):
            loss = 1.69 + 406.4 / run.params**0.34 + 410.7 / run.tokens**0.28
            c.execute("UPDATE runs SET status='done', best_eval_loss=? WHERE run_id=?", (loss, run_id))
    return study, db, plan.run_ids[0]


@pytest.mark.parametrize(
    "stored, why",
    [
        ("'abc'", "'abc', not a number"),
        ("X'00ff'", "not a number"),
        ("0", "0.0, not above 0"),
        ("-1.5", "not above 0"),
        ("9e999", "inf, not finite"),
        ("NULL", "missing"),
        ("1e300", "above 1,000 nats"),
    ],
)
def test_a_stored_loss_that_is_no_loss_is_named_and_left_out(tmp_path, capsys, finished, stored, why):
    study, db, first = finished
    copy = tmp_path / "copy.db"
    with sqlite3.connect(db) as source, sqlite3.connect(copy) as c:
        source.backup(c)  # (its write-ahead log too)
        c.execute(f"UPDATE runs SET best_eval_loss={stored} WHERE run_id=?", (first,))
    assert main(["report", "--study", str(study), "--db", str(copy), "--format", "json"]) == 0
    out = capsys.readouterr()
    records = _strict(out.out)
    assert "Traceback" not in out.err
    assert records["runs_done"] == records["runs_total"] - 1
    [problem] = [p for p in records["problems"] if first in p]
    assert str(copy) in problem and why in problem and "left out" in problem


# --- 3. outputs are checked before the work ------------------------------------------------------


@pytest.mark.parametrize("kind", ["a file", "under a file", "a folder of other files"])
def test_a_plot_folder_that_cannot_take_the_figures_is_refused_before_the_work(
    tmp_path, capsys, finished, monkeypatch, kind
):
    from madsl.scaling import report

    study, db, _ = finished
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    target = {
        "a file": tmp_path / "file",
        "under a file": tmp_path / "file" / "fig",
        "a folder of other files": tmp_path / "full",
    }[kind]
    monkeypatch.setattr(report, "study_report", lambda *a, **k: pytest.fail("the work ran before the check"))
    assert main(["report", "--study", str(study), "--db", str(db), "--plot", str(target)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--plot" in err
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mad-db", "{dir}/none.db"], "does not exist"),
        (["--mad-db", "{dir}"], "is a directory"),
        (["--protocol", "quick"], "--protocol reads a leaderboard's MAD runs"),
        (["--plot-sweeps", "{dir}/sweeps"], "--plot-sweeps reads a leaderboard's MAD runs"),
    ],
)
def test_report_study_refuses_what_it_would_ignore_or_fail_on_late(
    tmp_path, capsys, finished, monkeypatch, argv, message
):
    from madsl.scaling import report

    study, db, _ = finished
    monkeypatch.setattr(report, "study_report", lambda *a, **k: pytest.fail("the work ran before the check"))
    args = [a.replace("{dir}", str(tmp_path)) for a in argv]
    assert main(["report", "--study", str(study), "--db", str(db), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_mad_db_without_study_is_refused(tmp_path, capsys, finished):
    _, db, _ = finished
    assert main(["report", "--db", str(db), "--mad-db", str(db)]) == 2
    assert "--mad-db belongs to --study" in capsys.readouterr().err


# --- 4. the rate cache is untrusted input --------------------------------------------------------


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_folder_or_fifo_at_the_rate_cache_is_set_aside_with_a_plain_warning(tmp_path, capsys, corpora, rates, kind):
    from madsl.runner.plan import rate_cache

    path = rate_cache.cache_path()
    path.parent.mkdir(parents=True)
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    assert _scale(_study(tmp_path), corpora) == 0
    err = capsys.readouterr().err
    assert f"warning: {path}: not a usable rate cache" in err and "measured again" in err
    assert "Traceback" not in err and ".py:" not in err and "RuntimeWarning" not in err
    assert rates  # measured again
    assert path.is_dir() if kind == "folder" else path.is_file()  # a FIFO's name is replaced by the new cache


@pytest.mark.parametrize(
    "device, field, value",
    [
        ("cpu: a test CPU, 2 CPUs", "flops_per_s", 1.0),  # planned 2,230 hours for a 4-step run
        ("cpu: a test CPU, 2 CPUs", "flops_per_s", 1e15),  # 500 TFLOP/s a core
        ("cuda: a test GPU", "flops_per_s", 1e6),
        ("cpu: a test CPU, 2 CPUs", "overhead_s", 3000.0),
    ],
)
def test_a_cached_rate_no_such_machine_measures_is_refused(tmp_path, device, field, value):
    from madsl.runner.plan import rate_cache
    from madsl.runner.plan.rate import RateBook
    from madsl.runner.plan.rate_model import DeviceRates, Line, Measured, now

    rates = DeviceRates(device, 2, {"hyena": Line(0.001, 1e10, now(), 0.2)}, rest=Measured(2e-6, now(), 0.2))
    data = RateBook.known(rates).data
    [entry] = data["devices"].values()
    entry["families"]["hyena"][field] = value
    path = tmp_path / "device-rates.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"{field} .* is not a finite number in .*what {device[:10]}"):
        rate_cache.read_cache(path)


def test_the_study_plan_adds_each_process_start_up(tmp_path, capsys, corpora, monkeypatch):
    stand_in_rates(monkeypatch, tmp_path / "cache", startup_s=3.0)
    assert _scale(_study(tmp_path), corpora, "--format", "json", "--workers", "2") == 0
    plan = _strict(capsys.readouterr().out)
    assert (plan["processes"], plan["startup_seconds"]) == (3, 3.0)
    assert plan["cpu_hours"] == pytest.approx(plan["hours"] + 9.0 / 3600)
    assert plan["wall_hours"] == pytest.approx(plan["hours"] / 2 + 6.0 / 3600)
    assert main(["scale", str(_study(tmp_path)), "--dry-run", "--db", str(corpora)]) == 0
    assert "(and 3.0 s to start 1 process(es))" in capsys.readouterr().out


def test_a_cached_absurd_rate_is_measured_again_not_planned_with(tmp_path, capsys, corpora, rates):
    from madsl.runner.plan import rate_cache

    study = _study(tmp_path)
    assert _scale(study, corpora, "--format", "json") == 0
    before = _strict(capsys.readouterr().out)["hours"]
    path = rate_cache.cache_path()
    data = json.loads(path.read_text())
    for device in data["devices"].values():
        for line in device["families"].values():
            line["flops_per_s"] = 1
    path.write_text(json.dumps(data))
    rates.clear()
    assert _scale(study, corpora, "--format", "json") == 0
    out = capsys.readouterr()
    assert _strict(out.out)["hours"] == pytest.approx(before) and rates
    assert "flops_per_s 1 is not a finite number in" in out.err


def test_a_measured_slope_beyond_any_machine_is_kept_within_what_the_cache_admits(monkeypatch):
    import torch

    from madsl.runner.plan import rate_measure
    from madsl.runner.plan.rate import to_entry
    from madsl.runner.plan.rate_model import DeviceRates, Line, Measured, now

    monkeypatch.setattr(rate_measure, "measure_family", lambda family, device: Line(7200.0, 1e21, now(), 0.1))
    monkeypatch.setattr(rate_measure, "measure_model", lambda *a: (Measured(0.5, now(), 0.1), 0.01))
    book = DeviceRates("cpu: a test CPU, 1 CPUs", 1)
    rate_measure.measure_into(book, torch.device("cpu"), ["hyena"], None)
    assert book.families["hyena"].flops_per_s == 1e12 and book.families["hyena"].overhead_s == 60.0
    assert book.rest.value == 1e-3
    to_entry(book)  # what is written is what a read accepts


# --- 5. study files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message, line",
    [
        (
            ("  - {dim: 16}\n  - {dim: 32}\n  - {dim: 48}", "  - {dim: 16}\n  - {dim: 7}\n  - {dim: 48}"),
            "architecture transformer at size d7x1",
            "  - {dim: 7}",
        ),
        (("  - {dim: 48}", "  - {dim: 48, repeat: 100000}"), "beyond the limit", "  - {dim: 48, repeat: 100000}"),
        (("name: tiny", "name: ''"), "the study's name '' is empty", "name: ''"),
        (("name: tiny", "name: ../up"), "holds a path separator", "name: ../up"),
        (("name: tiny", "name: '..'"), "holds '..'", "name: '..'"),
        (("  hyena:", "  '':"), "architecture name '' is empty", "  '': bundled:paper/hyena-sg"),
        (("  hyena:", "  a/b:"), "architecture name 'a/b' holds a path separator", "  a/b: bundled:paper/hyena-sg"),
        (("  hyena:", "  12:"), "architecture name 12: not text", "  12: bundled:paper/hyena-sg"),
        (("[2e9, 4e9]", "[2e9, 1e40]"), "a budget: expected a number at most 1e+30", "budgets: [2e9, 1e40]"),
        (("budgets: [2e9, 4e9]", "budgets:\n  2e9: {}\n  1e3: {}"), "smaller than one training step", "  1e3: {}"),
        (
            ("eval_tokens: 1024}", "eval_tokens: 8}"),
            "eval_tokens 8 is fewer than one window of seq_len 32",
            "recipe: {batch_size: 8, eval_tokens: 8}",
        ),
        (
            ("eval_tokens: 1024}", "eval_tokens: 1e12}"),
            "more than the validation split holds",
            "recipe: {batch_size: 8, eval_tokens: 1e12}",
        ),
        (
            ("eval_tokens: 1024}", "eval_tokens: 1024, seed: 1e30}"),
            "recipe.seed: expected an integer at most 4,294,967,295",
            "recipe: {batch_size: 8, eval_tokens: 1024, seed: 1e30}",
        ),
        (("seq_len: 32", "seq_len: 32\ndescription: [1, 2]"), "description: expected text", "description: [1, 2]"),
        (
            ("seq_len: 32", "seq_len: 32\ndata_dtype: float64"),
            "data_dtype: unknown token file dtype 'float64'",
            "data_dtype: float64",
        ),
        (("data: bundled:tinyshakespeare", "data: outside"), "leads out of the study's folder", "data: outside"),
        (
            ("data: bundled:tinyshakespeare", "data: ../elsewhere"),
            "leads out of the study's folder",
            "data: ../elsewhere",
        ),
    ],
)
def test_bad_study_files_are_located_at_what_is_wrong(tmp_path, capsys, corpora, rates, change, message, line):
    (tmp_path / "elsewhere").mkdir()
    folder = tmp_path / "studies"
    folder.mkdir()
    (folder / "outside").symlink_to(tmp_path / "elsewhere")
    assert _scale(_study(folder, STUDY.replace(*change)), corpora) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    where = next(text for text in err.splitlines() if "study.yaml:" in text)
    number = int(where.rsplit("study.yaml:", 1)[1].split(":")[0])
    assert (folder / "study.yaml").read_text().splitlines()[number - 1] == line


@pytest.mark.parametrize("rate", ["1e-300", "0.5"])
def test_a_rate_that_makes_the_hours_overflow_is_refused(tmp_path, capsys, corpora, rates, rate):
    assert _scale(_study(tmp_path), corpora, "--rate", rate, "--format", "json") == 2
    err = capsys.readouterr().err
    assert "--rate" in err and "at least 1 FLOP/s" in err and "Traceback" not in err


def test_json_outputs_are_strict_json():
    from madsl.outputs import finite_json, json_text

    value = {"hours": math.inf, "rows": [1.0, math.nan, -math.inf, (2, math.inf)], "name": "x"}
    assert finite_json(value) == {"hours": None, "rows": [1.0, None, None, [2, None]], "name": "x"}
    assert _strict(json_text(value)) == finite_json(value)


# --- the leaderboard reads the same untrusted rows ------------------------------------------------


@pytest.fixture(scope="module")
def mad_db(tmp_path_factory) -> Path:
    from runner_helpers import run_toy_eval

    db = tmp_path_factory.mktemp("mad") / "m.db"
    run_toy_eval(db, epochs=1)
    return db


@pytest.mark.parametrize(
    "column, stored, why",
    [
        ("best_eval_acc", "'abc'", "best_eval_acc is str, not a number"),
        ("best_eval_acc", "X'00'", "best_eval_acc is bytes"),
        ("best_eval_acc", "9e999", "not an accuracy in [0, 1]"),
        ("lr", "'fast'", "lr is str"),
        ("setting", "'nope'", "setting is not a JSON object"),
    ],
)
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_leaderboard_row_holding_no_number_is_left_out_with_a_warning(
    tmp_path, capsys, mad_db, column, stored, why, fmt
):
    copy = tmp_path / "copy.db"
    with sqlite3.connect(mad_db) as source, sqlite3.connect(copy) as c:
        source.backup(c)
        c.execute(f"UPDATE runs SET {column}={stored}")
    assert main(["report", "--db", str(copy), "--format", fmt]) == 0
    out = capsys.readouterr()
    assert f"warning: results database {copy}: 1 run(s) left out" in out.err and why in out.err
    assert "Traceback" not in out.err
    if fmt == "json":
        _strict(out.out)
