"""The `rational` long filter: a rational transfer function per channel (Hyena's TransferFunc,
RTF), its taps by FFT (state-free) and its step by the recurrence that realises it exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.fftconv import full_precision
from madsl.layers.filter_base import ALL_CHANNELS, FullPrecisionFilter, device_and_dtype, over_extra


class RationalFilter(FullPrecisionFilter):
    """A rational transfer function of order n per channel (the Hyena paper's TransferFunc,
    App. A.1; RTF, Parnichkun et al. 2024, "State-Free Inference of State-Space Models: The
    Transfer Function Approach"):

        H(z) = h0 + b(z) / a(z),   a(z) = 1 + a_1 z^-1 + ... + a_n z^-n,   b(z) = b_1 z^-1 + ... + b_n z^-n

    Parameters per channel: the numerator b (`numerator`, n), the denominator through its n
    reflection coefficients (`reflection`), and h0 (`skip`, 1): channels * (2n + 1).

    Taps (RTF's state-free parallel form): b and a are evaluated by FFT at the M-th roots of
    unity, M = `filter_length` (RTF's truncation length; set it to the training length),
    and h = irfft_M(b / a)[:L]. On the roots of unity z^-M = 1, so this kernel is the
    impulse response of b/a aliased with period M; RTF's insight is that it is *exactly*
    the first M taps of another system of order n with the same poles: the one with
    numerator c = b (I - A^M)^-1 in the companion realisation (A the companion matrix of
    a), and a direct term h0 + k[0]. That system defines the filter at every length: RTF
    stops at M, here the taps of block j (t in [jM, (j+1)M)) are the same FFT ratio with
    numerator b A^(jM) (one matrix power A^M per channel, only when L > M), so sequences
    may outgrow M (length extrapolation) and still agree with the step form.

    Step mode runs that realisation (direct form II), so it agrees with the parallel form:
    the state is the last n values of w = u / a, n real numbers per channel,
        y_t = sum_i c_i w_{t-i} + (h0 + k[0]) u_t,   w_t = u_t - sum_i a_i w_{t-i}.
    (c and k[0] are recomputed in float64 at every step: A^M by repeated squaring and one
    n x n solve per channel; fine for checking and short generation, cache them for more.)

    The denominator is a(z) = step-up(tanh(reflection)) (the Levinson recursion from
    reflection coefficients k_m = tanh(.) in (-1, 1)), so all roots of a lie inside the unit
    circle for every value of the parameters: stable by construction, so that A^M is bounded
    and the recurrent form exists at any M. RTF trains the coefficients a_i directly, which
    its parallel form tolerates (the FFT ratio stays finite for an unstable a) but its
    recurrent form does not.

    Init (RTF's default, "zeros"): a = 1 (every pole at the origin) and b = 0, so the filter
    starts as the skip h0 ~ N(0, 1) alone. The reflection coefficients are marked
    `_no_weight_decay` (state-space parameters, as S4/Mamba).
    """

    channel_keys = ("fixed",)

    def __init__(self, channels: int, filter_states: int, filter_length: int):
        super().__init__()
        self.channels = channels
        self.filter_states = filter_states
        self.filter_length = filter_length
        self.reflection = nn.Parameter(torch.zeros(channels, filter_states))
        self.numerator = nn.Parameter(torch.zeros(channels, filter_states))
        self.skip = nn.Parameter(torch.randn(channels))
        self.reflection._no_weight_decay = True

    def denominator(self) -> Tensor:
        """a (channels, n + 1), a[:, 0] = 1, from the reflection coefficients (Levinson step-up)."""
        k = torch.tanh(self.reflection)
        a = torch.ones_like(k[:, :1])
        for m in range(self.filter_states):
            padded = F.pad(a, (0, 1))
            a = padded + k[:, m : m + 1] * padded.flip(-1)
        return a

    def _companion(self, a: Tensor) -> Tensor:
        """The companion matrix A (channels, n, n) of a: x_next = A x + e_0 u, with the state
        x = (w_{t-1}, ..., w_{t-n}) (w_t on top, the older values shifted down)."""
        n = self.filter_states
        companion = torch.zeros(self.channels, n, n, dtype=a.dtype, device=a.device)
        companion[:, 0] = -a[:, 1:]
        companion[:, 1:, :-1] = torch.eye(n - 1, dtype=a.dtype, device=a.device)
        return companion

    def forward(self, seq_len: int) -> Tensor:
        length = self.filter_length
        with full_precision(self.numerator):
            a = self.denominator()
            numerators = self.numerator.unsqueeze(0)  # (blocks, channels, n)
            blocks = -(-seq_len // length)
            if blocks > 1:  # past the truncation length: numerators b A^(jM) give the later blocks
                power = torch.linalg.matrix_power(self._companion(a.double()), length).to(a.dtype)
                rows = [self.numerator]
                for _ in range(blocks - 1):
                    rows.append((rows[-1].unsqueeze(-2) @ power).squeeze(-2))
                numerators = torch.stack(rows)
            spectrum = torch.fft.rfft(F.pad(numerators, (1, 0)), n=length) / torch.fft.rfft(a, n=length)
            kernels = torch.fft.irfft(spectrum, n=length)  # (blocks, channels, M)
            # block j >= 1 starts with the tap at jM, which is block j-1's aliased tap 0 (see realisation)
            later = [torch.cat([kernels[j - 1, :, :1], kernels[j, :, 1:]], dim=-1) for j in range(1, blocks)]
            return torch.cat([kernels[0], *later], dim=-1)[:, :seq_len]

    def realisation(self) -> tuple[Tensor, Tensor, Tensor]:
        """(a_1..a_n, c, direct term) in float64, (channels, n), (channels, n), (channels,): the
        recurrence whose impulse response is exactly this filter's taps."""
        a = self.denominator().double()
        companion = self._companion(a)
        before_last = torch.linalg.matrix_power(companion, self.filter_length - 1)
        identity = torch.eye(self.filter_states, dtype=torch.float64, device=a.device)
        # c (I - A^M) = b: the aliased kernel of b is the exact impulse response of c
        c = torch.linalg.solve(
            (identity - before_last @ companion).transpose(-1, -2), self.numerator.double().unsqueeze(-1)
        ).squeeze(-1)
        # the aliased kernel's tap 0 is sum_{j>=1} h_b[jM] = c A^(M-1) e_0 (= the realisation's
        # tap at M): part of the direct term
        direct = self.skip.double() + (c.unsqueeze(-2) @ before_last)[:, 0, 0]
        return a[:, 1:], c, direct

    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        device, dtype = device_and_dtype(self.numerator, device, dtype)
        return {"fixed": torch.zeros(batch, self.channels, *extra, self.filter_states, device=device, dtype=dtype)}

    def step(
        self, u_t: Tensor, state: dict[str, Tensor], channels: slice = ALL_CHANNELS, taps: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """state {"fixed": (B, c, *extra, n)} = (w_{t-1}, ..., w_{t-n})."""
        extra = u_t.dim() - 2
        a, c, direct = (part[channels].to(u_t.dtype) for part in self.realisation())
        past = state["fixed"]
        y = (past * over_extra(c, extra)).sum(-1) + over_extra(direct, extra) * u_t
        w = u_t - (past * over_extra(a, extra)).sum(-1)
        return y, {"fixed": torch.cat([w.unsqueeze(-1), past[..., :-1]], dim=-1)}
