"""argparse value types: each turns one command-line word into a checked value or a usage error (exit 2).

The words of the evaluation settings and options are parsed where they are declared
(madsl.runner.plan.settings, madsl.runner.execute.options); `word_type` makes such a parser an
argparse type, and the commands' other options use the few below."""

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
positive_number = word_type(settings.positive_text)
seed = word_type(settings.seed_text)
lengths = word_type(settings.lengths_text)
