"""SwiGLU channel mixer (`Sg`): the torch module of `madsl.primitives.swiglu`.

    out = w2(silu(w1 x) * w3 x)          w1, w3: dim -> inner; w2: inner -> dim (inner: the primitive's width)

`activation: gelu`: GeLU (tanh approximation) in place of silu (RecurrentGemma's MLP).

Init (as the MAD reference's SwiGLU inside its language model, which zeroes every
Linear bias): PyTorch's default Linear init for the weights (kaiming-uniform, bound
1/sqrt(fan_in)), biases zero.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from madsl.primitives.swiglu import SwiGLU as SwiGLUPrimitive


class SwiGLU(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: SwiGLUPrimitive):
        super().__init__()
        self.w1 = nn.Linear(p.dim, p.width, bias=p.bias)  # gate
        self.w3 = nn.Linear(p.dim, p.width, bias=p.bias)  # value
        self.w2 = nn.Linear(p.width, p.dim, bias=p.bias)  # down
        self.gelu = p.activation == "gelu"
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for linear in (self.w1, self.w3, self.w2):
            linear.reset_parameters()
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        gate = self.w1(x)
        gate = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.w2(gate * self.w3(x))
