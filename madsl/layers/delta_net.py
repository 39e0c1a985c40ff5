"""DeltaNet and Gated DeltaNet (`DN`, `GDN`): the torch module of `madsl.primitives.delta_net`.

    q, k, v = SiLU(short_conv(q_proj(x), k_proj(x), v_proj(x)))     heads x head_dim / value_dim
    q, k    = l2norm(q) * head_dim^-0.5, l2norm(k)                   per head (x / ||x||, or
                                                                     x / sqrt(||x||^2 + l2norm_eps))
    beta_t  = sigmoid(b_proj(x))                                     per head
    log alpha_t = -exp(A_log) softplus(a_proj(x) + dt_bias)          per head (gated only)
    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,  o_t = S_t^T q_t
    out = o_proj(rmsnorm(o) [* swish(g_proj(x))])

With more value heads than key heads (`value_heads`, Qwen3-Next), q and k are repeated for the
value heads each key head serves, after the norm: the recurrence runs per value head.

Training runs `madsl.kernels.linear_recurrence.delta_parallel` (fla's kernel on CUDA, else the
chunked WY form `delta_chunked`); `step`
runs the recurrence one token at a time. State: "fixed" (batch, value_heads, head_dim, value_dim)
and "conv" (batch, channels, d_conv - 1).

Init: PyTorch's default Linear init; A_log = log U(1, 16) and dt_bias the inverse softplus of
dt ~ logU(0.001, 0.1), as fla's GatedDeltaNet (after Mamba-2); norm weight one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.linear_recurrence import delta_parallel, delta_step
from madsl.layers.short_conv import ShortConv
from madsl.primitives.delta_net import DeltaNet as DeltaNetPrimitive


class DeltaRuleStep(nn.Module):
    """The recurrent (inference) form a delta-rule layer shares: the fixed state (heads x key x
    value), the short convolution's state where it has one, and one token through `step_kernel`
    (the layer's recurrence: DeltaNet's scalar decay, KDA's per-channel one). A subclass has
    `heads`, `key_dim`, `value_dim`, `conv`, `o_proj`, `_qkv`, `_mix_inputs` and `_readout`."""

    step_kernel = staticmethod(delta_step)

    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.o_proj.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        state = {"fixed": torch.zeros(batch, self.heads, self.key_dim, self.value_dim, device=device, dtype=dtype)}
        if self.conv is not None:
            state["conv"] = self.conv.init_state(batch, device, dtype)
        return state

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        qkv = self._qkv(x_t)
        new_state = {}
        if self.conv is not None:
            qkv, new_state["conv"] = self.conv.step(qkv, state["conv"])
        else:
            qkv = F.silu(qkv)
        q, k, v, beta, log_decay = self._mix_inputs(x_t, qkv)
        o, new_state["fixed"] = self.step_kernel(q, k, v, beta, log_decay, state["fixed"])
        return self._readout(o, x_t), new_state


class DeltaNet(DeltaRuleStep):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: DeltaNetPrimitive):
        super().__init__()
        dim, heads = p.dim, p.v_heads  # b, a, A_log, dt_bias and the output side are per value head
        self.key_heads, self.heads, self.key_dim, self.value_dim = p.heads, heads, p.key_dim, p.value_dim
        self.chunk_size = 64
        self.l2norm_eps = p.l2norm_eps
        key_width, value_width = p.heads * self.key_dim, heads * self.value_dim
        self.q_proj = nn.Linear(dim, key_width, bias=False)
        self.k_proj = nn.Linear(dim, key_width, bias=False)
        self.v_proj = nn.Linear(dim, value_width, bias=False)
        self.b_proj = nn.Linear(dim, heads, bias=False)
        self.conv = ShortConv(p.conv_channels, p.d_conv, bias=False) if p.d_conv > 0 else None
        if p.gated:
            self.a_proj = nn.Linear(dim, heads, bias=False)
            self.A_log = nn.Parameter(torch.empty(heads))
            self.dt_bias = nn.Parameter(torch.empty(heads))
        else:
            self.a_proj = None
        self.g_proj = nn.Linear(dim, value_width, bias=False) if p.output_gate else None
        self.o_norm = nn.RMSNorm(self.value_dim, eps=p.norm_eps)
        self.o_proj = nn.Linear(value_width, dim, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.a_proj is not None:
            with torch.no_grad():
                self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
                dt = torch.empty_like(self.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp(min=1e-4)
                self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        nn.init.ones_(self.o_norm.weight)

    def _mix_inputs(self, x: Tensor, qkv: Tensor) -> tuple[Tensor, ...]:
        """x (..., dim) and the conv'd qkv (..., channels) -> q, k (.., heads, head_dim), v, beta, log_decay."""
        lead = x.shape[:-1]
        key_width = self.key_heads * self.key_dim
        q, k, v = qkv.split((key_width, key_width, self.heads * self.value_dim), dim=-1)
        q = self._l2(q.view(*lead, self.key_heads, self.key_dim)) * self.key_dim**-0.5
        k = self._l2(k.view(*lead, self.key_heads, self.key_dim))
        if self.heads != self.key_heads:  # each key head serves heads / key_heads consecutive value heads
            q, k = (t.repeat_interleave(self.heads // self.key_heads, dim=-2) for t in (q, k))
        v = v.view(*lead, self.heads, self.value_dim)
        beta = torch.sigmoid(self.b_proj(x))
        log_decay = None
        if self.a_proj is not None:
            log_decay = -self.A_log.exp() * F.softplus(self.a_proj(x) + self.dt_bias)
        return q, k, v, beta, log_decay

    def _l2(self, x: Tensor) -> Tensor:
        """x / ||x|| per head, or x / sqrt(||x||^2 + l2norm_eps) (fla's l2norm, transformers' Qwen3-Next)."""
        if not self.l2norm_eps:
            return F.normalize(x, dim=-1)
        return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + self.l2norm_eps)

    def _qkv(self, x: Tensor) -> Tensor:
        return torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)

    def _readout(self, o: Tensor, x: Tensor) -> Tensor:
        o = self.o_norm(o.to(self.o_norm.weight.dtype))
        if self.g_proj is not None:
            o = o * F.silu(self.g_proj(x).view_as(o))
        return self.o_proj(o.flatten(-2))

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        qkv = self._qkv(x)
        qkv = self.conv(qkv) if self.conv is not None else F.silu(qkv)
        q, k, v, beta, log_decay = self._mix_inputs(x, qkv)

        def head_first(t):
            return None if t is None else t.transpose(1, 2)

        o = delta_parallel(
            head_first(q),
            head_first(k),
            head_first(v),
            head_first(beta),
            head_first(log_decay),
            chunk_size=self.chunk_size,
        )
        return self._readout(o.transpose(1, 2), x)
