"""A JSON Schema for spec files (`madsl schema`), generated from the stdlib and the spec format.

Editors that speak the YAML language server (VS Code, Neovim, JetBrains) use it to complete
keys and flag mistakes while typing: every top-level key, every stdlib symbol's parameters
with their types and choices (from the primitives' typed fields), new symbols (`primitive:`
or `base:`), and the budget section. Value checks that need the whole spec (divisibility,
roles, the topology string itself) stay with `madsl check`; whatever this schema rejects,
the loader rejects too. No torch.
"""
from __future__ import annotations

import types
import typing
from typing import Any, Literal

from madsl import stdlib
from madsl.budget import QUANTITIES
from madsl.primitives.base import WidthRelative
from madsl.runner.plan.settings import eval_schema
from madsl.spec_schema import CHOICES, POSITIVE, REQUIRED, TYPES

SCHEMA_ID = "https://madsl.invalid/schema/spec.json"  # an identifier, not a download location
SYMBOL_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"
_JSON_TYPES = {str: "string", int: "integer", bool: "boolean", dict: "object", float: "number",
               type(None): "null"}


def field_schema(annotation: Any) -> dict[str, Any]:
    """The JSON Schema of one typed hyperparameter (int, float, bool, str, Literal, Optional)."""
    origin, options = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [field_schema(o) for o in options if o is not type(None)]
        return {"anyOf": inner + [{"type": "null"}]}
    if origin is Literal:
        return {"enum": list(options)}
    return {"type": _JSON_TYPES[annotation]}


def _parameters(primitive: str) -> dict[str, Any]:
    entry = stdlib.primitives()[primitive]
    out = {}
    for name, annotation in entry.cls.fields().items():
        default = entry.defaults[name]
        if isinstance(default, WidthRelative):  # stated relative to the width: no one number
            out[name] = {**field_schema(annotation), "description": f"default: {default} (scales with the width)"}
        else:
            out[name] = {**field_schema(annotation), "default": default}
    return out


def _layer_defs(primitives: list[str]) -> dict[str, Any]:
    """$defs for `layers:` entries: per primitive, the entry that names it (`primitive: P`) and
    the entry that only overrides its parameters; and the entry based on another symbol."""
    source = {"source": {"type": "string", "description": "where the values come from"}}
    defs: dict[str, Any] = {}
    for p in primitives:
        defs[f"named-{p}"] = {"properties": {"primitive": {"const": p}, **source, **_parameters(p)},
                              "required": ["primitive"], "additionalProperties": False}
        defs[f"own-{p}"] = {"properties": {**source, **_parameters(p)}, "additionalProperties": False}
    # `base: SYMBOL` takes the parameters of another symbol: any parameter name of any primitive
    every = sorted({k for p in primitives for k in stdlib.primitives()[p].cls.fields()})
    defs["based"] = {"properties": {"base": {"type": "string", "pattern": SYMBOL_PATTERN}, **source,
                                    **{k: {} for k in every}},
                     "required": ["base"], "additionalProperties": False}
    return defs


def _layer_entry(primitive: str | None, primitives: list[str]) -> dict[str, Any]:
    """A `layers:` entry: the parameters of its own primitive (a stdlib symbol), or a primitive
    it names, or a symbol it is based on."""
    options = [{"$ref": f"#/$defs/named-{p}"} for p in primitives] + [{"$ref": "#/$defs/based"}]
    if primitive is not None:
        options.append({"$ref": f"#/$defs/own-{primitive}"})
    return {"anyOf": [{"type": "null"}, {"type": "object", "anyOf": options}]}


def _budget() -> dict[str, Any]:
    bound = {"type": ["string", "number"],
             "description": "a number (4096, 1.2M), with a tolerance (4096 ± 5%), or one-sided (<= 1M)"}
    return {"type": "object", "additionalProperties": False,
            "properties": {**{q: bound for q in QUANTITIES},
                           "seq_len": {"type": "integer", "minimum": 1},
                           "fit": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                                                   "minItems": 1}]}}}


def spec_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a .mad spec file."""
    primitives = sorted(stdlib.primitives())
    symbols = stdlib.symbols()
    properties: dict[str, Any] = {}
    for key, allowed in TYPES.items():
        kinds = [_JSON_TYPES[t] for t in allowed]
        properties[key] = {"type": kinds[0] if len(kinds) == 1 else kinds}
    for key, choices in CHOICES.items():
        properties[key]["enum"] = list(choices)
    for key in POSITIVE:
        if float in TYPES[key]:  # a positive number (the init stds)
            properties[key]["exclusiveMinimum"] = 0
        else:
            properties[key]["minimum"] = 1
    properties["name"]["pattern"] = r"\S"
    properties["channel_mixer"]["anyOf"] = [{"type": "null"}, {"type": "string", "pattern": SYMBOL_PATTERN}]
    properties["layers"] = {
        "type": "object",
        "properties": {sym: _layer_entry(entry.primitive, primitives) for sym, entry in sorted(symbols.items())},
        "additionalProperties": _layer_entry(None, primitives),  # a new symbol
        "propertyNames": {"pattern": SYMBOL_PATTERN, "not": {"const": "none"}},
    }
    properties["budget"] = _budget()
    properties["eval"] = eval_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "madsl spec (.mad)",
        "description": "A madsl architecture spec: topology, layer parameters, budgets (docs/language.md).",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "$defs": _layer_defs(primitives),
        # a spec that extends another may take the required keys from it
        "if": {"not": {"required": ["extends"]}},
        "then": {"required": list(REQUIRED)},
    }
