"""Mamba's selective scan, dispatched by device: `selective_scan` runs the fused CPU scan
(madsl/kernels/selective_scan_cpu.py: its semantics and shapes, those of mamba-ssm's
`selective_scan_fn`) on the CPU; on CUDA mamba-ssm's kernel, or without it the chunked parallel
scan of `selective_scan_chunked` (the CPU scan's step-by-step loop would launch several kernels
per time step on a GPU). Under vmap (grid-batched training) it folds the members into the
channels and scans once (`madsl.kernels.member_fold`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from madsl.kernels import cuda, member_fold
from madsl.kernels.selective_scan_chunked import selective_scan_chunked
from madsl.kernels.selective_scan_cpu import selective_scan_cpu


def selective_scan(
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
    """Dispatch. CUDA tensors: mamba-ssm's `selective_scan_fn` when it imports, else the
    chunked parallel scan (`selective_scan_chunked`, after a one-time warning naming the
    extra); never this module's step-by-step loop. Other devices: the fused CPU scan.
    Under vmap: the members folded into the channels, one scan for all (`_ScanFold`)."""
    if member_fold.active():
        return member_fold.folded(_ScanFold, u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    if u.is_cuda:
        cuda_scan = cuda.selective_scan_fn() if u.dtype != torch.float64 else None
        if cuda_scan is not None:
            return cuda_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
        return selective_scan_chunked(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    return selective_scan_cpu(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)


class _ScanFold:
    """Members into channels: u, delta, z (members, batch, d_inner, L) -> (batch, members *
    d_inner, L); A, D, delta_bias concatenated along the channels; B, C (members, batch,
    [groups,] d_state, L) -> (batch, members * groups, d_state, L), so that each member's
    channels read its own B and C (the scans' grouped B, C). The channels of different
    members never mix: the scan is exactly each member's."""

    call = staticmethod(selective_scan)

    @staticmethod
    def fold(
        members: int,
        in_dims: tuple,
        u: Tensor,
        delta: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        D: Tensor | None,
        z: Tensor | None,
        delta_bias: Tensor | None,
        delta_softplus: bool,
        return_last_state: bool,
    ):
        def first(x: Tensor | None, d: int | None) -> Tensor | None:
            return None if x is None else member_fold.member_first(x, d, members)

        def channels(x: Tensor | None, d: int | None) -> Tensor | None:  # -> (batch, members * d_inner, L)
            if x is None:
                return None
            x = first(x, d)  # (members, batch, d_inner, L)
            batch, length = x.shape[1], x.shape[3]
            if x.is_cuda:  # the CUDA kernels read time-contiguous rows
                return x.transpose(0, 1).reshape(batch, -1, length)
            # the CPU scan reads channel-contiguous (batch, L, channels) storage in place
            return x.permute(1, 3, 0, 2).reshape(batch, length, -1).transpose(1, 2)

        def groups(x: Tensor, d: int | None) -> Tensor:  # -> (batch, members * groups, d_state, L)
            x = first(x, d)
            x = x.unsqueeze(2) if x.dim() == 4 else x  # (members, batch, groups, d_state, L)
            return x.transpose(0, 1).flatten(1, 2)

        flat = [
            None if x is None else first(x, d).flatten(0, 1) for x, d in ((D, in_dims[5]), (delta_bias, in_dims[7]))
        ]
        out = selective_scan(
            channels(u, in_dims[0]),
            channels(delta, in_dims[1]),
            first(A, in_dims[2]).flatten(0, 1),
            groups(B, in_dims[3]),
            groups(C, in_dims[4]),
            flat[0],
            channels(z, in_dims[6]),
            flat[1],
            delta_softplus,
            return_last_state,
        )
        # (batch, members * d_inner, ...) -> (batch, members, d_inner, ...): the member axis is 1
        if return_last_state:
            return tuple(x.unflatten(1, (members, -1)) for x in out), (1, 1)
        return out.unflatten(1, (members, -1)), 1
