"""Routing weights of the mixture-of-experts layers (`MoE`, `He`) from their router's logits."""

from __future__ import annotations

import torch
from torch import Tensor


def route(logits: Tensor, active: int, leaky: bool) -> Tensor:
    """Weights (..., experts) from logits (..., experts).

    Sparse (the default): a softmax over each token's `active` largest logits, exactly 0 for
    every other expert (ties at the k-th logit broken by torch.topk).
    Leaky (`leaky_routing`, the MAD reference's MoeMlp and HyenaExpertsOperator): the logits
    below the `active`-th largest are set to 0 (not -inf) and the softmax runs over all
    experts, so an unselected expert keeps weight e^0 / Z (all logits tied at the k-th keep theirs).
    """
    top = logits.topk(active, dim=-1)
    if leaky:
        return torch.where(logits < top.values[..., -1:], torch.zeros_like(logits), logits).softmax(dim=-1)
    return torch.zeros_like(logits).scatter(-1, top.indices, torch.softmax(top.values, dim=-1))
