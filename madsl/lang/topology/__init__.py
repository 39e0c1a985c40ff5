"""Topology strings -> plain data, and back.

`parse(text)` runs the Lark grammar (grammar/topology.lark) and turns the tree
into frozen dataclasses. `expand()` unrolls repeats and drops groups that carry
no attributes, giving the architecture's one true shape; `canonical()` prints
an expanded topology in one normal form, so that two spellings of the same
architecture print, and compare, equal:

    canonical(expand(parse("(1H:1A)x12"))) == "(H:A)x12"
    parse(canonical(t)) expands to the same thing as t   (round trip)

Nothing here knows what a symbol means; the spec layer resolves symbols.

This package is the topology language's one public face (`from madsl.lang import topology as topo`;
`madsl.topology` is the same at its first address); each concern lives in a module of its own:

    nodes.py       the data (Span, Layer, Parallel, Block, Group, Fork, Repeat), the group
                   attributes and their values, the limits
    transform.py   the Lark transformer: parse tree -> that data, checking values
    parse.py       parse, TopologySyntaxError, locate: the grammar run, and every failure
                   located inside the string
    expand.py      size, expand, is_forked, blocks, layers, map_blocks
    printer.py     layer_text, block_text, expanded_text, canonical
"""

from __future__ import annotations

from .expand import blocks, expand, is_forked, layers, map_blocks, size
from .nodes import (
    BRANCH_ATTRIBUTES,
    GROUP_ATTRIBUTES,
    GROUP_DEFAULTS,
    MAX_BLOCKS,
    MAX_CHARS,
    MAX_INTEGER,
    MAX_NESTING,
    NO_CHANNEL,
    POSITIVE_NUMBER,
    Block,
    Fork,
    Group,
    Layer,
    Node,
    Parallel,
    Repeat,
    Settings,
    Span,
    Topology,
    Value,
)
from .parse import TopologySyntaxError, locate, parse
from .printer import block_text, canonical, expanded_text, layer_text

__all__ = [
    # the data
    "Block",
    "Fork",
    "Group",
    "Layer",
    "Node",
    "Parallel",
    "Repeat",
    "Settings",
    "Span",
    "Topology",
    "Value",
    "BRANCH_ATTRIBUTES",
    "GROUP_ATTRIBUTES",
    "GROUP_DEFAULTS",
    "NO_CHANNEL",
    "POSITIVE_NUMBER",
    "MAX_BLOCKS",
    "MAX_CHARS",
    "MAX_INTEGER",
    "MAX_NESTING",
    # string -> data
    "TopologySyntaxError",
    "locate",
    "parse",
    # walking it
    "blocks",
    "expand",
    "is_forked",
    "layers",
    "map_blocks",
    "size",
    # data -> string
    "block_text",
    "canonical",
    "expanded_text",
    "layer_text",
]
