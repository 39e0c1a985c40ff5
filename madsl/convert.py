"""Megatron-LM / Nemotron-H hybrid patterns <-> topologies at their first address: `madsl.convert` is
`madsl.interop.megatron` (its docstring says how a pattern reads)."""

from __future__ import annotations

from madsl.interop.megatron import (
    CHANNEL,
    DEFAULT_SYMBOLS,
    PRIMITIVE_CHARACTER,
    SEQUENCE,
    compact,
    describe_character,
    from_megatron_pattern,
    megatron_blocks,
    to_megatron_pattern,
)

__all__ = [
    "CHANNEL",
    "DEFAULT_SYMBOLS",
    "PRIMITIVE_CHARACTER",
    "SEQUENCE",
    "compact",
    "describe_character",
    "from_megatron_pattern",
    "megatron_blocks",
    "to_megatron_pattern",
]
