"""Multi-head Hyena (`mH`).

Defaults: 16 heads (head dim = dim/heads = 8 at width 128), 2 filter states per
head, order 2, short filter 3 (MAD paper App. B.3.2; the multi-head form is from
"Laughing Hyena", Massaroli et al. 2023).

Layout: `in_proj` dim -> 3*dim/G (G = proj_groups, default 1), its output repeated G
times to 3*dim channels (q, k, v; the tied projection groups of Hyena, which the MAD
reference's multi-head Hyena inherits with G = 4), and a depthwise causal `short_conv`
as in Hyena. Per head, the outer product k_t (x) v_t (head_dim^2 channels) is convolved
with that head's long filter (one filter per head, shared by its head_dim^2
channels), then read out with q_t: y_t = q_t . (h * (k (x) v))_t. This is the
outer-product head trick of MAD paper §2.2, which raises the state from head_dim
to head_dim^2 per head without parameters. `out_proj` dim -> dim. `key_last`: k is the
last third of the projections and v the middle one, as the MAD reference's
MultiHeadHyenaOperator reads them (which matters with tied projections, proj_groups > 1).

State: heads * head_dim^2 * filter_states = 16*8*8*2 = 2048 at width 128 (modal
filter). Every filter family of filters.py works here, one filter per head: its
fixed or dynamic state per filter channel is multiplied by head_dim^2. Convolution
state: the last short_filter-1 outputs of in_proj, 3*dim/G*(short_filter-1).
FLOPs: MAD paper App. C.4.3 (projections 6LD^2, convs 18LD, featurization S L H,
convolution and gates 10 L log2(L) D^2/H + 4 L D^2/H, out layer 2LD^2).
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, divides, log2, positive
from .filters import LongFilterPrimitive, filter_config, filter_cost, validate_filter


@dataclass(frozen=True)
class MultiHeadHyena(LongFilterPrimitive):
    heads: int
    order: int
    proj_groups: int
    key_last: bool

    name = "multihead_hyena"
    role = "sequence"
    module = "madsl.layers.multihead_hyena:MultiHeadHyena"
    # added later: specs at their defaults keep their run identities
    identity_omits = ("proj_groups", "key_last", "filter_emb_learned")

    def validate(self) -> None:
        positive(self, "heads", "short_filter", "proj_groups")
        divides(self, "heads", self.heads, self.dim, "dim")
        divides(self, "proj_groups", self.proj_groups, 3 * self.dim, "3*dim")
        if self.order != 2:
            raise ConfigError("order", f"multihead_hyena: only order 2 (q, k, v) is defined, got {self.order}")
        validate_filter(self)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def proj_width(self) -> int:
        """Outputs of in_proj, before their repetition over the projection groups."""
        return 3 * self.dim // self.proj_groups

    def _filter(self):
        return filter_cost(self.filter, self.heads, **filter_config(self))

    def params(self) -> int:
        D, P, W = self.dim, self.proj_width, 3 * self.dim
        in_proj = D * P + (P if self.bias else 0)
        short_conv = W * self.short_filter + (W if self.bias else 0)
        out_proj = D * D + (D if self.bias else 0)
        return in_proj + short_conv + self._filter().params + out_proj

    def fixed_state(self) -> int:
        # every one of a head's head_dim^2 outer-product channels runs the head's filter
        return self._filter().fixed_state * self.head_dim * self.head_dim

    def conv_state(self) -> int:
        return self.proj_width * (self.short_filter - 1)

    def kv_cache(self, seq_len: int) -> int:
        return self._filter().dynamic_state(seq_len) * self.head_dim * self.head_dim

    def flops(self, seq_len: int) -> int:
        L, D = seq_len, self.dim
        projections = 2 * L * D * self.proj_width
        short_convs = 2 * self.short_filter * L * 3 * D
        return projections + short_convs + self.non_matmul_flops(L) + 2 * L * D * D

    def non_matmul_flops(self, seq_len: int) -> int:
        """Featurization, and the outer-product convolutions and gates of the heads."""
        L, D, H = seq_len, self.dim, self.heads
        featurization = self._filter().featurization_flops(L)
        conv_and_gates = round(10 * L * log2(L) * D * D / H) + 4 * L * D * D // H
        return featurization + conv_and_gates
