"""`madsl check`: the CI gate: budgets of specs, and iso-state / iso-parameter sets, with every
problem located in its spec file (text, JSON, GitHub annotations, or one line per problem).

It never imports torch, so `madsl check` in CI starts in a fraction of a second.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from madsl.cli.common import EXIT_BAD_INPUT, EXIT_BUDGET, EXIT_OK, make_console, print_error, print_whole
from madsl.errors import Location, MadslError

if TYPE_CHECKING:
    from madsl.lang.spec import Spec


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("check", help="CI gate: budgets of specs, and iso-state / iso-parameter sets")
    p.add_argument(
        "specs",
        nargs="+",
        metavar="SPEC",
        help="spec files; a folder means every .mad under it; a quoted glob such as "
        "'specs/**/*.mad' is expanded by madsl (** spans folders)",
    )
    p.add_argument("--iso-state", action="store_true", help="all specs must have the same fixed state")
    p.add_argument("--iso-params", metavar="TOL", help="all parameter counts within TOL (5%% or 0.05)")
    p.add_argument(
        "--format",
        choices=("text", "json", "github", "line"),
        default="text",
        help="text: a table; json: for machines; github: workflow annotations (::error file=...); "
        "line: one 'file:line:col: error: message' line per problem (editors, grep)",
    )
    p.set_defaults(func=cmd_check)


def _parse_tolerance(text: str) -> float:
    """A relative tolerance written as 5% or 0.05."""
    from madsl.lang.budget import BudgetError, parse_tolerance

    try:
        return parse_tolerance(text)
    except BudgetError as err:
        raise MadslError(f"--iso-params: {err}") from None


def cmd_check(args) -> int:
    """The CI gate. Its exit status is a verdict, so nothing else may end in 1: bad input is 2 (a
    located error), and so is a failure of madsl itself on a spec (reported as such, without a
    traceback), which would otherwise leave Python's 1, read as "budget violated"."""
    try:
        return _check(args)
    except (MadslError, BrokenPipeError):
        raise  # main() maps these (2, and 0 for a reader that went away)
    except Exception as err:  # noqa: BLE001 (the exit status must not say "budget violated")
        print_error(_failure(None, err))
        return EXIT_BAD_INPUT


def _failure(path, err: Exception) -> MadslError:
    """madsl failing on a spec, as an error of that spec: its kind only (not its text, which could
    quote the file), and a request to report it."""
    return MadslError(
        f"madsl failed while checking {path or 'the specs'} ({type(err).__name__}); this is a bug in "
        "madsl, not a budget verdict",
        Location(str(path)) if path is not None else None,
        hint="please report it with the spec file; `madsl compile SPEC` shows the traceback",
    )


def _check(args) -> int:
    from madsl.graph import account
    from madsl.lang.budget import check

    tolerance = _parse_tolerance(args.iso_params) if args.iso_params is not None else None
    results, errors = [], []
    paths = list(dict.fromkeys(spec_paths(args.specs)))  # a spec named twice (overlapping globs) is checked once
    for path in paths:
        try:
            spec = _load_with_eval(path)
            acc = account(spec, seq_len=spec.budget_seq_len)
            violations = check(acc.totals, spec.budget)
        except MadslError as err:
            errors.append((path, err))
            continue
        except BrokenPipeError:
            raise
        except Exception as err:  # noqa: BLE001 (a crash on one spec is bad input of it, exit 2; the others go on)
            errors.append((path, _failure(path, err)))
            continue
        results.append((path, spec, acc, violations))

    set_problems = []
    if args.iso_state and results:
        states = {path: acc.totals["fixed_state"] for path, _, acc, _ in results}
        if len(set(states.values())) > 1:
            set_problems.append(("iso-state", "specs differ in fixed state", states))
    if tolerance is not None and results:
        params = {path: acc.totals["params"] for path, _, acc, _ in results}
        low, high = min(params.values()), max(params.values())
        if low == 0 or (high - low) / low > tolerance:
            spread = (high - low) / low if low else float("inf")
            set_problems.append(("iso-params", f"parameter counts spread {spread:.1%} > {tolerance:.1%}", params))

    violated = any(v for *_, v in results) or bool(set_problems)
    if args.format == "json":
        _check_json(results, errors, set_problems, ok=not violated and not errors)
    elif args.format in ("github", "line"):
        _check_lines(paths, results, errors, set_problems, github=args.format == "github")
    else:
        _check_text(results, errors, set_problems, args)
    if errors:
        return EXIT_BAD_INPUT
    return EXIT_BUDGET if violated else EXIT_OK


def _check_json(results: list, errors: list, set_problems: list, ok: bool) -> None:
    print(
        json.dumps(
            {
                "ok": ok,
                "specs": [
                    {
                        "path": str(p),
                        "name": s.name,
                        "ok": not v,
                        "totals": a.totals,
                        **({"fit": s.fit, "fit_solved": not v} if s.fit else {}),
                        "violations": [{"quantity": x.quantity, "actual": x.actual, "budget": x.bound.text} for x in v],
                    }
                    for p, s, a, v in results
                ],
                "errors": [{"path": str(p), **one.to_dict()} for p, e in errors for one in e.diagnostics],
                "set_checks": [{"check": c, "problem": m, "values": vals} for c, m, vals in set_problems],
            },
            indent=2,
        )
    )


def _load_with_eval(path: str) -> Spec:
    """A spec, checked with its `eval:` section (what shows without the tasks): every error of
    the file, the eval section's included, raised together."""
    from madsl.lang.spec import load_spec
    from madsl.lang.spec.files import load_merged
    from madsl.runner.plan.overrides import check_spec_eval

    try:
        spec = load_spec(path)
    except MadslError as err:
        try:  # the eval section is independent of what broke the rest, unless the file is unreadable
            data, source_map = load_merged(Path(path))
            if isinstance(data.get("eval"), dict):
                check_spec_eval(data["eval"], path, source_map)
        except MadslError as eval_err:
            raise MadslError.combine([err, eval_err], path) from None
        raise
    check_spec_eval(spec.eval, path, spec.source_map)
    return spec


GLOB_CHARACTERS = set("*?[")


def spec_paths(items: list[str]) -> list[str]:
    """The spec files named on the command line: a file as given, a folder as every .mad under
    it, a glob (quoted, so that the shell leaves it; `**` spans folders) as its matches, sorted.
    A folder or glob that matches nothing is an error: a gate that checks nothing must not pass."""
    import glob

    out: list[str] = []
    for item in items:
        if Path(item).is_dir():
            found = sorted(str(p) for p in Path(item).rglob("*.mad"))
        elif GLOB_CHARACTERS & set(item) and not Path(item).exists():
            found = sorted(glob.glob(item, recursive=True))
        else:
            out.append(item)
            continue
        if not found:
            raise MadslError(
                f"no spec file matches {item!r}",
                hint="a folder is searched for *.mad at any depth; in a glob, ** spans folders",
            )
        out += [_inside(path, item) for path in found]
    return out


def _inside(path: str, item: str) -> str:
    """A spec file a folder or glob found: one that is, or sits under, a symbolic link leading out
    of that folder (the glob's fixed part) is refused without being read, as `extends:` and sweep
    files refuse them: a pull request's `evil.mad -> /etc/passwd` must not print a line of it."""
    fixed = Path(item) if Path(item).is_dir() else Path(item.split("*")[0].split("?")[0].split("[")[0] or ".")
    root = (fixed if fixed.is_dir() else fixed.parent).resolve()
    if not Path(path).resolve().is_relative_to(root):
        raise MadslError(
            f"{path}: a symbolic link that leads out of {item}, not read",
            hint="name the file it points to directly if it is meant to be checked",
        )
    return path


def _contributors(acc, quantity: str) -> str:
    """The layers a layer-level quantity comes from, e.g. 'H x3 (2,048 each)'."""
    if quantity not in ("fixed_state", "conv_state", "kv_cache", "flops"):
        return ""
    by_symbol: dict[str, list[int]] = {}
    for row in acc.layers:
        if getattr(row, quantity):
            by_symbol.setdefault(row.symbol, []).append(getattr(row, quantity))
    parts = [
        f"{symbol} x{len(values)} ({values[0]:,} each)"
        if len(set(values)) == 1
        else f"{symbol} x{len(values)} ({sum(values):,} in all)"
        for symbol, values in by_symbol.items()
    ]
    return "; from " + ", ".join(parts) if parts else ""


def _budget_error(spec, path, acc, violation) -> MadslError | None:
    """A budget violation as a located error at its budget key (None where the spec has no file)."""
    source_map = getattr(spec, "source_map", None)
    try:
        location = source_map.key(("budget", violation.quantity)) if source_map is not None else None
    except (KeyError, LookupError, AttributeError):
        location = None
    if location is None:
        return None
    return MadslError(
        f"{spec.name}: {violation.message()}{_contributors(acc, violation.quantity)}",
        location,
        hint="change the model or the budget; `budget.fit` lets `madsl fit` solve a free parameter for it",
    )


def _budget_location(spec, path, quantity: str) -> tuple[str, int | None, int | None]:
    source_map = getattr(spec, "source_map", None)
    if source_map is not None:
        try:
            loc = source_map.key(("budget", quantity))
            return loc.file or str(path), loc.line, loc.column
        except (KeyError, LookupError, AttributeError):
            pass
    return str(path), None, None


def _one_line(file: str, line: int | None, column: int | None, message: str, github: bool) -> str:
    message = " ".join(message.split())
    if github:  # GitHub workflow commands: data escapes %, CR and LF; properties also ':' and ','
        fields = ",".join(
            f"{k}={_github_property(v)}" for k, v in (("file", file), ("line", line), ("col", column)) if v is not None
        )
        return f"::error {fields}::" + message.replace("%", "%25")
    where = ":".join(str(x) for x in (file, line, column) if x is not None)
    return f"{where}: error: {message}"


def _github_property(value) -> str:
    return (
        str(value).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A").replace(":", "%3A").replace(",", "%2C")
    )


def _check_lines(order, results, errors, set_problems, github: bool) -> None:
    """One line per problem, file by file as named: errors where they are written, budget
    violations at their budget key (both in file order), then the set checks."""
    problems: dict = {}
    for path in [p for p, _ in errors] + [p for p, *_ in results]:
        problems[path] = []
    for path, err in errors:
        for one in err.diagnostics:
            loc = one.location
            problems[path].append((loc.file or str(path), loc.line, loc.column, one.one_line()))
    for path, spec, acc, violations in results:
        for v in violations:
            file, line, column = _budget_location(spec, path, v.quantity)
            problems[path].append((file, line, column, f"{spec.name}: {v.message()}{_contributors(acc, v.quantity)}"))
    for path in sorted(problems, key=order.index):
        in_order = sorted(problems[path], key=lambda p: (p[1] is None, p[0] != str(path), p[0], p[1] or 0, p[2] or 0))
        for file, line, column, message in in_order:
            print(_one_line(file, line, column, message, github))
    for check_name, message, values in set_problems:
        listed = ", ".join(f"{p} {v:,}" for p, v in values.items())
        print(_one_line(str(next(iter(values))), None, None, f"{check_name}: {message}: {listed}", github))


def _check_table(results, set_problems):
    """The table of every spec's totals and budget verdict (a fixed state off the most common one in
    red where iso-state fails)."""
    from rich.table import Table

    table = Table(title="madsl check", title_justify="left")
    routed = any(a.totals["active_params"] != a.totals["params"] for _, _, a, _ in results)  # MoE, He
    for header in (
        "spec",
        "params",
        *(["active params"] if routed else []),
        "fixed state",
        "KV cache",
        "FLOPs",
        "budget",
    ):
        table.add_column(header, justify="left" if header in ("spec", "budget") else "right")
    iso_state_bad = any(c == "iso-state" for c, *_ in set_problems)
    mode_state = None
    if iso_state_bad:
        from collections import Counter

        mode_state = Counter(a.totals["fixed_state"] for _, _, a, _ in results).most_common(1)[0][0]
    for path, spec, acc, violations in results:
        t = acc.totals
        verdict = (
            ("[green]ok[/]" if spec.budget else "[dim]none[/]")
            if not violations
            else "[bold red]" + "; ".join(v.message() + _contributors(acc, v.quantity) for v in violations) + "[/]"
        )
        if violations and spec.fit:
            verdict += f" [yellow](budget.fit is not solved yet: run `madsl fit {path}`)[/]"
        state = f"{t['fixed_state']:,}"
        if mode_state is not None and t["fixed_state"] != mode_state:
            state = f"[bold red]{state}[/]"
        active = [f"{t['active_params']:,}"] if routed else []
        table.add_row(str(path), f"{t['params']:,}", *active, state, f"{t['kv_cache']:,}", f"{t['flops']:,}", verdict)
    return table


def _check_text(results, errors, set_problems, args) -> None:
    console = make_console()
    for _, err in errors:
        print_error(err)
    if args.verbose:
        from madsl import report_text

        for path, spec, acc, violations in results:
            console.print(f"[bold]{path}[/]")
            print_whole(console, report_text.account_table(acc, violations))
    if results and not args.quiet:
        print_whole(console, _check_table(results, set_problems))
        for path, spec, acc, violations in results:  # each violation again, located at its budget key
            located = [e for v in violations if (e := _budget_error(spec, path, acc, v)) is not None]
            for err in sorted(located, key=lambda e: (e.location.line or 0, e.location.column or 0)):
                print_error(err)
    if args.quiet:
        for path, spec, acc, violations in results:
            for v in violations:
                console.print(f"[bold red]✗ {path}:[/] {v.message()}{_contributors(acc, v.quantity)}")
    for check_name, message, values in set_problems:
        console.print(f"[bold red]✗ {check_name}:[/] {message}")
        groups: dict = {}
        for path, value in values.items():
            groups.setdefault(value, []).append(str(path))
        for value, paths in sorted(groups.items()):
            console.print(f"    {value:>14,}  {', '.join(paths)}")
    if not errors and not set_problems and not any(v for *_, v in results):
        checks = (
            ["budgets"]
            + (["iso-state"] if args.iso_state else [])
            + (["iso-params"] if args.iso_params is not None else [])
        )
        console.print(f"[bold green]✓ {len(results)} spec(s) pass:[/] {', '.join(checks)}")
