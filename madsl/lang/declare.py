"""The configuration language: every key of every file madsl reads besides a spec's own fields is
declared once, and read, checked and described from that declaration.

    Kind        what a value may be: a number (bounds, integer or not, one or a list), names, a
                choice, text, or a check of its own; it checks a value as written, with a located
                error, and says its JSON Schema
    Key         one key: its name, its Kind, its help, its default and whether it enters the
                identity of what it configures
    Section     a mapping of declared keys (a study's `recipe:`, a search's `algorithm:`): it reads
                one with every problem located (an unknown key at the key, with the nearest known
                one; a missing required key; a bad value at the value) and says its JSON Schema

A file kind's reader (madsl.runner.plan.sweep, madsl.scaling.study, madsl.search.reading, a
spec's `eval:` by madsl.runner.plan.settings) is its sections read in order, and its schema
(`madsl schema --kind ...`) the same sections' schemas: a key added to a section is read,
checked and in the schema at once. Numbers are read as YAML 1.2 reads them (madsl.lang.yamlsource:
`1e-3` is a number). Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from madsl.errors import Location, MadslError, did_you_mean


class Where:
    """Where a value and the parts below it are written, for located errors. `places` is what
    knows the file's places by key path (a `Located`, a spec's source map: `.key(path)` and
    `.value(path)`), `path` the value's own key path; without places (a Python call), the file
    alone, or nothing."""

    def __init__(self, places: Any = None, path: tuple = (), file: str | None = None):
        self.places, self.path, self.file = places, tuple(path), file

    def below(self, *keys: Any) -> "Where":
        return Where(self.places, self.path + keys, self.file)

    def value(self, *below: Any) -> Location | None:
        return self._locate("value", below)

    def key(self, *below: Any) -> Location | None:
        return self._locate("key", below)

    def _locate(self, part: str, below: tuple) -> Location | None:
        if self.places is not None:
            try:
                found = getattr(self.places, part)(self.path + below)
            except (KeyError, AttributeError, TypeError):
                found = None
            if found is not None:
                return found
        return Location(file=self.file) if self.file else None


class Kind:
    """What a value may be: `check` returns the value as madsl uses it or raises a MadslError
    located at `where`, naming the value by `source`; `schema` is its JSON Schema."""

    def check(self, value: Any, where: Where, source: str) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


def _items(value: Any, many: bool, where: Where) -> list[tuple[Any, Location | None]]:
    """The items of a value that may be one item or (with `many`) a list of them, each with its place."""
    if many and isinstance(value, (list, tuple)):
        return [(item, where.value(index)) for index, item in enumerate(value)]
    return [(value, where.value())]


def _one_or_list(item: dict[str, Any], many: bool, empty: bool = False) -> dict[str, Any]:
    if not many:
        return item
    return {"anyOf": [item, {"type": "array", "items": item, "minItems": 0 if empty else 1}]}


@dataclass(frozen=True)
class Number(Kind):
    """A finite number (an integer with `integer`; a whole float such as 1e5 is that integer, as
    JSON Schema counts it), from `minimum` (`inclusive` or not) to `maximum` (`below` it, or up
    to it); with `many` one or a list of them, none twice (a tuple; `empty`: the list may be)."""

    integer: bool = False
    minimum: float = -math.inf
    inclusive: bool = True
    maximum: float = math.inf
    below: bool = False  # the maximum itself excluded
    many: bool = False
    empty: bool = False
    hint: str | None = None
    unit: str = ""  # what is counted, after the noun: " of seconds"

    @property
    def wanted(self) -> str:
        return ("an integer" if self.integer else "a number") + (" or a list of them" if self.many else "")

    def check(self, value: Any, where: Where, source: str) -> Any:
        if not self.many and isinstance(value, (list, tuple)):
            raise MadslError(f"{source}: expected {self.wanted}, got {value!r}", where.value(), hint=self.hint)
        items = _items(value, self.many, where)
        if self.many and isinstance(value, (list, tuple)) and not value and not self.empty:
            raise MadslError(f"{source}: the list is empty", where.value(), expected=self.wanted)
        out: list = []
        for item, at in items:
            number = self._number(item, at, source)
            if number in out:  # planned once either way: a repeat is a slip, not a second run
                raise MadslError(f"{source}: {number!r} is given twice", at, hint="list each value once")
            out.append(number)
        return tuple(out) if self.many else out[0]

    def _number(self, item: Any, at: Location | None, source: str) -> int | float:
        one = "an integer" if self.integer else "a number"
        whole = isinstance(item, float) and math.isfinite(item) and item.is_integer()
        if (
            isinstance(item, bool)
            or not isinstance(item, (int, float))
            or (self.integer and isinstance(item, float) and not whole)
        ):
            raise MadslError(f"{source}: expected {self.wanted}, got {item!r}", at, hint=self.hint)
        if not math.isfinite(item):
            raise MadslError(f"{source}: expected a finite number, got {item!r}", at, hint=self.hint)
        number = int(item) if self.integer else float(item)
        if number < self.minimum or (number == self.minimum and not self.inclusive):
            if self.minimum == 0:
                wanted = f"a {'non-negative' if self.inclusive else 'positive'} {one.split()[-1]}"
            else:
                wanted = f"{one} {'at least' if self.inclusive else 'greater than'} {self.minimum:g}"
            raise MadslError(f"{source}: expected {wanted}{self.unit}, got {item!r}", at, hint=self.hint)
        if number > self.maximum or (number == self.maximum and self.below):
            bound = f"below {self.maximum:g}" if self.below else f"at most {self.maximum:,}"
            raise MadslError(f"{source}: expected {one} {bound}{self.unit}, got {item!r}", at, hint=self.hint)
        return number

    def schema(self) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "integer" if self.integer else "number"}
        if math.isfinite(self.minimum):
            item["minimum" if self.inclusive else "exclusiveMinimum"] = self.minimum
        if math.isfinite(self.maximum):
            item["exclusiveMaximum" if self.below else "maximum"] = self.maximum
        return _one_or_list(item, self.many, self.empty)


@dataclass(frozen=True)
class Names(Kind):
    """A name (a non-empty string) or a list of them (a tuple; `unique`: none twice)."""

    what: str
    unique: bool = False
    choices: tuple[str, ...] = ()  # the names known (empty: any name)
    item: str = "name"  # what one of them is, in messages ("unknown shape 'spiral'")

    def check(self, value: Any, where: Where, source: str) -> tuple[str, ...]:
        if isinstance(value, (list, tuple)) and not value:
            raise MadslError(f"{source}: the list is empty", where.value(), expected=self.what)
        out: list[str] = []
        for name, at in _items(value, True, where):
            if not isinstance(name, str) or not name:
                raise MadslError(f"{source}: expected {self.what}, got {name!r}", at)
            if self.choices and name not in self.choices:
                raise MadslError(
                    f"{source}: unknown {self.item} {name!r}",
                    at,
                    expected=", ".join(self.choices),
                    hint=did_you_mean(name, self.choices),
                )
            if self.unique and name in out:
                raise MadslError(f"{source}: {name!r} is given twice", at, hint="give each value once")
            out.append(name)
        return tuple(out)

    def schema(self) -> dict[str, Any]:
        item = {"enum": list(self.choices)} if self.choices else {"type": "string", "minLength": 1}
        array = {"type": "array", "items": item, "minItems": 1, **({"uniqueItems": True} if self.unique else {})}
        return {"anyOf": [item, array]}


@dataclass(frozen=True)
class Choice(Kind):
    """One of `options`; `what` names the value in messages, `meaning` says what each option does."""

    options: tuple[Any, ...]
    what: str
    meaning: str = ""

    def check(self, value: Any, where: Where, source: str) -> Any:
        if isinstance(value, bool) or value not in self.options:
            raise MadslError(
                f"{source}: unknown {self.what} {value!r}",
                where.value(),
                expected=" or ".join(map(str, self.options)),
                hint=did_you_mean(str(value), [str(o) for o in self.options]) or self.meaning or None,
            )
        return value

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.options)}


@dataclass(frozen=True)
class Flag(Kind):
    """true or false."""

    def check(self, value: Any, where: Where, source: str) -> bool:
        if not isinstance(value, bool):
            raise MadslError(f"{source}: expected true or false, got {value!r}", where.value())
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class Text(Kind):
    """Text that is not blank."""

    what: str = "text"

    def check(self, value: Any, where: Where, source: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise MadslError(f"{source}: expected {self.what} (a non-empty string), got {value!r}", where.value())
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": r"\S"}


@dataclass(frozen=True)
class Either(Kind):
    """One of several kinds, tried in order; the error is `message` (with `hint`)."""

    kinds: tuple[Kind, ...]
    message: str
    hint: str | None = None

    def check(self, value: Any, where: Where, source: str) -> Any:
        for kind in self.kinds:
            try:
                return kind.check(value, where, source)
            except MadslError:
                pass
        raise MadslError(f"{source}: {self.message}, got {value!r}", where.value(), hint=self.hint)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [kind.schema() for kind in self.kinds]}


@dataclass(frozen=True)
class Custom(Kind):
    """A value with a check of its own (`check(value, where, source)`) and the schema given."""

    checker: Callable[[Any, Where, str], Any]
    shape: Mapping[str, Any]

    def check(self, value: Any, where: Where, source: str) -> Any:
        return self.checker(value, where, source)

    def schema(self) -> dict[str, Any]:
        return dict(self.shape)


REQUIRED = object()  # the default of a key that must be given


@dataclass(frozen=True)
class Key:
    """One key of a section: what its value may be, what it means, its default (REQUIRED: it
    must be given; None: none), whether it enters the identity of what it configures."""

    name: str
    kind: Kind
    help: str
    default: Any = None
    identity: bool = False

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def schema(self) -> dict[str, Any]:
        out = {**self.kind.schema(), "description": self.help}
        if self.default is not None and self.default is not REQUIRED and _json_value(self.default):
            out["default"] = self.default
        return out


def _json_value(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and not (isinstance(value, float) and not math.isfinite(value))


@dataclass(frozen=True)
class Section(Kind):
    """A mapping of declared keys. `what` names it in messages ("the recipe"); `exactly_one`:
    groups of keys of which one must be given; `refused`: keys named with why they are not
    keys here; `open`: further keys read by another reader (a search file's spec fields)."""

    what: str
    keys: tuple[Key, ...]
    description: str = ""
    exactly_one: tuple[tuple[str, ...], ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)
    open: tuple[str, ...] = ()

    @property
    def by_name(self) -> dict[str, Key]:
        return {key.name: key for key in self.keys}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(key.name for key in self.keys) + self.open

    def check(self, value: Any, where: Where, source: str) -> dict[str, Any]:
        """The keys given, each value checked (a None section is an empty one); keys in `open` are
        passed on as written."""
        value = self.check_keys(value, where, source)
        return {name: self.check_value(name, item, where, source) for name, item in value.items()}

    def check_keys(self, value: Any, where: Where, source: str = "") -> Mapping[str, Any]:
        """The section's keys checked, not their values: it is a mapping, every key known, the
        required ones given (a None section is an empty one)."""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise MadslError(
                f"{source or self.what}: expected a mapping, got {type(value).__name__}",
                where.value(),
                expected=", ".join(self.names),
            )
        known = self.by_name
        for name in value:
            if name in self.refused:
                raise MadslError(f"{name}: {self.refused[name]}", where.key(name), expected=", ".join(self.names))
            if name not in known and name not in self.open:
                raise MadslError(
                    f"unknown key {name!r} in {self.what}",
                    where.key(name),
                    expected=", ".join(self.names),
                    hint=did_you_mean(str(name), self.names),
                )
        for key in self.keys:
            if key.required and key.name not in value:
                raise MadslError(
                    f"{self.what} needs {key.name}: ({key.help})", where.key() or where.value(), expected=key.name
                )
        for group in self.exactly_one:
            given = [name for name in group if name in value]
            if len(given) != 1:
                raise MadslError(
                    f"{self.what} gives one of {' or '.join(group)}, not {'both' if given else 'neither'}",
                    where.value(),
                    hint="; ".join(f"{name}: {known[name].help}" for name in group),
                )
        return value

    def check_value(self, name: str, value: Any, where: Where, source: str = "") -> Any:
        """The value of key `name` of this section, checked (a key in `open`: as written)."""
        key = self.by_name.get(name)
        if key is None:
            return value
        return key.kind.check(value, where.below(name), f"{source}.{name}" if source else str(name))

    def adding(self, key: Key, below: tuple[str, ...] = ()) -> "Section":
        """This section with one more key (in the section `below` names: ("recipe",))."""
        if below:
            inner = self.by_name[below[0]]
            key = Key(inner.name, inner.kind.adding(key, below[1:]), inner.help, inner.default, inner.identity)
            keys = tuple(key if k.name == inner.name else k for k in self.keys)
        else:
            keys = (*self.keys, key)
        return dataclasses.replace(self, keys=keys)

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "object",
            "properties": {key.name: key.schema() for key in self.keys},
            "additionalProperties": False,
        }
        if self.description:
            out["description"] = self.description
        required = [key.name for key in self.keys if key.required]
        if required:
            out["required"] = required
        for group in self.exactly_one:
            out.setdefault("allOf", []).append({"oneOf": [{"required": [name]} for name in group]})
        return out
