"""Mixture-of-experts SwiGLU channel mixer (`MoE`).

Defaults: 8 experts of width 16, 2 active (MAD paper App. B.3.1). Router: a
linear map dim -> experts without bias; each token's top-k logits go through a
softmax and the other experts get exactly zero weight (the public reference
sets them to 0 before the softmax, which leaks weight to unselected experts).
An auxiliary load-balancing loss (Switch Transformer form) is available.

Parameters: router dim*experts + experts * 3*dim*expert_width.
FLOPs: App. C.4.7 as printed there: router L D A, up projections 4 L D D_moe A
(the paper counts the up projections of all experts), sparse down projection
2 L D D_moe G; the shared expert as SwiGLU, 6 L D D_shared.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Primitive, positive


@dataclass(frozen=True)
class MoE(Primitive):
    experts: int
    expert_width: int
    active: int
    aux_loss_weight: float
    shared_width: int  # 0: no shared expert

    name = "moe"
    role = "channel"
    module = "madsl.layers.moe:MoE"
    identity_omits = ("shared_width",)  # added later: specs without a shared expert keep their run identities

    def validate(self) -> None:
        positive(self, "experts", "expert_width", "active")
        if self.active > self.experts:
            raise ConfigError("active", f"moe: active={self.active} exceeds experts={self.experts}",
                              "active experts are chosen among the experts")
        if self.aux_loss_weight < 0:
            raise ConfigError("aux_loss_weight", "moe: aux_loss_weight must be >= 0")
        if self.shared_width < 0:
            raise ConfigError("shared_width", f"moe: shared_width must be >= 0 (0: none), got {self.shared_width}")

    def params(self) -> int:
        return (self.dim * self.experts + self.experts * 3 * self.dim * self.expert_width
                + 3 * self.dim * self.shared_width)

    def flops(self, seq_len: int) -> int:
        L, D = seq_len, self.dim
        return (L * D * self.experts + 4 * L * D * self.expert_width * self.experts
                + 2 * L * D * self.expert_width * self.active + 6 * L * D * self.shared_width)
