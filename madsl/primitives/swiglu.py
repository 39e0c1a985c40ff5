"""SwiGLU channel mixer (`Sg`): out(silu(w1 x) * w3 x).

Defaults: inner width 512 at model width 128 (MAD paper App. B.3.1); 4096 at the
750M setting (Table C.2, "FFW size"). No bias.
FLOPs: App. C.4.1, GLU 6 L D D_glu.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import Primitive, positive


@dataclass(frozen=True)
class SwiGLU(Primitive):
    inner: int
    bias: bool

    name = "swiglu"
    role = "channel"
    module = "madsl.layers.swiglu:SwiGLU"

    def validate(self) -> None:
        positive(self, "inner")

    def params(self) -> int:
        return 3 * self.dim * self.inner + ((2 * self.inner + self.dim) if self.bias else 0)

    def flops(self, seq_len: int) -> int:
        return 6 * seq_len * self.dim * self.inner
