"""A Hugging Face `config.json`, read as untrusted input: its size, encoding, nesting and numbers
bounded before anything is built, then every value a family reads checked (type, range, finite)
and located by its JSON key (`Config`), with no line of a file that is not JSON ever shown. The
families that turn a config into a spec are in families.py.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

from madsl.errors import Location, MadslError
from madsl.interop.huggingface.shown import integer_hint, key_text, kind, look_alike, one_of, short, shown_value
from madsl.interop.megatron import describe_character
from madsl.lang import topology as topo
from madsl.lang.yamlsource import MAX_DEPTH, MAX_INTEGER, MAX_SPEC_BYTES

_REQUIRED = object()  # a key the config.json must state


class Config:
    """A config.json: its values, and where each top-level key is written (for located errors).

    Every value is read through one reader per kind of value (`count`, `layers`, `flag`,
    `number`, `word`, `words`, `pattern`), which checks its type (an integer is not a float, a
    bool or a string), its range (madsl's 64-bit integers, at most MAX_BLOCKS layers), that it is
    finite, and raises a MadslError located at its key otherwise."""

    def __init__(self, data: dict[str, Any], text: str, path: str):
        self.data, self.text, self.path = data, text, path
        self.keys = _top_level_keys(text)
        self.defaulted: dict[str, tuple[Any, str]] = {}  # key -> (value taken, why): listed with the spec
        self.notes: list[str] = []  # keys read as transformers' class reads them, said with the spec

    # The one policy for an absent key (families.py sets both from the family): a key in `defaults`
    # (transformers' config class default) is taken at it and listed in `defaulted`; any other is
    # refused by name. A reader given its own default takes and lists it the same way.
    defaults: dict[str, Any] = {}
    config_class = "config class"
    config_owner = "transformers'"  # whose class it is (RWKV-7's: flash-linear-attention's)

    def take_default(self, key: str, value: Any, why: str | None = None) -> Any:
        """`value` for the absent `key`, listed (in the top-level config, for a section's key)."""
        root, name = (self.parent, f"{self.parent_key}.{key}") if self.parent is not None else (self, key)
        root.defaulted[name] = (value, why or f"{root.config_owner} {root.config_class} default")
        return value

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        file = str(path)
        text = _read_text(file)
        too_deep = _too_deep(text)
        if too_deep is not None:
            raise MadslError(
                f"lists and objects are nested more than {MAX_DEPTH} deep",
                _position(file, text, too_deep),
                hint="a config.json is a flat object of settings",
            )
        try:
            data = json.loads(
                text,
                parse_int=_integer,
                parse_float=_Number,
                parse_constant=_Refused.constant,
                object_pairs_hook=_object,
            )
        except json.JSONDecodeError as err:  # the position only: never a line of a file that is not JSON
            raise MadslError(
                f"not valid JSON: {err.msg}",
                Location(file, err.lineno, err.colno),
                expected="a config.json (one JSON object)",
            ) from None
        except RecursionError:  # _too_deep bounds the nesting; this is the backstop
            raise MadslError(f"lists and objects are nested more than {MAX_DEPTH} deep", Location(file)) from None
        if not isinstance(data, dict):
            raise MadslError(
                f"a config.json holds one JSON object, not {kind(data)}",
                Location(file, 1, 1),
                expected='{"model_type": ..., ...}',
            )
        cfg = cls(data, text, file)
        first = next(_refused(data, ()), None)
        if first is not None:
            key_path, refused = first
            raise MadslError(f"{key_text(key_path)}: {refused.reason}", cfg.where(key_path[0]), hint=refused.hint)
        return cfg

    @classmethod
    def of(cls, data: dict[str, Any]) -> "Config":
        """A parsed config.json (located in its JSON text, where it has one)."""
        try:
            text = json.dumps(data, indent=2)
        except (TypeError, ValueError):  # values JSON does not write: errors name their keys, without a line
            text = ""
        return cls(data, text, "<config.json>")

    parent: "Config | None" = None  # the config a section (`section`) is nested in, and its key there
    parent_key = ""

    def where(self, key: str) -> Location:
        if self.parent is not None:  # a section's keys are located at the section's own key
            return self.parent.where(self.parent_key)
        start = self.keys.get(key)
        if start is None:
            return Location(self.path)
        line_start = self.text.rfind("\n", 0, start) + 1
        line_end = self.text.find("\n", start)
        line = self.text[line_start : line_end if line_end >= 0 else len(self.text)]
        return Location(
            self.path, self.text.count("\n", 0, start) + 1, start - line_start + 1, line, len(json.dumps(key))
        )

    def error(self, key: str, message: str, hint: str | None = None, index: int | None = None) -> MadslError:
        path = (key,) if index is None else (key, index)
        if self.parent is not None:
            path = (self.parent_key, *path)
        return MadslError(f"{key_text(path)}: {message}", self.where(key), hint=hint)

    # each family's title by model_type, for messages (families.py fills it from its families)
    family_titles: dict[str, str] = {}

    def family_name(self) -> str:
        model_type = self.data.get("model_type")
        return self.family_titles.get(model_type, "hybrid") if isinstance(model_type, str) else "hybrid"

    # ---- one reader per kind of value ----

    def _raw(self, key: str, default: Any) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _REQUIRED and key not in self.defaults:
            raise MadslError(
                f"missing key {json.dumps(key)}",
                Location(self.path),
                hint=f"a {self.family_name()} config.json states {json.dumps(key)}: madsl takes no default "
                "for a size that says which model it is",
            )
        return self.take_default(key, self.defaults[key] if default is _REQUIRED else default)

    def count(
        self, key: str, minimum: int = 1, maximum: int = MAX_INTEGER, default: Any = _REQUIRED, hint: str | None = None
    ) -> int:
        """An integer (not a bool, not a float such as 32.0 or 1e12) from `minimum` to `maximum`."""
        value = self._raw(key, default)
        if type(value) is not int or not minimum <= value <= maximum:
            what = (
                f"a positive integer at most {maximum:,}"
                if minimum == 1
                else f"an integer from {minimum:,} to {maximum:,}"
            )
            raise self.error(
                key, f"expected {what}, got {shown_value(value)}", hint or integer_hint(value, minimum, maximum)
            )
        return value

    def layers(self, key: str, per_block: int = 1) -> int:
        """A layer count: checked against madsl's limit on blocks before any list of layers is built."""
        return self.count(
            key,
            maximum=per_block * topo.MAX_BLOCKS,
            hint=f"madsl accounts stacks of at most {topo.MAX_BLOCKS:,} blocks"
            + (f" ({per_block} layers each)" if per_block > 1 else ""),
        )

    def flag(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self._raw(key, default)
        if type(value) is not bool:
            raise self.error(
                key, f"expected true or false, got {shown_value(value)}", "JSON's true and false, unquoted"
            )
        return value

    def number(self, key: str, default: Any = _REQUIRED, *, positive: bool) -> float:
        """A finite number (an integer or a float, not a bool), positive or at least 0."""
        value = self._raw(key, default)
        finite = (
            type(value) in (float, _Number) and math.isfinite(value) or type(value) is int and abs(value) <= MAX_INTEGER
        )
        if not finite or value < 0 or positive and value == 0:
            raise self.error(
                key,
                f"expected a {'positive' if positive else 'non-negative'} finite number, got {shown_value(value)}",
                'a JSON number such as 0.001 or 1e4 (NaN and Infinity are not finite, true and "1" are not numbers)',
            )
        return float(value)

    def word(self, key: str, choices: Any = None, default: Any = _REQUIRED) -> str:
        """A string; one of `choices` where they are given."""
        value = self._raw(key, default)
        if type(value) is not str:
            raise self.error(
                key,
                f"expected a string, got {shown_value(value)}",
                f"one of {one_of(choices)}" if choices is not None else "a JSON string, in double quotes",
            )
        if choices is not None and value not in choices:
            raise self.error(key, f"expected {one_of(choices)}, got {shown_value(value)}", look_alike(value))
        return value

    def words(self, key: str, choices: Any) -> list[str]:
        """A list of strings, each one of `choices` (Granite's layer_types)."""
        value = self._raw(key, _REQUIRED)
        if type(value) is not list:
            raise self.error(
                key, f"expected a list of strings, got {shown_value(value)}", f"one per layer, each {one_of(choices)}"
            )
        for i, item in enumerate(value):
            if type(item) is not str or item not in choices:
                raise self.error(
                    key,
                    f"layer {i + 1} is {shown_value(item)}; each layer is {one_of(choices)}",
                    look_alike(item) if type(item) is str else None,
                    index=i,
                )
        return value

    def integers(self, key: str, maximum: int) -> list[int]:
        """A list of distinct integers from 0 to maximum - 1 (Bamba's attn_layer_indices)."""
        value = self._raw(key, _REQUIRED)
        if type(value) is not list:
            raise self.error(
                key,
                f"expected a list of layer indices, got {shown_value(value)}",
                f"integers from 0 to {maximum - 1}, e.g. [9, 18, 27]",
            )
        for i, item in enumerate(value):
            if type(item) is not int or not 0 <= item < maximum:
                raise self.error(
                    key,
                    f"entry {i + 1} is {shown_value(item)}, not a layer index from 0 to {maximum - 1}",
                    "num_hidden_layers bounds the indices",
                    index=i,
                )
            if item in value[:i]:
                raise self.error(key, f"layer {item} is listed twice", "list each layer once", index=i)
        return value

    def section(self, key: str) -> "Config | None":
        """A nested object (Hugging Face's rope_parameters), read with the same readers; errors in it
        are located at its key. None where the key is absent or null."""
        value = self.data.get(key)  # absent or null alike: no section (nothing to list)
        if value is None:
            return None
        if type(value) is not dict:
            raise self.error(key, f"expected an object, got {shown_value(value)}", "a JSON object {...}, or null")
        nested = Config(value, "", self.path)
        nested.parent, nested.parent_key = self, key
        return nested

    def pattern(self, key: str, alphabet: str) -> str:
        """A string of characters from `alphabet` (ASCII): a look-alike letter is named by its code point."""
        value = self.word(key)
        for i, char in enumerate(value):
            if char not in alphabet:
                raise self.error(
                    key,
                    f"character {i + 1} is {describe_character(char)}, not a layer character",
                    f"each character is one of {' '.join(alphabet)}"
                    + (" (a look-alike of an ASCII letter?)" if not char.isascii() else ""),
                )
        return value


# ---- reading a config.json: its size, encoding, nesting and numbers bounded before anything is built ----

MAX_CONFIG_BYTES = MAX_SPEC_BYTES  # a config.json is a page of settings, as a spec is
_TOKEN = re.compile(r'["\[\]{}]')
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def _read_text(file: str) -> str:
    """The file's text: at most MAX_CONFIG_BYTES (one byte more is read, so /dev/zero ends), UTF-8."""
    try:
        with open(file, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except IsADirectoryError:
        raise MadslError(f"{file} is a directory", Location(file), hint="give its config.json") from None
    except OSError as err:
        raise MadslError(f"cannot read {file}: {err.strerror or type(err).__name__}", Location(file)) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise MadslError(
            f"{file} is larger than {MAX_CONFIG_BYTES // 1024} KiB; a config.json is at most that long",
            Location(file),
            hint="is this a config.json?",
        )
    try:
        if b"\0" in raw:  # UTF-16 without a byte-order mark decodes as "UTF-8" with a NUL in every other byte
            raise UnicodeError
        return raw.decode("utf-8-sig")
    except UnicodeError:
        raise MadslError(
            f"{file} is not UTF-8 JSON",
            Location(file),
            hint="a config.json is UTF-8 text (save it as UTF-8, not UTF-16)",
        ) from None


def _too_deep(text: str) -> int | None:
    """Where lists and objects first nest more than MAX_DEPTH deep (json's parser recurses), or None;
    one pass, skipping strings (an unterminated one ends the scan: json reports it)."""
    depth, pos = 0, 0
    while (token := _TOKEN.search(text, pos)) is not None:
        if token.group() == '"':
            rest = _STRING_REST.match(text, token.end())
            if rest is None:
                return None
            pos = rest.end()
            continue
        depth += 1 if token.group() in "[{" else -1
        if depth > MAX_DEPTH:
            return token.start()
        pos = token.end()
    return None


def _position(file: str, text: str, offset: int) -> Location:
    """A character offset as a line and column (without the line's text)."""
    line_start = text.rfind("\n", 0, offset) + 1
    return Location(file, text.count("\n", 0, offset) + 1, offset - line_start + 1)


class _Refused:
    """A JSON value madsl does not read anywhere in a config.json, kept in place by json's hooks so
    that the error names its key: integers past 64 bits, NaN and infinities, repeated keys."""

    def __init__(self, reason: str, hint: str):
        self.reason, self.hint = reason, hint

    @classmethod
    def constant(cls, literal: str) -> "_Refused":
        return cls(f"{literal} is not a finite number", "JSON has no NaN or Infinity; madsl reads finite numbers")


class _Number(float):
    """A JSON float that remembers how it was written (`got 1e12`, not `got 1000000000000.0`)."""

    def __new__(cls, literal: str) -> Any:
        value = float(literal)
        if not math.isfinite(value):  # 1e999
            return _Refused(f"{short(literal)} is not a finite number", "numbers are finite 64-bit floats")
        number = super().__new__(cls, value)
        number.literal = literal
        return number

    def __repr__(self) -> str:
        return self.literal


def _integer(literal: str) -> Any:
    digits = literal.lstrip("-")
    if len(digits) > len(str(MAX_INTEGER)) or int(literal) > MAX_INTEGER or int(literal) < -MAX_INTEGER:
        return _Refused(f"the integer {short(literal)} is too large", f"integers are at most {MAX_INTEGER:,} in size")
    return int(literal)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        data[key] = _Refused("the key is repeated", "keep one") if key in data else value
    return data


def _refused(value: Any, path: tuple) -> Iterator[tuple[tuple, _Refused]]:
    """(key path, _Refused) for each refused value, in the order written."""
    if isinstance(value, _Refused):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _refused(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _refused(item, path + (i,))


def _top_level_keys(text: str) -> dict[str, int]:
    """Where each top-level key of a JSON object is written (its last occurrence); {} if `text` is not one."""
    decoder = json.JSONDecoder(parse_int=str, parse_float=str, parse_constant=str)  # positions, not values
    found: dict[str, int] = {}
    space = re.compile(r"[ \t\n\r]*")
    try:
        pos = space.match(text, 0).end()
        if text[pos : pos + 1] != "{":
            return {}
        pos = space.match(text, pos + 1).end()
        while text[pos : pos + 1] == '"':
            key, end = json.decoder.scanstring(text, pos + 1)
            found[key] = pos
            pos = space.match(text, end).end() + 1  # past the colon
            _, pos = decoder.raw_decode(text, space.match(text, pos).end())
            pos = space.match(text, pos).end()
            if text[pos : pos + 1] != ",":
                break
            pos = space.match(text, pos + 1).end()
    except (ValueError, RecursionError):
        pass
    return found
