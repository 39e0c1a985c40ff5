"""Stacked pretraining (madsl.runner.pretrain.stacked): runs of one shape trained as one stacked
model equal the same runs trained one by one (fp32, CPU: to floating-point association), each
with its own seed, learning rate, weight decay and budget; a stopped stack resumes to exactly the
uninterrupted stack's results; the stack job reports each member as itself."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from madsl.runner.pretrain.recipe import PretrainSettings

SPEC_TOPOLOGY = "mA-Sg:H-Sg"  # attention and Hyena: the member folds of SDPA and the FFT convolution
BASE = PretrainSettings(seq_len=32, batch_size=4, steps=24, lr=3e-3, eval_every=8, eval_tokens=512)
MEMBERS = [
    BASE,
    dataclasses.replace(BASE, seed=1),
    dataclasses.replace(BASE, lr=1e-3, wd=0.0),
    dataclasses.replace(BASE, steps=16, grad_clip=0.0),  # another budget: stops first
]


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    from madsl.corpus import resolve_tokens

    return resolve_tokens("bundled:tinyshakespeare", tmp_path_factory.mktemp("corpora"))


def _build(settings: PretrainSettings):
    from madsl.compiler import compile_spec
    from madsl.spec import spec_from_topology

    spec = spec_from_topology(SPEC_TOPOLOGY, dim=16, vocab=256, seq_len=settings.seq_len)
    return lambda: compile_spec(spec, vocab_size=256, max_seq_len=settings.seq_len, seed=settings.seed)


def _alone(tokens, settings):
    from madsl.runner.pretrain.job import TokenBatches
    from madsl.runner.pretrain.loop import pretrain_run

    return pretrain_run(settings, _build(settings), TokenBatches(tokens, settings))


def _stacked(tokens, members, folder: Path, stop_after: int | None = None):
    """The members trained as one stack (from their checkpoints in `folder` where there are)."""
    from madsl.runner.pretrain.job import TokenBatches
    from madsl.runner.pretrain.loop import open_pretrain
    from madsl.runner.pretrain.stacked import pretrain_stack, stackable
    from madsl.runner.train.checkpoint import save_checkpoint
    from madsl.runner.train.loop import TrainHooks

    device = torch.device("cpu")
    paths = [folder / f"m{i}.pt" for i in range(len(members))]
    states = [open_pretrain(s, _build(s), device, p, f"run{i}") for i, (s, p) in enumerate(zip(members, paths))]
    for i, state in enumerate(states):
        state.run_id = f"run{i}"
    assert stackable(states)
    calls = [0]

    def should_stop() -> bool:
        calls[0] += 1
        return stop_after is not None and calls[0] > stop_after

    results = {}

    def save(state, finished: bool) -> None:
        index = int(state.run_id[3:])
        save_checkpoint(paths[index], state.to_checkpoint(state.result() if finished else None))
        if finished:
            results[index] = state.result()

    hooks = [TrainHooks(should_stop=should_stop, checkpoint_every_s=60.0) for _ in members]
    pretrain_stack(states, [TokenBatches(tokens, s) for s in members], hooks, save, device)
    return [results[i] for i in range(len(members))]


def test_a_stack_equals_its_members_trained_one_by_one(shakespeare, tmp_path):
    torch.set_num_threads(1)
    alone = [_alone(shakespeare, s) for s in MEMBERS]
    stacked = _stacked(shakespeare, MEMBERS, tmp_path)
    for one, many, settings in zip(alone, stacked, MEMBERS):
        assert len(many.history) == len(one.history) == len(settings.evaluation_steps())
        for a, b in zip(one.history, many.history):
            assert b.eval_loss == pytest.approx(a.eval_loss, rel=1e-5, abs=1e-6)
            assert b.train_loss == pytest.approx(a.train_loss, rel=1e-5, abs=1e-6)
            assert b.eval_acc == pytest.approx(a.eval_acc, abs=2e-3)  # an argmax tie may flip
            assert b.lr == a.lr
    # the members did differ: the stack did not train one model four times
    assert len({round(r.history[-1].eval_loss, 6) for r in stacked}) == len(MEMBERS)


def test_a_stopped_stack_resumes_to_the_same_results(shakespeare, tmp_path):
    from madsl.runner.train.loop import RunInterrupted

    torch.set_num_threads(1)
    whole = _stacked(shakespeare, MEMBERS, tmp_path / "whole")
    (tmp_path / "whole").mkdir(exist_ok=True)
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    with pytest.raises(RunInterrupted):
        _stacked(shakespeare, MEMBERS, stopped, stop_after=13)
    resumed = _stacked(shakespeare, MEMBERS, stopped)
    for a, b in zip(whole, resumed):
        assert [h.eval_loss for h in b.history] == [h.eval_loss for h in a.history]
        assert [h.train_loss for h in b.history] == [h.train_loss for h in a.history]


def test_the_stack_job_reports_each_member(shakespeare, tmp_path):
    """A PretrainStackJob emits started and finished for each member under its own run id, and
    a member already finished (its checkpoint holds its result) reports that result."""
    from madsl.runner.pretrain.job import PretrainJob, PretrainStackJob
    from madsl.spec import spec_from_topology

    spec = spec_from_topology(SPEC_TOPOLOGY, dim=16, vocab=256, seq_len=32)
    members = [
        PretrainJob(f"r{i}", spec, s, str(shakespeare.path), str(tmp_path / f"r{i}.pt"), device="cpu")
        for i, s in enumerate(MEMBERS[:3])
    ]
    events = []
    PretrainStackJob("stack", members, "cpu").execute(events.append, lambda: False)
    finished = {e.run_id: e.data for e in events if e.kind == "finished"}
    assert set(finished) == {"r0", "r1", "r2"} and all(d["stacked"] == 3 for d in finished.values())
    assert not [e for e in events if e.kind == "failed"]


# ---- studies: seed replicates, learning-rate ladders, stacks ------------------------------------
LADDER = """\
name: ladder
data: bundled:tinyshakespeare
seq_len: 32
architectures:
  hyena: bundled:paper/hyena-sg
budgets: [2e9]
sizes: [{dim: 16}]
seeds: 2
recipe: {batch_size: 8, eval_tokens: 1024, lr: [1e-3, 3e-3], eval_every: 20}
"""


def _scale_json(capsys, *argv: str) -> dict:
    import json

    from madsl.cli import main

    assert main(["scale", *argv, "--format", "json", "-q"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_ladder_and_seeds_plan_a_run_each_in_one_stack(tmp_path, capsys):
    study = tmp_path / "study.yaml"
    study.write_text(LADDER)
    plan = _scale_json(capsys, str(study), "--db", str(tmp_path / "r.db"), "--dry-run")
    rows = plan["runs"]
    assert [(r["lr"], r["seed"]) for r in rows] == [(1e-3, 0), (1e-3, 1), (3e-3, 0), (3e-3, 1)]
    assert {r["stack"] for r in rows} == {"s1"} and plan["stacks"] == [[r["run_id"] for r in rows]]
    alone = _scale_json(capsys, str(study), "--db", str(tmp_path / "r.db"), "--dry-run", "--no-batch")
    assert {r["stack"] for r in alone["runs"]} == {None} and alone["stacks"] == []
    # one seed, one rate: the runs (and their ids) of a study written before ladders existed
    plain = _scale_json(
        capsys,
        str(_write(tmp_path, LADDER.replace("seeds: 2\n", "").replace("[1e-3, 3e-3]", "1e-3"))),
        "--db",
        str(tmp_path / "r.db"),
        "--dry-run",
    )
    assert [r["run_id"] for r in plain["runs"]] == [rows[0]["run_id"]]


def test_a_budget_sets_its_own_seeds_and_ladder(tmp_path, capsys):
    """A budget's `seeds` and `lr` replace the study's for its runs alone; the labels name a run's
    rate and seed only where its budget has several; the runs of the other budget keep their ids."""
    from madsl.scaling.api import plan_study_file

    text = LADDER.replace("seeds: 2\n", "").replace("[1e-3, 3e-3]", "1e-3")
    text = text.replace("budgets: [2e9]", "budgets:\n  2e9: {lr: [1e-3, 3e-3]}\n  4e9: {seeds: 3}")
    study = _write(tmp_path, text)
    rows = _scale_json(capsys, str(study), "--db", str(tmp_path / "r.db"), "--dry-run")["runs"]
    assert [(r["budget"], r["lr"], r["seed"]) for r in rows] == [
        (2e9, 1e-3, 0),
        (2e9, 3e-3, 0),
        (4e9, 1e-3, 0),
        (4e9, 1e-3, 1),
        (4e9, 1e-3, 2),
    ]
    from madsl.scaling.stacks import run_labels

    labels = run_labels(plan_study_file(study, tmp_path / "r.db"))
    assert labels[0].endswith("@ 2e+09 lr 0.001") and labels[2].endswith("@ 4e+09 seed 0")
    one = _write(tmp_path, LADDER.replace("seeds: 2\n", "").replace("[1e-3, 3e-3]", "1e-3"))
    (plain,) = _scale_json(capsys, str(one), "--db", str(tmp_path / "r.db"), "--dry-run")["runs"]
    assert plain["run_id"] == rows[0]["run_id"]
    bad = _write(tmp_path, text.replace("seeds: 3", "seeds: 0"))
    from madsl.cli import main

    assert main(["scale", str(bad), "--dry-run", "--db", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err
    assert "other.yaml:8:" in err and "seeds" in err and "Traceback" not in err


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "other.yaml"
    path.write_text(text)
    return path


def test_a_stacked_study_equals_one_by_one_and_the_report_tunes_then_averages(tmp_path, capsys):
    import sqlite3

    from madsl.scaling.api import plan_study_file, study_points

    study = tmp_path / "study.yaml"
    study.write_text(LADDER)
    stacked, alone = tmp_path / "stacked.db", tmp_path / "alone.db"
    summary = _scale_json(capsys, str(study), "--db", str(stacked))
    # runs, not jobs: the four runs train as one stack ("4 of 1 runs done" was printed before)
    assert (summary["runs"], summary["jobs"], summary["done"]) == (4, 1, 4)
    _scale_json(capsys, str(study), "--db", str(alone), "--no-batch")
    losses = [dict(sqlite3.connect(db).execute("SELECT run_id, best_eval_loss FROM runs")) for db in (stacked, alone)]
    assert losses[0].keys() == losses[1].keys() and len(losses[0]) == 4
    for run_id, loss in losses[1].items():
        assert losses[0][run_id] == pytest.approx(loss, rel=1e-5)
    plan = plan_study_file(study, stacked)
    (point,) = study_points(plan, stacked)
    by_seed = {}
    for run, run_id in zip(plan.runs, plan.run_ids):
        by_seed[run.settings.seed] = min(by_seed.get(run.settings.seed, 1e9), losses[0][run_id])
    assert point.loss == pytest.approx(sum(by_seed.values()) / 2)
    # the report's ladder: each seed's model with its loss at both rates and the better one
    from madsl.scaling.report import study_report

    ladder = study_report(study, stacked, resamples=0, parametric_resamples=0).ladder
    assert [row["seed"] for row in ladder] == [0, 1]
    for row in ladder:
        assert list(row["losses"]) == [1e-3, 3e-3]
        best = min(row["losses"], key=row["losses"].__getitem__)
        assert row["best_lr"] == best and row["edge"] == ("lowest" if best == 1e-3 else "highest")
        assert by_seed[row["seed"]] == pytest.approx(row["losses"][best])


@pytest.mark.parametrize(
    "change, message, where",
    [
        (("seeds: 2", "seeds: 0"), "seeds: expected an integer at least 1, got 0", "8:8"),
        (("lr: [1e-3, 3e-3]", "lr: []"), "recipe.lr: the list is empty", "9:48"),
        (("lr: [1e-3, 3e-3]", "lr: [1e-3, 0.001]"), "recipe.lr: 0.001 is given twice", "9:55"),
        (("lr: [1e-3, 3e-3]", "lr: [1e-3, fast]"), "expected a number above 0 or `paper`", "9:55"),
    ],
)
def test_bad_ladders_and_seeds_are_located(tmp_path, capsys, change, message, where):
    from madsl.cli import main

    study = tmp_path / "study.yaml"
    study.write_text(LADDER.replace(*change))
    assert main(["scale", str(study), "--db", str(tmp_path / "r.db"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and f"study.yaml:{where}" in err, err


def test_a_stack_killed_resumes_every_member_to_the_same_results(tmp_path):
    """kill -9 while a stack trains: the study run again resumes each member from its checkpoint
    and ends with the uninterrupted stack's losses, to floating-point association (members that
    resume at different steps, or fewer of them, stack in other groups, whose batched matmuls may
    sum in another order; a stack resumed whole ends exactly: the test above)."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    study = tmp_path / "study.yaml"
    study.write_text(LADDER.replace("budgets: [2e9]", "budgets: [4e9]").replace("eval_every: 20", "eval_every: 10"))

    def scale(db: Path) -> subprocess.Popen:
        argv = [sys.executable, "-m", "madsl", "scale", str(study), "--db", str(db), "-q", "--checkpoint-every", "0"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def losses(db: Path) -> dict:
        with sqlite3.connect(db) as c:
            return dict(c.execute("SELECT run_id, best_eval_loss FROM runs WHERE status='done'").fetchall())

    whole, killed = tmp_path / "whole.db", tmp_path / "killed.db"
    assert scale(whole).wait(timeout=300) == 0
    process = scale(killed)
    checkpoints = tmp_path / "killed.files" / "checkpoints"
    deadline = time.monotonic() + 120
    while not (checkpoints.exists() and len(list(checkpoints.iterdir())) >= 4) and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert len(losses(killed)) < 4
    assert scale(killed).wait(timeout=300) == 0
    resumed, uninterrupted = losses(killed), losses(whole)
    assert resumed.keys() == uninterrupted.keys() and len(uninterrupted) == 4
    for run_id, loss in uninterrupted.items():
        assert resumed[run_id] == pytest.approx(loss, rel=1e-5)


def test_on_a_cpu_only_small_models_stack_unless_asked(tmp_path, capsys):
    """Wider than CPU_STACK_MAX_DIM a stack is no faster on a CPU: such runs train alone, unless
    --batch-grid asks for stacks at every width."""
    from madsl.scaling.stacks import CPU_STACK_MAX_DIM

    study = tmp_path / "study.yaml"
    study.write_text(LADDER.replace("{dim: 16}", f"{{dim: {2 * CPU_STACK_MAX_DIM}}}"))
    argv = [str(study), "--db", str(tmp_path / "r.db"), "--dry-run", "--device", "cpu"]
    assert {r["stack"] for r in _scale_json(capsys, *argv)["runs"]} == {None}
    assert {r["stack"] for r in _scale_json(capsys, *argv, "--batch-grid")["runs"]} == {"s1"}


def test_the_plan_counts_epochs_and_warns_when_data_repeats(tmp_path, capsys):
    from madsl.scaling.stacks import MAX_EPOCHS

    study = tmp_path / "study.yaml"
    study.write_text(LADDER)
    plan = _scale_json(capsys, str(study), "--db", str(tmp_path / "r.db"), "--dry-run")
    assert all(0 < r["epochs"] < 0.1 for r in plan["runs"]) and plan["warnings"] == []
    study.write_text(LADDER.replace("budgets: [2e9]", "budgets: [1.5e12]"))  # ~5 passes over 1M bytes
    plan = _scale_json(capsys, str(study), "--db", str(tmp_path / "r.db"), "--dry-run")
    assert all(r["epochs"] > MAX_EPOCHS for r in plan["runs"])
    (warning,) = plan["warnings"]
    assert warning.startswith("4 of 4 runs see the training split") and "data-constrained" in warning
