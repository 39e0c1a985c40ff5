"""One training run: a model, one task setting, one point of the lr x wd grid.

MAD paper Table B.1: AdamW with betas (0.9, 0.98), batch 128, cosine decay, no
dropout, cross-entropy on the target positions (IGNORE = -100 elsewhere), plus
the model's auxiliary loss (MoE load balancing). After every epoch the model is
evaluated on the test split; the run's result is the epoch with the lowest
evaluation perplexity (the reference implementation keeps that checkpoint), and
training stops early once evaluation accuracy reaches `early_stop_acc`.

Accuracy is the class-averaged ("macro") accuracy over scored positions, as
torchmetrics' MulticlassAccuracy computes it in the reference implementation;
per-token accuracy is recorded next to it.

Under the reference implementation's conventions (`settings.conventions == "mad-lab"`):
AdamW with its default betas (0.9, 0.999) and weight decay on every parameter, the cosine
schedule stepped once per epoch (T_max = epochs), evaluation in batches of the training
batch size, and the epoch's loss, perplexity and accuracy as its logger reports them: the
batch-size-weighted mean of per-batch values (each batch's accuracy class-averaged over
that batch alone); training stops once accuracy exceeds `early_stop_acc` (its
EarlyStopping threshold is strict).

Resumable and deterministic: model init and data order derive from the seed
(the data order of epoch e from (seed, e) alone), and a checkpoint (model,
optimizer, scheduler, RNG states, position, history) is written atomically every
`checkpoint_every_s` seconds (at the end of an epoch, or inside a long one), when
asked to stop and when the run ends. A run resumed from its checkpoint ends exactly
where an uninterrupted run ends.

This module knows nothing of the results store or of executors.
"""
from __future__ import annotations

import gc
import math
import warnings
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from madsl.runner.train.checkpoint import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from madsl.runner.train.heads import TaskModel
from madsl.runner.train.options import IDENTITY_DEFAULTS, stale_epochs
from madsl.runner.train.precision import autocast, configure_device
from madsl.runner.plan.protocols import TrainSettings

IGNORE = -100
BETAS = (0.9, 0.98)  # MAD paper Table B.1
MAD_LAB = "mad-lab"
EVAL_BATCH = 128  # evaluation batches are at least this large (no gradients: memory is not the limit)


class RunInterrupted(Exception):
    """Training stopped on request; the checkpoint holds everything to resume."""


# --- metrics -------------------------------------------------------------------------------

class MetricAccumulator:
    """Sums over one pass through a split: loss, token counts, per-class hits.

    Class-averaged accuracy follows torchmetrics' macro average: the mean over
    classes of hits / occurrences as targets, over classes that occur as a target
    or a prediction (a class only ever predicted, wrongly, counts as 0).

    per_batch: loss, perplexity and class-averaged accuracy are computed per batch and
    averaged over batches weighted by their rows (how mad-lab's Lightning logger
    aggregates `on_epoch`); otherwise over the whole pass.
    """

    SUMS = ("loss_sum", "count", "correct", "hits", "support", "predicted", "rows", "batch_loss", "batch_ppl",
            "batch_macro")

    def __init__(self, kind: str, num_classes: int, per_batch: bool = False):
        self.kind, self.num_classes, self.per_batch = kind, num_classes, per_batch
        self.reset()

    def reset(self) -> None:
        # sums stay on the model's device (no host sync per step); moved to the CPU to compute
        self.loss_sum = torch.zeros((), dtype=torch.float64)
        self.count = torch.zeros((), dtype=torch.long)
        self.correct = torch.zeros((), dtype=torch.long)
        self.hits = torch.zeros(self.num_classes, dtype=torch.long)
        self.support = torch.zeros(self.num_classes, dtype=torch.long)
        self.predicted = torch.zeros(self.num_classes, dtype=torch.long)
        # per-batch values, each weighted by the batch's rows (per_batch only)
        self.rows = torch.zeros((), dtype=torch.long)
        self.batch_loss = torch.zeros((), dtype=torch.float64)
        self.batch_ppl = torch.zeros((), dtype=torch.float64)
        self.batch_macro = torch.zeros((), dtype=torch.float64)

    def _to(self, device: torch.device) -> None:
        if self.hits.device != device:
            for key in self.SUMS:
                setattr(self, key, getattr(self, key).to(device))

    @torch.no_grad()
    def update(self, outputs: torch.Tensor, targets: torch.Tensor, loss_sum: torch.Tensor) -> None:
        """Add one batch. No host sync: masks weigh the counts instead of selecting positions
        (a boolean index or a bincount makes a GPU wait for its result every step)."""
        increments = metric_increments(self.kind, self.num_classes, self.per_batch, outputs.unsqueeze(0),
                                       targets.unsqueeze(0), loss_sum.reshape(1))
        self.add({key: value[0] for key, value in increments.items()})

    @torch.no_grad()
    def add(self, increments: Mapping[str, torch.Tensor]) -> None:
        """Add sums computed elsewhere (`metric_increments`; a stacked group's, one member's slice)."""
        for key, value in increments.items():
            self._to(value.device)
            getattr(self, key).add_(value)

    def compute(self) -> dict[str, float | None]:
        count = max(int(self.count), 1)
        loss = float(self.loss_sum) / count
        if self.kind == "regression":
            return {"loss": loss, "ppl": None, "acc": None, "macro_acc": None}
        if not math.isfinite(loss):  # diverged: predictions are argmaxes over NaN logits, not answers
            return {"loss": loss, "ppl": None, "acc": None, "macro_acc": None}
        if self.per_batch:
            rows = max(int(self.rows), 1)
            return {"loss": float(self.batch_loss) / rows, "ppl": float(self.batch_ppl) / rows,
                    "acc": int(self.correct) / count, "macro_acc": float(self.batch_macro) / rows}
        macro = float(_macro_accuracy(self.hits.cpu(), self.support.cpu(), self.predicted.cpu()))
        return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "acc": int(self.correct) / count, "macro_acc": macro}

    def state_dict(self) -> dict:
        return {key: getattr(self, key).detach().cpu().clone() for key in self.SUMS}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value.clone())


def metric_increments(kind: str, num_classes: int, per_batch: bool, outputs: torch.Tensor,
                      targets: torch.Tensor, loss_sum: torch.Tensor) -> dict[str, torch.Tensor]:
    """What one batch adds to each of MetricAccumulator's sums, for each member of a leading
    group axis (outputs (G, rows, ..., classes), targets (G, rows, ...), loss_sum (G,)): one
    definition for a run's batch (G = 1) and a stacked group's (`madsl.runner.batched.stacked`).
    Elementwise ops, reductions and scatter-adds only: no host sync, and the same work on
    every call (a CUDA graph can hold it)."""
    groups = targets.shape[0]
    increments = {"loss_sum": loss_sum.double()}
    if kind == "regression":
        increments["count"] = (~torch.isnan(targets)).reshape(groups, -1).sum(-1)
        return increments
    flat_targets = targets.reshape(groups, -1)
    scored = (flat_targets != IGNORE).long()  # 1 at scored positions
    classes = flat_targets.clamp(min=0)  # IGNORE -> class 0, weighed 0 below
    predictions = outputs.reshape(groups, -1, outputs.shape[-1]).argmax(-1)
    hit = (predictions == flat_targets).long() * scored
    hits = _class_counts(classes, hit, num_classes)
    support = _class_counts(classes, scored, num_classes)
    predicted = _class_counts(predictions, scored, num_classes)
    scored_count = scored.sum(-1)
    increments.update(count=scored_count, correct=hit.sum(-1), hits=hits, support=support, predicted=predicted)
    if per_batch:
        rows = targets.shape[1]
        batch_loss = loss_sum.double() / scored_count.clamp(min=1)
        increments.update(rows=torch.full_like(scored_count, rows), batch_loss=rows * batch_loss,
                          batch_ppl=rows * torch.exp(batch_loss.clamp(max=700.0)),
                          batch_macro=rows * _macro_accuracy(hits, support, predicted))
    return increments


def _class_counts(classes: torch.Tensor, weights: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Sum of `weights` per class along the last axis ((..., N) -> (..., num_classes); classes >=
    num_classes, e.g. predicted padding ids, are not counted); like bincount(classes,
    weights)[:num_classes] per row, without its host sync."""
    inside = classes < num_classes
    counts = torch.zeros(*classes.shape[:-1], num_classes, dtype=torch.long, device=classes.device)
    return counts.scatter_add_(-1, torch.where(inside, classes, 0), weights * inside)


def _macro_accuracy(hits: torch.Tensor, support: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """Mean over classes seen as a target or a prediction of hits / support, along the last
    axis (float64; 0 where none)."""
    present = (support + predicted) > 0
    per_class = hits.double() / support.clamp(min=1).double()
    return (per_class * present).sum(-1) / present.sum(-1).clamp(min=1)


@dataclass
class EpochMetrics:
    epoch: int  # 1-based
    lr: float  # learning rate at the end of the epoch
    seconds: float  # wall time of the epoch (training + evaluation)
    train_loss: float
    train_ppl: float | None
    train_acc: float | None
    train_macro_acc: float | None
    eval_loss: float
    eval_ppl: float | None
    eval_acc: float | None
    eval_macro_acc: float | None

    def selection_key(self) -> float:
        """Lower is better: eval perplexity (eval MSE for regression); NaN counts as worst."""
        value = self.eval_ppl if self.eval_ppl is not None else self.eval_loss
        return math.inf if value is None or math.isnan(value) else value


@dataclass
class RunResult:
    epochs_done: int
    best_epoch: int
    best: EpochMetrics  # the epoch with the lowest eval perplexity
    max_eval_macro_acc: float | None  # best eval accuracy over all epochs
    max_eval_acc: float | None
    early_stopped: bool
    train_seconds: float
    history: list[EpochMetrics]
    length_evals: list[dict] = field(default_factory=list)
    diverged_epoch: int | None = None  # the epoch whose loss became NaN / inf; training stopped there

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunResult":
        data = dict(data)
        data["best"] = EpochMetrics(**data["best"])
        data["history"] = [EpochMetrics(**h) for h in data["history"]]
        return cls(**data)


# --- the loop ------------------------------------------------------------------------------

@dataclass
class TrainHooks:
    """Callbacks of a run. `on_epoch` is called after the epoch's checkpoint, where one was due, is written."""

    on_epoch: Callable[[EpochMetrics], None] | None = None
    on_progress: Callable[[int, int, int], None] | None = None  # (epoch, step, steps per epoch)
    should_stop: Callable[[], bool] | None = None
    on_length: Callable[[int, int, int], None] | None = None  # (length, index, count): evaluating at it
    # checkpoint this often (at an epoch's end, or inside a long epoch): a crash loses at most this
    # much training; not every epoch: six members' saves a few times a second would cost a GPU more
    # than their training
    checkpoint_every_s: float = 60.0
    keep_best: bool = False  # hold the best epoch's weights (in the checkpoint) for `--keep best`


def build_optimizer(model: torch.nn.Module, lr: float, wd: float, device: torch.device,
                    conventions: str = "madsl", optimizer: str = "adamw") -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (no biases, norms, or `_no_weight_decay` tensors), betas
    of Table B.1. mad-lab: decay on every trained parameter, AdamW's default betas.
    optimizer "adam": torch.optim.Adam with its own defaults (betas (0.9, 0.999)) on the same groups,
    its weight decay coupled (added to the gradient)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        plain = conventions == MAD_LAB or (p.ndim >= 2 and not getattr(p, "_no_weight_decay", False))
        (decay if plain else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    if optimizer == "adam":
        kind, betas = torch.optim.Adam, (0.9, 0.999)
    else:
        kind, betas = torch.optim.AdamW, (0.9, 0.999) if conventions == MAD_LAB else BETAS
    try:  # the fused kernel makes the step ~25x cheaper on the CPU
        return kind(groups, lr=lr, betas=betas, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return kind(groups, lr=lr, betas=betas)


def build_scheduler(optimizer: torch.optim.Optimizer, settings: TrainSettings,
                    steps_per_epoch: int) -> torch.optim.lr_scheduler.LRScheduler:
    """The learning-rate schedule: cosine to min_lr over the run (stepped per step; per epoch under
    mad-lab), or constant."""
    if settings.schedule == "constant":
        return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    per_epoch = settings.conventions == MAD_LAB  # the reference steps its cosine once per epoch
    return torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=settings.epochs * (1 if per_epoch else steps_per_epoch),
        eta_min=min(settings.min_lr, settings.lr))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available")
    return torch.device(device)


def _epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The data order of an epoch depends on (seed, epoch) only, so a resumed run sees the same."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def same_settings(saved: Mapping[str, Any] | None, settings: TrainSettings) -> bool:
    """A checkpoint's settings are these (checkpoints from before an option existed had its default)."""
    return isinstance(saved, Mapping) and {**IDENTITY_DEFAULTS, **saved} == asdict(settings)


def _loss(model: TaskModel, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss over scored positions for the gradient, summed loss for the metrics)."""
    if model.kind == "regression":
        mask = ~torch.isnan(targets)  # weighed, not selected: no host sync
        squared = F.mse_loss(outputs.float(), targets.nan_to_num(), reduction="none")
        total = torch.where(mask, squared, 0.0).sum()
        count = mask.sum()
    else:
        flat_targets = targets.reshape(-1)
        total = F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]).float(), flat_targets,
                                ignore_index=IGNORE, reduction="sum")
        count = (flat_targets != IGNORE).sum()
    return total / count.clamp(min=1), total.detach()


@torch.no_grad()
def evaluate(model: TaskModel, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int,
             num_classes: int, precision: str = "fp32", per_batch: bool = False) -> dict[str, float | None]:
    was_training = model.training
    model.eval()
    acc = MetricAccumulator(model.kind, num_classes, per_batch)
    for start in range(0, inputs.shape[0], batch_size):
        x, y = inputs[start:start + batch_size], targets[start:start + batch_size]
        with autocast(precision, x.device):
            outputs = model(x)
        _, loss_sum = _loss(model, outputs, y)
        acc.update(outputs, y, loss_sum)
    model.train(was_training)
    return acc.compute()


def _to_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
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
        return cls(_to_tensor(train_data.inputs, device), _to_tensor(train_data.targets, device),
                   _to_tensor(test_data.inputs, device), _to_tensor(test_data.targets, device))


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
    def start(cls, settings: TrainSettings, build_model: Callable[[], TaskModel], device: torch.device,
              num_train: int, num_classes: int) -> "RunState":
        """A fresh run: seeded, so the model's init is deterministic."""
        _seed_everything(settings.seed)
        model = build_model().to(device)
        optimizer = build_optimizer(model, settings.lr, settings.wd, device, settings.conventions, settings.optimizer)
        steps_per_epoch = math.ceil(num_train / settings.batch_size)
        per_epoch = settings.conventions == MAD_LAB  # the reference aggregates its metrics per batch
        scheduler = build_scheduler(optimizer, settings, steps_per_epoch)
        return cls(settings, model, optimizer, scheduler, MetricAccumulator(model.kind, num_classes, per_epoch),
                   steps_per_epoch, num_classes)

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, Any], settings: TrainSettings,
                        build_model: Callable[[], TaskModel], device: torch.device, num_train: int,
                        num_classes: int) -> "RunState":
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
            warnings.warn(f"run {self.run_id or ''} resumes with {torch.get_num_threads()} torch thread(s); its "
                          f"first {self.epoch} epoch(s) trained with {threads}: its results can differ in the last "
                          "digits from a run trained with one thread count throughout", RuntimeWarning, stacklevel=2)
        return self

    def to_checkpoint(self, result: RunResult | None = None) -> dict:
        return {
            "settings": asdict(self.settings),
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "train_metrics": self.train_metrics.state_dict(),
            "rng": rng_state(), "epoch": self.epoch, "step": self.step, "epoch_seconds": self.epoch_seconds,
            "train_seconds": self.train_seconds, "history": [asdict(h) for h in self.history],
            "best": asdict(self.best) if self.best else None, "best_state": self.best_state,
            "finished": self.finished, "length_evals": self.length_evals, "diverged_epoch": self.diverged_epoch,
            "run_id": self.run_id, "result": result.to_dict() if result is not None else None,
            "threads": torch.get_num_threads()}

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
            self.best_state = ({k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
                               if self.settings.eval_lengths or self.keep_best else None)
        self.epoch, self.step, self.epoch_seconds = self.epoch + 1, 0, 0.0
        self.train_metrics.reset()
        self.finished = (self.solved(metrics) or self.stalled() or self.diverged_epoch is not None
                         or self.epoch >= self.settings.epochs)

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
        return patience is not None and stale_epochs([h.eval_loss for h in self.history],
                                                     self.settings.min_delta) >= patience

    def result(self) -> RunResult:
        assert self.best is not None
        accs = [h.eval_macro_acc for h in self.history if h.eval_macro_acc is not None]
        token_accs = [h.eval_acc for h in self.history if h.eval_acc is not None]
        return RunResult(
            epochs_done=len(self.history), best_epoch=self.best.epoch, best=self.best,
            max_eval_macro_acc=max(accs) if accs else None, max_eval_acc=max(token_accs) if token_accs else None,
            early_stopped=len(self.history) < self.settings.epochs and self.diverged_epoch is None,
            train_seconds=self.train_seconds,
            history=self.history, length_evals=self.length_evals, diverged_epoch=self.diverged_epoch)


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


def train_step(state: RunState, x: torch.Tensor, y: torch.Tensor) -> None:
    """One optimizer step on the batch (x, y): forward, backward, AdamW, the schedule (per
    step; mad-lab's per epoch, in epoch_metrics) and the epoch's train-metric sums."""
    model = state.model
    with autocast(state.settings.precision, x.device):  # the forward only; backward follows its dtypes
        outputs = model(x)
    loss, loss_sum = _loss(model, outputs, y)
    state.optimizer.zero_grad(set_to_none=True)
    (loss + model.aux_loss()).backward()
    state.optimizer.step()
    if state.settings.conventions != MAD_LAB:
        state.scheduler.step()
    state.train_metrics.update(outputs.detach(), y, loss_sum)


def train_epoch(state: RunState, data: RunData, hooks: TrainHooks, checkpointer: Checkpointer) -> EpochMetrics:
    """Train the rest of `state.epoch` from `state.step`, then evaluate; raises RunInterrupted on a stop."""
    settings = state.settings
    order = _epoch_order(data.train_x.shape[0], settings.seed, state.epoch).to(data.train_x.device)
    started = time.monotonic()

    def bank_time() -> None:  # move the time since `started` into the run's clocks
        nonlocal started
        elapsed = time.monotonic() - started
        state.epoch_seconds += elapsed
        state.train_seconds += elapsed
        started = time.monotonic()

    while state.step < state.steps_per_epoch:
        if hooks.should_stop is not None and hooks.should_stop():
            bank_time()
            checkpointer.save(state)
            raise RunInterrupted(f"stopped at epoch {state.epoch + 1}, step {state.step}")
        index = order[state.step * settings.batch_size:(state.step + 1) * settings.batch_size]
        train_step(state, data.train_x[index], data.train_y[index])
        state.step += 1
        if hooks.on_progress is not None:
            hooks.on_progress(state.epoch + 1, state.step, state.steps_per_epoch)
        if checkpointer.due() and state.step < state.steps_per_epoch:  # long epochs: checkpoint mid-way
            bank_time()
            checkpointer.save(state)

    return epoch_metrics(state, data, started)


def eval_batch_size(settings: TrainSettings) -> int:
    """Evaluation batches: at least EVAL_BATCH rows; mad-lab's accuracy depends on how the test
    set is batched, so under its conventions the training batch size, as there."""
    return settings.batch_size if settings.conventions == MAD_LAB else max(settings.batch_size, EVAL_BATCH)


def epoch_metrics(state: RunState, data: RunData, started: float,
                  evaluation: Mapping[str, float | None] | None = None) -> EpochMetrics:
    """Close the epoch's training: evaluate (unless `evaluation` is given: a stacked group's,
    madsl.runner.batched.stacked) and return its metrics; the time since `started` (not yet banked)
    counts towards the epoch and the run."""
    settings = state.settings
    mad_lab = settings.conventions == MAD_LAB
    if mad_lab:
        state.scheduler.step()  # once per epoch, after its last step
    train = state.train_metrics.compute()
    if evaluation is None:
        evaluation = evaluate(state.model, data.test_x, data.test_y, eval_batch_size(settings), state.num_classes,
                              settings.precision, mad_lab)
    elapsed = time.monotonic() - started
    state.train_seconds += elapsed
    return EpochMetrics(
        epoch=state.epoch + 1, lr=state.scheduler.get_last_lr()[0], seconds=state.epoch_seconds + elapsed,
        train_loss=train["loss"], train_ppl=train["ppl"], train_acc=train["acc"],
        train_macro_acc=train["macro_acc"], eval_loss=evaluation["loss"], eval_ppl=evaluation["ppl"],
        eval_acc=evaluation["acc"], eval_macro_acc=evaluation["macro_acc"])


def evaluate_lengths(state: RunState, length_data: Callable[[int], Any], tokens_per_batch: int,
                     device: torch.device, hooks: TrainHooks, checkpointer: Checkpointer) -> None:
    """Evaluate the best weights at each of settings.eval_lengths not yet done, appending to state.length_evals.

    One length at a time, each checkpointed: long lengths can take hours (attention is
    quadratic), and a stop or a crash must not lose the lengths already done.
    """
    if state.best_state is not None:
        state.model.load_state_dict(state.best_state)
    lengths = state.settings.eval_lengths
    for index in range(len(state.length_evals), len(lengths)):
        if hooks.should_stop is not None and hooks.should_stop():
            checkpointer.save(state)
            raise RunInterrupted(f"stopped before evaluating at length {lengths[index]} "
                                 f"({index} of {len(lengths)} lengths done)")
        if hooks.on_length is not None:
            hooks.on_length(lengths[index], index, len(lengths))
        state.length_evals.append(_evaluate_length(state.model, lengths[index], length_data, tokens_per_batch,
                                                   state.num_classes, device, state.settings.precision))
        checkpointer.save(state)


def open_run(settings: TrainSettings, build_model: Callable[[], TaskModel], device: torch.device, num_train: int,
             num_classes: int, checkpoint_path: Path | None, keep_best: bool = False,
             run_id: str | None = None) -> "RunState | RunResult":
    """The run as its checkpoint left it (fresh when there is none), or its result when it had finished
    and only the bookkeeping was lost. A checkpoint of another run is a CheckpointError: other training
    settings, or another run id (same settings, another model: two specs sharing a checkpoint path)."""
    saved = load_checkpoint(checkpoint_path) if checkpoint_path is not None else None
    if saved is not None:
        if not same_settings(saved.get("settings"), settings):
            raise CheckpointError(checkpoint_path, "belongs to another run (other training settings)")
        if run_id is not None and saved.get("run_id") not in (None, run_id):
            raise CheckpointError(checkpoint_path, f"belongs to another run ({str(saved['run_id'])[:16]}…, "
                                                   f"not {run_id[:16]}…)")
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
            raise CheckpointError(checkpoint_path, f"does not hold this run's state ({type(err).__name__}: "
                                                   f"{str(err)[:200]})") from None
    return state


def train_run(settings: TrainSettings, build_model: Callable[[], TaskModel], train_data, test_data, *,
              num_classes: int, device: torch.device | str = "cpu", checkpoint_path: Path | None = None,
              hooks: TrainHooks | None = None,
              length_data: Callable[[int], Any] | None = None, run_id: str | None = None) -> RunResult:
    """Train one run to the end (or raise RunInterrupted), resuming from `checkpoint_path` if it exists.

    build_model: returns a fresh TaskModel; called after seeding, so its init is deterministic.
    train_data, test_data: TaskData (numpy inputs / targets).
    length_data: for settings.eval_lengths, returns the test TaskData at a sequence length.
    run_id: written into the checkpoint; a checkpoint at `checkpoint_path` of another run id is refused.
    """
    hooks = hooks or TrainHooks()
    device = torch.device(device) if isinstance(device, str) else device
    checkpoint_path = Path(checkpoint_path) if checkpoint_path is not None else None
    state = open_run(settings, build_model, device, train_data.inputs.shape[0], num_classes, checkpoint_path,
                     hooks.keep_best, run_id)
    if isinstance(state, RunResult):
        return state
    data = RunData.from_tasks(train_data, test_data, device)
    checkpointer = Checkpointer(checkpoint_path, hooks.checkpoint_every_s)
    configure_device(device)

    state.model.train()
    while not state.finished:
        metrics = train_epoch(state, data, hooks, checkpointer)
        state.end_epoch(metrics)
        checkpointer.save_if_due(state)
        if hooks.on_epoch is not None:
            hooks.on_epoch(metrics)

    if settings.eval_lengths and length_data is not None:
        tokens_per_batch = settings.batch_size * max(int(train_data.inputs.shape[1]), 1)
        evaluate_lengths(state, length_data, tokens_per_batch, device, hooks, checkpointer)

    result = state.result()
    checkpointer.save(state, result)
    return result


def release_device_memory() -> None:
    """What freed tensors left cached in this process (a stack that ran out of memory, a plan's
    step measurements), back to the GPU, for what trains next or in the other processes."""
    gc.collect()  # (a failed stack's tensors can sit in reference cycles)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def is_out_of_memory(err: BaseException) -> bool:
    """Whether `err` is the device (or the host) running out of memory."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("out of memory" in text or "can't allocate" in text
                                              or "not enough memory" in text)


def _evaluate_length(model: TaskModel, length: int, length_data: Callable[[int], Any], tokens_per_batch: int,
                     num_classes: int, device: torch.device, precision: str = "fp32") -> dict:
    """Evaluate the best model at another sequence length; running out of memory is a result, not a crash."""
    started = time.monotonic()
    try:
        data = length_data(length)
        x, y = _to_tensor(data.inputs, device), _to_tensor(data.targets, device)
        metrics = evaluate(model, x, y, max(1, tokens_per_batch // max(length, 1)), num_classes, precision)
        status = "ok"
    except Exception as err:  # noqa: BLE001 - any failure at one length must not lose the run
        if not is_out_of_memory(err):
            metrics, status = {"error": f"{type(err).__name__}: {err}"}, "error"
        else:
            metrics, status = {}, "oom"
        release_device_memory()
    return {"length": length, "status": status, "seconds": time.monotonic() - started, **metrics}
