"""Hyena operator (`H`).

Defaults: order 2, short filter 3, modal filter featurization with 16 states per
channel (MAD paper App. B.3.2, which takes the featurization from "Laughing
Hyena"); the implicit-MLP filter of the Hyena paper is `filter=hyena`, and the
other long-convolution families of the Hyena paper's comparison (App. A.1) are
`conv1d`, `fno`, `s4d`, `rational`, `ckconv` (see filters.py for each one's
parameters and state, and stdlib/primitives.yaml for the defaults of
filter_size, filter_modes, filter_length).

Layout (order N): `in_proj` dim -> (N+1)*dim (v, x_1..x_N), a depthwise causal
`short_conv` of `short_filter` taps on those (N+1)*dim channels, N-1 long
filters of dim channels each, gating by x_1..x_N, `out_proj` dim -> dim.
Linear layers and the short convolution carry a bias when `bias` is true.

State: the long filters' recurrent state (see filters.py): (N-1)*dim*filter_states
= 2048 at width 128 with the modal filter; filters without a finite state (fno,
ckconv, hyena) keep their past inputs instead, reported as kv_cache. The short convolution's buffer, (N+1)*dim*(short_filter-1),
is reported as conv_state.
FLOPs: MAD paper App. C.4.2 (projections 6LD^2, convs on projections 18LD,
featurization S L D, convolution and gates 10 L log2(L) D + 4LD, out layer 2LD^2),
generalised to order N: (N+1) projections, (N-1) FFT convolutions, N gates.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, log2, positive
from .filters import LongFilterPrimitive, filter_config, filter_cost, validate_filter


@dataclass(frozen=True)
class Hyena(LongFilterPrimitive):
    order: int

    name = "hyena"
    role = "sequence"
    module = "madsl.layers.hyena:Hyena"

    def validate(self) -> None:
        positive(self, "short_filter")
        if self.order < 2:
            raise ConfigError("order", f"hyena: order must be at least 2, got {self.order}",
                              "order 2 is the Hyena of the MAD paper")
        validate_filter(self)

    # channels that go through long filters
    @property
    def filter_channels(self) -> int:
        return (self.order - 1) * self.dim

    def _filter(self):
        return filter_cost(self.filter, self.filter_channels, **filter_config(self))

    def params(self) -> int:
        D, P = self.dim, (self.order + 1) * self.dim
        in_proj = D * P + (P if self.bias else 0)
        short_conv = P * self.short_filter + (P if self.bias else 0)
        out_proj = D * D + (D if self.bias else 0)
        return in_proj + short_conv + self._filter().params + out_proj

    def fixed_state(self) -> int:
        return self._filter().fixed_state

    def conv_state(self) -> int:
        return (self.order + 1) * self.dim * (self.short_filter - 1)

    def kv_cache(self, seq_len: int) -> int:
        return self._filter().dynamic_state(seq_len)

    def flops(self, seq_len: int) -> int:
        L, D, N = seq_len, self.dim, self.order
        projections = 2 * L * D * (N + 1) * D
        short_convs = 2 * self.short_filter * L * (N + 1) * D
        featurization = self._filter().featurization_flops(L)
        conv_and_gates = round(10 * L * log2(L) * D * (N - 1)) + 2 * L * D * N
        return projections + short_convs + featurization + conv_and_gates + 2 * L * D * D
