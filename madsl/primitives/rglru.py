"""Griffin's recurrent block with its RG-LRU (`RG`; De et al. 2024, "Griffin"; RecurrentGemma).

Two branches of `width` channels read the input: one is GeLU(linear_y(x)); the other,
linear_x(x), goes through a short causal depthwise conv (d_conv taps, with bias, no activation)
and then the real-gated linear recurrent unit, per channel:

    r_t = sigmoid(W_a x_t + b_a),  i_t = sigmoid(W_x x_t + b_x)      block-diagonal gates, `heads` blocks
    log a_t = -8 r_t softplus(Lambda)                                 recurrence gate, Lambda per channel
    h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t x_t)                     (at position 0: h_0 = i_0 x_0)
    out = linear_out(h_t * GeLU(linear_y(x_t)))

Layout of transformers' RecurrentGemmaRecurrentBlock / RecurrentGemmaRglru: linear_x, linear_y
dim -> width and linear_out width -> dim, each with a bias; conv_1d with a bias; the gates' weights
(heads, width/heads, width/heads) and biases (heads, width/heads); recurrent_param (width).
`bias: false` drops the biases of the linear layers and the conv (not the gates'). At position 0
the input is not scaled by sqrt(1 - a^2), as the reference's reset at the start of a sequence.

Defaults (stdlib): width = dim (RecurrentGemma's lru_width = hidden_size), 4 gate blocks of
width/4 (RecurrentGemma: 10 of 256), conv 4 (conv1d_width), biases as the reference.

State: the recurrence keeps width numbers (fixed_state); the conv the last d_conv - 1 inputs of its
width channels (conv_state). FLOPs: linear_x, linear_y 2 x 2LDW, linear_out 2LWD, conv 2LW d_conv,
the two block-diagonal gates 2 x 2LW^2/heads, the recurrence 2LW (a multiply and an add); the
gates' sigmoids, the GeLU and the products (elementwise) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Primitive, divides, positive


@dataclass(frozen=True)
class RGLRU(Primitive):
    width: int | None  # None: dim (RecurrentGemma's lru_width)
    heads: int  # blocks of the block-diagonal input and recurrence gates
    d_conv: int  # taps of the conv before the RG-LRU
    bias: bool  # on linear_x, linear_y, linear_out and the conv

    name = "rglru"
    role = "sequence"
    module = "madsl.layers.rglru:RGLRU"

    def validate(self) -> None:
        positive(self, "width", "heads", "d_conv")
        divides(self, "heads", self.heads, self.lru_width, "width")

    @property
    def lru_width(self) -> int:
        return self.width if self.width is not None else self.dim

    @property
    def block_width(self) -> int:
        return self.lru_width // self.heads

    def params(self) -> int:
        D, W = self.dim, self.lru_width
        biases = 3 * W + D if self.bias else 0  # linear_x, linear_y, conv, linear_out
        gates = 2 * (W * self.block_width + W)  # input and recurrence gates: block weights, biases
        return 3 * D * W + W * self.d_conv + biases + gates + W  # W: recurrent_param

    def fixed_state(self) -> int:
        return self.lru_width

    def conv_state(self) -> int:
        return self.lru_width * (self.d_conv - 1)

    def flops(self, seq_len: int) -> int:
        L, D, W = seq_len, self.dim, self.lru_width
        return 6 * L * D * W + 2 * L * W * self.d_conv + 4 * L * W * self.block_width + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The recurrence h = a h + x, 2LW."""
        return 2 * seq_len * self.lru_width
