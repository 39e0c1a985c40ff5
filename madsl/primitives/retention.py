"""RetNet's multi-scale retention (`Ret`; Sun et al. 2023).

Per head h a fixed decay gamma_h = 1 - 2^(-5 - h) (the paper's multi-scale decays) and

    S_t = gamma_h S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t

with q and k rotated by position (fla's MultiScaleRetention uses rotary where the paper uses
xPos) and q scaled by key_dim^-0.5; each head's output RMS-normalised (weight value_dim, shared by
heads), gated by swish(g_proj(x)) (output_gate), then o_proj.

Layout of flash-linear-attention's `MultiScaleRetention`: q_proj, k_proj dim -> expand_k * dim;
v_proj, g_proj dim -> expand_v * dim; o_proj expand_v * dim -> dim; no bias. Defaults: its
defaults (8 heads, expand_k 1, expand_v 2, output gate), the RetNet paper's value expansion.

State: heads * key_dim * value_dim = (expand_k dim)(expand_v dim) / heads (128 * 256 / 8 = 4096
at width 128); the decays are constants, not state. Step mode also carries the position (an
integer per sequence, bookkeeping for the rotary embedding, as attention's).
FLOPs (recurrent form): projections 2LD(2 expand_k D + expand_v D [+ expand_v D]),
retention 5LHKV (decay, update, readout), out 2L expand_v D D.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Primitive, divides, positive


@dataclass(frozen=True)
class Retention(Primitive):
    heads: int
    expand_k: int
    expand_v: int
    rotary: bool
    output_gate: bool

    name = "retention"
    role = "sequence"
    module = "madsl.layers.retention:Retention"

    def validate(self) -> None:
        positive(self, "heads", "expand_k", "expand_v")
        divides(self, "heads", self.heads, self.key_width, "expand_k * dim")
        divides(self, "heads", self.heads, self.value_width, "expand_v * dim")
        if self.rotary and self.key_dim % 2:
            raise ConfigError(
                "heads",
                f"retention: rotary embeddings need an even key dimension per head, got {self.key_dim}",
                "set rotary=false or fewer heads",
            )

    @property
    def key_width(self) -> int:
        return self.expand_k * self.dim

    @property
    def value_width(self) -> int:
        return self.expand_v * self.dim

    @property
    def key_dim(self) -> int:
        return self.key_width // self.heads

    @property
    def value_dim(self) -> int:
        return self.value_width // self.heads

    def params(self) -> int:
        D, K, V = self.dim, self.key_width, self.value_width
        return 2 * D * K + D * V + (D * V if self.output_gate else 0) + self.value_dim + V * D

    def fixed_state(self) -> int:
        return self.heads * self.key_dim * self.value_dim

    def flops(self, seq_len: int) -> int:
        L, D, K, V = seq_len, self.dim, self.key_width, self.value_width
        projected = 2 * K + V + (V if self.output_gate else 0)
        return 2 * L * D * projected + self.non_matmul_flops(L) + 2 * L * V * D

    def non_matmul_flops(self, seq_len: int) -> int:
        """The retention recurrence, 5 L H K V."""
        return 5 * seq_len * self.heads * self.key_dim * self.value_dim
