"""A spec's symbol table: what each layer symbol means (a primitive and its parameters).

It starts from the stdlib's symbols (stdlib/symbols.yaml) with their primitives'
defaults; a spec's `layers:` section overrides parameters of a symbol, re-points it
at another primitive (`primitive:`), or defines a new one (`primitive:` or `base:`).
Parameter values are checked later, when a layer occurrence is resolved
(`Spec.primitive_for`), because topology overrides such as `A{heads=4}` apply on top.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from madsl.errors import Collector, Location, MadslError, did_you_mean
from madsl.lang import stdlib
from madsl.lang import topology as topo
from madsl.lang.spec.files import Locator

SYMBOL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class SymbolDef:
    """What a symbol means in one spec: a primitive and its parameters (defaults applied)."""

    symbol: str
    primitive: str
    params: dict[str, Any]
    source: str  # provenance of the defaults, or "spec" for spec-defined symbols
    # where each parameter was last set in a spec file (for errors), by key
    where: dict[str, Location] = field(default_factory=dict, compare=False)

    def role(self) -> str:
        return stdlib.primitives()[self.primitive].cls.role


def symbol_table(layers: dict, at: Locator, errors: Collector) -> tuple[dict[str, SymbolDef], set[str]]:
    """The stdlib's symbols with the spec's `layers:` section applied, and the symbols whose
    entry has an error (each error goes to `errors`; a symbol based on a broken one is broken
    too, without an error of its own). A broken symbol is in the table only where its entry
    names its primitive and just some parameters are unknown (then which parameters exist is
    still known; their values are not checked against it)."""
    prims = stdlib.primitives()
    table: dict[str, SymbolDef] = {}
    for sym, entry in stdlib.symbols().items():
        params = {**prims[entry.primitive].defaults, **entry.params}
        table[sym] = SymbolDef(sym, entry.primitive, params, entry.source or prims[entry.primitive].source)

    broken: set[str] = set()
    pending = dict(layers)
    # symbols may be based on each other in any order; resolve until nothing changes
    while pending:
        progressed = False
        for sym in list(pending):
            body = pending[sym]
            base_sym = body.get("base") if isinstance(body, dict) else None
            if not isinstance(base_sym, str):
                base_sym = None  # no base, or a bad one (_symbol_def reports it)
            if base_sym is not None and base_sym in pending and base_sym != sym:
                continue  # resolve the base first
            del pending[sym]
            progressed = True
            if base_sym in broken:
                broken.add(sym)
                continue
            unknown = Collector()
            try:
                # with unknown parameters left out: its primitive still tells which parameters exist
                table[sym] = _symbol_def(sym, body, table, at, unknown)
            except MadslError as err:
                unknown.add(err)
                table.pop(sym, None)
            if unknown:
                errors.errors += unknown.errors
                broken.add(str(sym))
        if not progressed:
            sym = next(iter(pending))
            errors.add(
                MadslError(
                    f"layers.{sym}: `base:` symbols form a cycle ({', '.join(map(str, pending))})",
                    at.value("layers", sym, "base"),
                )
            )
            broken |= set(map(str, pending))
            break
    return table, broken


def _starting_point(
    sym: str, body: dict, table: dict[str, SymbolDef], at: Locator
) -> tuple[str, dict[str, Any], str, dict[str, Location]]:
    """What a `layers:` entry starts from, before its own parameters: (primitive, parameters,
    source, where each parameter is written) of its `base:`, of its `primitive:`'s defaults, or of
    the symbol it redefines."""
    prims = stdlib.primitives()
    primitive = body.get("primitive")
    base_sym = body.get("base")
    if primitive is not None and base_sym is not None:
        raise MadslError(f"layers.{sym}: give either `primitive:` or `base:`, not both", at.key("layers", sym, "base"))
    where: dict[str, Location] = {}
    if base_sym is not None:
        if not isinstance(base_sym, str) or base_sym not in table:
            raise MadslError(
                f"layers.{sym}: unknown base symbol {base_sym!r}",
                at.value("layers", sym, "base"),
                hint=did_you_mean(str(base_sym), table),
            )
        base = table[base_sym]
        primitive, params, source = base.primitive, dict(base.params), f"spec (based on {base_sym})"
        where.update(base.where)
    elif primitive is not None:
        if not isinstance(primitive, str) or primitive not in prims:
            raise MadslError(
                f"layers.{sym}: unknown primitive {primitive!r}",
                at.value("layers", sym, "primitive"),
                expected="one of " + ", ".join(prims),
                hint=did_you_mean(str(primitive), prims),
            )
        params, source = dict(prims[primitive].defaults), "spec"
        if sym in table and table[sym].primitive == primitive:
            params, source = dict(table[sym].params), table[sym].source
    elif sym in table:
        primitive, params, source = table[sym].primitive, dict(table[sym].params), table[sym].source
        where.update(table[sym].where)
    else:
        raise MadslError(
            f"layers.{sym}: a new symbol needs `primitive:` or `base:`",
            at.key("layers", sym),
            hint="e.g. `primitive: attention` or `base: mA`; primitives: "
            + ", ".join(prims)
            + (f"; or did you mean the symbol {did_you_mean(sym, table)[14:-1]}?" if did_you_mean(sym, table) else ""),
        )
    return primitive, params, source, where


def _symbol_def(sym: str, body: Any, table: dict[str, SymbolDef], at: Locator, errors: Collector) -> SymbolDef:
    """One `layers:` entry. Raises MadslError where the entry cannot be read; its unknown
    parameters go to `errors` one by one (the caller treats the symbol as broken)."""
    sym_text = str(sym)
    if not isinstance(sym, str) or not SYMBOL_RE.match(sym) or sym == topo.NO_CHANNEL:
        raise MadslError(
            f"{sym_text!r} is not a valid layer symbol",
            at.key("layers", sym),
            expected="a letter followed by letters, digits or '_' (and not 'none')",
        )
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise MadslError(
            f"layers.{sym} must be a mapping of parameters, got {body!r}",
            at.value("layers", sym),
            hint=f"e.g. `{sym}: {{heads: 4}}`",
        )
    primitive, params, source, where = _starting_point(sym, body, table, at)
    defaults = stdlib.primitives()[primitive].defaults
    for key, value in body.items():
        if key in ("primitive", "base"):
            continue
        if key == "source":
            source = str(value)
            continue
        if key not in defaults:
            errors.add(
                MadslError(
                    f"layers.{sym}: {primitive} has no parameter {key!r}",
                    at.key("layers", sym, key),
                    expected="one of " + ", ".join(defaults),
                    hint=did_you_mean(str(key), defaults),
                )
            )
            continue
        params[key] = value
        where[key] = at.value("layers", sym, key)
    return SymbolDef(sym, primitive, params, source, where)
