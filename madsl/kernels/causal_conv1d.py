"""causal-conv1d's depthwise causal convolution (Mamba's short convolution on CUDA), with
a member fold (`madsl.kernels.member_fold`): under vmap the members of a stacked model
fold into the channels, x (members, batch, channels, L) -> (batch, members * channels, L)
with the members' weights and biases concatenated, and the kernel runs once for all.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from madsl.kernels import member_fold


def causal_conv1d_silu(kernel: Callable, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """SiLU(causal depthwise conv) by `kernel` (causal-conv1d's `causal_conv1d_fn`): x (batch,
    channels, L), weight (channels, width), bias (channels,) or None -> (batch, channels, L)."""
    if member_fold.active():
        return member_fold.folded(_ConvFold, kernel, x, weight, bias)
    return kernel(x, weight, bias, activation="silu")


class _ConvFold:
    call = staticmethod(causal_conv1d_silu)

    @staticmethod
    def fold(
        members: int, in_dims: tuple, kernel: Callable, x: Tensor, weight: Tensor, bias: Tensor | None
    ) -> tuple[Tensor, int]:
        x = member_fold.member_first(x, in_dims[1], members)  # (members, batch, channels, L)
        x = x.transpose(0, 1).reshape(x.shape[1], -1, x.shape[3]).contiguous()
        weight = member_fold.member_first(weight, in_dims[2], members).flatten(0, 1)
        bias = None if bias is None else member_fold.member_first(bias, in_dims[3], members).flatten(0, 1)
        return causal_conv1d_silu(kernel, x, weight, bias).unflatten(1, (members, -1)), 1
