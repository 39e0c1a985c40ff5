"""argparse wiring of `madsl eval` and `madsl report` (registered by madsl/cli.py).

Kept light: nothing here imports torch; the commands import the runner when they run.
Exit codes: 0 every run finished, 2 bad input (a located error, no traceback),
3 some runs failed, 130 interrupted (the runs are resumable).
"""
from __future__ import annotations

import argparse
import sys

from madsl.cli import _positive_int  # the one definition; this module is the CLI's own wiring

EXIT_OK, EXIT_BAD_INPUT, EXIT_RUNS_FAILED, EXIT_INTERRUPTED = 0, 2, 3, 130
PROTOCOL_NAMES = ("smoke", "quick", "baseline", "paper")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text}")
    return value


def _lengths(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated lengths such as 64,128,256, got {text!r}") \
            from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive lengths, got {text!r}")
    return values


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "eval", help="train and score specs on the MAD tasks; resumable, results in an SQLite database",
        description="Train every spec on every task setting of a protocol and record the results. "
                    "An interrupted eval resumes where it stopped when run again; finished runs are never "
                    "repeated. Precedence of every knob: command line > the spec's eval: section > protocol.")
    p.add_argument("specs", nargs="+", metavar="SPEC", help=".mad spec files")
    p.add_argument("--task", action="append", dest="tasks", metavar="NAME",
                   help="a task name, or all (the six MAD tasks); repeatable (default: all)")
    p.add_argument("--protocol", choices=PROTOCOL_NAMES, default=None,
                   help="smoke (seconds), quick (~10 min per architecture on 2 CPU cores), baseline "
                        "(baseline settings, full grid, 200 epochs), paper (every setting; default: the "
                        "spec's eval.protocol, else quick)")
    p.add_argument("--db", default="madsl-results.db", help="results database (default: %(default)s)")
    p.add_argument("--workers", type=_positive_int, default=1, help="runs in parallel (local processes)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--set", action="append", dest="settings", default=[], metavar="KEY=VALUE",
                   help="a task setting, e.g. seq_len=512, or TASK.KEY=VALUE for one task; repeatable")
    p.add_argument("--lr", type=_number, action="append", help="learning rate(s) instead of the grid's")
    p.add_argument("--wd", type=_number, action="append", help="weight decay(s) instead of the grid's")
    p.add_argument("--epochs", type=_positive_int)
    p.add_argument("--batch-size", type=_positive_int)
    p.add_argument("--seed", type=_non_negative_int, action="append", help="seed(s) of data, init and order")
    p.add_argument("--eval-lengths", type=_lengths, metavar="L1,L2,...",
                   help="after training, also evaluate the best model at these sequence lengths")
    p.add_argument("--freeze", action="append", metavar="NAME",
                   help="do not train these layers: a symbol (Mb), a tag (#a) or embedding; repeatable")
    p.add_argument("--quiet", action="store_true", help="no progress bars, only the final table")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: print the run summary as JSON instead of tables")
    p.set_defaults(func=cmd_eval)
    return p


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="leaderboard of a results database: MAD scores per task and overall",
                              description="Scores of every architecture in the database: per task the mean over "
                                          "settings of the best accuracy over the lr x wd grid; the MAD score is "
                                          "the mean over tasks.")
    p.add_argument("--db", default="madsl-results.db", help="results database (default: %(default)s)")
    p.add_argument("--format", choices=("text", "json", "csv"), default="text")
    p.add_argument("--plot", metavar="PATH", help="also write a heatmap PNG (needs madsl[plot])")
    p.add_argument("--protocol", choices=PROTOCOL_NAMES, help="only runs of this protocol")
    p.set_defaults(func=cmd_report)
    return p


def cmd_eval(args) -> int:
    from madsl.errors import MadslError

    try:
        from madsl.runner.api import evaluate
        from madsl.runner.protocols import parse_set_option

        settings = dict(parse_set_option(text) for text in args.settings)
        summary = evaluate(args.specs, tasks=args.tasks, protocol=args.protocol, db=args.db, workers=args.workers,
                           device=args.device, settings_overrides=settings, lr=args.lr, wd=args.wd,
                           epochs=args.epochs, seed=args.seed, batch_size=args.batch_size,
                           eval_lengths=args.eval_lengths, freeze=args.freeze,
                           progress=not args.quiet and args.format == "text")
    except MadslError as err:
        print(err.render(), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("aborted; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.format == "json":
        import json

        print(json.dumps(summary, indent=2))
    elif args.quiet:
        from madsl.runner.report import load_scores, render_text

        print(render_text(load_scores(args.db, run_ids=summary["run_ids"])), end="")
    if summary["interrupted"]:
        return EXIT_INTERRUPTED
    return EXIT_RUNS_FAILED if summary["failed"] else EXIT_OK


def cmd_report(args) -> int:
    from madsl.errors import MadslError

    try:
        from madsl.runner.api import report

        text = report(args.db, fmt=args.format, plot=args.plot, protocol=args.protocol)
    except MadslError as err:
        print(err.render(), file=sys.stderr)
        return EXIT_BAD_INPUT
    sys.stdout.write(text)
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return EXIT_OK
