"""Long filters of the Hyena family as modules: `filter(L)` -> h of shape (channels, L).

Accounting (parameter counts, states): `madsl.primitives.filters`. Both filters
expose the same small interface to the layers that use them:

    forward(seq_len) -> h (channels, L)         the filter's taps, for the parallel form
    skip                                        per-channel skip ("D") term or None
    init_state(batch, device, dtype) -> dict    the filter's part of the layer state
    step(u_t (B, c), state part, channels) -> (y_t (B, c), new state part)

`channels` in `step` is a slice of the filter's channels: an order-N Hyena runs its
N-1 channel groups one after another, with a gate in between.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from madsl.kernels.fftconv import full_precision

_ALL = slice(None)


def _complex_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


class ModalFilter(nn.Module):
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
            return self._taps(seq_len)

    def _taps(self, seq_len: int) -> Tensor:
        # Split t = a*block + b: h[a*block + b] = Re(sum_n (R_n lambda_n^(a*block)) lambda_n^b), one
        # (A, 2N) @ (2N, block) real matmul per channel with block ~ sqrt(L). Never materialises the
        # (channels, N, L) Vandermonde tensor (at L = 16k that alone was ~1 GB with its autograd copies).
        block = math.isqrt(max(seq_len - 1, 0)) + 1  # ~ceil(sqrt(L))
        blocks = -(-seq_len // block)
        rate, angle = torch.exp(self.log_rate).unsqueeze(-1), self.angle.unsqueeze(-1)  # (C, N, 1)
        options = {"device": rate.device, "dtype": rate.dtype}
        coarse = torch.arange(blocks, **options) * block  # a*block
        fine = torch.arange(block, **options)  # b
        # R lambda^(a*block) as real and imaginary parts: (C, N, A)
        magnitude, phase = torch.exp(-rate * coarse), angle * coarse
        cos, sin = torch.cos(phase), torch.sin(phase)
        left_re = magnitude * (self.residue_real.unsqueeze(-1) * cos - self.residue_imag.unsqueeze(-1) * sin)
        left_im = magnitude * (self.residue_real.unsqueeze(-1) * sin + self.residue_imag.unsqueeze(-1) * cos)
        # lambda^b: (C, N, block)
        magnitude, phase = torch.exp(-rate * fine), angle * fine
        right_re, right_im = magnitude * torch.cos(phase), magnitude * torch.sin(phase)
        # Re(x y) = x_re y_re - x_im y_im, summed over the modes by the matmul
        left = torch.cat([left_re, -left_im], dim=1).transpose(1, 2)  # (C, A, 2N)
        right = torch.cat([right_re, right_im], dim=1)  # (C, 2N, block)
        return torch.bmm(left, right).flatten(1)[:, :seq_len]

    # ---- recurrent form ---------------------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        device = device if device is not None else self.log_rate.device
        dtype = dtype if dtype is not None else self.log_rate.dtype
        return {"fixed": torch.zeros(batch, self.channels, self.filter_states, device=device,
                                     dtype=_complex_dtype(dtype))}

    def step(self, u_t: Tensor, state: dict[str, Tensor], channels: slice = _ALL, taps: Tensor | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
        """u_t (B, c) for the channels selected by `channels`; state {"fixed": (B, c, filter_states)}.
        (`taps` is unused: the interface is shared with HyenaFilter.)"""
        x = torch.exp(self.log_poles()[channels]) * state["fixed"] + u_t.unsqueeze(-1)
        y = (x * self.residues()[channels]).real.sum(-1)
        return y.to(u_t.dtype), {"fixed": x}


class _Sin(nn.Module):
    """sin(freq * x) with one learned frequency per feature; one instance is shared by all
    activations of the implicit MLP (as in the Hyena code), so it counts `order` parameters once."""

    def __init__(self, features: int, frequency: float):
        super().__init__()
        self.freq = nn.Parameter(torch.full((features,), float(frequency)))

    def forward(self, x: Tensor) -> Tensor:
        return torch.sin(self.freq * x)


class HyenaFilter(nn.Module):
    """The implicit long filter of the Hyena paper (App. A; safari's `HyenaFilter`):

        z(t)    = [t_n, cos(f_b w), -sin(f_b w)]                    filter_emb_dim features
        h(t)    = window(t) * MLP(z(t))                             (channels,) per step t
        MLP     = Linear(emb, order), Sin, [Linear(order, order), Sin] x 2, Linear(order, channels, no bias)
        window  = exp(-t_n * |delta_c|)                             fixed, one decay per channel
        y       = h * u + skip * u                                  skip: per-channel bias ("D")

    with t_n = t / (reference_length - 1), w = 2*pi*t / reference_length and
    (filter_emb_dim - 1) / 2 bands f_b = linspace(1e-4, bands - 1). Time is normalised by
    a fixed `reference_length` (safari's `l_max`, there set to the training length), never
    by the length of the call, so that a tap does not depend on how long the sequence is
    and step mode agrees with the parallel form; past the reference length the features
    continue analytically (the decay window has brought the filter to ~1e-2 or less by
    then). Default 1024, the longest MAD sequence length.

    Parameters: the MLP, the shared sine frequencies (`order`) and `skip` (`channels`),
    exactly `madsl.primitives.filters.filter_cost`. The positional features and decay
    window are buffers computed on the fly, not parameters (safari trains the features
    with a tiny learning rate; here they are fixed).

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
                 reference_length: int = 1024, sine_frequency: float = 1.0,
                 fast_decay_pct: float = 0.3, slow_decay_pct: float = 1.5, decay_target: float = 1e-2):
        super().__init__()
        if filter_emb_dim < 3 or filter_emb_dim % 2 == 0:
            raise ValueError("filter_emb_dim must be odd and >= 3 (time plus sine/cosine pairs)")
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
            a = self.sin(self.mlp_in(z))
            for layer in self.mlp_hidden:
                a = self.sin(layer(a))
            h = self.mlp_out(a) * torch.exp(-t_norm * self.decay.to(weight.dtype))  # (L, channels)
        return h.transpose(0, 1)

    # ---- cached (inference) form ------------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        device = device if device is not None else self.skip.device
        dtype = dtype if dtype is not None else self.skip.dtype
        return {"fixed": torch.zeros(batch, 0, device=device, dtype=dtype),  # no recurrent state
                "cache": torch.zeros(batch, self.channels, 0, device=device, dtype=dtype)}

    def step(self, u_t: Tensor, state: dict[str, Tensor], channels: slice = _ALL,
             taps: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """u_t (B, c); state {"cache": (B, c, t)}; `taps` may pass forward(t + 1) computed once
        for all channel groups of a step. y_t = sum_s h[t - s] u_s + skip * u_t."""
        cache = torch.cat([state["cache"], u_t.unsqueeze(-1)], dim=-1)
        steps = cache.shape[-1]
        taps = self(steps) if taps is None else taps
        y = (cache * taps[channels, :steps].flip(-1)).sum(-1) + self.skip[channels] * u_t
        return y, {"fixed": state["fixed"], "cache": cache}


def build_filter(kind: str, channels: int, *, filter_states: int, filter_order: int,
                 filter_emb_dim: int) -> ModalFilter | HyenaFilter:
    """The filter module named by a layer's `filter` hyperparameter."""
    if kind == "modal":
        return ModalFilter(channels, filter_states)
    if kind == "hyena":
        return HyenaFilter(channels, filter_order, filter_emb_dim)
    raise ValueError(f"unknown filter {kind!r} (expected 'modal' or 'hyena')")
