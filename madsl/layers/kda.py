"""Kimi Delta Attention (`KDA`): the torch module of `madsl.primitives.kda`.

    q, k, v = SiLU(short_conv(q_proj(x), k_proj(x), v_proj(x)))     heads x head_dim / value heads
    q, k    = l2norm(q) * head_dim^-0.5, l2norm(k)                   per head (repeated for grouped values)
              (l2norm: F.normalize, or x / sqrt(|x|^2 + l2norm_eps), fla's and transformers')
    log alpha_t = -exp(A_log) softplus(f_proj(x) + dt_bias)          value heads x head_dim
    beta_t  = sigmoid(b_proj(x))                                     per value head
    S_t = (I - beta_t k_t k_t^T) diag(alpha_t) S_{t-1} + beta_t k_t v_t^T,  o_t = S_t^T q_t
    out = o_proj(rmsnorm(o) * sigmoid(g_proj(x)))

Training runs `madsl.kernels.channel_delta.channel_delta_parallel` (the chunked WY form, pure
PyTorch); `step` runs the recurrence one token at a time. State: "fixed" (batch, value_heads,
head_dim, value_dim) and "conv" (batch, channels, d_conv - 1). One packed conv over q, k, v
(transformers' conv1d; fla's three convs hold the same weights).

Init: PyTorch's default Linear init; A_log = log U(1, 16) and dt_bias the inverse softplus of
dt ~ logU(0.001, 0.1), as fla's KimiDeltaAttention; norm weight one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.channel_delta import channel_delta_parallel, channel_delta_step
from madsl.layers.delta_net import DeltaRuleStep
from madsl.layers.short_conv import ShortConv
from madsl.primitives.kda import KDA as KDAPrimitive


def _low_rank(dim: int, rank: int, out: int, bias: bool) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, rank, bias=False), nn.Linear(rank, out, bias=bias))


class KDA(DeltaRuleStep):
    step_kernel = staticmethod(channel_delta_step)  # the per-channel decay's recurrence
    stacks = True  # exact under vmap over stacked members: plain ops, the chunked form folds

    def __init__(self, p: KDAPrimitive):
        super().__init__()
        dim, heads = p.dim, p.v_heads  # the gates and the output side are per value head
        self.key_heads, self.heads, self.key_dim, self.value_dim = p.heads, heads, p.key_dim, p.value_dim
        self.l2norm_eps = float(p.l2norm_eps)
        key_width, value_width = p.heads * p.key_dim, heads * p.value_dim
        self.q_proj = nn.Linear(dim, key_width, bias=False)
        self.k_proj = nn.Linear(dim, key_width, bias=False)
        self.v_proj = nn.Linear(dim, value_width, bias=False)
        self.conv = ShortConv(p.conv_channels, p.d_conv, bias=False) if p.d_conv > 0 else None
        self.f_proj = _low_rank(dim, p.value_dim, heads * p.key_dim, bias=False)
        self.A_log = nn.Parameter(torch.empty(heads))
        self.dt_bias = nn.Parameter(torch.empty(heads * p.key_dim))
        self.b_proj = nn.Linear(dim, heads, bias=False)
        self.g_proj = _low_rank(dim, p.value_dim, value_width, bias=p.gate_bias)
        self.o_norm = nn.RMSNorm(p.value_dim, eps=p.norm_eps)
        self.o_proj = nn.Linear(value_width, dim, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
            dt = torch.empty_like(self.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp(min=1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        nn.init.ones_(self.o_norm.weight)
        if self.g_proj[1].bias is not None:
            nn.init.zeros_(self.g_proj[1].bias)

    def _qkv(self, x: Tensor) -> Tensor:
        return torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)

    def _mix_inputs(self, x: Tensor, qkv: Tensor) -> tuple[Tensor, ...]:
        """x (..., dim), the conv'd qkv -> q, k, log_decay (.., value_heads, head_dim), v, beta."""
        lead = x.shape[:-1]
        key_width = self.key_heads * self.key_dim
        q, k, v = qkv.split((key_width, key_width, self.heads * self.value_dim), dim=-1)
        q = self._l2norm(q.view(*lead, self.key_heads, self.key_dim)) * self.key_dim**-0.5
        k = self._l2norm(k.view(*lead, self.key_heads, self.key_dim))
        if self.heads != self.key_heads:  # each key head serves heads / key_heads consecutive value heads
            q, k = (t.repeat_interleave(self.heads // self.key_heads, dim=-2) for t in (q, k))
        v = v.view(*lead, self.heads, self.value_dim)
        gate = (self.f_proj(x) + self.dt_bias).view(*lead, self.heads, self.key_dim)
        log_decay = -self.A_log.exp().unsqueeze(-1) * F.softplus(gate)
        return q, k, v, torch.sigmoid(self.b_proj(x)), log_decay

    def _l2norm(self, x: Tensor) -> Tensor:
        if not self.l2norm_eps:
            return F.normalize(x, dim=-1)
        return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + self.l2norm_eps)  # fla's l2norm, as transformers'

    def _readout(self, o: Tensor, x: Tensor) -> Tensor:
        o = self.o_norm(o.to(self.o_norm.weight.dtype)) * torch.sigmoid(self.g_proj(x).view_as(o))
        return self.o_proj(o.flatten(-2))

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        qkv = self._qkv(x)
        qkv = self.conv(qkv) if self.conv is not None else F.silu(qkv)
        q, k, v, beta, log_decay = self._mix_inputs(x, qkv)
        o = channel_delta_parallel(*(t.transpose(1, 2) for t in (q, k, v, beta, log_decay)))
        return self._readout(o.transpose(1, 2), x)
