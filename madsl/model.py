"""The torch model a spec compiles to: embedding, the topology's blocks, final norm, head.

Every block is pre-norm residual (`x + mixer(norm(x))`, then `x + channel(norm(x))`).
A layer and its pre-norm form one `PreNorm` unit, so a tag (`H#a`) shares both.
Parallel mixers share one norm owned by their block and are summed. A group with a
`residual` attribute wraps its sub-stack in a `GroupConnection`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def make_norm(kind: str, dim: int) -> nn.Module:
    # RMSNorm with a weight only (Transformer++), or LayerNorm with weight and bias
    return nn.RMSNorm(dim, eps=1e-5) if kind == "rms" else nn.LayerNorm(dim, eps=1e-5)


class PreNorm(nn.Module):
    """A layer with the norm in front of it."""

    def __init__(self, norm: nn.Module, layer: nn.Module):
        super().__init__()
        self.norm, self.layer = norm, layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.norm(x))


class Parallel(nn.Module):
    """Sequence mixers reading one normed input; their outputs are summed."""

    def __init__(self, norm: nn.Module, branches: list[nn.Module]):
        super().__init__()
        self.norm, self.branches = norm, nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return sum(branch(h) for branch in self.branches)


class Block(nn.Module):
    def __init__(self, mixer: nn.Module, channel: nn.Module | None):
        super().__init__()
        self.mixer, self.channel = mixer, channel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(x)
        if self.channel is not None:
            x = x + self.channel(x)
        return x


class GroupConnection(nn.Module):
    """The connection around a group's sub-stack G: `add` x + G(x); `gated`
    (1 - g) * x + g * G(x) with g = sigmoid(W x + b) (seed 004's "Gated-res")."""

    def __init__(self, body: list[nn.Module], residual: str, dim: int):
        super().__init__()
        self.body, self.residual = nn.Sequential(*body), residual
        self.gate = nn.Linear(dim, dim) if residual == "gated" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        if self.residual == "add":
            return x + out
        if self.residual == "gated":
            g = torch.sigmoid(self.gate(x))
            return (1 - g) * x + g * out
        return out


class Model(nn.Module):
    """tokens (B, L) -> logits (B, L, num_classes)."""

    def __init__(self, body: list[nn.Module], dim: int, vocab_size: int, num_classes: int, norm: str,
                 tie_embeddings: bool, max_seq_len: int | None = None):
        super().__init__()
        self.dim, self.vocab_size, self.num_classes, self.max_seq_len = dim, vocab_size, num_classes, max_seq_len
        self.named_layers: dict[str, list[nn.Module]] = {}  # set by the compiler: symbol or "#tag" -> modules
        self.embedding = nn.Embedding(vocab_size, dim)
        self.body = nn.Sequential(*body)
        self.final_norm = make_norm(norm, dim)
        tied = tie_embeddings and num_classes == vocab_size
        self.head = None if tied else nn.Linear(dim, num_classes, bias=False)
        nn.init.normal_(self.embedding.weight, std=0.02)  # GPT-2 / Transformer++ practice
        if self.head is not None:
            nn.init.normal_(self.head.weight, std=0.02)

    def features(self, tokens: torch.Tensor | None = None, embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states after the final norm, (B, L, dim). Give token ids or input embeddings."""
        if (tokens is None) == (embeds is None):
            raise ValueError("give exactly one of tokens or embeds")
        x = self.embedding(tokens) if tokens is not None else embeds
        return self.final_norm(self.body(x))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.features(tokens)
        return F.linear(h, self.embedding.weight) if self.head is None else self.head(h)

    def aux_loss(self) -> torch.Tensor:
        """Auxiliary losses (MoE load balancing) set by layers in the last forward pass."""
        total = torch.zeros((), device=self.embedding.weight.device)
        for module in self.modules():
            loss = getattr(module, "aux_loss", None)
            if isinstance(loss, torch.Tensor):
                total = total + loss
        return total

    def freeze(self, names: list[str]) -> int:
        """Stop training the layers named by symbol (`Mb`), tag (`#a`) or `embedding`;
        returns how many parameters were frozen. Unknown names raise KeyError."""
        frozen = 0
        for name in names:
            if name == "embedding":
                modules = [self.embedding]
            elif name in self.named_layers:
                modules = self.named_layers[name]
            else:
                known = sorted(self.named_layers) + ["embedding"]
                raise KeyError(f"no layer named {name!r} to freeze; layers: {', '.join(known)}")
            for module in modules:
                for p in module.parameters():
                    if p.requires_grad:
                        p.requires_grad_(False)
                        frozen += p.numel()
        return frozen

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def sincos_embedding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Fixed sin-cos position embedding (Vaswani et al.), (..., dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device) / max(1, half))
    angles = positions.float()[..., None] * freqs
    emb = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return F.pad(emb, (0, dim - 2 * half))
