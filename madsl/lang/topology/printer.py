"""A topology printed back as a topology string: a layer's or a block's text, the fully expanded
form, and the canonical form, one normal form per architecture, so that two spellings of the same
architecture print, and compare, equal. Every value prints as the parser reads it back.
"""

from __future__ import annotations

import math
import re

from madsl.lang.topology.expand import expand
from madsl.lang.topology.nodes import Block, Fork, Group, Layer, Node, Parallel, Settings, Topology, Value

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # the grammar's NAME: a value that may go unquoted
_KEYWORDS = ("true", "false", "null")  # words that read back as true, false and null (any case)


def _value(v: Value) -> str:
    """A value as the parser reads it back: the same value of the same type."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        if _WORD.fullmatch(v) and v.lower() not in _KEYWORDS:
            return v
        for quote in "\"'":  # the grammar has no escapes: a string with both quotes cannot be written
            if quote not in v:
                return f"{quote}{v}{quote}"
        raise ValueError(f"{v!r} contains both quote characters and cannot be written in a topology")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{v!r} cannot be written in a topology: numbers are finite")
    return repr(v)  # ints, and floats in Python's shortest round-tripping form (1e+16, 0.1)


def _settings_text(settings: Settings) -> str:
    return "{" + ",".join(f"{k}={_value(v)}" for k, v in settings) + "}" if settings else ""


def layer_text(layer: Layer) -> str:
    return layer.symbol + (f"#{layer.tag}" if layer.tag else "") + _settings_text(layer.overrides)


def block_text(block: Block) -> str:
    if isinstance(block.mixer, Parallel):
        mixer = "[" + " | ".join(layer_text(b) for b in block.mixer.branches) + "]"
    else:
        mixer = layer_text(block.mixer)
    inject = f"{layer_text(block.inject)}>" if block.inject is not None else ""
    return inject + mixer + (f"-{layer_text(block.channel)}" if block.channel is not None else "")


def expanded_text(topology: Topology) -> str:
    """The fully expanded form: every block written out, separated by ' : '."""
    parts = []
    for node in expand(topology):
        if isinstance(node, Group):
            parts.append(f"({expanded_text(node.body)}){_settings_text(node.attrs)}")
        elif isinstance(node, Fork):
            parts.append(" | ".join(expanded_text(branch) for branch in node.branches))
        else:
            parts.append(block_text(node))
    return " : ".join(parts)


def canonical(topology: Topology) -> str:
    """One normal form per architecture: expanded, then compressed deterministically.

    A sequence that is k > 1 copies of a shorter one prints as (period)xk; what
    remains is run-length encoded (4A). Groups with attributes print as
    (body){attrs}."""
    return _compress(list(expand(topology)))


def _unit(node: Node) -> str:
    if isinstance(node, Group):
        return f"({_compress(list(node.body))}){_settings_text(node.attrs)}"
    if isinstance(node, Fork):
        return " | ".join(_compress(list(branch)) for branch in node.branches)
    return block_text(node)


def _compress(nodes: list[Node]) -> str:
    n = len(nodes)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and nodes[:period] * (n // period) == nodes:
            inner = _compress(nodes[:period])
            if period == 1:
                return f"{n}{inner}"
            return f"({inner})x{n // period}"
    parts, i = [], 0
    while i < n:
        j = i
        while j < n and nodes[j] == nodes[i]:
            j += 1
        unit = _unit(nodes[i])
        parts.append(f"{j - i}{unit}" if j - i > 1 else unit)
        i = j
    return ":".join(parts)
