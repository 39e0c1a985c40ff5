"""`madsl scale STUDY.yaml`: train an IsoFLOP study (architectures x FLOP budgets x model sizes)
on text; `--dry-run` prints the grid with each run's parameters, tokens, FLOPs and hours here.

Exit codes: 0 every run finished, 2 bad input (a located error, no traceback), 3 some runs
failed, 130 interrupted (rerun the same command to resume). `madsl report --study STUDY.yaml`
fits and draws the results.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from madsl.cli.arguments import positive_number
from madsl.cli.common import EXIT_INTERRUPTED, EXIT_OK, EXIT_RUNS_FAILED
from madsl.runner.common.choices import PRECISIONS  # torch-free


def add_parser(subparsers) -> None:
    from madsl.cli.evaluate import add_execution_options

    p = subparsers.add_parser(
        "scale",
        help="train an IsoFLOP study on text (architectures x FLOP budgets x sizes); resumable",
        description="Pretrain every architecture of a study file at every size of every FLOP budget on its "
        "text (next-token loss, the paper's recipe), recording each run in the results database; "
        "an interrupted study resumes where it stopped. `madsl report --study STUDY.yaml` fits "
        "the IsoFLOP curves, frontiers and the MAD correlation (docs/scaling.md).",
    )
    p.add_argument(
        "study", metavar="STUDY", help="a study file (YAML: name, data, seq_len, architectures, budgets, sizes, recipe)"
    )
    add_execution_options(p)
    p.add_argument(
        "--no-batch",
        dest="batch_grid",
        action="store_const",
        const=False,
        help="train every run alone (default: runs of one shape, e.g. seed replicates, a learning-rate "
        "ladder or one size at several budgets, train together as one stacked model)",
    )
    p.add_argument(
        "--rate",
        type=positive_number,
        metavar="FLOP/S",
        dest="flops_per_second",
        help="the training rate the plan's hours are stated at (e.g. 3e14 for a GPU's sustained "
        "bf16 rate); default: this machine's per-layer-family rates, measured once and cached "
        "(as madsl eval's plan)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="in place of the study recipe's: bf16 autocast, fp32, or auto (bf16 on a CUDA device with "
        "bf16, fp32 elsewhere, as madsl eval); a run's precision is part of its identity",
    )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="json: print the plan (with --dry-run) or the summary as JSON",
    )
    p.set_defaults(func=cmd_scale)


def render_plan(cost: Mapping[str, Any]) -> str:
    """The study's grid as a table: one row per run, then the totals."""
    lines = [
        f"study {cost['study']}: {len(cost['runs'])} runs ({cost['done']} done), "
        f"{cost['flops']:.3g} FLOPs in all; data {cost['data']}",
        f"{'arch':<20} {'budget':>8} {'size':>10} {'dim':>5} {'params':>10} {'state':>10} {'tokens':>11} "
        f"{'steps':>7} {'epochs':>6} {'lr':>9} {'seed':>4} {'stack':>5} {'hours':>8}  status",
    ]
    for row in cost["runs"]:
        lines.append(
            f"{row['arch']:<20} {row['budget']:>8.2g} {row['size']:>10} {row['dim']:>5} "
            f"{row['params']:>10,} {row['state']:>10,} {row['tokens']:>11,} {row['steps']:>7,} "
            f"{row.get('epochs', 0):>6.2f} {row['lr']:>9.3g} {row.get('seed', 0):>4} {row.get('stack') or '-':>5} "
            f"{_hours(row['hours'])}  {row['status']}"
        )
    starting = ""
    if cost.get("startup_seconds") and cost["done"] < len(cost["runs"]):
        each = "each of " if cost["processes"] > 1 else ""
        starting = f" (and {cost['startup_seconds']:.1f} s to start {each}{cost['processes']} process(es))"
    lines.append(
        f"to do: {cost['hours']:.2f} h of training ({cost['rate_source']}), {cost['wall_hours']:.2f} h "
        f"with {cost['workers']} worker(s){starting}"
    )
    low, high = cost.get("wall_hours_interval") or (cost["wall_hours"], cost["wall_hours"])
    if low != high:  # where the measurement is uncertain (DeviceRates.interval)
        lines.append(f"  likely between {low:.2f} h and {high:.2f} h with {cost['workers']} worker(s)")
    fitted = {(row["arch"], row["size"]): row["fitted"] for row in cost["runs"] if row.get("fitted")}
    for (arch, size), values in fitted.items():  # a spec asking for a fit, solved at each width
        lines.append(f"fitted: {arch} {size}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    if cost.get("stacks"):
        lines.append(f"stacks: {len(cost['stacks'])} (runs of one shape trained together; --no-batch: each alone)")
    lines += [f"warning: {warning}" for warning in cost.get("warnings", ())]
    return "\n".join(lines) + "\n"


def _hours(hours: float | None) -> str:
    return f"{hours:>8.3f}" if hours is not None else f"{'?':>8}"


def _reporter():
    from madsl.cli.progress import RichReporter

    class StepBars(RichReporter):
        """Progress in steps (a pretraining run has no epochs), the validation loss per evaluation."""

        def started(self, job, *_) -> None:
            self.started_at[job.run_id] = __import__("time").monotonic()
            self.bars[job.run_id] = self.view.add_task(f"  {job.label}", total=job.settings.steps, info="starting")

        def progress(self, job, evaluation: int, step: int, steps: int) -> None:
            if (bar := self.bars.get(job.run_id)) is not None:
                self.view.update(bar, completed=step)

        def epoch(self, job, metrics) -> None:
            if (bar := self.bars.get(job.run_id)) is not None:
                self.view.update(bar, info=f"val loss {metrics['eval_loss']:.4f}")

        def plan(self, cost, notes) -> None:
            self.console.print(render_plan(cost), end="", highlight=False)

    return StepBars()


def cmd_scale(args) -> int:
    """Bad input raises MadslError (main() prints it, exit 2)."""
    import contextlib

    from madsl.cli.evaluate import check_executor_options, execution_values, with_tracking
    from madsl.cli.progress import stop_on_signals
    from madsl.outputs import json_text
    from madsl.runner.execute.options import Execution
    from madsl.scaling.api import scale

    check_executor_options(args)
    execution = Execution(**execution_values(args))
    shown = not args.quiet and args.format == "text" and not args.dry_run
    reporter = with_tracking(args, _reporter() if shown else None, execution.db)
    try:
        with stop_on_signals() as stop, reporter or contextlib.nullcontext():
            summary = scale(
                args.study,
                execution,
                reporter=reporter,
                stop=stop,
                flops_per_second=args.flops_per_second,
                precision=args.precision,
            )
    except KeyboardInterrupt:
        print("aborted; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.dry_run:
        print(
            json_text(summary["plan"], indent=2) if args.format == "json" else render_plan(summary["plan"]),
            end="\n" if args.format == "json" else "",
        )
        return EXIT_OK
    if args.format == "json":
        print(json_text(summary, indent=2))
    elif not args.quiet:
        print(
            f"{summary['done'] + summary['already_done']} of {summary['runs']} runs done; "
            f"`madsl report --study {args.study} --db {execution.db}` fits them",
            file=sys.stderr,
        )
    if summary["failed"]:
        print(f"{len(summary['failed'])} run(s) failed; rerun `madsl scale` to retry them", file=sys.stderr)
    if summary["interrupted"]:
        print(f"interrupted: {summary['interrupted']} run(s) left; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_RUNS_FAILED if summary["failed"] else EXIT_OK
