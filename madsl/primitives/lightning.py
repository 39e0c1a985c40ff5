"""MiniMax's lightning attention (`Lt`; MiniMax-01, MiniMax 2025): linear attention with a fixed
decay per head, a normalised and sigmoid-gated output.

Per head h, with the ALiBi-like slope s_h = 2^(-8 (h + 1) / heads) scaled by the layer's factor:

    q, k, v = SiLU(qkv_proj(x))                       heads x head_dim each, no scaling
    S_t = exp(-s_h) S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t
    out = out_proj(sigmoid(output_gate(x)) * rmsnorm(o))

Layout of transformers' MiniMaxLightningAttention: qkv_proj dim -> 3 heads*head_dim, output_gate
dim -> heads*head_dim, out_proj heads*head_dim -> dim, no bias; one RMSNorm over all heads
(weight heads*head_dim). MiniMax scales every layer's slopes by 1 - l / (layers - 1) + 1e-5 for
layer l (the first layer decays fastest, the last hardly at all): `decay_scale` is that factor
(1.0: the first layer's, up to the 1e-5).

Defaults (stdlib): 4 heads of dim / 4 (32 at width 128; MiniMax-Text-01: 64 of 128), decay scale 1.

State: heads*head_dim^2 (4*32*32 = 4096 at the default); the decays are constants, not state.
FLOPs (recurrent form): projections 2LD(3I + I) with I = heads*head_dim, the recurrence 5LH hd^2
(decay, update, readout, as retention's), out 2LID; the SiLU, the norm and the gate
(elementwise) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Heads, Primitive


@dataclass(frozen=True)
class Lightning(Heads, Primitive):
    heads: int
    head_dim: int | None  # None: dim // heads
    decay_scale: float  # MiniMax's per-layer factor on the slopes, 1 - l / (layers - 1) + 1e-5

    name = "lightning"
    role = "sequence"
    module = "madsl.layers.lightning:Lightning"

    def validate(self) -> None:
        self.validate_heads()
        if not 0 < self.decay_scale < float("inf"):
            raise ConfigError(
                "decay_scale",
                f"lightning: decay_scale must be a positive number, got {self.decay_scale}",
                "MiniMax's layer l of N: 1 - l / (N - 1) + 1e-5",
            )

    def slopes(self) -> list[float]:
        """The decay rate of each head: exp(-slope) per token."""
        base = 2.0 ** (-8.0 / self.heads)
        return [base ** (h + 1) * self.decay_scale for h in range(self.heads)]

    def params(self) -> int:
        D, inner = self.dim, self.inner
        return 3 * D * inner + D * inner + inner * D + inner  # qkv, output gate, out, norm

    def fixed_state(self) -> int:
        return self.heads * self.inner_head_dim**2

    def flops(self, seq_len: int) -> int:
        L, D, inner = seq_len, self.dim, self.inner
        return 2 * L * D * 4 * inner + 2 * L * inner * D + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The recurrence, 5 L H hd^2 (decay, update, readout)."""
        return 5 * seq_len * self.heads * self.inner_head_dim**2
