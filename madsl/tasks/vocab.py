"""Vocabulary layouts: token ids as consecutive, named blocks.

Every token task lays out its ids the same way: content blocks first (keys,
values, data, digits), then noise, then one-token special blocks (pad, insert,
blank, separator, ...). `Vocab` records that layout once, so generators, docs,
tests and the example printer all read the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from madsl.tasks.base import IGNORE


@dataclass(frozen=True)
class Block:
    name: str
    start: int
    size: int
    symbol: str  # how tokens print: "k" -> k0, k1, ...; a one-token block prints as given

    @property
    def stop(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class Vocab:
    blocks: tuple[Block, ...]

    @classmethod
    def of(cls, symbols: Mapping[str, str] | None = None, **sizes: int) -> "Vocab":
        """Blocks in keyword order, e.g. `Vocab.of(keys=8, values=8, pad=1)`.

        Tokens print as `<first letter><index in block>` (k3, v0) or, for one-token
        blocks, as `[name]`; `symbols` overrides either (e.g. digits print bare).
        """
        symbols = dict(symbols or {})
        blocks, start = [], 0
        for name, size in sizes.items():
            if size < 0:
                raise ValueError(f"vocabulary block {name!r} has negative size {size}")
            default = f"[{name}]" if size == 1 else name[0]
            blocks.append(Block(name, start, size, symbols.get(name, default)))
            start += size
        return cls(tuple(blocks))

    @property
    def size(self) -> int:
        return self.blocks[-1].stop if self.blocks else 0

    def block(self, name: str) -> Block:
        for b in self.blocks:
            if b.name == name:
                return b
        raise KeyError(f"no vocabulary block {name!r}; blocks: {', '.join(b.name for b in self.blocks)}")

    def start(self, name: str) -> int:
        return self.block(name).start

    def token(self, name: str) -> int:
        """The id of a one-token (special) block."""
        b = self.block(name)
        if b.size != 1:
            raise ValueError(f"vocabulary block {name!r} has {b.size} tokens, not one")
        return b.start

    def layout(self) -> dict[str, list[int]]:
        """{block name: [first id, last id + 1]} for every non-empty block (JSON-friendly)."""
        return {b.name: [b.start, b.stop] for b in self.blocks if b.size}

    def symbol(self, token: int) -> str:
        if token == IGNORE:
            return "."
        for b in self.blocks:
            if b.start <= token < b.stop:
                return b.symbol if b.size == 1 else f"{b.symbol}{token - b.start}"
        raise ValueError(f"token {token} is outside the vocabulary of size {self.size}")

    def render(self, tokens: Sequence[int] | np.ndarray) -> str:
        """One sequence as text, e.g. 'k3 v1 k0 v5'; IGNORE prints as '.'."""
        return " ".join(self.symbol(int(t)) for t in np.asarray(tokens).ravel())
