"""Linear attention (`Lin`: one head; `mLin`: 16 heads; Katharopoulos et al. 2020).

Per head, with a feature map phi applied to q and k:

    S_t = S_{t-1} + phi(k_t) v_t^T,   z_t = z_{t-1} + phi(k_t),   o_t = S_t^T phi(q_t) / (z_t . phi(q_t) + eps)

(normalize: false drops the denominator). Layout and defaults of the MAD reference's
`LinearAttention` (athms/mad-lab mad/model/layers/attention_linear.py, configs/layers/
linear-attention.yml and mh-linear-attention.yml): proj_q, proj_k dim -> expand_k * dim; proj_v
dim -> expand_v * dim; out_proj -> dim; no bias; feature map `elementwise_product` (the
"Hadamard" map: phi(x) = W1 x * W2 x, two Linear(head_dim, head_dim) with bias, separate for q
and k, shared by the heads). Other feature maps: elu (elu + 1), relu, identity (no parameters).
normalize: false by default, as flash-linear-attention's LinearAttention (do_feature_map_norm);
the MAD reference always normalises (eps 1e-12), which is `normalize: true`: with the Hadamard
map phi(q) . sum phi(k) has no sign and crosses zero, and that setting fails madsl's copy-task
learning test (loss 0.84 ln V after 150 steps, against 0.58 unnormalised).

Parameters: D (2 expand_k D + expand_v D) + expand_v D D, plus 4 (K^2 + K) for the Hadamard maps
(K = key dim per head).
State: heads * key_dim * value_dim, plus the normaliser z (heads * key_dim) when normalize
(1 * 128 * 128 = 16384 for `Lin`, 16 * 8 * 8 = 1024 for `mLin` at width 128; normalised, 16512 and 1152).
FLOPs (recurrent form): projections 2LD(2 eK D + eV D), feature maps 8LHK^2 (Hadamard),
state update and readout 4LHK(V + 1), out 2L eV D D.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .base import Primitive, divides, positive

FeatureMap = Literal["elementwise_product", "elu", "relu", "identity"]


@dataclass(frozen=True)
class LinearAttention(Primitive):
    heads: int
    expand_k: int
    expand_v: int
    feature_map: FeatureMap
    normalize: bool

    name = "linear_attention"
    role = "sequence"
    module = "madsl.layers.linear_attention:LinearAttention"

    def validate(self) -> None:
        positive(self, "heads", "expand_k", "expand_v")
        divides(self, "heads", self.heads, self.expand_k * self.dim, "expand_k * dim")
        divides(self, "heads", self.heads, self.expand_v * self.dim, "expand_v * dim")

    @property
    def key_dim(self) -> int:
        return self.expand_k * self.dim // self.heads

    @property
    def value_dim(self) -> int:
        return self.expand_v * self.dim // self.heads

    @property
    def state_columns(self) -> int:
        """Columns of each head's state: the values, and the normaliser as one more."""
        return self.value_dim + (1 if self.normalize else 0)

    def params(self) -> int:
        D, K = self.dim, self.key_dim
        feature = 4 * (K * K + K) if self.feature_map == "elementwise_product" else 0
        return D * (2 * self.expand_k * D + self.expand_v * D) + self.expand_v * D * D + feature

    def fixed_state(self) -> int:
        return self.heads * self.key_dim * self.state_columns

    def flops(self, seq_len: int) -> int:
        L, D, H, K = seq_len, self.dim, self.heads, self.key_dim
        feature = 8 * L * H * K * K if self.feature_map == "elementwise_product" else 0
        return (
            2 * L * D * (2 * self.expand_k * D + self.expand_v * D)
            + feature
            + self.non_matmul_flops(L)
            + 2 * L * self.expand_v * D * D
        )

    def non_matmul_flops(self, seq_len: int) -> int:
        """State update and readout, 4 L H K (V + 1 with the normaliser); the feature maps are matmuls."""
        return 4 * seq_len * self.heads * self.key_dim * self.state_columns
