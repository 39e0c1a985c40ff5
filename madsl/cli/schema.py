"""`madsl schema`: the JSON Schema of spec files, for editors (docs/language.md), or (--format
text) what it allows, for people: the keys, the symbols and their parameters, the budgets; with
--kind, that of sweep, study or search files (derived from their declared keys)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from madsl.cli.common import EXIT_OK, write_atomic
from madsl.outputs import check_output_path, output_error


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("schema", help="print the JSON Schema of .mad spec files (for editors)")
    p.add_argument(
        "--kind",
        choices=("spec", "sweep", "study", "search"),
        default="spec",
        help="the file kind: spec (default), sweep, study or search",
    )
    p.add_argument("-o", "--output", help="write the schema to this file instead of printing it")
    p.add_argument(
        "--format",
        choices=("json", "text"),
        default="json",
        help="json: the JSON Schema (draft 2020-12); text: what it allows, for reading",
    )
    p.set_defaults(func=cmd_schema)


def cmd_schema(args) -> int:
    from madsl.schema import file_schema

    if args.output:
        check_output_path(args.output, "-o")
    schema = file_schema(args.kind)
    if args.format == "json":
        text = json.dumps(schema, indent=2) + "\n"
    else:
        text = schema_text(schema) if args.kind == "spec" else section_text(schema)
    if args.output:
        try:
            write_atomic(Path(args.output), text)
        except OSError as err:
            raise output_error(err, args.output, "-o") from None
        if not args.quiet:
            print(f"wrote {args.output}")
    else:
        print(text, end="")
    return EXIT_OK


def describe(prop: dict[str, Any]) -> str:
    """One property's schema in a few words: `integer >= 1`, `rms | layer`, `integer | null = 4`."""
    if "enum" in prop:
        words = " | ".join(map(_value, prop["enum"]))
    elif "anyOf" in prop:
        words = " | ".join(describe(option) for option in prop["anyOf"])
    elif "const" in prop:
        words = _value(prop["const"])
    else:
        kinds = prop.get("type", "any")
        words = " | ".join(kinds) if isinstance(kinds, list) else kinds
    if "minimum" in prop:
        words += f" >= {prop['minimum']}"
    if "exclusiveMinimum" in prop:
        words += f" > {prop['exclusiveMinimum']}"
    if "maximum" in prop:
        words += f" <= {prop['maximum']:,}"
    if "exclusiveMaximum" in prop:
        words += f" < {prop['exclusiveMaximum']}"
    if "default" in prop:
        words += f" = {_value(prop['default'])}"
    return words


def _value(value: Any) -> str:
    """A value as a spec writes it: true, null, 4, modal."""
    return value if isinstance(value, str) else json.dumps(value)


def schema_text(schema: dict[str, Any]) -> str:
    """What the schema allows, for reading: one line per key, symbol and budget quantity."""
    props, defs = schema["properties"], schema["$defs"]
    required = ", ".join(schema["allOf"][0]["then"]["required"])
    lines = [
        f"{schema['title']}: {schema['description']}",
        "",
        f"keys (required: {required}, unless the spec extends one that has them)",
    ]
    described = {
        "layers": "{SYMBOL: parameters}: a symbol's parameters, or a new symbol (primitive: or base:)",
        "budget": "{QUANTITY: bound}, see budgets below",
        "eval": props["eval"].get("description", ""),
    }
    lines += [f"  {key:<15} {described.get(key) or describe(prop)}" for key, prop in props.items()]
    lines += ["", "symbols (layers: SYMBOL: {parameter: value}) and their primitives' parameters"]
    for symbol, entry in props["layers"]["properties"].items():
        primitive = entry["else"]["else"]["$ref"].removeprefix("#/$defs/own-")
        lines.append(_wrapped(f"  {symbol:<6} {primitive:<17}", _parameters(defs[f"own-{primitive}"])))
    lines += [
        "",
        "primitives (a new symbol: layers: NAME: {primitive: P, parameter: value})",
        _wrapped("  ", defs["named"]["properties"]["primitive"]["enum"]),
        "",
        "budgets",
    ]
    budget = props["budget"]["properties"]
    quantities = [q for q, prop in budget.items() if "pattern" in prop]
    lines += [f"  {', '.join(quantities)}:", f"    {budget[quantities[0]]['description']}"]
    lines += [f"  {key}: {describe(prop)}" for key, prop in budget.items() if key not in quantities]
    return "\n".join(lines) + "\n"


def section_text(schema: dict[str, Any], indent: str = "  ") -> str:
    """A file kind's keys for reading: one line each, a section's keys below it."""
    lines = [f"{schema['title']}: {schema.get('description', '')}", ""] if "title" in schema else []
    required = set(schema.get("required", ()))
    for key, prop in schema["properties"].items():
        what = prop.get("description", "")
        mark = " (required)" if key in required else ""
        if prop.get("type") == "object" and "properties" in prop:
            lines.append(f"{indent}{key}:{mark} {what}")
            lines.append(section_text(prop, indent + "  ").rstrip("\n"))
        else:
            lines.append(f"{indent}{key:<16} {describe(prop)}{mark}" + (f"  {what}" if what else ""))
    return "\n".join(lines) + "\n"


def _parameters(definition: dict[str, Any]) -> list[str]:
    return [f"{name}: {describe(prop)}" for name, prop in definition["properties"].items() if name != "source"]


def _wrapped(head: str, items: list[str]) -> str:
    """`items` after `head`, wrapped between items only (a no-break space holds each together)."""
    text = ", ".join(item.replace(" ", "\u00a0") for item in items)
    return textwrap.fill(
        text,
        width=110,
        initial_indent=head,
        subsequent_indent=" " * len(head),
        break_on_hyphens=False,
        break_long_words=False,
    ).replace("\u00a0", " ")
