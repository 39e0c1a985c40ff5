"""`madsl import DIR`: a local Hugging Face checkpoint folder (config.json + *.safetensors) -> its
madsl spec (-o, or printed) and the compiled model with the checkpoint's weights (--out, madsl's
model folder: model.safetensors + config.json, read back by madsl.compiler.load). Every output is
checked before the work and written only once every tensor has been placed (madsl/weights/); a
refused checkpoint writes nothing (exit status 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from madsl.cli.common import EXIT_OK, write_atomic
from madsl.outputs import check_output_dir, check_output_path, output_error

MODEL_FILES = ("model.safetensors", "config.json")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "import",
        help="a local Hugging Face checkpoint (config.json + safetensors; docs/weights.md lists the families) "
        "-> its spec and the madsl model with its weights",
    )
    p.add_argument("checkpoint", metavar="DIR", help="the checkpoint folder (config.json, *.safetensors)")
    p.add_argument("-o", "--output", metavar="SPEC", help="write the spec (YAML) here (default: print it)")
    p.add_argument(
        "--out", metavar="MODEL", help="write the model with its weights into this folder (madsl's model format)"
    )
    p.add_argument("--name", default=None, help="the spec's name (default: the folder's)")
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text: the spec's YAML after the conversion's notes (default); json: one object, the spec's data, "
        "the notes and the parameters loaded",
    )
    p.set_defaults(func=cmd_import)


def cmd_import(args) -> int:
    import yaml

    from madsl.compiler import save
    from madsl.weights import import_checkpoint

    if args.output:
        check_output_path(args.output, "-o")  # before any work
    if args.out:
        check_output_dir(
            args.out, "--out", lambda name: name in MODEL_FILES, force=True, writes="model.safetensors and config.json"
        )
    imported = import_checkpoint(args.checkpoint, args.name)
    if args.format == "json":
        result = {"spec": imported.spec, "notes": imported.notes, "params": imported.model.num_params()}
        text = json.dumps(result, indent=2) + "\n"
    else:
        notes = "".join(f"# {note}\n" for note in imported.notes)
        text = notes + yaml.safe_dump(imported.spec, sort_keys=False, width=10_000)
    quiet = getattr(args, "quiet", False)
    if args.out:
        save(imported.model, args.out, option="--out")
        if not quiet:
            print(f"wrote {args.out} ({imported.model.num_params():,} parameters loaded)", file=sys.stderr)
    if args.output:
        try:
            write_atomic(Path(args.output), text)
        except OSError as err:
            raise output_error(err, args.output, "-o") from None
        if not quiet:
            print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    return EXIT_OK
