"""Griffin's recurrent block (`RG`): the torch module of `madsl.primitives.rglru`.

    y   = GeLU_tanh(linear_y(x))
    u   = conv_1d(linear_x(x))                                  causal, depthwise, no activation
    r, i = sigmoid(block_diag(u; W_a) + b_a), sigmoid(block_diag(u; W_x) + b_x)
    log a = -8 r softplus(recurrent_param)
    h_t = a_t h_{t-1} + sqrt(1 - a_t^2) i_t u_t                 (position 0: h_0 = i_0 u_0)
    out = linear_out(h * y)

The parallel form runs the diagonal recurrence as a log-depth scan (Hillis-Steele over the pairs
(a, x), log2(L) steps of elementwise work): exact for any gates, since it multiplies decays <= 1
and divides by none. `step` runs it one token at a time. State: "fixed" (batch, width), "conv"
(batch, width, d_conv - 1) and "pos" (batch,) int64, whether the next token is the first.

Init: transformers' RecurrentGemma (w_init_variance_scale 0.01, final 2): linear_x, linear_y
N(0, 1/dim), linear_out N(0, 2/width), conv N(0, 0.01/d_conv), the gates N(0, 0.01/block_width),
biases zero; recurrent_param such that a^c = exp(-8 softplus) starts in [0.9, 0.999] (as
Griffin's Lambda).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.layers.short_conv import depthwise_conv1d
from madsl.primitives.rglru import RGLRU as RGLRUPrimitive


def diagonal_scan(a: Tensor, x: Tensor) -> Tensor:
    """h_t = a_t h_{t-1} + x_t from h_{-1} = 0, over dim 1 of a and x (batch, L, channels)."""
    length, shift = x.shape[1], 1
    while shift < length:
        # each position composes with the one `shift` back: identity (a = 1, x = 0) before the start
        x = x + a * F.pad(x, (0, 0, shift, 0))[:, :length]
        a = a * F.pad(a, (0, 0, shift, 0), value=1.0)[:, :length]
        shift *= 2
    return x


class RGLRU(nn.Module):
    stacks = True  # exact under vmap over stacked members: plain torch ops

    def __init__(self, p: RGLRUPrimitive):
        super().__init__()
        dim, width, heads = p.dim, p.lru_width, p.heads
        self.width, self.heads, self.block, self.taps = width, heads, p.block_width, p.d_conv
        self.linear_y = nn.Linear(dim, width, bias=p.bias)
        self.linear_x = nn.Linear(dim, width, bias=p.bias)
        self.linear_out = nn.Linear(width, dim, bias=p.bias)
        self.conv_1d = nn.Conv1d(width, width, p.d_conv, groups=width, padding=p.d_conv - 1, bias=p.bias)
        self.input_gate_weight = nn.Parameter(torch.empty(heads, p.block_width, p.block_width))
        self.input_gate_bias = nn.Parameter(torch.zeros(heads, p.block_width))
        self.recurrent_gate_weight = nn.Parameter(torch.empty(heads, p.block_width, p.block_width))
        self.recurrent_gate_bias = nn.Parameter(torch.zeros(heads, p.block_width))
        self.recurrent_param = nn.Parameter(torch.empty(width))
        self.reset_parameters(dim)

    def reset_parameters(self, dim: int) -> None:
        with torch.no_grad():
            for linear, std in ((self.linear_x, dim**-0.5), (self.linear_y, dim**-0.5), (self.linear_out, None)):
                nn.init.normal_(linear.weight, std=std or math.sqrt(2.0 / self.width))
            nn.init.normal_(self.conv_1d.weight, std=math.sqrt(0.01 / self.taps))
            for weight in (self.input_gate_weight, self.recurrent_gate_weight):
                nn.init.normal_(weight, std=math.sqrt(0.01 / self.block))
            for module in (self.linear_x, self.linear_y, self.linear_out, self.conv_1d):
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            a = torch.empty_like(self.recurrent_param).uniform_(0.9**2 + 1e-8, 0.999**2 + 1e-8).log().mul(0.5)
            self.recurrent_param.copy_(torch.log(torch.expm1(-a)))  # softplus(param) = -log a

    def _gate(self, u: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        blocks = u.reshape(-1, self.heads, self.block).transpose(0, 1)  # (heads, tokens, block)
        # baddbmm, as the reference: one product per block whatever its width
        gate = torch.baddbmm(bias.unsqueeze(1), blocks, weight).transpose(0, 1).reshape(u.shape)
        return torch.sigmoid(gate)

    def _lru_inputs(self, u: Tensor, first: Tensor) -> tuple[Tensor, Tensor]:
        """The decay a_t and the scaled input of the recurrence; `first` marks position 0 (broadcast)."""
        log_a = -8.0 * self._gate(u, self.recurrent_gate_weight, self.recurrent_gate_bias)
        log_a = log_a * F.softplus(self.recurrent_param)
        gated = u * self._gate(u, self.input_gate_weight, self.input_gate_bias)
        scale = torch.where(first, torch.ones_like(log_a), torch.sqrt(-torch.expm1(2 * log_a)))
        return log_a.exp(), gated * scale

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        length = x.shape[1]
        u = depthwise_conv1d(self.conv_1d, self.linear_x(x).transpose(1, 2))[..., :length].transpose(1, 2)
        first = (torch.arange(length, device=x.device) == 0).unsqueeze(-1)
        a, inputs = self._lru_inputs(u, first)
        h = diagonal_scan(a, inputs)
        return self.linear_out(h * F.gelu(self.linear_y(x), approximate="tanh"))

    # ---- recurrent (inference) form ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.linear_out.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        return {
            "fixed": torch.zeros(batch, self.width, device=device, dtype=dtype),
            "conv": torch.zeros(batch, self.width, self.taps - 1, device=device, dtype=dtype),
            "pos": torch.zeros(batch, dtype=torch.long, device=device),
        }

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        window = torch.cat((state["conv"], self.linear_x(x_t).unsqueeze(-1)), dim=-1)  # (B, width, taps)
        u = (window * self.conv_1d.weight[:, 0]).sum(-1)
        if self.conv_1d.bias is not None:
            u = u + self.conv_1d.bias
        a, inputs = self._lru_inputs(u, (state["pos"] == 0).unsqueeze(-1))
        h = a * state["fixed"] + inputs
        y = self.linear_out(h * F.gelu(self.linear_y(x_t), approximate="tanh"))
        return y, {"fixed": h, "conv": window[..., 1:], "pos": state["pos"] + 1}
