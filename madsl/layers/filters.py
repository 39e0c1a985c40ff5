"""Long filters of the Hyena family as modules: `filter(L)` -> h of shape (channels, L).

Accounting (parameter counts, states) and the choice of each family's state:
`madsl.primitives.filters`. Every filter exposes the same small interface to the
layers that use them (Hyena, multi-head Hyena, Hyena experts):

    forward(seq_len) -> h (channels, L)           the filter's taps, for the parallel form
    skip                                          per-channel skip ("D") term or None
    channel_keys                                  state entries whose axis 1 is the filter channel
    init_state(batch, device, dtype, extra=())    the filter's part of the layer state
    step(u_t (B, c, *extra), state part, channels, taps=None) -> (y_t, new state part)

`channels` in `step` is a slice of the filter's channels: an order-N Hyena runs its
N-1 channel groups one after another, with a gate in between. `extra` are trailing
dims that share a channel's filter (multi-head Hyena: the head_dim x head_dim outer
product of a head); the state then has shape (B, c, *extra, ...).

Step mode holds either a finite state ("fixed": modal, s4d, rational, conv1d) or the
past filter inputs ("cache": fno, ckconv, hyena; `taps` may pass forward(t + 1)
computed once for all channel groups of a step). Every state dict has a "fixed"
entry (empty, shape (B, 0), for the cached filters).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.fftconv import full_precision

_ALL = slice(None)


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


def _complex_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def _over(p: Tensor, extra: int) -> Tensor:
    """A per-channel tensor (c, ...) shaped (c, 1 x extra, ...) to broadcast over a state (B, c, *extra, ...)."""
    return p.reshape(p.shape[0], *([1] * extra), *p.shape[1:])


def _defaults(reference: Tensor, device, dtype) -> tuple[torch.device, torch.dtype]:
    return (device if device is not None else reference.device,
            dtype if dtype is not None else reference.dtype)


def _fit(h: Tensor, seq_len: int) -> Tensor:
    """(..., K) cut or zero-padded to (..., seq_len) along the last axis."""
    return h[..., :seq_len] if h.shape[-1] >= seq_len else F.pad(h, (0, seq_len - h.shape[-1]))


def _damped_mode_taps(rate: Tensor, angle: Tensor, residue_real: Tensor, residue_imag: Tensor,
                      seq_len: int) -> Tensor:
    """h[c, t] = Re(sum_n R[c, n] * lambda[c, n]^t) with lambda = exp(-rate + i*angle), for t < seq_len.

    Split t = a*block + b: h[a*block + b] = Re(sum_n (R_n lambda_n^(a*block)) lambda_n^b), one
    (A, 2N) @ (2N, block) real matmul per channel with block ~ sqrt(L). Never materialises the
    (channels, N, L) Vandermonde tensor (at L = 16k that alone was ~1 GB with its autograd copies)."""
    block = math.isqrt(max(seq_len - 1, 0)) + 1  # ~ceil(sqrt(L))
    blocks = -(-seq_len // block)
    rate, angle = rate.unsqueeze(-1), angle.unsqueeze(-1)  # (C, N, 1)
    options = {"device": rate.device, "dtype": rate.dtype}
    coarse = torch.arange(blocks, **options) * block  # a*block
    fine = torch.arange(block, **options)  # b
    # R lambda^(a*block) as real and imaginary parts: (C, N, A)
    magnitude, phase = torch.exp(-rate * coarse), angle * coarse
    cos, sin = torch.cos(phase), torch.sin(phase)
    left_re = magnitude * (residue_real.unsqueeze(-1) * cos - residue_imag.unsqueeze(-1) * sin)
    left_im = magnitude * (residue_real.unsqueeze(-1) * sin + residue_imag.unsqueeze(-1) * cos)
    # lambda^b: (C, N, block)
    magnitude, phase = torch.exp(-rate * fine), angle * fine
    right_re, right_im = magnitude * torch.cos(phase), magnitude * torch.sin(phase)
    # Re(x y) = x_re y_re - x_im y_im, summed over the modes by the matmul
    left = torch.cat([left_re, -left_im], dim=1).transpose(1, 2)  # (C, A, 2N)
    right = torch.cat([right_re, right_im], dim=1)  # (C, 2N, block)
    return torch.bmm(left, right).flatten(1)[:, :seq_len]


def _cached_step(u_t: Tensor, state: dict[str, Tensor], channels: slice, taps: Tensor,
                 skip: Tensor | None, keep: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Step of a filter without finite state: append u_t to the cache of past inputs and convolve
    it with the first taps; keep at most `keep` past inputs (a filter of keep + 1 taps)."""
    extra = u_t.dim() - 2
    cache = torch.cat([state["cache"], u_t.unsqueeze(-1)], dim=-1)
    steps = cache.shape[-1]
    y = (cache * _over(taps[channels, :steps].flip(-1), extra)).sum(-1)
    if skip is not None:
        y = y + _over(skip[channels], extra) * u_t
    if keep is not None:
        cache = cache[..., max(steps - keep, 0):]
    return y, {"fixed": state["fixed"], "cache": cache}


def _empty_cache(channels: int, batch: int, extra: tuple[int, ...], device, dtype) -> dict[str, Tensor]:
    return {"fixed": torch.zeros(batch, 0, device=device, dtype=dtype),  # no recurrent state
            "cache": torch.zeros(batch, channels, *extra, 0, device=device, dtype=dtype)}


# ---- state-space filters (finite state) -----------------------------------------------------------

class ModalFilter(FullPrecisionFilter):
    """Sum of damped complex exponentials per channel ("modal" form of Laughing Hyena):

        h[c, t] = Re( sum_n R[c, n] * lambda[c, n] ** t ),   t = 0, 1, ...

    Each mode is four real parameters: `log_rate` and `angle` give the pole,
    lambda = exp(-exp(log_rate) + i*angle), so |lambda| = exp(-exp(log_rate)) < 1 for
    every value of the parameter (stable by construction); `residue_real`,
    `residue_imag` give R. 4 * channels * filter_states parameters.

    It is a diagonal linear recurrence, so step mode keeps a finite complex state:
        x_t = lambda * x_{t-1} + u_t   (B, channels, filter_states),   y_t = Re(sum_n R_n x_{t,n}).

    Init (S4D-Lin, Gu et al. 2022; Laughing Hyena obtains its modal filters by
    distillation and gives no from-scratch init, and the MAD reference code's
    rational filter starts from zero): per channel a step dt ~ log-uniform in
    [1e-3, 1e-1], poles lambda_n = exp(dt * A_n) with A_n = -1/2 + i*pi*n, residues the
    zero-order-hold discretisation of C_n with B = 1, R_n = 2 C_n (lambda_n - 1) / A_n,
    C_n ~ CN(0, 1). The time constants 1/(dt/2) thus span 20 to 2000 steps across
    channels and each channel holds a ladder of frequencies pi*n*dt, so at init the
    filters decay over a range of time scales from a few tens of tokens to far beyond
    the MAD sequence lengths; the short convolution of the layer covers the shortest ones.
    All four parameters are marked `_no_weight_decay` (decay would pull every pole
    towards |lambda| = 1/e), as S4/Mamba do for their state-space parameters.
    """

    skip: Tensor | None = None  # the modal form has no direct term (accounting: 4 numbers per mode)
    channel_keys = ("fixed",)  # state entries whose axis 1 is the filter channel

    def __init__(self, channels: int, filter_states: int, dt_min: float = 1e-3, dt_max: float = 1e-1):
        super().__init__()
        self.channels = channels
        self.filter_states = filter_states
        dt = torch.exp(torch.rand(channels, 1) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        modes = torch.arange(filter_states, dtype=torch.float32)
        a = torch.complex(torch.full((filter_states,), -0.5), math.pi * modes)  # continuous-time poles
        c = torch.randn(channels, filter_states, dtype=torch.complex64)
        pole = torch.exp(dt * a)
        residue = 2 * c * (pole - 1) / a
        self.log_rate = nn.Parameter(torch.log(0.5 * dt).expand(channels, filter_states).clone())
        self.angle = nn.Parameter((math.pi * modes * dt).clone())
        self.residue_real = nn.Parameter(residue.real.clone())
        self.residue_imag = nn.Parameter(residue.imag.clone())
        for parameter in self.parameters():
            parameter._no_weight_decay = True

    def log_poles(self) -> Tensor:
        """log(lambda) as (channels, filter_states) complex: -rate + i*angle."""
        return torch.complex(-torch.exp(self.log_rate), self.angle)

    def residues(self) -> Tensor:
        return torch.complex(self.residue_real, self.residue_imag)

    def forward(self, seq_len: int) -> Tensor:
        with full_precision(self.log_rate):
            return _damped_mode_taps(torch.exp(self.log_rate), self.angle, self.residue_real,
                                     self.residue_imag, seq_len)

    # ---- recurrent form ---------------------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        device, dtype = _defaults(self.log_rate, device, dtype)
        return {"fixed": torch.zeros(batch, self.channels, *extra, self.filter_states, device=device,
                                     dtype=_complex_dtype(dtype))}

    def step(self, u_t: Tensor, state: dict[str, Tensor], channels: slice = _ALL, taps: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """u_t (B, c, *extra) for the channels selected by `channels`; state {"fixed": (B, c, *extra,
        filter_states)}. (`taps` is unused: the interface is shared with the cached filters.)"""
        extra = u_t.dim() - 2
        x = _over(torch.exp(self.log_poles()[channels]), extra) * state["fixed"] + u_t.unsqueeze(-1)
        y = (x * _over(self.residues()[channels], extra)).real.sum(-1)
        return y.to(u_t.dtype), {"fixed": x}


class S4DFilter(FullPrecisionFilter):
    """The diagonal state-space kernel of S4D (Gu et al. 2022, "On the Parameterization and
    Initialization of Diagonal State Space Models"), the long filter of H3 (Dao et al. 2022):

        x'(s) = A x(s) + B u(s),  y = 2 Re(C x) + D u        per channel, A diagonal with n complex modes
        zero-order hold with step dt:  lambda_n = exp(dt A_n),  B folded into C (B = 1)
        h[t] = Re( sum_n R_n lambda_n^t ),  R_n = 2 C_n (lambda_n - 1) / A_n

    Parameters per channel: `log_dt` (1), per mode `log_a_real` (A_n = -exp(log_a_real) +
    i a_imag, so Re A < 0: stable for every value), `a_imag`, `c_real`, `c_imag`; and the
    skip D (`skip`, 1): channels * (4 n + 2), n = filter_states complex modes. S4D counts
    its state size N in reals of conjugate pairs: N = 64 (H3, Hyena App. A) is n = 32.

    Versus `modal`: the same recurrence, but parametrized in continuous time (A, dt, C) with
    S4D's discretisation and a skip term, instead of directly by discrete poles and residues.

    Init (S4D-Lin, as the S4D paper's standalone `S4DKernel`): log dt ~ U[log 1e-3, log 1e-1]
    per channel, A_n = -1/2 + i pi n, C ~ CN(0, 1), D ~ N(0, 1). A and dt are marked
    `_no_weight_decay` (S4/S4D train them with weight decay 0).

    Step mode: x_t = lambda * x_{t-1} + u_t (complex, (B, c, n)), y_t = Re(sum R x_t) + D u_t.
    """

    channel_keys = ("fixed",)

    def __init__(self, channels: int, filter_states: int, dt_min: float = 1e-3, dt_max: float = 1e-1):
        super().__init__()
        self.channels = channels
        self.filter_states = filter_states
        self.log_dt = nn.Parameter(torch.rand(channels) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.log_a_real = nn.Parameter(torch.full((channels, filter_states), math.log(0.5)))
        self.a_imag = nn.Parameter(math.pi * torch.arange(filter_states, dtype=torch.float32).repeat(channels, 1))
        c = torch.randn(channels, filter_states, dtype=torch.complex64)
        self.c_real = nn.Parameter(c.real.clone())
        self.c_imag = nn.Parameter(c.imag.clone())
        self.skip = nn.Parameter(torch.randn(channels))
        for parameter in (self.log_dt, self.log_a_real, self.a_imag):
            parameter._no_weight_decay = True

    def _discrete(self) -> tuple[Tensor, Tensor, Tensor]:
        """(decay rate, angle) of the discrete poles and the residues R (complex), (channels, n) each."""
        dt = torch.exp(self.log_dt).unsqueeze(-1)
        a = torch.complex(-torch.exp(self.log_a_real), self.a_imag)
        pole = torch.exp(a * dt)
        residue = 2 * torch.complex(self.c_real, self.c_imag) * (pole - 1) / a
        return dt * torch.exp(self.log_a_real), dt * self.a_imag, residue

    def forward(self, seq_len: int) -> Tensor:
        with full_precision(self.log_dt):
            rate, angle, residue = self._discrete()
            return _damped_mode_taps(rate, angle, residue.real, residue.imag, seq_len)

    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        device, dtype = _defaults(self.log_dt, device, dtype)
        return {"fixed": torch.zeros(batch, self.channels, *extra, self.filter_states, device=device,
                                     dtype=_complex_dtype(dtype))}

    def step(self, u_t: Tensor, state: dict[str, Tensor], channels: slice = _ALL, taps: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        extra = u_t.dim() - 2
        rate, angle, residue = self._discrete()
        pole = torch.exp(torch.complex(-rate, angle))
        x = _over(pole[channels], extra) * state["fixed"] + u_t.unsqueeze(-1)
        y = (x * _over(residue[channels], extra)).real.sum(-1).to(u_t.dtype)
        return y + _over(self.skip[channels], extra) * u_t, {"fixed": x}


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
            a = padded + k[:, m:m + 1] * padded.flip(-1)
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
        c = torch.linalg.solve((identity - before_last @ companion).transpose(-1, -2),
                               self.numerator.double().unsqueeze(-1)).squeeze(-1)
        # the aliased kernel's tap 0 is sum_{j>=1} h_b[jM] = c A^(M-1) e_0 (= the realisation's
        # tap at M): part of the direct term
        direct = self.skip.double() + (c.unsqueeze(-2) @ before_last)[:, 0, 0]
        return a[:, 1:], c, direct

    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        device, dtype = _defaults(self.numerator, device, dtype)
        return {"fixed": torch.zeros(batch, self.channels, *extra, self.filter_states, device=device, dtype=dtype)}

    def step(self, u_t: Tensor, state: dict[str, Tensor], channels: slice = _ALL, taps: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """state {"fixed": (B, c, *extra, n)} = (w_{t-1}, ..., w_{t-n})."""
        extra = u_t.dim() - 2
        a, c, direct = (part[channels].to(u_t.dtype) for part in self.realisation())
        past = state["fixed"]
        y = (past * _over(c, extra)).sum(-1) + _over(direct, extra) * u_t
        w = u_t - (past * _over(a, extra)).sum(-1)
        return y, {"fixed": torch.cat([w.unsqueeze(-1), past[..., :-1]], dim=-1)}


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
        return _fit(self.weight, seq_len)

    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        device, dtype = _defaults(self.weight, device, dtype)
        return {"fixed": torch.zeros(batch, self.channels, *extra, self.filter_size - 1, device=device, dtype=dtype)}

    def step(self, u_t: Tensor, state: dict[str, Tensor], channels: slice = _ALL, taps: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """state {"fixed": (B, c, *extra, filter_size - 1)}, oldest input first."""
        window = torch.cat([state["fixed"], u_t.unsqueeze(-1)], dim=-1)
        y = (window * _over(self.weight[channels].flip(-1), u_t.dim() - 2)).sum(-1)
        return y, {"fixed": window[..., 1:]}


# ---- filters without finite state (cached) --------------------------------------------------------

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
            return _fit(torch.fft.irfft(spectrum, n=self.filter_length), seq_len)  # zero-pads the spectrum

    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        return _empty_cache(self.channels, batch, extra, *_defaults(self.weight_real, device, dtype))

    def step(self, u_t: Tensor, state: dict[str, Tensor], channels: slice = _ALL,
             taps: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        taps = self(state["cache"].shape[-1] + 1) if taps is None else taps
        return _cached_step(u_t, state, channels, taps, None, keep=self.filter_length - 1)


class _Sin(nn.Module):
    """sin(freq * x) with one learned frequency per feature; one instance is shared by all
    activations of the implicit MLP (as in the Hyena code), so it counts `order` parameters once."""

    def __init__(self, features: int, frequency: float):
        super().__init__()
        self.freq = nn.Parameter(torch.full((features,), float(frequency)))

    def forward(self, x: Tensor) -> Tensor:
        return torch.sin(self.freq * x)


class CKConvFilter(FullPrecisionFilter):
    """Continuous kernel convolution (Romero et al. 2021, "CKConv"; the Hyena paper's CKConv
    baseline, App. A.1): the filter is an MLP of the time coordinate alone, with SIREN sine
    activations (Sitzmann et al. 2020), no positional features, no window, no skip:

        t_n   = 2 t / (filter_length - 1) - 1          CKConv's relative positions in [-1, 1]
        h(t)  = Linear(w, channels)(sin(w0 Linear(w, w)(sin(w0 Linear(w, w)(sin(w0 Linear(1, w)(t_n)))))))

    Same depth and width as the Hyena filter's MLP (Hyena App. A.1: "CKConv and Hyena use the
    same size of FFNs"), biases everywhere (SIREN's layers). Time is normalised by a fixed
    `filter_length`, not by the call's length, so taps do not depend on L (past it, t_n
    continues beyond 1).

    Init (SIREN): w0 = 30; first layer weights U(-1, 1) (1 input), later layers
    U(-sqrt(6/w)/w0, sqrt(6/w)/w0); biases nn.Linear's default. `_no_weight_decay` on all,
    as the Hyena filter (safari trains its filters without weight decay).

    No finite state: step mode keeps every past input ("cache").
    """

    skip: Tensor | None = None
    channel_keys = ("cache",)

    def __init__(self, channels: int, filter_order: int, filter_length: int, omega_0: float = 30.0):
        super().__init__()
        self.channels = channels
        self.filter_length = filter_length
        self.omega_0 = omega_0
        self.mlp_in = nn.Linear(1, filter_order)
        self.mlp_hidden = nn.ModuleList([nn.Linear(filter_order, filter_order) for _ in range(2)])
        self.mlp_out = nn.Linear(filter_order, channels)
        with torch.no_grad():
            self.mlp_in.weight.uniform_(-1.0, 1.0)
            bound = math.sqrt(6 / filter_order) / omega_0
            for layer in (*self.mlp_hidden, self.mlp_out):
                layer.weight.uniform_(-bound, bound)
        for parameter in self.parameters():
            parameter._no_weight_decay = True

    def forward(self, seq_len: int) -> Tensor:
        weight = self.mlp_in.weight
        with full_precision(weight):
            t = torch.arange(seq_len, device=weight.device, dtype=weight.dtype).unsqueeze(-1)
            a = torch.sin(self.omega_0 * self.mlp_in(2 * t / (self.filter_length - 1) - 1))
            for layer in self.mlp_hidden:
                a = torch.sin(self.omega_0 * layer(a))
            return self.mlp_out(a).transpose(0, 1)

    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        return _empty_cache(self.channels, batch, extra, *_defaults(self.mlp_in.weight, device, dtype))

    def step(self, u_t: Tensor, state: dict[str, Tensor], channels: slice = _ALL,
             taps: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        taps = self(state["cache"].shape[-1] + 1) if taps is None else taps
        return _cached_step(u_t, state, channels, taps, None)


class HyenaFilter(FullPrecisionFilter):
    """The implicit long filter of the Hyena paper (App. A; safari's `HyenaFilter`):

        z(t)    = [t_n, cos(f_b w), -sin(f_b w)]                    filter_emb_dim features
        h(t)    = window(t) * MLP(z(t))                             (channels,) per step t
        MLP     = Linear(emb, order), Sin, [Linear(order, order), Sin] x 2, Linear(order, channels, no bias)
        window  = exp(-t_n * |delta_c|)                             fixed, one decay per channel
        y       = h * u + skip * u                                  skip: per-channel bias ("D")

    with t_n = t / (reference_length - 1), w = 2*pi*t / reference_length and
    (filter_emb_dim - 1) / 2 bands f_b = linspace(1e-4, bands - 1). Time is normalised by
    a fixed `reference_length` (safari's `l_max`, there set to the training length; the
    primitive's `filter_length`), never by the length of the call, so that a tap does not
    depend on how long the sequence is and step mode agrees with the parallel form; past
    the reference length the features continue analytically (the decay window has brought
    the filter to ~1e-2 or less by then). Default 1024, the longest MAD sequence length;
    `filter_length: seq_len` builds it for the length the model is built for, as the MAD
    reference builds its filter with `max_length` = the task setting's length (its time
    t = linspace(0, 1, max_length) is this t_n, its features this z).

    Parameters: the MLP, the shared sine frequencies (`order`) and `skip` (`channels`),
    exactly `madsl.primitives.filters.filter_cost`. The decay window is computed on the fly.
    The positional features too, unless `learned_features`: then the features of the first
    `reference_length` positions are a parameter `features_table` (reference_length, filter_emb_dim),
    initialised to the fixed ones, as the MAD reference's (and safari's) PositionalEmbedding
    registers them; past the reference length the fixed features continue.

    Init (safari / MAD reference defaults): nn.Linear's default init for the MLP, sine
    frequency 1 (`sine_frequency`; the Hyena paper's language models used 14), `skip`
    ~ N(0, 1), decays |delta| spaced linearly over channels so that the window falls to
    1e-2 between 0.3 and 1.5 reference lengths. All parameters are marked
    `_no_weight_decay`, as safari trains this filter with weight decay 0.

    No finite state: step mode keeps every past input of the filter ("cache",
    (B, channels, t) after t tokens: the accounting's kv_cache) and convolves it with
    the first t taps.
    """

    channel_keys = ("cache",)  # state entries whose axis 1 is the filter channel

    def __init__(self, channels: int, filter_order: int, filter_emb_dim: int,
                 reference_length: int = 1024, learned_features: bool = False, sine_frequency: float = 1.0,
                 fast_decay_pct: float = 0.3, slow_decay_pct: float = 1.5, decay_target: float = 1e-2):
        super().__init__()
        self.channels = channels
        self.filter_emb_dim = filter_emb_dim
        self.reference_length = reference_length
        self.sin = _Sin(filter_order, sine_frequency)
        self.mlp_in = nn.Linear(filter_emb_dim, filter_order)
        self.mlp_hidden = nn.ModuleList([nn.Linear(filter_order, filter_order) for _ in range(2)])
        self.mlp_out = nn.Linear(filter_order, channels, bias=False)
        self.skip = nn.Parameter(torch.randn(channels))
        slowest, fastest = math.log(decay_target) / slow_decay_pct, math.log(decay_target) / fast_decay_pct
        self.register_buffer("decay", torch.linspace(slowest, fastest, channels).abs(), persistent=False)
        self.features_table = (nn.Parameter(self.features(reference_length)[0]) if learned_features else None)
        for parameter in self.parameters():  # safari trains the implicit filter without weight decay
            parameter._no_weight_decay = True

    def features(self, seq_len: int, device=None, dtype=None) -> tuple[Tensor, Tensor]:
        """Positional features z (L, filter_emb_dim) and normalised time t_n (L, 1)."""
        steps = torch.arange(seq_len, device=device, dtype=dtype).unsqueeze(-1)
        t_norm = steps / (self.reference_length - 1)
        bands = (self.filter_emb_dim - 1) // 2
        freqs = torch.linspace(1e-4, bands - 1, bands, device=device, dtype=dtype)
        angle = freqs * (2 * math.pi / self.reference_length) * steps
        return torch.cat([t_norm, torch.cos(angle), -torch.sin(angle)], dim=-1), t_norm

    def forward(self, seq_len: int) -> Tensor:
        weight = self.mlp_in.weight
        with full_precision(weight):
            z, t_norm = self.features(seq_len, weight.device, weight.dtype)
            if self.features_table is not None:  # learned for the first reference_length positions
                z = torch.cat([self.features_table[:seq_len].to(z.dtype), z[self.reference_length:]])
            a = self.sin(self.mlp_in(z))
            for layer in self.mlp_hidden:
                a = self.sin(layer(a))
            h = self.mlp_out(a) * torch.exp(-t_norm * self.decay.to(weight.dtype))  # (L, channels)
        return h.transpose(0, 1)

    # ---- cached (inference) form ------------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        return _empty_cache(self.channels, batch, extra, *_defaults(self.skip, device, dtype))

    def step(self, u_t: Tensor, state: dict[str, Tensor], channels: slice = _ALL,
             taps: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """u_t (B, c, *extra); state {"cache": (B, c, *extra, t)}; `taps` may pass forward(t + 1)
        computed once for all channel groups of a step. y_t = sum_s h[t - s] u_s + skip * u_t."""
        taps = self(state["cache"].shape[-1] + 1) if taps is None else taps
        return _cached_step(u_t, state, channels, taps, self.skip)


LongFilter = ModalFilter | S4DFilter | RationalFilter | Conv1dFilter | FNOFilter | CKConvFilter | HyenaFilter


# The module of each filter family, from the filter's channel count and the layer's filter
# sizes (`madsl.primitives.filters.FILTER_OPTIONS`, validated there by `validate_filter`).
FILTER_MODULES: dict[str, Callable[..., nn.Module]] = {
    "modal": lambda channels, sizes: ModalFilter(channels, sizes["filter_states"]),
    "s4d": lambda channels, sizes: S4DFilter(channels, sizes["filter_states"]),
    "rational": lambda channels, sizes: RationalFilter(channels, sizes["filter_states"], sizes["filter_length"]),
    "conv1d": lambda channels, sizes: Conv1dFilter(channels, sizes["filter_size"]),
    "fno": lambda channels, sizes: FNOFilter(channels, sizes["filter_modes"], sizes["filter_length"]),
    "ckconv": lambda channels, sizes: CKConvFilter(channels, sizes["filter_order"], sizes["filter_length"]),
    "hyena": lambda channels, sizes: HyenaFilter(channels, sizes["filter_order"], sizes["filter_emb_dim"],
                                                 reference_length=sizes["filter_length"],
                                                 learned_features=sizes["filter_emb_learned"]),
}


def build_filter(kind: str, channels: int, **sizes: int) -> nn.Module:
    """The filter module named by a layer's `filter` hyperparameter (the kinds of
    madsl.primitives.filters.FILTERS) with `channels` channels; `sizes` are the layer's
    filter hyperparameters (each kind reads the ones it uses)."""
    return FILTER_MODULES[kind](channels, sizes)
