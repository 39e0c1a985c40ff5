"""Mixture-of-experts GLU channel mixer (`MoE`).

Defaults: 8 experts of width 16, 2 active (MAD paper App. B.3.1), SwiGLU experts.
Router: a linear map dim -> experts without bias; each token's top-k logits go
through a softmax and the other experts get exactly zero weight. An auxiliary
load-balancing loss (Switch Transformer form) is available.

Options for the MAD reference's `MoeMlp` (athms/mad-lab mad/model/layers/mlp.py,
configs/layers/moe-mlp.yml): `router_bias` (its router is a plain nn.Linear);
`activation: gelu` (its experts gate with GELU, tanh approximation, not SiLU);
`dense_down` (its down projection is one dense map from all experts' hidden units,
experts*expert_width, to experts*dim: each expert's output reads every expert's hidden
units, instead of its own); `leaky_routing` (the logits outside the top k are set to
0, not dropped, before a softmax over all experts, so every expert keeps weight).
`gated: false` makes every expert, and the shared one, a plain MLP of two matrices,
down(act(up x)), with `activation: relu2` (squared ReLU) Nemotron-H's experts
(NVIDIA-Nemotron-3's mixture of experts); the GLU experts have three.

Parameters: router dim*experts (+ experts), gate and up projections
2*experts*dim*expert_width (gated: false, the up projections alone), down projections
experts*expert_width*dim (dense_down: experts*expert_width*dim*experts). The reference's MoeMlp also holds `gates`
(experts x expert_width) that its forward never reads: not a parameter here.
Active parameters (what one token's output reads): the router, the shared expert and the
G chosen experts (G: `active`; all experts under leaky routing, where every expert keeps
weight), router + 3*dim*shared_width + G*3*dim*expert_width (2 matrices, not 3, where not
gated); with dense_down, every expert's
gate and up projections (the chosen down projections read all hidden units) and the G
chosen down projections.
FLOPs: App. C.4.7 as printed there: router L D A, up projections 4 L D D_moe A
(the paper counts the up projections of all experts), sparse down projection
2 L D D_moe G (G: the active experts; all experts under leaky routing; dense_down
reads all experts' hidden units: 2 L D A D_moe G); the shared expert as SwiGLU, 6 L D D_shared.
Not gated: the up projections 2 L D D_moe A, the shared expert 4 L D D_shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .base import ConfigError, Primitive, positive


@dataclass(frozen=True)
class MoE(Primitive):
    experts: int
    expert_width: int
    active: int
    aux_loss_weight: float
    shared_width: int  # 0: no shared expert
    activation: Literal["silu", "gelu", "relu2"]
    router_bias: bool
    dense_down: bool
    leaky_routing: bool
    gated: bool  # GLU experts (gate and up); false: plain MLP experts (up alone), as Nemotron-H's

    name = "moe"
    role = "channel"
    module = "madsl.layers.moe:MoE"
    # added later: specs at their defaults keep their run identities
    identity_omits = ("shared_width", "activation", "router_bias", "dense_down", "leaky_routing", "gated")

    def validate(self) -> None:
        positive(self, "experts", "expert_width", "active")
        if self.active > self.experts:
            raise ConfigError(
                "active",
                f"moe: active={self.active} exceeds experts={self.experts}",
                "active experts are chosen among the experts",
            )
        if self.aux_loss_weight < 0:
            raise ConfigError("aux_loss_weight", "moe: aux_loss_weight must be >= 0")
        if self.shared_width < 0:
            raise ConfigError("shared_width", f"moe: shared_width must be >= 0 (0: none), got {self.shared_width}")

    @property
    def weighted_experts(self) -> int:
        """Experts whose output a token's sum reads: all of them under leaky routing."""
        return self.experts if self.leaky_routing else self.active

    @property
    def down_inputs(self) -> int:
        """Hidden units each expert's down projection reads."""
        return self.experts * self.expert_width if self.dense_down else self.expert_width

    @property
    def input_matrices(self) -> int:
        """Matrices from the input to an expert's hidden units: gate and up (GLU), or up alone."""
        return 2 if self.gated else 1

    def params(self) -> int:
        D, E, W = self.dim, self.experts, self.expert_width
        router = D * E + (E if self.router_bias else 0)
        n = self.input_matrices
        return router + n * E * D * W + E * self.down_inputs * D + (n + 1) * D * self.shared_width

    def active_params(self) -> int:
        D, E, W, G = self.dim, self.experts, self.expert_width, self.weighted_experts
        router = D * E + (E if self.router_bias else 0)
        hidden_experts = E if self.dense_down else G  # experts whose gate and up a token reads
        n = self.input_matrices
        return router + n * hidden_experts * D * W + G * self.down_inputs * D + (n + 1) * D * self.shared_width

    def flops(self, seq_len: int) -> int:
        L, D, n = seq_len, self.dim, self.input_matrices
        return (
            L * D * self.experts
            + 2 * n * L * D * self.expert_width * self.experts
            + 2 * L * D * self.down_inputs * self.weighted_experts
            + 2 * (n + 1) * L * D * self.shared_width
            + self.non_matmul_flops(L)
        )

    def non_matmul_flops(self, seq_len: int) -> int:
        return 0  # router and experts are matmuls; routing, activations and weighting are not counted
