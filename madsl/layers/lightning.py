"""MiniMax's lightning attention (`Lt`): the torch module of `madsl.primitives.lightning`.

    q, k, v = split(SiLU(qkv_proj(x)))                 per head: [q | k | v], each head_dim wide
    S_t = exp(-slope_h) S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t
    out = out_proj(sigmoid(output_gate(x)) * rmsnorm(o))

Training runs `madsl.kernels.linear_recurrence.decay_parallel` (fla's chunk_simple_gla on CUDA,
else the chunked form, exact for any decay: MiniMax's own block form is the same computation);
`step` runs the recurrence one token at a time. State: "fixed" (batch, heads, head_dim, head_dim).

Init: PyTorch's default Linear init, norm weight one; the slopes are constants (a buffer, not saved).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.linear_recurrence import decay_parallel, decay_step
from madsl.primitives.lightning import Lightning as LightningPrimitive


class Lightning(nn.Module):
    stacks = True  # exact under vmap over stacked members: every op batches or folds

    def __init__(self, p: LightningPrimitive):
        super().__init__()
        self.heads, self.head_dim = p.heads, p.inner_head_dim
        self.qkv_proj = nn.Linear(p.dim, 3 * p.inner, bias=False)
        self.output_gate = nn.Linear(p.dim, p.inner, bias=False)
        self.norm = nn.RMSNorm(p.inner, eps=1e-6)
        self.out_proj = nn.Linear(p.inner, p.dim, bias=False)
        log_decay = -torch.tensor(p.slopes(), dtype=torch.float64)
        self.register_buffer("log_decay", log_decay, persistent=False)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (..., heads, head_dim)."""
        qkv = F.silu(self.qkv_proj(x)).unflatten(-1, (self.heads, 3 * self.head_dim))
        q, k, v = qkv.split(self.head_dim, dim=-1)
        return q, k, v

    def _readout(self, o: Tensor, x: Tensor) -> Tensor:
        o = self.norm(o.flatten(-2).to(self.norm.weight.dtype))
        return self.out_proj(torch.sigmoid(self.output_gate(x)) * o)

    def _log_decay(self, like: Tensor) -> Tensor:
        return self.log_decay.to(like.dtype if like.dtype == torch.float64 else torch.float32)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._project(x))
        log_decay = self._log_decay(q).view(1, -1, 1).expand(batch, -1, length)
        return self._readout(decay_parallel(q, k, v, log_decay).transpose(1, 2), x)

    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.out_proj.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        return {"fixed": torch.zeros(batch, self.heads, self.head_dim, self.head_dim, device=device, dtype=dtype)}

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        q, k, v = self._project(x_t)
        log_decay = self._log_decay(state["fixed"]).expand(x_t.shape[0], -1)
        o, fixed = decay_step(q, k, v, log_decay, state["fixed"])
        return self._readout(o, x_t), {"fixed": fixed}
