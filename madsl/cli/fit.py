"""`madsl fit`: set a spec's free hyperparameters so that it meets its budget, or matches
another spec's totals (iso-state, iso-parameters). No torch."""

from __future__ import annotations

import json
from pathlib import Path

from madsl.cli.common import EXIT_BUDGET, EXIT_OK, make_console, write_atomic
from madsl.errors import MadslError
from madsl.outputs import check_output_path, output_error


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("fit", help="solve a spec's free parameters for its budget (or another spec's totals)")
    p.add_argument("spec", help="a .mad spec file")
    p.add_argument(
        "--free",
        action="append",
        metavar="SYMBOL.PARAM",
        help="an integer parameter madsl may set (repeatable, or comma-separated); default: the spec's budget.fit list",
    )
    p.add_argument("--match", metavar="SPEC", help="match this spec's totals instead of the budget")
    p.add_argument(
        "--on",
        default=None,
        metavar="QUANTITY",
        help="with --match: the totals to match, comma-separated (params, fixed_state, conv_state, "
        "kv_cache, flops; default fixed_state)",
    )
    p.add_argument(
        "--tolerance",
        default=None,
        metavar="TOL",
        help="with --match: relative tolerance such as 1%% or 0 (default 1%%)",
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.add_argument("-o", "--output", help="write the solved spec (YAML) to this file")
    p.set_defaults(func=cmd_fit)


def _budget_to_match(args, spec):
    from madsl.graph import account
    from madsl.lang import budget as budgets
    from madsl.lang.spec import load_spec

    on = args.on if args.on is not None else "fixed_state"
    quantities = [q.strip() for q in on.split(",") if q.strip()]
    unknown = [q for q in quantities if q not in budgets.QUANTITIES]
    if unknown or not quantities:
        raise MadslError(
            f"--on: unknown quantity {unknown[0] if unknown else on!r}",
            expected="one or more of " + ", ".join(budgets.QUANTITIES),
        )
    try:
        tolerance = budgets.parse_tolerance(args.tolerance if args.tolerance is not None else "1%")
    except budgets.BudgetError as err:
        raise MadslError(f"--tolerance: {err}") from None
    other = load_spec(args.match)
    seq_len = spec.budget_seq_len or spec.seq_len
    totals = account(other, seq_len=seq_len, vocab=spec.vocab).totals
    return {
        q: budgets.Bound(
            totals[q] * (1 - tolerance),
            totals[q] * (1 + tolerance),
            f"{totals[q]:,} ± {tolerance * 100:.3g}% ({other.name})",
        )
        for q in quantities
    }


def cmd_fit(args) -> int:
    import yaml

    from madsl.fit import solve, solved_data
    from madsl.lang.spec import load_spec

    if args.output:
        check_output_path(args.output, "-o")  # before any work
    given = [flag for flag, value in (("--on", args.on), ("--tolerance", args.tolerance)) if value is not None]
    if given and not args.match:  # without --match they would be ignored: the spec's budget is the target
        raise MadslError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --match SPEC",
            hint="add --match SPEC to fit another spec's totals, or drop them to fit the budget",
        )
    spec = load_spec(args.spec)
    free = [item.strip() for items in (args.free or []) for item in items.split(",") if item.strip()]
    free = free or list(getattr(spec, "fit", []) or [])
    if not free:
        raise MadslError(
            f"{args.spec}: no free parameter to solve for",
            hint="name one with --free H.filter_states, or list them under budget: fit: [...]",
        )
    budget = _budget_to_match(args, spec) if args.match else None
    result = solve(spec, free, budget)
    best = result.best
    solved_text = None
    if best is not None:
        solved_text = (
            f"# solved by `madsl fit` from {Path(args.spec).name}: "
            + ", ".join(f"{k}={v}" for k, v in best.values.items())
            + "\n"
            + yaml.safe_dump(solved_data(spec, best), sort_keys=False, allow_unicode=True)
        )
        if args.output:
            try:
                write_atomic(Path(args.output), solved_text)
            except OSError as err:
                raise output_error(err, args.output, "-o") from None
    if args.format == "json":

        def solution(s):
            return None if s is None else {"values": s.values, "totals": s.totals, "within": s.within}

        print(
            json.dumps(
                {
                    "spec": spec.name,
                    "free": result.free,
                    "budget": {q: b.text for q, b in result.budget.items()},
                    "solution": solution(best),
                    "below": solution(result.below),
                    "above": solution(result.above),
                    "evaluated": result.evaluated,
                },
                indent=2,
            )
        )
    else:
        _print_text(spec, result, solved_text, args.output)
    return EXIT_OK if best is not None else EXIT_BUDGET


def _print_text(spec, result, solved_text: str | None, output: str | None) -> None:
    console = make_console()
    budget = ", ".join(f"{q} {b.text}" for q, b in result.budget.items())
    if result.best is None:
        console.print(
            f"[bold red]no solution[/] for {spec.name}: {', '.join(result.free)} cannot meet {budget} "
            f"({result.evaluated} settings tried)"
        )
        for side, s in (("closest below", result.below), ("closest above", result.above)):
            if s is not None:
                totals = ", ".join(f"{q} = {s.totals[q]:,}" for q in result.budget)
                console.print(f"  {side}: " + ", ".join(f"{k}={v}" for k, v in s.values.items()) + f"  ({totals})")
        return
    best = result.best
    totals = ", ".join(f"{q} = {best.totals[q]:,}" for q in result.budget)
    console.print(
        f"[bold green]solved[/] {spec.name}: "
        + ", ".join(f"{k}={v}" for k, v in best.values.items())
        + f"  ({totals}; budget {budget})"
    )
    if output:
        console.print(f"wrote {output}")
    else:
        print(solved_text, end="")
