"""argparse value types: each turns one command-line word into a checked value or a usage error (exit 2).

The words of the evaluation settings are parsed where the settings are declared
(madsl.runner.plan.settings); `word_type` makes such a parser an argparse type."""
from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

from madsl.runner.plan import settings  # torch-free


def word_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """`parse` (a ValueError for a bad word) as an argparse type (a usage error naming the option)."""
    @functools.wraps(parse)
    def typed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return typed


positive_int = word_type(settings.positive_int_text)
seed = word_type(settings.seed_text)
non_negative_number = word_type(settings.non_negative_text)
lengths = word_type(settings.lengths_text)


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def positive_number(text: str) -> float:
    value = word_type(settings.finite_text)(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def device_list(text: str) -> list[str]:
    """Devices, comma-separated (cuda:0,cuda:1); each is checked when runs are placed."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):  # "cuda:0,,cuda:1" or a trailing comma: a device left out, not to be guessed
        raise argparse.ArgumentTypeError(f"an empty item in {text!r}: expected a device between every two commas")
    return names
