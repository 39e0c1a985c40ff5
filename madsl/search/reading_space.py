"""The `space:` section of a search file -> a checked `Space`: the sequence and channel mixers
allowed (each a symbol of the spec's symbol table, in its role), the block-count range, the
shapes, and the ranges of named hyperparameters; every error located in the file.

    space:
      sequence_mixers: [H, mH, A, mA, Mb, GDN, DN]
      channel_mixers: [Sg, MoE]            # default: the spec's channel_mixer
      blocks: {min: 2, max: 4}             # or one number
      shapes: [sequence, striped, motif, parallel]   # default: [sequence]
      hyperparameters:
        mA.heads: [8, 16]                  # choices
        H.order: {min: 2, max: 3}          # an integer range, both ends included
"""

from __future__ import annotations

import typing
from typing import Any

from madsl.errors import MadslError, did_you_mean
from madsl.lang import stdlib
from madsl.lang.declare import Where
from madsl.lang.topology.nodes import NO_CHANNEL
from madsl.lang.yamlsource import Located
from madsl.search.config import FILL, Hyperparameter, Space
from madsl.search.keys import SPACE


def read_space(located: Located, symbols: dict[str, Any], default_channel: str | None) -> Space:
    """The space section, checked against the symbol table `symbols` (stdlib + the file's layers:)."""
    # the keys and the shape of each value, as declared (madsl.search.keys); the symbols here
    section = located.data.get("space")
    values = SPACE.check(section, Where(located, ("space",)), "space")
    mixers = _symbols(located, symbols, "sequence_mixers", roles=("sequence", "both"))
    if not mixers:
        raise MadslError(
            "the space is empty: sequence_mixers lists no sequence mixer",
            located.value(("space", "sequence_mixers")),
            hint="list at least one, e.g. [H, mA]",
        )
    if "channel_mixers" in section:
        channels = _symbols(located, symbols, "channel_mixers", roles=("channel",), none_allowed=True)
    else:
        channels = (default_channel,) if default_channel else ()
    both = tuple(m for m in mixers if symbols[m].role() == "both")
    if not channels and len(both) < len(mixers):
        where = located.value(("space", "channel_mixers")) if "channel_mixers" in section else located.key(("space",))
        raise MadslError(
            "the space is empty: no channel mixer for the sequence mixers that need one",
            where,
            hint="list channel_mixers, e.g. [Sg, MoE] (or none)",
        )
    low, high = values["blocks"]
    shapes, parallel = _shapes(located, values.get("shapes", ("sequence",)), low, high, len(mixers))
    named = set(mixers) | (set(channels) - {NO_CHANNEL})  # the symbols a hyperparameter may belong to
    hyper = _hyperparameters(located, section.get("hyperparameters"), named, symbols)
    if "fill" in values:  # a gene like a hyperparameter's: drawn, moved and crossed over with them
        hyper += (Hyperparameter(FILL, "budget", "fill", choices=tuple(values["fill"])),)
    return Space(mixers, channels, both, low, high, shapes, parallel, hyper)


def _symbols(
    located: Located, symbols: dict[str, Any], key: str, roles: tuple[str, ...], none_allowed: bool = False
) -> tuple[str, ...]:
    value = located.data["space"][key]
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise MadslError(f"space.{key}: expected a list of layer symbols, got {value!r}", located.value(("space", key)))
    out: list[str] = []
    kind = "channel" if roles == ("channel",) else "sequence"
    for index, name in enumerate(items):
        at = located.value(("space", key, index) if not isinstance(value, str) else ("space", key))
        if none_allowed and name == NO_CHANNEL:
            symbol_role = "channel"
        elif not isinstance(name, str) or name not in symbols:
            wanted = sorted(s for s, d in symbols.items() if d.role() in roles)
            raise MadslError(
                f"space.{key}: unknown layer {name!r}",
                at,
                expected=f"a {kind} mixer: " + ", ".join(wanted),
                hint=did_you_mean(str(name), wanted) or "define it under layers: with primitive: or base:",
            )
        else:
            symbol_role = symbols[name].role()
        if symbol_role not in roles:
            home = "channel_mixers" if symbol_role == "channel" else "sequence_mixers"
            raise MadslError(
                f"space.{key}: {name} is a {symbol_role} mixer, not a {kind} mixer",
                at,
                hint=f"list it under space.{home}",
            )
        if name in out:
            raise MadslError(f"space.{key}: {name} is given twice", at, hint="list each symbol once")
        out.append(name)
    return tuple(out)


def _shapes(located: Located, items: tuple[str, ...], low: int, high: int, mixers: int) -> tuple[tuple[str, ...], bool]:
    """The shapes (known and listed once, as declared), each possible with the blocks and mixers of the space."""
    value = located.data["space"].get("shapes")
    where = located.value(("space", "shapes"))
    probe = Space(("X",), ("Y",), (), low, high, (), False)
    for index, shape in enumerate(items):
        at = located.value(("space", "shapes", index)) if isinstance(value, list) else where
        if shape == "parallel" and mixers < 2:
            raise MadslError("space.shapes: parallel blocks need two sequence mixers, and the space has one", at)
        if shape != "parallel" and not probe.sizes(shape):
            need = "at least 3 blocks (a period of 2 and more)" if shape == "striped" else "at least 2 blocks"
            raise MadslError(
                f"space.shapes: a {shape} needs {need}, and blocks.max is {high}",
                at,
                hint="raise blocks.max, or drop the shape",
            )
    structural = tuple(s for s in items if s != "parallel")
    if not structural:
        raise MadslError(
            "space.shapes: parallel is a kind of block; list a shape too (sequence, striped, motif)", where
        )
    return structural, "parallel" in items


def _hyperparameters(
    located: Located, section: Any, allowed: set[str], symbols: dict[str, Any]
) -> tuple[Hyperparameter, ...]:
    if section is None:
        return ()
    out = []
    for name, value in section.items():
        at_key = located.key(("space", "hyperparameters", name))
        symbol, _, param = str(name).partition(".")
        if not param or symbol not in allowed:
            raise MadslError(
                f"space.hyperparameters: {name!r} is not SYMBOL.param of a symbol of the space",
                at_key,
                expected="a mixer of the space: " + ", ".join(sorted(allowed)),
                hint=did_you_mean(symbol, allowed),
            )
        fields = stdlib.primitives()[symbols[symbol].primitive].cls.fields()
        if param not in fields:
            raise MadslError(
                f"space.hyperparameters: {symbol} ({symbols[symbol].primitive}) has no parameter {param!r}",
                at_key,
                expected=", ".join(fields),
                hint=did_you_mean(param, fields),
            )
        out.append(_values(located, str(name), symbol, param, value, fields[param]))
    return tuple(out)


def _values(located: Located, name: str, symbol: str, param: str, value: Any, annotation: Any) -> Hyperparameter:
    path = ("space", "hyperparameters", name)
    if isinstance(value, list):
        if not value:
            raise MadslError(
                f"space.hyperparameters.{name}: the list is empty", located.value(path), expected="at least one value"
            )
        seen = set()  # (type, value): 1, 1.0 and true are three values; a set keeps a long list linear
        for index, item in enumerate(value):
            if isinstance(item, (list, dict)):
                raise MadslError(
                    f"space.hyperparameters.{name}: expected a value, got {item!r}", located.value(path + (index,))
                )
            if (type(item), item) in seen:
                raise MadslError(
                    f"space.hyperparameters.{name}: {item!r} is given twice",
                    located.value(path + (index,)),
                    hint="list each value once",
                )
            seen.add((type(item), item))
        return Hyperparameter(name, symbol, param, choices=tuple(value))
    if not isinstance(value, dict) or set(value) != {"min", "max"}:
        raise MadslError(
            f"space.hyperparameters.{name}: expected a list of values or {{min: N, max: M}}, got {value!r}",
            located.value(path),
            hint=f"{name}: [4, 8, 16], or {name}: {{min: 2, max: 8}}",
        )
    options = typing.get_args(annotation) or (annotation,)
    for key in ("min", "max"):
        number = value[key]
        if isinstance(number, bool) or not isinstance(number, int):
            raise MadslError(
                f"space.hyperparameters.{name}.{key}: a range is of integers, got {number!r}",
                located.value(path + (key,)),
                hint="list the values instead: [0.5, 1.0]",
            )
    if int not in options:
        raise MadslError(
            f"space.hyperparameters.{name}: {param} is not an integer parameter; list its values",
            located.value(path),
            hint=f"{name}: [...]",
        )
    if value["min"] > value["max"]:
        raise MadslError(
            f"space.hyperparameters.{name}: min {value['min']} is larger than max {value['max']}", located.value(path)
        )
    return Hyperparameter(name, symbol, param, low=value["min"], high=value["max"])
