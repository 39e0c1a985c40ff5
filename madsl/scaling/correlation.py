"""MAD scores against compute-optimal perplexity across architectures (the MAD paper's Fig. 5.1),
with the statistics a handful of architectures allows.

    compute_optimal_perplexities   exp(compute-optimal loss) per architecture at one IsoFLOP budget,
                                   of the optima inside the sizes trained (bracketed) alone
    correlate_mad                  Pearson's r, Spearman's rho and Kendall's tau of MAD score with
                                   perplexity: permutation p-values (exact over all n! orderings up
                                   to EXACT_UP_TO architectures, a seeded Monte Carlo test above),
                                   BCa bootstrap intervals from BCA_FROM architectures on, and the
                                   smallest correlation that could reach p < alpha at this n

Sign convention (DIRECTION): every correlation is of the MAD score with the perplexity. The MAD
paper's claim, a higher MAD score predicts a lower compute-optimal perplexity, is a negative
correlation, and the p-values test that direction alone (one-sided, pre-registered).

scipy.stats (permutation_test, bootstrap, rankdata), imported when used.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import numpy as np

from madsl.errors import MadslError
from madsl.scaling.fits import IsoFlopFit

DIRECTION = "one-sided, corr(MAD score, perplexity) < 0: a higher MAD score predicts a lower compute-optimal perplexity"
ALPHA = 0.05  # the level the smallest detectable correlation is stated at
EXACT_UP_TO = 9  # 9! = 362,880 orderings, enumerated in about a second; above, Monte Carlo
PERMUTATION_DRAWS = 100_000  # the Monte Carlo test's orderings: p-values resolved to about 1e-5
BCA_FROM = 8  # below this many architectures a bootstrap resample repeats most of them and BCa's
# jackknife has too few leave-one-out values: the interval says nothing, so it is not computed
PERMUTATION_BATCH = 40_320  # orderings a batch (8!), to bound the memory of Kendall's pairs
TIE_TOLERANCE = 1e-9  # correlations this close are one value of the null distribution


@dataclass(frozen=True)
class PermutationTest:
    """One correlation's permutation test, one-sided in the pre-registered direction (DIRECTION)."""

    statistic: float
    p_value: float  # exact: the share of the n! orderings at or below the statistic; Monte Carlo: (k+1)/(draws+1)
    detectable: float | None  # the smallest |correlation| whose one-sided p-value is below alpha (None: none is)
    smallest_p: float  # the p-value of the most extreme ordering: none lower is possible with these values


@dataclass(frozen=True)
class Correlation:
    """MAD score against compute-optimal perplexity across architectures: Pearson's r, Spearman's
    rho and Kendall's tau (all of MAD score with perplexity), their permutation tests (`tests`,
    one-sided: DIRECTION) and BCa bootstrap intervals over the architectures where n allows
    (else NaN, with the reason in `interval_note`)."""

    archs: tuple[str, ...]
    scores: tuple[float, ...]
    perplexities: tuple[float, ...]
    pearson: float
    pearson_interval: tuple[float, float]
    spearman: float
    spearman_interval: tuple[float, float]
    level: float
    resamples: int  # bootstrap resamples drawn (0: no interval computed)
    skipped: int  # resamples where a correlation is undefined (a constant side)
    kendall: float = math.nan
    kendall_interval: tuple[float, float] = (math.nan, math.nan)
    tests: dict[str, PermutationTest] = field(default_factory=dict)  # "pearson", "spearman", "kendall"
    permutations: int = 0  # orderings the tests weighed: n! (exact) or the Monte Carlo draws
    exact: bool = True
    alpha: float = ALPHA
    direction: str = DIRECTION
    interval_method: str = "none"  # "BCa", or "none" where not computed
    interval_note: str = ""  # why an interval is not computed
    budget: float | None = None  # the IsoFLOP budget of the perplexities, where known


def compute_optimal_perplexities(
    fits: Iterable[IsoFlopFit], budget: float, *, extrapolated: bool = False
) -> dict[str, float]:
    """exp(compute-optimal loss) of each architecture fitted at `budget` FLOPs whose optimum lies
    inside the sizes it trained (`extrapolated`: every one fitted). No fit at all at `budget` is
    a MadslError naming the budgets fitted."""
    fits = list(fits)
    at_budget = [fit for fit in fits if fit.budget == budget]
    if not at_budget:
        budgets = sorted({fit.budget for fit in fits})
        raise MadslError(
            f"no IsoFLOP fit at {budget:.3g} FLOPs",
            expected="one of " + ", ".join(f"{b:.3g}" for b in budgets) if budgets else None,
        )
    return {fit.arch: math.exp(fit.optimal_loss) for fit in at_budget if extrapolated or fit.bracketed}


# --- the statistics, vectorized along the last axis (NaN where a side is constant) --------------


def _pearson(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    dx = x - x.mean(axis=-1, keepdims=True)
    dy = y - y.mean(axis=-1, keepdims=True)
    scale = np.sqrt(np.sum(dx * dx, axis=-1) * np.sum(dy * dy, axis=-1))
    r = np.sum(dx * dy, axis=-1) / np.where(scale > 0, scale, 1.0)
    return np.where(scale > 0, np.clip(r, -1.0, 1.0), np.nan)


def _spearman(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Pearson's r of the ranks (ties share their mean rank), as scipy's spearmanr."""
    from scipy.stats import rankdata

    return _pearson(rankdata(x, axis=-1), rankdata(y, axis=-1))


def _kendall(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Kendall's tau-b, as scipy's kendalltau: (concordant − discordant pairs) over the square
    root of the product of the pairs untied in x and in y."""
    first, second = np.triu_indices(x.shape[-1], 1)
    sx = np.sign(x[..., second] - x[..., first])
    sy = np.sign(y[..., second] - y[..., first])
    scale = np.sqrt(np.sum(sx != 0, axis=-1) * np.sum(sy != 0, axis=-1))
    tau = np.sum(sx * sy, axis=-1) / np.where(scale > 0, scale, 1.0)
    return np.where(scale > 0, np.clip(tau, -1.0, 1.0), np.nan)


STATISTICS: dict[str, Callable[..., np.ndarray]] = {"pearson": _pearson, "spearman": _spearman, "kendall": _kendall}


def _detectable(null: np.ndarray, alpha: float, exact: bool) -> tuple[float | None, float]:
    """From a null distribution: the smallest |t| of its negative values t whose one-sided p-value
    P(T <= t) is below `alpha` (None where none is), and the smallest p-value any value reaches."""
    values = np.sort(null)
    candidates = np.unique(np.round(values, 9))
    counts = np.searchsorted(values, candidates + TIE_TOLERANCE, side="right")
    p = counts / len(values) if exact else (counts + 1) / (len(values) + 1)
    below = np.flatnonzero((p < alpha) & (candidates < 0))
    # the value itself, not its rounding: the largest of the distribution within that tie
    return (float(-values[counts[below[-1]] - 1]) if below.size else None), float(p[0])


def _permutation_test(x: np.ndarray, y: np.ndarray, name: str, draws: int, seed: int, alpha: float) -> PermutationTest:
    """The permutation test of one statistic: x's orderings against y held fixed (scipy's
    `pairings` of one sample: n! orderings, all of them up to EXACT_UP_TO), alternative `less`."""
    from scipy.stats import permutation_test

    statistic = STATISTICS[name]
    exact = len(x) <= EXACT_UP_TO
    result = permutation_test(
        (x,),
        lambda xs, axis=-1: statistic(xs, y),
        permutation_type="pairings",
        vectorized=True,
        n_resamples=np.inf if exact else draws,
        batch=PERMUTATION_BATCH,
        alternative="less",
        rng=np.random.default_rng(seed),
    )
    detectable, smallest_p = _detectable(np.asarray(result.null_distribution), alpha, exact)
    return PermutationTest(float(result.statistic), float(result.pvalue), detectable, smallest_p)


def _bca_interval(
    x: np.ndarray, y: np.ndarray, name: str, resamples: int, seed: int, level: float
) -> tuple[tuple[float, float], int, str]:
    """scipy's BCa interval of one statistic over paired resamples of the architectures, the
    resamples where it is undefined, and why the interval is not computed ("" where it is)."""
    from scipy.stats import bootstrap

    with warnings.catch_warnings():  # what scipy warns about is said in the note instead
        warnings.simplefilter("ignore")
        result = bootstrap(
            (x, y),
            STATISTICS[name],
            paired=True,
            vectorized=True,
            method="BCa",
            n_resamples=resamples,
            confidence_level=level,
            rng=np.random.default_rng(seed),
        )
    samples = np.asarray(result.bootstrap_distribution)
    undefined = int(np.sum(~np.isfinite(samples)))
    low, high = (float(v) for v in (result.confidence_interval.low, result.confidence_interval.high))
    if undefined:
        note = f"{undefined} of {resamples} resamples hold one MAD score or one perplexity only (no correlation)"
    elif np.ptp(samples) == 0:
        note = "every resample gives the same value, where BCa is undefined"
    elif not (math.isfinite(low) and math.isfinite(high)):
        note = "scipy's BCa found no interval"
    else:
        return (low, high), 0, ""
    return (math.nan, math.nan), undefined, note


def _checked(
    scores: Mapping[str, float], perplexities: Mapping[str, float], resamples: int, level: float, draws: int
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
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
    if resamples < 1 or draws < 1 or not 0 < level < 1:
        raise MadslError(f"resamples and draws must be >= 1 and 0 < level < 1, not {resamples}, {draws} and {level}")
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
    return archs, x, y


def correlate_mad(
    scores: Mapping[str, float],
    perplexities: Mapping[str, float],
    *,
    budget: float | None = None,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    draws: int = PERMUTATION_DRAWS,
    alpha: float = ALPHA,
) -> Correlation:
    """Pearson's r, Spearman's rho and Kendall's tau-b of per-architecture MAD scores with
    compute-optimal perplexities. Each has a permutation p-value, one-sided in the pre-registered
    direction (DIRECTION): exact over all n! orderings up to EXACT_UP_TO architectures, else from
    `draws` seeded random orderings; and the smallest |correlation| that reaches p < `alpha` with
    these values. From BCA_FROM architectures on, `level` BCa intervals from `resamples` seeded
    bootstrap resamples of the architectures; below, NaN with the reason in `interval_note`."""
    archs, x, y = _checked(scores, perplexities, resamples, level, draws)
    tests = {name: _permutation_test(x, y, name, draws, seed, alpha) for name in STATISTICS}
    if len(archs) >= BCA_FROM:
        intervals = {name: _bca_interval(x, y, name, resamples, seed, level) for name in STATISTICS}
        notes = sorted({f"{name}: {note}" for name, (_, _, note) in intervals.items() if note})
    else:
        nan = ((math.nan, math.nan), 0, "")
        intervals = dict.fromkeys(STATISTICS, nan)
        notes = [
            f"not computed with {len(archs)} architectures (BCa needs {BCA_FROM}): a resample of so few "
            "repeats most of them, and its interval would span nearly [-1, 1] whatever the data"
        ]
    computed = len(archs) >= BCA_FROM
    return Correlation(
        archs=archs,
        scores=tuple(map(float, x)),
        perplexities=tuple(map(float, y)),
        pearson=tests["pearson"].statistic,
        pearson_interval=intervals["pearson"][0],
        spearman=tests["spearman"].statistic,
        spearman_interval=intervals["spearman"][0],
        kendall=tests["kendall"].statistic,
        kendall_interval=intervals["kendall"][0],
        level=level,
        resamples=resamples if computed else 0,
        skipped=max(skipped for _, skipped, _ in intervals.values()),
        tests=tests,
        permutations=math.factorial(len(archs)) if len(archs) <= EXACT_UP_TO else draws,
        exact=len(archs) <= EXACT_UP_TO,
        alpha=alpha,
        interval_method="BCa" if computed else "none",
        interval_note="; ".join(notes),
        budget=budget,
    )
