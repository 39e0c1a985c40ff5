"""argparse value types: each turns one command-line word into a checked value or a usage error (exit 2)."""
from __future__ import annotations

import argparse
import math

from madsl.runner.options import MAX_SEED  # torch-free


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def seed(text: str) -> int:
    """A seed of data, init and order: an integer from 0 to 2^32 - 1."""
    value = non_negative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to {MAX_SEED:,} (2^32 - 1), got {value}")
    return value


def _finite_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


def non_negative_number(text: str) -> float:
    value = _finite_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text}")
    return value


def positive_number(text: str) -> float:
    value = _finite_number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def lengths(text: str) -> list[int]:
    """Sequence lengths: a comma-separated list (64,128,256), a range of powers of two
    (64..1048576: 64, 128, ..., 1048576), or both (32,64..256)."""
    values: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:  # "64,,128" or a trailing comma: a length left out, not to be guessed
            raise argparse.ArgumentTypeError(f"an empty item in {text!r}: expected a length between every two commas")
        low, dots, high = part.partition("..")
        try:
            first, last = int(low), int(high) if dots else int(low)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected lengths such as 64,128,256 or a range of powers of two such as 64..1048576, "
                f"got {text!r}") from None
        if first <= 0 or last <= 0:
            raise argparse.ArgumentTypeError(f"expected positive lengths, got {text!r}")
        if dots:
            if first & (first - 1) or last & (last - 1) or last < first:
                raise argparse.ArgumentTypeError(
                    f"a range {part!r} runs over powers of two: both ends powers of two, the first not larger")
            values += [1 << e for e in range(first.bit_length() - 1, last.bit_length())]
        else:
            values.append(first)
    if not values:
        raise argparse.ArgumentTypeError(f"expected positive lengths, got {text!r}")
    return values



def device_list(text: str) -> list[str]:
    """Devices, comma-separated (cuda:0,cuda:1); each is checked when runs are placed."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):  # "cuda:0,,cuda:1" or a trailing comma: a device left out, not to be guessed
        raise argparse.ArgumentTypeError(f"an empty item in {text!r}: expected a device between every two commas")
    return names
