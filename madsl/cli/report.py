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
    p.add_argument("--protocol", metavar="NAME",
                   help="only runs filed under this protocol (" + ", ".join(PROTOCOL_NAMES) + "), or under a "
                        "label such as quick+custom (runs with settings, lr, wd, epochs, batch size, seeds or "
                        "frozen layers of their own)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    from madsl.runner.api import report

    text = report(args.db, fmt=args.format, plot=args.plot, protocol=args.protocol)
    sys.stdout.write(text)
    if args.plot and not args.quiet:
        print(f"wrote {args.plot}", file=sys.stderr)
    return EXIT_OK


def add_export_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a run's kept model (madsl eval --keep best) as safetensors + JSON")
    p.add_argument("run_id", metavar="RUN_ID", help="the run (a unique prefix of its id is enough)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write model.safetensors and "
                                                                         "config.json into")
    p.add_argument("--db", default="madsl-results.db", help="results database (default: %(default)s)")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    from pathlib import Path

    from madsl.runner.kept import export
    from madsl.runner.store import store_files_dir

    run_id, out = export(store_files_dir(Path(args.db)), args.run_id, Path(args.output))
    if not args.quiet:
        print(f"wrote {out}: run {run_id} (load it with madsl.load_run({str(out)!r}))", file=sys.stderr)
    return EXIT_OK
