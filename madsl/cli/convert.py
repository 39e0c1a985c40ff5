"""`madsl convert`: Megatron-LM / Nemotron-H hybrid layer patterns (madsl/interop/megatron.py) and Hugging Face
config.json files of hybrid families (madsl/interop/huggingface/) <-> madsl specs.

`--format text` (the default, but for --to-hf) prints the result as people read it: the spec's YAML,
the pattern, the config fields one a line; `--format json` prints one JSON object: the spec's data
with its accounted totals, the pattern, the config fields (--to-hf's default)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from madsl.cli.arguments import positive_int
from madsl.cli.common import EXIT_OK, write_atomic
from madsl.errors import Location, MadslError
from madsl.outputs import check_output_path, output_error

FAMILY_TYPES = (
    "jamba",
    "nemotron_h",
    "granitemoehybrid",
    "bamba",
    "falcon_h1",
    "lfm2",
    "lfm2_moe",
    "qwen3_next",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "qwen3_5",
    "qwen3_5_moe",
    "recurrent_gemma",
    "kimi_linear",
    "minimax",
    "minimax_m1",
    "xlstm",
    "mamba",
    "gpt_neo",
    "rwkv7",
    "zamba2",
    "hymba",
)  # madsl.interop.huggingface.families.FAMILIES, and LANGUAGE_MODELS (written as text_config)


def _add_megatron_sizes(p) -> None:
    """The model-wide sizes a Megatron pattern does not state."""
    p.add_argument(
        "--vocab",
        type=positive_int,
        default=None,
        help="the vocabulary, --from-megatron (its embedding and head are counted at it; default: the spec's)",
    )
    p.add_argument(
        "--tie",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--from-megatron: the output head shares the embedding (--tie) or has its own (--no-tie: "
        "Megatron-LM's --untie-embeddings-and-output-weights); default: the spec's",
    )


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "convert",
        help="Megatron-LM hybrid patterns and Hugging Face config.json "
        "(15 hybrid families, Mamba and GPT-Neo; docs/convert.md) <-> madsl spec",
    )
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument(
        "--from-megatron",
        metavar="PATTERN",
        help="a hybrid_override_pattern (M Mamba, * attention, - MLP, E MoE), e.g. 'M-M*-': prints a spec (YAML)",
    )
    way.add_argument("--to-megatron", metavar="SPEC", help="a .mad spec: prints its hybrid_override_pattern")
    way.add_argument(
        "--from-hf",
        metavar="CONFIG_JSON",
        help="a Hugging Face config.json of a hybrid family (model_type "
        + ", ".join(FAMILY_TYPES)
        + "): prints a spec (YAML) with its widths, heads, state sizes and experts",
    )
    way.add_argument(
        "--to-hf",
        metavar="SPEC",
        help="a .mad spec: prints the config.json fields (JSON) of the "
        "family --model-type that describe its layer stack",
    )
    p.add_argument("--model-type", choices=FAMILY_TYPES, help="the family --to-hf writes (its config.json model_type)")
    p.add_argument(
        "--dim", type=positive_int, default=None, help="model width of the spec, --from-megatron (default: 128)"
    )
    p.add_argument("--name", default=None, help="name of the spec, --from-megatron / --from-hf (default: converted)")
    _add_megatron_sizes(p)
    p.add_argument(
        "--mamba",
        default=None,
        metavar="SYMBOL",
        help="the madsl symbol for M layers, --from-megatron (default: M2, Mamba-2; Mb for Mamba-1)",
    )
    p.add_argument(
        "--layer",
        action="append",
        default=[],
        metavar="SYMBOL.PARAM=VALUE",
        help="a layer parameter of the spec, --from-megatron / --from-hf, e.g. A.heads=32, "
        "M2.heads=128 or Mlp.inner=21504; repeatable",
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default=None,
        help="text: the spec's YAML, the pattern, the config fields one a line (default, but for "
        "--to-hf); json: one JSON object, a spec's data with its accounted totals (--to-hf's default)",
    )
    p.add_argument("-o", "--output", help="write the result to this file")
    p.set_defaults(func=cmd_convert)


def _layer_values(items: list[str]) -> dict[str, dict]:
    import yaml

    from madsl.lang.yamlsource import scalar

    layers: dict[str, dict] = {}
    for item in items:
        key, eq, value = item.partition("=")
        symbol, dot, param = key.partition(".")
        if not eq or not dot or not symbol or not param:
            raise MadslError(f"--layer {item!r}: expected SYMBOL.PARAM=VALUE", hint="e.g. --layer A.heads=32")
        try:
            parsed = scalar(value)
        except yaml.constructor.ConstructorError as err:  # a number no layer can take: .nan, 2**63
            raise MadslError(
                f"--layer {key}={value}: {err.problem}", hint="a finite number of at most 64 bits"
            ) from None
        except (yaml.YAMLError, RecursionError):  # an unclosed [ or thousands of them: not a value
            raise MadslError(
                f"--layer {key}=...: the value is not a YAML value",
                hint="a number, true/false or a word, e.g. --layer A.heads=32",
            ) from None
        layers.setdefault(symbol.strip(), {})[param.strip()] = parsed
    return layers


def _compiling_spec(data: dict, source: str, file: str | None = None) -> tuple[str, dict[str, Any]]:
    """The spec's YAML text and its accounted totals, once it has passed what `madsl compile` does
    to a spec file before the table (the same YAML reader, with its limits, then validation and
    torch-free accounting); else the conversion is refused: a spec that fails later is not written."""
    import tempfile

    import yaml

    from madsl.graph import account
    from madsl.lang.spec import load_spec

    text = yaml.safe_dump(data, sort_keys=False, width=10_000)
    with tempfile.TemporaryDirectory(prefix="madsl-convert-") as folder:
        path = Path(folder) / "converted.mad"
        path.write_text(text, encoding="utf-8")
        try:
            totals = account(load_spec(path)).totals
        except MadslError as err:
            first = err.diagnostics[0]
            line = f" (line {first.location.line} of the spec)" if first.location.line else ""
            more = f"; {len(err.diagnostics) - 1} more" if len(err.diagnostics) > 1 else ""
            raise MadslError(
                f"the spec converted from {source} does not compile{line}: {first.message}{more}",
                Location(file) if file else None,
                expected=first.expected,
                hint=first.hint or "madsl compile would refuse it, so it is not written",
            ) from None
    return text, totals


def _mamba2_width_stated(pattern: str, symbol: str, layers: dict[str, dict]) -> None:
    """A pattern with Mamba-2 layers whose sizes the user gives in part must state their width: the
    heads (a config's mamba_num_heads; width heads x head_dim) or expand (width expand x dim,
    Megatron-LM's default). Taking expand's default there would guess the width of a real model."""
    given = layers.get(symbol, {})
    if "M" not in pattern or symbol != "M2" or not given or {"heads", "expand"} & set(given):
        return
    raise MadslError(
        f"--layer {symbol}.{next(iter(given))}=...: the Mamba-2 layers' width is not stated",
        hint=f"give --layer {symbol}.heads=N (the config's mamba_num_heads: the width is heads x "
        f"head_dim) or --layer {symbol}.expand=E (the width is E x dim, Megatron-LM's default)",
    )


# the options each direction reads; any other given is refused rather than ignored
READS = {
    "from_megatron": {"dim", "name", "mamba", "layer", "vocab", "tie", "format"},
    "from_hf": {"name", "layer", "format"},
    "to_megatron": {"format"},
    "to_hf": {"model_type", "format"},
}


def _check_options(args) -> None:
    direction = next(way for way in READS if getattr(args, way) is not None)
    ignored = [
        f"--{option.replace('_', '-')}"
        for option in ("model_type", "dim", "name", "mamba", "layer", "vocab", "tie")
        if getattr(args, option) not in (None, []) and option not in READS[direction]
    ]
    if ignored:
        readers = sorted(
            f"--{way.replace('_', '-')}" for way in READS if ignored[0][2:].replace("-", "_") in READS[way]
        )
        raise MadslError(
            f"{', '.join(ignored)}: not read by --{direction.replace('_', '-')}",
            hint=f"{ignored[0]} goes with {' or '.join(readers)}",
        )


def _from_spec_data(data: dict, source: str, file: str | None, fmt: str) -> str:
    text, totals = _compiling_spec(data, source, file)
    if fmt == "text":
        return text
    return json.dumps({"spec": data, "totals": totals}, indent=2) + "\n"


def _convert(args, fmt: str) -> str:
    from madsl.interop.megatron import from_megatron_pattern, to_megatron_pattern

    name = args.name or "converted"
    if args.to_megatron:
        pattern = to_megatron_pattern(args.to_megatron)
        return pattern + "\n" if fmt == "text" else json.dumps({"hybrid_override_pattern": pattern}) + "\n"
    if args.to_hf:
        from madsl.interop.huggingface.families import to_hf_config

        if args.model_type is None:
            raise MadslError("--to-hf needs --model-type", expected=", ".join(FAMILY_TYPES))
        fields = to_hf_config(args.to_hf, args.model_type)
        if fmt == "json":
            return json.dumps(fields, indent=2) + "\n"
        return "".join(f"{key}: {json.dumps(value)}\n" for key, value in fields.items())
    layers = _layer_values(args.layer)
    if args.from_hf:
        return _from_hf(args, name, layers, fmt)
    symbol = args.mamba or "M2"
    _mamba2_width_stated(args.from_megatron, symbol, layers)
    data = {
        "name": name,
        "description": f"converted from the Megatron pattern {args.from_megatron}",
        "dim": args.dim or 128,
        "topology": from_megatron_pattern(args.from_megatron, {"mamba": symbol}),
        "channel_mixer": "none",
        **({"vocab": args.vocab} if args.vocab is not None else {}),
        **({"tie_embeddings": args.tie} if args.tie is not None else {}),
    }
    if layers:
        data["layers"] = layers
    defaulted, warnings = _defaulted(data)
    if fmt == "json":
        out = json.loads(_from_spec_data(data, "the Megatron pattern", None, fmt))
        return json.dumps({**out, "defaulted": defaulted, "warnings": warnings}, indent=2) + "\n"
    text = _from_spec_data(data, "the Megatron pattern", None, fmt)
    notes = ["# defaulted (not in the pattern or the flags): " + ", ".join(f"{k}={v}" for k, v in defaulted.items())]
    return "\n".join([*notes, *(f"# warning: {w}" for w in warnings)]) + "\n" + text


def _from_hf(args, name: str, layers: dict[str, dict], fmt: str) -> str:
    """A config.json's spec, with each key taken at transformers' default and each key read as
    transformers' class reads it listed: `# ` lines before the YAML (and on stderr where -o writes
    it), `defaulted` and `notes` in the JSON."""
    from madsl.interop.huggingface.families import read_hf_config

    read = read_hf_config(args.from_hf, name)
    for symbol, params in layers.items():  # on top of the config's own settings
        read.data.setdefault("layers", {}).setdefault(symbol, {}).update(params)
    out = _from_spec_data(read.data, args.from_hf, args.from_hf, fmt)
    if args.output and read.notes and not getattr(args, "quiet", False):
        print("".join(f"# {note}\n" for note in read.notes), end="", file=sys.stderr)
    if fmt == "json":
        return json.dumps({**json.loads(out), "defaulted": read.defaulted, "notes": read.notes}, indent=2) + "\n"
    return "".join(f"# {note}\n" for note in read.notes) + out


def _defaulted(data: dict) -> tuple[dict[str, Any], list[str]]:
    """What a converted pattern takes from madsl's defaults, not from the pattern or the flags: each
    used layer's parameters given by no --layer (SYMBOL.param: the value it takes), the vocabulary
    and the tying; and warnings where a default sizes something a real model states."""
    from madsl.lang import stdlib
    from madsl.lang.spec import spec_from_data

    spec = spec_from_data(data)
    given = data.get("layers", {})
    defaulted: dict[str, Any] = {}
    for symbol in spec.symbols_used():
        entry = stdlib.primitives()[spec.symbols[symbol].primitive]
        for key in entry.defaults:
            if key not in given.get(symbol, {}):
                defaulted[f"{symbol}.{key}"] = spec.symbols[symbol].params.get(key, entry.defaults[key])
    warnings = []
    if "vocab" not in data:
        defaulted["vocab"] = None
        warnings.append("no --vocab: the embedding and head are not counted (the total is the layers' alone)")
    if "tie_embeddings" not in data:
        defaulted["tie_embeddings"] = spec.tie_embeddings
    return defaulted, warnings


def cmd_convert(args) -> int:
    _check_options(args)
    if args.output:
        check_output_path(args.output, "-o")  # before any work
    fmt = args.format or ("json" if args.to_hf else "text")
    text = _convert(args, fmt)
    if args.output:
        try:
            write_atomic(Path(args.output), text)
        except OSError as err:
            raise output_error(err, args.output, "-o") from None
        if not getattr(args, "quiet", False):  # as fit, schema and export say what they wrote
            print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    return EXIT_OK
