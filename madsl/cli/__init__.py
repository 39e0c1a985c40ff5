"""The `madsl` command line.

    madsl compile (SPEC | -t TOPOLOGY) [--dim N] [--vocab V] [--seq-len L] [--emit summary|json|dot|torch] [-o PATH]
    madsl expand TOPOLOGY [--format text|json]
    madsl check SPEC... [--iso-state] [--iso-params TOL] [--format text|json]
    madsl fit SPEC [--free SYMBOL.PARAM] [--match SPEC --on QUANTITY] [-o PATH]
    madsl eval SPEC... (see `madsl eval --help`)
    madsl report (see `madsl report --help`)

Exit codes: 0 success, 1 a budget is violated, 2 bad input, 3 some eval runs failed,
130 interrupted. Bad input prints a located error and never a traceback.
`compile` (except --emit torch), `expand` and `check` do not import torch; no module
of this package imports torch or the runner at import time (the commands do, when run).

One module per command group: layout.py (compile, expand, check), fit.py (fit), evaluate.py (eval),
report.py (report); arguments.py holds the argparse value types, common.py the exit
codes and output helpers. Nothing outside this package imports it.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from madsl.cli import evaluate, fit, layout, report
from madsl.cli.common import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, print_error
from madsl.errors import MadslError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="madsl", description="A DSL and compiler for mechanistic "
                                                               "architecture design (MAD).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    layout.add_parsers(sub)
    fit.add_parser(sub)
    evaluate.add_parser(sub)
    report.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except MadslError as err:
        print_error(err)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


__all__ = ["build_parser", "main"]
