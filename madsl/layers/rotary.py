"""Rotary position embeddings at given positions (rotate-half convention, GPT-NeoX / Llama), for
the recurrent layers that rotate q and k (retention): positions come from the caller, so the
parallel form and step mode rotate a token alike."""

from __future__ import annotations

import torch
from torch import Tensor


def rotate(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """x (..., L, heads, head_dim) rotated by positions (L,) or (batch, 1) broadcastable to x's
    leading dims; computed in x's dtype at float32 precision or better."""
    head_dim = x.shape[-1]
    precision = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv_freq = base ** -(torch.arange(0, head_dim, 2, device=x.device, dtype=precision) / head_dim)
    angles = positions.to(precision).unsqueeze(-1) * inv_freq  # (..., head_dim / 2)
    angles = torch.cat((angles, angles), dim=-1).unsqueeze(-2)  # broadcast over heads
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin
