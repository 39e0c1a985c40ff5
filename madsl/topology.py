"""The topology language's public face at its first address: `madsl.topology` is `madsl.lang.topology`
(madsl/lang/topology/__init__.py says what each name is)."""
from __future__ import annotations

from madsl.lang.topology import (BRANCH_ATTRIBUTES, GROUP_ATTRIBUTES, GROUP_DEFAULTS, MAX_BLOCKS, MAX_CHARS,
                                 MAX_INTEGER, MAX_NESTING, NO_CHANNEL, POSITIVE_NUMBER, Block, Fork, Group, Layer,
                                 Node, Parallel, Repeat, Settings, Span, Topology, TopologySyntaxError, Value,
                                 block_text, blocks, canonical, expand, expanded_text, is_forked, layer_text, layers,
                                 locate, map_blocks, parse, size)

__all__ = ["BRANCH_ATTRIBUTES", "GROUP_ATTRIBUTES", "GROUP_DEFAULTS", "MAX_BLOCKS", "MAX_CHARS", "MAX_INTEGER",
           "MAX_NESTING", "NO_CHANNEL", "POSITIVE_NUMBER", "Block", "Fork", "Group", "Layer", "Node", "Parallel",
           "Repeat", "Settings", "Span", "Topology", "TopologySyntaxError", "Value", "block_text", "blocks",
           "canonical", "expand", "expanded_text", "is_forked", "layer_text", "layers", "locate", "map_blocks",
           "parse", "size"]
