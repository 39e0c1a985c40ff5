"""A run at a moment, and where it is kept between moments.

`RunState` is everything a run is (model, optimizer, scheduler, the partial epoch's metric
sums, epoch and step, clocks, history, best epoch and its weights, length results);
`to_checkpoint` / `restore` round-trip it exactly, RNG states included, so a run resumed from
its checkpoint ends exactly where an uninterrupted run ends. `Checkpointer` writes it
(atomically, through `madsl.runner.train.checkpoint`) and knows when a checkpoint is due;
`open_run` starts a run or resumes it from its checkpoint, refusing another run's.

Model init derives from the seed (`RunState.start` seeds every generator before building
the model). Apart from the loop because a grid group (`madsl.runner.batched.grid`) opens,
checkpoints and ends its members' runs itself, with the same state.
"""

from __future__ import annotations

import math
import random
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from madsl.conventions import MAD_LAB
from madsl.runner.common.records import TrainSettings
from madsl.runner.train.checkpoint import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from madsl.runner.train.heads import TaskModel
from madsl.runner.train.metrics import EpochMetrics, MetricAccumulator, RunResult
from madsl.runner.train.optim import build_optimizer, build_scheduler
from madsl.runner.train.options import IDENTITY_DEFAULTS, stale_epochs


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def same_settings(saved: Mapping[str, Any] | None, settings: TrainSettings) -> bool:
    """A checkpoint's settings are these (checkpoints from before an option existed had its default)."""
    return isinstance(saved, Mapping) and {**IDENTITY_DEFAULTS, **saved} == asdict(settings)


def to_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if tensor.dtype == torch.float64:
        tensor = tensor.float()
    return tensor.to(device)


@dataclass
class RunData:
    """A run's splits as tensors on its device."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @classmethod
    def from_tasks(cls, train_data, test_data, device: torch.device) -> "RunData":
        return cls(
            to_tensor(train_data.inputs, device),
            to_tensor(train_data.targets, device),
            to_tensor(test_data.inputs, device),
            to_tensor(test_data.targets, device),
        )


@dataclass
class RunState:
    """Everything a run is at a moment: what it trains, where it is, what it has seen.

    `to_checkpoint` / `from_checkpoint` round-trip it exactly (RNG states included),
    which is what makes a resumed run end where an uninterrupted one ends.
    """

    settings: TrainSettings
    model: TaskModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_metrics: MetricAccumulator  # sums over the current epoch's steps so far
    steps_per_epoch: int
    num_classes: int
    epoch: int = 0  # the next epoch to train (0-based)
    step: int = 0  # steps of it already done
    epoch_seconds: float = 0.0  # time spent in it so far (over interruptions)
    train_seconds: float = 0.0
    history: list[EpochMetrics] = field(default_factory=list)
    best: EpochMetrics | None = None
    best_state: dict | None = None  # the best epoch's weights, kept when lengths are evaluated after
    keep_best: bool = False  # or when the run's best model is kept (`--keep best`)
    finished: bool = False  # training is over (length evaluations may remain)
    length_evals: list[dict] = field(default_factory=list)  # in settings.eval_lengths order
    diverged_epoch: int | None = None
    run_id: str | None = None  # whose checkpoint this is (None: an anonymous run, as in the unit tests)

    @classmethod
    def start(
        cls,
        settings: TrainSettings,
        build_model: Callable[[], TaskModel],
        device: torch.device,
        num_train: int,
        num_classes: int,
    ) -> "RunState":
        """A fresh run: seeded, so the model's init is deterministic."""
        _seed_everything(settings.seed)
        model = build_model().to(device)
        optimizer = build_optimizer(model, settings.lr, settings.wd, device, settings.conventions, settings.optimizer)
        steps_per_epoch = math.ceil(num_train / settings.batch_size)
        per_epoch = settings.conventions == MAD_LAB  # the reference aggregates its metrics per batch
        scheduler = build_scheduler(optimizer, settings, steps_per_epoch)
        return cls(
            settings,
            model,
            optimizer,
            scheduler,
            MetricAccumulator(model.kind, num_classes, per_epoch),
            steps_per_epoch,
            num_classes,
        )

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Mapping[str, Any],
        settings: TrainSettings,
        build_model: Callable[[], TaskModel],
        device: torch.device,
        num_train: int,
        num_classes: int,
    ) -> "RunState":
        """The run where `checkpoint` (from `to_checkpoint`) left it, RNG states included."""
        return cls.start(settings, build_model, device, num_train, num_classes).restore(checkpoint)

    def restore(self, checkpoint: Mapping[str, Any]) -> "RunState":
        """Load `checkpoint` into this freshly started state (KeyError / TypeError / ... if it does not fit)."""
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.train_metrics.load_state_dict(checkpoint["train_metrics"])
        self.epoch, self.step = int(checkpoint["epoch"]), int(checkpoint["step"])
        self.epoch_seconds, self.train_seconds = float(checkpoint["epoch_seconds"]), float(checkpoint["train_seconds"])
        self.history = [EpochMetrics(**h) for h in checkpoint["history"]]
        self.best = EpochMetrics(**checkpoint["best"]) if checkpoint["best"] else None
        self.best_state = checkpoint.get("best_state")
        self.finished = bool(checkpoint["finished"])
        self.length_evals = list(checkpoint.get("length_evals", []))
        self.diverged_epoch = checkpoint.get("diverged_epoch")
        set_rng_state(checkpoint["rng"])
        threads = checkpoint.get("threads")
        if threads is not None and threads != torch.get_num_threads():  # CPU sums split by thread count
            warnings.warn(
                f"run {self.run_id or ''} resumes with {torch.get_num_threads()} torch thread(s); its "
                f"first {self.epoch} epoch(s) trained with {threads}: its results can differ in the last "
                "digits from a run trained with one thread count throughout",
                RuntimeWarning,
                stacklevel=2,
            )
        return self

    def to_checkpoint(self, result: RunResult | None = None) -> dict:
        return {
            "settings": asdict(self.settings),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "train_metrics": self.train_metrics.state_dict(),
            "rng": rng_state(),
            "epoch": self.epoch,
            "step": self.step,
            "epoch_seconds": self.epoch_seconds,
            "train_seconds": self.train_seconds,
            "history": [asdict(h) for h in self.history],
            "best": asdict(self.best) if self.best else None,
            "best_state": self.best_state,
            "finished": self.finished,
            "length_evals": self.length_evals,
            "diverged_epoch": self.diverged_epoch,
            "run_id": self.run_id,
            "result": result.to_dict() if result is not None else None,
            "threads": torch.get_num_threads(),
        }

    def end_epoch(self, metrics: EpochMetrics) -> None:
        """Record a finished epoch: history, best so far, and whether training is over.

        A non-finite loss ends training: the weights are NaN / inf from here on (AdamW
        cannot recover), so the run keeps its best finite epoch and is flagged diverged.
        """
        self.history.append(metrics)
        if not (math.isfinite(metrics.train_loss) and math.isfinite(metrics.eval_loss)):
            self.diverged_epoch = metrics.epoch
        if self.best is None or metrics.selection_key() < self.best.selection_key():
            self.best = metrics
            # weights not kept now are dropped, not left standing for this epoch: a resume may
            # switch --keep best on and off, and older weights must never pass for this epoch's
            self.best_state = (
                {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
                if self.settings.eval_lengths or self.keep_best
                else None
            )
        self.epoch, self.step, self.epoch_seconds = self.epoch + 1, 0, 0.0
        self.train_metrics.reset()
        self.finished = (
            self.solved(metrics)
            or self.stalled()
            or self.diverged_epoch is not None
            or self.epoch >= self.settings.epochs
        )

    def solved(self, metrics: EpochMetrics) -> bool:
        """The eval accuracy (settings.metric's) passed the stopping threshold: above stop_acc when set,
        else the protocol's early_stop_acc (reached; passed under mad-lab, whose check is strict)."""
        settings = self.settings
        acc = metrics.eval_acc if settings.metric == "token" else metrics.eval_macro_acc
        if acc is None:
            return False
        if settings.stop_acc is not None:
            return acc > settings.stop_acc
        return acc > settings.early_stop_acc if settings.conventions == MAD_LAB else acc >= settings.early_stop_acc

    def stalled(self) -> bool:
        """settings.patience epochs in a row without an eval-loss improvement of more than min_delta."""
        patience = self.settings.patience
        return (
            patience is not None
            and stale_epochs([h.eval_loss for h in self.history], self.settings.min_delta) >= patience
        )

    def result(self) -> RunResult:
        assert self.best is not None
        accs = [h.eval_macro_acc for h in self.history if h.eval_macro_acc is not None]
        token_accs = [h.eval_acc for h in self.history if h.eval_acc is not None]
        return RunResult(
            epochs_done=len(self.history),
            best_epoch=self.best.epoch,
            best=self.best,
            max_eval_macro_acc=max(accs) if accs else None,
            max_eval_acc=max(token_accs) if token_accs else None,
            early_stopped=len(self.history) < self.settings.epochs and self.diverged_epoch is None,
            train_seconds=self.train_seconds,
            history=self.history,
            length_evals=self.length_evals,
            diverged_epoch=self.diverged_epoch,
        )


class Checkpointer:
    """Writes a run's checkpoint (nowhere when the run has no path) and remembers when it last did."""

    def __init__(self, path: Path | None, every_s: float):
        self.path, self.every_s = path, every_s
        self.last = time.monotonic()

    def save(self, state: RunState, result: RunResult | None = None) -> None:
        if self.path is not None:
            save_checkpoint(self.path, state.to_checkpoint(result))
        self.last = time.monotonic()

    def due(self) -> bool:
        """Inside an epoch: whether `every_s` has passed since the last save (0: never inside one)."""
        return self.every_s > 0 and time.monotonic() - self.last > self.every_s

    def due_at_epoch_end(self) -> bool:
        """At an epoch's end: whether `every_s` has passed (0: always)."""
        return self.every_s == 0 or self.due()

    def save_if_due(self, state: RunState) -> None:
        """At an epoch's end: the checkpoint, if one is due."""
        if self.due_at_epoch_end():
            self.save(state)


def open_run(
    settings: TrainSettings,
    build_model: Callable[[], TaskModel],
    device: torch.device,
    num_train: int,
    num_classes: int,
    checkpoint_path: Path | None,
    keep_best: bool = False,
    run_id: str | None = None,
) -> "RunState | RunResult":
    """The run as its checkpoint left it (fresh when there is none), or its result when it had finished
    and only the bookkeeping was lost. A checkpoint of another run is a CheckpointError: other training
    settings, or another run id (same settings, another model: two specs sharing a checkpoint path)."""
    saved = load_checkpoint(checkpoint_path) if checkpoint_path is not None else None
    if saved is not None:
        if not same_settings(saved.get("settings"), settings):
            raise CheckpointError(checkpoint_path, "belongs to another run (other training settings)")
        if run_id is not None and saved.get("run_id") not in (None, run_id):
            raise CheckpointError(
                checkpoint_path, f"belongs to another run ({str(saved['run_id'])[:16]}…, not {run_id[:16]}…)"
            )
        if saved.get("result") is not None:  # finished, only the bookkeeping was lost
            try:
                return RunResult.from_dict(saved["result"])
            except (KeyError, TypeError, ValueError) as err:
                raise CheckpointError(checkpoint_path, f"holds a malformed result ({type(err).__name__})") from None
    state = RunState.start(settings, build_model, device, num_train, num_classes)
    state.keep_best, state.run_id = keep_best, run_id
    if saved is not None:
        try:
            state.restore(saved)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as err:
            raise CheckpointError(
                checkpoint_path, f"does not hold this run's state ({type(err).__name__}: {str(err)[:200]})"
            ) from None
    return state
