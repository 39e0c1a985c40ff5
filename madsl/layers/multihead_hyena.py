"""Multi-head Hyena (`mH`): the torch module of `madsl.primitives.multihead_hyena`.

Layout (Laughing Hyena's multi-head Hyena; the MAD reference's `MultiHeadHyenaOperator`):

    q, k, v = split(short_conv(in_proj(u)))          dim -> 3*dim (in_proj: 3*dim/G, repeated G = proj_groups
                                                     times), depthwise causal conv; heads x head_dim each
                                                     (key_last: q, v, k, the MAD reference's order)
    S_t     = sum_{s<=t} h[t-s] k_s (x) v_s          per head: head_dim^2 outer-product channels, one filter per head
    y_t     = q_t . S_t                              y_t[j] = sum_i q_t[i] S_t[i, j]
    out     = out_proj(y)

With the implicit filter the per-head skip term adds skip * k_t (x) v_t to S_t.

Two exact ways to compute it (`conv_method`, "auto" picks by length, see
madsl.kernels.fftconv.TOEPLITZ_MAX_LEN):
- "toeplitz" (quadratic): y = ((Q K^T) * T_h) V per head, T_h the Toeplitz matrix of the
  head's filter: O(L^2 head_dim) in matmuls, the fast choice on the CPU for short sequences
  (measured at B=128, L=128: ~2.5x faster than the FFT form), never materialises the outer product.
- "fft": materialise k (x) v as (B, heads, head_dim, head_dim, L), one rfft/irfft of size
  2L over all of it (the filter's spectrum broadcast over the head's head_dim^2
  channels), read out with q: O(L log L), for long sequences.

Init as Hyena (safari): nn.Linear / nn.Conv1d defaults; the filter documents its own.

State for `step`: "conv" (B, 3*dim/G, short_filter-1), the last in_proj outputs, and the filter's state over its
heads, each with the head's head_dim x head_dim outer-product channels
(madsl.layers.filters, `extra` dims): modal: "fixed" complex
(B, heads, head_dim, head_dim, filter_states) = 16*8*8*2 = 2048 numbers at width 128;
hyena: "fixed" empty and "cache" (B, heads, head_dim, head_dim, t), the past outer
products (the accounting's kv_cache); the other families alike.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from madsl.kernels.fftconv import (
    TOEPLITZ_MAX_LEN,
    ConvMethod,
    fft_causal_conv,
    full_precision,
    short_causal_conv,
    toeplitz_matrix,
)
from madsl.layers.filters import build_filter
from madsl.primitives.filters import filter_config
from madsl.primitives.multihead_hyena import MultiHeadHyena as MultiHeadHyenaPrimitive


class MultiHeadHyena(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: MultiHeadHyenaPrimitive):
        super().__init__()
        dim, bias = p.dim, p.bias
        self.dim = dim
        self.heads = p.heads
        self.head_dim = p.head_dim
        self.proj_groups = p.proj_groups
        self.key_last = p.key_last
        self.short_filter = p.short_filter
        self.conv_method: ConvMethod = "auto"
        width = (p.order + 1) * dim  # q, k, v: the primitive admits order 2 only
        self.in_proj = nn.Linear(dim, p.proj_width, bias=bias)
        # holds the depthwise weights; applied causally by short_causal_conv (and by hand in step)
        self.short_conv = nn.Conv1d(width, width, p.short_filter, groups=width, bias=bias)
        self.long_filter = build_filter(p.filter, p.heads, **filter_config(p))
        self.out_proj = nn.Linear(dim, dim, bias=bias)

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, u: Tensor) -> Tensor:
        batch, seq_len, _ = u.shape
        z = short_causal_conv(self._project(u), self.short_conv.weight, self.short_conv.bias)  # (B, 3*dim, L)
        q, k, v = self._qkv(z.split(self.dim, dim=1), (batch, self.heads, self.head_dim, seq_len))
        taps = self.long_filter(seq_len)  # (heads, L)
        skip = self.long_filter.skip  # (heads,) or None
        method = self.conv_method
        if method == "auto":
            method = "toeplitz" if seq_len <= TOEPLITZ_MAX_LEN else "fft"
        if method == "toeplitz":
            y = self._mix_quadratic(q, k, v, taps, skip)
        elif method == "fft":
            y = self._mix_fft(q, k, v, taps, skip)
        else:
            raise ValueError(f"unknown convolution method {method!r}")
        return self.out_proj(y.reshape(batch, self.dim, seq_len).transpose(1, 2))

    def _qkv(self, thirds: tuple[Tensor, ...], shape: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v from the three thirds of the short-convolved projections."""
        q, k, v = (part.reshape(shape) for part in thirds)
        return (q, v, k) if self.key_last else (q, k, v)

    def _project(self, u: Tensor) -> Tensor:
        """in_proj's outputs repeated over the projection groups (along the last axis)."""
        p = self.in_proj(u)
        return p.repeat(*([1] * (p.dim() - 1)), self.proj_groups) if self.proj_groups > 1 else p

    @staticmethod
    def _mix_quadratic(q: Tensor, k: Tensor, v: Tensor, taps: Tensor, skip: Tensor | None) -> Tensor:
        """q, k, v (B, heads, head_dim, L) -> y (B, heads, head_dim, L) via ((Q K^T) * T_h) V."""
        out_dtype = q.dtype
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        with full_precision(q):
            q, k, v, taps = q.to(dtype), k.to(dtype), v.to(dtype), taps.to(dtype)
            mask = toeplitz_matrix(taps)  # (heads, L, L): h[t - s] on and below the diagonal
            if skip is not None:
                mask = mask + torch.diag_embed(skip.to(dtype).unsqueeze(-1).expand_as(taps))
            scores = q.transpose(-1, -2) @ k  # (B, heads, L, L): q_t . k_s
            return ((scores * mask) @ v.transpose(-1, -2)).transpose(-1, -2).to(out_dtype)

    @staticmethod
    def _mix_fft(q: Tensor, k: Tensor, v: Tensor, taps: Tensor, skip: Tensor | None) -> Tensor:
        """The same by FFT over the materialised outer products (B, heads, head_dim, head_dim, L)."""
        kv = k.unsqueeze(3) * v.unsqueeze(2)  # [..., i, j, t] = k_t[i] v_t[j]
        state = fft_causal_conv(kv, taps[:, None, None, :], None if skip is None else skip[:, None, None])
        return (q.unsqueeze(3) * state).sum(2)  # sum over i

    # ---- recurrent (inference) form ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        device = device if device is not None else self.in_proj.weight.device
        dtype = dtype if dtype is not None else self.in_proj.weight.dtype
        # every head's filter runs over the head's head_dim x head_dim outer-product channels
        state = self.long_filter.init_state(batch, device, dtype, extra=(self.head_dim, self.head_dim))
        state["conv"] = torch.zeros(batch, self.in_proj.out_features, self.short_filter - 1, device=device, dtype=dtype)
        return state

    def step(self, u_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        batch = u_t.shape[0]
        window = torch.cat([state["conv"], self.in_proj(u_t).unsqueeze(-1)], dim=-1)  # (B, 3*dim/G, short_filter)
        repeated = window.repeat(1, self.proj_groups, 1) if self.proj_groups > 1 else window
        z = (repeated * self.short_conv.weight.squeeze(1)).sum(-1)
        if self.short_conv.bias is not None:
            z = z + self.short_conv.bias
        q, k, v = self._qkv(z.split(self.dim, dim=-1), (batch, self.heads, self.head_dim))
        kv = k.unsqueeze(-1) * v.unsqueeze(-2)  # (B, heads, head_dim, head_dim)

        filter_state = {key: value for key, value in state.items() if key != "conv"}
        mixed, new_state = self.long_filter.step(kv, filter_state)  # (B, heads, head_dim, head_dim)
        y = (q.unsqueeze(-1) * mixed).sum(-2)  # (B, heads, head_dim)
        new_state["conv"] = window[..., 1:]
        return self.out_proj(y.reshape(batch, self.dim)), new_state
