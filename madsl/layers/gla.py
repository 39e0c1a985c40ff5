"""Gated linear attention (`Alg`, `mAlg`): the torch module of `madsl.primitives.gla`.

Layout of flash-linear-attention's `GatedLinearAttention` (Yang et al. 2023):

    q, k = q_proj(x), k_proj(x)                      heads x key_dim each, q scaled by key_dim^-0.5
    v    = v_proj(x)                                 heads x value_dim
    g_t  = logsigmoid(gk_proj(x)) / gate_normalizer  log forget gate, low rank: dim -> r -> heads*key_dim
    S_t  = diag(exp(g_t)) S_{t-1} + k_t v_t^T,  o_t = S_t^T q_t          (per head)
    out  = o_proj(g_norm(o) * swish(g_proj(x)))      g_norm: RMSNorm over value_dim, shared by heads;
                                                     without the output gate: o_proj(g_norm(o))

Kernels (`madsl.kernels.gla`): on CUDA with flash-linear-attention installed, its
Triton chunk kernel; otherwise the pure-PyTorch chunked form. `kernel` can force
one ("chunked", "recurrent", "fla").

Init (as the GLA reference implementation that the MAD reference code uses):
xavier_uniform with gain 2^-2.5 for every projection weight, the forget gate's bias
zero (so alpha starts near exp(log(1/2)/16) = 0.957), RMSNorm weight one.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.gla import fla_applies, gla_chunked, gla_fla_chunk, gla_recurrent, gla_step
from madsl.primitives.gla import GatedLinearAttention as GLAPrimitive

Kernel = Literal["auto", "chunked", "recurrent", "fla"]


class GatedLinearAttention(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: GLAPrimitive):
        super().__init__()
        dim, heads, gate_low_rank, output_gate = p.dim, p.heads, p.gate_low_rank, p.output_gate
        self.dim = dim
        self.heads = heads
        self.key_dim = p.dk
        self.value_dim = p.dv
        self.gate_normalizer = float(p.gate_normalizer)
        self.output_gate = output_gate
        self.scale = self.key_dim**-0.5
        self.kernel: Kernel = "auto"
        self.chunk_size: int | None = None  # chunked kernel; None: default_chunk_size(key_dim, value_dim)

        key_width, value_width = heads * self.key_dim, heads * self.value_dim
        self.q_proj = nn.Linear(dim, key_width, bias=False)
        self.k_proj = nn.Linear(dim, key_width, bias=False)
        self.v_proj = nn.Linear(dim, value_width, bias=False)
        self.g_proj = nn.Linear(dim, value_width, bias=False) if output_gate else None
        self.gk_proj = nn.Sequential(
            nn.Linear(dim, gate_low_rank, bias=False), nn.Linear(gate_low_rank, key_width, bias=True)
        )
        self.g_norm = nn.RMSNorm(self.value_dim, eps=1e-5)
        self.o_proj = nn.Linear(value_width, dim, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight, gain=2**-2.5)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.ones_(self.g_norm.weight)

    # ---- shared pieces ----------------------------------------------------------------------------
    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x (..., dim) -> q (scaled), k, log_decay (..., heads, key_dim); v (..., heads, value_dim)."""
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.heads, self.key_dim) * self.scale
        k = self.k_proj(x).view(*lead, self.heads, self.key_dim)
        v = self.v_proj(x).view(*lead, self.heads, self.value_dim)
        log_decay = F.logsigmoid(self.gk_proj(x)).view(*lead, self.heads, self.key_dim) / self.gate_normalizer
        return q, k, v, log_decay

    def _readout(self, o: Tensor, x: Tensor) -> Tensor:
        """o (..., heads, value_dim), x (..., dim) -> (..., dim): norm, output gate, o_proj."""
        o = self.g_norm(o.to(self.g_norm.weight.dtype))  # under autocast: the norm's statistics in float32
        if self.g_proj is not None:
            o = o * F.silu(self.g_proj(x).view_as(o))
        return self.o_proj(o.flatten(-2))

    def _select_kernel(self, x: Tensor) -> str:
        if self.kernel != "auto":
            return self.kernel
        return "fla" if fla_applies(x) else "chunked"

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        q, k, v, log_decay = (t.transpose(1, 2) for t in self._project(x))  # (B, heads, L, .)
        kernel = self._select_kernel(x)
        if kernel == "chunked":
            o, _ = gla_chunked(q, k, v, log_decay, chunk_size=self.chunk_size)
        elif kernel == "recurrent":
            o, _ = gla_recurrent(q, k, v, log_decay)
        elif kernel == "fla":
            o, _ = gla_fla_chunk(q, k, v, log_decay)
        else:
            raise ValueError(f"unknown GLA kernel {kernel!r}")
        return self._readout(o.transpose(1, 2), x)

    # ---- recurrent (inference) form ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        dtype = dtype if dtype is not None else self.o_proj.weight.dtype
        device = device if device is not None else self.o_proj.weight.device
        return {"fixed": torch.zeros(batch, self.heads, self.key_dim, self.value_dim, device=device, dtype=dtype)}

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        q, k, v, log_decay = self._project(x_t)  # (B, heads, .)
        o, fixed = gla_step(q, k, v, log_decay, state["fixed"])
        return self._readout(o, x_t), {"fixed": fixed}
