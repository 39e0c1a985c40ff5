"""Training options (madsl.runner.train.options): optimizer, schedule, accuracy metric, stopping rule.

Each behaves as documented on the stand-in model, leaves existing run identities alone
at its default, and is a located error (exit 2) when its value is bad.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from runner_helpers import TOY_TASKS, StandInModel

from madsl.errors import MadslError
from madsl.runner.plan.overrides import overrides_from_spec_eval
from madsl.runner.plan.runs import TrainSettings
from madsl.runner.store.results import RunIdentity
from madsl.runner.train.heads import TaskModel
from madsl.runner.train.loop import train_run
from madsl.runner.train.metrics import EpochMetrics
from madsl.runner.train.options import stale_epochs, train_config_identity
from madsl.runner.train.state import RunState

torch.set_num_threads(1)

BASE = TrainSettings(lr=3e-3, wd=0.1, epochs=3, batch_size=32, seed=0, min_lr=1e-6, early_stop_acc=0.999)


def _toy(settings: TrainSettings, name: str = "toy-previous"):
    task = TOY_TASKS[name]
    s = dict(task.baseline)
    train, test = task.generate(s, "train", 0), task.generate(s, "test", 0)

    def build():
        return TaskModel(StandInModel(task.vocab_size(s), 16), task.head, num_classes=task.num_classes(s))

    return train_run(settings, build, train, test, num_classes=task.num_classes(s))


def _state(settings: TrainSettings) -> RunState:
    task = TOY_TASKS["toy-previous"]
    s = dict(task.baseline)
    return RunState.start(
        settings,
        lambda: TaskModel(StandInModel(task.vocab_size(s), 16), task.head, num_classes=task.num_classes(s)),
        torch.device("cpu"),
        64,
        task.num_classes(s),
    )


def _epoch(n: int, eval_loss: float, acc: float = 0.5, macro: float = 0.5) -> EpochMetrics:
    return EpochMetrics(
        epoch=n,
        lr=1e-3,
        seconds=0.0,
        train_loss=1.0,
        train_ppl=None,
        train_acc=None,
        train_macro_acc=None,
        eval_loss=eval_loss,
        eval_ppl=None,
        eval_acc=acc,
        eval_macro_acc=macro,
    )


def test_defaults_keep_run_identities_and_each_option_makes_another_run():
    before = {
        "lr": 1e-3,
        "wd": 0.0,
        "epochs": 2,
        "batch_size": 128,
        "seed": 0,
        "min_lr": 1e-5,
        "early_stop_acc": 0.99,
        "eval_lengths": (),
        "freeze": (),
    }
    default_id = RunIdentity("s", "t", {}, before, "v").run_id
    settings = TrainSettings(**before)
    assert RunIdentity("s", "t", {}, train_config_identity(vars(settings)), "v").run_id == default_id
    ids = {default_id}
    for change in (
        {"optimizer": "adam"},
        {"schedule": "constant"},
        {"metric": "token"},
        {"stop_acc": 0.99},
        {"patience": 4},
        {"min_delta": 0.001},
    ):
        config = train_config_identity(vars(dataclasses.replace(settings, **change)))
        assert set(change) <= set(config)
        ids.add(RunIdentity("s", "t", {}, config, "v").run_id)
    assert len(ids) == 7


def test_adam_is_plain_torch_adam_with_coupled_decay():
    state = _state(dataclasses.replace(BASE, optimizer="adam"))
    assert type(state.optimizer) is torch.optim.Adam
    assert state.optimizer.defaults["betas"] == (0.9, 0.999)
    assert [g["weight_decay"] for g in state.optimizer.param_groups] == [0.1, 0.0]  # matrices only, as AdamW
    # coupled: one step from a zero gradient still moves a decayed weight by lr * sign (Adam normalises wd * p)
    p = state.optimizer.param_groups[0]["params"][0]
    before = p.detach().clone()
    for q in state.model.parameters():
        q.grad = torch.zeros_like(q)
    state.optimizer.step()
    moved = (before - p.detach()).abs()
    assert torch.allclose(moved[before.abs() > 1e-3], torch.full_like(moved[before.abs() > 1e-3], 3e-3), rtol=1e-3)
    assert type(_state(BASE).optimizer) is torch.optim.AdamW


def test_constant_schedule_keeps_the_learning_rate():
    constant = _toy(dataclasses.replace(BASE, schedule="constant", epochs=2))
    assert [h.lr for h in constant.history] == [3e-3, 3e-3]
    cosine = _toy(dataclasses.replace(BASE, epochs=2))
    assert cosine.history[0].lr < 3e-3 and cosine.history[-1].lr == pytest.approx(1e-6)


def test_stop_acc_reads_the_chosen_metric_strictly():
    state = _state(dataclasses.replace(BASE, stop_acc=0.9, metric="token", epochs=10))
    state.end_epoch(_epoch(1, 1.0, acc=0.9, macro=0.95))
    assert not state.finished  # 0.9 does not exceed 0.9; the macro accuracy is not read
    state.end_epoch(_epoch(2, 0.9, acc=0.91, macro=0.2))
    assert state.finished
    macro = _state(dataclasses.replace(BASE, stop_acc=0.9, epochs=10))
    macro.end_epoch(_epoch(1, 1.0, acc=0.99, macro=0.5))
    assert not macro.finished


def test_patience_stops_after_epochs_without_improvement():
    assert stale_epochs([1.0, 0.9995, 0.9991, 0.99, 0.995], 0.001) == 1
    assert stale_epochs([1.0, 0.9995, 0.9991, 0.9990], 0.001) == 3
    assert stale_epochs([float("nan"), 1.0], 0.0) == 0
    state = _state(dataclasses.replace(BASE, patience=2, min_delta=0.01, epochs=10))
    for n, loss in enumerate([1.0, 0.5, 0.495, 0.6], start=1):
        assert not state.finished
        state.end_epoch(_epoch(n, loss))
    assert state.finished and len(state.history) == 4
    # a real run: with patience 1 and a huge min_delta, the second epoch never improves enough
    result = _toy(dataclasses.replace(BASE, patience=1, min_delta=100.0, epochs=5))
    assert result.epochs_done == 2 and result.early_stopped


def test_spec_eval_section_takes_the_options():
    out = overrides_from_spec_eval(
        {
            "optimizer": "adam",
            "schedule": "constant",
            "metric": "token",
            "stop_acc": 0.99,
            "patience": 4,
            "min_delta": 1e-3,
        }
    )
    assert (out.optimizer, out.schedule, out.metric, out.stop_acc, out.patience, out.min_delta) == (
        "adam",
        "constant",
        "token",
        0.99,
        4,
        0.001,
    )


@pytest.mark.parametrize(
    "key, value",
    [
        ("optimizer", "sgd"),
        ("schedule", "linear"),
        ("metric", "f1"),
        ("stop_acc", 1.5),
        ("patience", 0),
        ("min_delta", -1),
    ],
)
def test_bad_option_in_a_spec_is_a_located_error(tmp_path, key, value):
    from tests.test_cli import madsl

    spec = tmp_path / "s.mad"
    spec.write_text(f"name: s\ntopology: H:Sg\ndim: 32\neval:\n  protocol: smoke\n  {key}: {value}\n")
    proc = madsl("eval", str(spec), "--db", str(tmp_path / "r.db"), check_rc=2)
    assert f"s.mad:6:{len(key) + 5}" in proc.stderr and f"eval.{key}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_option_on_the_command_line_is_exit_2(tmp_path):
    from tests.test_cli import madsl

    for args in (["--optimizer", "sgd"], ["--patience", "0"], ["--stop-acc", "2"]):
        proc = madsl("eval", "specs/paper/hyena-sg.mad", *args, "--db", str(tmp_path / "r.db"), check_rc=2)
        assert "Traceback" not in proc.stderr and args[1] in proc.stderr
    with pytest.raises(MadslError, match="unknown schedule"):
        from madsl.runner.plan.evaluation import cli_overrides

        cli_overrides(schedule="linear")


def test_options_that_change_nothing_plan_the_runs_they_equal():
    """`lm_head: spec` under the madsl conventions is their own head: the same runs, the same
    run ids, filed under the protocol; under mad-lab it is another head, other runs."""
    from madsl.runner.plan.overrides import Overrides
    from madsl.runner.plan.runs import build_plan
    from madsl.tasks import get_task

    tasks = [get_task("in-context-recall")]
    for conventions, same in (("madsl", True), ("mad-lab", False)):
        default = build_plan(tasks, Overrides(protocol="baseline", conventions=conventions))
        spec_head = build_plan(tasks, Overrides(protocol="baseline", conventions=conventions, lm_head="spec"))
        assert ([r.train for r in spec_head.runs] == [r.train for r in default.runs]) is same
        assert {r.label for r in spec_head.runs} == ({"baseline"} if same else {"baseline+custom"})


def test_min_delta_without_patience_is_an_error_not_a_new_run(tmp_path):
    """min_delta only says what counts as an improvement for patience: alone it would train the
    default runs under new run ids."""
    from madsl.runner.plan.overrides import Overrides
    from madsl.runner.plan.runs import build_plan
    from madsl.tasks import get_task
    from tests.test_cli import madsl

    tasks = [get_task("in-context-recall")]
    with pytest.raises(MadslError, match="min_delta 0.001 has no effect without patience"):
        build_plan(tasks, Overrides(protocol="baseline", min_delta=0.001))
    assert (
        build_plan(tasks, Overrides(protocol="baseline", min_delta=0.0)).runs
        == build_plan(tasks, Overrides(protocol="baseline")).runs
    )
    assert (
        build_plan(tasks, Overrides(protocol="baseline", patience=3, min_delta=0.001)).runs[0].train.min_delta == 0.001
    )
    proc = madsl("eval", "specs/paper/hyena-sg.mad", "--min-delta", "0.001", "--db", str(tmp_path / "r.db"), check_rc=2)
    assert "no effect without patience" in proc.stderr and "--patience" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r.db").exists()
