"""`madsl eval`: train and score specs on the MAD tasks (the runner is imported when the command runs).

Exit codes: 0 every run finished, 2 bad input (a located error, no traceback),
3 some runs failed, 130 interrupted (the runs are resumable).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from madsl.cli.arguments import word_type
from madsl.cli.common import EXIT_INTERRUPTED, EXIT_OK, EXIT_RUNS_FAILED
from madsl.runner.plan.settings import SETTINGS  # torch-free

# a setting's argparse destination: its key, but --set's (KEY=VALUE words, parsed in cmd_eval)
DEST = {"set": "settings"}


def add_setting_options(p: argparse.ArgumentParser) -> None:
    """The options of what runs train, one a setting of madsl.runner.plan.settings (its flag, help,
    choices, metavar, and its word parser as the argparse type)."""
    group = p.add_argument_group(
        "what runs train (docs/runner.md, \"Overriding knobs\"; default: the spec's eval: section, else the protocol's)"
    )
    for setting in SETTINGS:
        if setting.flag is None:
            continue
        options = dict(setting.cli)
        if setting.text is not None:
            options["type"] = word_type(setting.text)
        group.add_argument(
            setting.flag, dest=DEST.get(setting.key, setting.key), default=None, help=setting.help, **options
        )


def add_execution_options(p: argparse.ArgumentParser) -> None:
    """The options of how runs execute, one an option of madsl.runner.execute.options (default None
    here: an option not given keeps the library's default, and the executor checks can tell)."""
    from madsl.runner.execute.options import OPTIONS  # torch-free

    groups = {"": p, "cluster": p.add_argument_group("where runs execute (docs/cluster.md)")}
    for option in OPTIONS:
        options = dict(option.cli)
        if options.get("action") == "boolean":
            options["action"] = argparse.BooleanOptionalAction
        if option.text is not None:
            options["type"] = word_type(option.text)
        if options.get("action") != "store_true":
            options["default"] = None
        groups[option.group].add_argument(option.flag, dest=option.name, help=option.help, **options)
    p.add_argument(
        "--track",
        action="append",
        metavar="KIND:DIR",
        help="also log every run to a tracker as it trains: tensorboard:DIR or mlflow:DIR (repeatable; needs "
        "madsl[tensorboard] or madsl[mlflow]; docs/report.md)",
    )


def with_tracking(args: argparse.Namespace, reporter: Any, db: Any) -> Any:
    """`reporter` with a tracker per --track (each KIND:DIR checked before any work)."""
    if not getattr(args, "track", None):
        return reporter
    from madsl.report.live import parse_track, tracked

    return tracked(reporter, [parse_track(value) for value in args.track], db)


def execution_values(args: argparse.Namespace) -> dict:
    """The execution options given on the command line, by name."""
    from madsl.runner.execute.options import OPTIONS

    return {option.name: getattr(args, option.name) for option in OPTIONS if getattr(args, option.name) is not None}


def command_settings(args: argparse.Namespace, task_settings: dict, sweep: Any) -> dict:
    """Each setting's value by key, as given on the command line, else in the sweep file (its
    train:, protocol: and tasks:); --set's KEY=VALUE words already read into `task_settings`
    (precedence: command line > sweep file > the spec's eval: section > the protocol)."""
    values = {}
    for setting in SETTINGS:
        given = getattr(args, DEST.get(setting.key, setting.key), None)
        values[setting.key] = given if given is not None else sweep.train.get(setting.key)
    values["set"] = task_settings
    values["tasks"] = values["tasks"] or sweep.tasks
    values["protocol"] = values["protocol"] or sweep.protocol
    return values


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval",
        help="train and score specs on the MAD tasks; resumable, results in an SQLite database",
        description="Train every spec on every task setting of a protocol and record the results. "
        "An interrupted eval resumes where it stopped when run again; finished runs are never "
        "repeated. Precedence of every knob: command line > the spec's eval: section > protocol.",
    )
    p.add_argument(
        "specs",
        nargs="+",
        metavar="SPEC",
        help=".mad spec files, or one sweep file (study.yaml: specs, protocol, tasks, vary, train; docs/runner.md)",
    )
    add_setting_options(p)
    add_execution_options(p)
    p.add_argument(
        "--allow-over-budget",
        action="store_true",
        help="also run the specs (and a sweep's variants) that break their spec's budget (default: reported, not run)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="json: print the run summary as JSON instead of tables",
    )
    p.set_defaults(func=cmd_eval)


def _specs_or_sweep(args, settings=None):
    """The specs to evaluate, and the sweep file's knobs (empty without one). A sweep's variants
    that break their spec's budget are reported here and left out unless --allow-over-budget;
    the runs of the rest are counted, and refused past the sweep's cap, before any is planned."""
    from madsl.errors import MadslError
    from madsl.runner.plan.sweep import Sweep, check_planned_runs, is_sweep_file, load_sweep

    sweeps = [path for path in args.specs if is_sweep_file(path)]
    if not sweeps:
        return _within_budget(args), Sweep(path="", variants=[])
    if len(args.specs) > 1:
        raise MadslError(
            f"a sweep file ({sweeps[0]}) is evaluated on its own",
            hint="list the other specs under its specs:, or run them in another madsl eval",
        )
    sweep = load_sweep(sweeps[0])
    for variant in sweep.variants:
        if variant.over_budget:
            verdict = "run anyway (--allow-over-budget)" if args.allow_over_budget else "not run"
            print(f"over budget, {verdict}: {variant.spec.name}: " + "; ".join(variant.over_budget), file=sys.stderr)
    variants = sweep.runnable(args.allow_over_budget)
    if not variants:
        raise MadslError(
            f"{sweep.path}: every variant breaks its spec's budget; nothing to run",
            hint="--allow-over-budget runs them anyway",
        )
    from madsl.runner.plan.evaluation import cli_overrides

    check_planned_runs(sweep, cli_overrides(**command_settings(args, settings, sweep)), variants)
    return [variant.spec for variant in variants], sweep


def _within_budget(args) -> list[str]:
    """The spec files to evaluate: one that breaks its own `budget:` is reported and left out, as a sweep's
    variant is (--allow-over-budget runs it anyway): `madsl check` would fail it, so its scores would
    stand for a model other than the one the budget describes."""
    from madsl.errors import MadslError
    from madsl.fit import fitted
    from madsl.graph import account
    from madsl.lang.budget import check
    from madsl.lang.spec import load_spec

    kept = []
    for path in args.specs:
        spec = load_spec(path)
        if spec.fit:  # trained with its budget.fit solved, as the plan loads it (load_specs)
            spec, _ = fitted(spec)
        violations = check(account(spec, seq_len=spec.budget_seq_len).totals, spec.budget) if spec.budget else []
        if violations:
            verdict = "run anyway (--allow-over-budget)" if args.allow_over_budget else "not run"
            print(f"over budget, {verdict}: {path}: " + "; ".join(v.message() for v in violations), file=sys.stderr)
            if not args.allow_over_budget:
                continue
        kept.append(path)
    if not kept:
        raise MadslError(
            "every spec breaks its budget; nothing to run",
            hint="`madsl check SPEC` shows what is over; --allow-over-budget runs them anyway",
        )
    return kept


def check_executor_options(args) -> None:
    """--address, --cpus-per-run and --gpus-per-run place runs on Ray, --workers and --devices on
    this machine: given to the other executor they would be ignored, so they are refused instead."""
    from madsl.errors import MadslError

    given = [
        flag
        for flag, value in (
            ("--address", args.address),
            ("--cpus-per-run", args.cpus_per_run),
            ("--gpus-per-run", args.gpus_per_run),
        )
        if value is not None
    ]
    executor = args.executor or "local"
    if given and executor == "local":
        raise MadslError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --executor ray",
            hint="add --executor ray, or use --workers N for local processes",
        )
    local = [flag for flag, value in (("--workers", args.workers), ("--devices", args.devices)) if value is not None]
    if local and executor == "ray":  # Ray decides how many runs at once, and where
        raise MadslError(
            f"{', '.join(local)} {'applies' if len(local) == 1 else 'apply'} only to the local executor",
            hint="on Ray, size each run with --cpus-per-run / --gpus-per-run; the cluster places them",
        )


def cmd_eval(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    from madsl.cli.progress import RichReporter, print_summary, stop_on_signals
    from madsl.runner.api import evaluate
    from madsl.runner.config import EvalConfig
    from madsl.runner.execute.options import Execution
    from madsl.runner.plan.task_settings import parse_set_option

    check_executor_options(args)
    settings = dict(parse_set_option(text) for text in args.settings or ())
    specs, sweep = _specs_or_sweep(args, settings)
    config = EvalConfig(settings=command_settings(args, settings, sweep), execution=Execution(**execution_values(args)))
    shown = not args.quiet and args.format == "text" and not args.dry_run
    reporter = (_EpochLines() if args.verbose else RichReporter()) if shown else None
    if args.dry_run and not args.quiet:  # what the plan is at, once it takes more than a second
        from madsl.cli.progress import PlanProgress

        reporter = PlanProgress(f"planning {len(specs)} spec{'s' if len(specs) != 1 else ''}")
    reporter = with_tracking(args, reporter, config.execution.db)
    try:
        with stop_on_signals() as stop, reporter or contextlib.nullcontext():
            summary = evaluate(specs, config, reporter=reporter, stop=stop)
    except KeyboardInterrupt:
        print("aborted; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.dry_run:
        from madsl.runner.plan.cost import render_cost

        print("".join(note + "\n" for note in summary["notes"]), end="", file=sys.stderr)
        print(
            json.dumps(summary["plan"], indent=2) if args.format == "json" else render_cost(summary["plan"]),
            end="\n" if args.format == "json" else "",
        )
        return EXIT_OK
    if shown:
        print_summary(config.execution.db, summary)
    if args.format == "json":
        print(json.dumps(summary, indent=2))
    elif args.quiet:
        from madsl.runner.reports.outputs import load_scores, render_text

        print(render_text(load_scores(config.execution.db, run_ids=summary["run_ids"])), end="")
        # quiet keeps the errors: a table of an unfinished evaluation must not pass for the result
        if summary["failed"]:
            print(
                f"{len(summary['failed'])} run(s) failed; rerun `madsl eval` to retry them (errors are in the "
                f"runs table of {config.execution.db})",
                file=sys.stderr,
            )
        if summary["interrupted"]:
            print(
                f"interrupted: {summary['interrupted']} run(s) left; rerun the same command to resume", file=sys.stderr
            )
    if summary["interrupted"]:
        return EXIT_INTERRUPTED
    return EXIT_RUNS_FAILED if summary["failed"] else EXIT_OK


def _EpochLines():
    """-v: the progress bars, and a line per finished epoch."""
    from madsl.cli.progress import RichReporter

    class EpochLines(RichReporter):
        def epoch(self, job, metrics) -> None:
            super().epoch(job, metrics)
            shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "epoch"}
            self.message(
                f"{job.label} epoch {metrics['epoch']}: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(shown.items()))
            )

    return EpochLines()
