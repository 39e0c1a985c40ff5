"""Mamba (`Mb`): a selective state-space layer that mixes sequence and channels.

Defaults: state dimension 4, convolution 4, expansion 2, no bias for the linear
and convolution layers (MAD paper App. B.3.2); dt_rank = ceil(dim/16) as in
mamba-ssm. Parameter names and shapes follow mamba-ssm's `Mamba` (in_proj,
conv1d, x_proj, dt_proj, A_log, D, out_proj), so weights move between the two.

Parameters (d_inner = expand*dim, R = dt_rank, N = d_state):
in_proj dim*2*d_inner, conv1d d_inner*d_conv (+ d_inner), x_proj d_inner*(R+2N),
dt_proj R*d_inner + d_inner (its bias is the dt initialisation, always present),
A_log d_inner*N, D d_inner, out_proj d_inner*dim; with `inner_norms` (Jamba's
`mamba_inner_layernorms`) RMSNorm weights on dt, B and C: R + 2N more.

State: d_inner * d_state = 256*4 = 1024 per layer at width 128 (four layers:
4096). The causal convolution's last d_conv-1 inputs, d_inner*(d_conv-1), are
reported as conv_state.
FLOPs: MAD paper App. C.4.5 (projections 4LD^2E, featurization 2LDE(D_dt + 2S) +
2LDE D_dt, associative scan 2LDES, out layer 2LD^2E) and the short conv 2 d_conv LDE
(2 FLOPs per tap, channel and token, as every other short conv here; the paper prints
6LDE, the count for 3 taps, though its Mamba's conv has d_conv = 4, App. C.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import Primitive, positive


class MambaWidths:
    """Mamba-1's widths from `expand` and an optional `dt_rank` (None: ceil(dim / 16), mamba-ssm's "auto")."""

    @property
    def d_inner(self) -> int:
        return self.expand * self.dim

    @property
    def rank(self) -> int:
        return self.dt_rank if self.dt_rank is not None else math.ceil(self.dim / 16)


@dataclass(frozen=True)
class Mamba(MambaWidths, Primitive):
    d_state: int
    d_conv: int
    expand: int
    dt_rank: int | None  # None: ceil(dim / 16)
    bias: bool
    conv_bias: bool
    inner_norms: bool = False  # RMSNorm on dt, B and C after x_proj (Jamba's mamba_inner_layernorms)
    inner_norm_eps: float = 1e-6  # their epsilon (Jamba's rms_norm_eps)

    name = "mamba"
    role = "both"
    module = "madsl.layers.mamba:Mamba"

    identity_omits = ("inner_norms", "inner_norm_eps")  # added later: specs without them keep their run identities

    def validate(self) -> None:
        positive(self, "d_state", "d_conv", "expand", "dt_rank", "inner_norm_eps")

    def params(self) -> int:
        D, E, R, N = self.dim, self.d_inner, self.rank, self.d_state
        in_proj = D * 2 * E + (2 * E if self.bias else 0)
        conv1d = E * self.d_conv + (E if self.conv_bias else 0)
        x_proj = E * (R + 2 * N)
        dt_proj = R * E + E
        out_proj = E * D + (D if self.bias else 0)
        inner_norms = R + 2 * N if self.inner_norms else 0
        return in_proj + conv1d + x_proj + dt_proj + E * N + E + out_proj + inner_norms

    def fixed_state(self) -> int:
        return self.d_inner * self.d_state

    def conv_state(self) -> int:
        return self.d_inner * (self.d_conv - 1)

    def flops(self, seq_len: int) -> int:
        L, D, E, R, S = seq_len, self.dim, self.expand, self.rank, self.d_state
        return (
            4 * L * D * D * E
            + 2 * self.d_conv * L * D * E
            + 2 * L * D * E * (R + 2 * S)
            + 2 * L * D * E * R
            + self.non_matmul_flops(L)
            + 2 * L * D * D * E
        )

    def non_matmul_flops(self, seq_len: int) -> int:
        """The associative scan, 2 L D E S."""
        return 2 * seq_len * self.dim * self.expand * self.d_state
