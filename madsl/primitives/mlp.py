"""A plain MLP channel mixer (`Mlp`): fc dim -> inner, an activation, proj inner -> dim.
The activation: GELU (tanh approximation, the default) or squared ReLU (`relu2`: Primer,
So et al. 2021; Nemotron-H's MLP layers); the parameters do not depend on it.

Defaults: the MAD reference's `mlp` layer (athms/mad-lab configs/layers/mlp.yml and
mad/model/layers/mlp.py): inner null = 4 * dim, no bias.

Parameters: 2 * dim * inner (+ inner + dim with bias). No state.
FLOPs: 4 * L * dim * inner (two matmuls); the activation is not counted, as for SwiGLU (App. C.4.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .base import Primitive, positive


@dataclass(frozen=True)
class Mlp(Primitive):
    inner: int | None  # None: 4 * dim
    bias: bool
    activation: Literal["gelu", "relu2"]

    name = "mlp"
    role = "channel"
    module = "madsl.layers.mlp:Mlp"
    identity_omits = ("activation",)  # added later: specs with the GELU keep their run identities

    def validate(self) -> None:
        positive(self, "inner")

    @property
    def width(self) -> int:
        return self.inner if self.inner is not None else 4 * self.dim

    def params(self) -> int:
        return 2 * self.dim * self.width + ((self.width + self.dim) if self.bias else 0)

    def flops(self, seq_len: int) -> int:
        return 4 * seq_len * self.dim * self.width

    def non_matmul_flops(self, seq_len: int) -> int:
        return 0  # two matmuls; the activation is not counted
