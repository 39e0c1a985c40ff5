"""What every long filter of madsl.layers.filters shares: the base class that keeps a filter in
full precision when the model is cast to half, and the helpers of the step (inference) form: a
per-channel tensor broadcast over a state's extra dims, the cached step of the filters without a
finite state, and the defaults of `init_state`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ALL_CHANNELS = slice(None)  # `step`'s default `channels`: every channel of the filter
_HALF = (torch.float16, torch.bfloat16)


class FullPrecisionFilter(nn.Module):
    """A filter's parameters and buffers stay float32 (float64) when the model is cast
    to half precision (`model.to(torch.bfloat16)`, `.half()`): filter generation and the
    FFT convolution run in full precision (complex bf16 does not exist), and the layers
    cast the filter's output to the input's dtype. Device moves apply as usual."""

    def _apply(self, fn, recurse=True):
        def keep_full_precision(t: Tensor) -> Tensor:
            out = fn(t)
            if out.dtype in _HALF and t.dtype not in _HALF:
                return t.to(device=out.device)
            return out

        return super()._apply(keep_full_precision, recurse)


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """The complex dtype of a state-space filter's state for real inputs of `dtype`."""
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def over_extra(p: Tensor, extra: int) -> Tensor:
    """A per-channel tensor (c, ...) shaped (c, 1 x extra, ...) to broadcast over a state (B, c, *extra, ...)."""
    return p.reshape(p.shape[0], *([1] * extra), *p.shape[1:])


def device_and_dtype(reference: Tensor, device, dtype) -> tuple[torch.device, torch.dtype]:
    """`init_state`'s device and dtype: those asked for, else those of the filter's `reference` parameter."""
    return (device if device is not None else reference.device, dtype if dtype is not None else reference.dtype)


def fit_length(h: Tensor, seq_len: int) -> Tensor:
    """(..., K) cut or zero-padded to (..., seq_len) along the last axis."""
    return h[..., :seq_len] if h.shape[-1] >= seq_len else F.pad(h, (0, seq_len - h.shape[-1]))


def cached_step(
    u_t: Tensor, state: dict[str, Tensor], channels: slice, taps: Tensor, skip: Tensor | None, keep: int | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Step of a filter without finite state: append u_t to the cache of past inputs and convolve
    it with the first taps; keep at most `keep` past inputs (a filter of keep + 1 taps)."""
    extra = u_t.dim() - 2
    cache = torch.cat([state["cache"], u_t.unsqueeze(-1)], dim=-1)
    steps = cache.shape[-1]
    y = (cache * over_extra(taps[channels, :steps].flip(-1), extra)).sum(-1)
    if skip is not None:
        y = y + over_extra(skip[channels], extra) * u_t
    if keep is not None:
        cache = cache[..., max(steps - keep, 0) :]
    return y, {"fixed": state["fixed"], "cache": cache}


def empty_cache(channels: int, batch: int, extra: tuple[int, ...], device, dtype) -> dict[str, Tensor]:
    """The state of a filter without finite state before the first step: no past inputs."""
    return {
        "fixed": torch.zeros(batch, 0, device=device, dtype=dtype),  # no recurrent state
        "cache": torch.zeros(batch, channels, *extra, 0, device=device, dtype=dtype),
    }
