"""Mamba's selective scan as the plain sequential recurrence, differentiated by autograd: what the
fused CPU scan (`selective_scan`) and the chunked scan (`selective_scan_chunked`) are tested and
benchmarked against. Not for training: autograd keeps every step's state, and every step costs
several ops."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels.precision import compute_dtype
from madsl.kernels.selective_scan_cpu import grouped_bc


def selective_scan_reference(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
):
    """The recurrence of the module docstring of `selective_scan`, step by step; arguments and
    result as `selective_scan_cpu` (B, C (batch, d_state, L) or grouped (batch, groups, d_state, L))."""
    dtype_in = u.dtype
    cdtype = compute_dtype(dtype_in)
    u, delta, A, B, C = (x.to(cdtype) for x in (u, delta, A, B, C))
    if delta_bias is not None:
        delta = delta + delta_bias.to(cdtype)[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    batch, d_inner, length = u.shape
    # every channel's own B and C: (batch, d_inner, d_state, L)
    B, C = (grouped_bc(x).repeat_interleave(d_inner // grouped_bc(x).shape[1], dim=1) for x in (B, C))
    h = u.new_zeros(batch, d_inner, A.shape[1])
    ys = []
    for t in range(length):
        delta_step = delta[:, :, t].unsqueeze(-1)
        h = torch.exp(delta_step * A) * h + delta_step * u[:, :, t, None] * B[..., t]
        ys.append(torch.matmul(h.unsqueeze(-2), C[..., t, None]).squeeze(-1).squeeze(-1))
    y = torch.stack(ys, dim=2)
    if D is not None:
        y = y + u * D.to(cdtype)[:, None]
    if z is not None:
        y = y * F.silu(z.to(cdtype))
    y = y.to(dtype_in)
    return (y, h) if return_last_state else y
