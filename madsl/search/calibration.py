"""Calibrating a search's fitness before searching: the references (hand-written designs of the
space: the search file's `references:`) and the initial population (generation 0 as the search
proposes it, from the same seed) scored by the search's own objective through the same runner
and results database, so the search run after it trains none of them again.

A fitness worth searching spreads the references over a wide range and leaves no candidate of the
initial population at the ceiling (CEILING): where one is, the search has solved its problem
before evolution starts, and no comparison of algorithms can tell them apart.

    table = calibrate(load_search("specs/search/recall-hybrids.yaml"), EvalConfig.from_keywords(workers=2))
    table["initial"]["at_ceiling"], table["references"]["spread"]
"""

from __future__ import annotations

import csv
import io
import statistics
from typing import Any

from madsl.runner.config import EvalConfig
from madsl.search.ask_tell import Search
from madsl.search.candidates import Candidate, Rejection
from madsl.search.config import SearchFile
from madsl.search.evaluation import RunnerEvaluator
from madsl.search.loop import preflight, search_config

CEILING = 0.99  # a MAD score (a mean accuracy) at or above it leaves nothing to find
TOTALS = ("params", "fixed_state", "kv_cache", "total_state")  # the accounted totals each row shows


def members(search: SearchFile, config: EvalConfig | None = None) -> list[dict[str, Any]]:
    """The rows to score: each reference (built and solved into the budget as a candidate is; one
    over the budget or invalid is a row that does not train), then the initial population."""
    driver = Search(search, config=config, restart=True)  # proposes generation 0; nothing is saved
    rows = []
    for name, text in search.references.items():
        built = driver.builder.build_topology(text)
        rows.append(_row("reference", name, built))
    for item in driver.prepare():
        record = driver.state.candidates[item["id"]]
        rows.append(
            {
                "kind": "initial",
                "name": record["name"],
                "topology": record["topology"],
                "spec_hash": item["id"],
                "status": "pending",
                "totals": {k: record["totals"].get(k) for k in TOTALS},
                "spec": driver.built[item["id"]],
            }
        )
    return rows


def _row(kind: str, name: str, built: Candidate | Rejection) -> dict[str, Any]:
    if isinstance(built, Rejection):
        return {"kind": kind, "name": name, "topology": built.topology, "status": built.reason, "why": built.message}
    return {
        "kind": kind,
        "name": name,
        "topology": built.topology,
        "spec_hash": built.spec_hash,
        "status": "pending",
        "totals": {k: built.totals.get(k) for k in TOTALS},
        "spec": built.spec,
    }


def trainable(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """spec hash -> spec of the rows that train, each once (a reference may be an initial candidate too)."""
    return {row["spec_hash"]: row["spec"] for row in rows if "spec" in row}


def plan_calibration(search: SearchFile, config: EvalConfig | None = None, *, evaluator: Any = None) -> dict[str, Any]:
    """What calibrating costs (madsl.runner.plan.cost), without training; the rows it would score."""
    config = search_config(search, config)
    evaluator = evaluator or RunnerEvaluator(config)
    rows = members(search, config)
    specs = list(trainable(rows).values())
    if specs:
        preflight(search, evaluator, specs[0])
    return {"search": search.name, "rows": [_plain(r) for r in rows], "plan": evaluator.plan(specs) if specs else None}


def calibrate(
    search: SearchFile, config: EvalConfig | None = None, *, evaluator: Any = None, **evaluator_options: Any
) -> dict[str, Any]:
    """Score the references and the initial population (`evaluator_options` go to RunnerEvaluator,
    as in run_search); the table and its summary. An interrupted evaluation returns what was
    scored, `interrupted` set: rerunning resumes (finished runs are in the results database)."""
    config = search_config(search, config)
    evaluator = evaluator or RunnerEvaluator(config, **evaluator_options)
    rows = members(search, config)
    specs = trainable(rows)
    if specs:
        preflight(search, evaluator, next(iter(specs.values())))
    outcome = evaluator.evaluate(list(specs.values()))
    for row in rows:
        if "spec_hash" in row:
            result = outcome.results.get(row["spec_hash"])
            scored = result is not None and result["score"] is not None
            # unscored after an interruption: some of its runs have not run yet (rerunning resumes them)
            unscored = "incomplete" if outcome.interrupted else "failed"
            row.update(status="scored" if scored else unscored, score=result["score"] if scored else None)
            row["tasks"] = dict(result["tasks"]) if result else {}
    return {
        "search": search.name,
        "tasks": list(evaluator.tasks),
        "ceiling": CEILING,
        "rows": [_plain(r) for r in rows],
        "references": _summary([r for r in rows if r["kind"] == "reference"]),
        "initial": _summary([r for r in rows if r["kind"] == "initial"]),
        "interrupted": outcome.interrupted,
        "failed": dict(outcome.failed),
        "trained": outcome.trained,
        "reused": outcome.reused,
    }


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    scores = [r["score"] for r in rows if r.get("score") is not None]
    return {
        "rows": len(rows),
        "scored": len(scores),
        "low": min(scores) if scores else None,
        "high": max(scores) if scores else None,
        "spread": max(scores) - min(scores) if scores else None,
        "median": statistics.median(scores) if scores else None,
        "at_ceiling": sum(s >= CEILING for s in scores),
    }


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "spec"}


def table_csv(table: dict[str, Any]) -> str:
    """The calibration's rows as CSV: one a candidate, each task's score a column."""
    tasks = table["tasks"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["kind", "name", "topology", "spec_hash", "status", "score", *tasks, *TOTALS])
    for row in table["rows"]:
        totals = row.get("totals") or {}
        writer.writerow(
            [row["kind"], row["name"], row["topology"], row.get("spec_hash", ""), row["status"]]
            + [_cell(row.get("score"))]
            + [_cell((row.get("tasks") or {}).get(t)) for t in tasks]
            + [_cell(totals.get(k)) for k in TOTALS]
        )
    return out.getvalue()


def _cell(value: Any) -> str:
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)
