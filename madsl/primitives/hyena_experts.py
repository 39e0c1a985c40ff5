"""Hyena experts (`He`): a Hyena operator whose channels are split into experts,
of which a router picks `active` per token.

Defaults: 8 experts of width 16, 2 active; all other settings shared with Hyena
(MAD paper App. B.3.2 and App. C.4.8).

Layout: `router` dim -> experts (a bias where `router_bias`); `in_proj` dim -> 3*dim,
`short_conv` and long filters as in an order-2 Hyena whose dim = experts * expert_width
channels are grouped into experts (`expert_layout`: `blocked`, expert e owns channels
e*expert_width .. (e+1)*expert_width - 1; `interleaved`, expert e owns channels j*experts + e,
j < expert_width, as the MAD reference's reshape (..., expert_width, experts) gives them);
each expert's gated output (expert_width wide) is weighted by the router (softmax over the
token's top-k logits, the others get exactly zero) and the weighted sum goes through
`out_proj` expert_width -> dim. `leaky_routing` is the MAD reference's routing instead: the
logits outside the top k are set to 0 and the softmax runs over all experts, so every
expert keeps some weight (and is computed: the FLOPs count all experts as active).
The reference's `hyena-experts.yml` also has a router bias and the implicit filter
(`filter: hyena`, filter_order 16, learned positional features).

The layout is no relabelling where the filter treats channels differently by their index:
the implicit filter's (`filter: hyena`) decay window is a fixed ladder over the channels,
from the slowest decay at channel 0 to the fastest at the last, so `blocked` gives expert 0
the slowest band of decays and expert 7 the fastest, and `interleaved` gives every expert
the whole range (the reference's He). For the filters whose channels are initialised alike
(the modal filter's random steps, the paper's He) the two are the same layer up to a
relabelling of the channels; the accounting is the same for both.

State: all experts' filter states, since which experts are active depends on
the input: experts * expert_width * filter_states = 2048 at width 128 (modal
filter; any filter family of filters.py works, over dim channels as in Hyena).
Active parameters (what one token's output reads): the router, `out_proj`, the long filter's
shared part (the implicit filters' MLP trunk) and, of `in_proj`, `short_conv` and the long
filter, the channels of the experts the token weights (`active` of them; all under leaky
routing): an unweighted expert's channels reach the output only through its weight, 0.
FLOPs: App. C.4.8 (router L D A, projections 6LD^2, convs 18LD, featurization
S L D_moh G, convolution and gates 10 L log2(L) D_moh G + 4 L D_moh G, out 2 L D_moh D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .base import ConfigError, log2, positive
from .filters import LongFilterPrimitive, filter_config, filter_cost, validate_filter


@dataclass(frozen=True)
class HyenaExperts(LongFilterPrimitive):
    experts: int
    expert_width: int
    active: int
    router_bias: bool
    leaky_routing: bool
    expert_layout: Literal["blocked", "interleaved"]

    name = "hyena_experts"
    role = "sequence"
    module = "madsl.layers.hyena_experts:HyenaExperts"
    # added later: specs at their defaults keep their run identities
    identity_omits = ("router_bias", "leaky_routing", "filter_emb_learned", "expert_layout")

    def validate(self) -> None:
        positive(self, "experts", "expert_width", "active", "short_filter")
        validate_filter(self)
        if self.active > self.experts:
            raise ConfigError("active", f"hyena_experts: active={self.active} exceeds experts={self.experts}")
        if self.experts * self.expert_width != self.dim:
            raise ConfigError(
                "expert_width",
                f"hyena_experts: experts*expert_width = {self.experts * self.expert_width} must equal dim = {self.dim}",
                f"with {self.experts} experts use expert_width={self.dim // self.experts}"
                if self.dim % self.experts == 0
                else None,
            )

    def _filter(self):
        return filter_cost(self.filter, self.dim, **filter_config(self))

    @property
    def weighted_experts(self) -> int:
        """Experts whose output a token's sum reads: all of them under leaky routing."""
        return self.experts if self.leaky_routing else self.active

    def params(self) -> int:
        D, P, W = self.dim, 3 * self.dim, self.expert_width
        router = D * self.experts + (self.experts if self.router_bias else 0)
        in_proj = D * P + (P if self.bias else 0)
        short_conv = P * self.short_filter + (P if self.bias else 0)
        out_proj = W * D + (D if self.bias else 0)
        return router + in_proj + short_conv + self._filter().params + out_proj

    def active_params(self) -> int:
        unread = (self.experts - self.weighted_experts) * self.expert_width  # channels of unweighted experts
        per_channel_proj = 3 * (self.dim + self.short_filter + (2 if self.bias else 0))  # in_proj and short_conv
        filter_unread = (
            self._filter().params - filter_cost(self.filter, self.dim - unread, **filter_config(self)).params
        )
        return self.params() - unread * per_channel_proj - filter_unread

    def fixed_state(self) -> int:
        return self._filter().fixed_state

    def conv_state(self) -> int:
        return 3 * self.dim * (self.short_filter - 1)

    def kv_cache(self, seq_len: int) -> int:
        return self._filter().dynamic_state(seq_len)

    def flops(self, seq_len: int) -> int:
        L, D, W = seq_len, self.dim, self.expert_width
        return (
            L * D * self.experts
            + 6 * L * D * D
            + 2 * self.short_filter * L * 3 * D
            + self.non_matmul_flops(L)
            + 2 * L * W * D
        )

    def non_matmul_flops(self, seq_len: int) -> int:
        """Featurization, convolutions and gates of the weighted experts."""
        L, W, G = seq_len, self.expert_width, self.weighted_experts
        # the active experts' share of the featurization (App. C.4.8: S L D_moh G)
        featurization = self._filter().featurization_flops(L) * G // self.experts
        return featurization + round(10 * L * log2(L) * W * G) + 4 * L * W * G
