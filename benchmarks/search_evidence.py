"""Does search beat random search on a fitness worth searching? The evidence of issue 40, as NAS
practice asks it (Lindauer & Hutter 2020's checklist; Li & Talwalkar 2019's baseline).

Every algorithm (default: NSGA-II, regularized evolution, random search) runs at every seed with
the same population, generations and offspring, so the same number of trained candidates, all on
one results database (an identity two searches propose trains once; scores are deterministic per
identity). Then each search's top K candidates (by their search score) are retrained on fresh
data seeds (held out: other data, initialisation and order than the search saw), and each search
is summarised by its held-out best (the best of its top K's mean held-out scores). The comparison
of an algorithm with random search is paired by search seed: an exact sign-flip permutation test
of the mean difference (2^n assignments) and an exact one-sided Wilcoxon signed-rank test, both
in the direction "the algorithm finds better", with a bootstrap interval of the mean difference.
Hypervolume of each search's (score, first minimised quantity) front, paired the same way.

    python benchmarks/search_evidence.py --out docs/evidence/search/comparison --db docs/evidence/search/results.db
    python benchmarks/search_evidence.py --tiny --out /tmp/evidence-tiny       # seconds-long runs: a check

Writes into --out: `states/ALGORITHM-seedN.json` (each search's state: its lineage, every
candidate with its spec, totals and score), `candidates.csv` (every candidate of every search),
`heldout.csv` (every retrained candidate and seed), `results.json` (the summary and the tests)
and `anytime.png`. Rerunning the same command resumes: searches from their states, runs from the
database (done runs are never repeated).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from search_vs_random import TINY_SETTINGS, best_so_far, hypervolume  # noqa: E402

from madsl.runner.config import EvalConfig  # noqa: E402
from madsl.search.config import Objectives  # noqa: E402
from madsl.search.loop import run_search  # noqa: E402
from madsl.search.reading import load_search  # noqa: E402

ALGORITHMS = ("nsga2", "regularized-evolution", "random")
BOOTSTRAP = 10_000


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--search", default=str(REPO / "specs" / "search" / "mad-hybrids.yaml"))
    p.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--population", type=int, default=8, help="every search's initial population (default 8)")
    p.add_argument("--generations", type=int, default=3, help="every search's generations (default 3)")
    p.add_argument("--offspring", type=int, default=6, help="candidates a generation (default 6)")
    p.add_argument("--top", type=int, default=5, help="candidates of each search retrained (default 5)")
    p.add_argument("--heldout-seeds", type=int, nargs="+", default=[1, 2], help="data seeds of the retrains")
    p.add_argument("--db", default="search-evidence.db")
    p.add_argument("--out", required=True, help="the folder of states, tables, results and figure")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--tiny", action="store_true", help="seconds-long runs, 3 + 1 x 2 candidates, 2 seeds: a check")
    return p.parse_args()


def variant(search, name: str, seed: int, budget: tuple[int, int, int], tiny: bool):
    population, generations, offspring = budget
    algorithm = dataclasses.replace(
        search.algorithm, name=name, seed=seed, population=population, generations=generations, offspring=offspring
    )
    algorithm = dataclasses.replace(algorithm, sample_size=min(algorithm.sample_size, population))
    changed = dataclasses.replace(search, algorithm=algorithm)
    if tiny:
        changed = dataclasses.replace(changed, objectives=Objectives(TINY_SETTINGS, search.objectives.minimize))
    return changed


def top_candidates(state, k: int) -> list[dict]:
    """A search's k best scored candidates, best first (ties: the earlier proposed), each with its
    spec hash (the state's key) as "spec_hash"."""
    scored = [{**c, "spec_hash": h} for h, c in state.candidates.items() if c.get("score") is not None]
    return sorted(scored, key=lambda c: -c["score"])[:k]


def retrain(candidates: list[dict], searched, seeds: list[int], db: str, workers: int) -> dict[str, dict[int, float]]:
    """Each candidate (by spec hash) -> held-out seed -> its MAD score trained on that seed, under
    the search's own fitness settings."""
    from madsl.runner.api import evaluate
    from madsl.spec import spec_from_data

    specs = {c["spec_hash"]: spec_from_data(c["spec"]) for c in candidates}
    out: dict[str, dict[int, float]] = {h: {} for h in specs}
    for seed in seeds:
        settings = {**searched.objectives.settings, "seed": [seed]}
        summary = evaluate(list(specs.values()), EvalConfig(settings=settings).replace(db=db, workers=workers))
        if not summary["complete"]:
            raise SystemExit("interrupted: rerun the same command to resume")
        for row in summary["scores"]:
            if row["spec_hash"] in out and row["score"] is not None:
                out[row["spec_hash"]][seed] = row["score"]
    return out


def paired(a: list[float], b: list[float], seed: int = 0) -> dict:
    """a against b, paired: the mean difference, its bootstrap 95 % interval, the exact one-sided
    sign-flip permutation p (a > b) and the exact one-sided Wilcoxon signed-rank p."""
    import numpy as np
    from scipy import stats

    d = np.array(a) - np.array(b)
    n = len(d)
    observed = d.mean()
    flips = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    permutation_p = float(np.mean((flips * np.abs(d)).mean(axis=1) >= observed - 1e-12))
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, n, size=(BOOTSTRAP, n))].mean(axis=1)
    nonzero = d[np.abs(d) > 1e-12]
    wilcoxon = float(stats.wilcoxon(nonzero, alternative="greater", method="exact").pvalue) if len(nonzero) else 1.0
    return {
        "n": n,
        "mean_difference": float(observed),
        "interval_95": [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))],
        "wins": int((d > 1e-12).sum()),
        "losses": int((d < -1e-12).sum()),
        "permutation_p": permutation_p,
        "wilcoxon_p": wilcoxon,
        "smallest_p": 1 / 2**n,
    }


def main() -> int:
    args = arguments()
    out = Path(args.out)
    (out / "states").mkdir(parents=True, exist_ok=True)
    search = load_search(args.search)
    seeds = [0, 1] if args.tiny else args.seeds
    budget = (3, 1, 2) if args.tiny else (args.population, args.generations, args.offspring)
    config = EvalConfig.from_keywords(db=args.db, workers=args.workers)
    rows, candidates_rows, heldout_rows = [], [], []
    for seed, name in itertools.product(seeds, args.algorithms):
        searched = variant(search, name, seed, budget, args.tiny)
        result = run_search(searched, config, state_path=out / "states" / f"{name}-seed{seed}.json")
        if result.interrupted:
            print("interrupted: rerun the same command to resume", file=sys.stderr)
            return 130
        top = top_candidates(result.state, args.top)
        held = retrain(top, searched, args.heldout_seeds, args.db, args.workers)
        means = {h: statistics.fmean(s.values()) for h, s in held.items() if len(s) == len(args.heldout_seeds)}
        for c in result.state.candidates.values():
            candidates_rows.append(
                {
                    "algorithm": name,
                    "seed": seed,
                    "name": c["name"],
                    "topology": c["topology"],
                    "status": c["status"],
                    "generation": c.get("generation"),
                    "score": c.get("score"),
                    **c.get("totals", {}),
                }
            )
        for c in top:
            for data_seed, score in held[c["spec_hash"]].items():
                heldout_rows.append(
                    {
                        "algorithm": name,
                        "seed": seed,
                        "name": c["name"],
                        "topology": c["topology"],
                        "search_score": c["score"],
                        "heldout_seed": data_seed,
                        "heldout_score": score,
                    }
                )
        best_heldout = max(means.values(), default=None)
        row = {
            "algorithm": name,
            "seed": seed,
            "evaluations": len(result.state.scored()),
            "best_search_score": top[0]["score"] if top else None,
            "best_heldout": best_heldout,
            "top_heldout_mean": statistics.fmean(means.values()) if means else None,
            "hypervolume": hypervolume(result, searched),
            "best_so_far": best_so_far(result),
        }
        rows.append(row)
        print(
            f"{name} seed {seed}: {row['evaluations']} scored, best {row['best_search_score']}, held-out best "
            f"{best_heldout}, hypervolume {row['hypervolume']}",
            flush=True,
        )
    results = summarise(rows, args, search, budget)
    _write_csv(out / "candidates.csv", candidates_rows)
    _write_csv(out / "heldout.csv", heldout_rows)
    (out / "results.json").write_text(json.dumps({**results, "load": os.getloadavg()}, indent=2) + "\n")
    plot_anytime(rows, args.algorithms, out / "anytime.png")
    print(json.dumps(results["tests"], indent=2))
    return 0


def summarise(rows: list[dict], args, search, budget: tuple[int, int, int]) -> dict:
    """Per algorithm the means over seeds; against random search, the paired tests."""
    by = {name: {r["seed"]: r for r in rows if r["algorithm"] == name} for name in args.algorithms}
    summary = {
        name: {
            key: _mean([r[key] for r in runs.values()])
            for key in ("best_search_score", "best_heldout", "top_heldout_mean", "hypervolume")
        }
        for name, runs in by.items()
    }
    tests = {}
    for name in (a for a in args.algorithms if a != "random"):
        if "random" not in by:
            break
        common = sorted(set(by[name]) & set(by["random"]))
        for key in ("best_heldout", "hypervolume"):
            pairs = [(by[name][s][key], by["random"][s][key]) for s in common]
            if pairs and None not in itertools.chain.from_iterable(pairs):
                tests[f"{name} vs random: {key}"] = paired([a for a, _ in pairs], [b for _, b in pairs])
    return {
        "search": args.search,
        "budget": {"population": budget[0], "generations": budget[1], "offspring": budget[2]},
        "top": args.top,
        "heldout_seeds": args.heldout_seeds,
        "fitness": search.objectives.settings,
        "per_search": rows,
        "means": summary,
        "tests": tests,
    }


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _write_csv(path: Path, rows: list[dict]) -> None:
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def plot_anytime(rows: list[dict], algorithms: list[str], path: Path) -> None:
    """The best search score so far against trained candidates: each algorithm's mean over seeds,
    its range shaded."""
    import numpy as np

    from madsl.runner.reports.plots import pyplot, save_atomic

    plt = pyplot("the search evidence figure")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    try:
        for name, colour in zip(algorithms, ("tab:red", "tab:green", "tab:blue")):
            curves = [r["best_so_far"] for r in rows if r["algorithm"] == name and r["best_so_far"]]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            values = np.array([[v if math.isfinite(v) else np.nan for v in c[:length]] for c in curves])
            x = np.arange(1, length + 1)
            ax.plot(x, np.nanmean(values, axis=0), color=colour, label=f"{name} (mean of {len(curves)} seeds)")
            ax.fill_between(x, np.nanmin(values, axis=0), np.nanmax(values, axis=0), color=colour, alpha=0.15)
        ax.set_xlabel("trained candidates")
        ax.set_ylabel("best MAD score so far (search's data)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_atomic(fig, path, dpi=150)
    finally:
        plt.close(fig)


if __name__ == "__main__":
    from madsl.cli.common import run_script

    run_script(main)
