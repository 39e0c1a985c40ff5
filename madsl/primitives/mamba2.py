"""Mamba-2 (`M2`; SSD, Dao & Gu 2024): a selective state-space layer with a scalar decay per head.

Layout of mamba-ssm's `Mamba2` (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj), so that
weights move between the two: in_proj dim -> [z, x, B, C, dt] = 2*d_inner + 2*groups*d_state +
heads; a causal depthwise conv of d_conv taps (+ bias) over [x, B, C] then SiLU; per head
(heads = d_inner / head_dim, each group's B and C shared by its heads):

    dt_t = softplus(dt + dt_bias),  h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T,  y_t = h_t^T C_t + D x_t

then a gated RMSNorm, rmsnorm(y * silu(z)) over each group's d_inner / groups channels (weight
d_inner), and out_proj d_inner -> dim.

Defaults: mamba-ssm's `Mamba2` (d_state 128, d_conv 4, expand 2, head_dim 64, 1 group, no bias on
the projections, bias on the conv).

Parameters (E = d_inner, G = groups, N = d_state, H = heads): in_proj D(2E + 2GN + H) (+ bias),
conv (E + 2GN) d_conv (+ E + 2GN), dt_bias, A_log and D H each, norm E, out_proj E D (+ D).
State: heads * head_dim * d_state = E * N (256 * 128 = 32768 at the default); the conv keeps
(E + 2GN)(d_conv - 1), reported as conv_state (as for Mamba).
FLOPs (recurrent form): in_proj 2LD(2E + 2GN + H), conv 2L(E + 2GN) d_conv, the scan 5LEN
(decay, the rank-one update, readout), skip and gated norm 7LE, out 2LED.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import Primitive, divides, positive


@dataclass(frozen=True)
class Mamba2(Primitive):
    d_state: int
    d_conv: int
    expand: int
    head_dim: int
    groups: int
    bias: bool
    conv_bias: bool

    name = "mamba2"
    role = "both"
    module = "madsl.layers.mamba2:Mamba2"

    def validate(self) -> None:
        positive(self, "d_state", "d_conv", "expand", "head_dim", "groups")
        divides(self, "head_dim", self.head_dim, self.d_inner, "d_inner (expand * dim)")
        divides(self, "groups", self.groups, self.heads, "heads (d_inner / head_dim)")

    @property
    def d_inner(self) -> int:
        return self.expand * self.dim

    @property
    def heads(self) -> int:
        return self.d_inner // self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.d_inner + 2 * self.groups * self.d_state

    def params(self) -> int:
        D, E, H, C = self.dim, self.d_inner, self.heads, self.conv_channels
        in_width = E + C + H
        in_proj = D * in_width + (in_width if self.bias else 0)
        conv = C * self.d_conv + (C if self.conv_bias else 0)
        out_proj = E * D + (D if self.bias else 0)
        return in_proj + conv + 3 * H + E + out_proj

    def fixed_state(self) -> int:
        return self.d_inner * self.d_state

    def conv_state(self) -> int:
        return self.conv_channels * (self.d_conv - 1)

    def flops(self, seq_len: int) -> int:
        L, D, E, N, C = seq_len, self.dim, self.d_inner, self.d_state, self.conv_channels
        return 2 * L * D * (E + C + self.heads) + 2 * L * C * self.d_conv + self.non_matmul_flops(L) + 2 * L * E * D

    def non_matmul_flops(self, seq_len: int) -> int:
        """The scan (decay, rank-one update, readout) 5 L E N, skip and gated norm 7 L E."""
        return 5 * seq_len * self.d_inner * self.d_state + 7 * seq_len * self.d_inner
