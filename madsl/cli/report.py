"""`madsl report`: the leaderboard of a results database (the runner is imported when the command runs)."""
from __future__ import annotations

import sys

from madsl.cli.common import EXIT_OK
from madsl.runner.plan.settings import PROTOCOL_NAMES  # torch-free


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="leaderboard of a results database: MAD scores per task and overall",
                              description="Scores of every architecture in the database: per task the mean over "
                                          "settings of the best accuracy over the lr x wd grid; the MAD score is "
                                          "the mean over tasks.")
    p.add_argument("--db", default="madsl-results.db", help="results database (default: %(default)s)")
    p.add_argument("--format", choices=("text", "json", "csv"), default="text",
                   help="text: the leaderboard tables; json or csv: records (see --rows)")
    p.add_argument("--rows", choices=("tasks", "settings", "runs"), default="tasks",
                   help="json / csv: one record per spec and task (default), per task setting (its score, the "
                        "setting's knobs as columns) or per run; settings and runs add a row per evaluation "
                        "length (docs/runner.md)")
    p.add_argument("--plot", metavar="PATH", help="also write a heatmap PNG (needs madsl[plot])")
    p.add_argument("--plot-sweeps", metavar="DIR",
                   help="also write a figure per task into DIR: the score against each difficulty knob its runs "
                        "vary (sequence length, training-set size, vocabulary, noise, ...), one line per "
                        "architecture (needs madsl[plot]); a folder holding other files needs --force")
    p.add_argument("--force", action="store_true", help="--plot-sweeps into a folder that holds other files too "
                                                        "(they are left as they are; task figures are replaced)")
    p.add_argument("--protocol", metavar="NAME",
                   help="only runs filed under this protocol (" + ", ".join(PROTOCOL_NAMES) + "), or under a "
                        "label such as quick+custom (runs with settings, lr, wd, epochs, batch size, seeds or "
                        "frozen layers of their own)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    from madsl.runner.reports.outputs import report_outputs

    text, written, flat = report_outputs(args.db, fmt=args.format, plot=args.plot, protocol=args.protocol,
                                         rows=args.rows, plot_sweeps=args.plot_sweeps, force=args.force)
    sys.stdout.write(text)
    if not args.quiet:
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        if flat:
            print(f"no sweep to plot for {', '.join(flat)}: evaluated at one setting only", file=sys.stderr)
    return EXIT_OK


def add_export_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a run's kept model (madsl eval --keep best) as safetensors + JSON")
    p.add_argument("run_id", metavar="RUN_ID", help="the run (a unique prefix of its id is enough)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write model.safetensors and "
                                                                         "config.json into")
    p.add_argument("--force", action="store_true", help="write into a folder that holds other files too "
                                                        "(they are left as they are)")
    p.add_argument("--db", default="madsl-results.db", help="results database (default: %(default)s)")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    from pathlib import Path

    from madsl.runner.store.kept import export
    from madsl.runner.store.files import store_files_dir

    from madsl.errors import MadslError

    db = Path(args.db)
    if not db.is_file():  # else every run id would read as 'no kept model'
        raise MadslError(f"no results database at {db}" if not db.exists() else f"results database {db} is not a file",
                         hint="--db names the database that `madsl eval --keep best` wrote "
                              "(default: madsl-results.db)")
    run_id, out = export(store_files_dir(db), args.run_id, Path(args.output), force=args.force)
    if not args.quiet:
        print(f"wrote {out}: run {run_id} (load it with madsl.load_run({str(out)!r}))", file=sys.stderr)
    return EXIT_OK
