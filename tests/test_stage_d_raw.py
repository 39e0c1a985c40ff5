"""A study's raw data as files (madsl.scaling.raw_runs): every run exported as CSV refits to the
database's numbers with no database; the MAD scores likewise; a bad file is a located error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from madsl.cli import main
from madsl.errors import MadslError

STUDY = """\
name: raw
data: bundled:tinyshakespeare
seq_len: 32
architectures:
  hyena: bundled:paper/hyena-sg
budgets:
  1e9: {lr: [1e-3, 3e-3]}
  2e9: {seeds: 2}
sizes: [{dim: 8}, {dim: 16}, {dim: 24}]
recipe: {batch_size: 8, eval_tokens: 1024, eval_every: 50, lr: 3e-3}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("raw")
    study = folder / "study.yaml"
    study.write_text(STUDY)
    db = folder / "r.db"
    assert main(["scale", str(study), "--db", str(db), "-q"]) == 0
    return study, db


def _report(capsys, *argv: str) -> dict:
    assert main(["report", *argv, "--format", "json", "-q"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_runs_file_refits_to_the_databases_numbers(trained, tmp_path, capsys):
    study, db = trained
    runs = tmp_path / "runs.csv"
    from_db = _report(capsys, "--study", str(study), "--db", str(db), "--export-runs", str(runs))
    lines = runs.read_text().splitlines()
    assert lines[0].startswith("run_id,arch,size,dim,budget,seed,lr,params,non_embedding_params,active_params,tokens")
    assert len(lines) == 1 + 3 * 2 + 3 * 2  # a ladder of 2 at 1e9, 2 seeds at 2e9, 3 sizes each
    # no database: its data cache goes to another folder, and nothing reads r.db
    refit = _report(capsys, "--study", str(study), "--db", str(tmp_path / "none.db"), "--runs", str(runs))
    assert not (tmp_path / "none.db").exists()
    for key in ("isoflops", "points", "seed_spread"):
        assert refit[key] == from_db[key], key


def _edited(runs: Path, line: int, column: str, value: str, out: Path) -> Path:
    rows = [row.split(",") for row in runs.read_text().splitlines()]
    rows[line - 1][rows[0].index(column)] = value
    out.write_text("\n".join(",".join(r) for r in rows) + "\n")
    return out


def test_a_bad_runs_file_is_a_located_error(trained, tmp_path, capsys):
    from madsl.scaling.api import plan_study_file, stored_runs
    from madsl.scaling.raw_runs import read_runs_csv, write_runs_csv

    study, db = trained
    plan = plan_study_file(study, db)
    runs = write_runs_csv(plan, stored_runs(plan, db), tmp_path / "runs.csv")
    assert read_runs_csv(plan, runs).keys() == stored_runs(plan, db).keys()
    cases = [
        (_edited(runs, 3, "loss", "abc", tmp_path / "a.csv"), "loss 'abc' is not a number", 3),
        (_edited(runs, 2, "lr", "0.5", tmp_path / "b.csv"), "has lr '0.5'; the study plans 0.001", 2),
        (_edited(runs, 4, "run_id", "f" * 64, tmp_path / "c.csv"), "is not a run of study raw", 4),
    ]
    for path, message, line in cases:
        with pytest.raises(MadslError, match=message) as raised:
            read_runs_csv(plan, path)
        assert raised.value.location.line == line and raised.value.location.file == str(path)
    header = runs.read_text().splitlines()
    (tmp_path / "d.csv").write_text("\n".join([header[0].replace(",loss,", ",los,")] + header[1:]) + "\n")
    with pytest.raises(MadslError, match="no column 'loss'"):
        read_runs_csv(plan, tmp_path / "d.csv")
    assert main(["report", "--study", str(study), "--runs", str(tmp_path / "a.csv"), "--db", str(db)]) == 2
    assert "a.csv:3:" in capsys.readouterr().err
    assert main(["report", "--runs", str(runs)]) == 2
    assert "--runs belongs to --study" in capsys.readouterr().err


def test_mad_scores_go_out_and_come_back_by_architecture_and_spec(trained, tmp_path):
    from madsl.scaling.api import plan_study_file
    from madsl.scaling.raw_runs import read_scores_csv, write_scores_csv

    study, db = trained
    plan = plan_study_file(study, db)
    path = write_scores_csv(plan, {"hyena": 0.455}, tmp_path / "mad.csv")
    assert read_scores_csv(plan, path) == {"hyena": 0.455}
    text = path.read_text()
    (tmp_path / "other.csv").write_text(text.replace(plan.study.architectures["hyena"].hash, "0" * 64))
    with pytest.raises(MadslError, match="was scored as another spec"):
        read_scores_csv(plan, tmp_path / "other.csv")
    (tmp_path / "range.csv").write_text(text.replace("0.455", "45.5"))
    with pytest.raises(MadslError, match="is not an accuracy in") as raised:
        read_scores_csv(plan, tmp_path / "range.csv")
    assert raised.value.location.line == 2
