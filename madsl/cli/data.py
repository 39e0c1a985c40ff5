"""`madsl data`: write one generated split of a task to .npz, or print some of its rows; and
`madsl data prepare`: tokenize text into the token files a pretraining run reads.

    madsl data compression --set seq_len=64 --conventions mad-lab --split train -o compression.npz
    madsl data selective-copying --format text --rows 2
    madsl data prepare corpus/ notes.txt --tokenizer bytes -o data/notes [--val-fraction 0.1] [--format json]
    madsl data prepare-labelled reviews/ --tokenizer tokenizer.json --seq-len 512 -o reviews-tokens [--truncate]

The .npz holds `inputs` and `targets` (int64; IGNORE = -100 at unscored positions, as the
runner reads them), any array the task shares between splits (memorization's `facts`), and
`info`: a JSON string with the task, conventions, split, seed, the full setting, the
vocabulary layout ({block: [first id, last id + 1]}), the embedding size, the number of
classes and the head. The same arrays the runner trains on (same seed, same setting).

`prepare` and `prepare-labelled` are recognised as the first word after `data` (no task has those
names) and have parsers of their own (`madsl data prepare --help`): the first writes train.bin,
val.bin and tokens.json (madsl.corpus), the second the arrays of a labelled text set that the
text-classification task reads (madsl.corpus.labelled).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from madsl.cli.arguments import positive_int, seed
from madsl.cli.common import EXIT_OK, add_verbosity
from madsl.errors import MadslError, did_you_mean, speaking

PREPARE = "prepare"
PREPARE_LABELLED = "prepare-labelled"


class _DataParser(argparse.ArgumentParser):
    """`madsl data`'s parser: a first word `prepare` or `prepare-labelled` (after -q or -v, if
    given) hands the rest to that word's parser."""

    word_parsers: dict[str, argparse.ArgumentParser]

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        verbosity = 0
        while verbosity < len(args) and args[verbosity] in ("-q", "--quiet", "-v", "--verbose"):
            verbosity += 1
        word = args[verbosity] if verbosity < len(args) else None
        if word in self.word_parsers:
            return self.word_parsers[word].parse_known_args(args[:verbosity] + args[verbosity + 1 :], namespace)
        return super().parse_known_args(args, namespace)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "data",
        help="write a generated task split to .npz or print rows; `data prepare`: tokenize text for pretraining",
        usage="%(prog)s TASK [options]\n       %(prog)s prepare TEXT... --tokenizer bytes|FILE -o DIR [options]"
        "\n       %(prog)s prepare-labelled TEXTS --tokenizer bytes|FILE --seq-len N -o DIR [options]",
        description="Generate one split of a task as madsl eval would (same seed, same arrays) and write it to "
        "an .npz file, to inspect it, feed it to another framework or compare it with the "
        "reference implementation's data; --format text prints rows instead.",
        epilog="madsl data prepare TEXT... --tokenizer bytes|FILE -o DIR tokenizes text files, folders or "
        "bundled:tinyshakespeare into train.bin, val.bin and tokens.json, the token files a "
        "pretraining run reads: see madsl data prepare --help. madsl data prepare-labelled tokenizes a "
        'folder\'s train.jsonl and test.jsonl ({"text": ..., "label": ...} a line) for the '
        "text-classification task: see madsl data prepare-labelled --help.",
    )
    p.__class__ = _DataParser  # (argparse builds every sub-parser of one class; only this one dispatches)
    p.word_parsers = {PREPARE: _prepare_parser(p.prog), PREPARE_LABELLED: _labelled_parser(p.prog)}
    p.add_argument("task", metavar="TASK", help="a task name (e.g. in-context-recall)")
    p.add_argument(
        "--set",
        action="append",
        dest="settings",
        default=[],
        metavar="KEY=VALUE",
        help="a task setting, e.g. seq_len=512; repeatable (default: the task's baseline)",
    )
    p.add_argument(
        "--conventions",
        choices=("mad-lab", "madsl"),
        default="madsl",
        help="whose task layout: the reference implementation's or madsl's (default: %(default)s)",
    )
    p.add_argument("--split", choices=("train", "test"), default="test", help="(default: %(default)s)")
    p.add_argument("--seed", type=seed, default=0, help="(default: %(default)s)")
    p.add_argument("-o", "--output", metavar="FILE.npz", help="where to write the split")
    p.add_argument(
        "--format",
        choices=("npz", "text"),
        default=None,
        help="npz (with -o; the default) or text: print --rows rows as `madsl/tasks/show.py` does",
    )
    p.add_argument("--rows", type=positive_int, default=3, help="rows to print with --format text (default: 3)")
    p.set_defaults(func=cmd_data)


def cmd_data(args) -> int:
    from madsl.outputs import check_output_path
    from madsl.runner.plan.task_settings import apply_setting_overrides, check_setting_keys, parse_set_option
    from madsl.tasks import TASKS, get_task

    if args.task not in TASKS:
        hint = "`prepare` comes first: madsl data prepare TEXT... [options]" if args.task == PREPARE else None
        raise MadslError(
            f"unknown task {args.task!r}",
            expected=", ".join(sorted(TASKS)),
            hint=hint or did_you_mean(args.task, TASKS),
        )
    fmt = args.format or "npz"
    if fmt == "npz" and not args.output:
        raise MadslError("madsl data: nowhere to write the split", expected="-o FILE.npz, or --format text")
    if fmt == "text" and args.output:
        raise MadslError(
            "madsl data: --format text prints to the terminal; -o writes .npz", hint="drop -o, or drop --format text"
        )
    output = check_output_path(args.output, "-o") if args.output else None
    task = get_task(args.task, args.conventions)
    overrides = dict(parse_set_option(text) for text in args.settings)
    check_setting_keys([task], overrides, "--set")
    settings = task.settings(**apply_setting_overrides(task, task.baseline, overrides, "--set"))
    try:
        data = task.generate(settings, args.split, args.seed)
    except ValueError as err:
        conventions = f" (conventions {args.conventions})" if args.conventions != "madsl" else ""
        raise MadslError(f"bad setting for {task.name}{conventions}: {err}", hint="check your --set values") from None
    except MemoryError:  # numpy's allocation failure: a setting far too large for this machine
        raise MadslError(
            f"{task.name}: the {args.split} split of this setting does not fit in memory",
            hint="lower the --set values that size it (seq_len, vocab_size, num_train_examples, ...)",
        ) from None
    if fmt == "text":
        print(_text(task, data, settings, args), end="")
        return EXIT_OK
    assert output is not None
    _write_npz(output, data, _info(task, data, settings, args))
    if not getattr(args, "quiet", False):
        print(
            f"wrote {output}: {task.name} ({args.conventions}) {args.split} split, seed {args.seed}: "
            f"inputs {tuple(data.inputs.shape)}, targets {tuple(data.targets.shape)}"
        )
    return EXIT_OK


def _info(task: Any, data: Any, settings: dict, args) -> dict:
    info = {
        "task": task.name,
        "conventions": args.conventions,
        "split": args.split,
        "seed": args.seed,
        "settings": settings,
        "head": task.head,
        "vocab_size": task.vocab_size(settings),
        "num_classes": task.num_classes(settings),
        "ignore_index": -100,
    }
    info.update({k: v for k, v in data.meta.items() if k in ("vocab", "compression_position", "num_resampled")})
    return info


def _write_npz(path: Path, data: Any, info: dict) -> None:
    import numpy as np

    arrays = {
        "inputs": data.inputs,
        "targets": data.targets,
        **{k: v for k, v in data.meta.items() if isinstance(v, np.ndarray)},
        "info": np.array(json.dumps(info, default=lambda v: v.item() if hasattr(v, "item") else str(v))),
    }
    from madsl.tasks.cache import save_npz_atomic

    save_npz_atomic(path, arrays)


def _text(task: Any, data: Any, settings: dict, args) -> str:
    from madsl.tasks.show import render_row

    shown = min(args.rows, len(data.inputs))
    lines = [
        f"{task.name} ({args.conventions}) {args.split} split, seed {args.seed}: "
        f"{len(data.inputs)} rows; showing {shown}"
    ]
    if "vocab" in data.meta:
        lines.append("vocabulary: " + ", ".join(f"{name} [{a}, {b})" for name, (a, b) in data.meta["vocab"].items()))
    for row in range(shown):
        lines += [f"-- row {row}", render_row(task, settings, data, row)]
    return "\n".join(lines) + "\n"


def _tokenizer_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer",
        required=True,
        metavar="bytes|FILE",
        help="bytes (UTF-8 bytes, vocabulary 256) or a Hugging Face tokenizer.json file (read locally)",
    )


def _output_arguments(p: argparse.ArgumentParser) -> None:
    """-o DIR and --force, as both prepare words take them."""
    p.add_argument(
        "-o",
        "--output",
        dest="out_dir",
        required=True,
        metavar="DIR",
        help="the folder to write; one holding other files is refused unless --force",
    )
    p.add_argument(
        "--force", action="store_true", help="write into a folder that holds other files (they are left as they are)"
    )


def _prepare_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{prog} {PREPARE}",
        description="Tokenize text into the token files a pretraining run reads: train.bin and val.bin (flat "
        "uint16 ids, uint32 above 65,536: nanoGPT's format) and tokens.json (tokenizer, vocabulary, "
        "counts, the text's bytes per split for bits per byte, the sources and a content hash). "
        "The last --val-fraction of each document's tokens is held out for validation.",
    )
    p.add_argument(
        "texts",
        nargs="+",
        metavar="TEXT",
        help="a UTF-8 text file, a folder (every file below it, in path order) or bundled:tinyshakespeare",
    )
    _tokenizer_argument(p)
    _output_arguments(p)
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="the fraction of each document's tokens held out for validation (default: %(default)s)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text: a summary; json: tokens.json's fields and the folder (default: %(default)s)",
    )
    add_verbosity(p, default=argparse.SUPPRESS)  # as every command has (madsl.cli.build_parser)
    p.set_defaults(func=cmd_prepare, command="data")
    return p


def cmd_prepare(args) -> int:
    from madsl.corpus import prepare

    words = {"out_dir": "-o", "val_fraction": "--val-fraction", "tokenizer": "--tokenizer", "force": "--force"}
    with speaking(words):
        info = prepare(args.texts, args.tokenizer, args.out_dir, val_fraction=args.val_fraction, force=args.force)
    folder = Path(args.out_dir)
    if args.format == "json":
        print(json.dumps({"folder": str(folder), **info.to_json()}, indent=2))
    elif not getattr(args, "quiet", False):
        print(_prepared_text(folder, info), end="")
    return EXIT_OK


def _prepared_text(folder: Path, info: Any) -> str:
    tokenizer = (
        info.tokenizer
        if info.tokenizer_sha256 is None
        else f"{info.tokenizer} (sha256 {info.tokenizer_sha256[:12]}...)"
    )
    lines = [f"wrote {folder}: tokenizer {tokenizer}, vocabulary {info.vocab_size:,}, {info.dtype}"]
    for split, name in (("train", "train.bin"), ("val", "val.bin")):
        lines.append(f"  {name:<9} {info.tokens(split):>14,} tokens from {info.text_bytes(split):>14,} bytes of text")
    for source in info.sources:
        documents = f"{source['documents']:,} document{'s' if source['documents'] != 1 else ''}"
        lines.append(f"  source {source['name']}: {documents}, {source['bytes']:,} bytes")
    lines.append(f"  hash {info.hash}")
    return "\n".join(lines) + "\n"


def _labelled_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{prog} {PREPARE_LABELLED}",
        description="Tokenize a labelled text set for the text-classification task (madsl eval --task "
        "text-classification --set data=DIR): the folder TEXTS holds train.jsonl and test.jsonl, one "
        '{"text": ..., "label": N} object a line, classes 0..C-1. Writes train.npy, train-labels.npy, '
        "test.npy, test-labels.npy and labelled.json (tokenizer, vocabulary, classes, counts, a hash).",
    )
    p.add_argument("texts", metavar="TEXTS", help="a folder holding train.jsonl and test.jsonl")
    _tokenizer_argument(p)
    p.add_argument("--seq-len", type=positive_int, required=True, metavar="N", help="the tokens of the longest text")
    p.add_argument(
        "--truncate",
        action="store_true",
        help="keep a longer text's first N tokens (counted in labelled.json) instead of refusing it",
    )
    p.add_argument(
        "--vocab-size",
        type=positive_int,
        metavar="N",
        help="the embedding rows of the model the set is for, where it has more than the tokenizer's ids "
        "(e.g. 50280 for mamba-130m-hf's 50277; default: the tokenizer's vocabulary)",
    )
    _output_arguments(p)
    p.add_argument("--format", choices=("text", "json"), default="text", help="(default: %(default)s)")
    add_verbosity(p, default=argparse.SUPPRESS)
    p.set_defaults(func=cmd_prepare_labelled, command="data")
    return p


def cmd_prepare_labelled(args) -> int:
    from madsl.corpus.labelled import prepare_labelled

    words = {"out_dir": "-o", "seq_len": "--seq-len", "truncate": "--truncate", "tokenizer": "--tokenizer"}
    with speaking({**words, "vocab_size": "--vocab-size"}):
        info = prepare_labelled(
            args.texts,
            args.tokenizer,
            args.out_dir,
            seq_len=args.seq_len,
            truncate=args.truncate,
            vocab_size=args.vocab_size,
            force=args.force,
        )
    if args.format == "json":
        print(json.dumps({"folder": str(args.out_dir), **info.to_json()}, indent=2))
    elif not getattr(args, "quiet", False):
        lines = [
            f"wrote {args.out_dir}: tokenizer {info.tokenizer}, vocabulary {info.vocab_size:,}, "
            f"{info.num_classes} classes, {info.seq_len:,} tokens a text at most"
        ]
        for split, counts in info.counts.items():
            lines.append(
                f"  {split:<5} {counts['examples']:>9,} texts, {counts['tokens']:>12,} tokens, "
                f"{counts['truncated']:,} truncated"
            )
        lines.append(f"  hash {info.hash}")
        print("\n".join(lines))
    return EXIT_OK
