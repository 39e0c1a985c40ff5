"""One pretraining run: a compiled spec trained on text with a next-token objective for a
fixed number of steps (its FLOP budget's), scored on the validation split along the way.

The loop reads as its steps: `train_step` is one optimizer step on the batch of step `step`,
`evaluate_text` scores the fixed validation windows, and `pretrain_run` strings them together,
recording an evaluation (an "epoch" of the results store: its index, the learning rate, the
train loss since the last one, the validation loss, perplexity and next-token accuracy) at each
of `PretrainSettings.evaluation_steps()`. The run's result is its final evaluation: the loss at
its budget, which is what an IsoFLOP curve plots.

Resumable and deterministic: the model's init derives from the seed, the batch of step s from
(seed, s) alone (`madsl.corpus`), the learning rate from s alone (`PretrainSettings.lr_at`);
a checkpoint (model, optimizer, step, history, RNG states) is written atomically every
`checkpoint_every_s`, when asked to stop and when the run ends, so a run resumed from its
checkpoint ends exactly where an uninterrupted one ends.

This module knows nothing of the results store or of executors (`madsl.runner.pretrain.job`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from madsl.runner.pretrain.recipe import PretrainSettings
from madsl.runner.train.checkpoint import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from madsl.runner.train.loop import RunInterrupted, TrainHooks
from madsl.runner.train.metrics import EpochMetrics, RunResult
from madsl.runner.train.optim import build_optimizer
from madsl.runner.train.precision import autocast, configure_device

KIND = "pretrain"  # a checkpoint's kind: a MAD run's checkpoint is not a pretraining run's


class TextBatches(Protocol):
    """A run's text: the training batch of a step, and the fixed validation windows."""

    def train_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]: ...

    def eval_batches(self) -> Iterable[tuple[np.ndarray, np.ndarray]]: ...


@dataclass
class PretrainState:
    """Everything a pretraining run is at a moment; `to_checkpoint` / `restore` round-trip it exactly."""

    settings: PretrainSettings
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    run_id: str | None = None
    step: int = 0
    train_seconds: float = 0.0
    loss_sum: float = 0.0  # train loss summed over the steps since the last evaluation
    loss_steps: int = 0
    history: list[EpochMetrics] = field(default_factory=list)
    diverged_epoch: int | None = None

    @property
    def finished(self) -> bool:
        return self.step >= self.settings.steps or self.diverged_epoch is not None

    def to_checkpoint(self, result: RunResult | None = None) -> dict[str, Any]:
        return {
            "kind": KIND,
            "settings": self.settings.identity(),
            "run_id": self.run_id,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state(),
            "step": self.step,
            "train_seconds": self.train_seconds,
            "loss_sum": self.loss_sum,
            "loss_steps": self.loss_steps,
            "history": [asdict(h) for h in self.history],
            "diverged_epoch": self.diverged_epoch,
            "result": result.to_dict() if result is not None else None,
        }

    def restore(self, saved: dict[str, Any]) -> None:
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        set_rng_state(saved["rng"])
        self.step, self.train_seconds = int(saved["step"]), float(saved["train_seconds"])
        self.loss_sum, self.loss_steps = float(saved["loss_sum"]), int(saved["loss_steps"])
        self.history = [EpochMetrics(**h) for h in saved["history"]]
        self.diverged_epoch = saved["diverged_epoch"]

    def result(self) -> RunResult:
        """The run's result: every evaluation, the last one (the loss at the budget) as its score."""
        last = self.history[-1]
        finite = [h for h in self.history if math.isfinite(h.eval_loss)]
        best = finite[-1] if finite else last
        return RunResult(
            epochs_done=len(self.history),
            best_epoch=best.epoch,
            best=best,
            max_eval_macro_acc=None,
            max_eval_acc=max((h.eval_acc or 0.0) for h in self.history),
            early_stopped=False,
            train_seconds=self.train_seconds,
            history=list(self.history),
            diverged_epoch=self.diverged_epoch,
        )


HYENA_LAYERS = ("hyena", "multihead_hyena", "hyena_experts")  # App. C: "weight decay 0 to all Hyena layer parameters"


def exempt_from_decay(model: torch.nn.Module, primitives: tuple[str, ...]) -> None:
    """Mark the parameters of the layers built from `primitives` (the compiler names each layer
    module's primitive) as not weight-decayed (madsl.runner.train.optim.build_optimizer)."""
    for module in model.modules():
        if getattr(module, "madsl_primitive", None) in primitives:
            for parameter in module.parameters():
                parameter._no_weight_decay = True


def open_pretrain(
    settings: PretrainSettings,
    build_model: Callable[[], torch.nn.Module],
    device: torch.device,
    checkpoint_path: Path | None,
    run_id: str | None,
) -> PretrainState | RunResult:
    """The run as its checkpoint left it (fresh when there is none), or its result when it had finished."""
    saved = load_checkpoint(checkpoint_path) if checkpoint_path is not None else None
    if saved is not None:
        if saved.get("kind") != KIND or saved.get("settings") != settings.identity():
            raise CheckpointError(
                checkpoint_path,
                "is the checkpoint of another run (other settings)",
                hint="remove it, or give this run another results folder",
            )
        if run_id is not None and saved.get("run_id") not in (None, run_id):
            raise CheckpointError(checkpoint_path, f"is the checkpoint of run {saved.get('run_id')}, not {run_id}")
        if saved.get("result") is not None:
            return RunResult.from_dict(saved["result"])
    torch.manual_seed(settings.seed)
    model = build_model().to(device)
    if not settings.decay_hyena:
        exempt_from_decay(model, HYENA_LAYERS)
    optimizer = build_optimizer(model, settings.lr, settings.wd, device, betas=(settings.beta1, settings.beta2))
    state = PretrainState(settings, model, optimizer, run_id)
    if saved is not None:
        state.restore(saved)
    return state


def as_tokens(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device)


def train_step(state: PretrainState, x: torch.Tensor, y: torch.Tensor) -> float:
    """One optimizer step at the schedule's learning rate; the step's train loss."""
    settings = state.settings
    for group in state.optimizer.param_groups:
        group["lr"] = settings.lr_at(state.step)
    with autocast(settings.precision, x.device):
        logits = state.model(x)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
    state.optimizer.zero_grad(set_to_none=True)
    (loss + state.model.aux_loss()).backward()
    if settings.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), settings.grad_clip)
    state.optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate_text(
    model: torch.nn.Module,
    batches: Iterable[tuple[np.ndarray, np.ndarray]],
    device: torch.device,
    precision: str = "fp32",
) -> dict[str, float]:
    """Mean next-token loss (nats), perplexity and top-1 accuracy over the validation windows."""
    was_training = model.training
    model.eval()
    loss_sum, correct, tokens = 0.0, 0, 0
    for x_np, y_np in batches:
        x, y = as_tokens(x_np, device), as_tokens(y_np, device)
        with autocast(precision, device):
            logits = model(x)
        logits = logits.float().reshape(-1, logits.shape[-1])
        loss_sum += float(F.cross_entropy(logits, y.reshape(-1), reduction="sum"))
        correct += int((logits.argmax(-1) == y.reshape(-1)).sum())
        tokens += y.numel()
    model.train(was_training)
    loss = loss_sum / max(tokens, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "acc": correct / max(tokens, 1)}


def _record(state: PretrainState, data: TextBatches, device: torch.device, seconds: float) -> EpochMetrics:
    """Score the validation split now and record it."""
    evaluation = evaluate_text(state.model, data.eval_batches(), device, state.settings.precision)
    return record_evaluation(state, evaluation, seconds)


def record_evaluation(state: PretrainState, evaluation: dict[str, float], seconds: float) -> EpochMetrics:
    """Record an evaluation (loss, ppl, acc) as the run's next "epoch"; the train loss is the mean
    since the last one. A non-finite loss marks the run diverged."""
    train_loss = state.loss_sum / max(state.loss_steps, 1)
    metrics = EpochMetrics(
        epoch=len(state.history) + 1,
        lr=state.settings.lr_at(state.step - 1),
        seconds=seconds,
        train_loss=train_loss,
        train_ppl=math.exp(min(train_loss, 50.0)),
        train_acc=None,
        train_macro_acc=None,
        eval_loss=evaluation["loss"],
        eval_ppl=evaluation["ppl"],
        eval_acc=evaluation["acc"],
        eval_macro_acc=None,
    )
    state.history.append(metrics)
    state.loss_sum, state.loss_steps = 0.0, 0
    if not (math.isfinite(train_loss) and math.isfinite(metrics.eval_loss)):
        state.diverged_epoch = metrics.epoch
    return metrics


def pretrain_run(
    settings: PretrainSettings,
    build_model: Callable[[], torch.nn.Module],
    data: TextBatches,
    *,
    device: torch.device | str = "cpu",
    checkpoint_path: Path | None = None,
    hooks: TrainHooks | None = None,
    run_id: str | None = None,
) -> RunResult:
    """Train one pretraining run to its budget (or raise RunInterrupted), resuming from `checkpoint_path`."""
    hooks = hooks or TrainHooks()
    device = torch.device(device) if isinstance(device, str) else device
    checkpoint_path = Path(checkpoint_path) if checkpoint_path is not None else None
    state = open_pretrain(settings, build_model, device, checkpoint_path, run_id)
    if isinstance(state, RunResult):
        return state
    configure_device(device)
    evaluations = settings.evaluation_steps()  # arithmetic, never listed (eval_every: 1 over many steps)
    last_save = since_eval = time.monotonic()

    def save(result: RunResult | None = None) -> None:
        nonlocal last_save
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path, state.to_checkpoint(result))
        last_save = time.monotonic()

    state.model.train()
    while not state.finished:
        if hooks.should_stop is not None and hooks.should_stop():
            save()
            raise RunInterrupted(f"stopped at step {state.step} of {settings.steps}")
        started = time.monotonic()
        x, y = data.train_batch(state.step)
        loss = train_step(state, as_tokens(x, device), as_tokens(y, device))
        state.loss_sum += loss
        state.loss_steps += 1
        state.step += 1
        state.train_seconds += time.monotonic() - started
        if hooks.on_progress is not None:
            hooks.on_progress(len(state.history) + 1, state.step, settings.steps)
        # a non-finite loss is recorded at once and stops the run: AdamW cannot recover from NaN weights
        if state.step in evaluations or not math.isfinite(loss):
            metrics = _record(state, data, device, time.monotonic() - since_eval)
            since_eval = time.monotonic()
            if hooks.checkpoint_every_s == 0 or time.monotonic() - last_save > hooks.checkpoint_every_s:
                save()
            if hooks.on_epoch is not None:
                hooks.on_epoch(metrics)
        elif hooks.checkpoint_every_s > 0 and time.monotonic() - last_save > hooks.checkpoint_every_s:
            save()
    result = state.result()
    save(result)
    return result
