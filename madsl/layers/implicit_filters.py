"""The implicit long filters: an MLP of the time coordinate gives the taps. `ckconv` (CKConv's
SIREN of the time alone) and `hyena` (the Hyena paper's filter: positional features, sine
activations and a decay window). Neither has a finite state: step mode keeps every past input.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from madsl.kernels.fftconv import full_precision
from madsl.layers.filter_base import ALL_CHANNELS, FullPrecisionFilter, cached_step, device_and_dtype, empty_cache


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
        return empty_cache(self.channels, batch, extra, *device_and_dtype(self.mlp_in.weight, device, dtype))

    def step(
        self, u_t: Tensor, state: dict[str, Tensor], channels: slice = ALL_CHANNELS, taps: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        taps = self(state["cache"].shape[-1] + 1) if taps is None else taps
        return cached_step(u_t, state, channels, taps, None)


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

    def __init__(
        self,
        channels: int,
        filter_order: int,
        filter_emb_dim: int,
        reference_length: int = 1024,
        learned_features: bool = False,
        sine_frequency: float = 1.0,
        fast_decay_pct: float = 0.3,
        slow_decay_pct: float = 1.5,
        decay_target: float = 1e-2,
    ):
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
        self.features_table = nn.Parameter(self.features(reference_length)[0]) if learned_features else None
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
                z = torch.cat([self.features_table[:seq_len].to(z.dtype), z[self.reference_length :]])
            a = self.sin(self.mlp_in(z))
            for layer in self.mlp_hidden:
                a = self.sin(layer(a))
            h = self.mlp_out(a) * torch.exp(-t_norm * self.decay.to(weight.dtype))  # (L, channels)
        return h.transpose(0, 1)

    # ---- cached (inference) form ------------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None, extra: tuple[int, ...] = ()) -> dict[str, Tensor]:
        return empty_cache(self.channels, batch, extra, *device_and_dtype(self.skip, device, dtype))

    def step(
        self, u_t: Tensor, state: dict[str, Tensor], channels: slice = ALL_CHANNELS, taps: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """u_t (B, c, *extra); state {"cache": (B, c, *extra, t)}; `taps` may pass forward(t + 1)
        computed once for all channel groups of a step. y_t = sum_s h[t - s] u_s + skip * u_t."""
        taps = self(state["cache"].shape[-1] + 1) if taps is None else taps
        return cached_step(u_t, state, channels, taps, self.skip)
