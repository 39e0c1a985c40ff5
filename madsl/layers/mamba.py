"""Mamba (`Mb`), the selective state-space layer of Gu & Dao (2023), as in mamba-ssm's
`mamba_simple.Mamba`: same parameter names, shapes and initialisation, so state
dicts move between the two. Kernels, by device (`madsl.kernels`):

    CUDA, mamba-ssm and causal-conv1d    mamba-ssm's `mamba_inner_fn` (the whole inner block fused)
    CUDA, either one missing             causal-conv1d's conv (else torch's Conv1d) and
                                         mamba-ssm's scan (else the chunked parallel scan)
    CPU (and float64 anywhere)           torch's Conv1d and madsl's fused CPU scan / chunked scan
    under vmap (stacked grid training)   the unfused parts, each running once for all members
                                         (members folded into the channels; mamba_inner_fn's
                                         projections cannot fold)

Nothing here imports mamba-ssm, causal-conv1d or triton eagerly.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels import cuda, member_fold
from madsl.kernels.causal_conv1d import causal_conv1d_silu
from madsl.kernels.selective_scan import selective_scan
from madsl.layers.short_conv import depthwise_conv1d
from madsl.primitives.mamba import Mamba as MambaPrimitive


def at_least_fp32(t: Tensor) -> Tensor:
    # The SSM parameters enter the scan in float32 even in a half-precision model
    # (as in mamba-ssm), and in float64 when the model is float64.
    return t if t.dtype == torch.float64 else t.float()


def mamba_scan(
    x: Tensor, dt: Tensor, B: Tensor, C: Tensor, z: Tensor, A_log: Tensor, D: Tensor, dt_bias: Tensor, last_state: bool
) -> tuple[Tensor, Tensor | None]:
    """Mamba-1's selective scan over (batch, L, channels) inputs, dt before its bias (added, then
    softplus, inside the scan): y (batch, L, d_inner) in the scan's precision and, where asked, the
    last state. The scan takes mamba-ssm's (batch, channels, L); transposed views of
    (batch, L, channels) tensors are what the CPU scan reads without copies."""
    out = selective_scan(
        x.transpose(1, 2),
        dt.transpose(1, 2),
        -torch.exp(at_least_fp32(A_log)),
        B.transpose(1, 2),
        C.transpose(1, 2),
        at_least_fp32(D),
        z=z.transpose(1, 2),
        delta_bias=at_least_fp32(dt_bias),
        delta_softplus=True,
        return_last_state=last_state,
    )
    y, h = out if last_state else (out, None)
    return y.transpose(1, 2), h


class Mamba(nn.Module):
    """x -> in_proj -> (x, z); x -> causal depthwise conv -> SiLU -> selective SSM
    (input-dependent dt, B, C) -> + D*x -> * SiLU(z) -> out_proj.

    Built from its resolved primitive (`madsl.primitives.mamba.Mamba`: hyperparameters,
    their validation and the derived sizes d_inner and dt_rank live there).
    Shapes: d_inner = expand * dim, dt_rank = ceil(dim / 16) when None.
      in_proj   Linear(dim, 2*d_inner, bias=bias)
      conv1d    Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv-1, bias=conv_bias)
      x_proj    Linear(d_inner, dt_rank + 2*d_state, bias=False)
      dt_proj   Linear(dt_rank, d_inner, bias=True)
      A_log     (d_inner, d_state);  A = -exp(A_log)
      D         (d_inner,)
      out_proj  Linear(d_inner, dim, bias=bias)

    Initialisation (as mamba-ssm): in_proj, conv1d, x_proj and out_proj keep PyTorch's
    defaults; dt_proj.weight ~ U(-s, s) with s = dt_rank^-0.5 * dt_scale; dt_proj.bias
    = softplus^-1(dt) with dt = exp(U(log dt_min, log dt_max)) clamped below at
    dt_init_floor, so that softplus(bias) starts log-uniform in [dt_min, dt_max]
    (marked `_no_reinit`); A_log[d, n] = log(n + 1) (S4D-real: A = -1, -2, ..., -d_state
    for every channel); D = 1. A_log and D are marked `_no_weight_decay`.

    State for `step`: "fixed" (batch, d_inner, d_state), the SSM state; "conv"
    (batch, d_inner, d_conv - 1), the last d_conv - 1 conv inputs (mamba-ssm keeps
    d_conv of them; the oldest is never used).
    """

    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    # dt initialisation (mamba-ssm's defaults): softplus(dt bias) log-uniform in [DT_MIN, DT_MAX]
    DT_MIN, DT_MAX, DT_SCALE, DT_INIT_FLOOR = 0.001, 0.1, 1.0, 1e-4

    def __init__(self, p: MambaPrimitive):
        super().__init__()
        dim, d_state, d_conv = p.dim, p.d_state, p.d_conv
        self.dim = dim
        self.d_state = d_state
        self.d_conv = d_conv
        self.expand = p.expand
        self.d_inner = p.d_inner
        self.dt_rank = p.rank

        self.in_proj = nn.Linear(dim, 2 * self.d_inner, bias=p.bias)
        self.conv1d = nn.Conv1d(
            self.d_inner, self.d_inner, kernel_size=d_conv, groups=self.d_inner, padding=d_conv - 1, bias=p.conv_bias
        )
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)

        # dt_proj keeps the variance of dt at initialisation; its bias sets dt's range.
        dt_init_std = self.dt_rank**-0.5 * self.DT_SCALE
        nn.init.uniform_(self.dt_proj.weight, -dt_init_std, dt_init_std)
        log_dt = torch.rand(self.d_inner) * (math.log(self.DT_MAX) - math.log(self.DT_MIN)) + math.log(self.DT_MIN)
        dt = torch.exp(log_dt).clamp(min=self.DT_INIT_FLOOR)
        inverse_softplus_dt = dt + torch.log(-torch.expm1(-dt))  # softplus(this) == dt
        with torch.no_grad():
            self.dt_proj.bias.copy_(inverse_softplus_dt)
        self.dt_proj.bias._no_reinit = True  # a model-wide "zero all biases" must skip it

        # S4D-real: A[d, n] = -(n + 1). Kept in float32 like mamba-ssm.
        A = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)
        self.A_log = nn.Parameter(torch.log(A))
        self.A_log._no_weight_decay = True
        self.D = nn.Parameter(torch.ones(self.d_inner))  # skip connection
        self.D._no_weight_decay = True

        self.out_proj = nn.Linear(self.d_inner, dim, bias=p.bias)
        self.inner_norm_eps = p.inner_norm_eps
        if p.inner_norms:  # Jamba's dt, B and C norms, under its names (weights move as they are)
            self.dt_layernorm = _NormWeight(self.dt_rank)
            self.b_layernorm = _NormWeight(d_state)
            self.c_layernorm = _NormWeight(d_state)
        self.inner_norms = p.inner_norms

    def _split(self, x_conv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """dt (low rank), B and C from the conv's output, normalised where the layer has inner norms."""
        dt, B, C = torch.split(self.x_proj(x_conv), [self.dt_rank, self.d_state, self.d_state], dim=-1)
        if self.inner_norms:
            dt, B, C = (
                F.rms_norm(t.float(), t.shape[-1:], norm.weight.float(), self.inner_norm_eps).to(t.dtype)
                for t, norm in ((dt, self.dt_layernorm), (B, self.b_layernorm), (C, self.c_layernorm))
            )
        return dt, B, C

    # --- parallel (training) form ------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        """x: (batch, L, dim) -> (batch, L, dim), causal."""
        fused = self._cuda_kernels(x)
        if fused is not None:
            return self._forward_fused(x, fused)
        return self._forward(x, last_state=False)

    def prefill(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The parallel forward and the state `step` continues from (the scan's last state,
        the last d_conv - 1 conv inputs)."""
        return self._forward(x, last_state=True)

    def _forward(self, x: Tensor, last_state: bool):
        x_in, z = self.in_proj(x).chunk(2, dim=-1)  # (batch, L, d_inner) each
        x_conv = self._causal_conv_silu(x_in)
        dt, B, C = self._split(x_conv)  # (batch, L, dt_rank), (batch, L, d_state) x 2
        dt = F.linear(dt, self.dt_proj.weight)  # its bias is added inside the scan
        y, h = mamba_scan(x_conv, dt, B, C, z, self.A_log, self.D, self.dt_proj.bias, last_state)
        if not last_state:
            return self.out_proj(y.to(x.dtype))
        window = F.pad(x_in.transpose(1, 2), (self.d_conv - 1, 0))[..., x_in.shape[1] :]  # last d_conv-1 inputs
        return self.out_proj(y.to(x.dtype)), {"fixed": h.to(x.dtype), "conv": window}

    def _cuda_kernels(self, x: Tensor):
        """mamba-ssm's fused `mamba_inner_fn` where it applies: CUDA, not float64 (its
        kernels take fp32/fp16/bf16), a conv width causal-conv1d supports (2..4), not under vmap."""
        if not x.is_cuda or x.dtype == torch.float64 or not 2 <= self.d_conv <= 4 or member_fold.active():
            return None
        if self.inner_norms:  # the fused path has no place for them
            return None
        return cuda.mamba_inner_fn()

    def _forward_fused(self, x: Tensor, mamba_inner_fn) -> Tensor:
        """mamba-ssm's fast path (as its `Mamba.forward`): xz (batch, 2*d_inner, L); B, C
        None = input-dependent; A, D and dt's bias in float32. Returns (batch, L, dim)."""
        xz = self.in_proj(x).transpose(1, 2)
        A = -torch.exp(at_least_fp32(self.A_log))
        return mamba_inner_fn(
            xz,
            self.conv1d.weight,
            self.conv1d.bias,
            self.x_proj.weight,
            self.dt_proj.weight,
            self.out_proj.weight,
            self.out_proj.bias,
            A,
            None,
            None,
            at_least_fp32(self.D),
            delta_bias=at_least_fp32(self.dt_proj.bias),
            delta_softplus=True,
        )

    def _cuda_conv(self, x: Tensor):
        """causal-conv1d's `causal_conv1d_fn` where it applies (as `_cuda_kernels`)."""
        if not x.is_cuda or x.dtype == torch.float64 or not 2 <= self.d_conv <= 4:
            return None
        return cuda.causal_conv1d_fn()

    def _causal_conv_silu(self, x: Tensor) -> Tensor:
        """SiLU of the depthwise causal convolution, (batch, L, d_inner) -> (batch, L, d_inner).
        On CUDA causal-conv1d's kernel (conv and SiLU fused; x (batch, d_inner, L), weight
        (d_inner, width)) where it applies. On the CPU nn.Conv1d on contiguous
        (batch, d_inner, L) copies was the fastest variant measured (shifted
        multiply-adds in place, a custom Function: no faster)."""
        conv_fn = self._cuda_conv(x)
        if conv_fn is not None:  # under vmap: one call for all members (madsl.kernels.causal_conv1d)
            out = causal_conv1d_silu(
                conv_fn, x.transpose(1, 2).contiguous(), self.conv1d.weight[:, 0, :], self.conv1d.bias
            )
            return out.transpose(1, 2)
        length = x.shape[1]
        out = depthwise_conv1d(self.conv1d, x.transpose(1, 2).contiguous())[..., :length]
        return F.silu(out.transpose(1, 2).contiguous())

    # --- recurrent (inference) form ----------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        device = device if device is not None else self.out_proj.weight.device
        dtype = dtype if dtype is not None else self.out_proj.weight.dtype
        return {
            "fixed": torch.zeros(batch, self.d_inner, self.d_state, device=device, dtype=dtype),
            "conv": torch.zeros(batch, self.d_inner, self.d_conv - 1, device=device, dtype=dtype),
        }

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """One token: x_t (batch, dim) -> (y_t (batch, dim), new state). The input state
        is not modified."""
        x_in, z = self.in_proj(x_t).chunk(2, dim=-1)  # (batch, d_inner)
        window = torch.cat([state["conv"], x_in.unsqueeze(-1)], dim=-1)  # (batch, d_inner, d_conv)
        x_conv = (window * self.conv1d.weight[:, 0, :]).sum(-1)
        if self.conv1d.bias is not None:
            x_conv = x_conv + self.conv1d.bias
        x_conv = F.silu(x_conv)

        dt, B, C = self._split(x_conv)
        dt = F.softplus(self.dt_proj(dt))  # (batch, d_inner)
        A = -torch.exp(self.A_log.to(dt.dtype))  # (d_inner, d_state)
        h = state["fixed"]
        h = torch.exp(dt.unsqueeze(-1) * A) * h + (dt * x_conv).unsqueeze(-1) * B.unsqueeze(1)
        y = (h * C.unsqueeze(1)).sum(-1) + self.D.to(dt.dtype) * x_conv
        y = y * F.silu(z)
        return self.out_proj(y), {"fixed": h, "conv": window[..., 1:]}


class _NormWeight(nn.Module):
    """An RMSNorm's weight (ones), under the `.weight` name Jamba's JambaRMSNorm gives it."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
