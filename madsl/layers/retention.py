"""RetNet's multi-scale retention (`Ret`): the torch module of `madsl.primitives.retention`.

    q, k = rotary(q_proj(x)) * key_dim^-0.5, rotary(k_proj(x));  v = v_proj(x)
    S_t  = gamma_h S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t,  gamma_h = 1 - 2^(-5 - h)
    out  = o_proj(rmsnorm(o) [* swish(g_proj(x))])

Training runs `madsl.kernels.linear_recurrence.decay_parallel` (fla's kernel on CUDA, else the
chunked form; a constant
log decay per head); `step` the recurrence. State: "fixed" (batch, heads, key_dim, value_dim)
and "pos" (batch,) int64, the next token's position (for the rotary embedding).

Init: PyTorch's default Linear init; norm weight one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.linear_recurrence import decay_parallel, decay_step
from madsl.layers.rotary import rotate
from madsl.primitives.retention import Retention as RetentionPrimitive

ROTARY_BASE = 10000.0


class Retention(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: RetentionPrimitive):
        super().__init__()
        self.heads, self.key_dim, self.value_dim = p.heads, p.key_dim, p.value_dim
        self.rotary = p.rotary
        self.chunk_size = 64
        self.q_proj = nn.Linear(p.dim, p.key_width, bias=False)
        self.k_proj = nn.Linear(p.dim, p.key_width, bias=False)
        self.v_proj = nn.Linear(p.dim, p.value_width, bias=False)
        self.g_proj = nn.Linear(p.dim, p.value_width, bias=False) if p.output_gate else None
        self.g_norm = nn.RMSNorm(p.value_dim, eps=1e-5)
        self.o_proj = nn.Linear(p.value_width, p.dim, bias=False)
        # the fixed decays: log(1 - 2^(-5 - h)), a buffer (not a parameter, not saved)
        log_gamma = [math.log1p(-(2.0 ** (-5 - h))) for h in range(p.heads)]
        self.register_buffer("log_gamma", torch.tensor(log_gamma, dtype=torch.float64), persistent=False)

    def _project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.heads, self.key_dim)
        k = self.k_proj(x).view(*lead, self.heads, self.key_dim)
        if self.rotary:
            q, k = rotate(q, positions, ROTARY_BASE), rotate(k, positions, ROTARY_BASE)
        return q * self.key_dim**-0.5, k, self.v_proj(x).view(*lead, self.heads, self.value_dim)

    def _readout(self, o: Tensor, x: Tensor) -> Tensor:
        o = self.g_norm(o.to(self.g_norm.weight.dtype))
        if self.g_proj is not None:
            o = o * F.silu(self.g_proj(x).view_as(o))
        return self.o_proj(o.flatten(-2))

    def forward(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._project(x, torch.arange(length, device=x.device)))
        log_decay = self.log_gamma.to(q.dtype if q.dtype == torch.float64 else torch.float32)
        log_decay = log_decay.view(1, -1, 1).expand(batch, -1, length)
        o = decay_parallel(q, k, v, log_decay, chunk_size=self.chunk_size)
        return self._readout(o.transpose(1, 2), x)

    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.o_proj.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        return {
            "fixed": torch.zeros(batch, self.heads, self.key_dim, self.value_dim, device=device, dtype=dtype),
            "pos": torch.zeros(batch, dtype=torch.long, device=device),
        }

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        q, k, v = self._project(x_t, state["pos"])
        log_decay = self.log_gamma.to(state["fixed"].dtype).expand(x_t.shape[0], -1)
        o, fixed = decay_step(q, k, v, log_decay, state["fixed"])
        return self._readout(o, x_t), {"fixed": fixed, "pos": state["pos"] + 1}
