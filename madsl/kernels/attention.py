"""Scaled dot-product attention with a member fold (`madsl.kernels.member_fold`).

`scaled_dot_product_attention` is torch's SDPA (which picks its fused backend itself).
SDPA's fused kernels have no vmap batching rule: vmap would loop over the members of a
stacked model, one kernel launch each (and the memory-efficient kernel's backward rejects
the per-member logsumexp views of that loop, H100 fp32). Under vmap the members are
folded into the batch axis instead, (members, batch, heads, L, hd) -> (members * batch,
heads, L, hd): one SDPA call for all members, forward and backward.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from madsl.kernels import member_fold


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """torch's SDPA (q (B, heads, L, hd), k and v (B, heads, S, hd)), one call for all members under vmap.
    `attn_mask` (L, S) must be the same for every member (a causal or banded mask is)."""
    if member_fold.active():
        return member_fold.folded(_SDPAFold, q, k, v, attn_mask, is_causal, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


class _SDPAFold:
    call = staticmethod(scaled_dot_product_attention)

    @staticmethod
    def fold(
        members: int,
        in_dims: tuple,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None,
        is_causal: bool,
        scale: float | None,
    ) -> tuple[Tensor, int]:
        member_fold.unbatched("scaled_dot_product_attention", in_dims, [3])
        q, k, v = (member_fold.into_batch(x, d, members) for x, d in zip((q, k, v), in_dims))
        y = scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale)
        return member_fold.out_of_batch(y, members), 0
