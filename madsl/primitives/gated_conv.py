"""Gated short convolution (`GConv`; LFM2's `ShortConv`, Liquid AI 2025): a depthwise causal
convolution of a few taps between two input-dependent gates.

Layout of Hugging Face's `Lfm2ShortConv` (in_proj, conv, out_proj), so that weights move between
the two:

    B, C, x = split(in_proj(u))           in_proj dim -> 3 dim, in that order
    y       = C * conv(B * x)             conv: d_conv taps per channel, causal, no activation
    out     = out_proj(y)                 dim -> dim

`bias` puts a bias on in_proj, the conv and out_proj together (LFM2's `conv_bias`).

Defaults: LFM2's (conv_L_cache 3 taps, conv_bias false).

Parameters: in_proj 3 D^2 (+ 3 D), conv D d_conv (+ D), out_proj D^2 (+ D).
State: no fixed state; the conv keeps the last d_conv - 1 gated inputs B * x of its D channels,
reported as conv_state.
FLOPs: in_proj 6 L D^2, conv 2 L D d_conv, out_proj 2 L D^2; the two gates 2 L D (elementwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Primitive, positive


@dataclass(frozen=True)
class GatedConv(Primitive):
    d_conv: int  # taps of the depthwise causal convolution
    bias: bool  # on in_proj, the conv and out_proj (LFM2's conv_bias)

    name = "gated_conv"
    role = "sequence"
    module = "madsl.layers.gated_conv:GatedConv"

    def validate(self) -> None:
        positive(self, "d_conv")

    def params(self) -> int:
        D = self.dim
        return 4 * D * D + D * self.d_conv + ((3 * D + D + D) if self.bias else 0)

    def conv_state(self) -> int:
        return self.dim * (self.d_conv - 1)

    def flops(self, seq_len: int) -> int:
        L, D = seq_len, self.dim
        return 6 * L * D * D + 2 * L * D * self.d_conv + 2 * L * D * D + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The two gates, B * x and C * y: 2 L D."""
        return 2 * seq_len * self.dim
