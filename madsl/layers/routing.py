"""Routing weights of the mixture-of-experts layers (`MoE`, `He`) from their router's logits."""

from __future__ import annotations

import torch
from torch import Tensor


def route(logits: Tensor, active: int, leaky: bool, **options) -> Tensor:
    """Weights (..., experts) from logits (..., experts).

    Sparse (the default): the chosen experts' weights (`choose`), exactly 0 for every other expert.
    Leaky (`leaky_routing`, the MAD reference's MoeMlp and HyenaExpertsOperator): the logits
    below the `active`-th largest are set to 0 (not -inf) and the softmax runs over all
    experts, so an unselected expert keeps weight e^0 / Z (all logits tied at the k-th keep theirs).
    """
    if leaky:
        top = logits.topk(active, dim=-1)
        return torch.where(logits < top.values[..., -1:], torch.zeros_like(logits), logits).softmax(dim=-1)
    indices, weights = choose(logits, active, **options)
    return torch.zeros_like(logits).scatter(-1, indices, weights)


def choose(
    logits: Tensor,
    active: int,
    *,
    normalize_top: bool = True,
    scores: str = "softmax",
    bias: Tensor | None = None,
    scale: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """(the chosen experts (..., active), their weights (..., active)) from logits (..., experts).

    softmax (the default): the `active` largest logits (ties broken by torch.topk), weighted by a
    softmax over them (Mixtral); not `normalize_top`: by their probabilities of a softmax over all
    experts (Jamba). sigmoid (DeepSeek-V3, Nemotron-H, LFM2-MoE): each expert's score is the
    sigmoid of its logit; the experts with the largest scores plus `bias` (a selection bias, which
    picks but does not weigh) are chosen and weighted by their scores, divided by their sum where
    `normalize_top`. Every weight is then multiplied by `scale` (routed_scaling_factor)."""
    if scores == "sigmoid":
        probabilities = torch.sigmoid(logits)
        indices = (probabilities if bias is None else probabilities + bias).topk(active, dim=-1).indices
        weights = probabilities.gather(-1, indices)
        if normalize_top:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    else:
        top = logits.topk(active, dim=-1)
        indices = top.indices
        weights = torch.softmax(top.values, dim=-1) if normalize_top else top_probabilities(logits, indices)
    return indices, weights if scale == 1.0 else weights * scale


def top_probabilities(logits: Tensor, indices: Tensor) -> Tensor:
    """The probabilities of a softmax over all experts, at `indices` (the chosen experts)."""
    return torch.softmax(logits.float(), dim=-1).to(logits.dtype).gather(-1, indices)
