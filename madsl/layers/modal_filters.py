"""The long filters that are sums of damped complex exponentials, h[t] = Re(sum_n R_n lambda_n^t):
`modal` (parametrized directly by discrete poles and residues) and `s4d` (S4D's continuous-time
A, dt, C and a skip). Both are diagonal linear recurrences: step mode keeps a finite complex state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from madsl.kernels.fftconv import full_precision
from madsl.layers.filter_base import ALL_CHANNELS, FullPrecisionFilter, complex_dtype, device_and_dtype, over_extra


def _damped_mode_taps(rate: Tensor, angle: Tensor, residue_real: Tensor, residue_imag: Tensor, seq_len: int) -> Tensor:
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
            return _damped_mode_taps(
                torch.exp(self.log_rate), self.angle, self.residue_real, self.residue_imag, seq_len
            )

    # ---- recurrent form ---------------------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        device, dtype = device_and_dtype(self.log_rate, device, dtype)
        return {
            "fixed": torch.zeros(
                batch, self.channels, *extra, self.filter_states, device=device, dtype=complex_dtype(dtype)
            )
        }

    def step(
        self, u_t: Tensor, state: dict[str, Tensor], channels: slice = ALL_CHANNELS, taps: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """u_t (B, c, *extra) for the channels selected by `channels`; state {"fixed": (B, c, *extra,
        filter_states)}. (`taps` is unused: the interface is shared with the cached filters.)"""
        extra = u_t.dim() - 2
        x = over_extra(torch.exp(self.log_poles()[channels]), extra) * state["fixed"] + u_t.unsqueeze(-1)
        y = (x * over_extra(self.residues()[channels], extra)).real.sum(-1)
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
        device, dtype = device_and_dtype(self.log_dt, device, dtype)
        return {
            "fixed": torch.zeros(
                batch, self.channels, *extra, self.filter_states, device=device, dtype=complex_dtype(dtype)
            )
        }

    def step(
        self, u_t: Tensor, state: dict[str, Tensor], channels: slice = ALL_CHANNELS, taps: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        extra = u_t.dim() - 2
        rate, angle, residue = self._discrete()
        pole = torch.exp(torch.complex(-rate, angle))
        x = over_extra(pole[channels], extra) * state["fixed"] + u_t.unsqueeze(-1)
        y = (x * over_extra(residue[channels], extra)).real.sum(-1).to(u_t.dtype)
        return y + over_extra(self.skip[channels], extra) * u_t, {"fixed": x}
