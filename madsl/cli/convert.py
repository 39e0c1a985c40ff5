"""`madsl convert`: Megatron-LM / Nemotron-H hybrid layer patterns <-> madsl specs (madsl/convert.py)."""
from __future__ import annotations

from pathlib import Path

from madsl.cli.arguments import positive_int
from madsl.cli.common import EXIT_OK, write_atomic
from madsl.errors import MadslError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("convert", help="Megatron-LM / Nemotron-H hybrid_override_pattern <-> madsl spec")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from-megatron", metavar="PATTERN",
                     help="a hybrid_override_pattern (M Mamba, * attention, - MLP, E MoE), e.g. 'M-M*-': "
                          "prints a spec (YAML)")
    way.add_argument("--to-megatron", metavar="SPEC", help="a .mad spec: prints its hybrid_override_pattern")
    p.add_argument("--dim", type=positive_int, default=128, help="model width of the spec (default: %(default)s)")
    p.add_argument("--name", default="converted", help="name of the spec (default: %(default)s)")
    p.add_argument("--mamba", default="M2", metavar="SYMBOL",
                   help="the madsl symbol for M layers (default: %(default)s, Mamba-2; Mb for Mamba-1)")
    p.add_argument("--layer", action="append", default=[], metavar="SYMBOL.PARAM=VALUE",
                   help="a layer parameter of the spec, e.g. A.heads=32 or Mlp.inner=21504; repeatable")
    p.add_argument("-o", "--output", help="write the result to this file")
    p.set_defaults(func=cmd_convert)


def _layer_values(items: list[str]) -> dict[str, dict]:
    import yaml

    layers: dict[str, dict] = {}
    for item in items:
        key, eq, value = item.partition("=")
        symbol, dot, param = key.partition(".")
        if not eq or not dot or not symbol or not param:
            raise MadslError(f"--layer {item!r}: expected SYMBOL.PARAM=VALUE", hint="e.g. --layer A.heads=32")
        layers.setdefault(symbol.strip(), {})[param.strip()] = yaml.safe_load(value)
    return layers


def cmd_convert(args) -> int:
    from madsl.convert import from_megatron_pattern, to_megatron_pattern

    if args.to_megatron:
        text = to_megatron_pattern(args.to_megatron) + "\n"
    else:
        import yaml

        from madsl.spec import spec_from_data

        topology = from_megatron_pattern(args.from_megatron, {"mamba": args.mamba})
        data = {"name": args.name, "description": f"converted from the Megatron pattern {args.from_megatron}",
                "dim": args.dim, "topology": topology, "channel_mixer": "none"}
        layers = _layer_values(args.layer)
        if layers:
            data["layers"] = layers
        from madsl.graph import account

        account(spec_from_data(data))  # the spec must load and account: a bad --layer is a located error now
        text = yaml.safe_dump(data, sort_keys=False, width=10_000)
    if args.output:
        write_atomic(Path(args.output), text)
    else:
        print(text, end="")
    return EXIT_OK
