"""The search's figures (matplotlib, written atomically): the Pareto front, score against an
accounted total (state or parameters), every scored candidate shown; and each generation's best
and median score, with the best so far.
"""

from __future__ import annotations

import os
from pathlib import Path

from madsl.runner.reports.plots import pyplot, save_atomic
from madsl.search.config import SearchFile
from madsl.search.record import front
from madsl.search.state import SearchState


def plot_front(search: SearchFile, state: SearchState, path: str | os.PathLike, x: str = "fixed_state") -> Path:
    """Score (y) against the total `x` of every scored candidate; the front's members marked and named."""
    plt = pyplot("the front figure")
    scored = [c for c in state.candidates.values() if c.get("score") is not None]
    best = front(search, state)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    try:
        ax.scatter(
            [c["totals"][x] for c in scored],
            [c["score"] for c in scored],
            s=18,
            color="0.65",
            label=f"candidates ({len(scored)})",
        )
        ordered = sorted(best, key=lambda c: c["totals"][x])
        ax.plot(
            [c["totals"][x] for c in ordered],
            [c["score"] for c in ordered],
            marker="o",
            color="tab:red",
            label=f"Pareto front ({', '.join(search.objectives.names)})",
        )
        for c in ordered:
            ax.annotate(
                c["topology"], (c["totals"][x], c["score"]), fontsize=7, xytext=(4, 3), textcoords="offset points"
            )
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel("MAD score")
        ax.set_title(f"{search.name}: {search.algorithm.name}, seed {search.algorithm.seed}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        return save_atomic(fig, Path(path), dpi=150)
    finally:
        plt.close(fig)


def plot_generations(search: SearchFile, state: SearchState, path: str | os.PathLike) -> Path:
    """Each generation's best and median score, and the best so far."""
    plt = pyplot("the generations figure")
    history = [h for h in state.history if h["best"] is not None]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    try:
        generations = [h["generation"] for h in history]
        ax.plot(generations, [h["best_so_far"] for h in history], color="tab:red", label="best so far")
        ax.plot(
            generations,
            [h["best"] for h in history],
            marker="o",
            linestyle="none",
            color="tab:blue",
            label="generation's best",
        )
        ax.plot(
            generations,
            [h["median"] for h in history],
            marker="s",
            linestyle="--",
            color="tab:gray",
            label="generation's median",
        )
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("generation (0: initial population)")
        ax.set_ylabel("MAD score")
        ax.set_title(f"{search.name}: {search.algorithm.name}, seed {search.algorithm.seed}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        return save_atomic(fig, Path(path), dpi=150)
    finally:
        plt.close(fig)
