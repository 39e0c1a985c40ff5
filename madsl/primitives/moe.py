"""Mixture-of-experts GLU channel mixer (`MoE`).

Defaults: 8 experts of width 16, 2 active (MAD paper App. B.3.1), SwiGLU experts.
Router: a linear map dim -> experts without bias; each token's top-k logits go
through a softmax and the other experts get exactly zero weight (`normalize_top: false`:
the chosen experts weigh their probabilities of a softmax over all experts, which sum to
less than 1, as Jamba's JambaTopKRouter). `scores: sigmoid` (DeepSeek-V3's router, Nemotron-H's,
LFM2-MoE's): each expert's score is the sigmoid of its logit; the largest scores, plus a
`selection_bias` buffer where there is one (e_score_correction_bias, expert_bias: it picks,
never weighs), choose the experts, weighted by their scores (divided by their sum where
`normalize_top`); `route_scale` multiplies every routed weight (routed_scaling_factor). The
selection bias is a buffer, not a parameter: it is loaded with the weights, never trained, and
not counted. An auxiliary
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

Latent experts (`latent_width` > 0; NVIDIA-Nemotron-3-Super's LatentMoE, transformers'
NemotronHMoE with `moe_latent_size`): each token is projected down to the latent width
(fc1_latent_proj, dim -> latent_width, no bias), the routed experts read and write the latent
width, and their weighted sum is projected back up (fc2_latent_proj, latent_width -> dim); the
router and the shared expert read the token at the model width. Every expert size above then has
latent_width (`expert_dim`) in place of D, plus 2*dim*latent_width parameters (active: both
projections) and 4 L D latent_width FLOPs for the two projections.
Shared-expert gate (`shared_gate`; Qwen2-MoE's and Qwen3-Next's `shared_expert_gate`): a map
dim -> 1 without bias whose sigmoid scales the shared expert's output, token by token: dim
parameters, 2 L D FLOPs; it needs a shared expert.
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
    latent_width: int  # 0: experts at the model width; else the latent width the routed experts work at
    shared_gate: bool  # a sigmoid gate dim -> 1 on the shared expert's output (Qwen2-MoE, Qwen3-Next)
    normalize_top: bool = True  # false: the top-k probabilities of a softmax over all experts (Jamba)
    scores: Literal["softmax", "sigmoid"] = "softmax"  # sigmoid: DeepSeek-V3's, Nemotron-H's, LFM2-MoE's router
    selection_bias: bool = False  # a buffer added to the sigmoid scores to pick experts, not to weigh them
    route_scale: float = 1.0  # the chosen experts' weights times this (routed_scaling_factor)

    name = "moe"
    role = "channel"
    module = "madsl.layers.moe:MoE"
    # added later: specs at their defaults keep their run identities
    identity_omits = (
        *("shared_width", "activation", "router_bias", "dense_down", "leaky_routing", "gated"),
        *("latent_width", "shared_gate", "normalize_top", "scores", "selection_bias", "route_scale"),
    )

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
        if self.latent_width < 0:
            raise ConfigError("latent_width", f"moe: latent_width must be >= 0 (0: none), got {self.latent_width}")
        if self.leaky_routing and (not self.normalize_top or self.scores != "softmax" or self.route_scale != 1.0):
            raise ConfigError(
                "leaky_routing",
                "moe: leaky_routing has a softmax of its own; normalize_top, scores and route_scale set another",
                "keep them at their defaults with leaky_routing",
            )
        if self.selection_bias and self.scores != "sigmoid":
            raise ConfigError(
                "selection_bias", "moe: a selection bias is added to sigmoid scores", "set scores: sigmoid"
            )
        if not 0 < self.route_scale < float("inf"):
            raise ConfigError("route_scale", f"moe: route_scale must be a positive number, got {self.route_scale}")
        if self.shared_gate and not self.shared_width:
            raise ConfigError(
                "shared_gate", "moe: shared_gate gates the shared expert, and there is none", "set shared_width > 0"
            )

    @property
    def expert_dim(self) -> int:
        """The width the routed experts read and write: the latent width, or the model width."""
        return self.latent_width or self.dim

    @property
    def shared_params(self) -> int:
        """The latent projections, the shared expert and its gate: read by every token."""
        n = self.input_matrices
        latent = 2 * self.dim * self.latent_width
        return latent + (n + 1) * self.dim * self.shared_width + (self.dim if self.shared_gate else 0)

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
        D, E, W, X = self.dim, self.experts, self.expert_width, self.expert_dim
        router = D * E + (E if self.router_bias else 0)
        n = self.input_matrices
        return router + n * E * X * W + E * self.down_inputs * X + self.shared_params

    def active_params(self) -> int:
        D, E, W, G, X = self.dim, self.experts, self.expert_width, self.weighted_experts, self.expert_dim
        router = D * E + (E if self.router_bias else 0)
        hidden_experts = E if self.dense_down else G  # experts whose gate and up a token reads
        n = self.input_matrices
        return router + n * hidden_experts * X * W + G * self.down_inputs * X + self.shared_params

    def flops(self, seq_len: int) -> int:
        L, D, n, X = seq_len, self.dim, self.input_matrices, self.expert_dim
        return (
            L * D * self.experts
            + 2 * n * L * X * self.expert_width * self.experts
            + 2 * L * X * self.down_inputs * self.weighted_experts
            + 2 * L * self.shared_params
            + self.non_matmul_flops(L)
        )

    def non_matmul_flops(self, seq_len: int) -> int:
        return 0  # router and experts are matmuls; routing, activations and weighting are not counted
