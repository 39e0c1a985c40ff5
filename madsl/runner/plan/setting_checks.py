"""The checks of a setting's value as written (a spec's eval:, a sweep file's train:, a Python
call): `Where` it is written, for located errors, and the general checks the settings table
(madsl.runner.plan.settings) is made of: numbers, names, a choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from madsl.errors import Location, MadslError, did_you_mean


class Where:
    """Where the parts of a setting's value are written, for located errors: `value(*path)` is
    the location of the value at `path` below the setting's key (an item of a list: its index);
    `key(*path)` that of a key. Without a source (a Python call), no location."""

    def __init__(self, find: Callable[[str, tuple], Location | None] | None = None, file: str | None = None):
        self._find, self.file = find, file

    def value(self, *path: Any) -> Location | None:
        return self._locate("value", path)

    def key(self, *path: Any) -> Location | None:
        return self._locate("key", path)

    def _locate(self, part: str, path: tuple) -> Location | None:
        if self._find is not None:
            found = self._find(part, path)
            if found is not None:
                return found
        return Location(file=self.file) if self.file else None


def as_number(value: Any) -> Any:
    """YAML 1.1 reads 1e-3 as a string: a string that is a number is that number."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def numbers(
    kind: type,
    *,
    minimum: float,
    inclusive: bool,
    maximum: float = math.inf,
    single: bool = False,
    unit: str = "",
    empty: bool = False,
) -> Callable[[Any, Where, str], Any]:
    """A check: a number (or with `single` False a list of them) of `kind`, each finite, >= (or >)
    `minimum` and <= `maximum`, no value twice; errors at the item. One value -> that value when
    `single`, else a tuple; an empty list is an error unless `empty` (then: none)."""
    wanted = ("a number" if kind is float else "an integer") + ("" if single else " or a list of them")

    def check(value: Any, where: Where, source: str) -> Any:
        items = value if isinstance(value, (list, tuple)) else [value]
        if single and isinstance(value, (list, tuple)):
            raise MadslError(f"{source}: expected {wanted}, got {value!r}", where.value())
        if not items and not (empty and not single):
            raise MadslError(f"{source}: the list is empty", where.value(), expected=wanted)
        out: list = []
        for index, item in enumerate(items):
            at = where.value(index) if isinstance(value, (list, tuple)) else where.value()
            if kind is float:
                item = as_number(item)
            if isinstance(item, bool) or not isinstance(item, (int, float) if kind is float else int):
                raise MadslError(f"{source}: expected {wanted}, got {item!r}", at)
            item = kind(item)
            if not math.isfinite(item):
                raise MadslError(f"{source}: expected a finite number, got {item!r}", at)
            if item < minimum or (item == minimum and not inclusive):
                bound = f"at least {minimum:g}" if inclusive else f"greater than {minimum:g}"
                raise MadslError(
                    f"{source}: expected {'a number' if kind is float else 'an integer'} {bound}{unit}, got {item!r}",
                    at,
                )
            if item > maximum:
                raise MadslError(f"{source}: expected at most {maximum:,}{unit}, got {item!r}", at)
            if item in out:  # planned once either way: a repeat is a slip, not a second run
                raise MadslError(f"{source}: {item!r} is given twice", at, hint="list each value once")
            out.append(item)
        return out[0] if single else tuple(out)

    return check


def names(what: str, unique: bool = False) -> Callable[[Any, Where, str], tuple[str, ...]]:
    """A check: a name or a list of names (non-empty strings; with `unique`, none twice); errors at
    the item."""

    def check(value: Any, where: Where, source: str) -> tuple[str, ...]:
        items = value if isinstance(value, (list, tuple)) else [value]
        if not items:
            raise MadslError(f"{source}: the list is empty", where.value(), expected=what)
        for index, name in enumerate(items):
            at = where.value(index) if isinstance(value, (list, tuple)) else where.value()
            if not isinstance(name, str) or not name:
                raise MadslError(f"{source}: expected {what}, got {name!r}", at)
            if unique and name in items[:index]:
                raise MadslError(f"{source}: {name!r} is given twice", at, hint="give each value once")
        return tuple(items)

    return check


def choice(options: tuple[str, ...], what: str, meaning: str = "") -> Callable[[Any, Where, str], str]:
    """A check: one of `options` (`what` names the setting in messages, `meaning` says what each
    option does where no option is near the value given)."""

    def check(value: Any, where: Where, source: str) -> str:
        if value not in options:
            raise MadslError(
                f"{source}: unknown {what} {value!r}",
                where.value(),
                expected=" or ".join(options),
                hint=did_you_mean(str(value), options) or meaning or None,
            )
        return str(value)

    return check
