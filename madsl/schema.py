"""The JSON Schemas of the files madsl reads (`madsl schema --kind spec|sweep|study|search`):
spec files from the stdlib and the spec format, the others from their declared sections
(madsl.lang.declare: a sweep file's, madsl.runner.plan.sweep; a study file's, madsl.scaling.study;
a search file's, madsl.search.keys, whose spec fields are a spec's). The rest of this docstring
is about the spec schema.

Editors that speak the YAML language server (VS Code, Neovim, JetBrains) use it to complete
keys and flag mistakes while typing: every top-level key, every stdlib symbol's parameters
with their types and choices (from the primitives' typed fields), new symbols (`primitive:`
or `base:`), the budget section with its values' grammar, and the topology string's tokens
and symbols as far as a regular expression can check them (schema_patterns.py). Every mapping
lists its keys and allows no others, choosing among alternatives with if/then rather than
anyOf, so that a validator names the key it does not know (`mA: {hedas: 8}`: 'hedas' was
unexpected) rather than saying that no alternative fits. Checks that need the whole spec
(divisibility, roles, groups that close) stay with `madsl check`; whatever this schema
rejects, the loader rejects too. No torch.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from madsl.lang import stdlib
from madsl.lang.budget import QUANTITIES
from madsl.lang.spec.init import ENTRY_SCHEMA as INIT_ENTRY_SCHEMA
from madsl.lang.spec.keys import CHOICES, POSITIVE, REQUIRED, TYPES
from madsl.lang.topology import NO_CHANNEL
from madsl.primitives.base import WidthRelative
from madsl.runner.plan.settings import eval_schema
from madsl.schema_patterns import budget_patterns, topology_pattern

SCHEMA_ID = "https://madsl.invalid/schema/spec.json"  # an identifier, not a download location
KINDS = ("spec", "sweep", "study", "search")  # the file kinds `madsl schema --kind` describes
SYMBOL_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"
_JSON_TYPES = {
    str: "string",
    int: "integer",
    bool: "boolean",
    dict: "object",
    float: "number",
    list: "array",
    type(None): "null",
}


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
    the entry that only overrides its parameters; and the entry based on another symbol. Each
    lists its keys and allows no others, so a validator names a misspelled one."""
    source = {"source": {"type": "string", "description": "where the values come from"}}
    defs: dict[str, Any] = {}
    for p in primitives:
        defs[f"named-{p}"] = {
            "properties": {"primitive": {"const": p}, **source, **_parameters(p)},
            "additionalProperties": False,
        }
        defs[f"own-{p}"] = {"properties": {**source, **_parameters(p)}, "additionalProperties": False}
    # one branch per primitive, chosen by the `primitive:` value (if/then: its errors are its own,
    # where anyOf would report only that no branch fits)
    defs["named"] = {
        "properties": {"primitive": {"enum": primitives}},
        "required": ["primitive"],
        "allOf": [
            {"if": {"properties": {"primitive": {"const": p}}}, "then": {"$ref": f"#/$defs/named-{p}"}}
            for p in primitives
        ],
    }
    # `base: SYMBOL` takes the parameters of another symbol: any parameter name of any primitive
    every = sorted({k for p in primitives for k in stdlib.primitives()[p].cls.fields()})
    defs["based"] = {
        "properties": {"base": {"type": "string", "pattern": SYMBOL_PATTERN}, **source, **{k: {} for k in every}},
        "required": ["base"],
        "additionalProperties": False,
    }
    return defs


def _layer_entry(primitive: str | None) -> dict[str, Any]:
    """A `layers:` entry, by the key it has: `primitive:` (a primitive it names), `base:` (a
    symbol it is based on), or neither: the parameters of its own primitive (a stdlib symbol's);
    a new symbol needs one of the two."""
    own = (
        {"$ref": f"#/$defs/own-{primitive}"}
        if primitive is not None
        else {"required": ["primitive"], "description": "a new symbol: `primitive: NAME` or `base: SYMBOL`"}
    )
    return {
        "type": ["object", "null"],
        "if": {"required": ["primitive"]},
        "then": {"$ref": "#/$defs/named"},
        "else": {"if": {"required": ["base"]}, "then": {"$ref": "#/$defs/based"}, "else": own},
    }


def _bound(quantity_pattern: str, description: str) -> dict[str, Any]:
    """A budget quantity: a number, or a string that `quantity_pattern` reads (pattern and
    minimum each apply to their own type, so no anyOf hides which one failed)."""
    return {
        "type": ["number", "string"],
        "minimum": 0,
        "pattern": quantity_pattern,
        "patternErrorMessage": description,
        "description": description,
    }


def _budget() -> dict[str, Any]:
    bound_pattern, quantity_pattern = budget_patterns()
    quantity = _bound(quantity_pattern, "a number: 4096, 500k, 1.2M, 7B")
    bound = {
        **_bound(
            bound_pattern, "a number (4096, 1.2M), with a tolerance (4096 ± 5%), one-sided (<= 1M) or {min: X, max: Y}"
        ),  # ... or a mapping of quantities:
        "type": ["number", "string", "object"],
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {"min": quantity, "max": quantity},
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **{q: bound for q in QUANTITIES},
            "seq_len": {"type": "integer", "minimum": 1},
            "fit": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]},
        },
    }


def _known_symbols(symbols: list[str]) -> dict[str, Any]:
    """Where the spec defines no symbol of its own (nor extends a spec that may), every symbol of
    its topology and its channel mixer is a stdlib one: `3H:mQ` is flagged, not only `3H:(`."""
    return {
        "if": {"not": {"required": ["extends"]}, "properties": {"layers": {"propertyNames": {"enum": symbols}}}},
        "then": {
            "properties": {
                "topology": {
                    "pattern": topology_pattern(symbols),
                    "patternErrorMessage": "a layer symbol the stdlib does not define, or a "
                    "syntax error (madsl check says which)",
                },
                "channel_mixer": {"enum": [None, NO_CHANNEL, *symbols]},
            }
        },
    }


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
    properties["channel_mixer"]["pattern"] = SYMBOL_PATTERN  # (a string's: null is none too)
    properties["topology"].update(
        pattern=topology_pattern(), patternErrorMessage="not a topology: madsl check says where it goes wrong"
    )
    properties["layers"] = {
        "type": "object",
        "properties": {sym: _layer_entry(entry.primitive) for sym, entry in sorted(symbols.items())},
        "additionalProperties": _layer_entry(None),  # a new symbol
        "propertyNames": {"pattern": SYMBOL_PATTERN, "not": {"const": "none"}},
    }
    properties["budget"] = _budget()
    properties["eval"] = eval_schema()
    properties["init"] = {"type": "array", "items": INIT_ENTRY_SCHEMA}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "madsl spec (.mad)",
        "description": "A madsl architecture spec: topology, layer parameters, budgets (docs/language.md).",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "$defs": _layer_defs(primitives),
        "allOf": [
            # a spec that extends another may take the required keys from it
            {"if": {"not": {"required": ["extends"]}}, "then": {"required": list(REQUIRED)}},
            _known_symbols(sorted(symbols)),
        ],
    }


def file_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a file kind of KINDS."""
    if kind == "spec":
        return spec_schema()
    if kind == "sweep":
        from madsl.runner.plan.sweep import SWEEP_FILE as section
    elif kind == "study":
        from madsl.scaling.study import STUDY_FILE as section
    elif kind == "search":
        from madsl.search.keys import SEARCH_FILE as section
    else:
        raise ValueError(f"unknown file kind {kind!r}; the kinds are {', '.join(KINDS)}")
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID.replace("spec.json", f"{kind}.json"),
        "title": f"madsl {kind} file",
        **section.schema(),
    }
    if section.open:  # a search file's spec fields: as a spec's, with the definitions they use
        spec = spec_schema()
        schema["properties"].update({key: spec["properties"][key] for key in section.open})
        schema["$defs"] = spec["$defs"]
    return schema
