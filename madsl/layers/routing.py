"""Routing weights of the mixture-of-experts layers (`MoE`, `He`) from their router's logits."""

from __future__ import annotations

import torch
from torch import Tensor


def route(logits: Tensor, active: int, leaky: bool, normalize_top: bool = True) -> Tensor:
    """Weights (..., experts) from logits (..., experts).

    Sparse (the default): a softmax over each token's `active` largest logits, exactly 0 for
    every other expert (ties at the k-th logit broken by torch.topk).
    Leaky (`leaky_routing`, the MAD reference's MoeMlp and HyenaExpertsOperator): the logits
    below the `active`-th largest are set to 0 (not -inf) and the softmax runs over all
    experts, so an unselected expert keeps weight e^0 / Z (all logits tied at the k-th keep theirs).
    Not `normalize_top` (Jamba): the chosen experts' probabilities of a softmax over all experts.
    """
    top = logits.topk(active, dim=-1)
    if leaky:
        return torch.where(logits < top.values[..., -1:], torch.zeros_like(logits), logits).softmax(dim=-1)
    chosen = torch.softmax(top.values, dim=-1) if normalize_top else top_probabilities(logits, top.indices)
    return torch.zeros_like(logits).scatter(-1, top.indices, chosen)


def top_probabilities(logits: Tensor, indices: Tensor) -> Tensor:
    """The probabilities of a softmax over all experts, at `indices` (the chosen experts)."""
    return torch.softmax(logits.float(), dim=-1).to(logits.dtype).gather(-1, indices)
