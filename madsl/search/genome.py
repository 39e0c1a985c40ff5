"""A candidate before it is built: its shape and blocks as topology nodes, and its hyperparameters.

    Genome("sequence", (H-Sg, mA-MoE, Mb), 1, ...)      H-Sg : mA-MoE : Mb
    Genome("motif",    (H-Sg, mA-Sg), 2, ...)           (H-Sg : mA-Sg)x2
    Genome("striped",  (H-Sg, mA-Sg), 3, ...)           H-Sg : mA-Sg : H-Sg   (a period of 2 over 3 blocks)

`unit` holds madsl.lang.topology nodes (Block with a Layer or a Parallel mixer); `topology()` is the
candidate's topology as nodes, which madsl.lang.topology prints in canonical form. The operators
(madsl.search.operators) work on these nodes, never on strings. A genome is stored in the search
state as plain data (`to_data` / `from_data`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from madsl.lang import topology as topo
from madsl.search.config import Space

PARALLEL_CHANCE = 0.25  # of a random block being a parallel one, where the space allows them


@dataclass(frozen=True)
class Genome:
    shape: str  # sequence | motif | striped
    unit: tuple[topo.Block, ...]  # sequence: every block; motif: the motif; striped: the period
    count: int  # sequence: 1; motif: its repeats; striped: the blocks the period fills
    params: tuple[tuple[str, Any], ...] = ()  # "SYMBOL.param" -> value, sorted

    @property
    def blocks_count(self) -> int:
        if self.shape == "motif":
            return len(self.unit) * self.count
        return self.count if self.shape == "striped" else len(self.unit)

    def blocks(self) -> tuple[topo.Block, ...]:
        """Every block, in order (the expanded topology)."""
        if self.shape == "motif":
            return self.unit * self.count
        if self.shape == "striped":
            return tuple(self.unit[i % len(self.unit)] for i in range(self.count))
        return self.unit

    def topology(self) -> topo.Topology:
        if self.shape == "motif" and self.count > 1:
            return (topo.Repeat(topo.Group(self.unit), self.count),)
        return self.blocks()

    def text(self) -> str:
        """The topology in madsl's canonical form (before the spec elides default channel mixers)."""
        return topo.canonical(self.topology())

    def fits(self, space: Space) -> bool:
        """Whether the shape and size are among the space's."""
        if not self.unit or self.shape not in space.shapes:
            return False
        return space.holds(self.shape, len(self.unit), self.count if self.shape != "sequence" else 1)

    def with_params(self, params: dict[str, Any]) -> "Genome":
        return Genome(self.shape, self.unit, self.count, tuple(sorted(params.items())))

    def to_data(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "count": self.count,
            "params": dict(self.params),
            "unit": [block_data(b) for b in self.unit],
        }


def from_data(data: dict[str, Any]) -> Genome:
    return Genome(
        data["shape"],
        tuple(make_block(b["mixers"], b["channel"]) for b in data["unit"]),
        int(data["count"]),
        tuple(sorted(data["params"].items())),
    )


def mixers_of(block: topo.Block) -> tuple[str, ...]:
    if isinstance(block.mixer, topo.Parallel):
        return tuple(layer.symbol for layer in block.mixer.branches)
    return (block.mixer.symbol,)


def channel_of(block: topo.Block) -> str | None:
    return block.channel.symbol if block.channel is not None else None


def block_data(block: topo.Block) -> dict[str, Any]:
    return {"mixers": list(mixers_of(block)), "channel": channel_of(block)}


def make_block(mixers: tuple[str, ...] | list[str], channel: str | None) -> topo.Block:
    """A block of one sequence mixer, or of two side by side (sorted: [H | mA] and [mA | H] sum the
    same outputs), with its channel mixer (None: the block's default, for mixers that mix channels)."""
    mixers = tuple(sorted(mixers))
    mixer = topo.Layer(mixers[0]) if len(mixers) == 1 else topo.Parallel(tuple(topo.Layer(m) for m in mixers))
    return topo.Block(mixer, topo.Layer(channel) if channel is not None else None)


def pick(items: Any, rng: Any) -> Any:
    """One of `items`, uniformly (numpy's choice would turn strings into numpy strings)."""
    items = list(items)
    return items[int(rng.integers(len(items)))]


def random_mixers(space: Space, rng: Any) -> tuple[str, ...]:
    if space.parallel and len(space.sequence_mixers) > 1 and rng.random() < PARALLEL_CHANCE:
        first = pick(space.sequence_mixers, rng)
        return (first, pick([m for m in space.sequence_mixers if m != first], rng))
    return (pick(space.sequence_mixers, rng),)


def random_block(space: Space, rng: Any) -> topo.Block:
    mixers = random_mixers(space, rng)
    return make_block(mixers, pick(space.channel_choices(mixers), rng))


def random_params(space: Space, rng: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((h.name, h.sample(rng)) for h in space.hyperparameters))


def random_genome(space: Space, rng: Any) -> Genome:
    """A genome drawn uniformly: a shape, then its size, then every block and hyperparameter."""
    shape = pick(space.shapes, rng)
    length, count = pick(space.sizes(shape), rng)
    unit = tuple(random_block(space, rng) for _ in range(length))
    return Genome(shape, unit, count, random_params(space, rng))
