"""What a topology is, as plain data: the frozen nodes a topology string parses into (Layer,
Block, Parallel, Group, Fork, Repeat) and where each was written (Span); the group attributes the
language knows, with their values; and the limits on a topology's size.

Nothing here knows what a symbol means; the spec layer resolves symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

Value = Union[int, float, bool, str, None]
Settings = tuple[tuple[str, Value], ...]  # sorted (key, value) pairs

POSITIVE_NUMBER = "a positive number"
# A group's attributes and their values (docs/language.md): the connection around it, the
# splitter and combiner of a group of branches, the pre-norm kind and the Linear init of its layers
GROUP_ATTRIBUTES: dict[str, Any] = {
    "residual": ("add", "none", "gated"),
    "split": ("copy", "res", "gated", "gated_soft"),
    "combine": ("mean", "res", "gated", "gated_soft"),
    "norm": ("rms", "layer"),
    "linear_std": POSITIVE_NUMBER,
}
BRANCH_ATTRIBUTES = ("split", "combine")  # only a group of branches has a splitter and a combiner
# what a bare group already is: dropped, so that both spellings are one architecture
GROUP_DEFAULTS = {"residual": "none", "split": "copy", "combine": "mean"}
NO_CHANNEL = "none"  # `H-none`: a block without a channel mixer

# Limits, checked before the expensive work so that any input answers in seconds
# (docs/language.md#limits). A topology longer than these is a typo, not an architecture.
MAX_BLOCKS = 1024  # after expansion; a parallel block counts once per branch
MAX_NESTING = 32  # parentheses inside parentheses
MAX_CHARS = 65_536  # the topology string itself
MAX_INTEGER = 2**63 - 1  # parameter values are 64-bit integers or finite floats


@dataclass(frozen=True)
class Span:
    """Where a node was written inside the topology string (1-based line and column)."""

    line: int
    column: int
    length: int


@dataclass(frozen=True)
class Layer:
    symbol: str
    overrides: Settings = ()
    tag: str | None = None
    span: Span | None = field(default=None, compare=False, repr=False)
    # where each override's key and value were written: (key, key span, value span)
    override_spans: tuple[tuple[str, Span, Span], ...] = field(default=(), compare=False, repr=False)
    # the type of each override, so that 1, 1.0 and true (equal in Python) stay three layers
    override_types: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "override_types", tuple(type(v).__name__ for _, v in self.overrides))


@dataclass(frozen=True)
class Parallel:
    """Sequence mixers applied to the same input; their outputs are summed."""

    branches: tuple[Layer, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Block:
    """A residual block: a sequence mixer and (optionally) its channel mixer.

    channel is None when the topology does not name one (the spec's default
    applies) and Layer("none") when the topology asks for none. inject is the layer written
    before `>` (`Zs#a>M2`): it reads the block's input, and its output is added to the input of
    the mixer's pre-norm, not to the stream (Zamba2's hybrid layer: h + M2(norm(h + Zs(h))))."""

    mixer: Layer | Parallel
    channel: Layer | None = None
    inject: Layer | None = None


@dataclass(frozen=True)
class Group:
    body: tuple["Node", ...]
    attrs: Settings = ()
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Fork:
    """The branches of a group written `(X | Y)`: sub-stacks that each read the group's input
    through its splitter, and whose outputs its combiner joins. Only ever a group's whole body."""

    branches: tuple[tuple["Node", ...], ...]


@dataclass(frozen=True)
class Repeat:
    node: Union[Block, Group]
    count: int


Node = Union[Block, Group, Repeat, Fork]
Topology = tuple[Node, ...]
