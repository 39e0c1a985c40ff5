"""Gated short convolution (`GConv`): the torch module of `madsl.primitives.gated_conv`.

    B, C, x = split(in_proj(u));  y = C * conv(B * x);  out = out_proj(y)

The conv is depthwise and causal (padded on the left), with no activation. Step mode keeps
the last d_conv - 1 gated inputs B * x of every channel: state {"conv": (batch, dim, d_conv - 1)}.

Init: PyTorch's default for the three (as Hugging Face's Lfm2ShortConv before its model's init).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from madsl.layers.short_conv import depthwise_conv1d
from madsl.primitives.gated_conv import GatedConv as GatedConvPrimitive


class GatedConv(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches

    def __init__(self, p: GatedConvPrimitive):
        super().__init__()
        self.dim, self.taps = p.dim, p.d_conv
        self.in_proj = nn.Linear(p.dim, 3 * p.dim, bias=p.bias)
        self.conv = nn.Conv1d(p.dim, p.dim, kernel_size=p.d_conv, groups=p.dim, padding=p.d_conv - 1, bias=p.bias)
        self.out_proj = nn.Linear(p.dim, p.dim, bias=p.bias)

    def forward(self, u: Tensor) -> Tensor:
        B, C, x = self.in_proj(u).chunk(3, dim=-1)
        length = u.shape[1]
        convolved = depthwise_conv1d(self.conv, (B * x).transpose(1, 2))[..., :length].transpose(1, 2)
        return self.out_proj(C * convolved)

    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.out_proj.weight
        return {
            "conv": torch.zeros(
                batch, self.dim, self.taps - 1, device=device or weight.device, dtype=dtype or weight.dtype
            )
        }

    def step(self, u_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        B, C, x = self.in_proj(u_t).chunk(3, dim=-1)
        window = torch.cat((state["conv"], (B * x).unsqueeze(-1)), dim=-1)  # (batch, dim, taps)
        y = (window * self.conv.weight[:, 0]).sum(-1)
        if self.conv.bias is not None:
            y = y + self.conv.bias
        return self.out_proj(C * y), {"conv": window[..., 1:]}
