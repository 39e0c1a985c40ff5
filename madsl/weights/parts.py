"""What a family's name map says (its module, e.g. lfm2.py, builds it; mapping.py checks it): each
model tensor -> the checkpoint tensors it is made of, each with the shape it must have."""

from __future__ import annotations

from typing import Any, NamedTuple


class Part(NamedTuple):
    """A checkpoint tensor and the shape it must have."""

    name: str
    shape: tuple[int, ...]


# a model tensor -> its parts (several: concatenated along the first axis, in order)
Sources = dict[str, tuple[Part, ...]]


def one(name: str, shape: tuple[int, ...]) -> tuple[Part, ...]:
    """A model tensor that is one checkpoint tensor as it stands."""
    return (Part(name, tuple(shape)),)


def qkv(attention: Any, q: str, k: str, v: str, shape: tuple[int, ...]) -> tuple[Part, ...]:
    """madsl's fused attention projection (weight or bias of `shape`) from a checkpoint's separate
    q, k and v tensors, in that order: the query heads' rows, then the key-value heads'."""
    rows = (attention.heads * attention.head_dim, attention.kv_heads * attention.head_dim)
    rest = tuple(shape[1:])
    return (Part(q, (rows[0], *rest)), Part(k, (rows[1], *rest)), Part(v, (rows[1], *rest)))
