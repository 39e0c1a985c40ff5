"""`madsl schema`: the JSON Schema of spec files, for editors (docs/language.md)."""
from __future__ import annotations

import json
from pathlib import Path

from madsl.cli.common import EXIT_OK, write_atomic
from madsl.outputs import check_output_path, output_error


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("schema", help="print the JSON Schema of .mad spec files (for editors)")
    p.add_argument("-o", "--output", help="write the schema to this file instead of printing it")
    p.set_defaults(func=cmd_schema)


def cmd_schema(args) -> int:
    from madsl.schema import spec_schema

    if args.output:
        check_output_path(args.output, "-o")
    text = json.dumps(spec_schema(), indent=2) + "\n"
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
