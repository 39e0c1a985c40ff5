"""What a search leaves: the Pareto front, each generation's best and median, the lineage of every
candidate (as data, text and JSON), and the best topologies as `.mad` spec files ready for
`madsl eval --protocol paper`. The figures are madsl.search.figures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import yaml

from madsl.lang.spec.files import SPEC_KEYS
from madsl.paths import file_in
from madsl.search.algorithms import objective_vector
from madsl.search.config import SearchFile
from madsl.search.hypervolume import generation_hypervolumes
from madsl.search.nsga2 import non_dominated_sort
from madsl.search.state import SearchState, json_ready


def front(search: SearchFile, state: SearchState) -> list[dict[str, Any]]:
    """The scored candidates no other scored candidate dominates over the search's objectives
    (the score maximised, the minimised totals), best score first."""
    scored = [c for c in state.candidates.values() if c.get("score") is not None]
    if not scored:
        return []
    vectors = [objective_vector(search, state, c["id"]) for c in scored]
    first = non_dominated_sort(vectors)[0]
    return sorted((scored[i] for i in first), key=lambda c: (-c["score"], c["totals"]["params"], c["name"]))


def lineage(state: SearchState) -> list[dict[str, Any]]:
    """Every candidate in the order proposed: generation, parents (names), operator, score, topology."""
    names = {spec_hash: record["name"] for spec_hash, record in state.candidates.items()}
    out = []
    for record in state.candidates.values():
        again = [
            {**entry, "parents": [names.get(p, p) for p in entry["parents"]]}
            for entry in record.get("proposed_again", [])
        ]
        out.append(
            {
                "name": record["name"],
                "spec_hash": record["id"],
                "generation": record["generation"],
                "parents": [names.get(p, p) for p in record["parents"]],
                "operator": record["operator"],
                "status": record["status"],
                "score": record["score"],
                "tasks": record["tasks"],
                "topology": record["topology"],
                "totals": record["totals"],
                "solved": record["solved"],
                "proposed_again": again,
            }
        )
    return out


def record(result: Any, written: Sequence[str] = ()) -> dict[str, Any]:
    """All of a search's outputs as JSON-ready data (`madsl search --format json`): finite numbers or
    None (json.dumps(..., allow_nan=False) takes it)."""
    search, state = result.search, result.state
    algorithm = search.algorithm
    volumes = generation_hypervolumes(search, state)
    return json_ready(
        {
            "search": search.name,
            "file": search.path,
            "state": str(result.state_path),
            "algorithm": {
                "name": algorithm.name,
                "population": algorithm.population,
                "generations": algorithm.generations,
                "offspring": algorithm.offspring,
                "seed": algorithm.seed,
                "evaluations": algorithm.evaluations,
            },
            "objectives": {"score": dict(search.objectives.settings), "minimize": list(search.objectives.minimize)},
            "complete": state.complete,
            "interrupted": result.interrupted,
            "generation": state.generation,
            "counts": {
                **state.counts,
                "candidates": len(state.candidates),
                "scored": len(state.scored()),
                "runs_trained": result.trained,
                "runs_reused": result.reused,
            },
            "failed": dict(result.failed),
            "front": [_summary(c) for c in front(search, state)],
            "hypervolume": {"reference": volumes["reference"], "rule": volumes["rule"]},
            "generations": [{**h, "hypervolume": v} for h, v in zip(state.history, volumes["values"])],
            "lineage": lineage(state),
            "written": list(written),
        }
    )


def _summary(candidate: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": candidate["name"],
        "spec_hash": candidate["id"],
        "score": candidate["score"],
        "tasks": candidate["tasks"],
        "topology": candidate["topology"],
        "totals": candidate["totals"],
        "generation": candidate["generation"],
    }


def render_text(search: SearchFile, state: SearchState) -> str:
    """The front and the generations as plain text tables."""
    lines = [f"Pareto front of {search.name} ({', '.join(search.objectives.names)}):"]
    quantities = list(dict.fromkeys(list(search.objectives.minimize) + ["params", "fixed_state", "kv_cache"]))
    header = ["score", *quantities, "gen", "name", "topology"]
    rows = [
        [
            f"{c['score']:.4f}",
            *(f"{c['totals'][q]:,}" for q in quantities),
            str(c["generation"]),
            c["name"],
            c["topology"],
        ]
        for c in front(search, state)
    ]
    lines += _table(header, rows) if rows else ["  (no candidate scored yet)"]
    lines.append("")
    lines.append("Generations:")

    def shown(x):
        return "-" if x is None else f"{x:.4f}"

    volumes = generation_hypervolumes(search, state)
    rows = [
        [
            str(h["generation"]),
            str(h["proposed"]),
            str(h["new"]),
            str(h["duplicates"]),
            str(h["failed"]),
            shown(h["best"]),
            shown(h["median"]),
            shown(h["best_so_far"]),
            shown(volume),
        ]
        for h, volume in zip(state.history, volumes["values"])
    ]
    header = ["gen", "proposed", "new", "duplicates", "failed", "best", "median", "best so far", "hypervolume"]
    lines += _table(header, rows)
    reference = ", ".join(f"{k} {v:,.6g}" for k, v in volumes["reference"].items())
    lines.append(f"hypervolume: the share of the box from (score 1, totals 0) to ({reference}) the front dominates")
    counts = state.counts
    lines.append(
        f"\n{len(state.candidates)} candidates proposed; rejected before training: {counts['over_budget']} "
        f"over budget, {counts['invalid']} invalid; {counts['duplicates']} duplicates scored from the store; "
        f"{counts.get('parent_returned', 0)} breedings that returned a parent, bred again"
    )
    return "\n".join(lines) + "\n"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(len(header))]

    def fmt(cells):
        return "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def spec_text(search: SearchFile, candidate: dict[str, Any]) -> str:
    """A candidate as a .mad spec file: its spec (solved values under layers:), its budget with the
    length it is accounted at (seq_len:) and the search's free parameters of the layers it uses
    under fit: (at its own width its values meet the
    budget and stand; a study at another width solves them again, madsl.scaling.grid.sized_spec),
    with a comment saying where it comes from and what it scored."""
    tasks = ", ".join(f"{t} {s:.4f}" for t, s in candidate["tasks"].items() if s is not None)
    header = (
        f"# found by `madsl search {search.path}` ({search.algorithm.name}, seed {search.algorithm.seed}), "
        f"generation {candidate['generation']}\n"
        f"# score {candidate['score']:.4f} ({tasks}) under objectives.score "
        f"{json.dumps(search.objectives.settings)}\n"
        f"# evaluate it: madsl eval {candidate['name']}.mad --protocol paper\n"
    )
    from madsl.lang.spec import spec_from_data

    data = {**candidate["spec"], "description": f"found by madsl search {search.name}"}
    spec = spec_from_data(candidate["spec"])
    if isinstance(data.get("budget"), dict):
        # the length the budget was met at, written out: a study trains the file at its own seq_len,
        # and a KV-cache or FLOP bound read at that length would be another rule than the search's
        data["budget"] = {**data["budget"], "seq_len": spec.budget_seq_len or spec.seq_len}
        free = _free_of(search, spec)
        if free:
            data["budget"]["fit"] = free
    order = sorted(data, key=lambda k: SPEC_KEYS.index(k) if k in SPEC_KEYS else len(SPEC_KEYS))
    return header + yaml.safe_dump({k: data[k] for k in order}, sort_keys=False, allow_unicode=True)


def _free_of(search: SearchFile, spec: Any) -> list[str]:
    """The search's free parameters (budget.fit) of the symbols a candidate's spec uses."""
    used = set(spec.symbols_used())
    return [item for item in search.free if item.partition(".")[0] in used]


def write_specs(search: SearchFile, state: SearchState, folder: str | os.PathLike) -> list[str]:
    """The front's candidates as `<name>.mad` in `folder`, each written atomically; returns the paths."""
    from madsl.outputs import write_text_atomic

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for candidate in front(search, state):
        # a name read from the state: a plain file name in `folder` (the write replaces a link, never follows it)
        path = file_in(folder, candidate["name"], ".mad", "a candidate's name")
        write_text_atomic(path, spec_text(search, candidate))
        written.append(str(path))
    return written
