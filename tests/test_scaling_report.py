"""`madsl report --study`: a study's runs in the results database, fitted and drawn. The runs here
carry losses drawn from a known scaling law (Hoffmann et al. 2022's constants, one offset per
architecture) on the grid `madsl scale` plans, so the report must find minima inside the sizes,
exponents near the law's, the architectures in the law's order, and draw the four figures."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from madsl.cli import main

E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28
OFFSETS = {"transformer": 0.0, "hyena": 2.0, "mamba": 4.0}  # lower loss, better architecture

STUDY = """\
name: law
data: bundled:tinyshakespeare
seq_len: 64
architectures:
  transformer: bundled:paper/mh-attention-sg
  hyena: bundled:paper/hyena-sg
  mamba: bundled:paper/mamba
budgets: [3e9, 1e10, 3e10]
sizes: [{dim: 8}, {dim: 16}, {dim: 24}, {dim: 32}, {dim: 48}, {dim: 64}, {dim: 96}]
recipe: {batch_size: 4, eval_tokens: 1024}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A study whose runs are 'done' with losses from the law (no training: the fits are under test)."""
    from madsl.runner.store.results import Store
    from madsl.scaling.api import _register, plan_study_file

    folder = tmp_path_factory.mktemp("law")
    study, db = folder / "study.yaml", folder / "r.db"
    study.write_text(STUDY)
    plan = plan_study_file(study, db)
    store = Store(db)
    _register(store, plan)
    store.close()
    with sqlite3.connect(db) as c:
        for run, run_id in zip(plan.runs, plan.run_ids):
            loss = E + OFFSETS[run.arch] + A / run.params**ALPHA + B / run.tokens**BETA
            c.execute("UPDATE runs SET status='done', best_eval_loss=? WHERE run_id=?", (loss, run_id))
    return study, db


def test_the_report_fits_the_law_and_ranks_the_architectures(trained, monkeypatch):
    from madsl.scaling import report as report_module

    study, db = trained
    # MAD scores for the three (better architecture, higher score), as `madsl eval` would have stored them
    monkeypatch.setattr(
        report_module, "_mad_scores", lambda plan, mad_db: {"transformer": 0.8, "hyena": 0.6, "mamba": 0.5}
    )
    report = report_module.study_report(study, db, resamples=200)
    assert len(report.points) == report.runs_total == 63
    assert len(report.isoflops) == 9 and all(f.bracketed for f in report.isoflops)
    for frontier in report.frontiers.values():
        # D is what the accounting's FLOPs buy, not C / 6N: the exponents sit near the law's
        assert 0.3 < frontier.params.exponent < 0.6
        assert frontier.params.exponent + frontier.tokens.exponent == pytest.approx(1.0, abs=0.15)
    at_top = {f.arch: f.optimal_loss for f in report.isoflops if f.budget == 3e10}
    assert at_top["transformer"] < at_top["hyena"] < at_top["mamba"]
    assert report.correlation is not None and report.correlation.budget == 3e10
    assert report.correlation.spearman == pytest.approx(-1.0)  # higher score, lower perplexity
    # three architectures: the best of 3! orderings, one-sided, is p = 1/6, and nothing reaches 0.05
    tests = report.correlation.tests
    assert report.correlation.exact and tests["spearman"].p_value == pytest.approx(1 / 6)
    assert tests["spearman"].detectable is None and report.correlation.interval_method == "none"
    assert report.correlation_left_out == {}
    for fit in report.parametric.values():  # approach 3 with bootstrap intervals, no constant at a bound
        assert fit.resamples == 200 and fit.intervals["alpha"][0] <= fit.alpha <= fit.intervals["alpha"][1]
    assert all(bpb > 0 for bpb in report.bits_per_byte.values())
    # the state-optimal law over the three budgets: more state at the optimum, lower perplexity
    assert set(report.state_laws) == set(OFFSETS) and report.state_laws_missing == {}
    for law in report.state_laws.values():
        low, high = law.law.interval
        assert len(law.budgets) == 3 and law.law.exponent < 0 and low <= law.law.exponent <= high
    assert report.ladder == []  # one learning rate: no ladder to report
    written = report_module.write_figures(report, Path(db).parent / "fig")
    assert sorted(p.name for p in written) == ["correlation.png", "frontier.png", "isoflops.png", "state_optimal.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_the_command_prints_the_fits_and_exports_records(trained, capsys):
    study, db = trained
    assert main(["report", "--study", str(study), "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert "IsoFLOP optima" in text and "Frontiers" in text and "MAD correlation: 0 of" in text
    assert "State-optimal law: P* ∝ M*^c" in text and "Learning-rate ladder" not in text
    assert main(["report", "--study", str(study), "--db", str(db), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert set(records["frontiers"]) == set(OFFSETS) and records["runs_done"] == 63
    assert set(records["state_laws"]) == set(OFFSETS) and records["learning_rate_ladder"] == []
    assert [f["extrapolated"] for f in records["isoflops"]] == [False] * 9
    assert records["correlation_left_out"] == {} and records["correlation"] is None
    assert main(["report", "--study", str(study), "--db", str(db), "--format", "csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0].startswith("arch,budget,params") and len(rows) == 64
    assert rows[0].endswith(",optimum_extrapolated")
    assert all(math.isfinite(float(r.split(",")[4])) for r in rows[1:])


def test_an_architecture_whose_optima_lie_beyond_its_sizes_is_marked_and_left_out(trained, tmp_path, monkeypatch):
    from madsl.scaling import report as report_module
    from madsl.scaling.api import plan_study_file

    study, db = trained
    copy = tmp_path / "beyond.db"
    with sqlite3.connect(db) as source, sqlite3.connect(copy) as target:
        source.backup(target)  # (its write-ahead log too)
    plan = plan_study_file(study, copy)
    with sqlite3.connect(copy) as c:  # mamba's loss falls with size as far as its sizes go (minimum at 10^15)
        for run, run_id in zip(plan.runs, plan.run_ids):
            if run.arch == "mamba":
                loss = 9.0 - 1.5 * math.log10(run.params) + 0.05 * math.log10(run.params) ** 2
                c.execute("UPDATE runs SET best_eval_loss=? WHERE run_id=?", (loss, run_id))
    monkeypatch.setattr(
        report_module, "_mad_scores", lambda plan, mad_db: {"transformer": 0.8, "hyena": 0.6, "mamba": 0.5}
    )
    report = report_module.study_report(study, copy, resamples=50, parametric_resamples=0)
    assert "mamba" in report.correlation_left_out and report.correlation is None  # 2 left: fewer than 3
    assert any(p.startswith("MAD correlation at 3e+10 FLOPs: mamba left out") for p in report.problems)
    assert any("needs at least 3, got 2" in p for p in report.problems)
    table = report_module.render_report(report).split("IsoFLOP optima")[1].split("\n\n")[0].splitlines()
    rows = [line for line in table if line.strip().startswith("mamba ")]
    assert len(rows) == 3 and all(row.endswith("EXTRAPOLATED") for row in rows)
    assert all(row.endswith("bracketed") for row in table[2:] if row.strip().startswith(("hyena ", "transformer ")))


def test_a_study_without_a_database_is_a_clear_error(tmp_path, capsys):
    study = tmp_path / "study.yaml"
    study.write_text(STUDY)
    assert main(["report", "--study", str(study), "--db", str(tmp_path / "none.db")]) == 2
    assert "no results database" in capsys.readouterr().err
