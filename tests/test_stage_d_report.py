"""The stage-D test (issue 39): a study's evidence refits from committed raw files with one
`madsl report` command and no training, and the report shows what a reviewer asks for: every run
as CSV, the refit from it (equal to the database's), MAD scores as a file, the seed spread of the
compute-optimal loss, N* under the total, non-embedding and active conventions (and `--params`
choosing the fits' N), and the MAD correlation over each pre-registered group.

The runs here are 'done' in a results database with losses drawn from a known law (no training:
the report is under test); the parametric fit, the slowest part and not under test here, is
replaced by one that records the points it is given."""

from __future__ import annotations

import csv
import json
import math
import sqlite3
import statistics
from pathlib import Path

import pytest

from madsl.cli import main
from madsl.errors import MadslError

E, A, B, ALPHA, BETA = 1.69, 40.64, 41.07, 0.34, 0.28  # Hoffmann et al.'s law, A and B a tenth
OFFSETS = {"transformer": 0.0, "hyena": 0.2, "hyena-moe": 0.3, "mamba": 0.4}  # lower loss, better
SCORES = {"transformer": 0.8, "hyena": 0.6, "hyena-moe": 0.55, "mamba": 0.5}  # better, higher score
CHAIN = ("transformer", "hyena", "hyena-moe")

STUDY = """\
name: staged
data: bundled:tinyshakespeare
seq_len: 64
architectures:
  transformer: bundled:paper/mh-attention-sg
  hyena: bundled:paper/hyena-sg
  hyena-moe: bundled:paper/hyena-moe
  mamba: bundled:paper/mamba
budgets:
  3e9: {lr: [1e-3, 3e-3]}
  1e10: {seeds: 2}
sizes: [{dim: 8}, {dim: 16}, {dim: 24}, {dim: 32}, {dim: 48}, {dim: 64}]
groups: {chain: [transformer, hyena, hyena-moe]}
recipe: {batch_size: 4, eval_tokens: 1024, lr: 3e-3}
"""
COLUMNS = (
    "run_id,arch,size,dim,budget,seed,lr,params,non_embedding_params,active_params,tokens,steps,epochs,"
    "state,status,loss,diverged_epoch,threads"
)


def _loss(run) -> float:
    """The law's loss; the ladder's lower rate 0.05 worse, seed 1 a little worse at larger sizes."""
    s = run.settings
    law = E + OFFSETS[run.arch] + A / run.params**ALPHA + B / run.tokens**BETA
    return law + (0.05 if s.lr == 1e-3 else 0.0) + 0.002 * s.seed * math.log(run.params)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from madsl.runner.store.results import Store
    from madsl.scaling.api import _register, plan_study_file

    folder = tmp_path_factory.mktemp("staged")
    path, db = folder / "study.yaml", folder / "r.db"
    path.write_text(STUDY)
    plan = plan_study_file(path, db)
    store = Store(db)
    _register(store, plan)
    store.close()
    with sqlite3.connect(db) as c:
        for run, run_id in zip(plan.runs, plan.run_ids):
            c.execute("UPDATE runs SET status='done', best_eval_loss=? WHERE run_id=?", (_loss(run), run_id))
    return path, db, plan


@pytest.fixture
def fast(monkeypatch):
    """The MAD scores as `madsl eval` would have stored them, and a parametric fit that records
    the points it gets (their N) and fits nothing."""
    from madsl.scaling import parametric
    from madsl.scaling import report as report_module

    seen: list[list] = []

    def recorded(points, **_):
        seen.append(list(points))
        raise MadslError("not fitted in this test")

    monkeypatch.setattr(report_module, "_mad_scores", lambda plan, mad_db: dict(SCORES))
    monkeypatch.setattr(parametric, "fit_parametric", recorded)
    return seen


def _json(capsys, *argv: str) -> dict:
    assert main(["report", "--study", *argv, "--format", "json", "-q"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_every_run_goes_out_as_csv_and_refits_to_the_databases_report(study, fast, tmp_path, capsys):
    from madsl.scaling.raw_runs import RUN_COLUMNS

    path, db, plan = study
    runs, scores = tmp_path / "runs.csv", tmp_path / "mad.csv"
    from_db = _json(capsys, str(path), "--db", str(db), "--export-runs", str(runs), "--export-mad", str(scores))
    assert [c.name for c in RUN_COLUMNS] == COLUMNS.split(",")  # declared once: the writer's and the reader's
    rows = list(csv.DictReader(runs.open()))
    assert runs.read_text().splitlines()[0] == COLUMNS and len(rows) == len(plan.runs) == 96
    train = plan.tokens.info.tokens("train")
    for row, run in zip(rows, plan.runs):
        assert (row["arch"], int(row["params"]), int(row["tokens"])) == (run.arch, run.params, run.tokens)
        assert int(row["non_embedding_params"]) == run.params - run.embedding_params < run.params
        assert (int(row["active_params"]) < run.params) == (run.arch == "hyena-moe")  # dense: all are active
        assert float(row["epochs"]) == pytest.approx(run.tokens / train, abs=1e-4)
        assert float(row["loss"]) == _loss(run) and row["status"] == "done" and row["diverged_epoch"] == ""
    assert [r["arch"] for r in csv.DictReader(scores.open())] == sorted(SCORES)
    # the refit: no database read or written (--db only names where the data is cached), same numbers
    none = tmp_path / "none.db"
    refit = _json(capsys, str(path), "--db", str(none), "--runs", str(runs), "--mad-scores", str(scores))
    assert not none.exists()
    assert refit == from_db
    assert refit["correlation"]["archs"] == sorted(SCORES) and refit["runs_done"] == 48


def _edited(runs: Path, line: int, column: str, value: str, out: Path) -> Path:
    rows = [row.split(",") for row in runs.read_text().splitlines()]
    rows[line - 1][rows[0].index(column)] = value
    out.write_text("\n".join(",".join(r) for r in rows) + "\n")
    return out


def test_a_bad_runs_file_is_an_error_at_its_file_line_and_column(study, tmp_path, capsys):
    from madsl.scaling.api import stored_runs
    from madsl.scaling.raw_runs import read_runs_csv, write_runs_csv

    path, db, plan = study
    runs = write_runs_csv(plan, stored_runs(plan, db), tmp_path / "runs.csv")
    header = runs.read_text().splitlines()[0].split(",")
    second = next(csv.DictReader(runs.open()))  # line 2: the first run
    bad_number = _edited(runs, 3, "loss", "1.2.3", tmp_path / "number.csv")
    foreign = _edited(runs, 2, "budget", "5e9", tmp_path / "budget.csv")
    recounted = _edited(runs, 2, "active_params", "1", tmp_path / "active.csv")
    missing = tmp_path / "missing.csv"
    missing.write_text(runs.read_text().replace(",active_params,", ",active,", 1))
    cases = [
        (bad_number, f"runs file {bad_number}: loss '1.2.3' is not a number", 3, "loss"),
        (
            foreign,
            f"runs file {foreign}: run {second['run_id'][:16]}... has budget '5e9'; the study plans 3000000000.0",
            2,
            "budget",
        ),
        (
            recounted,
            f"runs file {recounted}: run {second['run_id'][:16]}... has active_params '1'; the study plans "
            f"{second['active_params']}",
            2,
            "active_params",
        ),
        (missing, f"runs file {missing}: no column 'active_params'", 1, None),
    ]
    for file, message, line, column in cases:
        with pytest.raises(MadslError) as raised:
            read_runs_csv(plan, file)
        where = raised.value.location
        assert raised.value.message == message and (where.file, where.line) == (str(file), line)
        if column is not None:  # the column: where the cell starts on its line
            cells = file.read_text().splitlines()[line - 1].split(",")
            assert where.column == 1 + sum(len(c) + 1 for c in cells[: header.index(column)])
    assert main(["report", "--study", str(path), "--runs", str(bad_number), "--db", str(tmp_path / "x.db")]) == 2
    err = capsys.readouterr().err
    assert f"{bad_number}:3:" in err and "loss '1.2.3' is not a number" in err and "Traceback" not in err


def test_mad_scores_come_from_a_file_with_the_sign_convention_kept(study, fast, tmp_path, capsys):
    from madsl.scaling.raw_runs import write_scores_csv

    path, db, plan = study
    scores = write_scores_csv(plan, SCORES, tmp_path / "mad.csv")
    text = scores.read_text().splitlines()
    per_task = tmp_path / "tasks.csv"  # a per-task column beside the score is read past
    per_task.write_text("\n".join([text[0] + ",recall"] + [line + ",0.5" for line in text[1:]]) + "\n")
    assert main(["report", "--study", str(path), "--db", str(db), "--mad-scores", str(per_task)]) == 0
    out = capsys.readouterr().out
    assert "one-sided in the pre-registered direction: a higher MAD score predicts a lower perplexity" in out
    assert "Spearman ρ   -1.000" in out
    unknown = tmp_path / "unknown.csv"
    unknown.write_text(text[0] + "\n" + text[1] + "\nnope,abc,0.5\n")
    assert main(["report", "--study", str(path), "--db", str(db), "--mad-scores", str(unknown)]) == 2
    assert capsys.readouterr().err == (
        f"error: MAD scores file {unknown}: 'nope' is not an architecture of the study\n  --> {unknown}:3:1\n"
    )
    argv = ["report", "--study", str(path), "--db", str(db), "--mad-scores", str(scores), "--mad-db", str(db)]
    assert main(argv) == 2
    assert "--mad-scores and --mad-db both name the MAD scores" in capsys.readouterr().err


def test_the_seed_spread_is_the_optimum_fitted_on_each_seed_alone(study, fast):
    from madsl.scaling.api import _point
    from madsl.scaling.fits import fit_isoflop
    from madsl.scaling.report import render_report, study_report

    path, db, plan = study
    report = study_report(path, db, resamples=50)
    assert [(r["arch"], r["budget"]) for r in report.seed_spread] == [(a, 1e10) for a in sorted(OFFSETS)]
    for row in report.seed_spread:  # (3e9 has one seed: no spread)
        key = (row["arch"], row["budget"])
        for seed, loss in row["optimal_loss"].items():
            mine = [_point(r, _loss(r)) for r in plan.runs if (r.arch, r.budget, r.settings.seed) == (*key, seed)]
            assert loss == fit_isoflop(mine).optimal_loss
        values = list(row["optimal_loss"].values())
        assert set(row["optimal_loss"]) == {0, 1} and values[1] > values[0]
        assert (row["min"], row["max"], row["sd"]) == (min(values), max(values), statistics.stdev(values))
    text = render_report(report)
    assert "Seed replicates: the compute-optimal loss fitted on each seed's runs alone" in text
    assert f"seed 0: {report.seed_spread[0]['optimal_loss'][0]:.4f}" in text


def test_n_star_is_given_under_each_convention_and_params_chooses_the_fits_n(study, fast, tmp_path, capsys):
    from madsl.scaling.fits import ScalePoint, fit_isoflop
    from madsl.scaling.report import render_report, study_report

    path, db, plan = study
    default = study_report(path, db, resamples=50)
    # the default is the report before the conventions: total N, each model's points as they always were
    for fit in default.isoflops:
        models: dict[str, tuple[dict, object]] = {}  # size -> (seed -> its best rate's loss, its first run)
        for r in plan.runs:
            if (r.arch, r.budget) == (fit.arch, fit.budget):
                seeds = models.setdefault(r.size, ({}, r))[0]
                seeds[r.settings.seed] = min(_loss(r), seeds.get(r.settings.seed, math.inf))
        mine = [
            ScalePoint(r.arch, r.budget, float(r.params), float(r.tokens), sum(s.values()) / len(s), float(r.state))
            for s, r in models.values()
        ]
        assert fit == fit_isoflop(mine)
    active = study_report(path, db, resamples=50, params="active")
    rows = {(r["arch"], r["budget"]): r for r in default.optima_by_convention}
    assert rows == {(r["arch"], r["budget"]): r for r in active.optima_by_convention}
    for fit_total, fit_active in zip(default.isoflops, active.isoflops):
        row = rows[(fit_total.arch, fit_total.budget)]["optimal_params"]
        assert (row["total"], row["active"]) == (fit_total.optimal_params, fit_active.optimal_params)
        assert row["non-embedding"] < row["total"]
        assert (row["active"] < row["total"]) == (fit_total.arch == "hyena-moe")  # dense: the same fit
    moe = [p for p in active.points if p.arch == "hyena-moe"]
    assert {p.params for p in moe} == {float(r.active_params) for r in plan.runs if r.arch == "hyena-moe"}
    fitted_moe = [points for points in fast if points[0].arch == "hyena-moe"][-1]  # the parametric fit's N
    assert {p.params for p in fitted_moe} == {p.params for p in moe}
    text = render_report(active)
    assert "IsoFLOP optima (approach 2; N: parameters a token reads, a routed layer's chosen experts only)" in text
    assert "N* under each convention of N" in text and "non-embedding" in text
    records = _json(capsys, str(path), "--db", str(db), "--params", "non-embedding")
    assert records["params_convention"] == "non-embedding"
    assert [f["optimal_params"] for f in records["isoflops"]] == [
        r["optimal_params"]["non-embedding"] for r in records["optima_by_convention"]
    ]
    with pytest.raises(MadslError, match="'all': not a parameter convention"):
        study_report(path, db, params="all")
    assert main(["report", "--db", str(db), "--params", "active"]) == 2
    assert "--params belongs to --study" in capsys.readouterr().err


def test_the_correlation_is_taken_over_each_pre_registered_group(study, fast, tmp_path, capsys):
    from madsl.scaling.study import load_study

    path, db, plan = study
    records = _json(capsys, str(path), "--db", str(db))
    chain = records["group_correlations"]["chain"]
    assert sorted(chain["archs"]) == sorted(CHAIN) and chain["budget"] == records["correlation"]["budget"]
    assert chain["spearman"] == pytest.approx(-1.0) and len(records["correlation"]["archs"]) == 4
    assert chain["permutations"] == 6 and records["correlation"]["permutations"] == 24
    bad = tmp_path / "bad.yaml"
    bad.write_text(STUDY.replace("[transformer, hyena, hyena-moe]", "[transformer, hyena, hyena-mo]"))
    with pytest.raises(MadslError, match="group chain: 'hyena-mo' is not an architecture of the study") as raised:
        load_study(bad)
    assert (raised.value.location.file, raised.value.location.line) == (str(bad), 13)
    stage_d = load_study(Path(__file__).parent.parent / "specs" / "scaling" / "stage-d.yaml")
    assert stage_d.groups == {
        "design-chain": (
            "hyena",
            "mh-hyena",
            "striped-hyena",
            "striped-mh-hyena",
            "striped-mh-hyena-moe",
            "striped-hyena-experts-moe",
        )
    }
