"""A plain MLP channel mixer (`Mlp`): the torch module of `madsl.primitives.mlp`.

    out = proj(act(fc(x)))               act: gelu_tanh, or relu(.)^2 (relu2)

Init: PyTorch's default Linear init (as the MAD reference), biases zero.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from madsl.primitives.mlp import Mlp as MlpPrimitive


def _gelu(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


def _relu2(x: Tensor) -> Tensor:
    return F.relu(x).square()


ACTIVATIONS = {"gelu": _gelu, "relu2": _relu2}


class Mlp(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: MlpPrimitive):
        super().__init__()
        self.act = ACTIVATIONS[p.activation]
        self.fc = nn.Linear(p.dim, p.width, bias=p.bias)
        self.proj = nn.Linear(p.width, p.dim, bias=p.bias)
        for linear in (self.fc, self.proj):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))
