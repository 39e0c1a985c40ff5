"""MAD scores against compute-optimal perplexity across architectures (the MAD paper's Fig. 5.1).

    compute_optimal_perplexities   exp(compute-optimal loss) per architecture at one IsoFLOP budget
    correlate_mad                  Pearson's r and Spearman's rho, with bootstrap intervals that
                                   resample the architectures

numpy, and scipy's rankdata for the ranks (imported when used).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from madsl.errors import MadslError
from madsl.scaling.fits import IsoFlopFit


@dataclass(frozen=True)
class Correlation:
    """MAD score against compute-optimal perplexity across architectures, with bootstrap intervals
    (resampling architectures; resamples where a correlation is undefined are skipped)."""

    archs: tuple[str, ...]
    scores: tuple[float, ...]
    perplexities: tuple[float, ...]
    pearson: float
    pearson_interval: tuple[float, float]
    spearman: float
    spearman_interval: tuple[float, float]
    level: float
    resamples: int
    skipped: int
    budget: float | None = None  # the IsoFLOP budget of the perplexities, where known


def compute_optimal_perplexities(fits: Iterable[IsoFlopFit], budget: float) -> dict[str, float]:
    """exp(compute-optimal loss) of each architecture fitted at `budget` FLOPs."""
    fits = list(fits)
    found = {fit.arch: math.exp(fit.optimal_loss) for fit in fits if fit.budget == budget}
    if not found:
        budgets = sorted({fit.budget for fit in fits})
        raise MadslError(
            f"no IsoFLOP fit at {budget:.3g} FLOPs",
            expected="one of " + ", ".join(f"{b:.3g}" for b in budgets) if budgets else None,
        )
    return found


def _correlations(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pearson's r of each row pair, and whether it is defined (neither row constant)."""
    defined = (np.ptp(x, axis=1) > 0) & (np.ptp(y, axis=1) > 0)
    dx = x - x.mean(axis=1, keepdims=True)
    dy = y - y.mean(axis=1, keepdims=True)
    scale = np.sqrt(np.sum(dx * dx, axis=1) * np.sum(dy * dy, axis=1))
    return np.clip(np.sum(dx * dy, axis=1) / np.where(defined, scale, 1.0), -1.0, 1.0), defined


def _bootstrapped(
    x: np.ndarray, y: np.ndarray, rows: np.ndarray, level: float, ranked: bool
) -> tuple[float, tuple[float, float], np.ndarray]:
    """Pearson's r of x and y (of their ranks if `ranked`: Spearman's rho, ties sharing their mean
    rank), its percentile interval over the resamples `rows` (one resample a row of indices), and
    which resamples it is defined for."""
    from scipy.stats import rankdata

    def prepare(values: np.ndarray) -> np.ndarray:
        return rankdata(values, axis=1) if ranked else values

    (estimate,), _ = _correlations(prepare(x[None]), prepare(y[None]))
    samples, defined = _correlations(prepare(x[rows]), prepare(y[rows]))
    tail = 50 * (1 - level)
    interval = (
        tuple(float(v) for v in np.percentile(samples[defined], [tail, 100 - tail]))
        if defined.any()
        else (math.nan, math.nan)
    )
    return float(estimate), interval, defined


def correlate_mad(
    scores: Mapping[str, float],
    perplexities: Mapping[str, float],
    *,
    budget: float | None = None,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Correlation:
    """Pearson and Spearman correlation of per-architecture MAD scores with compute-optimal
    perplexities, with `level` percentile intervals from `resamples` seeded bootstrap resamples of
    the architectures (a resample where a correlation is undefined, all one value, is skipped).
    Spearman's rho is Pearson's r of the ranks (ties share their mean rank)."""
    if set(scores) != set(perplexities):
        odd = sorted(set(scores) ^ set(perplexities))
        raise MadslError(
            f"MAD scores and perplexities name different architectures: {', '.join(odd)}",
            hint="pass both for the same architectures",
        )
    archs = tuple(sorted(scores))
    if len(archs) < 3:
        raise MadslError(
            f"a correlation across architectures needs at least 3, got {len(archs)}",
            hint="score and scale more architectures",
        )
    if resamples < 1 or not 0 < level < 1:
        raise MadslError(f"bootstrap needs resamples >= 1 and 0 < level < 1, not {resamples} and {level}")
    try:
        x = np.array([scores[a] for a in archs], dtype=float)
        y = np.array([perplexities[a] for a in archs], dtype=float)
    except (TypeError, ValueError):
        x = y = np.array([math.nan])
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise MadslError("MAD scores and perplexities must be finite numbers")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        raise MadslError(
            "every architecture has the same MAD score or the same perplexity: there is no correlation to measure"
        )
    rows = np.random.default_rng(seed).integers(0, len(archs), size=(resamples, len(archs)))
    pearson, pearson_interval, defined = _bootstrapped(x, y, rows, level, ranked=False)
    spearman, spearman_interval, _ = _bootstrapped(x, y, rows, level, ranked=True)
    return Correlation(
        archs=archs,
        scores=tuple(map(float, x)),
        perplexities=tuple(map(float, y)),
        pearson=pearson,
        pearson_interval=pearson_interval,
        spearman=spearman,
        spearman_interval=spearman_interval,
        level=level,
        resamples=resamples,
        skipped=int(resamples - defined.sum()),
        budget=budget,
    )
