"""How a config.json's values and keys are shown in errors (config.py's readers): a key path as JSON
writes it, a value without its content where it is a list or an object, a look-alike letter named
by its code point."""

from __future__ import annotations

import json
from typing import Any

from madsl.interop.megatron import describe_character


def key_text(path: tuple) -> str:
    """A key path as JSON writes it: "layer_types"[3], "rope_parameters"."rope_theta"."""
    return "".join(
        f"[{part}]" if isinstance(part, int) else ("." if i else "") + json.dumps(part) for i, part in enumerate(path)
    )


def short(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text):,} characters)"


def shown_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int) and value.bit_length() > 64:  # repr of a huge int is slow, or refused
        return f"an integer of {value.bit_length():,} bits"
    if isinstance(value, (int, float)):
        return short(repr(value))
    if isinstance(value, str):
        return short(json.dumps(value, ensure_ascii=False)) if value.isprintable() else short(json.dumps(value))
    return kind(value)


def kind(value: Any) -> str:
    """What a JSON value is, without its content."""
    if isinstance(value, bool) or value is None:
        return "true, false or null"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), "a number")


def one_of(choices: Any) -> str:
    names = [json.dumps(c) for c in choices]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def look_alike(text: str) -> str | None:
    """A hint naming the first non-ASCII character of a string that should be an ASCII word."""
    for i, char in enumerate(text):
        if not char.isascii():
            return f"character {i + 1} is {describe_character(char)}, not ASCII: a look-alike letter?"
    return None


def integer_hint(value: Any, minimum: int, maximum: int) -> str:
    if isinstance(value, bool):
        return "true and false are not numbers"
    if isinstance(value, (int, float)) and value > maximum:
        return f"madsl's integers are at most {maximum:,} (64 bits), as in a spec"
    if isinstance(value, float):
        return "write an integer, without a fraction or an exponent"
    if isinstance(value, int):
        return "a count or a size is at least 1" if minimum == 1 else f"the least is {minimum}"
    return "a JSON integer, unquoted"
