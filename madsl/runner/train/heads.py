"""Output heads: how a compiled backbone is read out for each kind of task.

The backbone (what `madsl.compile` returns) maps tokens to logits and exposes
`features(tokens=None, embeds=None)`, the hidden states after the final norm.
A `TaskModel` puts the head a task needs on top of it:

    lm           next-token logits at every position (the backbone's own output layer)
    compression  a two-layer MLP decoder reads the backbone's output at the compression
                 token plus a fixed sin-cos embedding of the position to reconstruct
                 (MAD paper App. B.1.5), for every position of the target
    classify     the backbone's logits at the last position
    pooled       a text's own tokens (inputs of PAD = -1 after its last one, fed as token 0: a
                 causal backbone's outputs for the text cannot see them): the mean of the
                 backbone's features over them, read by a linear layer with a bias (seed 004's
                 text classification; madsl.tasks.text_classification)
    regress      real-valued inputs projected to the model width (instead of the token
                 embedding), a linear readout at every position, MSE loss

`TaskModel.forward` returns outputs aligned with the task's targets: logits
(..., C) for the class heads, values (...) for regress.

Under the reference implementation's conventions (`conventions="mad-lab"`) the lm head
is its own untied Linear with a bias (PyTorch's default weight init; training option
`lm_head: spec` keeps the spec's output layer instead), every Linear bias
of the model starts at zero (except those a layer marks `_no_reinit`, e.g. Mamba's dt
bias), and for compression every Linear weight starts as N(0, 0.02), every bias at zero
(the marked ones too: its AutoEncoder does not spare them) and the decoder's norms are
RMSNorms, as mad-lab's LanguageModel / AutoEncoder build them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

CLASS_HEADS = ("lm", "compression", "classify", "pooled")
HEADS = (*CLASS_HEADS, "regress")


def sincos_position_embedding(num_positions: int, dim: int) -> torch.Tensor:
    """Fixed (num_positions, dim) embedding: sines in the first half, cosines in the second."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * freq[None, :]
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros(num_positions, 1)], dim=1)
    return emb


def _init_linear(module: nn.Module, weights: bool = True, spare_marked: bool = True) -> None:
    """Every Linear of `module`: weights N(0, 0.02) (if `weights`), biases zero (unless marked
    `_no_reinit` and `spare_marked`)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            if weights:
                nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None and not (spare_marked and getattr(m.bias, "_no_reinit", False)):
                nn.init.zeros_(m.bias)


def pooled_mean(features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L, D) features, (B, L) mask of the tokens to pool -> (B, D) their mean."""
    weights = mask.to(features.dtype)
    return (features * weights[..., None]).sum(1) / weights.sum(1, keepdim=True).clamp(min=1)


class CompressionDecoder(nn.Module):
    """Two-layer MLP decoder; input: the compression token's output + sin-cos position."""

    def __init__(
        self,
        dim: int,
        num_classes: int,
        num_positions: int,
        token_position: int = -1,
        norm: type[nn.Module] = nn.LayerNorm,
    ):
        super().__init__()
        self.token_position = token_position
        self.register_buffer("positions", sincos_position_embedding(num_positions, dim), persistent=False)
        self.mlp = nn.Sequential(norm(dim), nn.Linear(dim, dim), nn.GELU(), norm(dim), nn.Linear(dim, dim), nn.GELU())
        self.out = nn.Sequential(norm(dim), nn.Linear(dim, num_classes))
        _init_linear(self)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        code = features[:, self.token_position]  # (B, D)
        x = code[:, None, :] + self.positions[None]  # (B, P, D): one query per position to rebuild
        return self.out(self.mlp(x))  # (B, P, C)


class TaskModel(nn.Module):
    """Backbone + head. `kind` is "classes" (cross-entropy) or "regression" (MSE)."""

    def __init__(
        self,
        backbone: nn.Module,
        head: str,
        *,
        num_classes: int | None = None,
        target_len: int | None = None,
        input_dim: int = 0,
        compression_position: int = -1,
        conventions: str = "madsl",
        lm_head: str = "conventions",
    ):
        super().__init__()
        if head not in HEADS:
            raise ValueError(f"unknown head {head!r}; heads: {', '.join(HEADS)}")
        self.backbone = backbone
        self.head = head
        self.kind = "regression" if head == "regress" else "classes"
        self.lm_head: nn.Linear | None = None
        dim = backbone.dim
        mad_lab = conventions == "mad-lab"
        if head == "lm" and mad_lab and lm_head == "conventions":
            assert num_classes is not None
            self.lm_head = nn.Linear(dim, num_classes)  # untied, with a bias
            if getattr(backbone, "head", None) is not None:
                backbone.head = None  # the spec's own head would sit unused
        if head == "compression":
            assert num_classes is not None and target_len is not None
            self.decoder = CompressionDecoder(
                dim, num_classes, target_len, compression_position, norm=nn.RMSNorm if mad_lab else nn.LayerNorm
            )
        elif head == "pooled":
            assert num_classes is not None
            self.classifier = nn.Linear(dim, num_classes)  # PyTorch's default init, as the seed's cls_head
            if getattr(backbone, "head", None) is not None:
                backbone.head = None  # the vocabulary's output layer would sit unused
        elif head == "regress":
            assert input_dim > 0, "regress head needs real-valued inputs (input_dim > 0)"
            self.input_proj = nn.Linear(input_dim, dim)
            self.readout = nn.Linear(dim, 1)
            _init_linear(self.input_proj)
            _init_linear(self.readout)
        if mad_lab:  # LanguageModel spares `_no_reinit` biases; AutoEncoder (compression) zeroes them all
            _init_linear(self, weights=head == "compression", spare_marked=head != "compression")

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.head == "lm":
            return (
                self.backbone(inputs) if self.lm_head is None else self.lm_head(self.backbone.features(tokens=inputs))
            )
        if self.head == "classify":
            return self.backbone(inputs)[:, -1]
        if self.head == "pooled":
            return self.classifier(pooled_mean(self.backbone.features(tokens=inputs.clamp(min=0)), inputs >= 0))
        if self.head == "compression":
            return self.decoder(self.backbone.features(tokens=inputs))
        h = self.backbone.features(embeds=self.input_proj(inputs))
        return self.readout(h).squeeze(-1)

    def aux_loss(self) -> torch.Tensor | float:
        aux = getattr(self.backbone, "aux_loss", None)
        return aux() if aux is not None else 0.0
