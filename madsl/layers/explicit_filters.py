"""The long filters whose parameters are the filter itself: `conv1d` (its taps, a FIR filter with
a finite state) and `fno` (its spectrum on the lowest frequencies, stepped with a cache of past
inputs).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from madsl.kernels.fftconv import full_precision
from madsl.layers.filter_base import (
    ALL_CHANNELS,
    FullPrecisionFilter,
    cached_step,
    device_and_dtype,
    empty_cache,
    fit_length,
    over_extra,
)


class Conv1dFilter(FullPrecisionFilter):
    """Explicit taps (the Hyena paper's "Conv1d" baseline, App. A.1: a regular depthwise
    convolution with a fixed filter size, 64 there): h[c, t] = weight[c, t] for t < filter_size,
    zero beyond. channels * filter_size parameters, no bias (the tap at t = 0 is the direct term).

    Init: nn.Conv1d's default for a depthwise kernel, U(-1/sqrt(filter_size), 1/sqrt(filter_size)).

    Step mode keeps the last filter_size - 1 inputs ("fixed", (B, c, filter_size - 1)): the
    finite state of a FIR filter, reported as fixed state (see madsl.primitives.filters).
    """

    skip: Tensor | None = None
    channel_keys = ("fixed",)

    def __init__(self, channels: int, filter_size: int):
        super().__init__()
        self.channels = channels
        self.filter_size = filter_size
        bound = 1 / math.sqrt(filter_size)
        self.weight = nn.Parameter(torch.empty(channels, filter_size).uniform_(-bound, bound))

    def forward(self, seq_len: int) -> Tensor:
        return fit_length(self.weight, seq_len)

    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        device, dtype = device_and_dtype(self.weight, device, dtype)
        return {"fixed": torch.zeros(batch, self.channels, *extra, self.filter_size - 1, device=device, dtype=dtype)}

    def step(
        self, u_t: Tensor, state: dict[str, Tensor], channels: slice = ALL_CHANNELS, taps: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """state {"fixed": (B, c, *extra, filter_size - 1)}, oldest input first."""
        window = torch.cat([state["fixed"], u_t.unsqueeze(-1)], dim=-1)
        y = (window * over_extra(self.weight[channels].flip(-1), u_t.dim() - 2)).sum(-1)
        return y, {"fixed": window[..., 1:]}


class FNOFilter(FullPrecisionFilter):
    """Explicit in the frequency domain (Fourier Neural Operator, Li et al. 2020; the Hyena
    paper's "FNO" baseline, App. A.1, 64 modes): per channel, complex weights W_m on the lowest
    `filter_modes` frequencies of a spectrum of resolution M = `filter_length`, zero elsewhere;
    the filter is that spectrum's impulse response, zero beyond M:

        h[c, t] = irfft_M(W[c])[t]  for t < M,   0 for t >= M

    FNO itself multiplies the input's FFT at the length of each call, which makes the filter
    depend on the sequence length and wrap around circularly; fixing the resolution gives a
    causal filter that is the same for every L (set M to the training length, as safari's
    l_max: then the filter spans the sequence). `irfft`'s normalisation makes W_m the filter's
    frequency response at frequency m/M, whatever M.

    Parameters: `weight_real`, `weight_imag` (channels, filter_modes): 2 * channels * filter_modes
    (the imaginary part of the DC weight has no effect, as in FNO). Init (FNO's SpectralConv1d
    with one input and one output channel): real and imaginary parts ~ U[0, 1).

    Step mode keeps past inputs ("cache"), at most M - 1 of them.
    """

    skip: Tensor | None = None
    channel_keys = ("cache",)

    def __init__(self, channels: int, filter_modes: int, filter_length: int):
        super().__init__()
        self.channels = channels
        self.filter_length = filter_length
        self.weight_real = nn.Parameter(torch.rand(channels, filter_modes))
        self.weight_imag = nn.Parameter(torch.rand(channels, filter_modes))

    def forward(self, seq_len: int) -> Tensor:
        with full_precision(self.weight_real):
            spectrum = torch.complex(self.weight_real, self.weight_imag)
            return fit_length(torch.fft.irfft(spectrum, n=self.filter_length), seq_len)  # zero-pads the spectrum

    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        return empty_cache(self.channels, batch, extra, *device_and_dtype(self.weight_real, device, dtype))

    def step(
        self, u_t: Tensor, state: dict[str, Tensor], channels: slice = ALL_CHANNELS, taps: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        taps = self(state["cache"].shape[-1] + 1) if taps is None else taps
        return cached_step(u_t, state, channels, taps, None, keep=self.filter_length - 1)
