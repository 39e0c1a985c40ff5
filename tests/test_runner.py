"""The runner: training, store, resume, executors, scores, reports, protocols.

Everything here runs on a small stand-in model and toy tasks (tests/runner_helpers.py),
so the runner is tested on its own; one thread per process keeps the file fast next to
other busy processes.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from runner_helpers import (
    TESTS_DIR,
    TOY_TASKS,
    DivergingFactory,
    FakeSpec,
    KillingFactory,
    StandInFactory,
    StandInModel,
    epoch_rows,
    run_rows,
    run_toy_eval,
    without_sequence_mixing,
)

from madsl.errors import MadslError
from madsl.runner.api import evaluate
from madsl.runner.execute.coordinator import Reporter
from madsl.runner.plan.overrides import Overrides, overrides_from_spec_eval
from madsl.runner.plan.protocols import PROTOCOLS
from madsl.runner.plan.runs import TrainSettings, build_plan
from madsl.runner.plan.task_settings import parse_set_option, resolve_task_names
from madsl.runner.reports import scores as scoring
from madsl.runner.reports.outputs import report
from madsl.runner.store.results import Store
from madsl.runner.train.checkpoint import load_checkpoint
from madsl.runner.train.heads import TaskModel, sincos_position_embedding
from madsl.runner.train.loop import train_run
from madsl.runner.train.metrics import MetricAccumulator
from madsl.tasks.base import IGNORE

torch.set_num_threads(1)


# --- training ------------------------------------------------------------------------------


def _train_toy(name, epochs, mixing=True, lr=3e-3, wd=0.0):
    """Train the stand-in on a toy task; mixing=False replaces its sequence mixer by identity (the control)."""
    task = TOY_TASKS[name]
    s = dict(task.baseline)
    train, test = task.generate(s, "train", 0), task.generate(s, "test", 0)
    cfg = TrainSettings(lr=lr, wd=wd, epochs=epochs, batch_size=32, seed=0, min_lr=1e-6, early_stop_acc=0.999)
    target_len = train.targets.shape[1] if task.head == "compression" else None

    def build():
        backbone = StandInModel(task.vocab_size(s), 16, 2 if name == "toy-classify" else None)
        return TaskModel(
            backbone if mixing else without_sequence_mixing(backbone),
            task.head,
            num_classes=task.num_classes(s),
            target_len=target_len,
            input_dim=task.input_dim(s),
        )

    return train_run(cfg, build, train, test, num_classes=task.num_classes(s))


def test_training_decreases_loss_and_learns():
    # toy-previous needs sequence mixing: a position alone says nothing of the token before it
    result = _train_toy("toy-previous", epochs=6)
    losses = [h.eval_loss for h in result.history]
    assert losses[-1] < losses[0] * 0.5
    assert result.best.eval_macro_acc > 0.9
    assert result.best_epoch == min(result.history, key=lambda h: h.eval_ppl).epoch
    assert result.early_stopped == (result.epochs_done < 6)
    # the control: the same model and training with the sequence mixer replaced by identity learns nothing
    control = _train_toy("toy-previous", epochs=6, mixing=False)
    assert control.history[-1].eval_loss > control.history[0].eval_loss * 0.95
    assert control.best.eval_macro_acc < 0.25  # 8 classes: chance is 0.125


@pytest.mark.parametrize("name", ["toy-compression", "toy-classify", "toy-regress"])
def test_heads_train_and_learn_what_needs_sequence_mixing(name):
    # each toy task's target needs another position (tests/runner_helpers.py); the control has no mixer
    result, control = _train_toy(name, epochs=10, wd=0.1), _train_toy(name, epochs=10, wd=0.1, mixing=False)
    assert result.epochs_done == 10
    if name == "toy-regress":
        assert result.best.eval_ppl is None and result.best.eval_macro_acc is None
        assert result.best.eval_loss < 0.6 * control.best.eval_loss
    else:
        assert result.best.eval_macro_acc > control.best.eval_macro_acc + 0.15


def _macro_accuracy_cases():
    # hand-made: class 3 is predicted but never a target (counts 0), IGNORE is not scored
    logits = torch.full((1, 6, 4), -10.0)
    for i, p in enumerate([0, 0, 1, 1, 3, 0]):
        logits[0, i, p] = 10.0
    yield "hand-made", 4, [(logits, torch.tensor([[0, 0, 1, 2, 1, IGNORE]]))]
    # random batches: skewed predictions (some classes never predicted), classes 6-7 never targets, IGNOREs
    rng = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(3):
        logits = torch.randn(4, 9, 8, generator=rng) + torch.tensor([2.0, 1, 0, 0, -1, -2, 0.5, -9])
        targets = torch.randint(0, 6, (4, 9), generator=rng)
        targets[torch.rand(4, 9, generator=rng) < 0.2] = IGNORE
        batches.append((logits, targets))
    yield "random", 8, batches


@pytest.mark.parametrize("case", list(_macro_accuracy_cases()), ids=lambda case: case[0])
def test_macro_accuracy_matches_torchmetrics(case):
    from torchmetrics.classification import MulticlassAccuracy

    _, num_classes, batches = case
    ours = MetricAccumulator("classes", num_classes)
    macro = MulticlassAccuracy(num_classes=num_classes, average="macro", ignore_index=IGNORE)
    micro = MulticlassAccuracy(num_classes=num_classes, average="micro", ignore_index=IGNORE)
    for logits, targets in batches:
        ours.update(logits, targets, torch.tensor(0.0))
        for metric in (macro, micro):
            metric.update(logits.reshape(-1, num_classes), targets.reshape(-1))
    out = ours.compute()
    assert out["macro_acc"] == pytest.approx(float(macro.compute()), abs=1e-6)
    assert out["acc"] == pytest.approx(float(micro.compute()), abs=1e-6)


@pytest.mark.parametrize("kind, per_batch", [("classes", False), ("classes", True), ("regression", False)])
def test_the_per_step_bookkeeping_needs_no_host_sync(kind, per_batch):
    """The loss and metric updates of every training step run on the meta device, where any
    op that needs the values on the host (a boolean index, bincount, .item()) raises: on a GPU
    such an op stalls each step until the device catches up."""
    from madsl.runner.train.heads import TaskModel
    from madsl.runner.train.metrics import task_loss

    outputs = torch.randn(4, 9, 8, device="meta")
    targets = (
        torch.randn(4, 9, 8, device="meta") if kind == "regression" else torch.randint(0, 8, (4, 9), device="meta")
    )
    model = TaskModel.__new__(TaskModel)
    model.kind = kind
    loss, loss_sum = task_loss(model, outputs, targets)
    accumulator = MetricAccumulator(kind, 8, per_batch)
    accumulator.update(outputs, targets, loss_sum)
    assert loss.device.type == "meta" and accumulator.count.device.type == "meta"


def test_moe_load_balancing_needs_no_host_sync():
    from madsl.lang.stdlib import primitive
    from madsl.layers.moe import MoE

    layer = MoE(primitive("moe", 16, experts=4, active=2)).to("meta")
    logits = torch.randn(10, 4, device="meta")
    aux = layer._load_balancing_loss(logits, logits.topk(2, dim=-1).indices)
    assert aux.shape == () and aux.device.type == "meta"


def test_sincos_positions_are_fixed_and_distinct():
    emb = sincos_position_embedding(32, 16)
    assert emb.shape == (32, 16)
    assert torch.allclose(emb[0, :8], torch.zeros(8)) and torch.allclose(emb[0, 8:], torch.ones(8))
    assert torch.cdist(emb, emb).add(torch.eye(32)).min() > 0.1


# --- the store, rerunning, resuming --------------------------------------------------------


def test_eval_records_epochs_and_rerun_repeats_nothing(tmp_path):
    db = tmp_path / "r.db"
    first = run_toy_eval(db, wd=[0.0, 0.1])
    assert first["complete"] and first["done"] == 2 and first["runs"] == 2
    runs = run_rows(db)
    assert {r["status"] for r in runs} == {"done"}
    epochs = epoch_rows(db)
    for r in runs:
        assert r["epochs_done"] == len([e for e in epochs if e[0] == r["run_id"]]) > 0
        assert r["best_eval_acc"] is not None and r["train_seconds"] > 0
        assert not Path(Store(db).checkpoint_path(r["run_id"])).exists()  # cleaned up once done
    second = run_toy_eval(db, wd=[0.0, 0.1])
    assert second["done"] == 0 and second["already_done"] == 2
    assert epoch_rows(db) == epochs and [r["finished"] for r in run_rows(db)] == [r["finished"] for r in runs]


def test_a_full_disk_while_recording_is_a_clear_error_and_rerunning_loses_and_repeats_nothing(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    real_finish, calls = Store.finish, []

    def full_disk_on_the_second_run(self, run_id, result, device=None, owner=None, threads=None):
        calls.append(run_id)
        if len(calls) == 2:
            raise sqlite3.OperationalError("database or disk is full")
        return real_finish(self, run_id, result, device, owner, threads)

    monkeypatch.setattr(Store, "finish", full_disk_on_the_second_run)
    with pytest.raises(MadslError, match="could not be written: database or disk is full") as info:
        run_toy_eval(db, epochs=2, wd=[0.0, 0.1])
    assert "rerun the same command" in info.value.render()
    monkeypatch.setattr(Store, "finish", real_finish)
    first_done = [r["run_id"] for r in run_rows(db) if r["status"] == "done"]
    assert len(first_done) == 1
    again = run_toy_eval(db, epochs=2, wd=[0.0, 0.1])
    assert again["complete"] and again["done"] == 1 and again["already_done"] == 1
    runs = run_rows(db)
    assert {r["status"] for r in runs} == {"done"} and len(runs) == 2
    epochs = epoch_rows(db)
    assert sorted(e[:2] for e in epochs) == sorted({e[:2] for e in epochs})  # no epoch recorded twice


def test_same_identity_same_run_id_and_new_budget_new_run(tmp_path):
    db = tmp_path / "r.db"
    run_toy_eval(db, epochs=2)
    run_toy_eval(db, epochs=3)
    assert len(run_rows(db)) == 2
    run_toy_eval(db, epochs=2, spec=FakeSpec("renamed", "standin-v1"))  # same model, other name: same run
    assert len(run_rows(db)) == 2


def _uninterrupted(tmp_path, epochs):
    db = tmp_path / "reference.db"
    run_toy_eval(db, epochs=epochs)
    return run_rows(db)[0], epoch_rows(db)


def _same_result(a_run, a_epochs, b_run, b_epochs):
    assert a_run["run_id"] == b_run["run_id"]
    for key in ("best_epoch", "epochs_done", "best_eval_acc", "best_eval_loss", "best_eval_ppl", "max_eval_acc"):
        assert a_run[key] == pytest.approx(b_run[key], rel=1e-6, abs=1e-7), key
    assert len(a_epochs) == len(b_epochs)
    for a_row, b_row in zip(a_epochs, b_epochs):  # approx takes flat sequences only (pytest >= 9.2)
        assert list(a_row[1:]) == pytest.approx(list(b_row[1:]), rel=1e-6, abs=1e-7)


def test_graceful_stop_resumes_to_the_same_result(tmp_path):
    epochs = 6
    reference_run, reference_epochs = _uninterrupted(tmp_path, epochs)

    class StopAfterTwoEpochs(Reporter):
        stop = False

        def epoch(self, job, metrics):
            self.stop = metrics["epoch"] >= 2

    db = tmp_path / "r.db"
    reporter = StopAfterTwoEpochs()
    # the Ctrl-C path: the coordinator asks the run to stop; it checkpoints mid-epoch and becomes pending
    stopped = run_toy_eval(db, epochs=epochs, reporter=reporter, stop=lambda: reporter.stop)
    assert stopped["interrupted"] == 1 and not stopped["complete"]
    run = run_rows(db)[0]
    assert run["status"] == "pending"
    assert Store(db).checkpoint_path(run["run_id"]).exists()
    assert 2 <= len(epoch_rows(db)) < epochs

    resumed = run_toy_eval(db, epochs=epochs)
    assert resumed["done"] == 1 and resumed["complete"]
    run = run_rows(db)[0]
    assert run["attempts"] == 2
    _same_result(reference_run, reference_epochs, run, epoch_rows(db))


def test_a_stop_counts_the_runs_already_done_as_done_not_as_left_to_do(tmp_path):
    db = tmp_path / "r.db"
    run_toy_eval(db, epochs=1, lr=1e-2)
    stopped = run_toy_eval(db, epochs=1, lr=[3e-3, 1e-2], stop=lambda: True)
    assert (stopped["interrupted"], stopped["already_done"]) == (1, 1)
    # nothing left to do: a stop changes nothing (exit status 0, not 130)
    nothing_left = run_toy_eval(db, epochs=1, lr=1e-2, stop=lambda: True)
    assert (nothing_left["interrupted"], nothing_left["already_done"]) == (0, 1) and nothing_left["complete"]


KILL_SCRIPT = """
import sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
import runner_helpers as t
factory = t.PausingFactory(db={db!r}, ready={ready!r}, pause_at={pause_at}, epochs_recorded={paused_epochs})
t.run_toy_eval({db!r}, epochs={epochs}, model_factory=lambda spec: factory, **{extra})
"""


def test_kill_9_resumes_from_checkpoint_to_the_same_result(tmp_path):
    epochs, paused_epochs = 12, 3
    # a checkpoint after every epoch (by default one a minute: this run would have none to resume from)
    extra = {"settings_overrides": {"num_train_examples": 512}, "lr": 3e-4, "checkpoint_every": 0}
    reference_db = tmp_path / "reference.db"
    run_toy_eval(reference_db, epochs=epochs, **extra)
    reference_run, reference_epochs = run_rows(reference_db)[0], epoch_rows(reference_db)
    assert reference_run["epochs_done"] > paused_epochs + 1  # no early stop before the point of the kill

    # Event-driven, no deadline to race: the eval pauses itself at the first step of epoch 4 once the
    # store holds epochs 1-3 and says so in `ready`; only then is it killed.
    db, ready = tmp_path / "r.db", tmp_path / "ready"
    steps_per_epoch = -(-512 // PROTOCOLS["smoke"].batch_size)
    script = KILL_SCRIPT.format(
        tests=str(TESTS_DIR),
        db=str(db),
        ready=str(ready),
        epochs=epochs,
        pause_at=paused_epochs * steps_per_epoch + 1,
        paused_epochs=paused_epochs,
        extra=repr(extra),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=TESTS_DIR.parent, env={**os.environ, "PYTHONPATH": str(TESTS_DIR.parent)}
    )
    try:
        waited = time.monotonic()
        while not ready.exists():
            assert proc.poll() is None, f"the eval ended (status {proc.returncode}) before it paused"
            assert time.monotonic() - waited < 600, "the eval never paused (a safety net, not a deadline)"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    run = run_rows(db)[0]
    assert run["status"] == "running"  # as the dead process left it
    assert len(epoch_rows(db)) == paused_epochs
    checkpoint = Store(db).checkpoint_path(run["run_id"])
    assert load_checkpoint(checkpoint)["epoch"] == paused_epochs

    resumed = run_toy_eval(db, epochs=epochs, **extra)
    assert resumed["done"] == 1
    run = run_rows(db)[0]
    assert run["status"] == "done" and run["attempts"] == 2
    _same_result(reference_run, reference_epochs, run, epoch_rows(db))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_sigterm_stops_runs_as_ctrl_c_does(signum):
    """A batch system stops a job with SIGTERM (SLURM's scancel and time limit, Kubernetes, `timeout`)
    and kills it a grace period later: the first asks the runs to checkpoint and stop, as Ctrl-C
    does, instead of ending the coordinator with runs in flight; the second aborts."""
    from madsl.cli.progress import stop_on_signals as stop_guard

    before = signal.getsignal(signum)
    with stop_guard() as should_stop:
        assert not should_stop()
        os.kill(os.getpid(), signum)
        assert should_stop()  # still alive, asking the runs to stop
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
    assert signal.getsignal(signum) is before


def test_workers_leave_stopping_to_the_coordinator():
    """A signal to the whole process group (Ctrl-C in a terminal, scancel) reaches the workers
    too: they ignore it and stop when the coordinator tells them, after their checkpoint."""
    script = (
        "import os, signal\nfrom madsl.runner.execute.local import _worker_init\n_worker_init(None, None, 1)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\nos.kill(os.getpid(), signal.SIGINT)\nprint('still running')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=TESTS_DIR.parent,
        env={**os.environ, "PYTHONPATH": str(TESTS_DIR.parent)},
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "still running", proc.stderr


def test_a_runs_result_does_not_depend_on_how_many_workers_ran_the_grid(tmp_path):
    """One run on one thread in this process (--workers 1) or in a spawned worker (--workers 2):
    the same losses and accuracies to the bit, so a grid (or a search) may resume on another
    worker count."""
    grid = {"epochs": 2, "wd": [0.0, 0.1], "seed": [0, 1], "threads": 1}
    run_toy_eval(tmp_path / "one.db", workers=1, **grid)
    run_toy_eval(tmp_path / "two.db", workers=2, **grid)
    one, two = epoch_rows(tmp_path / "one.db"), epoch_rows(tmp_path / "two.db")
    assert len(one) == 8 and one == two


def test_process_pool_executor_and_a_killed_worker_fails_its_runs_while_the_others_go_on(tmp_path):
    db = tmp_path / "r.db"
    specs = [FakeSpec("killed", "killed-v1"), FakeSpec("standin", "standin-v1")]

    def factory(spec):
        return KillingFactory() if spec.name == "killed" else StandInFactory()

    summary = evaluate(
        specs,
        tasks=["toy-previous"],
        protocol="smoke",
        db=db,
        epochs=1,
        lr=3e-3,
        wd=[0.0, 0.1],
        workers=2,
        model_factory=factory,
        task_registry=TOY_TASKS,
    )
    runs = run_rows(db)
    # no traceback, no run left "running": the killed worker's runs failed, the others ran in a new pool
    assert sorted((r["spec_name"], r["status"]) for r in runs) == [("killed", "failed")] * 2 + [("standin", "done")] * 2
    assert set(summary["failed"]) == {r["run_id"] for r in runs if r["spec_name"] == "killed"}
    assert all("worker died" in error for error in summary["failed"].values())
    assert summary["done"] == 2 and not summary["complete"]


def test_skip_solved_grid_points(tmp_path):
    db = tmp_path / "r.db"
    # smoke skips the rest of a setting's grid once one grid point reaches 0.999
    summary = run_toy_eval(db, epochs=30, lr=[3e-3, 1e-5], settings_overrides={"num_train_examples": 512})
    statuses = sorted(r["status"] for r in run_rows(db))
    assert statuses == ["done", "skipped"] and summary["skipped"] == 1 and summary["complete"]

    # the skipped grid point was running when its process died (kill -9): the next eval skips it too
    dead = subprocess.Popen(["true"])
    dead.wait()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE runs SET status='running', owner=?, heartbeat=? WHERE status='skipped'",
            (f"{socket.gethostname()}:{dead.pid}", time.time()),
        )
    again = run_toy_eval(db, epochs=30, lr=[3e-3, 1e-5], settings_overrides={"num_train_examples": 512})
    assert sorted(r["status"] for r in run_rows(db)) == ["done", "skipped"] and again["skipped"] == 1


def test_a_run_whose_loss_diverges_is_recorded_and_reported_as_diverged(tmp_path):
    db = tmp_path / "r.db"
    # smoke: 64 training examples in batches of 128, one step per epoch; NaN from epoch 3's step on
    summary = run_toy_eval(db, epochs=6, model_factory=lambda spec: DivergingFactory(at=3))
    assert summary["complete"] and summary["done"] == 1
    run = run_rows(db)[0]
    assert run["status"] == "done" and run["diverged_epoch"] == 3
    assert run["epochs_done"] == 3 and not run["early_stopped"]  # training stops where the loss diverged
    assert run["best_epoch"] <= 2 and run["best_eval_acc"] is not None  # its best finite epoch stands
    diverged_epoch = epoch_rows(db)[-1]
    assert diverged_epoch[1] == 3 and diverged_epoch[2] is None and diverged_epoch[3] is None  # no accuracy
    [task] = [r for r in json.loads(report(db, fmt="json")) if not r["aggregate"]]
    assert task["runs_diverged"] == 1 and task["score"] == pytest.approx(run["best_eval_acc"])
    assert "1/1 (1 diverged)" in report(db)

    # diverged from the first step: no epoch has a result, so the run has no accuracy to score
    db = tmp_path / "first.db"
    run_toy_eval(db, epochs=6, model_factory=lambda spec: DivergingFactory(at=1))
    run = run_rows(db)[0]
    assert run["diverged_epoch"] == 1 and run["best_eval_acc"] is None and run["epochs_done"] == 1
    [task] = [r for r in json.loads(report(db, fmt="json")) if not r["aggregate"]]
    assert task["score"] is None and task["runs_diverged"] == 1 and task["metric"] == "accuracy"


# --- scores and reports ----------------------------------------------------------------------


def _row(spec, task, setting, lr, wd, acc, seed=0, status="done", seconds=1.0, regression=False):
    return {
        "run_id": f"{spec}{task}{setting}{lr}{wd}{seed}",
        "spec_hash": spec,
        "spec_name": spec,
        "task": task,
        "setting": setting,
        "lr": lr,
        "wd": wd,
        "seed": seed,
        "status": status,
        "train_seconds": seconds,
        "best_eval_acc": None if regression else acc,
        "best_eval_ppl": None if regression else 1.0,
        "best_eval_loss": acc,
    }


def test_scores_math():
    rows = [
        _row("a", "t1", "s1", 1e-3, 0.0, 0.5),
        _row("a", "t1", "s1", 1e-4, 0.0, 0.9),
        _row("a", "t1", "s2", 1e-3, 0.0, 0.7),
        _row("a", "t1", "s2", 1e-4, 0.0, 0.3),
        _row("a", "t1", "s2", 5e-4, 0.0, 0.99, status="failed"),  # unfinished runs do not count
        _row("a", "t2", "s1", 1e-3, 0.1, 0.2),
        _row("a", "t2", "s1", 1e-3, 0.1, 0.4, seed=1),
        _row("a", "t3", "s1", 1e-3, 0.0, 0.05, regression=True),  # MSE: not in the MAD score
        _row("b", "t1", "s1", 1e-3, 0.0, 1.0),
    ]
    by_spec = {s.spec: s for s in scoring.spec_scores(rows)}
    a = by_spec["a"]
    assert a.tasks["t1"].score == pytest.approx((0.9 + 0.7) / 2)
    assert a.tasks["t2"].score == pytest.approx((0.2 + 0.4) / 2)  # mean over seeds of the grid best
    assert a.tasks["t3"].metric == "mse" and a.tasks["t3"].score == pytest.approx(0.05)
    assert a.score == pytest.approx(((0.9 + 0.7) / 2 + 0.3) / 2)
    assert a.tasks["t1"].runs_done == 4 and a.tasks["t1"].runs_total == 5
    assert a.tasks["t2"].best_lr == 1e-3 and a.tasks["t2"].best_wd == 0.1
    assert [s.spec for s in scoring.spec_scores(rows)] == ["b", "a"]  # best first


def test_report_json_csv_text(tmp_path):
    db = tmp_path / "r.db"
    run_toy_eval(db, epochs=2, tasks=("toy-previous", "toy-classify"))
    run_toy_eval(db, epochs=2, tasks=("toy-previous",), spec=FakeSpec("other", "standin-v2"))
    records = json.loads(report(db, fmt="json"))
    aggregates = [r for r in records if r["aggregate"]]
    per_task = [r for r in records if not r["aggregate"]]
    assert {r["spec"] for r in aggregates} == {"standin", "other"}
    assert {(r["spec"], r["task"]) for r in per_task} == {
        ("standin", "toy-previous"),
        ("standin", "toy-classify"),
        ("other", "toy-previous"),
    }
    for r in records:
        assert {"spec", "task", "score", "best_lr", "best_wd", "seconds_per_run"} <= set(r)
        assert 0.0 <= r["score"] <= 1.0
    standin = {r["task"]: r["score"] for r in records if r["spec"] == "standin"}
    assert standin["MAD"] == pytest.approx((standin["toy-previous"] + standin["toy-classify"]) / 2)
    rows = list(csv.DictReader(io.StringIO(report(db, fmt="csv"))))
    assert len(rows) == len(records) and float(rows[0]["score"]) == pytest.approx(records[0]["score"])
    text = report(db)
    assert "standin" in text and "toy-previous" in text and "MAD score" not in text and "mean" in text
    assert "MAD leaderboard, protocol" in text  # the protocol in the title; "mean": toy tasks are not the MAD set
    # the runs override the smoke protocol's epochs: they are filed under smoke+custom, not smoke
    assert report(db, protocol="smoke") == (
        f"no runs in {db} are filed under protocol smoke yet (`madsl report` without --protocol shows every run)\n"
    )


def test_report_errors(tmp_path, monkeypatch):
    with pytest.raises(MadslError, match="no results database"):
        report(tmp_path / "missing.db")
    db = tmp_path / "r.db"
    Store(db).close()
    with pytest.raises(MadslError, match="format"):
        report(db, fmt="xml")
    with pytest.raises(MadslError, match="nothing to plot"):
        report(db, plot=tmp_path / "x.png")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if madsl[plot] were not installed
    with pytest.raises(MadslError) as err:
        report(db, plot=tmp_path / "x.png")
    assert "madsl[plot]" in err.value.render()
    assert not (tmp_path / "x.png").exists()


# --- protocols and overrides ---------------------------------------------------------------


def test_protocol_override_precedence():
    tasks = [TOY_TASKS["toy-previous"]]
    quick, smoke = PROTOCOLS["quick"], PROTOCOLS["smoke"]
    assert quick.epochs != 3 and quick.lrs != (1e-3, 1e-4)  # else the precedence below would prove nothing
    protocol_only = build_plan(tasks, Overrides(protocol="quick"))
    assert {r.train.epochs for r in protocol_only.runs} == {quick.epochs}
    spec = overrides_from_spec_eval({"protocol": "smoke", "epochs": 3, "lr": [1e-3, 1e-4], "set": {"seq_len": 24}})
    cli = Overrides(epochs=5, settings={"seq_len": 20})
    assert [r.train.epochs for r in build_plan(tasks, spec.over(Overrides(protocol="quick"))).runs] == [3, 3]
    plan = build_plan(tasks, cli.over(spec.over(Overrides(protocol="quick"))))
    assert plan.protocol.name == "smoke"  # from the spec
    assert {r.train.epochs for r in plan.runs} == {5}  # CLI > spec > protocol
    assert sorted(r.train.lr for r in plan.runs) == [1e-4, 1e-3]  # spec > protocol
    assert {r.settings["seq_len"] for r in plan.runs} == {20}  # CLI --set > spec eval.set
    assert {r.settings["num_train_examples"] for r in plan.runs} == {smoke.task_settings["*"]["num_train_examples"]}
    # the paper protocol is MAD Table B.1 (what users compare against): its grid and epochs are pinned
    paper = build_plan(tasks, Overrides(protocol="paper"))
    assert len(paper.runs) == 2 * 6 and {r.train.epochs for r in paper.runs} == {200}
    assert {(r.train.lr, r.train.wd) for r in paper.runs} == {(a, b) for a in (1e-4, 5e-4, 1e-3) for b in (0.0, 0.1)}
    collapsed = build_plan(tasks, Overrides(protocol="paper", settings={"seq_len": 16}))
    assert len(collapsed.runs) == 6  # the two sweep points became one setting


def test_runs_with_overrides_of_their_own_are_filed_under_a_custom_label(tmp_path, capsys):
    from madsl.cli import main

    tasks = [TOY_TASKS["toy-previous"]]

    def labels(overrides):
        return {r.label for r in build_plan(tasks, overrides).runs}

    assert labels(Overrides(protocol="smoke")) == {"smoke"}
    # knobs that leave the protocol's runs as they are: still its runs
    assert labels(
        Overrides(
            protocol="smoke",
            lrs=PROTOCOLS["smoke"].lrs,
            eval_lengths=(8,),
            conventions="mad-lab",
            tasks=("toy-previous",),
        )
    ) == {"smoke"}
    for changed in (
        Overrides(protocol="smoke", epochs=1),
        Overrides(protocol="smoke", lrs=(3e-3,)),
        Overrides(protocol="smoke", settings={"seq_len": 24}),
        Overrides(protocol="smoke", seeds=(1,)),
        Overrides(protocol="smoke", freeze=("embedding",)),
    ):
        assert labels(changed) == {"smoke+custom"}, changed
    # a part of the protocol's own grid is still its runs
    paper = build_plan(tasks, Overrides(protocol="paper", lrs=(1e-3,)))
    assert {r.label for r in paper.runs} == {"paper"}

    db = tmp_path / "r.db"
    own = run_toy_eval(db, epochs=2, lr=1e-3)  # the smoke protocol's own epochs and lr
    custom = run_toy_eval(db, epochs=1, lr=1e-3)
    store = Store(db, create=False)
    stored = store.labels()
    store.close()
    assert {stored[r][0] for r in own["run_ids"]} == {"smoke"}
    assert {stored[r][0] for r in custom["run_ids"]} == {"smoke+custom"}
    assert set(own["run_ids"]).isdisjoint(custom["run_ids"])
    by_protocol = {r["protocol"] for r in json.loads(report(db, fmt="json"))}
    assert by_protocol == {"smoke", "smoke+custom"}
    assert {r["protocol"] for r in json.loads(report(db, fmt="json", protocol="smoke+custom"))} == {"smoke+custom"}
    assert "[smoke+custom]" in report(db) and "[smoke]" in report(db)
    assert main(["report", "--db", str(db), "--protocol", "smoke+custm"]) == 2
    err = capsys.readouterr().err
    assert "smoke+custom" in err and "Traceback" not in err


def test_bad_overrides_are_located_errors():
    tasks = [TOY_TASKS["toy-previous"], TOY_TASKS["toy-classify"]]
    with pytest.raises(MadslError) as err:
        build_plan(tasks, Overrides(settings={"seq_lne": 32}))
    assert "did you mean 'seq_len'" in err.value.render()
    with pytest.raises(MadslError, match="must be an integer"):
        build_plan(tasks, Overrides(settings={"seq_len": "long"}))
    with pytest.raises(MadslError) as err:
        build_plan(tasks, Overrides(settings={"toy-previus.seq_len": 32}))
    assert "did you mean 'toy-previous'" in err.value.render()
    with pytest.raises(MadslError) as err:
        resolve_task_names(["toy-previos"], ["toy-previous"], TOY_TASKS)
    assert "did you mean 'toy-previous'" in err.value.render()
    with pytest.raises(MadslError) as err:
        overrides_from_spec_eval({"epoch": 3}, "x.mad")
    assert "did you mean 'epochs'" in err.value.render() and "x.mad" in err.value.render()
    with pytest.raises(MadslError, match="unknown protocol"):
        build_plan(tasks, Overrides(protocol="quik"))
    assert parse_set_option("seq_len=512") == ("seq_len", 512)
    assert parse_set_option("frac_noise=0.4") == ("frac_noise", 0.4)
    with pytest.raises(MadslError):
        parse_set_option("seq_len")


def test_cli_bad_input_exits_2(tmp_path, capsys):
    from madsl.cli import main

    assert main(["eval", str(tmp_path / "missing.mad"), "--db", str(tmp_path / "r.db")]) == 2
    assert "no such spec file" in capsys.readouterr().err
    assert main(["eval", "x.mad", "--set", "seq_len", "--db", str(tmp_path / "r.db")]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["report", "--db", str(tmp_path / "missing.db")]) == 2


@pytest.mark.parametrize(
    "option", [["--lr", "nan"], ["--wd", "nan"], ["--lr", "inf"], ["--wd", "Infinity"], ["--lr", "1e400"]]
)
def test_non_finite_learning_rates_and_weight_decays_are_bad_input(tmp_path, capsys, option):
    from madsl.cli import main

    spec = str(TESTS_DIR.parent / "specs" / "paper" / "hyena-sg.mad")
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error
        main(["eval", spec, "--task", "memorization", *option, "--db", str(tmp_path / "r.db")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "finite" in err and "Traceback" not in err
    assert not (tmp_path / "r.db").exists()
    with pytest.raises(MadslError, match="finite"):  # the same through the API and a spec's eval: section
        run_toy_eval(tmp_path / "r.db", **{option[0][2:]: float(option[1])})
    assert not (tmp_path / "r.db").exists()
    with pytest.raises(MadslError, match=f"eval.{option[0][2:]}"):
        overrides_from_spec_eval({option[0][2:]: float(option[1])}, "x.mad")


def test_spec_identity_covers_what_changes_the_model(tmp_path):
    from madsl.spec import load_spec

    paper = TESTS_DIR.parent / "specs" / "paper"
    base = load_spec(paper / "hyena-sg.mad")
    (tmp_path / "renamed.mad").write_text("extends: bundled:paper/hyena-sg\nname: renamed\neval: {protocol: smoke}\n")
    (tmp_path / "order3.mad").write_text("extends: bundled:paper/hyena-sg\nname: order3\nlayers: {H: {order: 3}}\n")
    (tmp_path / "wide.mad").write_text("extends: bundled:paper/hyena-sg\nname: wide\ndim: 256\n")
    assert load_spec(tmp_path / "renamed.mad").identity_text == base.identity_text
    assert load_spec(tmp_path / "order3.mad").identity_text != base.identity_text
    assert load_spec(tmp_path / "wide.mad").identity_text != base.identity_text
    assert load_spec(paper / "mh-hyena-sg.mad").identity_text != base.identity_text


def test_spec_identity_ignores_symbols_the_model_does_not_use(tmp_path):
    from madsl.spec import load_spec

    paper = TESTS_DIR.parent / "specs" / "paper"
    mamba = load_spec(paper / "mamba.mad")  # Mamba mixes channels itself: no Sg anywhere
    assert mamba.symbols_used() == ["Mb"]
    (tmp_path / "sg.mad").write_text("extends: bundled:paper/mamba\nlayers: {Sg: {inner: 64}}\n")
    (tmp_path / "mb.mad").write_text("extends: bundled:paper/mamba\nlayers: {Mb: {d_state: 8}}\n")
    assert load_spec(tmp_path / "sg.mad").identity() == mamba.identity()
    assert load_spec(tmp_path / "mb.mad").identity() != mamba.identity()
    assert load_spec(paper / "hyena-sg.mad").symbols_used() == ["H", "Sg"]


def test_eval_lengths_are_recorded_reported_and_out_of_memory_is_a_result(tmp_path):
    db = tmp_path / "r.db"
    too_long = 1 << 40  # 64 test rows x 2**40 tokens: numpy cannot allocate it
    summary = run_toy_eval(
        db,
        epochs=8,
        eval_lengths=(8, 16, 32, too_long),
        settings_overrides={"num_train_examples": 256, "num_test_examples": 64},
    )
    assert summary["complete"]
    records = json.loads(report(db, fmt="json"))
    task = next(r for r in records if r["task"] == "toy-previous")
    by_length = {ev["length"]: ev for ev in task["length_evals"]}
    assert sorted(by_length) == [8, 16, 32, too_long]
    assert by_length[too_long]["status"] == "oom" and by_length[too_long]["acc"] is None
    # at the training length the best checkpoint on the same test set scores what the run scored
    assert by_length[16]["macro_acc"] == pytest.approx(task["score"])
    assert all(0.0 <= by_length[n]["acc"] <= 1.0 and by_length[n]["status"] == "ok" for n in (8, 16, 32))
    assert all(ev["setting"]["seq_len"] == 16 for ev in task["length_evals"])
    text = report(db)
    assert "length extrapolation" in text and "OOM" in text and "2^40" in text
    header = next(line for line in text.splitlines() if "trained at" in line)
    assert header.index(" 8 ") < header.index(" 16 ") < header.index(" 32 ") < header.index("2^40")
    row = next(line for line in text.splitlines() if "toy-previous" in line and "OOM" in line)
    assert f"{by_length[32]['acc']:.3f}" in row
    csv_text = report(db, fmt="csv")
    assert '""status"": ""oom""' in csv_text


def test_length_evaluations_stop_cleanly_and_resume_without_redoing_a_length(tmp_path):
    from madsl.runner.train.loop import RunInterrupted, TrainHooks

    task = TOY_TASKS["toy-previous"]
    settings = dict(task.baseline)
    train, test = task.generate(settings, "train", 0), task.generate(settings, "test", 0)
    cfg = TrainSettings(
        lr=3e-3, wd=0.0, epochs=2, batch_size=32, seed=0, min_lr=1e-6, early_stop_acc=0.999, eval_lengths=(8, 24, 40)
    )
    drawn: list[int] = []

    def length_data(length):
        drawn.append(length)
        return task.generate({**settings, "seq_len": length}, "test", 0)

    def run(hooks=None, checkpoint=None):
        return train_run(
            cfg,
            lambda: TaskModel(StandInModel(8, 64), "lm"),
            train,
            test,
            num_classes=8,
            checkpoint_path=checkpoint,
            hooks=hooks,
            length_data=length_data,
        )

    uninterrupted = run()
    assert [ev["length"] for ev in uninterrupted.length_evals] == [8, 24, 40]
    drawn.clear()
    started: list[int] = []
    hooks = TrainHooks(
        on_length=lambda length, index, count: started.append(length), should_stop=lambda: len(started) == 2
    )  # a Ctrl-C while length 24 is evaluated
    checkpoint = tmp_path / "run.pt"
    with pytest.raises(RunInterrupted, match="length 40"):
        run(hooks, checkpoint)
    assert drawn == [8, 24]
    drawn.clear()
    resumed = run(TrainHooks(), checkpoint)
    assert drawn == [40]  # neither training nor the lengths already done are repeated
    assert [(ev["length"], ev["acc"]) for ev in resumed.length_evals] == [
        (ev["length"], ev["acc"]) for ev in uninterrupted.length_evals
    ]


def test_eval_lengths_are_checked_against_the_task_before_anything_runs(tmp_path, capsys):
    from madsl.cli import main

    spec = str(TESTS_DIR.parent / "specs" / "paper" / "hyena-sg.mad")
    db = tmp_path / "r.db"
    assert (
        main(
            [
                "eval",
                spec,
                "--task",
                "arithmetic",
                "--protocol",
                "smoke",
                "--eval-lengths",
                "8",
                "--db",
                str(db),
                "--quiet",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "'arithmetic' has no seq_len" in err and "Traceback" not in err
    assert (
        main(
            [
                "eval",
                spec,
                "--task",
                "induction-heads",
                "--protocol",
                "smoke",
                "--eval-lengths",
                "2,64",
                "--db",
                str(db),
                "--quiet",
            ]
        )
        == 2
    )
    assert "length 2 is not a valid induction-heads setting" in capsys.readouterr().err
    assert (
        not sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE name='runs'").fetchone()
        or not sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    )


def test_eval_section_errors_point_at_the_line_and_column_in_the_spec(tmp_path, capsys):
    from madsl.cli import main

    cases = {
        "lr: abc": ("eval.lr", 3, 7),
        "lrr: 1": ("unknown key 'lrr'", 3, 3),
        "eval_lengths: [64, -5]": ("length -5 is not a valid", 3, 17),
    }
    for body, (message, line, column) in cases.items():
        spec = tmp_path / "bad.mad"
        spec.write_text(f"extends: bundled:induction/mamba\neval:\n  {body}\n")
        assert main(["eval", str(spec), "--db", str(tmp_path / "r.db"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and f"{spec}:{line}:{column}" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "body,message,column",
    [
        ("protocol: nope", "unknown protocol 'nope'", 13),
        ("epochs: 0", "an integer at least 1, got 0", 11),
        ("lr: [1e-3, -1]", "a positive number, got -1", 14),
        ("lr: .nan", "not a finite number", 7),
        ("wd: -0.1", "eval.wd", 7),
        ("batch_size: 0", "eval.batch_size", 15),
        ("tasks: 5", "expected task names", 10),
        ("tasks: [compression, nope]", "unknown task 'nope'", 24),
        ("seed: -1", "eval.seed", 9),
        ("epochs: [1, 2]", "expected an integer, got [1, 2]", 11),
        ("set: {seq_len: x}", "must be an integer", 18),
        ("set: {nope: 3}", "no setting 'nope'", 9),
        ("set: 3", "eval.set", 8),
        ("set: {seq_len: }", "eval.set.seq_len", 17),
        ("freeze: [Q]", "nothing named 'Q' to freeze", 11),
        ("freeze: 3", "eval.freeze", 11),
    ],
)
def test_every_bad_value_in_an_eval_section_is_located_in_the_spec(tmp_path, body, message, column):
    from madsl.runner.plan.evaluation import plan_spec
    from madsl.spec import load_spec

    path = tmp_path / "bad.mad"
    path.write_text(f"name: x\ndim: 64\ntopology: H:A\neval:\n  {body}\n")
    with pytest.raises(MadslError) as info:
        plan_spec(load_spec(path), str(path))
    err = info.value
    assert message in err.message, err.render()
    assert (err.location.file, err.location.line, err.location.column) == (str(path), 5, column), err.render()
    assert "^" in err.render()


@pytest.mark.parametrize("kind, per_batch", [("classes", False), ("classes", True), ("regression", False)])
def test_a_groups_metric_increments_are_its_members(kind, per_batch):
    """metric_increments over a group axis (a stacked grid group's batch) gives each member
    exactly what its own batch gives alone: one definition for both."""
    from madsl.runner.train.metrics import IGNORE, metric_increments

    generator = torch.Generator().manual_seed(0)
    members, rows, length, classes = 3, 4, 9, 8
    outputs = torch.randn(members, rows, length, classes, generator=generator)
    if kind == "regression":
        outputs, targets = outputs[..., 0], torch.randn(members, rows, length, generator=generator)
        targets[targets > 1.0] = float("nan")  # unscored positions
    else:
        targets = torch.randint(0, classes + 2, (members, rows, length), generator=generator)  # some past the classes
        targets[:, :, :3] = IGNORE
    loss_sums = torch.rand(members, generator=generator)
    grouped = metric_increments(kind, classes, per_batch, outputs, targets, loss_sums)
    for m in range(members):
        alone = metric_increments(
            kind, classes, per_batch, outputs[m : m + 1], targets[m : m + 1], loss_sums[m : m + 1]
        )
        assert grouped.keys() == alone.keys()
        for key in grouped:
            assert torch.equal(grouped[key][m], alone[key][0]), key
    if kind == "classes":  # the counts are real: scored positions are those not IGNOREd
        assert grouped["count"].tolist() == [(t != IGNORE).sum().item() for t in targets]


def test_a_run_records_its_thread_count_and_a_resume_with_another_says_so(tmp_path):
    """Results depend on torch's thread count (CPU sums split by it), which is not part of a run's
    identity: the run records it, and a run resumed with another count than its checkpoint's warns."""
    import warnings

    from runner_helpers import StandInModel

    from madsl.runner.plan.runs import TrainSettings
    from madsl.runner.train.state import RunState

    db = tmp_path / "r.db"
    run_toy_eval(db, epochs=1)
    assert run_rows(db)[0]["threads"] == torch.get_num_threads()

    settings = TrainSettings(lr=1e-3, wd=0.0, epochs=2, batch_size=8, seed=0, min_lr=1e-6, early_stop_acc=0.999)

    def build():
        return TaskModel(StandInModel(8, 16), "lm")

    saved = RunState.start(settings, build, torch.device("cpu"), 16, 8).to_checkpoint()
    assert saved["threads"] == torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RunState.start(settings, build, torch.device("cpu"), 16, 8).restore(saved)  # same count: silent
    saved["threads"] = torch.get_num_threads() + 1
    with pytest.warns(RuntimeWarning, match=r"resumes with \d+ torch thread\(s\); its first 0 epoch\(s\) trained with"):
        RunState.start(settings, build, torch.device("cpu"), 16, 8).restore(saved)
