"""Stand-ins for the compiler and the tasks, shared by the runner tests.

A small stand-in model and toy tasks with the interfaces of the compiler and of
madsl.tasks, so the runner is tested on its own (tests/test_runner_e2e.py runs the
real compiled path).
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from madsl.runner.api import evaluate
from madsl.tasks.base import IGNORE, Task, TaskData

TESTS_DIR = Path(__file__).resolve().parent


# --- stand-ins for the compiler and the tasks ----------------------------------------------

class StandInModel(nn.Module):
    """Embedding, a causal depthwise conv, a causal running mean, an MLP, a norm, a linear head."""

    def __init__(self, vocab_size: int, max_seq_len: int, num_classes: int | None = None, dim: int = 32):
        super().__init__()
        self.dim = dim
        self.embed = nn.Embedding(vocab_size, dim)
        self.conv = nn.Conv1d(dim, dim, 4, groups=dim, padding=3)
        self.mix = nn.Linear(2 * dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, num_classes or vocab_size)

    def features(self, tokens=None, embeds=None):
        x = self.embed(tokens) if embeds is None else embeds
        length = x.shape[1]
        local = self.conv(x.transpose(1, 2))[..., :length].transpose(1, 2)
        mean = x.cumsum(1) / torch.arange(1, length + 1, device=x.device)[None, :, None]
        x = x + self.mix(torch.cat([local, mean], -1))
        return self.norm(x + self.mlp(x))

    def forward(self, tokens):
        return self.out(self.features(tokens))

    def aux_loss(self):
        return torch.zeros(())


@dataclass
class StandInFactory:
    dim: int = 32

    def __call__(self, vocab_size, max_seq_len, num_classes=None, seed=0):
        torch.manual_seed(seed)
        return StandInModel(vocab_size, max_seq_len, num_classes, self.dim)


@dataclass
class FakeSpec:
    name: str
    text: str
    eval: dict = field(default_factory=dict)

    def canonical(self) -> str:
        return self.text

    def identity(self) -> dict:
        return {"canonical": self.text}


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
        return TaskData(x.astype(np.int64), (x[:, 0] % 2).astype(np.int64))


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
        y = x.sum(-1)
        y[:, :2] = np.nan
        return TaskData(x, y.astype(np.float32))


TOY_TASKS = {t.name: t for t in (ToyPrevious(), ToyCompression(), ToyClassify(), ToyRegress())}


def run_toy_eval(db, epochs=4, tasks=("toy-previous",), spec=None, lr=3e-3, **kwargs):
    return evaluate([spec or FakeSpec("standin", "standin-v1")], tasks=tasks, protocol="smoke", db=db,
                    epochs=epochs, lr=lr, progress=False, model_factory=standin_factory,
                    task_registry=TOY_TASKS, **kwargs)


def epoch_rows(db):
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT run_id, epoch, eval_loss, eval_macro_acc FROM epochs "
                            "ORDER BY run_id, epoch").fetchall()


def run_rows(db):
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY run_id")]
