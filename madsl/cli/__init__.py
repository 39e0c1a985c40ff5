"""The `madsl` command line.

    madsl --version
    madsl compile (SPEC | -t TOPOLOGY) [--dim N] [--vocab V] [--seq-len L] [--format text|json|dot|torch] [-o PATH]
    madsl expand TOPOLOGY [--format text|json]
    madsl check SPEC|DIR|'GLOB'... [--iso-state] [--iso-params TOL] [--format text|json|github|line]
    madsl fit SPEC [--free SYMBOL.PARAM] [--match SPEC --on QUANTITY] [-o PATH]
    madsl eval SPEC... (see `madsl eval --help`)
    madsl report (see `madsl report --help`)
    madsl export RUN_ID -o DIR [--db PATH] [--format text|json]
    madsl schema [-o PATH] [--format json|text]
    madsl convert (--from-megatron PATTERN [--dim N] [--layer SYMBOL.PARAM=VALUE] | --to-megatron SPEC)
    madsl import DIR [-o SPEC] [--out MODEL] [--name NAME]
    madsl data TASK [--set KEY=VALUE] [--conventions mad-lab|madsl] [--split train|test] [--seed N]
               (-o FILE.npz | --format text [--rows N])
    madsl data prepare TEXT... --tokenizer bytes|FILE -o DIR [--val-fraction F]
    madsl scale STUDY [--dry-run] [--workers N] [--rate FLOP/S] (see `madsl scale --help`)
    madsl report --study STUDY [--plot DIR] [--mad-db PATH] [--format text|json|csv]
    madsl search FILE [--dry-run] [--workers N] [--out DIR] (see `madsl search --help`)

Exit codes: 0 success, 1 a budget is violated, 2 bad input, 3 some eval runs failed,
130 interrupted. Bad input prints a located error and never a traceback. Every command
takes -q/--quiet (only errors and the verdict or result) and -v/--verbose (more detail
where a command has it: check prints each spec's layers, eval a line per epoch), before
the command or after it (`madsl -q compile ...`, `madsl compile ... -q`). Every command
that prints a result takes --format; `text` is the human one everywhere (compile's old
name for it, `summary`, still works, with a note on stderr).
`compile` (except --emit torch), `expand` and `check` do not import torch; no module
of this package imports torch or the runner at import time (the commands do, when run).

One module per command group: compile.py (compile, expand), check.py (check), fit.py (fit), evaluate.py (eval),
report.py (report, export), schema.py (schema), convert.py (convert), weights.py (import), data.py (data);
arguments.py holds the argparse value types, common.py the exit
codes and output helpers. Nothing outside this package imports it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from madsl import __version__
from madsl.cli import check, compile, convert, data, evaluate, fit, report, scale, schema, search, weights
from madsl.cli.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, add_verbosity, print_error, show_warnings
from madsl.errors import MadslError, speaking


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="madsl", description="A DSL and compiler for mechanistic architecture design (MAD)."
    )
    parser.add_argument(
        "--version", action="version", version=f"madsl {__version__}", help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    compile.add_parsers(sub)
    check.add_parser(sub)
    fit.add_parser(sub)
    evaluate.add_parser(sub)
    report.add_parser(sub)
    report.add_export_parser(sub)
    schema.add_parser(sub)
    convert.add_parser(sub)
    weights.add_parser(sub)
    data.add_parser(sub)
    scale.add_parser(sub)
    search.add_parser(sub)
    add_verbosity(parser, default=False)  # before the command (madsl -q compile ...) or after it:
    for command in sub.choices.values():  # unset there unless given, so as not to undo the global one
        add_verbosity(command, default=argparse.SUPPRESS)
    return parser


def option_words(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """The library's names of `command`'s settings -> its flags (what messages call them here)."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    words = {
        action.dest: next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
        for action in subparsers.choices[command]._actions
        if action.option_strings
    }
    from madsl.runner.plan.settings import SETTINGS  # torch-free

    words.update({setting.key: setting.flag for setting in SETTINGS if setting.flag})
    words.update({"settings_overrides": "--set", "fmt": "--format"})  # the library's other names
    return words


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quiet and args.verbose:  # one given before the command, the other after it
        parser.error("argument -v/--verbose: not allowed with argument -q/--quiet")
    show_warnings()  # what the library logs (an unusable rate cache, a damaged row) as `warning:` lines
    try:
        with speaking(option_words(parser, args.command)):
            return args.func(args)
    except MadslError as err:
        print_error(err)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except ModuleNotFoundError as err:  # the light install (the CI gate) has no torch or numpy
        if err.name not in TRAINING_MODULES:
            raise
        print_error(
            MadslError(
                f"madsl {args.command} needs {err.name}, which is not installed",
                hint="install the torch extra: pip install 'madsl[torch]' (check, compile, "
                "expand, fit, schema and convert work without it)",
            )
        )
        return EXIT_BAD_INPUT


TRAINING_MODULES = ("torch", "numpy", "scipy", "tokenizers")  # the torch extra's


__all__ = ["build_parser", "main"]
