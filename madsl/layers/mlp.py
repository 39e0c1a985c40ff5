"""A plain MLP channel mixer (`Mlp`): the torch module of `madsl.primitives.mlp`.

    out = proj(gelu_tanh(fc(x)))

Init: PyTorch's default Linear init (as the MAD reference), biases zero.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from madsl.primitives.mlp import Mlp as MlpPrimitive


class Mlp(nn.Module):
    def __init__(self, p: MlpPrimitive):
        super().__init__()
        self.fc = nn.Linear(p.dim, p.width, bias=p.bias)
        self.proj = nn.Linear(p.width, p.dim, bias=p.bias)
        for linear in (self.fc, self.proj):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))
