"""What a family's name map says (its module, e.g. lfm2.py, builds it; mapping.py checks it): each
model tensor -> the checkpoint tensors it is made of, each with the shape it must have."""

from __future__ import annotations

from typing import NamedTuple


class Part(NamedTuple):
    """A checkpoint tensor and the shape it must have."""

    name: str
    shape: tuple[int, ...]


# a model tensor -> its parts (several: concatenated along the first axis, in order)
Sources = dict[str, tuple[Part, ...]]


def one(name: str, shape: tuple[int, ...]) -> tuple[Part, ...]:
    """A model tensor that is one checkpoint tensor as it stands."""
    return (Part(name, tuple(shape)),)
