"""Gated linear attention (`Alg`: one head; `mAlg`: 8 heads x 16).

Defaults: 8 heads of dimension 16 for `mAlg` (MAD paper App. B.3.2); a single
head of key and value dimension dim for `Alg` (128 x 128 = 16384 states at width
128, which the paper's iso-state setting reduces by shrinking the key dimension).
Gate: low-rank (16) forget gate with a logit normaliser of 16, a swish output
gate and an RMSNorm over each head's output, as in the GLA paper (Yang et al.
2023) and flash-linear-attention's `GatedLinearAttention`.

Layout: q_proj, k_proj dim -> heads*key_dim; v_proj, g_proj dim -> heads*value_dim
(no bias); gk_proj: dim -> gate_low_rank -> heads*key_dim (bias on the second
map only); g_norm weight value_dim (shared by heads); o_proj heads*value_dim -> dim.

State: per head a key_dim x value_dim matrix: heads*key_dim*value_dim
(8*16*16 = 2048 at the mAlg default).
FLOPs (not in MAD App. C.4; recurrent form of the GLA paper): projections
2 L D (2 H dk + 2 H dv), gate 2 L (D r + r H dk), state update and readout
4 L H dk dv, out 2 L H dv D.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Primitive, divides, positive


@dataclass(frozen=True)
class GatedLinearAttention(Primitive):
    heads: int
    key_dim: int | None  # per head; None: dim // heads
    value_dim: int | None  # per head; None: dim // heads
    gate_low_rank: int
    gate_normalizer: float
    output_gate: bool

    name = "gla"
    role = "sequence"
    module = "madsl.layers.gla:GatedLinearAttention"

    def validate(self) -> None:
        positive(self, "heads", "key_dim", "value_dim", "gate_low_rank", "gate_normalizer")
        if self.key_dim is None or self.value_dim is None:
            divides(self, "heads", self.heads, self.dim, "dim")

    @property
    def dk(self) -> int:
        return self.key_dim if self.key_dim is not None else self.dim // self.heads

    @property
    def dv(self) -> int:
        return self.value_dim if self.value_dim is not None else self.dim // self.heads

    def params(self) -> int:
        D, H, K, V, r = self.dim, self.heads, self.dk, self.dv, self.gate_low_rank
        qk = 2 * D * H * K
        v = D * H * V
        g = D * H * V if self.output_gate else 0
        gate = D * r + r * H * K + H * K
        return qk + v + g + gate + V + H * V * D

    def fixed_state(self) -> int:
        return self.heads * self.dk * self.dv

    def flops(self, seq_len: int) -> int:
        L, D, H, K, V, r = seq_len, self.dim, self.heads, self.dk, self.dv, self.gate_low_rank
        g = H * V if self.output_gate else 0
        return (
            2 * L * D * (2 * H * K + H * V + g)
            + 2 * L * (D * r + r * H * K)
            + self.non_matmul_flops(L)
            + 2 * L * H * V * D
        )

    def non_matmul_flops(self, seq_len: int) -> int:
        """The recurrence: state update and readout, 4 L H dk dv."""
        return 4 * seq_len * self.heads * self.dk * self.dv
