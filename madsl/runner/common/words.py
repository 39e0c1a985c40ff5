"""Command-line words: each reads one word of the command line as its option's value, or raises
the ValueError argparse turns into a usage error. Shared by the option tables of what runs train
(madsl.runner.plan.settings) and how they execute (madsl.runner.execute.options).
"""

from __future__ import annotations

import math
from typing import Any

from madsl.runner.common.choices import MAX_SEED


def _word(text: str, kind: type, expected: str) -> Any:
    """`text` read as an int or a float, or a ValueError saying what was expected."""
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"expected {expected}, got {text!r}") from None


def _require(ok: bool, expected: str, shown: Any) -> None:
    if not ok:
        raise ValueError(f"expected {expected}, got {shown}")


def positive_int_text(text: str) -> int:
    value = _word(text, int, "a positive integer")
    _require(value > 0, "a positive integer", value)
    return value


def finite_text(text: str) -> float:
    value = _word(text, float, "a number")
    _require(math.isfinite(value), "a finite number", text)
    return value


def non_negative_text(text: str) -> float:
    value = finite_text(text)
    _require(value >= 0, "a non-negative number", text)
    return value


def positive_text(text: str) -> float:
    value = finite_text(text)
    _require(value > 0, "a positive number", text)
    return value


def seed_text(text: str) -> int:
    """A seed of data, init and order: an integer from 0 to 2^32 - 1."""
    value = _word(text, int, "an integer")
    _require(value >= 0, "a non-negative integer", value)
    _require(value <= MAX_SEED, f"a seed from 0 to {MAX_SEED:,} (2^32 - 1)", value)
    return value


def lengths_text(text: str) -> list[int]:
    """Sequence lengths: a comma-separated list (64,128,256), a range of powers of two
    (64..1048576: 64, 128, ..., 1048576), or both (32,64..256)."""
    values: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:  # "64,,128" or a trailing comma: a length left out, not to be guessed
            raise ValueError(f"an empty item in {text!r}: expected a length between every two commas")
        low, dots, high = part.partition("..")
        try:
            first, last = int(low), int(high) if dots else int(low)
        except ValueError:
            raise ValueError(
                f"expected lengths such as 64,128,256 or a range of powers of two such as 64..1048576, got {text!r}"
            ) from None
        if first <= 0 or last <= 0:
            raise ValueError(f"expected positive lengths, got {text!r}")
        if dots:
            if first & (first - 1) or last & (last - 1) or last < first:
                raise ValueError(
                    f"a range {part!r} runs over powers of two: both ends powers of two, the first not larger"
                )
            values += [1 << e for e in range(first.bit_length() - 1, last.bit_length())]
        else:
            values.append(first)
    if not values:
        raise ValueError(f"expected positive lengths, got {text!r}")
    return values
