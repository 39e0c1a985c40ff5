"""SwiGLU channel mixer (`Sg`): out(silu(w1 x) * w3 x).

Defaults: inner width 512 at model width 128 (MAD paper App. B.3.1); 4096 at the
750M setting (Table C.2, "FFW size"). No bias. `inner: null` is the MAD reference's
rule (its SwiGLU has no inner width parameter; LLaMA's rule): 8/3 x dim, rounded down,
then up to a multiple of `multiple_of` (16): 352 at width 128, 3 x 128 x 352 = 135,168
parameters. `multiple_of` is read only where inner is null.
FLOPs: App. C.4.1, GLU 6 L D D_glu.

`activation: gelu` gates with GeLU (tanh approximation) in place of SiLU, a GeGLU: RecurrentGemma's
MLP (transformers' RecurrentGemmaMlp, hidden_activation gelu_pytorch_tanh); the same parameters,
state and FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .base import Primitive, positive


@dataclass(frozen=True)
class SwiGLU(Primitive):
    inner: int | None  # None: the MAD reference's rule (see width)
    multiple_of: int
    bias: bool
    activation: Literal["silu", "gelu"] = "silu"  # gelu: tanh approximation (RecurrentGemma's MLP)

    name = "swiglu"
    role = "channel"
    module = "madsl.layers.swiglu:SwiGLU"
    # added later: specs at their defaults keep their run identities
    identity_omits = ("multiple_of", "activation")

    def validate(self) -> None:
        positive(self, "inner", "multiple_of")

    @property
    def width(self) -> int:
        """The inner width: `inner`, or 8*dim/3 rounded down, then up to a multiple of multiple_of."""
        if self.inner is not None:
            return self.inner
        return -(-(8 * self.dim // 3) // self.multiple_of) * self.multiple_of

    def params(self) -> int:
        return 3 * self.dim * self.width + ((2 * self.width + self.dim) if self.bias else 0)

    def flops(self, seq_len: int) -> int:
        return 6 * seq_len * self.dim * self.width

    def non_matmul_flops(self, seq_len: int) -> int:
        return 0  # three matmuls; the activation and the product are not counted (App. C.4.1)
