"""`--conventions mad-lab|madsl`: the reference implementation's task layouts, metric and
training details next to madsl's own, pinned by the rules the reference's code states
(github athms/mad-lab, mad/data/instances.py, mad/model/pl_model_wrapper.py, train.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from madsl.cli import main
from madsl.conventions import check_conventions
from madsl.errors import MadslError
from madsl.runner.plan.overrides import Overrides, overrides_from_spec_eval
from madsl.runner.plan.runs import TrainSettings, build_plan
from madsl.runner.train.heads import TaskModel
from madsl.runner.train.metrics import MetricAccumulator, evaluate
from madsl.runner.train.optim import build_optimizer
from madsl.runner.train.precision import train_config_identity
from madsl.runner.train.state import RunState
from madsl.tasks import IGNORE, MAD_TASKS, get_task
from tests.runner_helpers import FakeSpec, StandInModel, run_rows, run_toy_eval

SMALL = {"num_train_examples": 200, "num_test_examples": 100}


def data(name: str, conventions: str, split: str = "test", **settings):
    task = get_task(name, conventions)
    return task, task.generate({**SMALL, **settings}, split, 3)


def test_every_mad_task_has_a_mad_lab_variant_with_the_same_settings():
    for name in MAD_TASKS:
        ours, theirs = get_task(name), get_task(name, "mad-lab")
        assert theirs is not ours and theirs.name == name and theirs.conventions == "mad-lab"
        assert theirs.baseline == ours.baseline and theirs.sweep == ours.sweep
    assert get_task("induction-heads", "mad-lab") is get_task("induction-heads")  # no variant: the same task


@pytest.mark.parametrize("name", ["in-context-recall", "noisy-in-context-recall"])
def test_mad_lab_recall_slots_keys_at_even_positions_and_a_repeated_key_last(name):
    task, test = data(name, "mad-lab")
    _, train = data(name, "mad-lab", "train")
    vocab = task.vocab(task.settings())
    keys, values, noise = (vocab.block(b) for b in ("keys", "values", "noise"))
    x = test.inputs
    assert x.shape[1] == 127  # seq_len - 1: the stream of seq_len // 2 slots without its last token
    is_key = (x >= keys.start) & (x < keys.stop)
    is_value = (x >= values.start) & (x < values.stop)
    assert is_key[:, 0::2].sum() + (x[:, 0::2] >= noise.start).sum() == x[:, 0::2].size  # keys or noise only
    assert not is_key[:, 1::2].any() and not is_value[:, 0::2].any()  # keys at even, values at odd positions
    if noise.size:  # noise fills whole slots: both tokens of a slot or neither
        slots = x[:, :126].reshape(len(x), 63, 2) >= noise.start
        assert (slots[..., 0] == slots[..., 1]).all() and slots.any()
    # the last input is a key shown earlier in a pair; its value is the last target, always scored
    last = x[:, -1]
    assert is_key[:, -1].all()
    assert all(last[i] in x[i, :-1][is_key[i, :-1]] for i in range(len(x)))
    assert (test.targets[:, -1] != IGNORE).all()
    for i in range(len(x)):  # ... and that value is the one the key had in its earlier pair
        earlier = np.flatnonzero(x[i, :-1] == last[i])[0]
        assert test.targets[i, -1] == x[i, earlier + 1]
    assert np.array_equal(train.inputs[:, 1:], train.targets[:, :-1])  # next-token training


def test_noise_conventions_differ_as_stated():
    _, ours = data("noisy-in-context-recall", "madsl", "train")
    noise_start = (
        get_task("noisy-in-context-recall").vocab(get_task("noisy-in-context-recall").settings()).start("noise")
    )
    # madsl: exactly round(0.2 * 129) = 26 single noise tokens per sequence (of its 129-token stream)
    stream = np.concatenate([ours.inputs, ours.targets[:, -1:]], axis=1)
    assert ours.inputs.shape[1] == 128
    assert set((stream >= noise_start).sum(1).tolist()) <= {25, 26}  # (one may fall past the truncated end)
    # mad-lab: a binomial number of 2-token chunks (mean 0.2 * 62 + ... ~ 12 slots), never a single token
    _, theirs = data("noisy-in-context-recall", "mad-lab")
    counts = (theirs.inputs >= noise_start).sum(1)
    assert (counts % 2 == 0).all() and 20 < counts.mean() < 30 and counts.std() > 2


def test_mad_lab_selective_copying_one_copy_token_after_the_last_data_token():
    task, test = data("selective-copying", "mad-lab")
    vocab = task.vocab(task.settings())
    assert vocab.size == 16 and vocab.block("data").size == 14  # vocab_size counts blank and copy token
    copy, blank = vocab.token("copy"), vocab.token("blank")
    x, y = test.inputs, test.targets
    assert ((x == copy).sum(1) == 1).all() and (x[:, 256 - 16 - 1] == copy).all()
    assert (x[:, 256 - 16 - 2] < 14).all()  # the last data token sits right before the copy token
    assert (x[:, -16:] == blank).all()  # the model answers at blanks
    assert ((x < 14).sum(1) == 16).all()
    scored = y != IGNORE
    assert scored[:, -16:].all() and not scored[:, :-16].any() and scored.mean() == 16 / 256
    assert np.array_equal(y[:, -16:], x[:, :-17][x[:, :-17] < 14].reshape(len(x), 16))  # in order
    # madsl: 16 data tokens, no copy token, insert tokens as the last 16 inputs
    ours_task, ours = data("selective-copying", "madsl")
    ours_vocab = ours_task.vocab(ours_task.settings())
    assert ours_vocab.block("data").size == 16 and "copy" not in ours_vocab.layout()
    assert (ours.inputs[:, -16:] == ours_vocab.token("insert")).all()


def test_mad_lab_compression_reconstructs_every_position_with_15_data_tokens():
    task, test = data("compression", "mad-lab")
    vocab = task.vocab(task.settings())
    assert vocab.size == 16 and vocab.block("tokens").size == 15 and vocab.token("compress") == 15
    assert np.array_equal(test.inputs, test.targets) and (test.inputs[:, -1] == 15).all()
    assert (test.inputs[:, :-1] < 15).all()
    _, ours = data("compression", "madsl")
    assert ours.targets.shape[1] == 31 and get_task("compression").vocab_size(get_task("compression").baseline) == 17


def test_mad_lab_fuzzy_recall_fits_keys_values_and_pad_in_vocab_size():
    task, test = data("fuzzy-in-context-recall", "mad-lab")
    vocab = task.vocab(task.settings())
    assert vocab.size == 16 and vocab.layout() == {"keys": [0, 7], "values": [7, 15], "pad": [15, 16]}
    x, y = test.inputs, test.targets
    assert x.shape[1] == 128 and x.max() < 16
    pad = x == 15
    assert pad[:, :2].all()  # left-padded: at least 2 pad tokens (the loop stops short of seq_len)
    assert (np.diff(pad.astype(int), axis=1) <= 0).all()  # pads only at the front
    assert ((y != IGNORE).sum(1) >= 1).all() and (y[:, -1] != IGNORE).all()  # the final probe's value is scored
    values_scored = y[y != IGNORE]
    assert ((values_scored >= 7) & (values_scored < 15)).all()


def test_mad_lab_memorization_keys_and_facts():
    task, test = data("memorization", "mad-lab", num_train_examples=256)
    vocab = task.vocab(task.settings())
    assert vocab.layout() == {"keys": [0, 127], "values": [127, 255], "insert": [255, 256]}
    facts = test.meta["facts"]
    assert len(facts) == 127 and len(set(facts.tolist())) == 127 and facts.min() >= 127 and facts.max() < 255
    assert (test.inputs[:, 1::2] == 255).all() and np.array_equal(test.targets[:, 1::2], facts[test.inputs[:, 0::2]])


# --- the metric ------------------------------------------------------------------------------


class FixedLogits(torch.nn.Module):
    """Outputs given logits row by row (a stand-in for a trained model)."""

    kind = "classes"

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits[x[:, 0]]


def test_mad_lab_accuracy_is_the_batch_weighted_mean_of_per_batch_macro_accuracies():
    # three rows, batches of 2 and 1; classes 0..2; row i's input starts with i (selects its logits)
    targets = torch.tensor([[0, 1], [0, IGNORE], [2, 2]])
    predictions = torch.tensor([[0, 0], [1, 0], [2, 1]])
    logits = torch.nn.functional.one_hot(predictions, 3).float()
    inputs = torch.tensor([[0, 0], [1, 0], [2, 0]])
    model = FixedLogits(logits)
    # batch 1 (rows 0, 1): class 0: 1 hit of 2, class 1: 0 of 1 -> macro 0.25 (class 1 predicted too: counted)
    # batch 2 (row 2): class 2: 1 of 2; class 1 only predicted -> 0 -> macro 0.25
    # reference: (2 * 0.25 + 1 * 0.25) / 3 = 0.25; over the whole set: classes 0: 1/2, 1: 0/1, 2: 1/2 -> 1/3
    theirs = evaluate(model, inputs, targets, batch_size=2, num_classes=3, per_batch=True)
    ours = evaluate(model, inputs, targets, batch_size=2, num_classes=3)
    assert theirs["macro_acc"] == pytest.approx(0.25) and ours["macro_acc"] == pytest.approx(1 / 3)
    # ... and the same as torchmetrics per batch, weighted as Lightning weights `on_epoch` logs
    from torchmetrics.classification import MulticlassAccuracy

    metric = MulticlassAccuracy(num_classes=3, ignore_index=IGNORE)
    per_batch = [
        (float(metric(logits[i : i + 2].reshape(-1, 3), targets[i : i + 2].reshape(-1))), len(targets[i : i + 2]))
        for i in (0, 2)
    ]
    assert theirs["macro_acc"] == pytest.approx(sum(v * n for v, n in per_batch) / 3)
    assert theirs["acc"] == ours["acc"] == pytest.approx(2 / 5)


def test_per_batch_sums_survive_a_checkpoint():
    acc = MetricAccumulator("classes", 3, per_batch=True)
    acc.update(torch.eye(3)[None], torch.tensor([[0, 1, 1]]), torch.tensor(1.5))
    again = MetricAccumulator("classes", 3, per_batch=True)
    again.load_state_dict(acc.state_dict())
    assert again.compute() == acc.compute()


# --- training details ----------------------------------------------------------------------


def _settings(conventions: str, epochs: int = 4) -> TrainSettings:
    return TrainSettings(
        lr=1e-3, wd=0.1, epochs=epochs, batch_size=8, seed=0, min_lr=1e-6, early_stop_acc=0.999, conventions=conventions
    )


def test_mad_lab_optimizer_schedule_and_heads():
    model = TaskModel(StandInModel(8, 16), "lm", num_classes=8, conventions="mad-lab")
    assert model.lm_head is not None and model.lm_head.bias is not None and model.backbone.out is not None
    opt = build_optimizer(model, 1e-3, 0.1, torch.device("cpu"), "mad-lab")
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)
    assert sum(p.numel() for p in opt.param_groups[0]["params"]) == sum(p.numel() for p in model.parameters())
    ours = build_optimizer(model, 1e-3, 0.1, torch.device("cpu"), "madsl")
    assert ours.param_groups[0]["betas"] == (0.9, 0.98) and ours.param_groups[1]["params"]  # biases undecayed
    zero_biases = [m.bias for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert all(float(b.detach().abs().max()) == 0 for b in zero_biases)  # mad-lab zeroes every Linear bias
    compression = TaskModel(StandInModel(8, 16), "compression", num_classes=8, target_len=16, conventions="mad-lab")
    weights = torch.cat([m.weight.detach().flatten() for m in compression.modules() if isinstance(m, torch.nn.Linear)])
    assert float(weights.std()) == pytest.approx(0.02, rel=0.1)
    assert isinstance(compression.decoder.mlp[0], torch.nn.RMSNorm)

    state = RunState.start(
        _settings("mad-lab"),
        lambda: TaskModel(StandInModel(8, 16), "lm", num_classes=8, conventions="mad-lab"),
        torch.device("cpu"),
        num_train=64,
        num_classes=8,
    )
    assert state.scheduler.T_max == 4  # one cosine step per epoch
    assert (
        RunState.start(
            _settings("madsl"),
            lambda: TaskModel(StandInModel(8, 16), "lm"),
            torch.device("cpu"),
            num_train=64,
            num_classes=8,
        ).scheduler.T_max
        == 4 * 8
    )


# --- where conventions come from, and identities -------------------------------------------


def test_protocol_default_spec_and_command_line_precedence():
    tasks = [get_task("in-context-recall")]
    assert build_plan(tasks, Overrides(protocol="paper")).runs[0].train.conventions == "mad-lab"
    assert build_plan(tasks, Overrides(protocol="baseline")).runs[0].train.conventions == "mad-lab"
    assert build_plan(tasks, Overrides(protocol="quick")).runs[0].train.conventions == "madsl"
    assert build_plan(tasks, Overrides(protocol="paper", conventions="madsl")).runs[0].train.conventions == "madsl"
    paper = build_plan(tasks, Overrides(protocol="paper")).runs[0].train
    assert paper.precision == "auto"  # bf16 on CUDA, as the reference trains; fp32 on a CPU
    assert overrides_from_spec_eval({"conventions": "mad-lab"}).conventions == "mad-lab"


def test_madsl_conventions_leave_run_ids_as_they_were_and_mad_lab_makes_new_ones(tmp_path):
    assert "conventions" not in train_config_identity({"lr": 1.0, "conventions": "madsl"})
    assert train_config_identity({"lr": 1.0, "conventions": "mad-lab"})["conventions"] == "mad-lab"
    db = tmp_path / "r.db"
    run_toy_eval(db, epochs=1)
    run_toy_eval(db, epochs=1, conventions="madsl")
    assert len(run_rows(db)) == 1  # the same run: madsl is what runs before conventions used
    run_toy_eval(db, epochs=1, conventions="mad-lab")
    rows = run_rows(db)
    assert len(rows) == 2 and {json.loads(r["train_config"]).get("conventions") for r in rows} == {None, "mad-lab"}
    from madsl.runner.reports.outputs import load_scores, records

    recs = [r for r in records(load_scores(db)) if r["aggregate"]]
    assert sorted(r["conventions"] for r in recs) == ["mad-lab", "madsl"]  # scored apart, each named


def test_unknown_conventions_are_located_errors(tmp_path, capsys):
    with pytest.raises(MadslError, match="(?s)unknown conventions 'madlab'.*did you mean 'mad-lab'"):
        check_conventions("madlab")
    spec = tmp_path / "bad.mad"
    spec.write_text("extends: bundled:induction/mamba\neval:\n  conventions: reference\n")
    assert main(["eval", str(spec), "--db", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:3:16" in err and "unknown conventions 'reference'" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(spec), "--conventions", "nope"])
    assert exit_info.value.code == 2
    # a setting valid under one convention and not the other is refused before anything runs
    from madsl.runner.api import evaluate

    with pytest.raises(MadslError, match="bad setting for selective-copying \\(conventions mad-lab\\)"):
        evaluate(
            [FakeSpec("s", "s")],
            tasks=["selective-copying"],
            protocol="smoke",
            db=tmp_path / "x.db",
            conventions="mad-lab",
            settings_overrides={"vocab_size": 2},
        )
    assert not (tmp_path / "x.db").exists()


# --- the memorization ceiling ----------------------------------------------------------------


def test_memorization_ceiling_is_the_share_of_test_facts_shown_in_training():
    task = get_task("memorization")
    setting = {"vocab_size": 8192, "num_test_examples": 256}
    train, test = task.generate(setting, "train", 0), task.generate(setting, "test", 0)
    shown = set(train.inputs[:, 0::2].ravel().tolist())
    asked = set(test.inputs[:, 0::2].ravel().tolist())
    assert task.ceiling(setting, 0) == pytest.approx(len(asked & shown) / len(asked))
    assert 0.55 < task.ceiling(setting, 0) < 0.7  # 4096 draws of 4096 keys: about 1 - 1/e are shown
    assert task.ceiling({}, 0) == 1.0 and get_task("in-context-recall").ceiling({}, 0) is None


def test_report_shows_the_ceiling_where_a_task_has_one(tmp_path, capsys):
    from madsl.runner.api import evaluate
    from madsl.runner.reports.outputs import load_scores, records
    from tests.runner_helpers import standin_factory

    db = tmp_path / "r.db"
    evaluate(
        [FakeSpec("standin", "standin-v1")],
        tasks=["memorization", "compression"],
        protocol="smoke",
        db=db,
        epochs=1,
        model_factory=standin_factory,
        settings_overrides={"vocab_size": 4096},
    )
    by_task = {r["task"]: r for r in records(load_scores(db)) if not r["aggregate"]}
    expected = get_task("memorization").ceiling(
        {"vocab_size": 4096, "num_train_examples": 64, "num_test_examples": 32}, 0
    )
    assert by_task["memorization"]["ceiling"] == pytest.approx(expected) and expected < 0.5
    assert by_task["compression"]["ceiling"] is None
    assert main(["report", "--db", str(db)]) == 0
    assert "ceiling" in capsys.readouterr().out


def test_mad_lab_compression_zeroes_every_bias_as_the_reference_autoencoder():
    # mad-lab's AutoEncoder re-inits every Linear (Mamba's dt bias too); its LanguageModel spares `_no_reinit` ones
    def marked() -> StandInModel:
        backbone = StandInModel(8, 16)
        with torch.no_grad():
            backbone.mlp[0].bias.fill_(1.0)
        backbone.mlp[0].bias._no_reinit = True
        return backbone

    compression = TaskModel(marked(), "compression", num_classes=8, target_len=16, conventions="mad-lab")
    assert float(compression.backbone.mlp[0].bias.detach().abs().max()) == 0
    lm = TaskModel(marked(), "lm", num_classes=8, conventions="mad-lab")
    assert float(lm.backbone.mlp[0].bias.detach().min()) == 1.0
