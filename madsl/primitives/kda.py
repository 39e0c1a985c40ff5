"""Kimi Delta Attention (`KDA`; Kimi Linear, Moonshot AI 2025): the gated delta rule with a decay
per key channel.

Gated DeltaNet decays each head's memory by one scalar alpha_t per token; KDA by a vector, one
decay per key channel (a diagonal, fine-grained gate, as GLA's):

    S_t = (I - beta_t k_t k_t^T) diag(alpha_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
    log alpha_t = -exp(A_log) softplus(f_up(f_down(x)) + dt_bias)          heads x head_dim

Layout of flash-linear-attention's `KimiDeltaAttention` and transformers' `KimiLinearDeltaAttention`:
q_proj, k_proj dim -> heads*head_dim; v_proj dim -> value_heads*value_dim (value_dim =
expand_v*head_dim); short causal depthwise convs of d_conv taps over q, k and v (no bias; 0: none)
followed by SiLU; the gate through a low-rank bottleneck of rank value_dim (f_proj: dim ->
value_dim -> value_heads*head_dim, no bias), A_log per value head and dt_bias per value head and
key channel; b_proj dim -> value_heads (beta = sigmoid); q and k L2-normalised per head (q scaled
by head_dim^-1/2); the output RMSNorm'd per head (weight value_dim, shared) and gated by
sigmoid(g_up(g_down(x))) (rank value_dim; a bias on g_up where `gate_bias`: fla's layer has one,
transformers' class and Moonshot's checkpoints do not); o_proj value_heads*value_dim -> dim.
The output norm's epsilon is `norm_eps` (1e-5, fla's; transformers' KimiLinearDeltaAttention takes
the model's rms_norm_eps). The L2 norm of q and k is x / max(|x|, 1e-12) (torch's F.normalize) at
`l2norm_eps` 0, else x / sqrt(|x|^2 + l2norm_eps): fla's and transformers' l2norm (their kernels'
use_qk_l2norm_in_kernel) at 1e-6, which Kimi Linear's checkpoints were trained with; the two
differ by a relative l2norm_eps / (2 |x|^2), which a key of small norm makes large.
With more value heads than key heads (`value_heads`, fla's num_v_heads) each key head serves
value_heads / heads consecutive value heads.

Defaults (stdlib): 4 heads of key dimension dim / 4 (32 at width 128), values as wide as the keys
(Kimi Linear: expand_v 1), conv 4 (Kimi Linear's short_conv_kernel_size), no gate bias.

State: value_heads*head_dim*value_dim (4*32*32 = 4096 at the default); the conv keeps the last
d_conv-1 inputs of its 2*heads*head_dim + value_heads*value_dim channels, reported as conv_state.
FLOPs (recurrent form), H key heads, Hv value heads, K, V: projections 2LD(2HK + HvV + Hv), the two
low-rank gates 2L(DV + V HvK) + 2L(DV + V HvV), conv 2L(2HK + HvV)d_conv, the delta rule
6LHvKV (S^T k, the rank-one update, the readout) + LHvKV (the decay), out 2LHvVD.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Primitive, positive
from .delta_net import DeltaRuleLayout


@dataclass(frozen=True)
class KDA(DeltaRuleLayout, Primitive):
    heads: int
    head_dim: int | None  # key dimension per head; None: dim // heads
    expand_v: int  # value dimension per head = expand_v * head_dim
    value_heads: int | None  # None: heads; more (a multiple of heads): grouped value heads
    d_conv: int  # taps of the short convolutions over q, k, v; 0: none
    gate_bias: bool  # a bias on the output gate's up projection (fla's layer)
    norm_eps: float = 1e-5  # the gated output RMSNorm's epsilon (Kimi Linear's rms_norm_eps; fla's 1e-5)
    l2norm_eps: float = 0.0  # q, k / sqrt(|.|^2 + eps) (fla's and transformers' l2norm: 1e-6); 0: F.normalize

    identity_omits = ("norm_eps", "l2norm_eps")  # added later: specs at their defaults keep their run identities

    name = "kda"
    role = "sequence"
    module = "madsl.layers.kda:KDA"

    def validate(self) -> None:
        self.validate_layout("null: as many value heads as key heads")
        positive(self, "norm_eps")
        if not self.l2norm_eps >= 0:
            raise ConfigError("l2norm_eps", f"kda: l2norm_eps must be 0 or positive, got {self.l2norm_eps}")

    def params(self) -> int:
        D, Hv, K, V = self.dim, self.v_heads, self.key_dim, self.value_dim
        projections = D * self.conv_channels + D * Hv + Hv * V * D  # q, k, v, b_proj, o_proj
        forget = D * V + V * Hv * K + Hv + Hv * K  # f_proj (down, up), A_log, dt_bias
        output_gate = D * V + V * Hv * V + (Hv * V if self.gate_bias else 0)
        return projections + self.conv_channels * self.d_conv + forget + output_gate + V  # V: o_norm

    def flops(self, seq_len: int) -> int:
        L, D, Hv, K, V = seq_len, self.dim, self.v_heads, self.key_dim, self.value_dim
        projections = 2 * L * D * (self.conv_channels + Hv) + 2 * L * Hv * V * D
        gates = 2 * L * (D * V + V * Hv * K) + 2 * L * (D * V + V * Hv * V)
        conv = 2 * L * self.conv_channels * self.d_conv
        return projections + gates + conv + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The delta rule (S^T k, rank-one update, readout) and the per-channel decay, recurrent form."""
        return 7 * seq_len * self.v_heads * self.key_dim * self.value_dim
