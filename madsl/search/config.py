"""What a search file says, as plain checked data: the space of architectures (`Space`, with its
named hyperparameters), the objectives (`Objectives`), the algorithm (`Algorithm`) and the spec
fields every candidate shares (`SearchFile.spec_data`: width, layers, budget). Made by
madsl.search.reading.load_search; nothing here reads a file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from madsl.errors import Location
from madsl.lang.yamlsource import Located

SHAPES = ("sequence", "striped", "motif", "parallel")  # parallel: blocks may be [X | Y] groups
ALGORITHMS = ("nsga2", "regularized-evolution", "random")
MINIMIZABLE = ("params", "fixed_state", "conv_state", "kv_cache", "total_state", "flops")  # accounted totals


@dataclass(frozen=True)
class Hyperparameter:
    """A named hyperparameter (`SYMBOL.param`) the search may set: a list of choices, or an
    integer range low..high (both inclusive)."""

    name: str
    symbol: str
    param: str
    choices: tuple[Any, ...] = ()
    low: int | None = None
    high: int | None = None

    @property
    def values_count(self) -> int:
        return len(self.choices) if self.choices else self.high - self.low + 1

    def sample(self, rng: Any) -> Any:
        if self.choices:
            return self.choices[int(rng.integers(len(self.choices)))]
        return int(rng.integers(self.low, self.high + 1))

    def neighbour(self, value: Any, rng: Any) -> Any:
        """Another value within the range: another choice, or an integer a few steps away."""
        if self.choices:
            others = [c for c in self.choices if c != value]
            return others[int(rng.integers(len(others)))] if others else value
        reach = max(1, (self.high - self.low) // 4)
        step = int(rng.integers(1, reach + 1)) * (1 if rng.random() < 0.5 else -1)
        moved = min(self.high, max(self.low, value + step))
        if moved == value:  # at an end of the range: step the other way
            moved = min(self.high, max(self.low, value - step))
        return moved


FILL = "budget.fill"  # the gene of `space.fill`: the fraction of each state bound a candidate is solved toward
FILLED = ("fixed_state", "conv_state", "total_state")  # the bounds it scales: what the free parameters move


@dataclass(frozen=True)
class Space:
    """The architectures a search may propose."""

    sequence_mixers: tuple[str, ...]
    channel_mixers: tuple[str, ...]
    mixes_channels: tuple[str, ...]  # sequence mixers that mix channels themselves (Mb): may go without one
    min_blocks: int
    max_blocks: int
    shapes: tuple[str, ...]  # of sequence, striped, motif
    parallel: bool  # blocks may hold two sequence mixers side by side ([H | mA])
    hyperparameters: tuple[Hyperparameter, ...] = ()  # the layers' named ones, and `fill`'s gene (FILL)

    @property
    def layer_hyperparameters(self) -> tuple[Hyperparameter, ...]:
        """The hyperparameters of layers (every one but the fill gene)."""
        return tuple(h for h in self.hyperparameters if h.name != FILL)

    def channel_choices(self, mixers: tuple[str, ...]) -> tuple[str | None, ...]:
        """The channel mixers a block of these sequence mixers may take; None: none (only where
        every mixer of the block mixes channels itself, as the MAD paper's Mamba blocks)."""
        extra = (None,) if all(m in self.mixes_channels for m in mixers) else ()
        return tuple(self.channel_mixers) + extra

    def sizes(self, shape: str) -> list[tuple[int, int]]:
        """The (unit length, count) pairs a shape may take within the block range: a sequence's
        (n, 1); a motif's (m, N) repeated N >= 2 times; a striped period's (p, n), p >= 2 blocks
        filling n > p blocks."""
        low, high = self.min_blocks, self.max_blocks
        if shape == "sequence":
            return [(n, 1) for n in range(low, high + 1)]
        if shape == "motif":
            return [(m, n) for n in range(2, high + 1) for m in range(1, high + 1) if low <= m * n <= high]
        return [(p, n) for n in range(max(low, 3), high + 1) for p in range(2, n)]

    def holds(self, shape: str, length: int, count: int) -> bool:
        """Whether (length, count) is among `sizes(shape)`, by arithmetic: a genome read from a
        saved state is checked before anything of its size is built or listed."""
        low, high = self.min_blocks, self.max_blocks
        if shape == "sequence":
            return count == 1 and low <= length <= high
        if shape == "motif":
            return 2 <= count <= high and 1 <= length <= high and low <= length * count <= high
        if shape == "striped":
            return max(low, 3) <= count <= high and 2 <= length < count
        return False


@dataclass(frozen=True)
class Objectives:
    """The MAD score on the evaluation `settings` (maximised), and accounted totals to minimise."""

    settings: dict[str, Any]  # protocol, tasks, set, epochs, ...: madsl.runner.plan.settings keys
    minimize: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return ("score",) + self.minimize


@dataclass(frozen=True)
class Algorithm:
    name: str  # one of ALGORITHMS
    population: int
    generations: int
    offspring: int  # children proposed per generation
    seed: int
    sample_size: int  # regularized evolution: candidates per tournament
    crossover: float  # NSGA-II: the chance a child is bred from two parents

    @property
    def evaluations(self) -> int:
        """Candidates proposed in all: the initial population, then `offspring` per generation."""
        return self.population + self.generations * self.offspring


@dataclass
class SearchFile:
    path: str
    name: str
    description: str
    spec_data: dict[str, Any]  # the spec fields every candidate shares (dim, layers, budget, ...)
    free: tuple[str, ...]  # budget.fit: free parameters solved into the budget
    space: Space
    objectives: Objectives
    algorithm: Algorithm
    references: dict[str, str] = field(default_factory=dict)  # name -> canonical topology (--calibrate)
    located: Located | None = field(default=None, repr=False)

    def where(self, *path: Any) -> Location | None:
        """Where the value at `path` is written in the search file (None without a file)."""
        return self.located.value(path) if self.located is not None else None

    def fingerprint(self) -> str:
        """What decides the candidates and their scores, hashed: a saved search state belongs
        to the search file it was made from (the description and the references aside: neither
        changes what the search proposes)."""
        data = {
            "name": self.name,
            "spec": self.spec_data,
            "free": self.free,
            "space": _plain(self.space),
            "objectives": _plain(self.objectives),
            "algorithm": _plain(self.algorithm),
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _plain(value: Any) -> Any:
    return asdict(value)
