"""The search comparison's analysis from its committed raw data alone: nothing trains.

`benchmarks/search_evidence.py` runs the comparison and writes its pre-registered tests into
`results.json`. This script refits those tests from the raw data (each search's state and
`heldout.csv`) and adds what the write-up reports beside them:

- each search's **front** over (score, total state): its size and the total-state range it spans,
  as a share of the budget's bound (issue 40 asks for at least half);
- the **anytime curves** in numbers: the mean best search score over seeds after the initial
  population and after each generation (8, 14, 20 and 26 trained candidates in the comparison),
  with a Student-t 95 % interval over seeds;
- the **winner's curse**: how far each search's top candidates fall from their search score when
  retrained on the held-out seeds, and how well the search score orders them (Spearman);
- an **exploratory** paired test of regularized evolution against NSGA-II (two-sided; it was not
  pre-registered, so it is reported as such).

    python benchmarks/search_evidence_analysis.py --out docs/evidence/search/comparison

Writes `analysis.json` into --out and prints the tables as Markdown. The states are read through
madsl's own state reader (each checked whole against the search it belongs to).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from search_evidence import ALGORITHMS, paired, variant  # noqa: E402

from madsl.errors import Location, MadslError  # noqa: E402
from madsl.lang.budget import upper_bound  # noqa: E402
from madsl.outputs import write_text_atomic  # noqa: E402
from madsl.search.nsga2 import non_dominated_sort  # noqa: E402
from madsl.search.reading import load_search  # noqa: E402
from madsl.search.state_check import load_state  # noqa: E402


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the comparison's folder (states/, heldout.csv, results.json)")
    p.add_argument("--search", default=None, help="the search file (default: the one results.json names)")
    p.add_argument("--tiny", action="store_true", help="the analysis of a `search_evidence.py --tiny` run")
    return p.parse_args()


def front_of(candidates: list[dict]) -> list[dict]:
    """The scored candidates no other beats on both score (higher) and total state (lower)."""
    scored = [c for c in candidates if c.get("score") is not None]
    points = [(-c["score"], c["totals"]["total_state"]) for c in scored]
    fronts = non_dominated_sort(points)
    return [scored[i] for i in fronts[0]] if fronts else []


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """The mean and its Student-t 95 % interval."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def curve(candidates: list[dict]) -> list[float]:
    """The best search score after each trained candidate, in the order proposed."""
    out, top = [], -math.inf
    for c in candidates:
        if c.get("status") in ("scored", "failed"):
            top = max(top, c["score"]) if c.get("score") is not None else top
            out.append(top)
    return out


def analyse(out: Path, search_path: str | None, tiny: bool = False) -> dict:
    results = json.loads((out / "results.json").read_text())
    search = load_search(search_path or results["search"])
    budget = tuple(results["budget"][k] for k in ("population", "generations", "offspring"))
    bound = upper_bound(search.spec_data.get("budget") or {}, "total_state")
    fixed_bound = upper_bound(search.spec_data.get("budget") or {}, "fixed_state")
    heldout = read_heldout(out / "heldout.csv")
    rows = []
    for row in results["per_search"]:
        name, seed = row["algorithm"], row["seed"]
        state, _ = load_state(out / "states" / f"{name}-seed{seed}.json", variant(search, name, seed, budget, tiny))
        candidates = list(state.candidates.values())
        front = front_of(candidates)
        states = [c["totals"]["total_state"] for c in front]
        mine = [h for h in heldout if h["algorithm"] == name and h["seed"] == seed]
        held = retrained(candidates, mine, len(results["heldout_seeds"]))
        best = max(held, key=lambda n: held[n][1]) if held else None
        rows.append(
            {
                "algorithm": name,
                "seed": seed,
                "best_search_score": row["best_search_score"],
                "best_heldout": held[best][1] if held else None,
                "best_heldout_candidate": best,
                "hypervolume": row["hypervolume"],
                "front_size": len(front),
                "front_state_min": min(states) if states else None,
                "front_state_max": max(states) if states else None,
                "front_state_span": (max(states) - min(states)) / bound if states else None,
                "front_state_range": max(states) - min(states) if states else None,
                "fixed_state_near_bound": near_bound(candidates, fixed_bound),
                "search_minus_heldout": statistics.fmean(a - b for a, b in held.values()) if held else None,
                "spearman": spearman([a for a, _ in held.values()], [b for _, b in held.values()]),
                "curve": curve(candidates),
                "counts": state.counts,
            }
        )
    return {
        "search": results["search"],
        "state_bound": bound,
        "fixed_state_bound": fixed_bound,
        "fronts_over_half": {
            "total_state_bound": sum(r["front_state_range"] >= bound / 2 for r in rows),
            "fixed_state_bound": sum(r["front_state_range"] >= fixed_bound / 2 for r in rows),
            "searches": len(rows),
        },
        "refit_equals_results": refit_equals(rows, results["tests"]),
        "per_search": rows,
        "checkpoints": checkpoints(budget),
        "anytime": anytime(rows, checkpoints(budget)),
        "means": means(rows),
        "tests": refit_tests(rows),
        "exploratory": exploratory(rows),
    }


def near_bound(candidates: list[dict], bound: float, share: float = 3800 / 4096) -> float:
    """The share of a search's candidates whose fixed state is within 7 % of its bound (3,800 of
    4,096: the figure issue 40 gave for the search before space.fill, 87.5 % of its draws)."""
    states = [c["totals"]["fixed_state"] for c in candidates if c.get("totals")]
    return sum(s >= share * bound for s in states) / len(states)


HELDOUT_COLUMNS = {"algorithm": str, "seed": int, "topology": str, "search_score": float, "heldout_score": float}


def read_heldout(path: Path) -> list[dict]:
    """heldout.csv's rows, each number read and each row's place kept (a bad cell is a located error)."""
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in HELDOUT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise MadslError(f"missing columns {missing}", Location(file=str(path), line=1, column=1))
        for row in reader:
            where = Location(file=str(path), line=reader.line_num, column=1)
            try:
                read = {k: kind(row[k]) for k, kind in HELDOUT_COLUMNS.items()}
                rows.append(read | {"name": row.get("name") or None, "where": where})
            except (TypeError, ValueError):
                bad = next(k for k, kind in HELDOUT_COLUMNS.items() if not _reads(kind, row[k]))
                raise MadslError(
                    f"{bad}: expected {'an integer' if HELDOUT_COLUMNS[bad] is int else 'a number'}, got {row[bad]!r}",
                    where,
                ) from None
    return rows


def _reads(kind: type, text: str | None) -> bool:
    try:
        kind(text)
        return True
    except (TypeError, ValueError):
        return False


def retrained(candidates: list[dict], rows: list[dict], seeds: int) -> dict[str, tuple[float, float]]:
    """Each retrained candidate's name -> (search score, mean held-out score). heldout.csv names a
    candidate by topology and search score (two candidates of one topology differ in their solved
    values, so the topology alone does not identify one), and by name where it has the column (the
    comparison's own file, written before it had one, does not): each row must match one candidate,
    and each candidate must have every held-out seed."""
    scores: dict[str, list[float]] = {}
    searched: dict[str, float] = {}
    for row in rows:
        key = (row["topology"], row["search_score"])
        matches = [
            c["name"] for c in candidates if (c["topology"], c.get("score")) == key and row["name"] in (None, c["name"])
        ]
        if len(matches) != 1:
            raise MadslError(
                f"{row['algorithm']} seed {row['seed']}: {key[0]} at search score {key[1]!r} matches "
                f"{len(matches)} candidates of its search's state, not one",
                row["where"],
                hint="heldout.csv and states/ must come from the same run of benchmarks/search_evidence.py",
            )
        scores.setdefault(matches[0], []).append(row["heldout_score"])
        searched[matches[0]] = key[1]
    incomplete = [n for n, v in scores.items() if len(v) != seeds]
    if incomplete:
        raise MadslError(
            f"{', '.join(incomplete)}: fewer rows than the {seeds} held-out seeds results.json names",
            rows[0]["where"],
            hint="rerun benchmarks/search_evidence.py with the same arguments to finish the retrains",
        )
    return {n: (searched[n], statistics.fmean(v)) for n, v in scores.items()}


def spearman(a: list[float], b: list[float]) -> float | None:
    from scipy import stats

    if len(a) < 3:
        return None
    return float(stats.spearmanr(a, b).statistic)


def checkpoints(budget: tuple[int, int, int]) -> list[int]:
    """Trained candidates after the initial population and after each generation."""
    population, generations, offspring = budget
    return [population + g * offspring for g in range(generations + 1)]


def means(rows: list[dict]) -> dict:
    """Per algorithm, each per-search quantity's mean over seeds."""
    keys = (
        "best_search_score",
        "best_heldout",
        "hypervolume",
        "front_state_span",
        "fixed_state_near_bound",
        "search_minus_heldout",
        "spearman",
    )
    return {
        name: {k: _mean([r[k] for r in rows if r["algorithm"] == name]) for k in keys}
        for name in ALGORITHMS
        if any(r["algorithm"] == name for r in rows)
    }


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.fmean(values) if values else None


def anytime(rows: list[dict], at: list[int]) -> dict:
    out = {}
    for name in ALGORITHMS:
        curves = [r["curve"] for r in rows if r["algorithm"] == name]
        out[name] = {
            str(k): dict(zip(("mean", "low", "high"), t_interval([c[k - 1] for c in curves])))
            for k in at
            if curves and all(len(c) >= k for c in curves)
        }
    return out


def by_seed(rows: list[dict], name: str, key: str) -> dict[int, float]:
    return {r["seed"]: r[key] for r in rows if r["algorithm"] == name and r[key] is not None}


def refit_tests(rows: list[dict]) -> dict:
    """The pre-registered tests again, from the raw data: each algorithm against random search."""
    tests = {}
    for name, key in itertools.product(("nsga2", "regularized-evolution"), ("best_heldout", "hypervolume")):
        a, b = by_seed(rows, name, key), by_seed(rows, "random", key)
        common = sorted(set(a) & set(b))
        if common:
            tests[f"{name} vs random: {key}"] = paired([a[s] for s in common], [b[s] for s in common])
    return tests


def refit_equals(rows: list[dict], recorded: dict) -> bool:
    """The tests refitted from the raw data agree with results.json's (as the comparison ran them)."""
    refit = refit_tests(rows)
    return set(refit) == set(recorded) and all(
        math.isclose(refit[k][field], recorded[k][field], abs_tol=1e-12)
        for k in refit
        for field in ("mean_difference", "permutation_p", "wilcoxon_p")
    )


def exploratory(rows: list[dict]) -> dict:
    """Regularized evolution against NSGA-II, two-sided: twice the smaller one-sided p."""
    out = {}
    for key in ("best_heldout", "hypervolume"):
        a, b = by_seed(rows, "regularized-evolution", key), by_seed(rows, "nsga2", key)
        common = sorted(set(a) & set(b))
        if not common:
            continue
        one = paired([a[s] for s in common], [b[s] for s in common])
        other = paired([b[s] for s in common], [a[s] for s in common])
        one["permutation_p_two_sided"] = min(1.0, 2 * min(one["permutation_p"], other["permutation_p"]))
        one["wilcoxon_p_two_sided"] = min(1.0, 2 * min(one["wilcoxon_p"], other["wilcoxon_p"]))
        out[f"regularized-evolution vs nsga2: {key}"] = one
    return out


def markdown(analysis: dict) -> str:
    lines = [
        "| algorithm | seed | best search score | held-out best | hypervolume | front | front's total state | span |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in analysis["per_search"]:
        lines.append(
            f"| {r['algorithm']} | {r['seed']} | {r['best_search_score']:.3f} | {r['best_heldout']:.3f} | "
            f"{r['hypervolume']:.3f} | {r['front_size']} | {r['front_state_min']:,}-{r['front_state_max']:,} | "
            f"{r['front_state_span']:.2f} |"
        )
    at = analysis["checkpoints"]
    lines += ["", "| algorithm | " + " | ".join(f"after {k}" for k in at) + " |", "|---" * (len(at) + 1) + "|"]
    for name, points in analysis["anytime"].items():
        cells = [f"{p['mean']:.3f} [{p['low']:.3f}, {p['high']:.3f}]" for p in points.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| algorithm | held-out best | hypervolume | front's span | search - held-out (top 5) | Spearman |"]
    lines.append("|---|---|---|---|---|---|")
    for name, m in analysis["means"].items():
        cells = [m[k] for k in ("best_heldout", "hypervolume", "front_state_span", "search_minus_heldout", "spearman")]
        lines.append(f"| {name} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in cells) + " |")
    lines += ["", "| comparison | mean difference [95 % bootstrap] | wins/losses | permutation p | Wilcoxon p |"]
    lines.append("|---|---|---|---|---|")
    for label, t in {**analysis["tests"], **analysis["exploratory"]}.items():
        low, high = t["interval_95"]
        p, w = t.get("permutation_p_two_sided", t["permutation_p"]), t.get("wilcoxon_p_two_sided", t["wilcoxon_p"])
        lines.append(
            f"| {label} | {t['mean_difference']:+.3f} [{low:+.3f}, {high:+.3f}] | {t['wins']}/{t['losses']} | "
            f"{p:.3f} | {w:.3f} |"
        )
    return "\n".join(lines)


def main() -> int:
    args = arguments()
    out = Path(args.out)
    analysis = analyse(out, args.search, args.tiny)
    write_text_atomic(out / "analysis.json", json.dumps(analysis, indent=2) + "\n")
    print(markdown(analysis))
    return 0


if __name__ == "__main__":
    from madsl.cli.common import run_script

    run_script(main)
