"""What a run measures: the loss, the metric sums of a pass over a split, an evaluation
of a model on a split, and the records of an epoch (`EpochMetrics`) and of a run (`RunResult`).

Accuracy is the class-averaged ("macro") accuracy over scored positions, as
torchmetrics' MulticlassAccuracy computes it in the reference implementation;
per-token accuracy is recorded next to it. Under the reference implementation's
conventions an epoch's loss, perplexity and accuracy are as its logger reports them: the
batch-size-weighted mean of per-batch values (each batch's accuracy class-averaged over
that batch alone).

Apart from the loop because a stacked group (`madsl.runner.batched.stacked`) adds into the
same sums for all its members at once: one definition of every metric for both.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from madsl.conventions import MAD_LAB
from madsl.runner.common.records import TrainSettings
from madsl.runner.train.heads import TaskModel
from madsl.runner.train.precision import autocast

IGNORE = -100

EVAL_BATCH = 128  # evaluation batches are at least this large (no gradients: memory is not the limit)


class MetricAccumulator:
    """Sums over one pass through a split: loss, token counts, per-class hits.

    Class-averaged accuracy follows torchmetrics' macro average: the mean over
    classes of hits / occurrences as targets, over classes that occur as a target
    or a prediction (a class only ever predicted, wrongly, counts as 0).

    per_batch: loss, perplexity and class-averaged accuracy are computed per batch and
    averaged over batches weighted by their rows (how mad-lab's Lightning logger
    aggregates `on_epoch`); otherwise over the whole pass.
    """

    SUMS = (
        "loss_sum",
        "count",
        "correct",
        "hits",
        "support",
        "predicted",
        "rows",
        "batch_loss",
        "batch_ppl",
        "batch_macro",
    )

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
        increments = metric_increments(
            self.kind, self.num_classes, self.per_batch, outputs.unsqueeze(0), targets.unsqueeze(0), loss_sum.reshape(1)
        )
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
            return {
                "loss": float(self.batch_loss) / rows,
                "ppl": float(self.batch_ppl) / rows,
                "acc": int(self.correct) / count,
                "macro_acc": float(self.batch_macro) / rows,
            }
        macro = float(_macro_accuracy(self.hits.cpu(), self.support.cpu(), self.predicted.cpu()))
        return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "acc": int(self.correct) / count, "macro_acc": macro}

    def state_dict(self) -> dict:
        return {key: getattr(self, key).detach().cpu().clone() for key in self.SUMS}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value.clone())


def metric_increments(
    kind: str, num_classes: int, per_batch: bool, outputs: torch.Tensor, targets: torch.Tensor, loss_sum: torch.Tensor
) -> dict[str, torch.Tensor]:
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
        increments.update(
            rows=torch.full_like(scored_count, rows),
            batch_loss=rows * batch_loss,
            batch_ppl=rows * torch.exp(batch_loss.clamp(max=700.0)),
            batch_macro=rows * _macro_accuracy(hits, support, predicted),
        )
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


def task_loss(model: TaskModel, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss over scored positions for the gradient, summed loss for the metrics)."""
    if model.kind == "regression":
        mask = ~torch.isnan(targets)  # weighed, not selected: no host sync
        squared = F.mse_loss(outputs.float(), targets.nan_to_num(), reduction="none")
        total = torch.where(mask, squared, 0.0).sum()
        count = mask.sum()
    else:
        flat_targets = targets.reshape(-1)
        total = F.cross_entropy(
            outputs.reshape(-1, outputs.shape[-1]).float(), flat_targets, ignore_index=IGNORE, reduction="sum"
        )
        count = (flat_targets != IGNORE).sum()
    return total / count.clamp(min=1), total.detach()


@torch.no_grad()
def evaluate(
    model: TaskModel,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    batch_size: int,
    num_classes: int,
    precision: str = "fp32",
    per_batch: bool = False,
) -> dict[str, float | None]:
    """The model's loss and accuracies on (inputs, targets), in batches of `batch_size`, without
    gradients (its train / eval mode left as it was)."""
    was_training = model.training
    model.eval()
    acc = MetricAccumulator(model.kind, num_classes, per_batch)
    for start in range(0, inputs.shape[0], batch_size):
        x, y = inputs[start : start + batch_size], targets[start : start + batch_size]
        with autocast(precision, x.device):
            outputs = model(x)
        _, loss_sum = task_loss(model, outputs, y)
        acc.update(outputs, y, loss_sum)
    model.train(was_training)
    return acc.compute()


def eval_batch_size(settings: TrainSettings) -> int:
    """Evaluation batches: at least EVAL_BATCH rows; mad-lab's accuracy depends on how the test
    set is batched, so under its conventions the training batch size, as there."""
    return settings.batch_size if settings.conventions == MAD_LAB else max(settings.batch_size, EVAL_BATCH)


@dataclass
class EpochMetrics:
    """What one epoch recorded: its train metrics, its evaluation and its learning rate."""

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
    """A finished run: every epoch's metrics, the best epoch (the run's score) and how it ended."""

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
