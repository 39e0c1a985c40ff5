"""`madsl search FILE --calibrate`: the references and the initial population scored by the
search's fitness (madsl.search.calibration), as a table; calibration.json and calibration.csv
written to the search's output folder (docs/search.md, "Calibrating the fitness")."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

from madsl.cli.common import EXIT_INTERRUPTED, EXIT_OK, EXIT_RUNS_FAILED


def cmd_calibrate(args: Any, search: Any, config: Any, out_dir: Callable[[Any, Any], Path]) -> int:
    from madsl.cli.common import write_atomic
    from madsl.cli.progress import stop_on_signals
    from madsl.search.calibration import calibrate, plan_calibration, table_csv
    from madsl.search.state import json_ready

    if args.dry_run:
        plan = plan_calibration(search, config)
        print(_json(json_ready(plan)) if args.format == "json" else _render_plan(plan), end="")
        return EXIT_OK
    out = out_dir(args, search)
    try:
        with stop_on_signals() as stop:
            table = calibrate(search, config, stop=stop)
    except KeyboardInterrupt:
        print("aborted; rerun the same command to resume the calibration", file=sys.stderr)
        return EXIT_INTERRUPTED
    write_atomic(out / "calibration.json", _json(json_ready(table)))
    write_atomic(out / "calibration.csv", table_csv(table))
    print(_json(json_ready(table)) if args.format == "json" else render(table), end="")
    if not args.quiet and args.format == "text":
        print(f"wrote calibration.json and calibration.csv to {out}")
    if table["interrupted"]:
        print("interrupted: rerun the same command to resume the calibration", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_RUNS_FAILED if table["failed"] else EXIT_OK


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def _render_plan(plan: dict[str, Any]) -> str:
    from madsl.runner.plan.cost import render_cost

    rows = plan["rows"]
    lines = [f"calibration of search {plan['search']}: {len(rows)} rows"]
    lines += [f"  {r['kind']:<9}  {r['name']:<28}  {r['topology']}  ({r['status']})" for r in rows]
    return "\n".join(lines) + "\n" + (render_cost(plan["plan"]) if plan["plan"] else "nothing to train\n")


def _shown(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(table: dict[str, Any]) -> str:
    """The table: a row a reference or initial candidate, each task's score, the fitness, the state."""
    tasks = table["tasks"]
    width = max([len(r["name"]) for r in table["rows"]] + [4])
    topo_width = max([len(r["topology"]) for r in table["rows"]] + [8])
    head = f"{'kind':<9}  {'name':<{width}}  {'topology':<{topo_width}}  {'total_state':>11}  "
    head += "  ".join(f"{t[:14]:>14}" for t in tasks) + f"  {'score':>6}"
    lines = [f"calibration of search {table['search']}: the MAD score on {', '.join(tasks)}", head]
    for row in table["rows"]:
        state = (row.get("totals") or {}).get("total_state")
        scores = "  ".join(f"{_shown((row.get('tasks') or {}).get(t)):>14}" for t in tasks)
        tail = _shown(row.get("score")) if row["status"] == "scored" else row["status"]
        lines.append(
            f"{row['kind']:<9}  {row['name']:<{width}}  {row['topology']:<{topo_width}}  "
            f"{'-' if state is None else f'{state:,}':>11}  {scores}  {tail:>6}"
        )
    refs, initial = table["references"], table["initial"]
    if refs["rows"]:
        lines.append(
            f"references: {refs['scored']} of {refs['rows']} scored, {_shown(refs['low'])} to {_shown(refs['high'])} "
            f"(spread {_shown(refs['spread'])})"
        )
    lines.append(
        f"initial population: {initial['scored']} of {initial['rows']} scored, median {_shown(initial['median'])}, "
        f"best {_shown(initial['high'])}; {initial['at_ceiling']} at the ceiling (score >= {table['ceiling']:g})"
    )
    if initial["at_ceiling"]:
        lines.append(
            "warning: the fitness is solved in the initial population; evolution has nothing to find "
            "(harder task settings, more tasks or a tighter budget)"
        )
    return "\n".join(lines) + "\n"
