"""`madsl search FILE --then-scale STUDY`: the front, written as specs that keep their budget rule,
goes into a study beside the template's baselines, with the template's data, budgets, sizes and
recipe and its paths moved; `madsl scale` on it solves each front spec again at every width."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from runner_helpers import tiny_search

from madsl.cli import main
from madsl.errors import MadslError

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]

TINY = tiny_search("{name: random, population: 2, generations: 0, seed: 0}")
TEMPLATE = """\
name: check
data: bundled:tinyshakespeare
seq_len: 64
architectures: {baseline: bundled:paper/hyena-sg, local: specs/local.mad}
budgets: [1e10]
sizes: [{dim: 16}, {dim: 32}]
recipe: {batch_size: 8, eval_tokens: 1024}
"""


def test_the_front_goes_into_a_study_that_solves_its_budget_at_each_width(tmp_path, capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "studies" / "specs").mkdir(parents=True)
    local = (REPO / "specs" / "paper" / "mh-attention-sg.mad").read_text()
    (tmp_path / "studies" / "specs" / "local.mad").write_text(local)
    template = tmp_path / "studies" / "check.yaml"
    template.write_text(TEMPLATE)
    out = tmp_path / "out"
    command = ["search", str(tmp_path / "tiny.yaml"), "--db", str(tmp_path / "r.db"), "--out", str(out)]
    assert main(command + ["--then-scale", str(template)]) == 0
    assert f"madsl scale {out / 'front-study.yaml'} --dry-run" in capsys.readouterr().out
    study = yaml.safe_load((out / "front-study.yaml").read_text())
    front = sorted(p.stem for p in out.glob("tiny-*.mad") if "-baseline-" not in p.stem)
    assert study["name"] == "tiny-front" and study["budgets"] == [1e10]
    assert study["architectures"] == {
        "baseline": "bundled:paper/hyena-sg",
        "local": "tiny-baseline-local.mad",  # copied beside it: a study reads nothing outside its folder
        **{name: f"{name}.mad" for name in front},
    }
    argv = ["scale", str(out / "front-study.yaml"), "--dry-run", "--db", str(tmp_path / "s.db"), "--rate", "1e9"]
    assert main([*argv, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["runs"]
    found = [r for r in rows if r["arch"] in front and "H.filter_states" in (r.get("fitted") or {})]
    assert {r["dim"] for r in found} == {16, 32}  # the free parameter solved again at each width
    assert (out / "tiny-baseline-local.mad").read_text() == local


def test_a_template_whose_data_is_a_token_folder_is_refused(tmp_path, capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "tokens").mkdir()
    (tmp_path / "check.yaml").write_text(
        TEMPLATE.replace("bundled:tinyshakespeare", "tokens").replace(", local: specs/local.mad", "")
    )
    command = ["search", str(tmp_path / "tiny.yaml"), "--db", str(tmp_path / "r.db")]
    assert main(command + ["--then-scale", str(tmp_path / "check.yaml")]) == 2
    err = capsys.readouterr().err
    assert "is a token folder" in err and "check.yaml:2" in err and not (tmp_path / "r.db").exists()


def test_a_bad_template_is_refused_before_anything_trains(tmp_path, capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    template = textwrap.dedent(TEMPLATE).replace("budgets: [1e10]", "budgets: [-1]")
    (tmp_path / "check.yaml").write_text(template.replace(", local: specs/local.mad", ""))
    db = tmp_path / "r.db"
    command = ["search", str(tmp_path / "tiny.yaml"), "--db", str(db), "--then-scale", str(tmp_path / "check.yaml")]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "check.yaml:5" in err and not db.exists()


def test_a_front_file_keeps_the_length_its_budget_was_met_at(tmp_path):
    """A study trains a front file at its own seq_len; the file's KV-cache bound stays the one the
    search met at its length (budget.seq_len written out), not the same number at another length."""
    from madsl.lang.spec import spec_from_data
    from madsl.scaling.grid import sized_spec
    from madsl.search import load_search
    from madsl.search.record import spec_text

    text = TINY.replace("dim: 16\n", "dim: 16\nseq_len: 32\n").replace(
        "budget: {fixed_state: <= 256,", "budget: {fixed_state: <= 256, kv_cache: <= 1024,"
    )
    (tmp_path / "tiny.yaml").write_text(text)
    search = load_search(tmp_path / "tiny.yaml")
    budget = {k: v for k, v in search.spec_data["budget"].items() if k != "fit"}  # as a candidate's spec holds it
    spec = {**search.spec_data, "budget": budget, "name": "tiny-found", "topology": "H-Sg:mA-Sg"}  # KV: 2 x 16 x 32
    candidate = {"spec": spec, "tasks": {"in-context-recall": 0.5}, "score": 0.5, "generation": 0, "name": "found"}
    written = yaml.safe_load(spec_text(search, candidate))
    assert written["budget"] == {
        "fixed_state": "<= 256",
        "kv_cache": "<= 1024",
        "seq_len": 32,
        "fit": ["H.filter_states"],
    }
    sized = sized_spec(spec_from_data(written), dim=16, repeat=1, vocab=64, seq_len=64, name="at-64")
    assert sized.seq_len == 64 and sized.budget_seq_len == 32  # trained at 64, its budget read at 32
    unpinned = {**written, "budget": {k: v for k, v in written["budget"].items() if k != "seq_len"}}
    with pytest.raises(MadslError, match="kv_cache = 2,048 is outside its budget"):
        sized_spec(spec_from_data(unpinned), dim=16, repeat=1, vocab=64, seq_len=64, name="at-64")
