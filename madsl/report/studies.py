"""The page's study and search sections, from what the database holds.

A study (the pretraining runs filed under `scale:<name>`): its IsoFLOP profiles (the final
validation loss against the training tokens D at each compute budget C, a line per architecture
and budget, the best run of each starred; at a fixed C, D and N trade off one for the other), the
compute-optimal frontier (that best D* against C), every run's validation curve, its runs, and,
where the database also holds MAD scores of specs named as the study's architectures, the MAD
score against the compute-optimal loss at the largest budget. The fitted laws, bootstrap intervals
and the parametric fit need the study file: `madsl report --study STUDY.yaml`.

A search (its state beside the database): each generation's best, median and best-so-far score,
the candidates' score against their parameters with the Pareto front (score up, parameters down),
and the lineage of every candidate.
"""

from __future__ import annotations

import math
from collections import defaultdict
from html import escape
from typing import Any, Sequence

from madsl.report.page import cell, table
from madsl.report.records import json_object, number
from madsl.report.svg import line_chart, scatter_chart


def _tokens(row: Any) -> float | None:
    train = json_object(row["train_config"])
    parts = [train.get(k) for k in ("steps", "batch_size", "seq_len")]
    return float(math.prod(parts)) if all(isinstance(p, int) and p > 0 for p in parts) else None


def study_points(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """The study's finished runs as points: arch, size, budget C, tokens D, loss."""
    out = []
    for row in rows:
        setting = json_object(row["setting"])
        budget, loss, tokens = number(setting.get("budget")), number(row["best_eval_loss"]), _tokens(row)
        if row["status"] == "done" and budget and loss is not None and tokens:
            out.append(
                {"arch": str(setting.get("arch", row["spec_name"])), "size": str(setting.get("size", ""))}
                | {"budget": budget, "tokens": tokens, "loss": loss, "run": row, "seed": row["seed"]}
            )
    return out


def _optima(points: list[dict]) -> dict[tuple[str, float], dict]:
    best: dict[tuple[str, float], dict] = {}
    for p in points:
        key = (p["arch"], p["budget"])
        if key not in best or p["loss"] < best[key]["loss"]:
            best[key] = p
    return best


def study_section(name: str, rows: Sequence[Any], epochs: dict, scores: dict[str, float]) -> str:
    points = study_points(rows)
    if not points:
        return f'<h3>{escape(name)}</h3><p class="empty">{len(rows)} runs, none finished yet.</p>'
    lines: dict[str, list] = defaultdict(list)
    for p in sorted(points, key=lambda p: p["tokens"]):
        lines[f"{p['arch']}, C={p['budget']:.2g}"].append((p["tokens"], p["loss"]))
    optima = _optima(points)
    marks = [(f"{a} at C={c:.2g}: D*={p['tokens']:.3g}", (p["tokens"], p["loss"])) for (a, c), p in optima.items()]
    charts = [
        line_chart(sorted(lines.items()), "IsoFLOP profiles", "training tokens D", "val loss", logx=True, marks=marks)
    ]
    frontier: dict[str, list] = defaultdict(list)
    for (arch, budget), p in sorted(optima.items()):
        frontier[arch].append((budget, p["tokens"]))
    charts.append(
        line_chart(sorted(frontier.items()), "compute-optimal D*", "budget C (FLOPs)", "D*", logx=True, logy=True)
    )
    charts.append(_curves(rows, epochs))
    if (correlation := _correlation(optima, scores)) is not None:
        charts.append(correlation)
    headers = ["architecture", "size", "budget C", "tokens D", "seed", "val loss", "best of its C"]
    body = [
        [
            cell(p["arch"]),
            cell(p["size"]),
            cell(p["budget"]),
            cell(int(p["tokens"])),
            cell(p["seed"]),
            cell(p["loss"], 4),
        ]
        + [cell(optima[(p["arch"], p["budget"])] is p)]
        for p in points
    ]
    return (
        f'<h3>{escape(name)}</h3><p>{len(rows)} runs, {len(points)} finished.</p><div class="charts">{"".join(charts)}'
        f"</div>{table(headers, body, 'study-' + escape(name))}"
    )


def _curves(rows: Sequence[Any], epochs: dict) -> str:
    """Each run's validation loss against the tokens it had trained on."""
    from madsl.report.records import evaluation_steps

    series = []
    for row in rows:
        train = json_object(row["train_config"])
        history = epochs.get(row["run_id"], [])
        per_step = (train.get("batch_size") or 1) * (train.get("seq_len") or 1)
        steps = evaluation_steps(train, len(history))
        pts = [(s * per_step, v) for s, e in zip(steps, history) if (v := number(e["eval_loss"])) is not None]
        setting = json_object(row["setting"])
        budget = number(setting.get("budget"))
        label = f"{setting.get('arch', row['spec_name'])} {setting.get('size', '')}" + (
            f" C={budget:.2g}" if budget else ""
        )
        series.append((label, pts))
    return line_chart(series, "validation curves", "tokens trained", "val loss", logx=True)


def _correlation(optima: dict[tuple[str, float], dict], scores: dict[str, float]) -> str | None:
    if not optima:
        return None
    top = max(budget for _, budget in optima)
    pairs = [(scores[a], p["loss"], a) for (a, c), p in optima.items() if c == top and a in scores]
    if len(pairs) < 2:
        return None
    return scatter_chart(
        [(x, y, label, False) for x, y, label in pairs],
        f"MAD score vs compute-optimal loss at C={top:.2g}",
        "MAD score",
        "val loss",
    )


def _front(candidates: list[dict]) -> set[int]:
    """The indices of the candidates no other beats on both score (up) and parameters (down)."""
    out = set()
    for i, c in enumerate(candidates):
        if not any(
            d["score"] >= c["score"]
            and d["params"] <= c["params"]
            and (d["score"], -d["params"]) != (c["score"], -c["params"])
            for d in candidates
        ):
            out.add(i)
    return out


def search_section(name: str, state: dict[str, Any]) -> str:
    history = [h for h in state["history"] if isinstance(h, dict) and isinstance(h.get("generation"), int)]
    series = [
        (what, [(h["generation"], v) for h in history if (v := number(h.get(what))) is not None])
        for what in ("best", "median", "best_so_far")
    ]
    charts = [line_chart(series, "score per generation", "generation", "score")]
    candidates = []
    for c in state["candidates"].values():
        if isinstance(c, dict):
            totals = c.get("totals") if isinstance(c.get("totals"), dict) else {}
            candidates.append({**c, "params": number(totals.get("params")), "score": number(c.get("score"))})
    scored = [c for c in candidates if c["score"] is not None and c["params"] is not None]
    front = _front(scored)
    points = [(c["params"], c["score"], str(c.get("name", "")), i in front) for i, c in enumerate(scored)]
    charts.append(scatter_chart(points, "candidates and the front", "parameters", "score", logx=True))
    names = {c.get("id"): str(c.get("name", "")) for c in candidates}
    headers = ["generation", "name", "parents", "operator", "status", "score", "params", "fixed state", "topology"]
    body = []
    for c in candidates:
        parents = c.get("parents") if isinstance(c.get("parents"), list) else []
        totals = c.get("totals") if isinstance(c.get("totals"), dict) else {}
        body.append(
            [cell(c.get("generation")), cell(c.get("name")), cell(", ".join(names.get(p, str(p)[:8]) for p in parents))]
            + [cell(c.get("operator")), cell(c.get("status")), cell(c["score"]), cell(c["params"] and int(c["params"]))]
            + [cell(number(totals.get("fixed_state"))), cell(c.get("topology"))]
        )
    done = "complete" if state.get("complete") else "in progress"
    return (
        f"<h3>{escape(name)}</h3><p>{len(history)} generations, {len(candidates)} candidates, {len(front)} on the "
        f'front ({done}).</p><div class="charts">{"".join(charts)}</div>'
        "<details><summary>lineage: every candidate</summary>"
        f"{table(headers, body, 'lineage-' + escape(name))}</details>"
    )
