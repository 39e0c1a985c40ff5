"""The short causal depthwise convolution that modern recurrent layers put before their mixer
(Mamba-2, DeltaNet, Gated DeltaNet): `taps` taps per channel, then SiLU.

Parallel form: a grouped Conv1d padded on the left. Step form: the last taps - 1 inputs of
every channel are the state, (batch, channels, taps - 1), which the accounting counts as
conv_state. `taps` 1 is a per-channel scale with no state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def depthwise_conv1d(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """conv(x) with its weight and bias in x's dtype. Under vmap (stacked grid training) torch's
    convolution batching rule leaves the bias out of autocast's casts (a bf16 input with a
    float32 bias fails); outside vmap autocast casts both to x's dtype itself, so this is the
    same computation."""
    bias = None if conv.bias is None else conv.bias.to(x.dtype)
    return F.conv1d(x, conv.weight.to(x.dtype), bias, conv.stride, conv.padding, conv.dilation, conv.groups)


class ShortConv(nn.Module):
    def __init__(self, channels: int, taps: int, bias: bool):
        super().__init__()
        self.channels, self.taps = channels, taps
        self.conv = nn.Conv1d(channels, channels, kernel_size=taps, groups=channels, padding=taps - 1, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (batch, L, channels) -> SiLU(conv(x)) (batch, L, channels)."""
        length = x.shape[1]
        return F.silu(depthwise_conv1d(self.conv, x.transpose(1, 2))[..., :length].transpose(1, 2))

    def init_state(self, batch: int, device=None, dtype=None) -> Tensor:
        weight = self.conv.weight
        return torch.zeros(
            batch, self.channels, self.taps - 1, device=device or weight.device, dtype=dtype or weight.dtype
        )

    def step(self, x_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """x_t (batch, channels), state (batch, channels, taps - 1) -> (SiLU(conv) at t, new state)."""
        window = torch.cat((state, x_t.unsqueeze(-1)), dim=-1)  # (batch, channels, taps)
        y = (window * self.conv.weight[:, 0]).sum(-1)
        if self.conv.bias is not None:
            y = y + self.conv.bias
        return F.silu(y), window[..., 1:]
