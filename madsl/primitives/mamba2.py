"""Mamba-2 (`M2`; SSD, Dao & Gu 2024): a selective state-space layer with a scalar decay per head.

Layout of mamba-ssm's `Mamba2` (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj), so that
weights move between the two: in_proj dim -> [z, x, B, C, dt] = 2*d_inner + 2*groups*d_state +
heads; a causal depthwise conv of d_conv taps (+ bias) over [x, B, C] then SiLU; per head
(each group's B and C shared by its heads):

    dt_t = softplus(dt + dt_bias),  h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T,  y_t = h_t^T C_t + D x_t

then a gated RMSNorm, rmsnorm(y * silu(z)) over each group's d_inner / groups channels (weight
d_inner), and out_proj d_inner -> dim. `norm: false` leaves the gate alone, y * silu(z) with no
norm and no weight (Falcon-H1's `mamba_rms_norm: false`).

The width: `heads` null, d_inner = expand * dim and heads = d_inner / head_dim (mamba-ssm's and
Megatron-LM's default); `heads` set, d_inner = heads * head_dim whatever expand is (Nemotron-H's
and Falcon-H1's configs state mamba_num_heads x mamba_head_dim, e.g. 128 x 80 = 10240 on a
4480-wide model, where expand x dim would be 8960).

Defaults: mamba-ssm's `Mamba2` (d_state 128, d_conv 4, expand 2, head_dim 64, 1 group, no bias on
the projections, bias on the conv).

Parameters (E = d_inner, G = groups, N = d_state, H = heads): in_proj D(2E + 2GN + H) (+ bias),
conv (E + 2GN) d_conv (+ E + 2GN), dt_bias, A_log and D H each, norm E (none without the norm),
out_proj E D (+ D).
State: heads * head_dim * d_state = E * N (256 * 128 = 32768 at the default); the conv keeps
(E + 2GN)(d_conv - 1), reported as conv_state (as for Mamba).
FLOPs (recurrent form): in_proj 2LD(2E + 2GN + H), conv 2L(E + 2GN) d_conv, the scan 5LEN
(decay, the rank-one update, readout), skip and gate 4LE, the norm 3LE, out 2LED.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Primitive, divides, positive


@dataclass(frozen=True)
class Mamba2(Primitive):
    d_state: int
    d_conv: int
    expand: int
    head_dim: int
    groups: int
    bias: bool
    conv_bias: bool
    heads: int | None  # None: expand * dim / head_dim; set: the width is heads * head_dim
    norm: bool  # the gated RMSNorm; false: y * silu(z) alone
    norm_eps: float = 1e-5  # the gated RMSNorm's epsilon (Granite 4.0: its rms_norm_eps, 1e-6)
    dt_min: float = 0.0  # dt clamped below (Zamba2's time_step_min); 0: no clamp (softplus is positive)

    name = "mamba2"
    role = "both"
    module = "madsl.layers.mamba2:Mamba2"
    # added later: specs at their defaults keep their run identities
    identity_omits = ("heads", "norm", "norm_eps", "dt_min")

    def validate(self) -> None:
        positive(self, "d_state", "d_conv", "expand", "head_dim", "groups", "heads", "norm_eps")
        if not self.dt_min >= 0:
            raise ConfigError("dt_min", f"dt_min must be at least 0, got {self.dt_min}")
        if self.heads is None:
            divides(self, "head_dim", self.head_dim, self.d_inner, "d_inner (expand * dim)")
        divides(self, "groups", self.groups, self.n_heads, "heads")

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim if self.heads is not None else self.expand * self.dim

    @property
    def n_heads(self) -> int:
        """The heads, stated or derived (d_inner / head_dim)."""
        return self.heads if self.heads is not None else self.d_inner // self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.d_inner + 2 * self.groups * self.d_state

    def params(self) -> int:
        D, E, H, C = self.dim, self.d_inner, self.n_heads, self.conv_channels
        in_width = E + C + H
        in_proj = D * in_width + (in_width if self.bias else 0)
        conv = C * self.d_conv + (C if self.conv_bias else 0)
        out_proj = E * D + (D if self.bias else 0)
        return in_proj + conv + 3 * H + (E if self.norm else 0) + out_proj

    def fixed_state(self) -> int:
        return self.d_inner * self.d_state

    def conv_state(self) -> int:
        return self.conv_channels * (self.d_conv - 1)

    def flops(self, seq_len: int) -> int:
        L, D, E, C = seq_len, self.dim, self.d_inner, self.conv_channels
        return 2 * L * D * (E + C + self.n_heads) + 2 * L * C * self.d_conv + self.non_matmul_flops(L) + 2 * L * E * D

    def non_matmul_flops(self, seq_len: int) -> int:
        """The scan (decay, rank-one update, readout) 5 L E N, skip and gate 4 L E, the norm 3 L E."""
        return 5 * seq_len * self.d_inner * self.d_state + (7 if self.norm else 4) * seq_len * self.d_inner
