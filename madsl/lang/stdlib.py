"""The standard layer library, loaded from `stdlib/` (data, not code).

`primitives.yaml` maps each primitive name to the class that does its
accounting and gives every hyperparameter's default with its provenance;
`symbols.yaml` maps the symbols of the MAD paper to primitives. Registration is
by these files alone: adding a primitive means adding a file under
madsl/primitives/ and madsl/layers/ and an entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import yaml

from madsl.primitives.base import Primitive, WidthRelative
from madsl.resources import stdlib_dir


@dataclass(frozen=True)
class PrimitiveEntry:
    name: str
    cls: type[Primitive]
    defaults: dict[str, Any]
    source: str


@dataclass(frozen=True)
class SymbolEntry:
    symbol: str
    primitive: str
    params: dict[str, Any] = field(default_factory=dict)
    source: str = ""


@cache
def primitives() -> dict[str, PrimitiveEntry]:
    data = yaml.safe_load((stdlib_dir() / "primitives.yaml").read_text(encoding="utf-8"))
    out = {}
    for name, entry in data.items():
        module_name, _, class_name = entry["class"].partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        missing = set(cls.fields()) - set(entry["defaults"])
        extra = set(entry["defaults"]) - set(cls.fields())
        if missing or extra:  # the stdlib and the code must agree; a packaging bug, not user input
            raise RuntimeError(
                f"stdlib/primitives.yaml: {name}: missing defaults {sorted(missing)}, unknown {sorted(extra)}"
            )
        out[name] = PrimitiveEntry(name, cls, _width_relative(entry["defaults"]), entry.get("source", ""))
    return out


def primitive(name: str, dim: int, **params: Any) -> Primitive:
    """The primitive `name` at width `dim`: its stdlib defaults with `params` over them,
    validated (ConfigError otherwise). `.build()` gives its torch module, e.g.
    `primitive("mamba", 64, d_state=16).build()`."""
    entry = primitives()[name]
    return entry.cls.create(dim, {**entry.defaults, **params})


@cache
def symbols() -> dict[str, SymbolEntry]:
    data = yaml.safe_load((stdlib_dir() / "symbols.yaml").read_text(encoding="utf-8"))
    return {
        sym: SymbolEntry(sym, e["primitive"], _width_relative(e.get("params") or {}), e.get("source", ""))
        for sym, e in data.items()
    }


def _width_relative(values: dict[str, Any]) -> dict[str, Any]:
    """The stdlib's `K * dim` / `dim / K` strings as WidthRelative (resolved once the width is known)."""
    return {k: (WidthRelative.parse(v) or v) if isinstance(v, str) else v for k, v in values.items()}
