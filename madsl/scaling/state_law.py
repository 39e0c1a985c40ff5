"""The state-optimal law (the MAD paper's Fig. 4.3, right): an architecture's compute-optimal
perplexity against the total state of its compute-optimal model, across budgets,

    P*(C) = k · M*(C)^c        (least squares in log10-log10 over the budgets' optima)

with a seeded bootstrap interval of the slope c: each budget's points resampled with
replacement, every IsoFLOP parabola refit, its optimum's loss and the state of a model of that
size (log state interpolated over log N, as madsl.scaling.fits.state_optima reads it) taken
again. Only bracketed optima enter (an optimum outside the sizes trained is an extrapolation;
the report names those it leaves out). With two budgets the law is a two-point line: its
interval is what says how little that shows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from madsl.errors import MadslError
from madsl.scaling.fits import (
    IsoFlopFit,
    PowerLaw,
    ScalePoint,
    check_bootstrap,
    fit_isoflops,
    interpolate,
    log_lines,
    parabolas,
    percentile_interval,
    state_optima,
)


@dataclass(frozen=True)
class StateLaw:
    """One architecture's P* ∝ M*^c: `law.exponent` is c, `law.interval` its bootstrap interval."""

    arch: str
    budgets: tuple[float, ...]  # the budgets whose (bracketed) optima it is fitted to
    states: tuple[float, ...]  # M*(C), total state of the compute-optimal model
    perplexities: tuple[float, ...]  # P*(C) = exp(compute-optimal loss)
    law: PowerLaw
    level: float
    resamples: int
    skipped: int  # resamples in which some budget's parabola had no minimum


def _resampled(
    fit: IsoFlopFit, all_points: list[ScalePoint], rng: np.random.Generator, resamples: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log10 M* and log10 P* of `resamples` resamples of the group's points, and which have a minimum."""
    log_n = np.log10([p.params for p in fit.points])
    loss = np.array([p.loss for p in fit.points])
    rows = rng.integers(0, len(loss), size=(resamples, len(loss)))
    center = float(np.mean(log_n))
    coefficients, ok = parabolas(log_n[rows], loss[rows], center)
    a, b, c = coefficients[:, 0], coefficients[:, 1], coefficients[:, 2]
    ok &= a > 0
    safe_a = np.where(ok, a, 1.0)
    x_opt = center - b / (2 * safe_a)
    optimal_loss = c - b * b / (4 * safe_a)
    log_state = interpolate(x_opt, np.log10([p.params for p in all_points]), np.log10([p.state for p in all_points]))
    return log_state, optimal_loss / math.log(10), ok


def fit_state_law(
    points: Iterable[ScalePoint], *, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> StateLaw:
    """P* ∝ M*^c for one architecture over its budgets with a bracketed optimum (at least 2)."""
    points = list(points)
    archs = sorted({p.arch for p in points})
    if len(archs) != 1:
        raise MadslError(f"fit_state_law takes one architecture; these points hold {len(archs)}: {', '.join(archs)}")
    if any(p.state is None or p.state <= 0 for p in points):
        raise MadslError(f"the state-optimal law of {archs[0]} needs every point's total state (above 0)")
    optima = [fit for fit in fit_isoflops(points) if fit.bracketed]
    if len(optima) < 2:
        raise MadslError(
            f"the state-optimal law of {archs[0]} needs 2 budgets with a bracketed optimum, it has {len(optima)}",
            hint="train sizes on both sides of each budget's optimum",
        )
    check_bootstrap(resamples, level)
    states = [s.state for s in state_optima(points) if s.bracketed]  # M* as the state-optimal view reads it
    log_p = np.array([f.optimal_loss / math.log(10) for f in optima])
    rng = np.random.default_rng(seed)
    drawn = [_resampled(fit, points, rng, resamples) for fit in optima]
    ok = np.all([d[2] for d in drawn], axis=0)
    slope, intercept = log_lines(np.log10(states), log_p)
    x = np.stack([d[0] for d in drawn], axis=1)[ok]
    y = np.stack([d[1] for d in drawn], axis=1)[ok]
    samples = _row_slopes(x, y)
    return StateLaw(
        arch=archs[0],
        budgets=tuple(f.budget for f in optima),
        states=tuple(states),
        perplexities=tuple(math.exp(f.optimal_loss) for f in optima),
        law=PowerLaw(
            exponent=float(slope), coefficient=float(10**intercept), interval=percentile_interval(samples, level)
        ),
        level=level,
        resamples=resamples,
        skipped=int(resamples - ok.sum()),
    )


def _row_slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The least-squares slope of each row's (x, y) line; rows whose x do not vary are dropped."""
    dx = x - x.mean(axis=1, keepdims=True)
    spread = np.sum(dx * dx, axis=1)
    keep = spread > 0
    return (np.sum(dx * (y - y.mean(axis=1, keepdims=True)), axis=1)[keep]) / spread[keep]


def fit_state_laws(
    points: Iterable[ScalePoint], *, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[dict[str, StateLaw], dict[str, str]]:
    """fit_state_law for each architecture that has one, and why each other has none."""
    by_arch: dict[str, list[ScalePoint]] = defaultdict(list)
    for point in points:
        by_arch[point.arch].append(point)
    laws, missing = {}, {}
    for arch in sorted(by_arch):
        try:
            laws[arch] = fit_state_law(by_arch[arch], resamples=resamples, seed=seed, level=level)
        except MadslError as err:
            missing[arch] = err.message
    return laws, missing
