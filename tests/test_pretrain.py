"""Pretraining on text (madsl.runner.pretrain) and IsoFLOP studies (madsl.scaling): the paper's
recipe, a FLOP budget spent to within one step, a run that learns real text (below its unigram
entropy), resume equal to an uninterrupted run, and `madsl scale` end to end (dry run, training,
kill -9 and resume, bad study files)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from madsl.cli import main
from madsl.errors import MadslError
from madsl.runner.pretrain.recipe import PretrainSettings, paper_learning_rate, steps_for_budget

REPO = Path(__file__).resolve().parent.parent


# ---- the recipe ---------------------------------------------------------------------------------
def test_paper_learning_rates_follow_table_c2():
    assert paper_learning_rate(8e6) == pytest.approx(9.77e-4)
    assert paper_learning_rate(150e6) == pytest.approx(8.00e-4)
    assert paper_learning_rate(7e9) == pytest.approx(2.00e-4)
    assert paper_learning_rate(1e5) == pytest.approx(9.77e-4)  # below the table: its smallest size's
    assert paper_learning_rate(86e6) == pytest.approx((8.95e-4 + 8.56e-4) / 2)  # halfway between 70M and 102M


def test_schedule_warms_up_then_decays_to_a_tenth():
    s = PretrainSettings(seq_len=8, batch_size=2, steps=1000, lr=1e-3)
    assert s.warmup_steps == 10
    assert s.lr_at(0) == pytest.approx(1e-4)
    assert s.lr_at(9) == pytest.approx(1e-3)
    assert s.lr_at(999) == pytest.approx(1e-4, rel=1e-3)
    assert all(s.lr_at(i) >= s.lr_at(i + 1) for i in range(10, 999))
    assert s.evaluation_steps()[-1] == 1000


def test_budget_buys_whole_steps_within_one_step():
    steps = steps_for_budget(1e12, 6e5, 2048)
    step_flops = 6e5 * 2048
    assert steps * step_flops <= 1e12 < (steps + 1) * step_flops
    with pytest.raises(MadslError, match="smaller than one training step"):
        steps_for_budget(1e6, 6e5, 2048)


# ---- one run on real text -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    from madsl.corpus import resolve_tokens

    return resolve_tokens("bundled:tinyshakespeare", tmp_path_factory.mktemp("corpora"))


def _run(tokens, settings, checkpoint=None, stop_after=None):
    import torch

    from madsl.compiler import compile_spec
    from madsl.runner.pretrain.job import TokenBatches
    from madsl.runner.pretrain.loop import pretrain_run
    from madsl.runner.train.loop import TrainHooks
    from madsl.spec import spec_from_topology

    torch.set_num_threads(1)
    spec = spec_from_topology("mA-Sg", dim=32, vocab=256, seq_len=settings.seq_len)
    calls = [0]

    def should_stop():
        calls[0] += 1
        return stop_after is not None and calls[0] > stop_after

    return pretrain_run(
        settings,
        lambda: compile_spec(spec, vocab_size=256, max_seq_len=settings.seq_len, seed=settings.seed),
        TokenBatches(tokens, settings),
        checkpoint_path=checkpoint,
        hooks=TrainHooks(should_stop=should_stop, checkpoint_every_s=0.0),
    )


def test_a_run_learns_real_text_below_its_unigram_entropy(shakespeare):
    from madsl.corpus import unigram_entropy

    settings = PretrainSettings(seq_len=64, batch_size=16, steps=150, lr=3e-3, eval_tokens=8192)
    result = _run(shakespeare, settings)
    entropy = unigram_entropy(shakespeare.train)
    assert 2.5 < entropy < 3.5  # English bytes: about 3 nats
    assert result.best.eval_loss < entropy - 0.2
    assert result.history[0].eval_loss > result.history[-1].eval_loss
    assert result.epochs_done == len(settings.evaluation_steps())


def test_a_resumed_run_equals_an_uninterrupted_one(shakespeare, tmp_path):
    from madsl.runner.train.loop import RunInterrupted

    settings = PretrainSettings(seq_len=32, batch_size=8, steps=40, lr=2e-3, eval_every=10, eval_tokens=2048)
    whole = _run(shakespeare, settings)
    checkpoint = tmp_path / "run.pt"
    with pytest.raises(RunInterrupted):
        _run(shakespeare, settings, checkpoint, stop_after=17)
    resumed = _run(shakespeare, settings, checkpoint)
    assert [h.eval_loss for h in resumed.history] == [h.eval_loss for h in whole.history]
    assert [h.train_loss for h in resumed.history] == [h.train_loss for h in whole.history]


# ---- madsl scale ----------------------------------------------------------------------------------
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
  - {params: 5e4}
recipe: {batch_size: 8, eval_tokens: 1024}
"""


def _study(tmp_path, text=STUDY) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def test_dry_run_prints_the_grid(tmp_path, capsys):
    study = _study(tmp_path)
    assert main(["scale", str(study), "--dry-run", "--db", str(tmp_path / "r.db"), "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["runs"]) == 12 and plan["done"] == 0
    for row in plan["runs"]:
        assert row["flops"] <= row["budget"]
        assert row["tokens"] == row["steps"] * 8 * 32
        assert row["hours"] > 0
    target = [r for r in plan["runs"] if r["size"] == "p5e+04x1"]
    assert all(abs(math.log(r["params"] / 5e4)) < 0.5 for r in target)
    assert not (tmp_path / "r.db").exists()  # a dry run writes no database


@pytest.mark.parametrize(
    "change, message",
    [
        ("budgets: [2e9, 4e9]", "budgets: [1e3]"),
        ("- {dim: 16}", "- {dim: 16, depth: 2}"),
        ("recipe: {batch_size: 8, eval_tokens: 1024}", "recipe: {batch_size: 0}"),
        ("  hyena: bundled:paper/hyena-sg", "  hyena: /etc/passwd"),
        ("recipe: {batch_size: 8, eval_tokens: 1024}", "recipe: {batch_size: 8, lr: fast}"),
    ],
)
def test_bad_studies_are_located_errors(tmp_path, capsys, change, message):
    study = _study(tmp_path, STUDY.replace(change, message))
    assert main(["scale", str(study), "--dry-run", "--db", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "study.yaml:" in err


def test_a_missing_study_file_is_named(tmp_path, capsys):
    assert main(["scale", str(tmp_path / "none.yaml"), "--dry-run"]) == 2
    assert "no such study file" in capsys.readouterr().err


def test_a_budget_below_one_step_says_so(tmp_path, capsys):
    study = _study(tmp_path, STUDY.replace("budgets: [2e9, 4e9]", "budgets: [1e3]"))
    assert main(["scale", str(study), "--dry-run", "--db", str(tmp_path / "r.db")]) == 2
    assert "smaller than one training step" in capsys.readouterr().err


def _scale(study: Path, db: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "madsl", "scale", str(study), "--db", str(db), "-q", "--checkpoint-every", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _losses(db: Path) -> dict[str, float]:
    import sqlite3

    with sqlite3.connect(db) as c:
        return dict(c.execute("SELECT run_id, best_eval_loss FROM runs WHERE status='done'").fetchall())


def test_a_study_killed_resumes_to_the_same_results(tmp_path):
    study = _study(tmp_path, STUDY.replace("budgets: [2e9, 4e9]", "budgets: [4e9]").replace("  - {dim: 16}\n", ""))
    whole_db, killed_db = tmp_path / "whole.db", tmp_path / "killed.db"
    assert _scale(study, whole_db).wait(timeout=300) == 0
    process = _scale(study, killed_db)
    checkpoints = tmp_path / "killed.files" / "checkpoints"
    deadline = time.monotonic() + 120
    while not (checkpoints.exists() and any(checkpoints.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert len(_losses(killed_db)) < 4
    assert _scale(study, killed_db).wait(timeout=300) == 0
    assert _losses(killed_db) == _losses(whole_db) and len(_losses(whole_db)) == 4


def test_hyena_layers_are_not_weight_decayed_as_the_paper_trains_them():
    """App. C: weight decay 0 on every Hyena layer parameter (Hyena, multi-head Hyena, Hyena
    experts), `wd` on the other matrices; `decay_hyena: true` decays them too."""
    import torch

    from madsl.compiler import compile_spec
    from madsl.lang.spec import load_spec
    from madsl.runner.pretrain.loop import open_pretrain
    from madsl.runner.pretrain.recipe import PretrainSettings

    root = Path(__file__).resolve().parents[1] / "specs" / "paper"
    for name, layer in (
        ("hyena-sg", "hyena"),
        ("mh-hyena-sg", "multihead_hyena"),
        ("hyena-experts-sg", "hyena_experts"),
    ):
        spec = load_spec(root / f"{name}.mad")
        for decay_hyena in (False, True):
            settings = PretrainSettings(seq_len=32, batch_size=2, steps=4, lr=1e-3, decay_hyena=decay_hyena)
            state = open_pretrain(
                settings, lambda: compile_spec(spec, vocab_size=256, max_seq_len=32), torch.device("cpu"), None, None
            )
            decayed = {id(p) for g in state.optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
            hyena = [m for m in state.model.modules() if getattr(m, "madsl_primitive", None) == layer]
            matrices = [p for m in hyena for p in m.parameters() if p.ndim >= 2]
            assert hyena and matrices
            if decay_hyena:  # the matrices the layer itself does not exempt (e.g. its filters' own)
                assert any(id(p) in decayed for p in matrices)
                assert all(id(p) in decayed for p in matrices if not getattr(p, "_no_weight_decay", False))
            else:
                assert not any(id(p) in decayed for p in matrices), name
            others = [m for m in state.model.modules() if getattr(m, "madsl_primitive", None) == "swiglu"]
            assert others and all(id(p) in decayed for m in others for p in m.parameters() if p.ndim >= 2)
