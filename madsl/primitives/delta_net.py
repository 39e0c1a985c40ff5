"""DeltaNet (`DN`; Yang et al. 2024) and Gated DeltaNet (`GDN`; Yang, Kautz, Hatamizadeh 2024).

The delta rule: per head, a key_dim x value_dim memory S that, at each token, replaces what it
holds under the key k_t by the value v_t with strength beta_t in (0, 1); Gated DeltaNet
first decays the whole memory by a data-dependent alpha_t in (0, 1) (Mamba-2's gate):

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t

Layout of flash-linear-attention's `DeltaNet` / `GatedDeltaNet`: q_proj, k_proj dim ->
heads*head_dim; v_proj dim -> heads*value_dim (value_dim = expand_v*head_dim); b_proj dim ->
heads (beta = sigmoid); gated: a_proj dim -> heads, A_log and dt_bias per head (log alpha =
-exp(A_log) softplus(a_proj(x) + dt_bias)); a short causal depthwise conv of d_conv taps over
q, k and v (no bias; d_conv 0: none) followed by SiLU; q and k L2-normalised per head; an
RMSNorm over each head's output (weight value_dim, shared by heads), gated by
swish(g_proj(x)) with an output gate (g_proj dim -> heads*value_dim); o_proj heads*value_dim -> dim.
No bias anywhere. The output norm's epsilon is `norm_eps` (1e-5, fla's; Qwen3-Next's rms_norm_eps 1e-6).
The L2 norms of q and k divide by ||x|| (`l2norm_eps` 0, torch's normalize), or by
sqrt(||x||^2 + l2norm_eps) (fla's l2norm and transformers' Qwen3-Next and Qwen3.5: 1e-6), which
differ where a head's q or k is short (KDA's option of the same name).

Value heads (`value_heads`, null = heads; Qwen3-Next's linear_num_value_heads, fla's num_v_heads):
more value heads than key heads, a multiple of them; key head h serves the value heads
h*groups .. (h+1)*groups - 1 (q and k repeated, as transformers' repeat_interleave). v, b, a,
A_log, dt_bias, the output gate and o_proj are per value head; the state is one memory per
value head.

Defaults (stdlib): 4 heads of key dimension 32, expand_v 2, conv 4, the MAD reference's
gated-delta-net config (athms/mad-lab configs/layers/gated-delta-net.yml); DeltaNet: the same
without gate and output gate (fla's DeltaNet defaults).

State: value_heads*head_dim*value_dim (4*32*64 = 8192 at the default); the conv keeps the last
d_conv-1 inputs of its 2*heads*head_dim + value_heads*value_dim channels, reported as conv_state.
FLOPs (recurrent form), H key heads, Hv value heads: projections 2LD(2HK + HvV + Hv [+ Hv gate]
[+ HvV output gate]), conv 2L(2HK + HvV)d_conv, delta rule 6LHvKV (S^T k, the rank-one update,
the readout) [+ LHvKV decay], out 2LHvVD.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Primitive, divides, positive


class DeltaRuleLayout:
    """The shape the delta-rule layers share (DeltaNet, Gated DeltaNet, Kimi Delta Attention):
    `heads` key heads of `head_dim` (None: dim // heads), `value_heads` memories (None: heads; a
    multiple of them) of expand_v x head_dim values, short convolutions of `d_conv` taps over q, k
    and v; each memory is a key_dim x value_dim matrix."""

    def validate_layout(self, hint: str) -> None:
        positive(self, "heads", "head_dim", "expand_v", "value_heads")
        if self.d_conv < 0:
            raise ConfigError("d_conv", f"{self.name}: d_conv must be 0 (no short conv) or positive, got {self.d_conv}")
        if self.head_dim is None:
            divides(self, "heads", self.heads, self.dim, "dim")
        if self.value_heads is not None and self.value_heads % self.heads:
            raise ConfigError(
                "value_heads",
                f"{self.name}: value_heads={self.value_heads} is not a multiple of heads={self.heads}",
                hint,
            )

    @property
    def v_heads(self) -> int:
        """Value heads (and memories): value_heads, or heads where it is null."""
        return self.value_heads if self.value_heads is not None else self.heads

    @property
    def key_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.dim // self.heads

    @property
    def value_dim(self) -> int:
        return self.expand_v * self.key_dim

    @property
    def conv_channels(self) -> int:
        return 2 * self.heads * self.key_dim + self.v_heads * self.value_dim

    def fixed_state(self) -> int:
        return self.v_heads * self.key_dim * self.value_dim

    def conv_state(self) -> int:
        return self.conv_channels * max(self.d_conv - 1, 0)


@dataclass(frozen=True)
class DeltaNet(DeltaRuleLayout, Primitive):
    heads: int
    head_dim: int | None  # key dimension per head; None: dim // heads
    expand_v: int  # value dimension per head = expand_v * head_dim
    d_conv: int  # taps of the short convolution over q, k, v; 0: none
    gated: bool  # Gated DeltaNet's decay alpha_t
    output_gate: bool  # swish(g_proj(x)) on the normalised output
    value_heads: int | None  # None: heads; more (a multiple of heads): Qwen3-Next's value heads
    norm_eps: float = 1e-5  # the output RMSNorm's epsilon (Qwen3-Next's rms_norm_eps, 1e-6)
    l2norm_eps: float = 0.0  # q, k / sqrt(||.||^2 + eps) (fla's and transformers' l2norm: 1e-6); 0: F.normalize

    # added later: specs that leave them at their defaults keep their run identities
    identity_omits = ("value_heads", "norm_eps", "l2norm_eps")

    name = "delta_net"
    role = "sequence"
    module = "madsl.layers.delta_net:DeltaNet"

    def validate(self) -> None:
        self.validate_layout("null: as many value heads as key heads; Qwen3-Next: 2 x its key heads")
        positive(self, "norm_eps")
        if not self.l2norm_eps >= 0:
            raise ConfigError("l2norm_eps", f"{self.name}: l2norm_eps must be 0 or positive, got {self.l2norm_eps}")

    def params(self) -> int:
        D, H, Hv, K, V = self.dim, self.heads, self.v_heads, self.key_dim, self.value_dim
        total = D * (2 * H * K + Hv * V) + D * Hv + Hv * V * D + V  # q, k, v, b_proj, o_proj, o_norm
        total += self.conv_channels * self.d_conv
        if self.gated:
            total += D * Hv + 2 * Hv  # a_proj, A_log, dt_bias
        if self.output_gate:
            total += D * Hv * V
        return total

    def flops(self, seq_len: int) -> int:
        L, D, Hv, V = seq_len, self.dim, self.v_heads, self.value_dim
        gates = Hv + (Hv if self.gated else 0) + (Hv * V if self.output_gate else 0)
        return (
            2 * L * D * (self.conv_channels + gates)
            + 2 * L * self.conv_channels * self.d_conv
            + self.non_matmul_flops(L)
            + 2 * L * Hv * V * D
        )

    def non_matmul_flops(self, seq_len: int) -> int:
        """The delta rule (S^T k, rank-one update, readout) and the decay where gated."""
        L, Hv, K, V = seq_len, self.v_heads, self.key_dim, self.value_dim
        return 6 * L * Hv * K * V + (L * Hv * K * V if self.gated else 0)
