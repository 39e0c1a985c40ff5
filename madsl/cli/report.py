"""`madsl report`: the leaderboard of a results database (the runner is imported when the command runs)."""
from __future__ import annotations

import sys

from madsl.cli.common import EXIT_OK
from madsl.cli.evaluate import PROTOCOL_NAMES


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="leaderboard of a results database: MAD scores per task and overall",
                              description="Scores of every architecture in the database: per task the mean over "
                                          "settings of the best accuracy over the lr x wd grid; the MAD score is "
                                          "the mean over tasks.")
    p.add_argument("--db", default="madsl-results.db", help="results database (default: %(default)s)")
    p.add_argument("--format", choices=("text", "json", "csv"), default="text",
                   help="text: the leaderboard tables; json or csv: one record per spec and task")
    p.add_argument("--plot", metavar="PATH", help="also write a heatmap PNG (needs madsl[plot])")
    p.add_argument("--protocol", choices=PROTOCOL_NAMES, help="only runs of this protocol")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    from madsl.runner.api import report

    text = report(args.db, fmt=args.format, plot=args.plot, protocol=args.protocol)
    sys.stdout.write(text)
    if args.plot and not args.quiet:
        print(f"wrote {args.plot}", file=sys.stderr)
    return EXIT_OK
