"""Mamba-2 (`M2`): the torch module of `madsl.primitives.mamba2`.

    z, xBC, dt = in_proj(x)                          xBC -> SiLU(short conv) -> x, B, C
    per head:   h_t = exp(dt_t A) h_{t-1} + B_t (dt_t x_t)^T,   y_t = h_t^T C_t + D x_t
    out = out_proj(rmsnorm_per_group(y * silu(z)) * norm.weight)   norm: false: out_proj(y * silu(z))

The scan is SSD (`madsl.kernels.linear_recurrence.decay_parallel`: fla's chunk_simple_gla on
CUDA, else the chunked form `decay_chunked`; q = C,
k = B, v = dt x, log decay dt A); `step` runs it one token at a time. State: "fixed"
(batch, heads, d_state, head_dim) and "conv" (batch, d_inner + 2 groups d_state, d_conv - 1).

Init (as mamba-ssm's Mamba2): PyTorch's default init for in_proj, conv and out_proj; A_log =
log U(1, 16); dt_bias the inverse softplus of dt ~ logU(0.001, 0.1) (floor 1e-4); D and the
norm weight one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.linear_recurrence import decay_parallel, decay_step
from madsl.layers.short_conv import ShortConv
from madsl.primitives.mamba2 import Mamba2 as Mamba2Primitive


class Mamba2(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: Mamba2Primitive):
        super().__init__()
        self.d_inner, self.d_state, self.head_dim = p.d_inner, p.d_state, p.head_dim
        self.heads, self.groups = p.n_heads, p.groups
        self.chunk_size = 64
        self.in_proj = nn.Linear(p.dim, p.d_inner + p.conv_channels + self.heads, bias=p.bias)
        self.conv = ShortConv(p.conv_channels, p.d_conv, bias=p.conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(self.heads))
        self.A_log = nn.Parameter(torch.empty(self.heads))
        self.D = nn.Parameter(torch.empty(self.heads))
        self.norm_weight = nn.Parameter(torch.empty(p.d_inner)) if p.norm else None
        self.norm_eps = p.norm_eps
        self.dt_min = p.dt_min
        self.out_proj = nn.Linear(p.d_inner, p.dim, bias=p.bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            dt = torch.empty_like(self.dt_bias).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp(min=1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
        nn.init.ones_(self.D)
        if self.norm_weight is not None:
            nn.init.ones_(self.norm_weight)

    def _split(self, zxbcdt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return zxbcdt.split((self.d_inner, self.d_inner + 2 * self.groups * self.d_state, self.heads), dim=-1)

    def _ssm_inputs(self, xBC: Tensor, dt: Tensor) -> tuple[Tensor, ...]:
        """Conv'd xBC (..., channels), raw dt (..., heads) -> x (.., heads, head_dim), B, C
        (.., heads, d_state), dt (.., heads), log decay (.., heads)."""
        lead = xBC.shape[:-1]
        group_width = self.groups * self.d_state
        x, B, C = xBC.split((self.d_inner, group_width, group_width), dim=-1)
        per_group = self.heads // self.groups
        B = B.view(*lead, self.groups, self.d_state).repeat_interleave(per_group, dim=-2)
        C = C.view(*lead, self.groups, self.d_state).repeat_interleave(per_group, dim=-2)
        dt = F.softplus(dt + self.dt_bias)
        if self.dt_min:  # Zamba2's time_step_min: a floor under every step size
            dt = dt.clamp(min=self.dt_min)
        return x.view(*lead, self.heads, self.head_dim), B, C, dt, -self.A_log.exp() * dt

    def _output(self, y: Tensor, x: Tensor, z: Tensor) -> Tensor:
        """y, x (.., heads, head_dim), z (.., d_inner) -> out_proj(gated per-group RMSNorm(y + D x))."""
        y = (y + self.D[:, None] * x).flatten(-2)
        if self.norm_weight is None:  # the gate alone (Falcon-H1's mamba_rms_norm: false)
            return self.out_proj(y * F.silu(z))
        with torch.autocast(device_type=y.device.type, enabled=False):  # the norm's statistics in float32
            dtype = torch.promote_types(y.dtype, torch.float32)
            gated = (y.to(dtype) * F.silu(z.to(dtype))).unflatten(-1, (self.groups, -1))
            normed = gated * torch.rsqrt(gated.square().mean(-1, keepdim=True) + self.norm_eps)
            y = normed.flatten(-2) * self.norm_weight.to(dtype)
        return self.out_proj(y.to(self.out_proj.weight.dtype))

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, u: Tensor) -> Tensor:
        z, xBC, dt = self._split(self.in_proj(u))
        x, B, C, dt, log_decay = self._ssm_inputs(self.conv(xBC), dt)

        def head_first(t):
            return t.transpose(1, 2)

        y = decay_parallel(
            head_first(C),
            head_first(B),
            head_first(x * dt.unsqueeze(-1)),
            head_first(log_decay),
            chunk_size=self.chunk_size,
        )
        return self._output(y.transpose(1, 2), x, z)

    # ---- recurrent (inference) form ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.out_proj.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        return {
            "fixed": torch.zeros(batch, self.heads, self.d_state, self.head_dim, device=device, dtype=dtype),
            "conv": self.conv.init_state(batch, device, dtype),
        }

    def step(self, u_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        z, xBC, dt = self._split(self.in_proj(u_t))
        xBC, conv = self.conv.step(xBC, state["conv"])
        x, B, C, dt, log_decay = self._ssm_inputs(xBC, dt)
        y, fixed = decay_step(C, B, x * dt.unsqueeze(-1), log_decay, state["fixed"])
        return self._output(y, x, z), {"fixed": fixed, "conv": conv}
