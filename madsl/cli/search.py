"""`madsl search FILE`: evolve topologies under budgets, scored by MAD, on the executors of `madsl eval`
(docs/search.md). The runner and the search are imported when the command runs (the search file's
keys aside, torch-free).

Exit codes: 0 the search finished, 2 bad input (a located error, no traceback, before anything
trains) or a search over the cost guard not confirmed (madsl.search.loop.over_cost; --yes), 3 some
candidates' runs failed (they count as unscored), 130 interrupted (rerunning the same command
resumes the search where it stopped).
"""

from __future__ import annotations

import json
import signal
import sys
from functools import partial
from pathlib import Path

from madsl.cli.common import EXIT_INTERRUPTED, EXIT_OK, EXIT_RUNS_FAILED
from madsl.cli.evaluate import add_execution_options, check_executor_options, execution_values
from madsl.search.config import MINIMIZABLE

OUTPUT_FILES = (
    "front.png",
    "generations.png",
    "search.json",
    "calibration.json",
    "calibration.csv",
    "front-study.yaml",
)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "search",
        help="architecture search: evolve topologies under budgets, scored on the MAD tasks",
        description="Search the space of a search file (NSGA-II, regularized evolution or random search): every "
        "candidate is built, solved into the budget and accounted before it trains, scored through "
        "the same runner and results database as `madsl eval`, and never trained twice. An "
        "interrupted search resumes where it stopped when run again.",
    )
    p.add_argument("file", metavar="FILE", help="a search file (YAML: space, budget, objectives, algorithm)")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where the front's .mad files and the figures go (default: beside --db, <db>.search-NAME/)",
    )
    p.add_argument("--force", action="store_true", help="--out into a folder that holds other files too")
    p.add_argument(
        "--state", metavar="PATH", help="the search's state file (default: beside --db, <db>.search-NAME.json)"
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="start the search over, ignoring a saved state (finished "
        "runs stay in the results database and are not retrained)",
    )
    p.add_argument(
        "--plot-x",
        choices=MINIMIZABLE,
        default=None,
        help="the front figure's x axis (default: the first minimised objective, else fixed_state)",
    )
    p.add_argument(
        "--yes",
        action="store_true",
        help="train without asking where the search's estimated cost is over the cost guard "
        "(more than an hour of run time; docs/search.md)",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="score the file's references and the initial population only (the search after it reuses "
        "their runs), and write calibration.json and calibration.csv to --out: is the fitness worth searching?",
    )
    p.add_argument(
        "--then-scale",
        metavar="STUDY",
        help="a study file whose data, budgets, sizes and recipe check the front at scale: writes "
        "front-study.yaml to --out, the front's specs beside the study's architectures (madsl scale it)",
    )
    add_execution_options(p)
    p.add_argument("--format", choices=("text", "json"), default="text", help="json: every output as JSON")
    p.set_defaults(func=cmd_search)


def _out_dir(args, search) -> Path:
    from madsl.errors import Location, MadslError
    from madsl.outputs import check_output_dir
    from madsl.paths import require_path, safe_file_name

    if args.out is not None:
        named = require_path(args.out, "--out")
    else:  # beside the database, named after the search: a plain file name, so the folder stays beside it
        db = require_path(args.db or "madsl-results.db", "--db")
        named = db.with_name(f"{db.stem}.search-{safe_file_name(search.name, 'the search name')}")
    owns = lambda name: name in OUTPUT_FILES or (name.startswith(f"{search.name}-") and name.endswith(".mad"))  # noqa
    try:
        return check_output_dir(named, "--out", owns, force=args.force, writes="the front's spec files and the figures")
    except MadslError as err:  # located at the folder it names
        raise MadslError(
            err.message,
            err.location if err.location.file else Location(str(named)),
            expected=err.expected,
            hint=err.hint,
        ) from None


def _check_state_path(args) -> None:
    """--state, before anything runs: a path that can be written (the state is saved at every step)."""
    from madsl.errors import Location, MadslError
    from madsl.outputs import check_output_path
    from madsl.paths import require_path

    if args.state is None:
        return
    path = require_path(args.state, "--state")
    if path.is_symlink():  # a state read through a link could be any file; it is never followed
        raise MadslError(f"--state {path}: is a symbolic link", Location(str(path)), hint="give the file's own path")
    try:
        check_output_path(path, "--state")
    except MadslError as err:
        raise MadslError(
            err.message,
            Location(str(path)),
            expected=err.expected,
            hint=err.hint or "give --state a file's path in a folder that can be written",
        ) from None


def cmd_search(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    from madsl.cli.progress import stop_on_signals
    from madsl.runner.config import EvalConfig
    from madsl.runner.execute.options import Execution
    from madsl.search.loop import plan_search, run_search
    from madsl.search.reading import load_search

    check_executor_options(args)
    search = load_search(args.file)
    config = EvalConfig(execution=Execution(**execution_values(args)))
    if args.calibrate:
        from madsl.cli.search_calibration import cmd_calibrate

        return cmd_calibrate(args, search, config, _out_dir)
    if args.dry_run:
        plan = plan_search(search, config, state_path=args.state, restart=args.restart)
        print(_json(plan) if args.format == "json" else _render_plan(plan), end="")
        return EXIT_OK
    _check_state_path(args)
    if args.then_scale:
        from madsl.search.front_study import check_template

        check_template(args.then_scale)  # before anything trains
    out = _out_dir(args, search)
    shown = not args.quiet and args.format == "text"
    try:
        with stop_on_signals() as stop:
            result = run_search(
                search,
                config,
                state_path=args.state,
                restart=args.restart,
                observer=_Lines() if shown else None,
                reporter=_tracked_progress(args, shown, config.execution.db),
                stop=stop,
                confirm=None if args.yes else partial(_confirm, search),
            )
    except KeyboardInterrupt:
        print("aborted; rerun the same command to resume the search", file=sys.stderr)
        return EXIT_INTERRUPTED
    written = _write_outputs(result, out, args.plot_x)
    if args.then_scale and result.state.complete:
        from madsl.search.front_study import write_front_study

        written.append(str(write_front_study(search, result.state, args.then_scale, out)))
    _print_result(args, result, written)
    if args.then_scale and result.state.complete and not args.quiet and args.format == "text":
        print(f"the front at scale: madsl scale {out / 'front-study.yaml'} --dry-run")
    if result.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_RUNS_FAILED if result.failed else EXIT_OK


def _confirm(search, plan: dict) -> None:
    """The cost guard (madsl.search.loop.over_cost): a search over it trains only once confirmed
    at the terminal, or with --yes; refused (exit 2, nothing saved or trained) otherwise."""
    from madsl.errors import MadslError
    from madsl.search.loop import over_cost

    reason = over_cost(plan)
    if reason is None:
        return
    hint = "rerun with --yes to train it; --dry-run shows the plan; fewer generations or a smaller population cost less"
    if not sys.stdin.isatty():
        raise MadslError(f"{reason}: not started without confirmation", search.where("algorithm"), hint=hint)
    print(f"search {search.name}: {reason}. Train it? [y/N] ", end="", file=sys.stderr, flush=True)
    # Ctrl-C at the prompt aborts at once (the search's own handler only asks runs to stop)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        answer = sys.stdin.readline()
    finally:
        signal.signal(signal.SIGINT, previous)
    if answer.strip().lower() not in ("y", "yes"):
        raise MadslError(f"{reason}: not confirmed, nothing trained", search.where("algorithm"), hint=hint)


def _write_outputs(result, out: Path, plot_x: str | None) -> list[str]:
    from madsl.cli.common import write_atomic
    from madsl.search.figures import plot_front, plot_generations
    from madsl.search.record import record, write_specs

    search, state = result.search, result.state
    x = plot_x or (search.objectives.minimize[0] if search.objectives.minimize else "fixed_state")
    written = write_specs(search, state, out)
    written.append(str(plot_front(search, state, out / "front.png", x=x)))
    written.append(str(plot_generations(search, state, out / "generations.png")))
    write_atomic(out / "search.json", _json(record(result, written)))
    return written + [str(out / "search.json")]


def _json(data) -> str:
    """JSON with finite numbers only (NaN and Infinity are not JSON: most readers refuse them)."""
    from madsl.search.state import json_ready

    return json.dumps(json_ready(data), indent=2, allow_nan=False) + "\n"


def _print_result(args, result, written: list[str]) -> None:
    from madsl.search.record import record, render_text

    if args.format == "json":
        print(_json(record(result, written)), end="")
    else:
        print(render_text(result.search, result.state), end="")
        if not args.quiet:
            print(f"wrote {len(written)} files to {Path(written[0]).parent}; state {result.state_path}")
    # on stderr in either format: a script reading the JSON on stdout still sees it said
    if result.failed:
        print(
            f"{len(result.failed)} run(s) failed; their candidates count as unscored (errors are in the "
            f"runs table of the results database)",
            file=sys.stderr,
        )
    if result.interrupted:
        print("interrupted: rerun the same command to resume the search", file=sys.stderr)


def _render_plan(plan: dict) -> str:
    from madsl.runner.plan.cost import render_cost

    if plan["complete"]:
        return (
            f"search {plan['search']} is complete: {plan['evaluated']} candidates evaluated (state {plan['state']})\n"
        )
    lines = [
        f"search {plan['search']}: generation {plan['generation']} of {plan['generations']}, "
        f"{plan['evaluated']} of {plan['evaluations']} candidates evaluated (state {plan['state']})",
        f"next batch ({len(plan['batch'])} candidates):",
    ]
    lines += [
        f"  {c['name']}  {c['topology']}" + ("  (duplicate: scored from the store)" if c["duplicate"] else "")
        for c in plan["batch"]
    ]
    text = "\n".join(lines) + "\n" + (render_cost(plan["plan"]) if plan["plan"] else "nothing to train in it\n")
    if plan["estimated_run_seconds"] is not None:
        hours = plan["estimated_run_seconds"] / 3600
        text += (
            f"the whole search: {plan['remaining']} candidates left, ~{hours:.2g} h of run time at this "
            "batch's mean per candidate (an upper bound: duplicates are not trained)"
            + (f", and {plan['startup_seconds']:.1f} s to start" if plan.get("startup_seconds") else "")
            + "\n"
        )
    rejected = plan["rejected"]
    return text + (
        f"rejected before training so far: {rejected['over_budget']} over budget, {rejected['invalid']} invalid\n"
    )


def _tracked_progress(args, shown: bool, db):
    """Each batch's reporter: the progress bars (where shown) and a tracker per --track."""
    from madsl.cli.evaluate import with_tracking

    if not getattr(args, "track", None):
        return _progress if shown else None
    with_tracking(args, None, db)  # the KIND:DIR values checked before any work
    return lambda: with_tracking(args, _progress() if shown else None, db)


def _progress():
    """Each batch's progress bars (without the plan: every candidate is a new model to time)."""
    from madsl.cli.progress import RichReporter

    class BatchProgress(RichReporter):
        shows_plan = False

    return BatchProgress()


class _Lines:
    """A line per generation proposed and recorded, on stderr."""

    def proposed(self, generation: int, batch: list) -> None:
        new = sum(not item["duplicate"] for item in batch)
        print(
            f"generation {generation}: {len(batch)} candidates proposed ({new} new, {len(batch) - new} from the store)",
            file=sys.stderr,
        )

    def recorded(self, generation: int, entry: dict) -> None:
        def shown(x):
            return "-" if x is None else f"{x:.4f}"

        print(
            f"generation {generation}: best {shown(entry['best'])}, median {shown(entry['median'])}, best so far "
            f"{shown(entry['best_so_far'])} ({entry['trained']} runs trained, {entry['reused']} from the store)",
            file=sys.stderr,
        )
