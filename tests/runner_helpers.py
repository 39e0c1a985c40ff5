"""Stand-ins for the compiler and the tasks, shared by the runner tests.

A small stand-in model and toy tasks with the interfaces of the compiler and of
madsl.tasks, so the runner is tested on its own (tests/test_runner_e2e.py runs the
real compiled path).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from madsl.runner.api import evaluate
from madsl.tasks.base import IGNORE, Task, TaskData

TESTS_DIR = Path(__file__).resolve().parent


# --- stand-ins for the compiler and the tasks ----------------------------------------------


class CausalMixer(nn.Module):
    """The stand-in's sequence mixer: a causal depthwise conv and a causal running mean, added to the input."""

    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 4, groups=dim, padding=3)
        self.mix = nn.Linear(2 * dim, dim)

    def forward(self, x):
        length = x.shape[1]
        local = self.conv(x.transpose(1, 2))[..., :length].transpose(1, 2)
        mean = x.cumsum(1) / torch.arange(1, length + 1, device=x.device)[None, :, None]
        return x + self.mix(torch.cat([local, mean], -1))


class StandInModel(nn.Module):
    """Embedding, a sequence mixer (CausalMixer), an MLP, a norm, a linear head."""

    def __init__(self, vocab_size: int, max_seq_len: int, num_classes: int | None = None, dim: int = 32):
        super().__init__()
        self.dim = dim
        self.embed = nn.Embedding(vocab_size, dim)
        self.mixer = CausalMixer(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, num_classes or vocab_size)

    def features(self, tokens=None, embeds=None):
        x = self.mixer(self.embed(tokens) if embeds is None else embeds)
        return self.norm(x + self.mlp(x))

    def forward(self, tokens):
        return self.out(self.features(tokens))

    def aux_loss(self):
        return torch.zeros(())


def without_sequence_mixing(model: StandInModel) -> StandInModel:
    """The control of every "learns" test: the same model with its sequence mixer replaced by identity.

    Every position then sees only its own token, so a task that needs mixing cannot be learned.
    """
    model.mixer = nn.Identity()
    return model


@dataclass
class StandInFactory:
    dim: int = 32

    def __call__(self, vocab_size, max_seq_len, num_classes=None, seed=0):
        torch.manual_seed(seed)
        return StandInModel(vocab_size, max_seq_len, num_classes, self.dim)


@dataclass
class PausingFactory(StandInFactory):
    """Stand-ins whose training pauses for good at training step `pause_at` (1-based, over epochs),
    once the results database `db` shows `epochs_recorded` epoch rows; then `ready` is written.

    A test that kills the process after `ready` appears kills it at a known point: the
    checkpoint and the store both hold exactly the epochs before that step.
    """

    db: str = ""
    ready: str = ""
    pause_at: int = 0
    epochs_recorded: int = 0

    def __call__(self, vocab_size, max_seq_len, num_classes=None, seed=0):
        model = super().__call__(vocab_size, max_seq_len, num_classes, seed)
        steps = [0]

        def count_training_steps(module, args):
            if module.training:
                steps[0] += 1
                if steps[0] == self.pause_at:
                    self._pause()

        model.register_forward_pre_hook(count_training_steps)
        return model

    def _pause(self) -> None:
        while True:
            try:
                with sqlite3.connect(self.db) as conn:
                    if conn.execute("SELECT COUNT(*) FROM epochs").fetchone()[0] >= self.epochs_recorded:
                        break
            except sqlite3.OperationalError:  # busy: the coordinator is writing
                pass
            time.sleep(0.02)
        Path(self.ready).write_text("paused")
        threading.Event().wait()


@dataclass
class DivergingFactory(StandInFactory):
    """Stand-ins whose weights become NaN at training step `at` (1-based): a loss that diverges, on cue."""

    at: int = 1

    def __call__(self, vocab_size, max_seq_len, num_classes=None, seed=0):
        model = super().__call__(vocab_size, max_seq_len, num_classes, seed)
        steps = [0]

        def poison(module, args):
            if module.training:
                steps[0] += 1
                if steps[0] == self.at:
                    with torch.no_grad():
                        module.embed.weight.fill_(float("nan"))

        model.register_forward_pre_hook(poison)
        return model


@dataclass
class KillingFactory(StandInFactory):
    """Kills the process that builds its model (SIGKILL): a worker lost to the OOM killer, on cue."""

    def __call__(self, vocab_size, max_seq_len, num_classes=None, seed=0):
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class FakeSpec:
    name: str
    text: str
    eval: dict = field(default_factory=dict)

    def canonical(self) -> str:
        return self.text

    def identity(self) -> dict:
        return {"canonical": self.text}

    @property
    def identity_text(self) -> str:  # as madsl.spec.Spec's
        return json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.identity_text.encode()).hexdigest()


def standin_factory(spec):
    return StandInFactory()


class ToyTask(Task):
    """What the toy tasks share: their settings, a split's generator and its row count."""

    def vocab_size(self, settings):
        return settings["vocab_size"]

    def draw(self, settings, split, seed):
        s = self.settings(**settings)
        return s, np.random.default_rng([seed, 0 if split == "train" else 1]), s[f"num_{split}_examples"]


class ToyPrevious(ToyTask):
    """Predict the token before the current one (a causal conv learns it in a few epochs)."""

    name = "toy-previous"
    baseline = {"vocab_size": 8, "seq_len": 16, "num_train_examples": 256, "num_test_examples": 64}
    sweep = {"seq_len": (16, 24)}

    def generate(self, settings, split, seed):
        s, rng, n = self.draw(settings, split, seed)
        x = rng.integers(0, s["vocab_size"], (n, s["seq_len"]))
        y = np.full_like(x, IGNORE)
        y[:, 1:] = x[:, :-1]
        return TaskData(x.astype(np.int64), y.astype(np.int64))


class ToyCompression(ToyTask):
    name = "toy-compression"
    head = "compression"
    baseline = {"vocab_size": 6, "seq_len": 6, "num_train_examples": 128, "num_test_examples": 32}

    def generate(self, settings, split, seed):
        s, rng, n = self.draw(settings, split, seed)
        x = rng.integers(0, s["vocab_size"] - 1, (n, s["seq_len"]))
        x[:, -1] = s["vocab_size"] - 1  # the compression token
        y = x.copy()
        y[:, -1] = IGNORE
        return TaskData(x.astype(np.int64), y.astype(np.int64))


class ToyClassify(ToyTask):
    name = "toy-classify"
    head = "classify"
    baseline = {"vocab_size": 5, "seq_len": 8, "num_train_examples": 128, "num_test_examples": 32}

    def num_classes(self, settings):
        return 2

    def generate(self, settings, split, seed):
        s, rng, n = self.draw(settings, split, seed)
        x = rng.integers(0, s["vocab_size"], (n, s["seq_len"]))
        return TaskData(x.astype(np.int64), (x[:, -2] % 2).astype(np.int64))  # needs the token before the last


class ToyRegress(ToyTask):
    name = "toy-regress"
    head = "regress"
    baseline = {"seq_len": 8, "input_dim": 3, "num_train_examples": 128, "num_test_examples": 32}

    def vocab_size(self, settings):
        return 1

    def input_dim(self, settings):
        return settings["input_dim"]

    def generate(self, settings, split, seed):
        s, rng, n = self.draw(settings, split, seed)
        x = rng.standard_normal((n, s["seq_len"], s["input_dim"])).astype(np.float32)
        y = np.full(x.shape[:2], np.nan, dtype=np.float32)
        y[:, 2:] = x[:, 1:-1].sum(-1)  # the previous position's sum: needs sequence mixing
        return TaskData(x, y.astype(np.float32))


TOY_TASKS = {t.name: t for t in (ToyPrevious(), ToyCompression(), ToyClassify(), ToyRegress())}


def run_toy_eval(db, epochs=4, tasks=("toy-previous",), spec=None, lr=3e-3, model_factory=standin_factory, **kwargs):
    return evaluate(
        [spec or FakeSpec("standin", "standin-v1")],
        tasks=tasks,
        protocol="smoke",
        db=db,
        epochs=epochs,
        lr=lr,
        model_factory=model_factory,
        task_registry=TOY_TASKS,
        **kwargs,
    )


def epoch_rows(db):
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT run_id, epoch, eval_loss, eval_macro_acc FROM epochs ORDER BY run_id, epoch"
        ).fetchall()


def run_rows(db):
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY run_id")]


# --- the plan's training rate, stood in for ------------------------------------------------


def stand_in_rates(
    monkeypatch,
    folder: Path,
    flops_per_s: float = 1e9,
    overhead_s: float = 1e-3,
    rest_s: float = 0.0,
    startup_s: float = 0.0,
) -> list[str]:
    """The plan's rate (madsl.runner.plan.rate) cached in `folder` and, where missing, "measured"
    without training: every layer family at `flops_per_s` with `overhead_s` a step, the rest of a
    model `rest_s` a layer and a token, the threads' speedup 1, a process's start-up `startup_s`.
    Returns the list the families measured are appended to."""
    from madsl.runner.plan import rate_measure
    from madsl.runner.plan.rate_model import Line, Measured, now

    measured: list[str] = []
    monkeypatch.setenv("MADSL_CACHE_DIR", str(folder))
    monkeypatch.setattr(
        rate_measure,
        "measure_family",
        lambda family, device: measured.append(family) or Line(overhead_s, flops_per_s, now(), 0.5),
    )
    monkeypatch.setattr(
        rate_measure, "measure_model", lambda book, reference, device: (Measured(rest_s, now(), 0.5), 0.01)
    )
    monkeypatch.setattr(rate_measure, "measure_speedup", lambda *args: Measured(1.0, now(), 0.5))
    monkeypatch.setattr(rate_measure, "measure_startup", lambda threads: Measured(startup_s, now(), 0.5))
    return measured


# A search of real compiled models that trains in seconds (one block of H or mA at width 16, the
# smoke protocol on in-context recall): `tiny_search(algorithm)` with the algorithm's line, and
# any further lines of the file after it.
TINY_SEARCH = """\
name: tiny
dim: 16
budget: {fixed_state: <= 256, fit: [H.filter_states]}
layers: {mA: {heads: 2}}
space: {sequence_mixers: [H, mA], channel_mixers: [Sg], blocks: 1}
objectives:
  score:
    protocol: smoke
    tasks: [in-context-recall]
    epochs: 1
    set: {num_train_examples: 32, num_test_examples: 16, seq_len: 16}
"""


def tiny_search(algorithm: str, more: str = "") -> str:
    return TINY_SEARCH + f"algorithm: {algorithm}\n" + more
