"""`madsl data`: write one generated split of a task to .npz, or print some of its rows.

    madsl data compression --set seq_len=64 --conventions mad-lab --split train -o compression.npz
    madsl data selective-copying --format text --rows 2

The .npz holds `inputs` and `targets` (int64; IGNORE = -100 at unscored positions, as the
runner reads them), any array the task shares between splits (memorization's `facts`), and
`info`: a JSON string with the task, conventions, split, seed, the full setting, the
vocabulary layout ({block: [first id, last id + 1]}), the embedding size, the number of
classes and the head. The same arrays the runner trains on (same seed, same setting).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from madsl.cli.arguments import positive_int, seed
from madsl.cli.common import EXIT_OK
from madsl.errors import MadslError, did_you_mean


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "data", help="write a generated task split (inputs, targets, setting, vocabulary) to .npz, or print rows",
        description="Generate one split of a task as madsl eval would (same seed, same arrays) and write it to "
                    "an .npz file, to inspect it, feed it to another framework or compare it with the "
                    "reference implementation's data; --format text prints rows instead.")
    p.add_argument("task", metavar="TASK", help="a task name (e.g. in-context-recall)")
    p.add_argument("--set", action="append", dest="settings", default=[], metavar="KEY=VALUE",
                   help="a task setting, e.g. seq_len=512; repeatable (default: the task's baseline)")
    p.add_argument("--conventions", choices=("mad-lab", "madsl"), default="madsl",
                   help="whose task layout: the reference implementation's or madsl's (default: %(default)s)")
    p.add_argument("--split", choices=("train", "test"), default="test", help="(default: %(default)s)")
    p.add_argument("--seed", type=seed, default=0, help="(default: %(default)s)")
    p.add_argument("-o", "--output", metavar="FILE.npz", help="where to write the split")
    p.add_argument("--format", choices=("npz", "text"), default=None,
                   help="npz (with -o; the default) or text: print --rows rows as `madsl/tasks/show.py` does")
    p.add_argument("--rows", type=positive_int, default=3, help="rows to print with --format text (default: 3)")
    p.set_defaults(func=cmd_data)


def cmd_data(args) -> int:
    from madsl.outputs import check_output_path
    from madsl.runner.plan.task_settings import apply_setting_overrides, check_setting_keys, parse_set_option
    from madsl.tasks import TASKS, get_task

    if args.task not in TASKS:
        raise MadslError(f"unknown task {args.task!r}", expected=", ".join(sorted(TASKS)),
                         hint=did_you_mean(args.task, TASKS))
    fmt = args.format or "npz"
    if fmt == "npz" and not args.output:
        raise MadslError("madsl data: nowhere to write the split", expected="-o FILE.npz, or --format text")
    if fmt == "text" and args.output:
        raise MadslError("madsl data: --format text prints to the terminal; -o writes .npz",
                         hint="drop -o, or drop --format text")
    output = check_output_path(args.output, "-o") if args.output else None
    task = get_task(args.task, args.conventions)
    overrides = dict(parse_set_option(text) for text in args.settings)
    check_setting_keys([task], overrides, "--set")
    settings = task.settings(**apply_setting_overrides(task, task.baseline, overrides, "--set"))
    try:
        data = task.generate(settings, args.split, args.seed)
    except ValueError as err:
        conventions = f" (conventions {args.conventions})" if args.conventions != "madsl" else ""
        raise MadslError(f"bad setting for {task.name}{conventions}: {err}", hint="check your --set values") \
            from None
    except MemoryError:  # numpy's allocation failure: a setting far too large for this machine
        raise MadslError(f"{task.name}: the {args.split} split of this setting does not fit in memory",
                         hint="lower the --set values that size it (seq_len, vocab_size, num_train_examples, "
                              "...)") from None
    if fmt == "text":
        print(_text(task, data, settings, args), end="")
        return EXIT_OK
    assert output is not None
    _write_npz(output, data, _info(task, data, settings, args))
    if not getattr(args, "quiet", False):
        print(f"wrote {output}: {task.name} ({args.conventions}) {args.split} split, seed {args.seed}: "
              f"inputs {tuple(data.inputs.shape)}, targets {tuple(data.targets.shape)}")
    return EXIT_OK


def _info(task: Any, data: Any, settings: dict, args) -> dict:
    info = {"task": task.name, "conventions": args.conventions, "split": args.split, "seed": args.seed,
            "settings": settings, "head": task.head, "vocab_size": task.vocab_size(settings),
            "num_classes": task.num_classes(settings), "ignore_index": -100}
    info.update({k: v for k, v in data.meta.items() if k in ("vocab", "compression_position", "num_resampled")})
    return info


def _write_npz(path: Path, data: Any, info: dict) -> None:
    import numpy as np

    arrays = {"inputs": data.inputs, "targets": data.targets,
              **{k: v for k, v in data.meta.items() if isinstance(v, np.ndarray)},
              "info": np.array(json.dumps(info, default=lambda v: v.item() if hasattr(v, "item") else str(v)))}
    from madsl.tasks.cache import save_npz_atomic

    save_npz_atomic(path, arrays)


def _text(task: Any, data: Any, settings: dict, args) -> str:
    from madsl.tasks.show import render_row

    shown = min(args.rows, len(data.inputs))
    lines = [f"{task.name} ({args.conventions}) {args.split} split, seed {args.seed}: "
             f"{len(data.inputs)} rows; showing {shown}"]
    if "vocab" in data.meta:
        lines.append("vocabulary: " + ", ".join(f"{name} [{a}, {b})" for name, (a, b) in data.meta["vocab"].items()))
    for row in range(shown):
        lines += [f"-- row {row}", render_row(task, settings, data, row)]
    return "\n".join(lines) + "\n"
