"""A run's optimizer and learning-rate schedule.

MAD paper Table B.1: AdamW with betas (0.9, 0.98), weight decay on matrices only, cosine
decay to `min_lr` over the run, stepped every optimizer step. Under the reference
implementation's conventions (`settings.conventions == "mad-lab"`): AdamW with its default
betas (0.9, 0.999) and weight decay on every parameter, the cosine schedule stepped once per
epoch (T_max = epochs).

Apart from the loop because a run's optimizer is also built to measure a step's memory and
time before anything trains (`madsl.runner.plan.cost`), and a stacked group applies the
optimizer's own parameter groups to its members (`madsl.runner.batched.stacked`).
"""

from __future__ import annotations

import torch

from madsl.conventions import MAD_LAB
from madsl.runner.common.records import TrainSettings

BETAS = (0.9, 0.98)  # MAD paper Table B.1


def build_optimizer(
    model: torch.nn.Module,
    lr: float,
    wd: float,
    device: torch.device,
    conventions: str = "madsl",
    optimizer: str = "adamw",
    betas: tuple[float, float] | None = None,
) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (no biases, norms, or `_no_weight_decay` tensors), betas
    of Table B.1. mad-lab: decay on every trained parameter, AdamW's default betas.
    optimizer "adam": torch.optim.Adam with its own defaults (betas (0.9, 0.999)) on the same groups,
    its weight decay coupled (added to the gradient). `betas`: AdamW's, where a recipe sets its own
    (pretraining: the paper's (0.9, 0.95), madsl.runner.pretrain.recipe)."""
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
        kind, betas = torch.optim.AdamW, betas or ((0.9, 0.999) if conventions == MAD_LAB else BETAS)
    try:  # the fused kernel makes the step ~25x cheaper on the CPU
        return kind(groups, lr=lr, betas=betas, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return kind(groups, lr=lr, betas=betas)


def build_scheduler(
    optimizer: torch.optim.Optimizer, settings: TrainSettings, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """The learning-rate schedule: cosine to min_lr over the run (stepped per step; per epoch under
    mad-lab), or constant."""
    if settings.schedule == "constant":
        return torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    per_epoch = settings.conventions == MAD_LAB  # the reference steps its cosine once per epoch
    return torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer,
        T_max=settings.epochs * (1 if per_epoch else steps_per_epoch),
        eta_min=min(settings.min_lr, settings.lr),
    )
