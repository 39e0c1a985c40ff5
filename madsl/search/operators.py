"""Operators on genomes, working on topology nodes: mutations and crossover.

    primitive       a block's sequence mixer (or one branch of a parallel block) becomes another
    insert          a random block enters the unit (the sequence, the motif or the period)
    delete          a block leaves the unit
    repeat          a motif's repeat count or a striped period's length changes by one; in a
                    sequence, a block is repeated in place (`H` -> `2H`) or a repeat undone
    channel         a block's channel mixer becomes another allowed one
    hyperparameter  a named hyperparameter moves within its range
    parallel        a block becomes a parallel one ([H | mA]) or back (where the space allows)
    reshape         the blocks take another shape of the space (a sequence's first blocks become
                    a motif or a period; a motif or striped period is written out as a sequence)
    crossover       cut-and-splice of two parents' block lists (of their units, where both are
                    motifs or both striped), each hyperparameter from either parent

Each operator returns a new genome, or None where it does not apply (no block to delete, a count
at the end of the range): `mutate` then tries another. A result is always within the space's
shapes and block range; whether it is new, valid and within budget is for the candidate builder.
"""

from __future__ import annotations

from typing import Any, Callable

from madsl.lang import topology as topo
from madsl.search.config import Space
from madsl.search.genome import Genome, channel_of, make_block, mixers_of, pick, random_block

CUTS_TRIED = 16  # cut-and-splice: random cut pairs tried for a child within the block range


def _within(genome: Genome, space: Space) -> Genome | None:
    return genome if genome.fits(space) else None


def _replace_block(genome: Genome, index: int, block: topo.Block) -> Genome:
    unit = genome.unit[:index] + (block,) + genome.unit[index + 1 :]
    return Genome(genome.shape, unit, genome.count, genome.params)


def _with_mixers(block: topo.Block, mixers: tuple[str, ...], space: Space, rng: Any) -> topo.Block:
    """The block with other sequence mixers, keeping its channel mixer where they may take it."""
    choices = space.channel_choices(mixers)
    channel = channel_of(block)
    return make_block(mixers, channel if channel in choices else pick(choices, rng))


def primitive(genome: Genome, space: Space, rng: Any) -> Genome | None:
    if len(space.sequence_mixers) < 2:
        return None
    index = int(rng.integers(len(genome.unit)))
    mixers = list(mixers_of(genome.unit[index]))
    branch = int(rng.integers(len(mixers)))
    options = [m for m in space.sequence_mixers if m not in mixers]
    if not options:
        return None
    mixers[branch] = pick(options, rng)
    return _replace_block(genome, index, _with_mixers(genome.unit[index], tuple(mixers), space, rng))


def insert(genome: Genome, space: Space, rng: Any) -> Genome | None:
    at = int(rng.integers(len(genome.unit) + 1))
    unit = genome.unit[:at] + (random_block(space, rng),) + genome.unit[at:]
    return _within(Genome(genome.shape, unit, genome.count, genome.params), space)


def delete(genome: Genome, space: Space, rng: Any) -> Genome | None:
    if len(genome.unit) < 2:
        return None
    at = int(rng.integers(len(genome.unit)))
    return _within(Genome(genome.shape, genome.unit[:at] + genome.unit[at + 1 :], genome.count, genome.params), space)


def repeat(genome: Genome, space: Space, rng: Any) -> Genome | None:
    step = 1 if rng.random() < 0.5 else -1
    if genome.shape != "sequence":
        return _within(Genome(genome.shape, genome.unit, genome.count + step, genome.params), space) or _within(
            Genome(genome.shape, genome.unit, genome.count - step, genome.params), space
        )
    at = int(rng.integers(len(genome.unit)))
    unit = genome.unit
    repeated = at + 1 < len(unit) and unit[at + 1] == unit[at]
    if step < 0 and repeated:  # 2H -> H
        return _within(Genome("sequence", unit[:at] + unit[at + 1 :], 1, genome.params), space)
    return _within(Genome("sequence", unit[: at + 1] + unit[at:], 1, genome.params), space)  # H -> 2H


def channel(genome: Genome, space: Space, rng: Any) -> Genome | None:
    options = [i for i, b in enumerate(genome.unit) if len(space.channel_choices(mixers_of(b))) > 1]
    if not options:
        return None
    index = pick(options, rng)
    block = genome.unit[index]
    others = [c for c in space.channel_choices(mixers_of(block)) if c != channel_of(block)]
    return _replace_block(genome, index, make_block(mixers_of(block), pick(others, rng)))


def hyperparameter(genome: Genome, space: Space, rng: Any) -> Genome | None:
    movable = [h for h in space.hyperparameters if h.values_count > 1]
    if not movable:
        return None
    hyper = pick(movable, rng)
    params = dict(genome.params)
    params[hyper.name] = hyper.neighbour(params[hyper.name], rng)
    return genome.with_params(params)


def parallel(genome: Genome, space: Space, rng: Any) -> Genome | None:
    if not space.parallel:
        return None
    index = int(rng.integers(len(genome.unit)))
    block = genome.unit[index]
    mixers = mixers_of(block)
    if len(mixers) > 1:
        kept = (pick(mixers, rng),)
    else:
        kept = mixers + (pick([m for m in space.sequence_mixers if m not in mixers], rng),)
    return _replace_block(genome, index, _with_mixers(block, kept, space, rng))


def reshape(genome: Genome, space: Space, rng: Any) -> Genome | None:
    targets = [s for s in space.shapes if s != genome.shape]
    if not targets:
        return None
    shape = pick(targets, rng)
    blocks = genome.blocks()
    if shape == "sequence":
        return _within(Genome("sequence", blocks, 1, genome.params), space)
    sizes = [(length, count) for length, count in space.sizes(shape) if length <= len(blocks)]
    if not sizes:
        return None
    length, count = pick(sizes, rng)
    return _within(Genome(shape, blocks[:length], count, genome.params), space)


MUTATIONS: dict[str, Callable[[Genome, Space, Any], Genome | None]] = {
    "primitive": primitive,
    "insert": insert,
    "delete": delete,
    "repeat": repeat,
    "channel": channel,
    "hyperparameter": hyperparameter,
    "parallel": parallel,
    "reshape": reshape,
}


def mutate(genome: Genome, space: Space, rng: Any) -> tuple[Genome, str] | None:
    """One mutation, drawn uniformly among those that apply and change the genome; None where none does."""
    names = list(MUTATIONS)
    for position in rng.permutation(len(names)):
        name = names[int(position)]
        child = MUTATIONS[name](genome, space, rng)
        if child is not None and child != genome:
            return child, name
    return None


def crossover(first: Genome, second: Genome, space: Space, rng: Any) -> Genome | None:
    """Cut-and-splice: the first parent's blocks up to a cut, the second's from another cut on
    (their units, where both parents are motifs or both striped: the shape and count are the
    first's); each hyperparameter from either parent. None where no cut gives a child in range."""
    params = {
        name: (value if rng.random() < 0.5 else dict(second.params).get(name, value)) for name, value in first.params
    }
    same = first.shape == second.shape and first.shape in ("motif", "striped")
    left, right = (first.unit, second.unit) if same else (first.blocks(), second.blocks())
    shape, count = (first.shape, first.count) if same else ("sequence", 1)
    for _ in range(CUTS_TRIED):
        cut_left = int(rng.integers(1, len(left) + 1))
        cut_right = int(rng.integers(0, len(right)))
        child = _within(Genome(shape, left[:cut_left] + right[cut_right:], count, tuple(sorted(params.items()))), space)
        if child is not None:
            return child
    return None
