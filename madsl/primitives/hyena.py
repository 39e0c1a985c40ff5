"""Hyena operator (`H`).

Defaults: order 2, short filter 3, modal filter featurization with 16 states per
channel (MAD paper App. B.3.2, which takes the featurization from "Laughing
Hyena"); the implicit-MLP filter of the Hyena paper is `filter=hyena`, and the
other long-convolution families of the Hyena paper's comparison (App. A.1) are
`conv1d`, `fno`, `s4d`, `rational`, `ckconv` (see filters.py for each one's
parameters and state, and stdlib/primitives.yaml for the defaults of
filter_size, filter_modes, filter_length).

Layout (order N, inner width I = inner_factor * dim): `in_proj` dim -> (N+1)*I/G
(G = proj_groups), its output repeated G times to (N+1)*I channels (v, x_1..x_N: the
"tied projection groups" of safari and the MAD reference, whose Hyena config has
inner_factor 4 and proj_groups 4), a depthwise causal `short_conv` of `short_filter`
taps on those (N+1)*I channels (its own taps per channel, repeated or not), N-1 long
filters of I channels each, gating by x_1..x_N, `out_proj` I -> dim. Linear layers and
the short convolution carry a bias when `bias` is true. Defaults I = dim, G = 1.

State: the long filters' recurrent state (see filters.py): (N-1)*I*filter_states
= 2048 at width 128 with the modal filter; filters without a finite state (fno,
ckconv, hyena) keep their past inputs instead, reported as kv_cache. The short
convolution's buffer is the last short_filter-1 outputs of in_proj, before the
repetition (repeated channels hold the same values): (N+1)*I/G*(short_filter-1),
reported as conv_state.
FLOPs: MAD paper App. C.4.2 (projections 6LD^2, convs on projections 18LD,
featurization S L D, convolution and gates 10 L log2(L) D + 4LD, out layer 2LD^2),
generalised to order N, inner width I and G projection groups: a projection to
(N+1)I/G, (N+1)I short-conv channels, (N-1) FFT convolutions and N gates of I
channels, out layer 2LID.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, divides, log2, positive
from .filters import LongFilterPrimitive, filter_config, filter_cost, validate_filter


@dataclass(frozen=True)
class Hyena(LongFilterPrimitive):
    order: int
    inner_factor: int
    proj_groups: int

    name = "hyena"
    role = "sequence"
    module = "madsl.layers.hyena:Hyena"
    # added later: specs at their defaults keep their run identities
    identity_omits = ("inner_factor", "proj_groups", "filter_emb_learned")

    def validate(self) -> None:
        positive(self, "short_filter", "inner_factor", "proj_groups")
        if self.order < 2:
            raise ConfigError(
                "order", f"hyena: order must be at least 2, got {self.order}", "order 2 is the Hyena of the MAD paper"
            )
        divides(self, "proj_groups", self.proj_groups, self.width, "(order+1)*inner_factor*dim")
        validate_filter(self)

    @property
    def inner(self) -> int:
        """Width of each of v, x_1..x_N and of each group of the long filters."""
        return self.inner_factor * self.dim

    @property
    def width(self) -> int:
        """Channels of the short convolution: v, x_1..x_N."""
        return (self.order + 1) * self.inner

    @property
    def proj_width(self) -> int:
        """Outputs of in_proj, before their repetition over the projection groups."""
        return self.width // self.proj_groups

    # channels that go through long filters
    @property
    def filter_channels(self) -> int:
        return (self.order - 1) * self.inner

    def _filter(self):
        return filter_cost(self.filter, self.filter_channels, **filter_config(self))

    def params(self) -> int:
        D, inner, P, W = self.dim, self.inner, self.proj_width, self.width
        in_proj = D * P + (P if self.bias else 0)
        short_conv = W * self.short_filter + (W if self.bias else 0)
        out_proj = inner * D + (D if self.bias else 0)
        return in_proj + short_conv + self._filter().params + out_proj

    def fixed_state(self) -> int:
        return self._filter().fixed_state

    def conv_state(self) -> int:
        return self.proj_width * (self.short_filter - 1)

    def kv_cache(self, seq_len: int) -> int:
        return self._filter().dynamic_state(seq_len)

    def flops(self, seq_len: int) -> int:
        L, D, inner = seq_len, self.dim, self.inner
        projections = 2 * L * D * self.proj_width
        short_convs = 2 * self.short_filter * L * self.width
        return projections + short_convs + self.non_matmul_flops(L) + 2 * L * inner * D

    def non_matmul_flops(self, seq_len: int) -> int:
        """Featurization, the N-1 FFT convolutions and the N gates."""
        L, inner, N = seq_len, self.inner, self.order
        featurization = self._filter().featurization_flops(L)
        conv_and_gates = round(10 * L * log2(L) * inner * (N - 1)) + 2 * L * inner * N
        return featurization + conv_and_gates
