"""`madsl report`: the leaderboard of a results database (the runner is imported when the command runs)."""

from __future__ import annotations

import json
import sys

from madsl.cli.arguments import positive_number
from madsl.cli.common import EXIT_OK
from madsl.errors import MadslError
from madsl.outputs import check_output_path
from madsl.runner.plan.settings import PROTOCOL_NAMES  # torch-free
from madsl.scaling.optima import CONVENTIONS  # torch-free


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="leaderboard of a results database: MAD scores per task and overall",
        description="Scores of every architecture in the database: per task the mean over "
        "settings of the best accuracy over the lr x wd grid; the MAD score is "
        "the mean over tasks.",
    )
    p.add_argument("--db", default="madsl-results.db", help="results database (default: %(default)s)")
    p.add_argument(
        "--format",
        choices=("text", "json", "csv"),
        default="text",
        help="text: the leaderboard tables; json or csv: records (see --rows)",
    )
    p.add_argument(
        "--rows",
        choices=("tasks", "settings", "runs"),
        default="tasks",
        help="json / csv: one record per spec and task (default), per task setting (its score, the "
        "setting's knobs as columns) or per run; settings and runs add a row per evaluation "
        "length (docs/runner.md)",
    )
    p.add_argument("--plot", metavar="PATH", help="also write a heatmap PNG (needs madsl[plot])")
    p.add_argument(
        "--plot-sweeps",
        metavar="DIR",
        help="also write a figure per task into DIR: the score against each difficulty knob its runs "
        "vary (sequence length, training-set size, vocabulary, noise, ...), one line per "
        "architecture (needs madsl[plot]); a folder holding other files needs --force",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="--plot-sweeps (or --study's --plot) into a folder that "
        "holds other files too (they are left as they are; the "
        "figures are replaced)",
    )
    p.add_argument(
        "--protocol",
        metavar="NAME",
        help="only runs filed under this protocol (" + ", ".join(PROTOCOL_NAMES) + "), or under a "
        "label such as quick+custom (runs with settings, lr, wd, epochs, batch size, seeds or "
        "frozen layers of their own)",
    )
    _add_publish_arguments(p)
    _add_study_arguments(p)
    p.set_defaults(func=cmd_report)


def cmd_publish(args) -> int:
    """`--export KIND DIR` and `--html DIR`: the database where researchers look (madsl.report)."""
    given = [
        flag
        for flag, value in (("--study", args.study), ("--plot", args.plot), ("--plot-sweeps", args.plot_sweeps))
        if value
    ]
    given += ["--protocol"] if args.protocol else []
    given += ["--format"] if args.format != "text" else []
    if given:
        raise MadslError(
            f"{', '.join(given)} cannot go with --export or --html (they write every run of the database)",
            hint="run them as commands of their own",
        )
    if args.export:
        from madsl.report.export import check_folder, export

        kind, folder = args.export
        check_folder(kind, folder, f"--export {kind}", args.force)  # before the database is read
        synced = export(args.db, kind, folder, force=args.force)
        if not args.quiet:
            print(
                f"{kind}: {synced.written} records written, {synced.current} already there: {synced.folder}",
                file=sys.stderr,
            )
    if args.html:
        from madsl.report.html import check_folder as check_page_folder
        from madsl.report.html import write_page

        check_page_folder(args.html, args.force)
        path = write_page(args.db, args.html, force=args.force)
        if not args.quiet:
            print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def _add_publish_arguments(p) -> None:
    """`madsl report --export KIND DIR` and `--html DIR` (madsl.report)."""
    p.add_argument(
        "--export",
        nargs=2,
        metavar=("KIND", "DIR"),
        help="replay the database into a tracker instead: tensorboard DIR (event files; tensorboard --logdir DIR) "
        "or mlflow DIR (a local store, DIR/mlflow.db): every run's config, curves and scores, the studies' "
        "and searches' too; a second export writes nothing new (needs madsl[tensorboard] / madsl[mlflow]; "
        "docs/report.md)",
    )
    p.add_argument(
        "--html",
        metavar="DIR",
        help="write one self-contained page, DIR/index.html, instead: the sortable leaderboard, the heatmap, the "
        "runs, the sweep curves, the studies and searches, the commands (docs/report.md)",
    )


def _add_study_arguments(p) -> None:
    """`madsl report --study` and the options that go with it."""
    p.add_argument(
        "--study",
        metavar="STUDY.yaml",
        help="report a scaling study (madsl scale) instead: IsoFLOP optima, frontiers with bootstrap "
        "intervals, the parametric fit, the state-optimal view and the MAD correlation; --plot "
        "then names a folder for its figures (docs/scaling.md)",
    )
    p.add_argument(
        "--mad-db",
        metavar="PATH",
        help="with --study: the database holding the architectures' MAD scores (default: --db)",
    )
    p.add_argument(
        "--export-runs",
        metavar="RUNS.csv",
        help="with --study: also write every run with a stored result as CSV (design, N conventions, tokens, "
        "epochs, loss): the raw data --runs refits from",
    )
    p.add_argument(
        "--export-mad",
        metavar="SCORES.csv",
        help="with --study: also write the MAD scores the report uses as CSV (arch, spec_hash, score)",
    )
    p.add_argument(
        "--runs",
        metavar="RUNS.csv",
        help="with --study: fit the runs of a runs file (--export-runs) instead of the database: a refit "
        "that trains and reads no database",
    )
    p.add_argument(
        "--mad-scores",
        metavar="SCORES.csv",
        help="with --study: the MAD scores of a scores file (--export-mad) instead of --mad-db",
    )
    p.add_argument(
        "--params",
        choices=CONVENTIONS,
        help="with --study: the N the frontiers, the parametric fits and the state-optimal view use: total "
        "(embedding and head included, the default), non-embedding, or active (a routed layer's chosen "
        "experts only); each optimum's N* is reported under all three",
    )
    p.add_argument(
        "--budget",
        type=positive_number,
        metavar="FLOPS",
        help="with --study: the IsoFLOP budget the MAD correlation is taken at (default: the largest "
        "of the budgets where the most scored architectures have an optimum inside their sizes trained)",
    )


def cmd_study(args) -> int:
    """`madsl report --study`: a scaling study's fits, as text, json or csv, and its figures. Its
    outputs (the databases read, the --plot folder) are checked before the work."""
    import csv

    from madsl.outputs import json_text
    from madsl.scaling.report import (
        check_figures_folder,
        check_report_inputs,
        export_raw,
        render_report,
        report_records,
        report_rows,
        study_report,
        write_figures,
    )

    for flag, given in (("--plot-sweeps", args.plot_sweeps), ("--protocol", args.protocol)):
        if given is not None:  # else silently ignored
            raise MadslError(
                f"{flag} reads a leaderboard's MAD runs, not a study's",
                hint="with --study: --plot names the folder of its figures, --mad-db and --budget the MAD correlation",
            )
    _check_raw_options(args)
    if args.plot:
        check_figures_folder(args.plot, force=args.force)
    if args.runs is None:
        check_report_inputs(args.db, args.mad_db)
    for path in (args.export_runs, args.export_mad):
        if path is not None:
            check_output_path(path, "--export-runs" if path == args.export_runs else "--export-mad")
    report = study_report(
        args.study,
        args.db,
        mad_db=args.mad_db,
        budget=args.budget,
        runs=args.runs,
        mad_scores=args.mad_scores,
        params=args.params or "total",
    )
    if args.export_runs or args.export_mad:
        for path in export_raw(args.study, args.db, args.mad_db, args.export_runs, args.export_mad):
            if not args.quiet:
                print(f"wrote {path}", file=sys.stderr)
    if args.format == "json":
        print(json_text(report_records(report), indent=2, default=str))
    elif args.format == "csv":
        rows = report_rows(report)
        writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]) if rows else ["arch"])
        writer.writeheader()
        writer.writerows(rows)
    else:
        sys.stdout.write(render_report(report))
    if args.plot:
        for path in write_figures(report, args.plot):
            if not args.quiet:
                print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def _check_raw_options(args) -> None:
    """The raw-data options that cannot go together: a refit from files exports nothing, and the
    MAD scores come from one place."""
    if args.runs is not None and (args.export_runs or args.export_mad):
        raise MadslError(
            "--export-runs and --export-mad write a study's databases out; --runs refits from a file",
            hint="export from the databases (--db, --mad-db) first, then refit with --runs",
        )
    if args.mad_scores is not None and args.mad_db is not None:
        raise MadslError("--mad-scores and --mad-db both name the MAD scores", hint="give one of them")


def cmd_report(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    if args.export or args.html:
        return cmd_publish(args)
    if args.study:
        return cmd_study(args)
    study_only = (
        ("--mad-db", args.mad_db),
        ("--budget", args.budget),
        ("--runs", args.runs),
        ("--mad-scores", args.mad_scores),
        ("--export-runs", args.export_runs),
        ("--export-mad", args.export_mad),
        ("--params", args.params),
    )
    for flag, given in study_only:
        if given is not None:  # else silently ignored
            raise MadslError(
                f"{flag} belongs to --study (a scaling study's fits, raw data and MAD correlation)",
                hint="add --study STUDY.yaml, or leave it out",
            )
    from madsl.runner.reports.outputs import report_outputs

    text, written, flat = report_outputs(
        args.db,
        fmt=args.format,
        plot=args.plot,
        protocol=args.protocol,
        rows=args.rows,
        plot_sweeps=args.plot_sweeps,
        force=args.force,
    )
    sys.stdout.write(text)
    if not args.quiet:
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
        if flat:
            print(f"no sweep to plot for {', '.join(flat)}: evaluated at one setting only", file=sys.stderr)
    return EXIT_OK


def add_export_parser(subparsers) -> None:
    from madsl.weights.mapping import families

    p = subparsers.add_parser(
        "export",
        help="write a run's kept model (madsl eval --keep best) as safetensors + JSON, or a model as a "
        "Hugging Face checkpoint (--to-hf)",
    )
    p.add_argument(
        "run_id",
        metavar="RUN_ID|MODEL_DIR",
        help="the run (a unique prefix of its id is enough); with --to-hf, a madsl model folder "
        "(`madsl import --out`, madsl.save) or a run of a next-token task",
    )
    p.add_argument(
        "--to-hf",
        metavar="MODEL_TYPE",
        choices=sorted(families()),
        help="write the model folder as a Hugging Face checkpoint of this family (config.json + "
        "model.safetensors for transformers' from_pretrained; docs/weights.md): " + ", ".join(sorted(families())),
    )
    p.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="folder to write model.safetensors and config.json into"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write into a folder that holds other files too (they are left as they are)",
    )
    p.add_argument("--db", help="results database (default: madsl-results.db)")
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text: a line saying what was written (on stderr); json: the run id, the folder and its files (on stdout)",
    )
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    from pathlib import Path

    from madsl.runner.store.files import store_files_dir
    from madsl.runner.store.kept import EXPORTED, RUN_ID_PREFIX, export
    from madsl.runner.store.results import DEFAULT_DB

    if args.to_hf:
        return _export_hf(args)
    db = Path(args.db or DEFAULT_DB)
    default = " (the default: no --db given)" if args.db is None else ""
    if not db.is_file():  # else every run id would read as 'no kept model'
        raise MadslError(
            f"no results database at {db}{default}" if not db.exists() else f"results database {db} is not a file",
            hint=f"--db names the database that `madsl eval --keep best` wrote (default: {DEFAULT_DB})",
        )
    if RUN_ID_PREFIX.fullmatch(args.run_id):  # (else export says what a run id is)
        _check_recorded(db, args.run_id, default)
    run_id, out = export(store_files_dir(db), args.run_id, Path(args.output), force=args.force)
    if args.format == "json":
        print(
            json.dumps(
                {"run_id": run_id, "output": str(out), "files": [str(out / name) for name in EXPORTED]}, indent=2
            )
        )
    elif not args.quiet:
        print(f"wrote {out}: run {run_id} (load it with madsl.load_run({str(out)!r}))", file=sys.stderr)
    return EXIT_OK


def _export_hf(args) -> int:
    """`madsl export MODEL_DIR|RUN_ID --to-hf MODEL_TYPE -o DIR`: a madsl model folder, or a run's
    kept model, as a checkpoint."""
    from pathlib import Path

    from madsl.compiler import load
    from madsl.weights.export import CONFIG, WEIGHTS, export_hf

    if Path(args.run_id).is_dir():
        if args.db is not None:
            raise MadslError(f"--db names a results database: {args.run_id} is a model folder, not a run")
        model = load(args.run_id, device="cpu")
    else:
        model = _kept_language_model(args)
    out = export_hf(model, args.to_hf, args.output, force=args.force)
    if args.format == "json":
        print(json.dumps({"model": args.run_id, "to_hf": args.to_hf, "files": [str(out / WEIGHTS), str(out / CONFIG)]}))
    elif not args.quiet:
        print(
            f"wrote {out}: a {args.to_hf} checkpoint (transformers.AutoModelForCausalLM.from_pretrained)",
            file=sys.stderr,
        )
    return EXIT_OK


def _kept_language_model(args):
    """The backbone of a run's kept model (`madsl eval --keep best`), where it is the whole language
    model: a next-token task read through the backbone's own output layer. Its spec states the
    task's vocabulary, which a checkpoint's config.json needs."""
    from pathlib import Path

    from madsl.lang.spec import spec_with
    from madsl.runner.store.files import store_files_dir
    from madsl.runner.store.kept import RUN_ID_PREFIX, kept_folder, load_run
    from madsl.runner.store.results import DEFAULT_DB

    db = Path(args.db or DEFAULT_DB)
    default = " (the default: no --db given)" if args.db is None else ""
    if not db.is_file():
        raise MadslError(
            f"{args.run_id} is no model folder, and no results database is at {db}{default} to find it as a run",
            hint="name a madsl model folder (madsl import --out, madsl.save), or a run with --db",
        )
    if RUN_ID_PREFIX.fullmatch(args.run_id):
        _check_recorded(db, args.run_id, default)
    run_id, folder = kept_folder(store_files_dir(db), args.run_id)
    model = load_run(folder, device="cpu")
    if model.head != "lm" or model.lm_head is not None:
        raise MadslError(
            f"run {run_id[:12]}: its model reads {model.config['task']} through a head of its own "
            f"({model.head}{', mad-lab conventions' if model.lm_head is not None else ''}), not the "
            "backbone's output layer: no causal language model to write",
            hint="--to-hf writes runs of next-token tasks trained with madsl's conventions or lm_head: spec",
        )
    backbone = model.backbone
    backbone.spec = spec_with(backbone.spec, {"vocab": backbone.vocab_size})
    return backbone


def _check_recorded(db, run_id: str, default: str) -> None:
    """A run that the database does not hold is named with the database that was read (and
    `default`: whether that was the default one) and how to list the runs it does hold."""
    import shlex

    from madsl.runner.store.results import Store

    store = Store(db, create=False)
    try:
        if any(row["run_id"].startswith(run_id) for row in store.runs()):
            return
    finally:
        store.close()
    raise MadslError(
        f"no kept model for run {run_id!r}: results database {db}{default} has no run with that id",
        hint=f"`madsl report --db {shlex.quote(str(db))} --format csv --rows runs` lists its runs with "
        "their ids; --db PATH reads another database",
    )
