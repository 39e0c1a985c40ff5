"""Causal long convolutions for the Hyena family.

    y[..., t] = sum_{s=0}^{t} h[..., s] * u[..., t - s]  (+ skip * u[..., t])

`u` is (..., L) with time last; `h` has the same trailing channel dims as `u` (size-1
dims broadcast) and at least L taps (it is cut to L); `skip`, the per-channel "D"
term of the Hyena paper, has the shape of `h` without its time axis.

Three ways to compute it, all differentiable:

- `fft_causal_conv`: zero-pad to 2L, rfft, multiply, irfft, keep the first L
  outputs: O(L log L). Padding with `F.pad` first and then taking a plain rfft is ~3x
  faster on the CPU than asking rfft for n=2L (which pads through a slow path).
- `toeplitz_causal_conv`: one (L, L) lower-triangular Toeplitz matrix per channel and
  a batched matmul: O(L^2), but at matmul speed, so on the CPU it beats the FFT for
  short sequences (measured on 2 EPYC cores, 16k channels: ~2-3x faster forward +
  backward at L=128, even at L=256, far slower at L=1024).
- `direct_causal_conv`: a loop over lags; the reference for tests.

`causal_conv(..., method="auto")` picks Toeplitz for L <= TOEPLITZ_MAX_LEN, FFT
beyond. Half-precision inputs are computed in float32 with autocast off (the MAD paper
keeps Hyena's convolutions in full precision) and cast back; float64 stays float64.

`short_causal_conv` is the few-tap depthwise convolution on the projections.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels.precision import compute_dtype

ConvMethod = Literal["auto", "fft", "toeplitz", "direct"]

# Longest sequence for which "auto" uses the Toeplitz matmul instead of the FFT.
TOEPLITZ_MAX_LEN = 128


def full_precision(t: Tensor) -> torch.autocast:
    """Context that switches autocast off on t's device: the long convolutions and the filters
    stay in float32 under a bf16 autocast (bmm would otherwise run in bf16)."""
    return torch.autocast(device_type=t.device.type, enabled=False)


def _prepare(u: Tensor, h: Tensor, skip: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None, int]:
    seq_len = u.shape[-1]
    if h.shape[-1] < seq_len:
        raise ValueError(f"filter has {h.shape[-1]} taps, the input {seq_len} steps")
    dtype = compute_dtype(u.dtype)
    u = u.to(dtype)
    h = h[..., :seq_len].to(dtype)
    skip = skip.to(dtype) if skip is not None else None
    return u, h, skip, seq_len


def _add_skip(y: Tensor, u: Tensor, skip: Tensor | None) -> Tensor:
    return y if skip is None else y + u * skip.unsqueeze(-1)


def fft_causal_conv(u: Tensor, h: Tensor, skip: Tensor | None = None) -> Tensor:
    """Causal convolution by FFT of size 2L (no circular wrap-around for the first L outputs)."""
    out_dtype = u.dtype
    with full_precision(u):
        u, h, skip, seq_len = _prepare(u, h, skip)
        u_f = torch.fft.rfft(F.pad(u, (0, seq_len)))
        h_f = torch.fft.rfft(F.pad(h, (0, seq_len)))
        y = torch.fft.irfft(u_f * h_f, n=2 * seq_len)[..., :seq_len]
        return _add_skip(y, u, skip).to(out_dtype)


def toeplitz_matrix(h: Tensor, seq_len: int | None = None) -> Tensor:
    """(..., L) filter -> (..., L, L) lower-triangular T with T[t, s] = h[t - s] (zero for s > t)."""
    seq_len = h.shape[-1] if seq_len is None else seq_len
    h = h[..., :seq_len]
    # windows of the left-padded filter read h[t + j - (L - 1)]; flipping j gives h[t - s]
    return F.pad(h, (seq_len - 1, 0)).unfold(-1, seq_len, 1).flip(-1)


def toeplitz_causal_conv(u: Tensor, h: Tensor, skip: Tensor | None = None) -> Tensor:
    """Causal convolution as a batched matmul with one Toeplitz matrix per channel."""
    out_dtype = u.dtype
    with full_precision(u):
        u, h, skip, seq_len = _prepare(u, h, skip)
        channel_shape = u.shape[u.dim() - h.dim() : -1]  # the dims of u that h's channel dims address
        h = h.expand(*channel_shape, seq_len).reshape(-1, seq_len)  # (C, L)
        channels = h.shape[0]
        # (C, N, L) @ (C, L, L)^T: the channel is the matmul batch, everything else its rows. One explicit
        # copy to that layout: given a channels-last input, bmm would otherwise clone matrix by matrix.
        u_rows = u.reshape(-1, channels, seq_len).transpose(0, 1).contiguous()
        y = torch.bmm(u_rows, toeplitz_matrix(h).transpose(1, 2))
        y = y.transpose(0, 1).reshape(u.shape)
        return _add_skip(y, u, skip).to(out_dtype)


def direct_causal_conv(u: Tensor, h: Tensor, skip: Tensor | None = None) -> Tensor:
    """Reference: y[t] = sum over lags k <= t of h[k] u[t - k], one vectorised step per lag."""
    out_dtype = u.dtype
    u, h, skip, seq_len = _prepare(u, h, skip)
    y = torch.zeros_like(u * h[..., :1])
    for lag in range(seq_len):
        y[..., lag:] += h[..., lag : lag + 1] * u[..., : seq_len - lag]
    return _add_skip(y, u, skip).to(out_dtype)


def causal_conv(u: Tensor, h: Tensor, skip: Tensor | None = None, method: ConvMethod = "auto") -> Tensor:
    """Dispatch: Toeplitz matmul for short sequences, FFT for long ones (see module docstring)."""
    if method == "auto":
        method = "toeplitz" if u.shape[-1] <= TOEPLITZ_MAX_LEN else "fft"
    if method == "fft":
        return fft_causal_conv(u, h, skip)
    if method == "toeplitz":
        return toeplitz_causal_conv(u, h, skip)
    if method == "direct":
        return direct_causal_conv(u, h, skip)
    raise ValueError(f"unknown convolution method {method!r}")


def short_causal_conv(z: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Depthwise causal convolution with a few taps, for the projections of the Hyena family.

    z (B, L, C) as a linear layer leaves it; weight (C, 1, K) and bias (C,) of an
    nn.Conv1d(C, C, K, groups=C); returns (B, C, L), out[:, c, t] = bias[c] +
    sum_k weight[c, 0, k] * z[:, t - (K - 1) + k, c] (zero before the start).

    Runs as a depthwise conv2d on the channels-last view (B, C, 1, L) of z, left-padded
    in time so that the output is exactly L long: no transposed copy of z and no slice
    of the output (whose backward would scatter into a zero-filled buffer). On the CPU
    this is ~2x faster forward + backward than nn.Conv1d on z.transpose(1, 2) with
    symmetric padding. The result is a channels-last (B, C, L) view.
    """
    taps = weight.shape[-1]
    padded = F.pad(z, (0, 0, taps - 1, 0))  # (B, K-1+L, C): zeros before the start
    y = F.conv2d(padded.unsqueeze(1).permute(0, 3, 1, 2), weight.unsqueeze(2), bias, groups=weight.shape[0])
    return y.squeeze(2)
