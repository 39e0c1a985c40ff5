"""Does evolution beat random search? The evidence for `madsl search` (issue 29).

For each seed, the search file's algorithm (default: the file's, e.g. NSGA-II) and random search
run with the same population, generations and offspring, so the same number of candidates
(population + generations x offspring); both through `madsl.search.loop.run_search`, on one results
database (an architecture both propose is trained once, its score read by both: the scores are
deterministic per identity on one device and thread count). Then the best score each found, per
seed and on average, and the hand-written specs of the space (the MAD paper's specs whose mixers
the space holds, e.g. (H-Sg)x2, 4Mb, H-MoE:mA-MoE) scored under the same protocol: does the best
found beat the best hand-written one? Random search is the baseline every search method must beat
(Li & Talwalkar 2019; Yu et al. 2020).

    python benchmarks/search_vs_random.py                              # specs/search/recall-hybrids.yaml, seeds 0 1 2
    python benchmarks/search_vs_random.py --seeds 0 1 2 3 4 --workers 2 --db search-evidence.db
    python benchmarks/search_vs_random.py --algorithm regularized-evolution
    python benchmarks/search_vs_random.py --tiny                       # a check that it runs: seconds-long runs,
                                                                       # 3 + 1 x 2 candidates, seed 0

Prints one line per search, a table per seed, the means, and the hand-written specs' scores;
`--json PATH` also writes all of it. Rerunning the same command resumes where it stopped (every
search keeps its state beside --db).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from madsl import topology as topo  # noqa: E402
from madsl.graph import account  # noqa: E402
from madsl.lang.budget import QUANTITIES, check, parse_bound, upper_bound  # noqa: E402
from madsl.runner.config import EvalConfig  # noqa: E402
from madsl.search.config import Objectives  # noqa: E402
from madsl.search.figures import plot_front, plot_generations  # noqa: E402
from madsl.search.hypervolume import hypervolume as front_hypervolume  # noqa: E402
from madsl.search.loop import run_search  # noqa: E402
from madsl.search.reading import load_search  # noqa: E402
from madsl.spec import load_spec  # noqa: E402

TOP_K = 5  # the k of top_mean
TIE = 0.005  # best scores closer than this are a tie: a few test tokens, well inside the seed-to-seed spread
SOLVED = 0.99  # a score that counts as solving the tasks: where every search reaches it, how soon and how often

# --tiny: a protocol of seconds per run, to check the script end to end
TINY_SETTINGS = {
    "protocol": "smoke",
    "tasks": ["in-context-recall"],
    "epochs": 1,
    "set": {"num_train_examples": 32, "num_test_examples": 16},
}


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--search", default=str(REPO / "specs" / "search" / "recall-hybrids.yaml"), help="the search file")
    p.add_argument(
        "--algorithm",
        choices=("nsga2", "regularized-evolution"),
        default=None,
        help="the evolutionary algorithm compared with random search (default: the file's)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--db", default="search-vs-random.db", help="results database (default: %(default)s)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument(
        "--hand",
        nargs="*",
        default=None,
        help="hand-written specs to compare with (default: specs/paper/*.mad whose mixers the space holds)",
    )
    p.add_argument("--tiny", action="store_true", help="seconds-long runs, 3 + 1 x 2 candidates, seed 0: a check")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--figures",
        metavar="DIR",
        help="also draw each search's front and generations figures "
        "(front-ALGORITHM-seedN.png, generations-ALGORITHM-seedN.png)",
    )
    p.add_argument(
        "--plot",
        metavar="PNG",
        help="also draw the best score so far against candidates scored, per algorithm (mean and range over the seeds)",
    )
    return p.parse_args()


def variant(search, name: str, seed: int, tiny: bool):
    algorithm = dataclasses.replace(
        search.algorithm, name=name, seed=seed, **({"population": 3, "generations": 1, "offspring": 2} if tiny else {})
    )
    if name != "regularized-evolution":
        algorithm = dataclasses.replace(algorithm, sample_size=min(algorithm.sample_size, algorithm.population))
    changed = dataclasses.replace(search, algorithm=algorithm)
    if tiny:
        changed = dataclasses.replace(changed, objectives=Objectives(TINY_SETTINGS, search.objectives.minimize))
    return changed


def best_so_far(result) -> list[float]:
    """The best score after each candidate, in the order the search proposed them (a failed
    candidate counts as scored, adding nothing)."""
    curve, top = [], -math.inf
    for candidate in result.state.scored():
        score = candidate.get("score")
        top = max(top, score) if score is not None else top
        curve.append(top)
    return curve


def solved(result) -> tuple[int | None, int]:
    """How many candidates the search scored until its first one at SOLVED or above (None: none
    reached it), and how many reached it in all."""
    curve = best_so_far(result)
    first = next((i + 1 for i, top in enumerate(curve) if top >= SOLVED), None)
    return first, sum(1 for c in result.state.candidates.values() if (c.get("score") or 0) >= SOLVED)


def hypervolume(result, search) -> float | None:
    """The share of the (score, first minimised total) plane a search's candidates dominate, the
    usual measure of a Pareto front (Zitzler & Thiele 1998): score from 0 to 1 (maximised), the
    total from 0 to its budget bound (minimised). None: no minimised total, or no bound on it."""
    if not search.objectives.minimize:
        return None
    quantity = search.objectives.minimize[0]
    budget = search.spec_data.get("budget") or {}
    limit = upper_bound(budget, quantity)  # total_state: fixed_state's and kv_cache's bounds summed
    if not math.isfinite(limit) or limit <= 0:
        return None
    # the library's exact hypervolume over (negated score, total), the score capped at 1, as a share of the box
    points = [
        (-min(c["score"], 1.0), c["totals"][quantity])
        for c in result.state.candidates.values()
        if c.get("score") is not None
    ]
    return front_hypervolume(points, (0.0, limit)) / limit


def top_mean(result, k: int = TOP_K) -> float | None:
    """The mean score of a search's k best candidates: less luck-bound than the single best."""
    scores = sorted((c["score"] for c in result.state.candidates.values() if c.get("score") is not None), reverse=True)
    return statistics.fmean(scores[:k]) if len(scores) >= k else None


def best(result) -> tuple[float | None, str | None]:
    scored = [c for c in result.state.candidates.values() if c.get("score") is not None]
    if not scored:
        return None, None
    top = max(scored, key=lambda c: c["score"])
    return top["score"], top["topology"]


def hand_written(search, paths: list[str] | None) -> list[str]:
    """The paper's specs the space holds (its mixers, within its block range) that meet the search's
    budget, accounted at the search's length as its candidates are."""
    if paths is not None:
        return paths
    allowed = set(search.space.sequence_mixers) | set(search.space.channel_mixers)
    budget = {q: parse_bound(v) for q, v in (search.spec_data.get("budget") or {}).items() if q in QUANTITIES}
    out = []
    for path in sorted(glob.glob(str(REPO / "specs" / "paper" / "*.mad"))):
        spec = load_spec(path)
        blocks = list(topo.blocks(topo.expand(spec.topology)))
        if (
            set(spec.symbols_used()) <= allowed
            and search.space.min_blocks <= len(blocks) <= search.space.max_blocks
            and not check(account(spec, seq_len=search.spec_data.get("seq_len")).totals, budget)
        ):
            out.append(path)
    return out


def score_hand_written(search, paths: list[str], db: str, workers: int) -> list[dict]:
    from madsl.runner.api import evaluate

    if not paths:
        return []
    config = EvalConfig(settings=dict(search.objectives.settings)).replace(db=db, workers=workers)
    summary = evaluate(paths, config)
    # named by their files: the store may know a spec's identity under a candidate's name first
    names = {load_spec(path).hash: Path(path).stem for path in paths}
    return [{"spec": names.get(row.get("spec_hash"), row["spec"]), "score": row["score"]} for row in summary["scores"]]


def main() -> int:
    args = arguments()
    search = load_search(args.search)
    seeds = [0] if args.tiny else args.seeds
    evolution = args.algorithm or (search.algorithm.name if search.algorithm.name != "random" else "nsga2")
    config = EvalConfig.from_keywords(db=args.db, workers=args.workers)
    stem = Path(args.db).with_suffix("")
    rows, results = [], []
    for seed in seeds:
        row = {"seed": seed}
        for name in (evolution, "random"):
            searched = variant(search, name, seed, args.tiny)
            result = run_search(searched, config, state_path=f"{stem}.search-{search.name}-{name}-{seed}.json")
            if result.interrupted:
                print("interrupted: rerun the same command to resume", file=sys.stderr)
                return 130
            results.append(result)
            if args.figures:
                plot_front(searched, result.state, Path(args.figures) / f"front-{name}-seed{seed}.png")
                plot_generations(searched, result.state, Path(args.figures) / f"generations-{name}-seed{seed}.png")
            score, topology = best(result)
            first_solved, solved_count = solved(result)
            row[name] = {
                "best": score,
                "topology": topology,
                "candidates": len(result.state.candidates),
                "duplicates": result.state.counts["duplicates"],
                f"top{TOP_K}_mean": top_mean(result),
                "best_so_far": best_so_far(result),
                "first_solved": first_solved,
                "solved": solved_count,
                "hypervolume": hypervolume(result, searched),
                "generation_medians": [h["median"] for h in result.state.history],
            }
            print(
                f"seed {seed} {name}: best {score} ({topology}), {len(result.state.candidates)} candidates, "
                f"{result.state.counts['duplicates']} duplicates",
                flush=True,
            )
        rows.append(row)
    hand = score_hand_written(
        variant(search, evolution, 0, args.tiny), hand_written(search, args.hand), args.db, args.workers
    )
    report(rows, evolution, hand, variant(search, evolution, seeds[0], args.tiny))
    print(audit(args.db, results))
    if args.plot:
        print(f"figure: {plot_anytime(rows, evolution, hand, args.plot)}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "search": args.search,
                    "evolution": evolution,
                    "seeds": rows,
                    "hand_written": hand,
                    "load": os.getloadavg(),
                },
                indent=2,
            )
            + "\n"
        )
    return 0


def report(rows: list[dict], evolution: str, hand: list[dict], search) -> None:
    algorithm = search.algorithm
    print(
        f"\n{evolution} vs random search, {algorithm.evaluations} candidates each "
        f"({algorithm.population} + {algorithm.generations} x {algorithm.offspring}), "
        f"objectives.score {json.dumps(search.objectives.settings)}"
    )
    print(f"{'seed':>6}  {evolution:>24}  {'random':>8}  winner")
    for row in rows:
        a, b = row[evolution]["best"], row["random"]["best"]
        winner = "-" if a is None or b is None else "tie" if abs(a - b) < TIE else evolution if a > b else "random"
        print(f"{row['seed']:>6}  {_shown(a):>24}  {_shown(b):>8}  {winner}")
    if rows and rows[0]["random"]["hypervolume"] is not None:
        print(
            f"hypervolume of (score, {search.objectives.minimize[0]}): "
            + "; ".join(
                f"seed {r['seed']} {evolution} {r[evolution]['hypervolume']:.4f} "
                f"random {r['random']['hypervolume']:.4f}"
                for r in rows
            )
        )
    print(f"scores >= {SOLVED}: the candidates scored until the first, and how many in all")
    for row in rows:
        print(
            f"{row['seed']:>6}  "
            + "  ".join(
                f"{name}: first at {row[name]['first_solved'] or '-'}, {row[name]['solved']} in all"
                for name in (evolution, "random")
            )
        )
    for name in (evolution, "random"):
        values = [r[name]["best"] for r in rows if r[name]["best"] is not None]
        if values:
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            print(f"{name}: mean best {statistics.fmean(values):.4f} ± {spread:.4f} over {len(values)} seed(s)")
        tops = [r[name][f"top{TOP_K}_mean"] for r in rows if r[name][f"top{TOP_K}_mean"] is not None]
        if tops:
            print(f"{name}: mean of the {TOP_K} best candidates {statistics.fmean(tops):.4f} (mean over seeds)")
    wins = sum(
        1
        for r in rows
        if None not in (r[evolution]["best"], r["random"]["best"]) and r[evolution]["best"] > r["random"]["best"] + TIE
    )
    print(f"{evolution} beats random search on {wins} of {len(rows)} seed(s) (by more than {TIE})")
    scored = [h for h in hand if h["score"] is not None]
    for h in sorted(scored, key=lambda h: -h["score"]):
        print(f"  hand-written {h['spec']}: {h['score']:.4f}")
    if scored:
        top = max(h["score"] for h in scored)
        found = max(
            (r[n]["best"] for r in rows for n in (evolution, "random") if r[n]["best"] is not None), default=None
        )
        verdict = "beats" if found is not None and found > top + TIE else "does not beat"
        print(f"the best found ({_shown(found)}) {verdict} the best hand-written spec ({top:.4f})")


def audit(db: str, results: list) -> str:
    """What the store and the saved states show: every candidate of every search re-accounted from
    the spec it trained and held to its budget again, and how often each run was taken up."""
    import sqlite3

    from madsl.spec import spec_from_data

    candidates = {h: c for r in results for h, c in r.state.candidates.items() if c.get("status") == "scored"}
    over = [
        c["topology"]
        for c in candidates.values()
        if check(
            account(spec_from_data(c["spec"])).totals,
            {q: parse_bound(v) for q, v in c["spec"].get("budget", {}).items() if q in QUANTITIES},
        )
    ]
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:  # the runs of each identity under one training
        counts = conn.execute(
            "SELECT COUNT(*), MAX(attempts) FROM runs WHERE spec_hash IN (%s) "
            "GROUP BY spec_hash, task, setting_hash, seed, train_config" % ",".join("?" * len(candidates)),
            list(candidates),
        ).fetchall()
    proposed = sum(len(r.state.candidates) for r in results)
    return (
        f"store: {len(candidates)} distinct candidates scored across {len(results)} searches "
        f"({proposed} proposals); runs of one identity under one training: at most "
        f"{max((c for c, _ in counts), default=0)}, each taken up at most {max((a for _, a in counts), default=0)} "
        f"time(s) (2: stopped and resumed from its checkpoint); over budget when re-accounted: {len(over)}"
        f"{' ' + str(over) if over else ''}"
    )


def plot_anytime(rows: list[dict], evolution: str, hand: list[dict], path: str) -> Path:
    """Left: the best score so far against candidates scored, each algorithm's mean over the seeds
    (its range shaded), the best hand-written spec as a line. Right: each generation's median
    score, mean over the seeds: where the best saturates, whether a search keeps proposing good ones."""
    import numpy as np

    from madsl.runner.reports.plots import pyplot, save_atomic

    plt = pyplot("the search comparison figure")
    fig, (best_ax, median_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    try:
        for name, color in ((evolution, "tab:red"), ("random", "tab:blue")):
            for ax, key in ((best_ax, "best_so_far"), (median_ax, "generation_medians")):
                curves = [r[name][key] for r in rows if r[name][key] and None not in r[name][key]]
                if not curves:
                    continue
                length = min(len(c) for c in curves)
                values = np.array([c[:length] for c in curves])
                x = np.arange(1, length + 1) if key == "best_so_far" else np.arange(length)
                ax.plot(
                    x,
                    values.mean(axis=0),
                    color=color,
                    marker="o" if key != "best_so_far" else None,
                    label=f"{name} (mean of {len(curves)} seeds)",
                )
                ax.fill_between(x, values.min(axis=0), values.max(axis=0), color=color, alpha=0.15)
        scored = [h["score"] for h in hand if h["score"] is not None]
        if scored:
            best_ax.axhline(max(scored), color="0.3", linestyle="--", label="best hand-written spec")
        best_ax.set_xlabel("candidates scored")
        best_ax.set_ylabel("best MAD score so far")
        median_ax.set_xlabel("generation (0: the initial population, shared)")
        median_ax.set_ylabel("the generation's median MAD score")
        from matplotlib.ticker import MaxNLocator

        median_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        for ax in (best_ax, median_ax):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        return save_atomic(fig, Path(path), dpi=150)
    finally:
        plt.close(fig)


def _shown(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


if __name__ == "__main__":
    from madsl.cli.common import run_script

    run_script(main)
